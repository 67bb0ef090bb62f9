// Chapter 15's "Train" panel (mhbook/viz/explorers/live_train.py: live_train_html): the toy of
// the induction heads (two layers of attention only, RoPE, RMSNorm, no biases: a
// mhbook.DecoderOnlyLM of LIVE_COPIER_MODEL) trained here, in the page, from a seeded
// initialisation, on random blocks written again and again. Runs after live_core.js ($, esc,
// linearRows, rmsNormRows, ropeFrequencies, ropeRows, mulberry32, heatmap, status, showError):
// the layers' arithmetic is the language models' own. data: {config, task, train, threshold,
// scale}.
//
// THE BACKWARD PASS IS WRITTEN BY HAND, on purpose. The book prefers a well-kept library (an
// autograd library from the npm registry, such as TensorFlow.js, would do the arithmetic), but
// chapter 15 teaches these very gradients, and here the reader can read them: each forward
// function below has its backward beside it, the chain rule written out as the chapter's
// section "Train it in this page" derives it (softmax attention's
// dS = P * (dP - rowsum(dP * P)) with the scale 1/sqrt(d_head), RoPE's backward a rotation by
// the negative angle, RMSNorm's, cross-entropy's softmax - onehot). The forward here is the one
// the panel draws (its attention weights are the heatmaps, its losses the curves): there is no
// second forward for the display. It works on a whole batch at once, in flat Float32Arrays
// (float32 as PyTorch's), row n = sequence b, position t at n = b * T + t, through live_core.js's
// row functions (the language models pass their one new token through the same ones). Only
// its attention is its own, causalAttention: all the batch's queries at once, keeping P for the
// backward, where the language models' attendHeads reads one query over a KV cache; the
// training step does ~10 million multiply-adds and must run in milliseconds.
// tests/viz/test_browser_live_train.py checks the loss and every gradient after step 1, the first
// 50 losses and the phase change against PyTorch (mhbook.training.live_copier).

// ---------------------------------------------------------------- random numbers, both sides
// mulberry32 is live_core.js's (mhbook.training.live_copier.mulberry32 is its Python twin).
const BATCH_SALT = 0x5bd1e995;
const TEST_SEED = 0x7e57;
// The parameters in state_dict order, with their shapes, as DecoderOnlyLM names them.
function parameterShapes(cfg, vocab) {
  const d = cfg.d_model;
  const shapes = [["embedding.weight", [vocab, d]]];
  for (let l = 0; l < cfg.num_layers; l++) {
    for (const w of ["W_q", "W_k", "W_v", "W_o"]) shapes.push([`blocks.${l}.self_attn.${w}.weight`, [d, d]]);
    shapes.push([`blocks.${l}.addnorm1.norm.weight`, [d]]);
  }
  shapes.push(["norm.weight", [d]], ["output.weight", [vocab, d]]);
  return shapes;
}
// live_copier_init: embeddings N(0, 1) by Box-Muller, linear weights U(-1/sqrt(in), 1/sqrt(in)),
// norm gains 1; PyTorch's initialisation in distribution, drawn from mulberry32(seed).
function initParams(cfg, vocab, seed) {
  const random = mulberry32(seed);
  const P = {};
  for (const [name, shape] of parameterShapes(cfg, vocab)) {
    const n = shape.reduce((a, b) => a * b, 1);
    const values = new Float32Array(n);
    if (name.endsWith("norm.weight")) values.fill(1);
    else if (name === "embedding.weight") {
      for (let i = 0; i < n; i++) {
        const u1 = 1 - random();
        const u2 = random();
        values[i] = Math.sqrt(-2 * Math.log(u1)) * Math.cos(2 * Math.PI * u2);
      }
    } else {
      const bound = 1 / Math.sqrt(shape[1]);
      for (let i = 0; i < n; i++) values[i] = (2 * random() - 1) * bound;
    }
    P[name] = { shape, values };
  }
  return P;
}
// (n, length) ids: per sequence `longest` tokens, then its period; token t is the block's t mod p.
function sequences(random, n, [shortest, longest], length, vocab) {
  const ids = new Int32Array(n * length);
  for (let s = 0; s < n; s++) {
    const block = Array.from({ length: longest }, () => Math.floor(random() * vocab));
    const p = shortest + Math.floor(random() * (longest - shortest + 1));
    for (let t = 0; t < length; t++) ids[s * length + t] = block[t % p];
  }
  return ids;
}
// The next batch of (x, y): sequences of length + 1 cut one token apart.
function nextBatch(random, task, batchSize) {
  const T = task.length;
  const s = sequences(random, batchSize, task.periods, T + 1, task.vocab_size);
  const x = new Int32Array(batchSize * T);
  const y = new Int32Array(batchSize * T);
  for (let b = 0; b < batchSize; b++) {
    for (let t = 0; t < T; t++) {
      x[b * T + t] = s[b * (T + 1) + t];
      y[b * T + t] = s[b * (T + 1) + t + 1];
    }
  }
  return { x, y, B: batchSize };
}

