// The attention viewer of chapters 6 and 7 (mhbook/viz/explorers/viewer.py writes its page).
// data: viewer_payload() plus `initial` = {index, kind, layer, head, remove}. Its `text` and
// `weights` are zlib + base64: unpacked here with DecompressionStream("deflate"). The weights
// are uint8, round(255 w), number by number; per number kind by kind (encoder self (S, S),
// decoder self (T, T), cross (T, S)), layer by layer, head by head, each map row by row.
const L = data.numLayers;
const H = data.numHeads;
const $ = (selector) => root.querySelector(selector);
const numberInput = $(".mhbook-viewer-number");
const pick = $(".mhbook-viewer-pick");
const kindSelect = $(".mhbook-viewer-kind");
const layerSelect = $(".mhbook-viewer-layer");
const headSelect = $(".mhbook-viewer-head");
const hint = $(".mhbook-viewer-hint");
const sentence = $(".mhbook-viewer-sentence");
const mapsBox = $(".mhbook-viewer-maps");
const effect = $(".mhbook-viewer-effect");
const broken = $(".mhbook-viewer-broken");
const radios = Array.from(root.querySelectorAll(`input[name="${root.id}-remove"]`));
const byNumber = new Map(data.numbers.map((n, i) => [n, i]));
const sorted = data.numbers.slice().sort((a, b) => a - b);
const state = { index: data.initial.index, remove: data.initial.remove, shownRemove: null };
let text = null; // the unpacked `text` blob
let weights = null; // Uint8Array of every weight
let offsets = null; // offsets[n]: where number n's weights start

const esc = (s) =>
  String(s).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
const spaced = (n) => n.toLocaleString("en-US").replace(/,/g, "\u2009");
const percent = (x) => (100 * x).toFixed(1);
// A change of exact match in points, signed: "−5.2", "+0.1", "0.0".
const points = (x) => {
  const s = (100 * x).toFixed(1);
  return /^-?0\.0$/.test(s) ? "0.0" : s.startsWith("-") ? `\u2212${s.slice(1)}` : `+${s}`;
};
const range = (n) => Array.from({ length: n }, (_, i) => i);

async function unpack(b64) {
  const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
  const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("deflate"));
  return new Uint8Array(await new Response(stream).arrayBuffer());
}

// [[Lq, Lk] of encoder self, decoder self, cross] for number n.
function shapes(n) {
  const S = text.src[n].length;
  const T = text.out[n].length;
  return [[S, S], [T, T], [T, S]];
}

// The (Lq, Lk) weights of one map, as numbers in [0, 1].
function mapValues(n, kind, layer, head) {
  const sz = shapes(n);
  let at = offsets[n];
  for (let k = 0; k < kind; k++) at += L * H * sz[k][0] * sz[k][1];
  const [rows, cols] = sz[kind];
  at += (layer * H + head) * rows * cols;
  return range(rows).map((i) =>
    Array.from(weights.subarray(at + i * cols, at + (i + 1) * cols), (q) => q / 255));
}

// Row (query) and column (key) tokens of a kind for number n.
function labels(n, kind) {
  const src = text.src[n];
  const out = text.out[n];
  const read = ["<bos>"].concat(out.slice(0, -1));
  return [[src, src], [read, read], [out, src]][kind];
}

// The largest cell that fits `perRow` maps of `cols` columns side by side.
function fitCell(left, cols, perRow) {
  const budget = (Math.max(mapsBox.clientWidth, 320) - 14 * (perRow - 1)) / perRow;
  return Math.floor((budget - left - 8) / cols);
}

