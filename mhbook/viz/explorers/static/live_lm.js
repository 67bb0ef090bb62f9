// The live language model (mhbook/viz/explorers/live.py: live_lm_html; chapter 14 writes the
// weights with export_lm). Part V's small Llama runs here, in plain JavaScript, after
// live_core.js ($, esc, loadWeights, loadOnce, mulberry32, linear, rmsNormRows, ropeFrequencies,
// ropeRows, softmax, argmax, attendHeads,
// addNorm, cacheBytes, heatmap, status, showError, registerConsoleApi). One function per piece, named as
// in mhbook so that a reader can hold the two side by side: rmsNorm (RMSNorm), swiglu (SwiGLU),
// rope (RotaryEmbedding, Llama's rotate-half layout), attention (MultiHeadAttention with
// grouped-query heads and the rolling KV cache of a sliding window, LayerCache(window)), addNorm
// (live_core.js's, pre-norm here), decoderOnlyBlock, decoderOnlyLM (one token with the cache),
// and generateSteps (mhbook.generate: greedy, or sampled at a temperature). Weights travel as
// float16 and are computed in float32. The step-through (traceToken) runs the same functions
// with a trace that records every operation of live_step.py's STEP_OPS (data.ops).
// data: {url, scale (colour_scale()), glyphs, ops, api (the API page's address), code (the
// folder of the book's highlighted source)}.

// ---------------------------------------------------------------- characters (CharTokenizer)
const glyph = (c) => data.glyphs[c] ?? c; // how the map labels " " and "\n"
function encode(model, text) {
  const unknown = [...new Set(Array.from(text).filter((c) => !model.index.has(c)))];
  if (unknown.length) {
    const first = Array.from(text).findIndex((c) => c === unknown[0]);
    throw new Error(`The model knows only the ${model.chars.length} characters of Tiny ` +
      `Shakespeare; the prompt has ${unknown.length} other${unknown.length > 1 ? "s" : ""}: ` +
      `${unknown.map((c) => `\u201c${c}\u201d`).join(", ")} (the first at position ` +
      `${first + 1}). It knows: ${model.chars.map(glyph).join("")}`);
  }
  if (!text.length) throw new Error("Write a prompt of at least one character.");
  return Array.from(text, (c) => model.index.get(c));
}

