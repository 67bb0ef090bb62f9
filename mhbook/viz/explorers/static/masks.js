// The mask builder of chapter 3 (mhbook/viz/explorers/masks.py writes its page).
// data: {scores: (max_queries, max_keys) fixed scores, scale, maskScale}.
const control = (name) => root.querySelector(`[id$='-${name}']`);
const lq = control("lq");
const lk = control("lk");
const valid = control("valid");
const causal = control("causal");
const note = control("note");
const maskSvg = root.querySelector("svg[id$='-mask']");
const weightsSvg = root.querySelector("svg[id$='-weights']");

// padding & causal, True = may attend; the reference is explorer_mask in Python.
function buildMask(Lq, Lk, validLen, alignment) {
  return Array.from({ length: Lq }, (_, i) =>
    Array.from({ length: Lk }, (_, j) => {
      if (j >= validLen) return false;
      if (alignment === "top-left") return j <= i;
      if (alignment === "bottom-right") return j <= i + (Lk - Lq);
      return true;
    }),
  );
}

// Masked softmax as mhbook does it: masked keys get 0, a row with no key gets all zeros.
function weightsOf(mask) {
  return mask.map((row, i) => {
    if (!row.some((m) => m)) return row.map(() => 0);
    const s = row.map((m, j) => (m ? data.scores[i][j] : -Infinity));
    return softmax(s);
  });
}

function redraw() {
  const Lq = +lq.value;
  const Lk = +lk.value;
  valid.max = Lk;
  if (+valid.value > Lk) valid.value = Lk;
  for (const s of [lq, lk, valid]) root.querySelector(`output[for="${s.id}"]`).textContent = s.value;
  const mask = buildMask(Lq, Lk, +valid.value, causal.value);
  const weights = weightsOf(mask);
  drawHeatmap(maskSvg, mask.map((row) => row.map(Number)), data.maskScale);
  drawHeatmap(weightsSvg, weights, data.scale);
  const empty = mask.map((row, i) => (row.some((m) => m) ? null : `q${i}`)).filter((x) => x);
  const text = empty.length
    ? `no key for ${empty.join(", ")}: weights all 0`
    : "every query has at least one key";
  weightsSvg.querySelector(".mhbook-explorer-subtitle").textContent = text;
  maskSvg.querySelector(".mhbook-explorer-subtitle").textContent =
    `Lq = ${Lq}, Lk = ${Lk}, ${valid.value} valid keys, causal: ${causal.value}`;
  note.textContent =
    causal.value === "bottom-right" && Lq > Lk
      ? "Lq > Lk: mhbook.causal_mask refuses this shape, since the first queries see no key."
      : "";
}

for (const s of [lq, lk, valid]) s.addEventListener("input", redraw);
causal.addEventListener("change", redraw);
redraw();