// One heatmap, laid out as heatmap_svg (svg.py) lays out its own (same classes), sized to
// its tokens; drawHeatmap (heatmap.js) colours it. Small maps (a grid of `perRow` heads in
// a row) get cells of 9 to 15 pixels, so that a row of heads fits the page.
function mapMarkup(n, kind, layer, head, small, perRow) {
  const [rowLabels, colLabels] = labels(n, kind);
  const font = small ? 10 : 12;
  const charW = font * 0.62;
  const longest = (list) => Math.max(...list.map((t) => t.length));
  const removed = state.remove >= 0 && data.heads[state.remove].kind === kind &&
    data.heads[state.remove].layer === layer && data.heads[state.remove].head === head;
  const left = 8 + charW * longest(rowLabels);
  const cell = small ? Math.max(9, Math.min(15, fitCell(left, colLabels.length, perRow))) : 34;
  const top = 22;
  const gridW = colLabels.length * cell;
  const gridH = rowLabels.length * cell;
  const title = small
    ? `layer ${layer + 1}, head ${head + 1}`
    : `${data.kinds[kind].name}, layer ${layer + 1}, head ${head + 1}`;
  const shownTitle = `${title}${removed ? " (removed)" : ""}`;
  const width = Math.max(left + gridW + 6, 4 + shownTitle.length * (font + 1) * 0.62);
  const height = top + gridH + 10 + charW * longest(colLabels);
  const aria = `${data.kinds[kind].name}, layer ${layer + 1}, head ${head + 1}, ` +
    `for ${spaced(data.numbers[n])}: rows ${data.kinds[kind].queries}, ` +
    `columns ${data.kinds[kind].keys}${removed ? " (the head removed below)" : ""}`;
  const parts = [
    `<svg class="mhbook-explorer-heatmap mhbook-viewer-map${removed ? " mhbook-viewer-removed" : ""}"` +
    ` role="img" aria-label="${esc(aria)}" data-index="${n}" data-kind="${kind}"` +
    ` data-layer="${layer}" data-head="${head}" width="${width.toFixed(0)}"` +
    ` height="${height.toFixed(0)}" viewBox="0 0 ${width.toFixed(0)} ${height.toFixed(0)}"` +
    ` font-family="DejaVu Sans, Arial, sans-serif" font-size="${font}">`,
    `<text class="mhbook-explorer-title" x="4" y="14" font-size="${font + 1}">` +
    `${esc(shownTitle)}</text>`,
  ];
  rowLabels.forEach((_, i) => colLabels.forEach((_, j) => {
    const x = left + j * cell;
    const y = top + i * cell;
    parts.push(
      `<rect class="mhbook-explorer-cell" data-i="${i}" data-j="${j}" x="${x}" y="${y}"` +
      ` width="${cell}" height="${cell}" fill="#fff" stroke="#fff" stroke-width="1"/>` +
      `<text class="mhbook-explorer-value" data-i="${i}" data-j="${j}" x="${x + cell / 2}"` +
      ` y="${y + cell / 2 + 4}" text-anchor="middle" font-size="10"></text>`);
  }));
  rowLabels.forEach((t, i) => parts.push(
    `<text class="mhbook-explorer-query" x="${left - 4}" y="${top + i * cell + cell / 2 + 4}"` +
    ` text-anchor="end">${esc(t)}</text>`));
  colLabels.forEach((t, j) => {
    const x = left + j * cell + cell / 2 + 4;
    const y = top + gridH + 6;
    parts.push(
      `<text class="mhbook-explorer-key" x="${x}" y="${y}" text-anchor="end"` +
      ` transform="rotate(-90 ${x} ${y})">${esc(t)}</text>`);
  });
  parts.push("</svg>");
  return parts.join("");
}

function render() {
  const n = state.index;
  const kind = Number(kindSelect.value);
  const layers = layerSelect.value === "all" ? range(L) : [Number(layerSelect.value)];
  const heads = headSelect.value === "all" ? range(H) : [Number(headSelect.value)];
  const small = layers.length * heads.length > 1;
  const k = data.kinds[kind];
  // Heads side by side; where a row of them does not fit with cells of 9 pixels, half a row.
  const [rowLabels, colLabels] = labels(n, kind);
  const left = 8 + 6.2 * Math.max(...rowLabels.map((t) => t.length));
  let perRow = heads.length;
  while (perRow > 1 && fitCell(left, colLabels.length, perRow) < 9) perRow = Math.ceil(perRow / 2);
  const rows = [];
  for (const layer of layers) {
    for (let start = 0; start < heads.length; start += perRow) {
      const group = heads.slice(start, start + perRow);
      rows.push(`<div class="mhbook-viewer-row">` +
        group.map((head) => mapMarkup(n, kind, layer, head, small, perRow)).join("") + "</div>");
    }
  }
  mapsBox.classList.toggle("mhbook-viewer-small", small);
  mapsBox.innerHTML =
    `<p class="mhbook-viewer-caption">${esc(k.name)} of ${spaced(data.numbers[n])}: ` +
    `rows are ${esc(k.queries)}, columns ${esc(k.keys)}` +
    `${small ? "; choose one layer and one head to read the weights" : ""}.</p>` +
    rows.join("");
  mapsBox.querySelectorAll("svg.mhbook-viewer-map").forEach((svg) => {
    const d = svg.dataset;
    drawHeatmap(svg, mapValues(n, Number(d.kind), Number(d.layer), Number(d.head)), data.scale);
  });

  const fr = text.translation[n];
  const ref = text.reference[n];
  sentence.innerHTML =
    `<b>${esc(text.english[n])}</b> &rarr; <b>${esc(fr)}</b> ` +
    (fr === ref ? "(right)" : `(wrong: the reference is <i>${esc(ref)}</i>)`) +
    ". The maps are teacher-forced on the model's own translation.";
  renderEffect();
  root.dataset.ready = "true";
}

