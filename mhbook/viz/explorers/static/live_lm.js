// The live language model (mhbook/viz/explorers/live.py: live_lm_html; chapter 14 writes the
// weights with export_lm). Part V's small Llama runs here, in plain JavaScript, after
// live_core.js ($, esc, loadWeights, loadOnce, linear, softmax, argmax, attendHeads, addNorm,
// cacheBytes, heatmap, status, showError, registerConsoleApi). One function per piece, named as
// in mhbook so that a reader can hold the two side by side: rmsNorm (RMSNorm), swiglu (SwiGLU),
// rope (RotaryEmbedding, Llama's rotate-half layout), attention (MultiHeadAttention with
// grouped-query heads and the rolling KV cache of a sliding window, LayerCache(window)), addNorm
// (live_core.js's, pre-norm here), decoderOnlyBlock, decoderOnlyLM (one token with the cache),
// and generateSteps (mhbook.generate: greedy, or sampled at a temperature). Weights travel as
// float16 and are computed in float32. data: {url, scale (colour_scale()), glyphs}.

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
  return x.map((row) => {
    let squares = 0;
    for (const v of row) squares += v * v;
    const scale = 1 / Math.sqrt(squares / row.length + eps);
    return row.map((v, i) => v * scale * weight.values[i]);
  });
}
function swiglu(x, P, name) { // SwiGLU: W_down(silu(W_gate x) * W_up x), silu(a) = a sigmoid(a)
  const gate = linear(x, P[`${name}.W_gate.weight`]);
  const up = linear(x, P[`${name}.W_up.weight`]);
  const hidden = gate.map((row, t) => row.map((a, i) => (a / (1 + Math.exp(-a))) * up[t][i]));
  return linear(hidden, P[`${name}.W_down.weight`]);
}
// RoPE's frequencies theta_i = base^(-2i / d_head), rounded to float32 where mhbook.rope computes
// in float32 (Math.fround), so that the angles are PyTorch's.
function ropeFrequencies(dHead, base) {
  const f = Math.fround;
  return Array.from({ length: dHead / 2 }, (_, i) => f(1 / f(base ** f((2 * i) / dHead))));
}
// RotaryEmbedding (rotate-half) on one row at `position`: in each head, the pair
// (x_i, x_{i + d/2}) turns by position * theta_i, x * cos + rotate_half(x) * sin with
// rotate_half(x1, x2) = (-x2, x1).
function rope(x, position, heads, dHead, theta) {
  const out = new Float32Array(x.length);
  const half = dHead / 2;
  for (let i = 0; i < half; i++) {
    const angle = Math.fround(position * theta[i]);
    const cos = Math.fround(Math.cos(angle));
    const sin = Math.fround(Math.sin(angle));
    for (let h = 0; h < heads; h++) {
      const a = h * dHead + i;
      const b = a + half;
      out[a] = x[a] * cos - x[b] * sin;
      out[b] = x[b] * cos + x[a] * sin;
    }
  }
  return out;
}
// MultiHeadAttention for the new token: W_q, W_k, W_v; RoPE on its query and key at its
// position; its key and value join the layer's cache, which keeps the last `window` tokens (a
// rolling cache: the oldest is dropped, so no mask is needed); attendHeads (live_core.js) with
// query head h reading key/value head floor(h / group) (grouped-query attention); W_o.
// Returns [output rows, weights[head][key]].
function attention(x, P, name, model, layerCache, position) {
  const { numHeads, kvHeads, dHead, window, theta } = model.dims;
  const q = linear(x, P[`${name}.W_q.weight`]).map((row) => rope(row, position, numHeads, dHead,
    theta));
  const k = linear(x, P[`${name}.W_k.weight`]).map((row) => rope(row, position, kvHeads, dHead,
    theta));
  layerCache.keys.push(...k);
  layerCache.values.push(...linear(x, P[`${name}.W_v.weight`]));
  while (layerCache.keys.length > window) { // LayerCache._trim: the last `window` tokens
    layerCache.keys.shift();
    layerCache.values.shift();
  }
  const [heads, weights] = attendHeads(q, layerCache.keys, layerCache.values, numHeads,
    { group: numHeads / kvHeads });
  return [linear(heads, P[`${name}.W_o.weight`]), weights.map((w) => w[0])];
}
// AddNorm's RMSNorm (`${name}.norm`), for addNorm (live_core.js) pre-norm:
// x + sublayer(RMSNorm(x)).
const norm = (P, name, eps) => (x) => rmsNorm(x, P[`${name}.norm.weight`], eps);
function decoderOnlyBlock(x, P, name, model, layerCache, position) {
  const eps = model.cfg.norm_eps;
  let weights = null;
  x = addNorm(x, (h) => {
    let out;
    [out, weights] = attention(h, P, `${name}.self_attn`, model, layerCache, position);
    return out;
  }, norm(P, `${name}.addnorm1`, eps), true);
  x = addNorm(x, (h) => swiglu(h, P, `${name}.ffn`), norm(P, `${name}.addnorm2`, eps), true);
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
function decoderOnlyLM(id, model, cache) {
  const { P, cfg } = model;
  const d = cfg.d_model;
  const scale = cfg.scale_embeddings ? Math.sqrt(d) : 1;
  let x = [P["embedding.weight"].values.slice(id * d, (id + 1) * d).map((v) => v * scale)];
  const weights = [];
  for (let l = 0; l < cfg.num_layers; l++) {
    let w;
    [x, w] = decoderOnlyBlock(x, P, `blocks.${l}`, model, cache.layers[l], cache.length);
    weights.push(w);
  }
  cache.length += 1;
  return [linear(rmsNorm(x, P["norm.weight"], cfg.norm_eps), P["output.weight"])[0], weights];
}

// ---------------------------------------------------------------- choosing the next character
// mulberry32 (Tommy Ettinger, public domain): a 32-bit state, one add, two multiply-xorshifts per
// number; a seed (any integer, taken modulo 2^32) gives the same floats in [0, 1) in every
// browser. Not PyTorch's generator: a seed here does not give chapter 14's samples.
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
// mhbook.generate: temperature 0 takes the argmax (the first, as torch.argmax); otherwise
// next_token_probs, softmax((z - max z) / temperature), and one draw from it.
function nextToken(logits, temperature, random) {
  const best = argmax(logits);
  if (temperature === 0) return best;
  const top = logits[best];
  const probs = softmax(Array.from(logits, (z) => (z - top) / temperature));
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
function numberIn(box, name, low, high) {
  const v = Number(box.value);
  if (box.value.trim() === "" || !Number.isInteger(v) || v < low || v > high) {
    throw new Error(`${name} must be a whole number from ${low} to ` +
      `${high.toLocaleString("en-US")}`);
  }
  return v;
}
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
showTemperature();
// The weights load when the reader opens the panel; the console API (and the browser test's),
// beside the translator's.
registerConsoleApi({
  complete,
  lmLogits,
  lmAttention,
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
