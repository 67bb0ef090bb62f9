// The passage explorer (mhbook/viz/explorers/passages.py writes its page).
// data: passage_payload() plus `headLabels` ([layer][head] -> "" or a name) and `initial`
// = {passage, layer, head}. `weights` is zlib + base64 of uint8 round(255 w), in C order of
// (P, L, H, T, T): unpacked here with DecompressionStream("deflate").
const P = data.numPassages;
const L = data.numLayers;
const H = data.numHeads;
const T = data.length;
const $ = (selector) => root.querySelector(selector);
const passageSelect = $(`#${root.id}-passage`);
const layerSelect = $(`#${root.id}-layer`);
const headSelect = $(`#${root.id}-head`);
const textBox = $(".mhbook-passages-text");
const readout = $(".mhbook-passages-readout");
const maxLabel = $(".mhbook-passages-max");
const thumbs = $(".mhbook-passages-thumbs");
const lut = data.scale.colours;
const textColours = data.scale.text;
const state = { ...data.initial, query: T - 1 };
let weights = null; // Uint8Array of every weight
let spans = []; // the token boxes of the passage shown

const esc = (s) => String(s).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
const glyph = (token) => Array.from(token, (c) => data.glyphs[c] ?? c).join("");
// Where the weight that query q gives key k (head h of layer l, passage p) is.
const at = (p, l, h, q, k) => (((p * L + l) * H + h) * T + q) * T + k;
const weight = (q, k, h = state.head) => weights[at(state.passage, state.layer, h, q, k)] / 255;

async function unpack(b64) {
  const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
  const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("deflate"));
  return new Uint8Array(await new Response(stream).arrayBuffer());
}

// The passage, one box per token; a token holding a newline ends its line.
function drawPassage() {
  textBox.innerHTML = data.tokens[state.passage].map((t, j) =>
    `<span class="mhbook-passages-token" role="option" aria-selected="false" tabindex="-1"` +
    ` data-t="${j}">${esc(glyph(t))}</span>${t.includes("\n") ? "<br>" : ""}`).join("");
  spans = Array.from(textBox.querySelectorAll(".mhbook-passages-token"));
}

// Shade every token up to the query by the weight it gets, on 0 .. the largest of them.
function shade() {
  const q = state.query;
  let best = 0;
  for (let k = 1; k <= q; k++) if (weight(q, k) > weight(q, best)) best = k;
  const top = Math.max(weight(q, best), 1 / 255);
  const tokens = data.tokens[state.passage];
  spans.forEach((span, k) => {
    span.tabIndex = k === q ? 0 : -1;
    span.setAttribute("aria-selected", String(k === q));
    span.classList.toggle("mhbook-passages-query", k === q);
    span.classList.toggle("mhbook-passages-argmax", k === best);
    span.classList.toggle("mhbook-passages-future", k > q);
    if (k > q) {
      span.style.background = "";
      span.style.color = "";
      span.removeAttribute("data-weight");
      span.setAttribute("aria-label", `${glyph(tokens[k])}, after the query`);
      return;
    }
    const w = weight(q, k);
    const c = Math.round(Math.min(1, w / top) * (lut.length - 1));
    span.style.background = lut[c];
    span.style.color = textColours[c];
    span.dataset.weight = String(Math.round(w * 1e4) / 1e4);
    span.setAttribute("aria-label",
      `${glyph(tokens[k])}, ${k === q ? "the query, " : ""}weight ${w.toFixed(2)}`);
  });
  maxLabel.textContent = top.toFixed(2);
  const back = best === q ? "itself" : `${q - best} back`;
  readout.textContent = `Query ${q + 1} “${glyph(tokens[q])}”: its largest weight, ` +
    `${weight(q, best).toFixed(2)}, goes to token ${best + 1} “${glyph(tokens[best])}” (${back}).`;
  Object.assign(root.dataset, {
    passage: state.passage, layer: state.layer, head: state.head, query: q });
}

// A small map (queries down, keys across, 0 to 1) of every head of the layer.
const rgb = lut.map((c) => [1, 3, 5].map((i) => parseInt(c.slice(i, i + 2), 16)));
function drawThumbs() {
  const names = data.headLabels[state.layer];
  // Enlarged pixel by pixel; shrunk (more tokens than pixels) smoothly.
  const smooth = T > 96 ? ' style="image-rendering: auto"' : "";
  thumbs.innerHTML = names.map((name, h) =>
    `<button type="button" class="mhbook-passages-thumb" data-head="${h}" aria-pressed="false">` +
    `<canvas width="${T}" height="${T}" aria-hidden="true"${smooth}></canvas>` +
    `<span>head ${h + 1}${name ? `: ${esc(name)}` : ""}</span></button>`).join("");
  thumbs.querySelectorAll("canvas").forEach((canvas, h) => {
    const context = canvas.getContext("2d");
    const image = context.createImageData(T, T);
    for (let q = 0; q < T; q++) {
      for (let k = 0; k < T; k++) {
        const [r, g, b] = rgb[Math.round(weight(q, k, h) * (lut.length - 1))];
        image.data.set([r, g, b, 255], 4 * (q * T + k));
      }
    }
    context.putImageData(image, 0, 0);
  });
  // The head menu names the heads of this layer.
  Array.from(headSelect.options).forEach((option, h) => {
    option.textContent = names[h] ? `${h + 1}: ${names[h]}` : `${h + 1}`;
  });
  markThumb();
}

function markThumb() {
  thumbs.querySelectorAll("button").forEach((b) =>
    b.setAttribute("aria-pressed", String(Number(b.dataset.head) === state.head)));
}

function setQuery(j) {
  if (j === state.query) return;
  state.query = j;
  shade();
}

function start() {
  drawPassage();
  drawThumbs();
  shade();
  passageSelect.addEventListener("change", () => {
    state.passage = Number(passageSelect.value);
    drawPassage();
    drawThumbs();
    shade();
  });
  layerSelect.addEventListener("change", () => {
    state.layer = Number(layerSelect.value);
    drawThumbs();
    shade();
  });
  headSelect.addEventListener("change", () => {
    state.head = Number(headSelect.value);
    markThumb();
    shade();
  });
  thumbs.addEventListener("click", (event) => {
    const button = event.target.closest("button[data-head]");
    if (!button) return;
    state.head = Number(button.dataset.head);
    headSelect.value = String(state.head);
    markThumb();
    shade();
  });
  const tokenOf = (event) => event.target.closest(".mhbook-passages-token");
  textBox.addEventListener("mouseover", (event) => {
    const span = tokenOf(event);
    if (span) setQuery(Number(span.dataset.t));
  });
  textBox.addEventListener("focusin", (event) => {
    const span = tokenOf(event);
    if (span) setQuery(Number(span.dataset.t));
  });
  textBox.addEventListener("keydown", (event) => {
    const moves = { ArrowRight: 1, ArrowDown: 1, ArrowLeft: -1, ArrowUp: -1 };
    let j = state.query;
    if (event.key in moves) j += moves[event.key];
    else if (event.key === "Home") j = 0;
    else if (event.key === "End") j = T - 1;
    else return;
    event.preventDefault();
    spans[Math.max(0, Math.min(T - 1, j))].focus(); // focusin makes it the query
  });
  root.dataset.ready = "true";
}

(async () => {
  if (typeof DecompressionStream === "undefined") {
    textBox.textContent = "This browser cannot unpack the weights (no DecompressionStream).";
    return;
  }
  weights = await unpack(data.weights);
  if (weights.length !== P * L * H * T * T) {
    throw new Error(`weights: ${weights.length} bytes, expected ${P * L * H * T * T}`);
  }
  start();
})();
