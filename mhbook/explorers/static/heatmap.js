// Recolour the heatmap that heatmap_svg (mhbook/explorers/svg.py) laid out.
// `scale` is colour_scale(): {colours: [hex, ...] from 0 to 1, darkAbove: 0.6}.
function drawHeatmap(svg, values, scale) {
  const lut = scale.colours;
  const texts = svg.querySelectorAll(".mhbook-explorer-value");
  svg.querySelectorAll(".mhbook-explorer-cell").forEach((cell, c) => {
    const v = values[cell.dataset.i][cell.dataset.j];
    cell.setAttribute("fill", lut[Math.round(v * (lut.length - 1))]);
    texts[c].textContent = v.toFixed(2);
    texts[c].setAttribute("fill", v > scale.darkAbove ? "white" : "black");
  });
  const rounded = values.map((row) => row.map((v) => Math.round(v * 1e4) / 1e4));
  svg.setAttribute("data-weights", JSON.stringify(rounded));
}
