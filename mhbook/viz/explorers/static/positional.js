// The positional-encoding explorer of chapter 5 (mhbook/viz/explorers/positional.py writes it).
// data: {L: number of positions, d: width of the code}.
const L = data.L;
const d = data.d;
const slider = (name) => root.querySelector(`input[id$='-${name}']`);
const [tIn, sIn, iIn] = ["t", "s", "i"].map(slider);
const svg = (name) => root.querySelector(`svg[id$='-${name}']`);
const readouts = root.querySelector(".mhbook-explorer-readouts");

// P[t, 2i] = sin(t w_i), P[t, 2i+1] = cos(t w_i), w_i = 10000^(-2i/d): the reference is
// mhbook.sinusoidal_encoding; the tests compare the two.
const omega = (j) => Math.pow(10000, -(j - (j % 2)) / d);
const code = (t) => Array.from({ length: d }, (_, j) => (j % 2 ? Math.cos : Math.sin)(t * omega(j)));
const P = Array.from({ length: L }, (_, t) => code(t));
const dot = (a, b) => a.reduce((s, x, j) => s + x * b[j], 0);

function redraw() {
  const t = +tIn.value;
  const s = +sIn.value;
  const i = +iIn.value;
  for (const el of [tIn, sIn, iIn]) root.querySelector(`output[for="${el.id}"]`).textContent = el.value;
  drawBars(svg("code"), P[t], null);
  svg("code").querySelector(".mhbook-explorer-title").textContent = `the code P_t of position t = ${t}`;
  const positions = P.map((_, u) => u);
  drawLines(svg("column"), [{ x: positions, y: P.map((p) => p[i]), marker: [t, P[t][i]] }]);
  const w = omega(i);
  svg("column").querySelector(".mhbook-explorer-title").textContent =
    `dimension i = ${i} over the positions`;
  svg("column").querySelector(".mhbook-explorer-subtitle").textContent =
    `${i % 2 ? "cos" : "sin"}(ω t), ω = ${w.toPrecision(3)}, period ${(2 * Math.PI / w).toPrecision(3)}`;
  const offsets = positions.map((u) => u - t);
  const dots = positions.map((u) => dot(P[t], P[u]));
  const every = Array.from({ length: 2 * L - 1 }, (_, n) => n - (L - 1));
  const formula = every.map((k) => {
    let sum = 0;
    for (let j = 0; j < d; j += 2) sum += Math.cos(omega(j) * k);
    return sum;
  });
  const ts = dot(P[t], P[s]);
  drawLines(svg("dots"), [
    { x: every, y: formula, marker: null },
    { x: offsets, y: dots, marker: [s - t, ts] },
  ]);
  svg("dots").querySelector(".mhbook-explorer-subtitle").textContent =
    `t = ${t}: offsets ${-t} to ${L - 1 - t}`;
  readouts.innerHTML =
    `P[t, i] = P[${t}, ${i}] = ${P[t][i].toFixed(3)}<br>` +
    `P_t · P_s = P_${t} · P_${s} = ${ts.toFixed(3)}<br>offset s − t = ${s - t}; ` +
    `‖P_t‖² = ${dot(P[t], P[t]).toFixed(3)} = d/2`;
  const r = (v) => Number(v.toPrecision(8));
  readouts.dataset.stats = JSON.stringify({ dot: r(ts), value: r(P[t][i]), dots: dots.map(r) });
}

for (const el of [tIn, sIn, iIn]) el.addEventListener("input", redraw);
redraw();