// ---------------------------------------------------------------- the layers and their backward
// linearRows, rmsNormRows, ropeFrequencies and ropeRows are live_core.js's; their backwards:
// Its backward: dW += dy^T x, and dx = dy W (added into dx).
function linearRowsBackward(dy, x, W, n, dW, dx) {
  const [out, inp] = W.shape;
  const w = W.values;
  for (let r = 0; r < n; r++) {
    const xo = r * inp;
    for (let o = 0; o < out; o++) {
      const g = dy[r * out + o];
      if (g === 0) continue;
      const wo = o * inp;
      for (let i = 0; i < inp; i++) {
        dW[wo + i] += g * x[xo + i];
        dx[xo + i] += g * w[wo + i];
      }
    }
  }
}
// Its backward, with g = dy * weight: dx = r g - x r^3 (g . x) / d (added into dx);
// dweight += dy * x * r.
function rmsNormRowsBackward(dy, x, r, weight, n, d, dWeight, dx) {
  for (let row = 0; row < n; row++) {
    const o = row * d;
    let dot = 0;
    for (let i = 0; i < d; i++) {
      const g = dy[o + i] * weight.values[i];
      dot += g * x[o + i];
      dWeight[i] += dy[o + i] * x[o + i] * r[row];
    }
    const c = (r[row] * r[row] * r[row] * dot) / d;
    for (let i = 0; i < d; i++) dx[o + i] += r[row] * dy[o + i] * weight.values[i] - c * x[o + i];
  }
}
// Causal softmax attention, head by head: S = q k^T / sqrt(d_head) over keys j <= i,
// P = softmax(S), o = P v. Returns o (n, heads * dHead) and P (B, heads, T, T), zero above the
// diagonal.
function causalAttention(q, k, v, B, T, heads, dHead) {
  const width = heads * dHead;
  const scale = 1 / Math.sqrt(dHead);
  const o = new Float32Array(B * T * width);
  const P = new Float32Array(B * heads * T * T);
  const s = new Float64Array(T);
  for (let b = 0; b < B; b++) {
    for (let h = 0; h < heads; h++) {
      const ph = (b * heads + h) * T * T;
      for (let i = 0; i < T; i++) {
        const qi = (b * T + i) * width + h * dHead;
        let max = -Infinity;
        for (let j = 0; j <= i; j++) {
          const kj = (b * T + j) * width + h * dHead;
          let dot = 0;
          for (let c = 0; c < dHead; c++) dot += q[qi + c] * k[kj + c];
          s[j] = dot * scale;
          if (s[j] > max) max = s[j];
        }
        let total = 0;
        for (let j = 0; j <= i; j++) {
          s[j] = Math.exp(s[j] - max);
          total += s[j];
        }
        for (let j = 0; j <= i; j++) {
          const p = s[j] / total;
          P[ph + i * T + j] = p;
          const vj = (b * T + j) * width + h * dHead;
          for (let c = 0; c < dHead; c++) o[qi + c] += p * v[vj + c];
        }
      }
    }
  }
  return { o, P };
}
// Its backward. dP_ij = do_i . v_j, dv_j += P_ij do_i; the softmax's
// dS_ij = P_ij (dP_ij - sum_j' dP_ij' P_ij'); S = q k^T / sqrt(d_head) gives
// dq_i += dS_ij k_j / sqrt(d_head), dk_j += dS_ij q_i / sqrt(d_head).
function causalAttentionBackward(dO, q, k, v, P, B, T, heads, dHead) {
  const width = heads * dHead;
  const scale = 1 / Math.sqrt(dHead);
  const dq = new Float32Array(q.length);
  const dk = new Float32Array(k.length);
  const dv = new Float32Array(v.length);
  const dP = new Float64Array(T);
  for (let b = 0; b < B; b++) {
    for (let h = 0; h < heads; h++) {
      const ph = (b * heads + h) * T * T;
      for (let i = 0; i < T; i++) {
        const qi = (b * T + i) * width + h * dHead;
        let rowsum = 0;
        for (let j = 0; j <= i; j++) {
          const vj = (b * T + j) * width + h * dHead;
          const p = P[ph + i * T + j];
          let dot = 0;
          for (let c = 0; c < dHead; c++) {
            dot += dO[qi + c] * v[vj + c];
            dv[vj + c] += p * dO[qi + c];
          }
          dP[j] = dot;
          rowsum += dot * p;
        }
        for (let j = 0; j <= i; j++) {
          const dS = P[ph + i * T + j] * (dP[j] - rowsum) * scale;
          const kj = (b * T + j) * width + h * dHead;
          for (let c = 0; c < dHead; c++) {
            dq[qi + c] += dS * k[kj + c];
            dk[kj + c] += dS * q[qi + c];
          }
        }
      }
    }
  }
  return { dq, dk, dv };
}