// ---------------------------------------------------------------- the layers, one token at a time
// A sequence is an array of Float32Array rows, as in live_core.js; the model is fed one token at
// a time, so here each holds the one new token's row.
function rmsNorm(x, weight, eps) { // RMSNorm: weight * x / sqrt(mean(x^2) + eps)
  return x.map((row) => rmsNormRows(row, weight, 1, row.length, eps).y);
}
function swiglu(x, P, name, trace = null) { // SwiGLU: W_down(silu(W_gate x) * W_up x), silu(a) = a sigmoid(a)
  const gate = linear(x, P[`${name}.W_gate.weight`]);
  const up = linear(x, P[`${name}.W_up.weight`]);
  const hidden = gate.map((row, t) => row.map((a, i) => (a / (1 + Math.exp(-a))) * up[t][i]));
  const out = linear(hidden, P[`${name}.W_down.weight`]);
  if (trace) {
    trace.record("gate", gate[0]);
    trace.record("up", up[0]);
    trace.record("hidden", hidden[0]);
    trace.record("ffn_out", out[0]);
  }
  return out;
}
// RotaryEmbedding (rotate-half) on one row at `position` (live_core.js's ropeRows), a new row.
function rope(x, position, heads, dHead, theta) {
  const out = Float32Array.from(x);
  ropeRows(out, [position], heads, dHead, theta);
  return out;
}
// MultiHeadAttention for the new token: W_q, W_k, W_v; RoPE on its query and key at its
// position; its key and value join the layer's cache, which keeps the last `window` tokens (a
// rolling cache: the oldest is dropped, so no mask is needed); attendHeads (live_core.js) with
// query head h reading key/value head floor(h / group) (grouped-query attention); W_o.
// Returns [output rows, weights[head][key]]. A `trace` ({record(key, value), textLength}, the
// step-through's) records each operation under its key in STEP_OPS (live_step.py).
function attention(x, P, name, model, layerCache, position, trace = null) {
  const { numHeads, kvHeads, dHead, window, theta } = model.dims;
  const qIn = linear(x, P[`${name}.W_q.weight`]);
  const kIn = linear(x, P[`${name}.W_k.weight`]);
  const v = linear(x, P[`${name}.W_v.weight`]);
  const q = qIn.map((row) => rope(row, position, numHeads, dHead, theta));
  const k = kIn.map((row) => rope(row, position, kvHeads, dHead, theta));
  layerCache.keys.push(...k);
  layerCache.values.push(...v);
  while (layerCache.keys.length > window) { // LayerCache._trim: the last `window` tokens
    layerCache.keys.shift();
    layerCache.values.shift();
  }
  const group = numHeads / kvHeads;
  const [heads, weights, scores] = attendHeads(q, layerCache.keys, layerCache.values, numHeads,
    { group });
  const out = linear(heads, P[`${name}.W_o.weight`]);
  if (trace) {
    const { record } = trace;
    record("q", qIn[0]);
    record("k", kIn[0]);
    record("v", v[0]);
    record("angles", theta.map((t) => Math.fround(position * t)));
    record("q_rope", q[0]);
    record("k_rope", k[0]);
    record("keys", layerCache.keys.map((row) => Array.from(row)));
    record("values", layerCache.values.map((row) => Array.from(row)));
    record("keys_grouped", Array.from({ length: numHeads }, (_, h) => { // repeat_interleave
      const from = Math.floor(h / group) * dHead;
      return layerCache.keys.map((row) => Array.from(row.slice(from, from + dHead)));
    }));
    record("scores", scores.map((rows) => rows[0]));
    // causal_mask(T, T, window)[position]: the keys this token may see among the text's T
    record("mask", Array.from({ length: trace.textLength },
      (_, j) => (j <= position && j > position - window ? 1 : 0)));
    record("weights", weights.map((rows) => rows[0]));
    record("heads", heads[0]);
    record("attn_out", out[0]);
  }
  return [out, weights.map((w) => w[0])];
}
// AddNorm's RMSNorm (`${name}.norm`), for addNorm (live_core.js) pre-norm:
// x + sublayer(RMSNorm(x)).
const norm = (P, name, eps) => (x) => rmsNorm(x, P[`${name}.norm.weight`], eps);
function decoderOnlyBlock(x, P, name, model, layerCache, position, trace = null) {
  const eps = model.cfg.norm_eps;
  let weights = null;
  x = addNorm(x, (h) => {
    let out;
    trace?.record("norm1", h[0]);
    [out, weights] = attention(h, P, `${name}.self_attn`, model, layerCache, position, trace);
    return out;
  }, norm(P, `${name}.addnorm1`, eps), true);
  trace?.record("residual1", x[0]);
  x = addNorm(x, (h) => {
    trace?.record("norm2", h[0]);
    return swiglu(h, P, `${name}.ffn`, trace);
  }, norm(P, `${name}.addnorm2`, eps), true);
  trace?.record("residual2", x[0]);
  return [x, weights];
}
// A KV cache (mhbook.KVCache): per layer the keys (after RoPE) and values of the last `window`
// tokens; `length` counts every token fed, the next one's position. Its size is cacheBytes
// (live_core.js) of cache.layers.
function newCache(model) {
  return { length: 0, layers: Array.from({ length: model.cfg.num_layers },
    () => ({ keys: [], values: [] })) };
}
// DecoderOnlyLM on one new token after those in the cache: [next-token logits, weights of
// every layer [layer][head][key]]. Embedding (times sqrt(d_model) if the config scales), the
// blocks, the final RMSNorm, the output layer.
// A `trace` (the step-through's) records every operation, the blocks' under `blocks.{l}.`.
function decoderOnlyLM(id, model, cache, trace = null) {
  const { P, cfg } = model;
  const d = cfg.d_model;
  const scale = cfg.scale_embeddings ? Math.sqrt(d) : 1;
  let x = [P["embedding.weight"].values.slice(id * d, (id + 1) * d).map((v) => v * scale)];
  trace?.record("embedding", x[0]);
  const weights = [];
  for (let l = 0; l < cfg.num_layers; l++) {
    let w;
    const inBlock = trace && { ...trace,
      record: (key, value) => trace.record(`blocks.${l}.${key}`, value) };
    [x, w] = decoderOnlyBlock(x, P, `blocks.${l}`, model, cache.layers[l], cache.length, inBlock);
    weights.push(w);
  }
  cache.length += 1;
  const normed = rmsNorm(x, P["norm.weight"], cfg.norm_eps);
  const logits = linear(normed, P["output.weight"])[0];
  trace?.record("final_norm", normed[0]);
  trace?.record("logits", logits);
  return [logits, weights];
}

