// What the live panels share (mhbook/viz/explorers/live.py): the translator (live.js, chapter 6)
// and the language model (live_lm.js, chapter 14) each run after this file, inside embed.js,
// with `root` (the panel's <div>) and `data` (its JSON: url, scale, ...) in scope.
// Here: the weights, fetched when the reader opens a panel (float16 on the wire, float32 in
// the browser) and loaded once; the layers' arithmetic on rows (nn.Linear, RMSNorm, RoPE,
// which the Train panel, live_train.js, also runs on its batch); softmax; argmax; attention head by head
// (mhbook.attend, grouped-query heads and a causal mask included); AddNorm, post-norm or
// pre-norm as AddNorm(norm_first=); the KV cache's size; the heatmap of attention weights in
// the book's map; the status line; and the tail both panels end with: load on open, and the
// console API window.mhbookLive.
const $ = (selector) => root.querySelector(selector);
const esc = (s) => String(s).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);

// ---------------------------------------------------------------- weights: float16 -> float32
function halfToFloat(h) {
  const sign = h & 0x8000 ? -1 : 1;
  const exponent = (h >> 10) & 0x1f;
  const fraction = h & 0x3ff;
  if (exponent === 0) return sign * 2 ** -14 * (fraction / 1024);
  if (exponent === 31) return fraction ? NaN : sign * Infinity;
  return sign * 2 ** (exponent - 15) * (1 + fraction / 1024);
}
function decodeTensor({ shape, data: b64 }) {
  const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
  const halves = new Uint16Array(bytes.buffer, bytes.byteOffset, bytes.length / 2);
  const values = new Float32Array(halves.length);
  for (let i = 0; i < halves.length; i++) values[i] = halfToFloat(halves[i]);
  return { shape, values };
}
// The file live.py wrote: {P: every tensor by its state_dict name, raw: the rest of the JSON}.
// Fetched; from file://, where a page may not fetch, read from the script the book's build
// writes beside it (NAME.js for NAME.json, _ext/mhbook_sphinx.py), which a page may run.
async function loadWeights(url) {
  const raw = location.protocol === "file:" ? await scriptedJson(url) : await fetchedJson(url);
  const P = {};
  for (const [name, tensor] of Object.entries(raw.tensors)) P[name] = decodeTensor(tensor);
  return { P, raw };
}
async function fetchedJson(url) {
  const response = await fetch(url);
  if (!response.ok) throw new Error(`could not load ${url}: HTTP ${response.status}`);
  return response.json();
}
function scriptedJson(url) {
  const name = url.split("/").pop();
  const src = url.replace(/\.json$/, ".js");
  return new Promise((resolve, reject) => {
    const script = document.createElement("script");
    script.src = src;
    script.onload = () => {
      const raw = (window.mhbookLiveFiles || {})[name];
      if (raw) delete window.mhbookLiveFiles[name]; // the model keeps what it needs
      raw ? resolve(raw) : reject(new Error(`${src} holds no weights`));
    };
    script.onerror = () => reject(new Error(`could not load ${src}`));
    document.head.append(script);
  });
}
// mulberry32 (Tommy Ettinger, public domain): a 32-bit state, one add, two multiply-xorshifts per
// number; a seed (any integer, taken modulo 2^32) gives the same floats in [0, 1) in every
// browser (the language model's samples, the training panel's weights and batches).
function mulberry32(seed) {
  let state = seed >>> 0;
  return () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
// `build()` once: the promise of the model, shared by every caller; a failed load may be
// tried again.
function loadOnce(build) {
  let promise = null;
  return () => {
    if (!promise) {
      promise = build();
      promise.catch(() => { promise = null; });
    }
    return promise;
  };
}

// ---------------------------------------------------------------- the shared layers
// The arithmetic of every panel's layers, written once: on `n` rows of width d held in one flat
// Float32Array (row r at r * d), the Train panel's whole batch (live_train.js, which adds each
// one's backward) or the one new token of the language models (live.js, live_lm.js, where a
// sequence is an array of Float32Array rows, one per token, and each row goes through alone).

// nn.Linear: y (n, out) = x (n, inp) W^T + b, W (out, inp) as PyTorch stores it; b optional.
function linearRows(x, W, n, b = null) {
  const [out, inp] = W.shape;
  const w = W.values;
  const y = new Float32Array(n * out);
  for (let r = 0; r < n; r++) {
    const xo = r * inp;
    for (let o = 0; o < out; o++) {
      let s = b ? b.values[o] : 0;
      const wo = o * inp;
      for (let i = 0; i < inp; i++) s += x[xo + i] * w[wo + i];
      y[r * out + o] = s;
    }
  }
  return y;
}
function linear(x, W, b) { // on a sequence of rows
  return x.map((row) => linearRows(row, W, 1, b));
}
// RMSNorm: y = weight * x * r, r = 1 / sqrt(mean(x^2) + eps), row by row (r kept for backward).
function rmsNormRows(x, weight, n, d, eps) {
  const y = new Float32Array(n * d);
  const r = new Float32Array(n);
  for (let row = 0; row < n; row++) {
    let squares = 0;
    for (let i = 0; i < d; i++) squares += x[row * d + i] * x[row * d + i];
    r[row] = 1 / Math.sqrt(squares / d + eps);
    for (let i = 0; i < d; i++) y[row * d + i] = x[row * d + i] * r[row] * weight.values[i];
  }
  return { y, r };
}
// RoPE's frequencies theta_i = base^(-2i / d_head), rounded to float32 where mhbook.rope computes
// in float32 (Math.fround), so that the angles are PyTorch's.
function ropeFrequencies(dHead, base) {
  const f = Math.fround;
  return Array.from({ length: dHead / 2 }, (_, i) => f(1 / f(base ** f((2 * i) / dHead))));
}
// RotaryEmbedding (rotate-half), in place, on rows of `heads` heads: in each head the pair
// (x_i, x_{i + d/2}) of row r turns by positions[r] * theta_i, x * cos + rotate_half(x) * sin
// with rotate_half(x1, x2) = (-x2, x1). sign -1 turns back: RoPE's backward, since a
// rotation's transpose is the rotation by the negative angle.
function ropeRows(x, positions, heads, dHead, theta, sign = 1) {
  const half = dHead / 2;
  const width = heads * dHead;
  for (let row = 0; row < positions.length; row++) {
    for (let i = 0; i < half; i++) {
      const angle = Math.fround(positions[row] * theta[i]);
      const cos = Math.fround(Math.cos(angle));
      const sin = sign * Math.fround(Math.sin(angle));
      for (let h = 0; h < heads; h++) {
        const a = row * width + h * dHead + i;
        const b = a + half;
        const xa = x[a];
        const xb = x[b];
        x[a] = xa * cos - xb * sin;
        x[b] = xb * cos + xa * sin;
      }
    }
  }
}
function softmax(scores) {
  let max = -Infinity;
  for (const s of scores) if (s > max) max = s;
  const e = scores.map((s) => (s === -Infinity ? 0 : Math.exp(s - max)));
  const total = e.reduce((a, b) => a + b, 0);
  return e.map((v) => v / total);
}
function argmax(values) { // the first largest, as torch.argmax
  let best = 0;
  for (let i = 1; i < values.length; i++) if (values[i] > values[best]) best = i;
  return best;
}

// mhbook.attend, head by head: the query rows `q` (numHeads * dHead wide, projected, and
// turned by RoPE where the model has it) over the cached key and value rows (kvHeads * dHead
// wide). Query head h reads key/value head floor(h / group): group 1 is multi-head attention,
// numHeads / kvHeads grouped-query. softmax(q . k / sqrt(d_head)) over the keys; `causalFrom`
// is the position of the first query among the keys (query i sees keys 0 to causalFrom + i,
// the bottom-right causal_mask), or null for no mask.
// Returns [the heads' outputs merged into rows (before W_o), weights [head][query][key],
// the scaled scores [head][query][key] (the step-through shows them)].
function attendHeads(q, keys, values, numHeads, { group = 1, causalFrom = null } = {}) {
  const width = q[0].length;
  const dHead = width / numHeads;
  const out = q.map(() => new Float32Array(width));
  const weights = [];
  const allScores = [];
  for (let h = 0; h < numHeads; h++) {
    const o = h * dHead;
    const kv = Math.floor(h / group) * dHead;
    const headScores = [];
    allScores.push(headScores);
    weights.push(q.map((qi, i) => {
      const scores = keys.map((key, j) => {
        if (causalFrom !== null && j > causalFrom + i) return -Infinity;
        let s = 0;
        for (let c = 0; c < dHead; c++) s += qi[o + c] * key[kv + c];
        return s / Math.sqrt(dHead);
      });
      headScores.push(scores);
      const a = softmax(scores);
      a.forEach((w, j) => {
        const value = values[j];
        for (let c = 0; c < dHead; c++) out[i][o + c] += w * value[kv + c];
      });
      return a;
    }));
  }
  return [out, weights, allScores];
}
// AddNorm, as mhbook.AddNorm(norm_first=): a residual connection around `sublayer` (rows ->
// rows) with the normalisation `norm` (rows -> rows). Post-norm (the translator, the paper's):
// norm(x + sublayer(x)); pre-norm (the language model, Llama's): x + sublayer(norm(x)).
function addNorm(x, sublayer, norm, normFirst) {
  const add = (y) => x.map((row, t) => row.map((v, i) => v + y[t][i]));
  return normFirst ? add(sublayer(norm(x))) : norm(add(sublayer(x)));
}
// A KV cache's size as KVCache.nbytes counts it: the float32 numbers held by every store
// ({keys, values}: rows) in `stores`.
function cacheBytes(stores) {
  let numbers = 0;
  for (const { keys, values } of stores) {
    for (const rows of [keys, values]) numbers += rows.length * (rows.length ? rows[0].length : 0);
  }
  return 4 * numbers;
}

// ---------------------------------------------------------------- drawing
// Attention weights [query][key] from 0 to 1 in the book's colour map (data.scale), cells of
// `cell` by `rowHeight` pixels, a tooltip on every cell, the labels on both axes: the keys'
// turned a quarter, or `upright` (single characters).
function heatmap(values, rowLabels, colLabels, title, { cell = 16, rowHeight = cell,
  upright = false } = {}) {
  const left = 8 + 6.2 * Math.max(4, ...rowLabels.map((t) => t.length));
  const top = upright ? 18 : 8 + 6.2 * Math.max(4, ...colLabels.map((t) => t.length));
  const width = left + cell * colLabels.length + 4;
  const height = top + rowHeight * rowLabels.length + 4;
  const lut = data.scale.colours;
  let body = "";
  values.forEach((row, i) => row.forEach((v, j) => {
    const k = Math.round(Math.min(1, Math.max(0, v)) * (lut.length - 1));
    body += `<rect x="${left + j * cell}" y="${top + i * rowHeight}" width="${cell}" ` +
      `height="${rowHeight}" fill="${lut[k]}"><title>${esc(rowLabels[i])} \u2192 ` +
      `${esc(colLabels[j])}: ${v.toFixed(2)}</title></rect>`;
  }));
  rowLabels.forEach((t, i) => {
    body += `<text x="${left - 4}" y="${top + i * rowHeight + rowHeight * 0.7}" ` +
      `text-anchor="end" font-size="11">${esc(t)}</text>`;
  });
  colLabels.forEach((t, j) => {
    const x = left + j * cell + cell * (upright ? 0.5 : 0.65);
    body += upright
      ? `<text x="${x}" y="${top - 5}" text-anchor="middle" font-size="11">${esc(t)}</text>`
      : `<text transform="translate(${x},${top - 4}) rotate(-90)" font-size="11">${esc(t)}</text>`;
  });
  return `<figure class="mhbook-live-map"><figcaption>${esc(title)}</figcaption>` +
    `<svg role="img" aria-label="${esc(title)}: attention weights, queries ${esc(rowLabels
      .join(" "))} over keys ${esc(colLabels.join(" "))}" width="${width}" height="${height}" ` +
    `viewBox="0 0 ${width} ${height}">${body}</svg></figure>`;
}

// ---------------------------------------------------------------- the status line, the tail
const status = $(".mhbook-live-status");
const error = $(".mhbook-live-error");
// A number box's whole number within [low, high], or an error that names the box and the range.
function numberIn(box, name, low, high) {
  const v = Number(box.value);
  if (box.value.trim() === "" || !Number.isInteger(v) || v < low || v > high) {
    throw new Error(`${name} must be a whole number from ${low} to ` +
      `${high.toLocaleString("en-US")}`);
  }
  return v;
}
function showError(message) {
  error.textContent = message;
  error.hidden = !message;
}
// The tail of both panels: the weights load when the reader opens the panel, not with the page
// (`load()`, then the status line says `loaded(model)`); `api` joins window.mhbookLive, the
// console's API (and the browser tests'), beside the other panel's.
function registerConsoleApi(api, { load, loaded }) {
  root.querySelector("details").addEventListener("toggle", (event) => {
    if (!event.target.open) return;
    status.textContent = "Loading the weights\u2026";
    load().then((model) => { status.textContent = loaded(model); },
      (err) => showError(`${err.message}. The live panel runs in the HTML book.`));
  });
  window.mhbookLive = Object.assign(window.mhbookLive || {}, api);
}