// ---------------------------------------------------------------- the model: forward, backward
// DecoderOnlyLM with ffn="none": x = E[ids]; per layer x = x + W_o attention(RoPE(W_q h),
// RoPE(W_k h), W_v h) with h = RMSNorm(x); logits = W_out RMSNorm(x). Keeps what backward needs.
function forward(model, ids, B) {
  const { P, cfg, dims } = model;
  const { d, heads, dHead, T, theta, vocab } = dims;
  const n = B * T;
  const E = P["embedding.weight"].values;
  let x = new Float32Array(n * d);
  for (let r = 0; r < n; r++) x.set(E.subarray(ids[r] * d, ids[r] * d + d), r * d);
  const positions = Int32Array.from({ length: n }, (_, r) => r % T); // row b * T + t is at t
  const layers = [];
  for (let l = 0; l < cfg.num_layers; l++) {
    const name = `blocks.${l}`;
    const norm = rmsNormRows(x, P[`${name}.addnorm1.norm.weight`], n, d, cfg.norm_eps);
    const q = linearRows(norm.y, P[`${name}.self_attn.W_q.weight`], n);
    const k = linearRows(norm.y, P[`${name}.self_attn.W_k.weight`], n);
    const v = linearRows(norm.y, P[`${name}.self_attn.W_v.weight`], n);
    ropeRows(q, positions, heads, dHead, theta);
    ropeRows(k, positions, heads, dHead, theta);
    const att = causalAttention(q, k, v, B, T, heads, dHead);
    const out = linearRows(att.o, P[`${name}.self_attn.W_o.weight`], n);
    const next = new Float32Array(n * d);
    for (let i = 0; i < next.length; i++) next[i] = x[i] + out[i];
    layers.push({ x, norm, q, k, v, o: att.o, P: att.P });
    x = next;
  }
  const final = rmsNormRows(x, P["norm.weight"], n, d, cfg.norm_eps);
  const logits = linearRows(final.y, P["output.weight"], n);
  return { ids, B, n, positions, layers, x, final, logits, vocab };
}
// Cross-entropy, mean over the rows: the loss, and dlogits = (softmax - onehot) / n.
function crossEntropy(logits, y, n, vocab) {
  const dLogits = new Float32Array(n * vocab);
  let loss = 0;
  for (let r = 0; r < n; r++) {
    const o = r * vocab;
    let max = -Infinity;
    for (let c = 0; c < vocab; c++) if (logits[o + c] > max) max = logits[o + c];
    let total = 0;
    for (let c = 0; c < vocab; c++) total += Math.exp(logits[o + c] - max);
    const logTotal = Math.log(total) + max;
    loss += logTotal - logits[o + y[r]];
    for (let c = 0; c < vocab; c++) dLogits[o + c] = Math.exp(logits[o + c] - logTotal) / n;
    dLogits[o + y[r]] -= 1 / n;
  }
  return { loss: loss / n, dLogits };
}
// The chain rule back through forward: every parameter's gradient, by name.
function backward(model, fwd, dLogits) {
  const { P, cfg, dims } = model;
  const { d, heads, dHead, T, theta } = dims;
  const { n, B } = fwd;
  const G = {};
  for (const name of Object.keys(P)) G[name] = new Float32Array(P[name].values.length);
  const dFinal = new Float32Array(n * d);
  linearRowsBackward(dLogits, fwd.final.y, P["output.weight"], n, G["output.weight"], dFinal);
  let dx = new Float32Array(n * d);
  rmsNormRowsBackward(dFinal, fwd.x, fwd.final.r, P["norm.weight"], n, d, G["norm.weight"], dx);
  for (let l = cfg.num_layers - 1; l >= 0; l--) {
    const name = `blocks.${l}`;
    const c = fwd.layers[l];
    const dIn = Float32Array.from(dx); // the residual: x + ... passes dx through
    const dO = new Float32Array(n * d);
    const W = (w) => `${name}.self_attn.${w}.weight`;
    linearRowsBackward(dx, c.o, P[W("W_o")], n, G[W("W_o")], dO);
    const { dq, dk, dv } = causalAttentionBackward(dO, c.q, c.k, c.v, c.P, B, T, heads, dHead);
    ropeRows(dq, fwd.positions, heads, dHead, theta, -1);
    ropeRows(dk, fwd.positions, heads, dHead, theta, -1);
    const dNorm = new Float32Array(n * d);
    linearRowsBackward(dq, c.norm.y, P[W("W_q")], n, G[W("W_q")], dNorm);
    linearRowsBackward(dk, c.norm.y, P[W("W_k")], n, G[W("W_k")], dNorm);
    linearRowsBackward(dv, c.norm.y, P[W("W_v")], n, G[W("W_v")], dNorm);
    const gain = `${name}.addnorm1.norm.weight`;
    rmsNormRowsBackward(dNorm, c.x, c.norm.r, P[gain], n, d, G[gain], dIn);
    dx = dIn;
  }
  const dE = G["embedding.weight"];
  for (let r = 0; r < n; r++) {
    const e = fwd.ids[r] * d;
    for (let i = 0; i < d; i++) dE[e + i] += dx[r * d + i];
  }
  return G;
}
// torch.nn.utils.clip_grad_norm_: scale every gradient by min(1, clip / (norm + 1e-6)).
function clipGradNorm(G, clip) {
  let squares = 0;
  for (const g of Object.values(G)) for (const v of g) squares += v * v;
  const norm = Math.sqrt(squares);
  const coef = Math.min(1, clip / (norm + 1e-6));
  if (coef < 1) for (const g of Object.values(G)) for (let i = 0; i < g.length; i++) g[i] *= coef;
  return norm;
}
// torch.optim.AdamW (make_optimizer: betas (0.9, 0.98), eps 1e-9, weight decay 0 here):
// m = b1 m + (1 - b1) g, v = b2 v + (1 - b2) g^2, p -= lr / (1 - b1^t) * m /
// (sqrt(v) / sqrt(1 - b2^t) + eps), after p *= 1 - lr * weight_decay.
function adamStep(model, G, lr) {
  const { P, adam, train } = model;
  const [b1, b2] = train.betas;
  adam.t += 1;
  const c1 = 1 - b1 ** adam.t;
  const c2 = Math.sqrt(1 - b2 ** adam.t);
  for (const [name, p] of Object.entries(P)) {
    const w = p.values;
    const g = G[name];
    const m = adam.m[name];
    const v = adam.v[name];
    for (let i = 0; i < w.length; i++) {
      w[i] *= 1 - lr * train.weight_decay;
      m[i] = b1 * m[i] + (1 - b1) * g[i];
      v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
      w[i] -= (lr / c1) * (m[i] / (Math.sqrt(v[i]) / c2 + train.eps));
    }
  }
}