// ---------------------------------------------------------------- choosing the next character
// mulberry32 (live_core.js) draws the samples. Not PyTorch's generator: a seed here does not
// give chapter 14's samples.
// mhbook.next_token_probs: softmax((z - max z) / temperature); with `topP` below 1 only the
// likeliest characters whose probabilities, largest first, reach topP (the one that crosses it
// included; ties in PyTorch's sort order), renormalised.
function nextTokenProbs(logits, temperature = 1, topP = null) {
  const top = logits[argmax(logits)];
  let probs = softmax(Array.from(logits, (z) => (z - top) / temperature));
  if (topP !== null && topP < 1) {
    const order = probs.map((p, i) => [p, i]).sort((a, b) => b[0] - a[0] || a[1] - b[1]);
    let before = 0;
    const keep = new Set();
    for (const [p, i] of order) {
      if (before >= topP) break;
      keep.add(i);
      before += p;
    }
    probs = probs.map((p, i) => (keep.has(i) ? p : 0));
    const total = probs.reduce((a, b) => a + b, 0);
    probs = probs.map((p) => p / total);
  }
  return probs;
}
// mhbook.generate: temperature 0 takes the argmax (the first, as torch.argmax); otherwise
// next_token_probs, and one draw from it.
function nextToken(logits, temperature, random) {
  const best = argmax(logits);
  if (temperature === 0) return best;
  const probs = nextTokenProbs(logits, temperature);
  const u = random();
  let total = 0;
  for (let i = 0; i < probs.length; i++) {
    total += probs[i];
    if (u < total) return i;
  }
  return best; // u beyond the rounded total: the likeliest
}
// The prompt, one token at a time into the cache, then `n` new characters. Each new one is fed
// back at once, so that every step yields its attention (it is the query) and the next logits.
function* generateSteps(model, ids, n, { temperature = 0, seed = 0 } = {}) {
  const cache = newCache(model);
  const random = mulberry32(seed);
  const tokens = [...ids];
  let logits;
  let weights;
  for (const id of ids) [logits, weights] = decoderOnlyLM(id, model, cache);
  for (let step = 0; step < n; step++) {
    const id = nextToken(logits, temperature, random);
    tokens.push(id);
    [logits, weights] = decoderOnlyLM(id, model, cache);
    yield { step, id, tokens, weights, cache, logits };
  }
}

// ---------------------------------------------------------------- the model, loaded lazily
const loadLM = loadOnce(() => loadWeights(data.url).then(({ P, raw }) => {
  const cfg = raw.config;
  const numHeads = cfg.num_heads;
  const dHead = cfg.head_dim ?? cfg.d_model / numHeads;
  const dims = { numHeads, kvHeads: cfg.num_kv_heads ?? numHeads, dHead,
    window: cfg.window, theta: ropeFrequencies(dHead, cfg.rope_theta) };
  return { P, cfg, raw, dims, chars: raw.chars, index: new Map(raw.chars.map((c, i) => [c, i])),
    kb: Math.round(JSON.stringify(raw).length / 1024) };
}));
function checkOptions(n, { temperature = 0, seed = 0 } = {}) {
  if (!Number.isInteger(n) || n < 0) throw new RangeError(`n must be an integer >= 0, got ${n}`);
  if (!(temperature >= 0) || !Number.isFinite(temperature)) {
    throw new RangeError(`temperature must be 0 (greedy) or a finite number > 0, got ` +
      `${temperature}`);
  }
  if (!Number.isInteger(seed)) throw new RangeError(`seed must be an integer, got ${seed}`);
  return { temperature, seed };
}
// The console API: the n new characters after `prompt` (greedy unless a temperature is given).
async function complete(prompt, n = 200, options = {}) {
  const model = await loadLM();
  const opts = checkOptions(n, options);
  let text = "";
  for (const step of generateSteps(model, encode(model, String(prompt)), n, opts)) {
    text += model.chars[step.id];
  }
  return text;
}
// The next character's logits after `prompt`, and the last character's attention
// [layer][head][key] over the keys of its window (oldest first).
async function lmRun(prompt) {
  const model = await loadLM();
  const cache = newCache(model);
  let out;
  for (const id of encode(model, String(prompt))) out = decoderOnlyLM(id, model, cache);
  return out;
}
const lmLogits = async (prompt) => Array.from((await lmRun(prompt))[0]);
const lmAttention = async (prompt) => (await lmRun(prompt))[1];

