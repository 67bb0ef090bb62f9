// The live translator (mhbook/viz/explorers/live.py writes its panel; chapter 6 writes the weights).
// The book's trained Transformer runs here, in plain JavaScript, with no kernel and no network
// beyond this book's own files. One function per piece, named as in mhbook so that a reader can
// hold the two side by side: embed (Stack.embed), linear (nn.Linear), layerNorm, addNorm
// (AddNorm, post-norm), positionWiseFFN, multiHeadAttention (W_q, W_k, W_v, W_o, split into
// heads), encoderBlock, encoder, decoderBlock, decoder (one step with a KV cache), translate
// (greedy, as mhbook.generate). Weights travel as float16 and are computed in float32.
// data: {url, scale (colour_scale()), maxNumber}. After live_core.js, which holds what the
// live panels share: $, esc, loadWeights (float16 -> float32), loadOnce, linear, softmax,
// argmax, attendHeads, addNorm, cacheBytes, heatmap, status, showError, registerConsoleApi.

// ---------------------------------------------------------------- numbers to English words
// Written by hand to match num2words(n, lang="en") without commas, as mhbook.data.english_words
// (a test compares them on every edge case and thousands of random numbers).
const ONES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine",
  "ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen",
  "eighteen", "nineteen"];
const TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty",
  "ninety"];
function below100(n) {
  if (n < 20) return ONES[n];
  return TENS[Math.floor(n / 10)] + (n % 10 ? `-${ONES[n % 10]}` : "");
}
function below1000(n) {
  if (n < 100) return below100(n);
  const rest = n % 100;
  return `${ONES[Math.floor(n / 100)]} hundred` + (rest ? ` and ${below100(rest)}` : "");
}
function numberToWords(n) {
  if (!Number.isInteger(n) || n < 0 || n > data.maxNumber) {
    throw new RangeError(`numbers from 0 to ${data.maxNumber.toLocaleString("en-US")}, got ${n}`);
  }
  if (n < 1000) return below1000(n);
  const high = Math.floor(n / 1000);
  const low = n % 1000;
  const rest = low === 0 ? "" : low < 100 ? ` and ${below100(low)}` : ` ${below1000(low)}`;
  return `${below1000(high)} thousand${rest}`;
}
// mhbook.data.tokenize: split on spaces, every hyphen a token of its own.
function tokenize(text) {
  const tokens = [];
  for (const word of text.split(/\s+/).filter(Boolean)) {
    word.split("-").forEach((part, i) => {
      if (i > 0) tokens.push("-");
      if (part) tokens.push(part);
    });
  }
  return tokens;
}
// mhbook.data.detokenize: spaces between words, hyphens glued to both neighbours.
function detokenize(tokens) {
  let text = "";
  tokens.forEach((t, i) => {
    if (i > 0 && t !== "-" && tokens[i - 1] !== "-") text += " ";
    text += t;
  });
  return text;
}

// ---------------------------------------------------------------- the layers
// A sequence is an array of Float32Array rows (one per token); linear is live_core.js's.
function layerNorm(x, weight, bias, eps) {
  return x.map((row) => {
    const d = row.length;
    let mean = 0;
    for (const v of row) mean += v;
    mean /= d;
    let variance = 0;
    for (const v of row) variance += (v - mean) ** 2;
    variance /= d;
    const scale = 1 / Math.sqrt(variance + eps);
    return row.map((v, i) => (v - mean) * scale * weight.values[i] + bias.values[i]);
  });
}
// AddNorm's LayerNorm (`${name}.norm`), for addNorm (live_core.js) post-norm:
// LayerNorm(x + sublayer(x)).
const norm = (P, name, eps) => (x) => layerNorm(x, P[`${name}.norm.weight`],
  P[`${name}.norm.bias`], eps);