function renderEffect() {
  const n = state.index;
  const total = data.numbers.length.toLocaleString("en-US");
  if (state.remove < 0) {
    effect.innerHTML =
      `With every head: exact match ${percent(data.exact)}% of the ${total} ${data.split} ` +
      `numbers, ${data.split} loss ${data.loss.toFixed(3)}. Choose a head to remove.`;
    broken.innerHTML = "";
    state.shownRemove = -1;
    return;
  }
  const info = data.heads[state.remove];
  const changed = new Map(text.ablated[state.remove]);
  const fr = changed.has(n) ? changed.get(n) : text.translation[n];
  const right = fr === text.reference[n];
  effect.innerHTML =
    `Without ${esc(info.label)}: exact match ${percent(data.exact)}% &rarr; ` +
    `${percent(info.exact)}% of the ${total} ${data.split} numbers ` +
    `(${points(info.exact - data.exact)} points), ${data.split} loss ` +
    `${data.loss.toFixed(3)} &rarr; ${info.loss.toFixed(3)}. ` +
    `${esc(spaced(data.numbers[n]))} becomes <b>${esc(fr)}</b> ` +
    `(${right ? "right" : "wrong"}${changed.has(n) ? "" : ", unchanged"}).`;
  if (state.shownRemove !== state.remove) {
    // Numbers whose translation this removal changes, those it makes wrong first.
    const list = text.ablated[state.remove]
      .map(([m, t]) => [m, t !== text.reference[m]])
      .sort((a, b) => Number(b[1]) - Number(a[1]) || data.numbers[a[0]] - data.numbers[b[0]]);
    const shown = list.slice(0, 12).map(([m, wrong]) =>
      `<button type="button" data-index="${m}">${spaced(data.numbers[m])}` +
      `${wrong ? "" : " (still right)"}</button>`);
    broken.innerHTML = list.length
      ? `It changes the translation of ${list.length} numbers; show one: ${shown.join(" ")}` +
        (list.length > 12 ? " &hellip;" : "")
      : "It changes no translation.";
    state.shownRemove = state.remove;
  }
}

function choose(index, fromInput) {
  state.index = index;
  pick.value = String(index);
  if (!fromInput) numberInput.value = String(data.numbers[index]);
  hint.textContent = "";
  render();
}

function parseNumber(s) {
  const digits = s.replace(/[\s,.'\u2009\u202f]/g, "");
  return /^\d+$/.test(digits) ? Number(digits) : NaN;
}

function nearest(value) {
  let i = 0;
  while (i < sorted.length && sorted[i] < value) i++;
  return [sorted[i - 1], sorted[i]].filter((x) => x !== undefined).map(spaced).join(" and ");
}

function typed(final) {
  const value = parseNumber(numberInput.value);
  if (byNumber.has(value)) {
    if (byNumber.get(value) !== state.index) choose(byNumber.get(value), true);
    hint.textContent = "";
  } else if (final) {
    hint.textContent = Number.isNaN(value)
      ? "type the digits of a number"
      : `${spaced(value)} is not a ${data.split} number; the nearest are ${nearest(value)}`;
  }
}

async function start() {
  if (typeof DecompressionStream === "undefined") {
    mapsBox.textContent = "This browser cannot unpack the weights (no DecompressionStream).";
    return;
  }
  const decoder = new TextDecoder();
  text = JSON.parse(decoder.decode(await unpack(data.text)));
  weights = await unpack(data.weights);
  offsets = [];
  let at = 0;
  for (let n = 0; n < data.numbers.length; n++) {
    offsets.push(at);
    at += L * H * shapes(n).reduce((sum, [r, c]) => sum + r * c, 0);
  }
  if (at !== weights.length) throw new Error(`weights: ${weights.length} bytes, expected ${at}`);
  numberInput.addEventListener("input", () => typed(false));
  numberInput.addEventListener("change", () => typed(true));
  numberInput.addEventListener("keydown", (event) => {
    if (event.key === "Enter") typed(true);
  });
  pick.addEventListener("change", () => choose(Number(pick.value), false));
  for (const select of [kindSelect, layerSelect, headSelect]) {
    select.addEventListener("change", render);
  }
  for (const radio of radios) {
    radio.addEventListener("change", () => {
      if (!radio.checked) return;
      state.remove = Number(radio.value);
      render();
    });
  }
  broken.addEventListener("click", (event) => {
    const button = event.target.closest("button[data-index]");
    if (button) choose(Number(button.dataset.index), false);
  });
  render();
}

start();