// ---------------------------------------------------------------- the panel
const form = $(".mhbook-live-lm-form");
const promptBox = $(".mhbook-live-lm-prompt");
const temperatureBox = $(".mhbook-live-lm-temperature");
const temperatureShown = $(".mhbook-live-lm-temperature-value");
const seedBox = $(".mhbook-live-lm-seed");
const lengthBox = $(".mhbook-live-lm-length");
const layerBox = $(".mhbook-live-lm-layer");
const headBox = $(".mhbook-live-lm-head");
const given = $(".mhbook-live-lm-given");
const written = $(".mhbook-live-lm-new");
const cacheLine = $(".mhbook-live-lm-cache");
const maps = $(".mhbook-live-maps");
const readout = $(".mhbook-live-lm-readout");
let run = 0; // the current generation; a new one (or Stop) ends the one before
let running = false;
let shown = null; // {model, state}: what the map draws

function showTemperature() {
  const t = Number(temperatureBox.value);
  temperatureShown.textContent = t === 0 ? "0 (greedy)" : t.toFixed(1);
}
function fillChoices(model) {
  const { cfg, dims } = model;
  const group = dims.numHeads / dims.kvHeads;
  const options = (n, label) => Array.from({ length: n }, (_, i) => // values count from 1
    `<option value="${i + 1}">${label(i)}</option>`).join("");
  const layer = Math.min(Number(layerBox.value) || 1, cfg.num_layers);
  const head = Math.min(Number(headBox.value) || 1, dims.numHeads);
  layerBox.innerHTML = options(cfg.num_layers, (l) => `${l + 1}`);
  headBox.innerHTML = options(dims.numHeads,
    (h) => `${h + 1} (key/value head ${Math.floor(h / group) + 1})`);
  layerBox.value = String(layer);
  headBox.value = String(head);
}
// The attention of the last character fed (the query) over the characters in its window.
function draw() {
  if (!shown) return;
  const { model, state } = shown;
  const l = (Number(layerBox.value) || 1) - 1;
  const h = (Number(headBox.value) || 1) - 1;
  const row = state.weights[l][h];
  const keys = state.tokens.slice(-row.length).map((id) => model.chars[id]);
  const query = keys[keys.length - 1];
  const title = `Layer ${l + 1}, head ${h + 1}: the last character, \u201c${glyph(query)}\u201d, ` +
    `over the ${row.length} in its window`;
  maps.innerHTML = heatmap([row], [glyph(query)], keys.map(glyph), title,
    { cell: 12, rowHeight: 28, upright: true });
  const best = row.map((w, j) => [w, j]).sort((a, b) => b[0] - a[0]).slice(0, 3);
  readout.textContent = "Most weight: " + best.map(([w, j]) => {
    const back = row.length - 1 - j;
    return `\u201c${glyph(keys[j])}\u201d ${back === 0 ? "(itself)" : `${back} back`} ` +
      `${w.toFixed(2)}`;
  }).join("; ") + ". Darker is more weight, from 0 to 1.";
  const { cfg, dims } = model;
  cacheLine.textContent = `KV cache: the last ${state.cache.layers[0].keys.length} characters ` +
    `(of a window of ${dims.window}) in each of ${cfg.num_layers} layers, ` +
    `${cacheBytes(state.cache.layers).toLocaleString("en-US")} bytes (${dims.kvHeads} key/value ` +
    `heads for ${dims.numHeads} query heads); the next position is ${state.cache.length}.`;
}
const pause = () => new Promise((resolve) => { setTimeout(resolve, 0); });
async function generateInPage() {
  const me = ++run;
  showError("");
  try {
    const model = await loadLM();
    const text = promptBox.value;
    const ids = encode(model, text);
    const temperature = Number(temperatureBox.value);
    const seed = numberIn(seedBox, "The seed", 0, 4294967295);
    const n = numberIn(lengthBox, "The number of characters", 1, 2000);
    given.textContent = text;
    written.textContent = "";
    status.textContent = "Generating\u2026";
    const begun = performance.now();
    let count = 0;
    running = true;
    for (const state of generateSteps(model, ids, n, { temperature, seed })) {
      if (me !== run) return; // stopped, or a new generation began
      written.textContent += model.chars[state.id];
      shown = { model, state };
      draw();
      count += 1;
      await pause(); // the browser shows the character before the next one is computed
    }
    if (me !== run) return;
    running = false;
    const seconds = (performance.now() - begun) / 1000;
    status.textContent = `Generated ${count} characters in ${seconds.toFixed(1)} s ` +
      `(${temperature === 0 ? "greedy" : `temperature ${temperature.toFixed(1)}, seed ${seed}`}).`;
  } catch (err) {
    running = false;
    showError(err.message);
    status.textContent = "";
  }
}
form.addEventListener("submit", (event) => {
  event.preventDefault();
  generateInPage();
});
promptBox.addEventListener("keydown", (event) => {
  if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
    event.preventDefault();
    generateInPage();
  }
});
$(".mhbook-live-lm-stop").addEventListener("click", () => {
  if (!running) return;
  run += 1;
  running = false;
  status.textContent = `Stopped after ${written.textContent.length} characters.`;
});
temperatureBox.addEventListener("input", showTemperature);
layerBox.addEventListener("change", draw);
headBox.addEventListener("change", draw);
// ---------------------------------------------------------------- the step-through
// data.ops is STEP_OPS (live_step.py): the operations in order, each with its key, name,
// formula, shape, the mhbook function or method that computes it, its anchor in the API page
// (data.api) and its lines in the highlighted source (data.code).
// An edition's page (pt-BR, zh-CN) has neither: the reference and the code are the English
// book's, whose page its <link rel="alternate" hreflang="en"> names; links resolve from there.
const englishPage = document.querySelector('link[rel="alternate"][hreflang="en"]');
const inBook = (path) => (englishPage ? new URL(path, englishPage.href).href : path);
// The page records each with the functions above (a trace), and the browser test compares
// every record with PyTorch's (live_step.step_reference): an operation shown is checked.
function stepOrder(model) { // [{op, layer, key}], as live_step.step_keys orders them
  const order = [];
  const add = (op, layer) => order.push({ op, layer,
    key: layer === null ? op.key : `blocks.${layer}.${op.key}` });
  for (const op of data.ops) if (!op.per_block && op.key === "embedding") add(op, null);
  for (let l = 0; l < model.cfg.num_layers; l++) {
    for (const op of data.ops) if (op.per_block) add(op, l);
  }
  for (const op of data.ops) if (!op.per_block && op.key !== "embedding") add(op, null);
  return order;
}
// One character through the model with every operation recorded: the one at `position` of
// `ids`, after the cache (built here from the characters before it unless given) holds those.
function traceToken(model, ids, position, { temperature = 1, topP = null, cache = null } = {}) {
  if (!cache) {
    cache = newCache(model);
    for (const id of ids.slice(0, position)) decoderOnlyLM(id, model, cache);
  }
  const values = {};
  const trace = { textLength: ids.length, record: (key, value) => { values[key] = value; } };
  const [logits] = decoderOnlyLM(ids[position], model, cache, trace);
  values.probs = nextTokenProbs(logits, temperature, topP);
  return { values, cache, position };
}
const plain = (v) => (typeof v === "number" ? v : Array.from(v, plain)); // typed -> plain arrays
// The console API: every operation's values for the character at `position` (0-based).
async function lmStep(prompt, position, options = {}) {
  const model = await loadLM();
  const ids = encode(model, String(prompt));
  if (!Number.isInteger(position) || position < 0 || position >= ids.length) {
    throw new RangeError(`position must be an integer from 0 to ${ids.length - 1}, got ` +
      `${position}`);
  }
  const { values } = traceToken(model, ids, position, options);
  const out = {};
  for (const [key, value] of Object.entries(values)) out[key] = plain(value);
  return { order: stepOrder(model).map((s) => s.key), values: out };
}