function positionWiseFFN(x, P, name) { // linear2(relu(linear1(x)))
  const hidden = linear(x, P[`${name}.linear1.weight`], P[`${name}.linear1.bias`]);
  hidden.forEach((row) => row.forEach((v, i) => { if (v < 0) row[i] = 0; }));
  return linear(hidden, P[`${name}.linear2.weight`], P[`${name}.linear2.bias`]);
}
// mhbook.MultiHeadAttention: project, attend head by head (attendHeads), merge, W_o. `cache` (optional)
// holds this layer's keys and values so far: {keys: [...rows], values: [...rows]}.
function multiHeadAttention(query, memory, P, name, numHeads, { cache = null, causal = false,
  fixedKV = null } = {}) {
  const q = linear(query, P[`${name}.W_q.weight`], P[`${name}.W_q.bias`]);
  let k;
  let v;
  if (fixedKV) { // cross-attention: the memory's keys and values, projected once
    ({ keys: k, values: v } = fixedKV);
  } else {
    const newK = linear(memory, P[`${name}.W_k.weight`], P[`${name}.W_k.bias`]);
    const newV = linear(memory, P[`${name}.W_v.weight`], P[`${name}.W_v.bias`]);
    if (cache) { cache.keys.push(...newK); cache.values.push(...newV); }
    k = cache ? cache.keys : newK;
    v = cache ? cache.values : newV;
  }
  const causalFrom = causal ? k.length - query.length : null;
  const [heads, weights] = attendHeads(q, k, v, numHeads, { causalFrom });
  return [linear(heads, P[`${name}.W_o.weight`], P[`${name}.W_o.bias`]), weights];
}
function projectMemory(memory, P, name) {
  return {
    keys: linear(memory, P[`${name}.W_k.weight`], P[`${name}.W_k.bias`]),
    values: linear(memory, P[`${name}.W_v.weight`], P[`${name}.W_v.bias`]),
  };
}
// Stack.embed: embedding * sqrt(d_model) (if the config scales), plus sinusoidal positions.
function embed(ids, table, cfg, offset) {
  const d = cfg.d_model;
  const scale = cfg.scale_embeddings ? Math.sqrt(d) : 1;
  return ids.map((id, t) => {
    const row = new Float32Array(d);
    const position = offset + t;
    for (let i = 0; i < d; i += 2) {
      const angle = position / 10000 ** (i / d);
      row[i] = table.values[id * d + i] * scale + Math.sin(angle);
      row[i + 1] = table.values[id * d + i + 1] * scale + Math.cos(angle);
    }
    return row;
  });
}

function encoderBlock(x, P, name, cfg) {
  const eps = cfg.norm_eps;
  let weights;
  x = addNorm(x, (h) => {
    let out;
    [out, weights] = multiHeadAttention(h, h, P, `${name}.self_attn`, cfg.num_heads);
    return out;
  }, norm(P, `${name}.addnorm1`, eps), false);
  x = addNorm(x, (h) => positionWiseFFN(h, P, `${name}.ffn`), norm(P, `${name}.addnorm2`, eps),
    false);
  return [x, weights];
}
function encoder(srcIds, model) {
  const { P, cfg } = model;
  let x = embed(srcIds, P["encoder.embedding.weight"], cfg, 0);
  const weights = [];
  for (let l = 0; l < cfg.num_layers; l++) {
    let w;
    [x, w] = encoderBlock(x, P, `encoder.blocks.${l}`, cfg);
    weights.push(w);
  }
  return [x, weights];
}
function decoderBlock(x, P, name, cfg, layerCache) {
  const eps = cfg.norm_eps;
  let selfWeights;
  let crossWeights;
  x = addNorm(x, (h) => {
    let out;
    [out, selfWeights] = multiHeadAttention(h, h, P, `${name}.self_attn`, cfg.num_heads,
      { cache: layerCache.self, causal: true });
    return out;
  }, norm(P, `${name}.addnorm1`, eps), false);
  x = addNorm(x, (h) => {
    let out;
    [out, crossWeights] = multiHeadAttention(h, null, P, `${name}.cross_attn`, cfg.num_heads,
      { fixedKV: layerCache.memory });
    return out;
  }, norm(P, `${name}.addnorm2`, eps), false);
  x = addNorm(x, (h) => positionWiseFFN(h, P, `${name}.ffn`), norm(P, `${name}.addnorm3`, eps),
    false);
  return [x, selfWeights, crossWeights];
}
// A KV cache (mhbook.KVCache): per decoder layer the self-attention's keys and values so far,
// and the encoder memory's keys and values for the cross-attention, projected once.
function newCache(model, memory) {
  const { P, cfg } = model;
  return Array.from({ length: cfg.num_layers }, (_, l) => ({
    self: { keys: [], values: [] },
    memory: projectMemory(memory, P, `decoder.blocks.${l}.cross_attn`),
  }));
}
// The decoder on new tokens `ids` after the cached ones: logits rows and the new queries' weights.
function decoder(ids, model, cache) {
  const { P, cfg } = model;
  let x = embed(ids, P["decoder.embedding.weight"], cfg, cache[0].self.keys.length);
  const selfWeights = [];
  const crossWeights = [];
  for (let l = 0; l < cfg.num_layers; l++) {
    let s;
    let c;
    [x, s, c] = decoderBlock(x, P, `decoder.blocks.${l}`, cfg, cache[l]);
    selfWeights.push(s);
    crossWeights.push(c);
  }
  return [linear(x, P["decoder.output.weight"], P["decoder.output.bias"]), selfWeights,
    crossWeights];
}

