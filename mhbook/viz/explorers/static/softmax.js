// The softmax explorer of chapter 2 (mhbook/viz/explorers/softmax.py writes its page).
// data: {dims: [d_k, ...], raw: [d_k][query][key] dot products q.k_j, upstream: the same
// shape, gradients g_j; scale}.
const dk = root.querySelector("input[id$='-dk']");
const temperature = root.querySelector("input[id$='-temperature']");
const query = root.querySelector("input[id$='-query']");
const scaled = root.querySelector("input[id$='-scaled']");
const bars = root.querySelector("svg[id$='-weights']");
const chart = root.querySelector("svg[id$='-norms']");
const readouts = root.querySelector(".mhbook-explorer-readouts");

// Weights, Jacobian J = diag(a) - a a^T and gradient dL/ds = J g of one query.
// The reference is softmax_stats in Python (autograd); tests compare the two.
function stats(n, i, isScaled, T) {
  const d = data.dims[n];
  const s = data.raw[n][i].map((x) => x / (isScaled ? Math.sqrt(d) : 1) / T);
  const a = softmax(s);
  const g = data.upstream[n][i];
  let frob = 0;
  let jmax = 0;
  const grad = a.map(() => 0);
  a.forEach((aj, j) => {
    a.forEach((al, l) => {
      const J = (j === l ? aj : 0) - aj * al;
      frob += J * J;
      jmax = Math.max(jmax, Math.abs(J));
      grad[j] += J * g[l];
    });
  });
  return {
    weights: a,
    max_weight: Math.max(...a),
    entropy: a.reduce((h, p) => (p > 0 ? h - p * Math.log(p) : h), 0),
    jacobian_norm: Math.sqrt(frob),
    jacobian_max: jmax,
    grad_norm: Math.sqrt(grad.reduce((t, x) => t + x * x, 0)),
  };
}

const fmt = (x) => (x >= 0.01 || x === 0 ? x.toFixed(3) : x.toExponential(1));
function redraw() {
  const n = +dk.value;
  const d = data.dims[n];
  const T = parseFloat(temperature.value);
  const i = +query.value;
  const st = stats(n, i, scaled.checked, T);
  dk.setAttribute("aria-valuetext", `d_k = ${d}`);
  root.querySelector(`output[for="${dk.id}"]`).textContent = d;
  root.querySelector(`output[for="${temperature.id}"]`).textContent = T.toFixed(1);
  root.querySelector(`output[for="${query.id}"]`).textContent = i;
  drawBars(bars, st.weights, data.scale);
  const x = data.dims.map(Math.log2);
  const median = (v) => {
    const s = v.slice().sort((a, b) => a - b);
    const h = s.length >> 1;
    return s.length % 2 ? s[h] : (s[h - 1] + s[h]) / 2;
  };
  const norms = (way) =>
    data.dims.map((_, m) => median(data.raw[m].map((_, q) => stats(m, q, way, T).jacobian_norm)));
  const marker = [Math.log2(d), st.jacobian_norm];
  drawLines(chart, [
    { x, y: norms(false), marker: scaled.checked ? null : marker },
    { x, y: norms(true), marker: scaled.checked ? marker : null },
  ]);
  const divisor = scaled.checked ? `√${d} · ${T.toFixed(1)}` : T.toFixed(1);
  bars.querySelector(".mhbook-explorer-title").textContent = `softmax weights of query ${i}`;
  bars.querySelector(".mhbook-explorer-subtitle").textContent =
    `d_k = ${d}, scores q·k divided by ${divisor}`;
  readouts.innerHTML =
    `largest weight ${st.max_weight.toFixed(3)}<br>` +
    `entropy ${st.entropy.toFixed(3)} (uniform: ${Math.log(st.weights.length).toFixed(3)})<br>` +
    `‖J‖<sub>F</sub> = ${fmt(st.jacobian_norm)}, max |J<sub>jl</sub>| = ${fmt(st.jacobian_max)}<br>` +
    `‖∂L/∂s‖ = ${fmt(st.grad_norm)}`;
  const round = (v) => (Array.isArray(v) ? v.map(round) : Number(v.toPrecision(6)));
  readouts.dataset.stats = JSON.stringify(Object.fromEntries(Object.entries(st).map(([k, v]) => [k, round(v)])));
}

for (const control of [dk, temperature, query]) control.addEventListener("input", redraw);
scaled.addEventListener("change", redraw);
redraw();