// Drawing: a vector as a strip of bars from a middle line (above: positive), a matrix as a
// map, white at 0, blue positive and red negative; the number of every cell on hover.
const diverging = (v, scale) => {
  const t = Math.min(1, Math.abs(v) / (scale || 1));
  const [r, g, b] = v >= 0 ? [33, 102, 172] : [178, 24, 43];
  const mix = (c) => Math.round(255 + (c - 255) * t);
  return `rgb(${mix(r)},${mix(g)},${mix(b)})`;
};
const largest = (rows) => Math.max(1e-12, ...rows.map((r) => Math.max(...Array.from(r, Math.abs))));
function barStrip(values, label, title) {
  const n = values.length;
  const bar = Math.max(2, Math.min(12, Math.floor(720 / n)));
  const half = 40;
  const scale = largest([values]);
  let body = `<line x1="0" x2="${n * bar}" y1="${half}" y2="${half}" stroke="#555"/>`;
  Array.from(values).forEach((v, i) => {
    const h = (Math.abs(v) / scale) * (half - 2);
    body += `<rect x="${i * bar}" y="${v >= 0 ? half - h : half}" width="${bar - (bar > 3)}" ` +
      `height="${Math.max(h, 0.5)}" fill="${v >= 0 ? "#2166ac" : "#b2182b"}"><title>` +
      `${esc(label(i))}: ${v.toFixed(5)}</title></rect>`;
  });
  return `<figure class="mhbook-live-map"><figcaption>${esc(title)} (the largest |value| is ` +
    `${scale.toFixed(3)})</figcaption><svg role="img" aria-label="${esc(title)}" ` +
    `width="${n * bar}" height="${2 * half}" viewBox="0 0 ${n * bar} ${2 * half}">${body}</svg>` +
    "</figure>";
}
// `colText(j)`: a short label above column j (a key's character), where the cells are wide.
function valueMap(rows, rowLabels, colLabel, title, colText = null) {
  const cols = rows[0].length;
  const cell = Math.max(3, Math.min(14, Math.floor(720 / cols)));
  const rowHeight = Math.max(3, Math.min(14, Math.floor(360 / rows.length)));
  const left = rowHeight >= 10 ? 8 + 6.2 * Math.max(...rowLabels.map((t) => t.length)) : 8;
  const top = colText && cell >= 8 ? 16 : 0;
  const scale = largest(rows);
  let body = "";
  if (top) {
    for (let j = 0; j < cols; j++) {
      body += `<text x="${left + (j + 0.5) * cell}" y="${top - 4}" text-anchor="middle" ` +
        `font-size="10">${esc(colText(j))}</text>`;
    }
  }
  rows.forEach((row, i) => Array.from(row).forEach((v, j) => {
    body += `<rect x="${left + j * cell}" y="${top + i * rowHeight}" width="${cell}" ` +
      `height="${rowHeight}" fill="${Number.isFinite(v) ? diverging(v, scale) : "#999"}"><title>` +
      `${esc(rowLabels[i])}, ${esc(colLabel(j))}: ${v.toFixed(5)}</title></rect>`;
  }));
  if (rowHeight >= 10) {
    rowLabels.forEach((t, i) => {
      body += `<text x="${left - 4}" y="${top + i * rowHeight + rowHeight * 0.75}" ` +
        `text-anchor="end" font-size="10">${esc(t)}</text>`;
    });
  }
  const width = left + cols * cell;
  const height = top + rows.length * rowHeight;
  return `<figure class="mhbook-live-map"><figcaption>${esc(title)} (white 0, blue positive, ` +
    `red negative; the largest |value| is ${scale.toFixed(3)})</figcaption><svg role="img" ` +
    `aria-label="${esc(title)}" width="${width}" height="${height}" ` +
    `viewBox="0 0 ${width} ${height}">${body}</svg></figure>`;
}