// ---------------------------------------------------------------- the model, loaded lazily
const loadModel = loadOnce(async () => {
  const { P, raw } = await loadWeights(data.url);
  const srcIndex = new Map(raw.src_vocab.map((t, i) => [t, i]));
  return { P, cfg: raw.config, raw, srcIndex };
});

function englishIds(model, text) {
  const cleaned = text.trim().toLowerCase().replace(/,/g, "");
  if (!cleaned) throw new Error("type a number from 0 to 999,999, in digits or in words");
  const words = /^\d+$/.test(cleaned.replace(/[\s\u2009_]/g, ""))
    ? numberToWords(Number(cleaned.replace(/[\s\u2009_]/g, "")))
    : cleaned;
  const tokens = tokenize(words);
  const unknown = tokens.filter((t) => !model.srcIndex.has(t) || t.startsWith("<"));
  if (unknown.length) {
    throw new Error(`the model's English vocabulary has no ${unknown.map((t) => `"${t}"`)
      .join(", ")}: it knows the number words from zero to nine hundred and ninety-nine thousand`);
  }
  return { words, tokens, ids: [...tokens.map((t) => model.srcIndex.get(t)), model.raw.specials.eos] };
}

// Greedy translation, one token at a time with the cache; `onStep` sees every step.
function* translationSteps(model, srcIds) {
  const [memory, encoderWeights] = encoder(srcIds, model);
  const cache = newCache(model, memory);
  const { bos, eos } = model.raw.specials;
  let next = bos;
  const out = [];
  const selfRows = [];
  const crossRows = [];
  for (let step = 0; step < model.raw.max_new_tokens; step++) {
    const [logits, s, c] = decoder([next], model, cache);
    const best = argmax(logits[0]);
    selfRows.push(s);
    crossRows.push(c);
    out.push(best);
    const bytes = cacheBytes(cache.flatMap((layer) => [layer.self, layer.memory]));
    yield { step, token: best, fed: next, cache, encoderWeights, selfRows, crossRows, out, bytes,
      done: best === eos };
    if (best === eos) return;
    next = best;
  }
}

async function translate(text) {
  const model = await loadModel();
  const start = performance.now();
  const src = englishIds(model, String(text));
  let last = null;
  for (last of translationSteps(model, src.ids)); // run to the end
  const ids = last.out;
  const tokens = ids.filter((i) => i !== model.raw.specials.eos).map((i) => model.raw.tgt_vocab[i]);
  return { text: detokenize(tokens), tokens, ids, english: src.words, srcIds: src.ids,
    ms: performance.now() - start };
}

// Teacher-forced logits: the decoder fed tgtIds (starting with <bos>) one token at a time.
async function logits(srcIds, tgtIds) {
  const model = await loadModel();
  const [memory] = encoder(srcIds, model);
  const cache = newCache(model, memory);
  return tgtIds.map((id) => Array.from(decoder([id], model, cache)[0][0]));
}

