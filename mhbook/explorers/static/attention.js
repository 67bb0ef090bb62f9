// The attention explorer of chapter 1 (mhbook/explorers/attention.py writes its page).
// data: {X: (n, d) embeddings, scale: colour_scale(), titles: [one per focus choice],
//        presets: [[q_diag, k_diag], one per focus choice]}; choice 0 = "none", 1 + a = axis a.
const X = data.X;
const d = X[0].length;
const svg = root.querySelector(".mhbook-explorer-heatmap");
const focus = root.querySelector(".mhbook-explorer-focus");
const sliders = (m) => Array.from(root.querySelectorAll(`input[data-matrix="${m}"]`));
const qs = sliders("q");
const ks = sliders("k");
const values = (list) => list.map((s) => parseFloat(s.value));
const choice = () => (focus.value === "none" ? 0 : Number(focus.value) + 1);

// softmax((X diag(q)) (X diag(k))^T / sqrt(d)), one query (row) at a time.
// The reference is explorer_weights in Python; tests/test_plot.py compares the two.
function weights(q, k) {
  return X.map((xi) => {
    const scores = X.map((xj) => {
      let s = 0;
      for (let a = 0; a < d; a++) s += xi[a] * q[a] * xj[a] * k[a];
      return s / Math.sqrt(d);
    });
    const m = Math.max(...scores);
    const e = scores.map((s) => Math.exp(s - m));
    const sum = e.reduce((x, y) => x + y, 0);
    return e.map((v) => v / sum);
  });
}

function redraw() {
  const q = values(qs);
  const k = values(ks);
  drawHeatmap(svg, weights(q, k), data.scale);
  for (const s of qs.concat(ks)) {
    const readout = root.querySelector(`output[data-for="${s.id}"]`);
    if (readout) readout.textContent = parseFloat(s.value).toFixed(1);
  }
  svg.querySelector(".mhbook-explorer-title").textContent = data.titles[choice()];
  const diag = (v) => v.map((x) => x.toFixed(1)).join(", ");
  svg.querySelector(".mhbook-explorer-subtitle").textContent =
    `W_q = diag(${diag(q)}),  W_k = diag(${diag(k)})`;
}

focus.addEventListener("change", () => {
  const [q, k] = data.presets[choice()];
  qs.forEach((s, a) => (s.value = q[a]));
  ks.forEach((s, a) => (s.value = k[a]));
  redraw();
});
for (const s of qs.concat(ks)) s.addEventListener("input", redraw);
redraw();