// ---------------------------------------------------------------- a run: model, steps, looks
// A fresh run: the weights of `seed`, Adam's moments at zero, the batches' generator.
function newRun({ seed = 0, layers = data.config.num_layers, lr = data.train.lr } = {}) {
  const cfg = { ...data.config, num_layers: layers };
  const task = data.task;
  const dHead = cfg.d_model / cfg.num_heads;
  const dims = { d: cfg.d_model, heads: cfg.num_heads, dHead, T: task.length,
    vocab: task.vocab_size, theta: ropeFrequencies(dHead, cfg.rope_theta) };
  const P = initParams(cfg, task.vocab_size, seed);
  const zeros = () => Object.fromEntries(Object.entries(P).map(([k, p]) =>
    [k, new Float32Array(p.values.length)]));
  const p = task.periods[1];
  return { P, cfg, dims, task, train: data.train, seed, lr, step: 0, losses: [], looks: [],
    adam: { t: 0, m: zeros(), v: zeros() },
    random: mulberry32((seed ^ BATCH_SALT) >>> 0),
    test: sequences(mulberry32(TEST_SEED), task.test_sequences, [p, p], task.length,
      task.vocab_size) };
}
// One training step: a batch, forward, loss, backward, clipping, AdamW.
// Returns {loss, grads (before clipping), norm}.
function trainStep(model) {
  const { x, y, B } = nextBatch(model.random, model.task, model.train.batch_size);
  const fwd = forward(model, x, B);
  const { loss, dLogits } = crossEntropy(fwd.logits, y, fwd.n, model.dims.vocab);
  const G = backward(model, fwd, dLogits);
  const grads = Object.fromEntries(Object.entries(G).map(([k, g]) => [k, Float32Array.from(g)]));
  const norm = clipGradNorm(G, model.train.clip_norm);
  adamStep(model, G, model.lr);
  model.step += 1;
  model.losses.push(loss);
  return { loss, grads, norm };
}
// A look, as chapter 15's probe: on the fixed test blocks of p tokens written twice, the loss on
// the tokens 1..p-1 of the first copy and p+1.. of the second, every head's previous-token score
// (mean weight on key i - 1) and induction score (mean weight on key i - p + 1 over the second
// copy's queries), [layer][head]; and the first sequence's weights, for the maps.
function look(model) {
  const { task, dims, cfg } = model;
  const T = task.length;
  const p = task.periods[1];
  const B = task.test_sequences;
  const fwd = forward(model, model.test, B);
  let first = 0;
  let second = 0;
  for (let b = 0; b < B; b++) {
    for (let t = 0; t < T - 1; t++) {
      const r = b * T + t;
      const o = r * dims.vocab;
      let max = -Infinity;
      for (let c = 0; c < dims.vocab; c++) max = Math.max(max, fwd.logits[o + c]);
      let total = 0;
      for (let c = 0; c < dims.vocab; c++) total += Math.exp(fwd.logits[o + c] - max);
      const loss = Math.log(total) + max - fwd.logits[o + model.test[r + 1]];
      if (t < p - 1) first += loss;
      else if (t >= p) second += loss;
    }
  }
  first /= B * (p - 1);
  second /= B * (T - 1 - p);
  const previous = [];
  const induction = [];
  fwd.layers.forEach(({ P }) => {
    const prev = [];
    const ind = [];
    for (let h = 0; h < dims.heads; h++) {
      let sp = 0;
      let si = 0;
      for (let b = 0; b < B; b++) {
        const ph = (b * dims.heads + h) * T * T;
        for (let i = 1; i < T; i++) sp += P[ph + i * T + i - 1];
        for (let i = p; i < T; i++) si += P[ph + i * T + i - p + 1];
      }
      prev.push(sp / (B * (T - 1)));
      ind.push(si / (B * (T - p)));
    }
    previous.push(prev);
    induction.push(ind);
  });
  const maps = fwd.layers.map(({ P }) => Array.from({ length: dims.heads }, (_, h) =>
    Array.from({ length: T }, (_, i) => Array.from(P.subarray(h * T * T + i * T,
      h * T * T + i * T + T)))));
  void cfg;
  return { step: model.step, first, second, previous, induction, maps };
}
// chapter 15's phase change: the first look whose second-copy loss is below ln(vocab) / 2; and
// for every head, the first look above the threshold.
function phaseChange(looks, vocab) {
  const chance = Math.log(vocab);
  const hit = looks.find((r) => r.second < chance / 2);
  const crossed = {};
  for (const kind of ["previous", "induction"]) {
    crossed[kind] = looks[0][kind].map((row, l) => row.map((_, h) => {
      const r = looks.find((x) => x[kind][l][h] > data.threshold);
      return r ? r.step : null;
    }));
  }
  return { change: hit ? hit.step : null, crossed };
}