// ---------------------------------------------------------------- drawing
function drawState(model, srcTokens, state) {
  const { cfg, raw } = model;
  const src = [...srcTokens, "<eos>"];
  const fed = [raw.tgt_vocab[raw.specials.bos], ...state.out.slice(0, -1).map((i) => raw.tgt_vocab[i])];
  const heads = Array.from({ length: cfg.num_heads }, (_, h) => h);
  const layers = Array.from({ length: cfg.num_layers }, (_, l) => l);
  const kinds = [
    ["Encoder self-attention", (l, h) => state.encoderWeights[l][h], src, src],
    ["Decoder masked self-attention", (l, h) => state.selfRows.map((s, t) => {
      const row = s[l][h][0];
      return fed.map((_, j) => (j < row.length ? row[j] : 0));
    }), fed, fed],
    ["Cross-attention", (l, h) => state.crossRows.map((c) => c[l][h][0]), fed, src],
  ];
  let html = "";
  for (const [title, values, rows, cols] of kinds) {
    html += `<h4>${esc(title)}</h4><div class="mhbook-live-grid">`;
    for (const l of layers) {
      for (const h of heads) {
        html += heatmap(values(l, h), rows, cols, `layer ${l + 1}, head ${h + 1}`);
      }
    }
    html += "</div>";
  }
  $(".mhbook-live-maps").innerHTML = html;
}

// ---------------------------------------------------------------- the panel
const input = $(".mhbook-live-input");
const french = $(".mhbook-live-french");
const english = $(".mhbook-live-english");
const cacheRows = $(".mhbook-live-cache tbody");
let stepper = null;
let stepModel = null;
let stepTokens = null;

function cacheRow(model, state) {
  const t = model.raw.tgt_vocab;
  const selfTokens = state.cache[0].self.keys.length;
  const memoryTokens = state.cache[0].memory.keys.length;
  return `<tr><td>${state.step + 1}</td><td>${esc(t[state.fed])}</td><td>${esc(t[state.token])}` +
    `</td><td>${selfTokens}</td><td>${memoryTokens}</td>` +
    `<td>${state.bytes.toLocaleString("en-US")}</td></tr>`;
}
function show(model, srcTokens, state) {
  const t = model.raw.tgt_vocab;
  const words = state.out.filter((i) => i !== model.raw.specials.eos).map((i) => t[i]);
  french.textContent = detokenize(words) + (state.done ? "" : " \u2026");
  cacheRows.insertAdjacentHTML("beforeend", cacheRow(model, state));
  drawState(model, srcTokens, state);
}
function start(model) {
  const src = englishIds(model, input.value);
  english.textContent = src.words;
  cacheRows.innerHTML = "";
  stepModel = model;
  stepTokens = src.tokens;
  stepper = translationSteps(model, src.ids);
}
async function run(all) {
  showError("");
  try {
    const model = await loadModel();
    if (all || !stepper) start(model);
    const begun = performance.now();
    let state = null;
    do {
      const next = stepper.next();
      if (next.done) break;
      state = next.value;
      show(stepModel, stepTokens, state);
    } while (all && !state.done);
    if (state && state.done) {
      stepper = null;
      status.textContent = all
        ? `Translated in ${(performance.now() - begun).toFixed(1)} ms, with the KV cache.`
        : "Done: the model wrote <eos>. Step again to start over.";
    } else if (state) {
      status.textContent = `Step ${state.step + 1}: the cache holds ${state.cache[0].self.keys
        .length} French tokens per layer.`;
    }
  } catch (err) {
    stepper = null;
    showError(err.message);
  }
}
$(".mhbook-live-form").addEventListener("submit", (event) => {
  event.preventDefault();
  run(true);
});
$(".mhbook-live-step").addEventListener("click", () => run(false));
$(".mhbook-live-reset").addEventListener("click", () => {
  stepper = null;
  showError("");
  cacheRows.innerHTML = "";
  french.textContent = "";
  english.textContent = "";
  $(".mhbook-live-maps").innerHTML = "";
  status.textContent = "Type a number, then Translate, or Step for one token at a time.";
});
// The weights load when the reader opens the panel; the console API (and the browser test's).
registerConsoleApi({
  translate,
  logits,
  numberToWords,
  tokenize,
  load: () => loadModel().then(() => true),
}, {
  load: loadModel,
  loaded: (model) => `Loaded ${Math.round(JSON.stringify(model.raw).length / 1024)
    .toLocaleString("en-US")} KB of weights. Type a number, then Translate, or Step for one ` +
    "token at a time.",
});
// The language model's complete() is live_lm.js's (chapter 14); on a page without its panel,
// a pointer to it.
window.mhbookLive.complete ??= () => Promise.reject(new Error(
  "the live language model is in chapter 14, A small Llama: open its panel there"));
