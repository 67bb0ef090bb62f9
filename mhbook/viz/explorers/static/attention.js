// The attention explorer of chapter 1 (mhbook/viz/explorers/attention.py writes its page).
// data: {X: (n, d) embeddings, names: preset names, presets: [[W_q, W_k, W_v], ...] (d x d,
//        rows = input axes), scale, outputScale: colour scales of the weights and outputs}.
const X = data.X;
const d = X[0].length;
const weightsSvg = root.querySelector("svg[id$='-heatmap']");
const outputSvg = root.querySelector("svg[id$='-output']");
const preset = root.querySelector(".mhbook-explorer-preset");
const entries = Array.from(root.querySelectorAll("input.mhbook-explorer-entry"));
const matrix = (m) => {
  const W = Array.from({ length: d }, () => new Array(d).fill(0));
  for (const e of entries) {
    if (e.dataset.matrix === m) W[+e.dataset.i][+e.dataset.j] = parseFloat(e.value) || 0;
  }
  return W;
};
const times = (A, B) => A.map((row) => B[0].map((_, j) => row.reduce((s, a, k) => s + a * B[k][j], 0)));

// softmax((X W_q)(X W_k)^T / sqrt(d)) and the outputs A (X W_v), one query (row) at a time.
// The reference is explorer_attention in Python; tests/book/test_browser.py compares the two.
function attention(Wq, Wk, Wv) {
  const Q = times(X, Wq);
  const K = times(X, Wk);
  const V = times(X, Wv);
  const A = Q.map((q) => softmax(K.map((k) => q.reduce((s, qa, a) => s + qa * k[a], 0) / Math.sqrt(d))));
  return [A, times(A, V)];
}

let edited = false;
function redraw() {
  const [A, O] = attention(matrix("q"), matrix("k"), matrix("v"));
  drawHeatmap(weightsSvg, A, data.scale);
  drawHeatmap(outputSvg, O, data.outputScale);
  const name = data.names[+preset.value] + (edited ? ", edited" : "");
  weightsSvg.querySelector(".mhbook-explorer-subtitle").textContent = `preset: ${name}`;
}

function apply(n) {
  data.presets[n].forEach((W, index) => {
    const m = "qkv"[index];
    for (const e of entries) if (e.dataset.matrix === m) e.value = W[+e.dataset.i][+e.dataset.j];
  });
  edited = false;
  redraw();
}

preset.addEventListener("change", () => apply(+preset.value));
root.querySelector(".mhbook-explorer-reset").addEventListener("click", () => {
  preset.value = "0";
  apply(0);
});
for (const e of entries) {
  e.addEventListener("input", () => {
    edited = true;
    redraw();
  });
}
redraw();