// ---------------------------------------------------------------- the console API
// For the reader's console and the browser test: a run of its own, not the panel's.
let apiRun = null;
function trainInit(options = {}) {
  apiRun = newRun(options);
  return Object.fromEntries(Object.entries(apiRun.P).map(([k, p]) => [k, Array.from(p.values)]));
}
function trainStepApi() {
  if (!apiRun) trainInit();
  const { loss, grads, norm } = trainStep(apiRun);
  return { loss, norm, grads: Object.fromEntries(Object.entries(grads).map(([k, g]) =>
    [k, Array.from(g)])) };
}
// `steps` steps of a fresh run, a look every `every`, stopping `after` steps past the phase
// change if given: {losses, looks (no maps), change, crossed, seconds, stepsPerSecond}.
function trainRun({ seed = 0, layers, lr, steps = data.train.num_steps, every = 10,
  after = null } = {}) {
  const model = newRun({ seed, layers, lr });
  const strip = ({ maps, ...rest }) => rest;
  model.looks.push(strip(look(model)));
  const begun = performance.now();
  let change = null;
  while (model.step < steps) {
    trainStep(model);
    if (model.step % every === 0) {
      model.looks.push(strip(look(model)));
      change = phaseChange(model.looks, model.dims.vocab).change;
      if (after !== null && change !== null && model.step >= change + after) break;
    }
  }
  const seconds = (performance.now() - begun) / 1000;
  return { losses: model.losses, looks: model.looks, ...phaseChange(model.looks, model.dims.vocab),
    seconds, stepsPerSecond: model.step / seconds };
}