const stepForm = $(".mhbook-live-step-form");
const stepPosition = $(".mhbook-live-step-position");
const stepTemperature = $(".mhbook-live-step-temperature");
const stepTopP = $(".mhbook-live-step-top-p");
const stepOp = $(".mhbook-live-step-op");
const stepView = $(".mhbook-live-step-view");
let stepping = null; // {model, ids, traced, order, index}

function drawStep() {
  if (!stepping) return;
  const { model, ids, traced, order } = stepping;
  const index = Number(stepOp.value);
  stepping.index = index;
  const { op, layer, key } = order[index];
  const value = traced.values[key];
  const p = traced.position;
  const { dims, cfg } = model;
  const char = (id) => glyph(model.chars[id]);
  const first = p + 1 - traced.values[`blocks.0.keys`].length; // the oldest key in the window
  const keyLabel = (j) => `position ${first + j} \u201c${char(ids[first + j])}\u201d` +
    (first + j === p ? " (new)" : " (cached)");
  const keyChar = (j) => char(ids[first + j]);
  const dimLabel = (j) => `feature ${j}`;
  let picture;
  if (op.key === "probs") {
    const top = Array.from(value, (v, i) => [v, i]).sort((a, b) => b[0] - a[0]).slice(0, 10);
    const kept = Array.from(value).filter((v) => v > 0).length;
    picture = `<p>Top-p kept ${kept} of the ${value.length} characters; the ten likeliest:</p>` +
      `<ol class="mhbook-live-step-probs">${top.map(([v, i]) =>
      `<li><span class="mhbook-live-step-char">\u201c${esc(char(i))}\u201d</span> ` +
      `<span class="mhbook-live-step-bar" style="width:${Math.round(v * 300)}px"></span> ` +
      `${v.toFixed(4)}</li>`).join("")}</ol>`;
  } else if (op.key === "weights") {
    picture = heatmap(value, Array.from({ length: dims.numHeads }, (_, h) => `head ${h + 1}`),
      value[0].map((_, j) => glyph(model.chars[ids[first + j]])),
      `Layer ${layer + 1}: each head's weights over the ${value[0].length} keys`,
      { cell: 12, upright: true });
  } else if (op.key === "mask") {
    picture = valueMap([value], ["may attend"], (j) => `position ${j} \u201c${char(ids[j])}\u201d`,
      `Row ${p} of the causal mask over the prompt's ${ids.length} characters (1: may attend)`,
      (j) => char(ids[j])) + `<p>With the cache nothing needs masking: it holds only the ` +
      `characters up to this one (the last ${dims.window} at most), the keys this row allows. ` +
      "A forward pass over the whole prompt at once applies the row, as mhbook.attend does.</p>";
  } else if (op.key === "keys" || op.key === "values") {
    picture = valueMap(value, value.map((_, j) => keyLabel(j)), dimLabel,
      `The ${value.length} ${op.key} of layer ${layer + 1}: ${value.length - 1} from the cache, ` +
      "1 new");
  } else if (op.key === "keys_grouped") { // one map per query head: its key/value head's keys
    const group = dims.numHeads / dims.kvHeads;
    picture = value.map((head, h) => valueMap(head, head.map((_, j) => keyLabel(j)), dimLabel,
      `Query head ${h + 1} reads key/value head ${Math.floor(h / group) + 1}`)).join("");
  } else if (op.key === "scores") {
    picture = valueMap(value, value.map((_, h) => `head ${h + 1}`), keyLabel,
      `Layer ${layer + 1}: each head's scores over the ${value[0].length} keys`, keyChar);
  } else if (op.key === "angles") { // and each angle modulo a full turn, in degrees
    const turn = (a) => ((a % (2 * Math.PI)) * 180) / Math.PI;
    picture = barStrip(value, (i) => `pair ${i} (features ${i} and ${i + dims.dHead / 2}), ` +
      "angle in radians", `The angle of each pair at position ${p}`) +
      `<p class="mhbook-live-step-angles">${Array.from(value, (a, i) => `pair ${i}: ` +
      `${a.toFixed(3)} rad (${turn(a).toFixed(1)}\u00b0 after whole turns)`).join("; ")}</p>`;
  } else {
    const label = op.key === "logits"
      ? (i) => `\u201c${char(i)}\u201d` : (i) => `feature ${i}`;
    picture = barStrip(value, label, `${op.name}, ${value.length} values`);
  }
  const shape = Array.isArray(value[0]) ? (Array.isArray(value[0][0])
    ? `(${value.length}, ${value[0].length}, ${value[0][0].length})`
    : `(${value.length}, ${value[0].length})`) : `(${value.length},)`;
  const where = layer === null ? "" : `Layer ${layer + 1} of ${cfg.num_layers}: `;
  stepView.innerHTML =
    `<p class="mhbook-live-step-where">Character ${p + 1} of ${ids.length}, ` +
    `\u201c${esc(char(ids[p]))}\u201d (position ${p}); operation ${index + 1} of ` +
    `${order.length}</p><h4>${esc(where + op.name)}</h4>` +
    `<p class="mhbook-live-step-formula">${esc(op.formula)}</p>` +
    `<p>Shape ${esc(op.shape)} = ${shape}. Computed in mhbook by <a href="` +
    `${esc(inBook(`${data.api}#${op.anchor}`))}"><code>${esc(op.source)}</code></a> (<a ` +
    `class="mhbook-live-step-code" href="${esc(inBook(data.code + op.code))}">its code</a>).</p>` +
    picture;
}
function fillOps(order) {
  stepOp.innerHTML = order.map(({ op, layer }, i) =>
    `<option value="${i}">${i + 1}. ${esc(layer === null ? "" : `layer ${layer + 1}: `)}` +
    `${esc(op.name)}</option>`).join("");
}
function stepOptions() {
  const temperature = Number(stepTemperature.value);
  const topP = Number(stepTopP.value);
  if (!(temperature > 0) || temperature > 2) {
    throw new Error("The temperature must be a number above 0, at most 2");
  }
  if (!(topP > 0) || topP > 1) throw new Error("Top-p must be a number above 0, at most 1");
  return { temperature, topP };
}
async function startStep() {
  showError("");
  try {
    const model = await loadLM();
    const ids = encode(model, promptBox.value);
    const position = numberIn(stepPosition, "The character number", 1, ids.length) - 1;
    const traced = traceToken(model, ids, position, stepOptions());
    const order = stepOrder(model);
    const keep = stepping ? stepping.index : 0;
    stepping = { model, ids, traced, order, index: keep };
    fillOps(order);
    stepOp.value = String(keep);
    drawStep();
  } catch (err) {
    showError(err.message);
  }
}
function moveStep(by) {
  if (!stepping) return;
  const index = Math.min(stepping.order.length - 1, Math.max(0, stepping.index + by));
  stepOp.value = String(index);
  drawStep();
}
// The next character of the prompt, through the same cache: its keys and values join the
// ones already there, which are not computed again.
function nextCharacter() {
  showError("");
  if (!stepping) return;
  const { model, ids, traced } = stepping;
  if (traced.position + 1 >= ids.length) {
    showError(`Character ${ids.length} is the prompt's last: make the prompt longer to go on.`);
    return;
  }
  try {
    stepping.traced = traceToken(model, ids, traced.position + 1,
      { ...stepOptions(), cache: traced.cache });
    stepPosition.value = String(traced.position + 2);
    drawStep();
  } catch (err) {
    showError(err.message);
  }
}
stepForm.addEventListener("submit", (event) => {
  event.preventDefault();
  startStep();
});
stepOp.addEventListener("change", drawStep);
$(".mhbook-live-step-back").addEventListener("click", () => moveStep(-1));
$(".mhbook-live-step-forward").addEventListener("click", () => moveStep(1));
$(".mhbook-live-step-next-char").addEventListener("click", nextCharacter);

showTemperature();
// The weights load when the reader opens the panel; the console API (and the browser test's),
// beside the translator's.
registerConsoleApi({
  complete,
  lmLogits,
  lmAttention,
  lmStep,
  lmLoad: () => loadLM().then(() => true),
}, {
  load: loadLM,
  loaded: (model) => {
    fillChoices(model);
    const { cfg, dims } = model;
    return `Loaded ${model.kb.toLocaleString("en-US")} KB of weights: ${cfg.num_layers} ` +
      `layers, ${dims.numHeads} heads, a window of ${dims.window} characters. Write a prompt, ` +
      "then Generate.";
  },
});
