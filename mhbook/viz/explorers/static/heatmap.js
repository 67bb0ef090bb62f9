// Recolour the heatmap that heatmap_svg (mhbook/viz/explorers/svg.py) laid out.
// `scale` is colour_scale(): {colours: [hex, ...] from vmin to vmax, darkAbove: 0.6}, plus
// `text` (a text colour per colour) for another colour map and `vmin`, `vmax` for another range.
// `values` may be smaller than the laid-out grid: the cells outside it are hidden.
function drawHeatmap(svg, values, scale) {
  const lut = scale.colours;
  const vmin = scale.vmin ?? 0;
  const vmax = scale.vmax ?? 1;
  const format = svg.dataset.format || "2";
  const rows = values.length;
  const cols = rows ? values[0].length : 0;
  const show = (el, visible) =>
    visible ? el.removeAttribute("visibility") : el.setAttribute("visibility", "hidden");
  const texts = svg.querySelectorAll(".mhbook-explorer-value");
  svg.querySelectorAll(".mhbook-explorer-cell").forEach((cell, c) => {
    const i = Number(cell.dataset.i);
    const j = Number(cell.dataset.j);
    const inside = i < rows && j < cols;
    show(cell, inside);
    show(texts[c], inside);
    if (!inside) return;
    const v = values[i][j];
    const f = Math.min(1, Math.max(0, (v - vmin) / (vmax - vmin)));
    const k = Math.round(f * (lut.length - 1));
    cell.setAttribute("fill", lut[k]);
    texts[c].textContent = format === "bool" ? (v > 0.5 ? "True" : "False") : v.toFixed(+format);
    texts[c].setAttribute("fill", scale.text ? scale.text[k] : f > scale.darkAbove ? "white" : "black");
  });
  svg.querySelectorAll(".mhbook-explorer-query").forEach((t) => show(t, +t.dataset.i < rows));
  svg.querySelectorAll(".mhbook-explorer-key").forEach((t) => show(t, +t.dataset.j < cols));
  const rounded = values.map((row) => row.map((v) => Math.round(v * 1e4) / 1e4));
  svg.setAttribute("data-weights", JSON.stringify(rounded));
}