// ---------------------------------------------------------------- the panel
const EVERY = 10; // a look every 10 steps
const chance = Math.log(data.task.vocab_size);
const seedBox = $(".mhbook-live-train-seed");
const lrBox = $(".mhbook-live-train-lr");
const layersBox = $(".mhbook-live-train-layers");
const startButton = $(".mhbook-live-train-start");
const stepButton = $(".mhbook-live-train-step");
const resetButton = $(".mhbook-live-train-reset");
const lossChart = $(".mhbook-live-train-loss");
const prevChart = $(".mhbook-live-train-previous");
const indChart = $(".mhbook-live-train-induction");
const crossedTable = $(".mhbook-live-train-crossed");
const maps = $(".mhbook-live-maps");
const HEAD_COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"];
let panel = null;
let running = false;
let lastShown = 0;
let lastMaps = 0;
let startedAt = 0;
let stepsAtStart = 0;

// A line chart in SVG: axes with ticks, labels, a legend; `series` [{label, x, y, colour,
// dash}], `hlines` [{y, label}], `vline` {x, label} or null.
function lineChart(title, xlabel, ylabel, series, { xmax, ymax, hlines = [], vline = null }) {
  const W = 540;
  const H = 250;
  const L = 52;
  const R = 170;
  const top = 26;
  const bottom = 40;
  const pw = W - L - R;
  const ph = H - top - bottom;
  const X = (x) => L + (x / xmax) * pw;
  const Y = (y) => top + (1 - Math.min(1, Math.max(0, y / ymax))) * ph;
  let body = `<text x="${L + pw / 2}" y="16" text-anchor="middle" font-size="13" ` +
    `font-weight="bold">${esc(title)}</text>`;
  body += `<rect x="${L}" y="${top}" width="${pw}" height="${ph}" fill="none" stroke="#444"/>`;
  for (let k = 0; k <= 4; k++) {
    const xv = Math.round((xmax * k) / 4);
    body += `<text x="${X(xv)}" y="${top + ph + 14}" text-anchor="middle" font-size="11">${xv}</text>`;
  }
  const yticks = ymax <= 1 ? 4 : ymax; // 0, 0.25, ... 1; or the whole numbers
  for (let k = 0; k <= yticks; k++) {
    const yv = (ymax * k) / yticks;
    body += `<text x="${L - 5}" y="${Y(yv) + 4}" text-anchor="end" font-size="11">` +
      `${ymax <= 1 ? yv.toFixed(2) : yv}</text>`;
    body += `<line x1="${L}" x2="${L + pw}" y1="${Y(yv)}" y2="${Y(yv)}" stroke="#ddd"/>`;
  }
  body += `<text x="${L + pw / 2}" y="${H - 6}" text-anchor="middle" font-size="12">${esc(xlabel)}</text>`;
  body += `<text transform="translate(14,${top + ph / 2}) rotate(-90)" text-anchor="middle" ` +
    `font-size="12">${esc(ylabel)}</text>`;
  for (const h of hlines) {
    body += `<line x1="${L}" x2="${L + pw}" y1="${Y(h.y)}" y2="${Y(h.y)}" stroke="#555" ` +
      `stroke-dasharray="5 4"/>`;
  }
  if (vline) {
    body += `<line x1="${X(vline.x)}" x2="${X(vline.x)}" y1="${top}" y2="${top + ph}" ` +
      `stroke="#000" stroke-dasharray="2 3" stroke-width="1.5"/>`;
  }
  for (const s of series) {
    if (!s.x.length) continue;
    const points = s.x.map((x, i) => `${X(x).toFixed(1)},${Y(s.y[i]).toFixed(1)}`).join(" ");
    body += `<polyline points="${points}" fill="none" stroke="${s.colour}" stroke-width="1.8"` +
      `${s.dash ? ` stroke-dasharray="${s.dash}"` : ""}/>`;
  }
  const legend = [...series.map((s) => ({ ...s, kind: "line" })),
    ...hlines.map((h) => ({ label: h.label, colour: "#555", dash: "5 4" })),
    ...(vline ? [{ label: vline.label, colour: "#000", dash: "2 3" }] : [])];
  legend.forEach((s, i) => {
    const y = top + 8 + i * 16;
    body += `<line x1="${L + pw + 8}" x2="${L + pw + 30}" y1="${y}" y2="${y}" stroke="${s.colour}" ` +
      `stroke-width="2"${s.dash ? ` stroke-dasharray="${s.dash}"` : ""}/>` +
      `<text x="${L + pw + 34}" y="${y + 4}" font-size="11">${esc(s.label)}</text>`;
  });
  return `<svg role="img" aria-label="${esc(title)}" width="${W}" height="${H}" ` +
    `viewBox="0 0 ${W} ${H}">${body}</svg>`;
}
// Everything the panel shows; the maps only when `withMaps` (while it trains: every 0.5 s).
function draw(withMaps = true) {
  if (!panel) return;
  const { looks, dims, cfg } = panel;
  const steps = looks.map((r) => r.step);
  const xmax = Math.max(500, Math.ceil(panel.step / 500) * 500);
  const { change, crossed } = phaseChange(looks, dims.vocab);
  const vline = change === null ? null : { x: change, label: `phase change, step ${change}` };
  lossChart.innerHTML = lineChart("Loss on each copy of the block", "training step",
    "loss (nats per token)", [
      { label: "first copy", x: steps, y: looks.map((r) => r.first), colour: "#1f77b4" },
      { label: "second copy", x: steps, y: looks.map((r) => r.second), colour: "#d62728" },
    ], { xmax, ymax: Math.ceil(chance + 1), vline,
      hlines: [{ y: chance, label: `uniform guess, ${chance.toFixed(2)}` }] });
  for (const [kind, chart, title] of [["previous", prevChart, "Previous-token score of every head"],
    ["induction", indChart, "Induction score of every head"]]) {
    const series = [];
    for (let l = 0; l < cfg.num_layers; l++) {
      for (let h = 0; h < dims.heads; h++) {
        series.push({ label: `layer ${l + 1}, head ${h + 1}`, x: steps,
          y: looks.map((r) => r[kind][l][h]), colour: HEAD_COLOURS[h], dash: l ? "6 3" : "" });
      }
    }
    chart.innerHTML = lineChart(title, "training step", "mean attention weight", series,
      { xmax, ymax: 1, vline, hlines: [{ y: data.threshold, label: `threshold ${data.threshold}` }] });
  }
  let rows = "";
  for (let l = 0; l < cfg.num_layers; l++) {
    for (let h = 0; h < dims.heads; h++) {
      const last = looks[looks.length - 1];
      const at = (kind) => (crossed[kind][l][h] === null ? "not yet" : `step ${crossed[kind][l][h]}`);
      rows += `<tr><th scope="row">layer ${l + 1}, head ${h + 1}</th>` +
        `<td>${last.previous[l][h].toFixed(2)}</td><td>${at("previous")}</td>` +
        `<td>${last.induction[l][h].toFixed(2)}</td><td>${at("induction")}</td></tr>`;
    }
  }
  crossedTable.innerHTML = `<caption>Each head's scores now, and the step at which each first ` +
    `passed ${data.threshold}</caption><thead><tr><th scope="col">head</th>` +
    `<th scope="col">previous-token</th><th scope="col">passed</th>` +
    `<th scope="col">induction</th><th scope="col">passed</th></tr></thead><tbody>${rows}</tbody>`;
  const shown = looks[looks.length - 1];
  if (withMaps) drawMaps(shown);
  const rate = running && panel.step > stepsAtStart
    ? `, ${((panel.step - stepsAtStart) / ((performance.now() - startedAt) / 1000)).toFixed(0)} steps per second`
    : "";
  status.textContent = `Step ${panel.step}: ${panel.losses.length ? `training loss ` +
    `${panel.losses[panel.losses.length - 1].toFixed(2)}, ` : "not trained yet; "}` +
    `on the fixed blocks first copy ${shown.first.toFixed(2)}, ` +
    `second copy ${shown.second.toFixed(2)} nats${rate}` +
    (change === null ? "." : `; the phase change came at step ${change}.`);
  lastShown = performance.now();
}
// Every head's weights on the fixed sequence, [query][key] from 0 to 1 in the book's colour map
// (data.scale, as live_core.js's heatmap). Drawn on canvases rather than by heatmap's SVG:
// its 8,192 cells with their tooltips take most of a second to redraw, too slow to follow the
// training; the canvases take milliseconds. Built once, repainted at every redraw.
const CELL = 5;
function drawMaps(shown) {
  const T = data.task.length;
  const lut = data.scale.colours;
  const left = 22;
  const top = 14;
  const size = left + CELL * T + 2;
  const count = shown.maps.length * shown.maps[0].length;
  if (maps.querySelectorAll("canvas").length !== count) {
    let html = "";
    shown.maps.forEach((layer, l) => layer.forEach((_, h) => {
      const title = `Layer ${l + 1}, head ${h + 1}`;
      html += `<figure class="mhbook-live-map"><figcaption>${esc(title)}</figcaption>` +
        `<canvas width="${size}" height="${top + CELL * T + 2}" role="img" aria-label="${esc(title)}` +
        `: attention weights of the ${T} positions of the fixed sequence, queries down, keys ` +
        `across"></canvas></figure>`;
    }));
    maps.innerHTML = html;
  }
  const canvases = maps.querySelectorAll("canvas");
  let k = 0;
  shown.maps.forEach((layer) => layer.forEach((w) => {
    const ctx = canvases[k++].getContext("2d");
    ctx.fillStyle = "#fff";
    ctx.fillRect(0, 0, size, top + CELL * T + 2);
    ctx.fillStyle = "#000";
    ctx.font = "10px sans-serif";
    ctx.textAlign = "center";
    for (let t = 0; t < T; t += 8) {
      ctx.fillText(String(t), left + CELL * (t + 0.5), top - 3); // keys, across
      ctx.textAlign = "right";
      ctx.fillText(String(t), left - 3, top + CELL * (t + 1));   // queries, down
      ctx.textAlign = "center";
    }
    w.forEach((row, i) => row.forEach((v, j) => {
      ctx.fillStyle = lut[Math.round(Math.min(1, Math.max(0, v)) * (lut.length - 1))];
      ctx.fillRect(left + j * CELL, top + i * CELL, CELL, CELL);
    }));
  }));
}
function reset() {
  showError("");
  try {
    const seed = numberIn(seedBox, "The seed", 0, 4294967295);
    panel = newRun({ seed, layers: Number(layersBox.value), lr: Number(lrBox.value) });
    panel.looks.push(look(panel));
    draw();
  } catch (err) {
    panel = null;
    showError(err.message);
  }
}
function oneStep() {
  trainStep(panel);
  if (panel.step % EVERY === 0) panel.looks.push(look(panel));
}
function setRunning(on) {
  running = on;
  // The label says what the button will do; no aria-pressed, whose toggle keeps one label.
  startButton.textContent = on ? "Pause" : "Start";
}
// Training in slices of ~40 ms that yield to the page between them.
function slice() {
  if (!running || !panel) return;
  const begun = performance.now();
  while (performance.now() - begun < 30 && panel.step < data.train.num_steps) oneStep();
  const now = performance.now();
  if (now - lastMaps > 500) {
    draw(true);
    lastMaps = performance.now();
  } else if (now - lastShown > 300) draw(false);
  if (panel.step >= data.train.num_steps) {
    setRunning(false);
    draw();
    return;
  }
  setTimeout(slice, 0);
}
startButton.addEventListener("click", () => {
  if (!panel) reset();
  if (!panel) return;
  setRunning(!running);
  if (running) {
    startedAt = performance.now();
    stepsAtStart = panel.step;
    slice();
  } else draw();
});
stepButton.addEventListener("click", () => {
  if (!panel) reset();
  if (!panel) return;
  setRunning(false);
  trainStep(panel);
  panel.looks.push(look(panel));
  draw();
});
resetButton.addEventListener("click", () => {
  setRunning(false);
  reset();
});
for (const box of [seedBox, lrBox, layersBox]) {
  box.addEventListener("change", () => {
    setRunning(false);
    reset();
  });
}
root.querySelector("details").addEventListener("toggle", (event) => {
  if (event.target.open && !panel) reset();
});
if (root.querySelector("details").open) reset(); // a page of its own shows it open
window.mhbookLive = Object.assign(window.mhbookLive || {}, {
  trainInit,
  trainStep: trainStepApi,
  trainRun,
});
