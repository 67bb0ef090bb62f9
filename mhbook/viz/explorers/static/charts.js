// What several explorers share besides the heatmap: the softmax, and redrawing the bar and
// line charts that bars_svg and line_chart_svg (mhbook/viz/explorers/svg.py) laid out.

// softmax of one row; entries that are -Infinity get weight 0.
function softmax(row) {
  const m = Math.max(...row);
  const e = row.map((s) => Math.exp(s - m));
  const sum = e.reduce((x, y) => x + y, 0);
  return e.map((v) => v / sum);
}

const clip01 = (f) => Math.min(1, Math.max(0, f));
const numbers = (text) => text.split(",").map(Number);

// Bars of `values`; `scale` colours them (colour_scale()), or null: blue >= 0, red < 0.
function drawBars(svg, values, scale) {
  const [left, top, width, height] = numbers(svg.dataset.plot);
  const [lo, hi] = numbers(svg.dataset.ylim);
  const yOf = (v) => top + (1 - clip01((v - lo) / (hi - lo))) * height;
  const base = yOf(Math.min(Math.max(0, lo), hi));
  const texts = svg.querySelectorAll(".mhbook-explorer-bar-value");
  svg.querySelectorAll(".mhbook-explorer-bar").forEach((bar, j) => {
    const v = values[j];
    const y0 = Math.min(base, yOf(v));
    const y1 = Math.max(base, yOf(v));
    bar.setAttribute("y", y0.toFixed(1));
    bar.setAttribute("height", (y1 - y0).toFixed(1));
    const lut = scale && scale.colours;
    bar.setAttribute(
      "fill",
      lut ? lut[Math.round(clip01((v - lo) / (hi - lo)) * (lut.length - 1))]
        : v >= 0 ? "#2171b5" : "#cb181d",
    );
    if (texts[j]) {
      texts[j].textContent = v.toFixed(2);
      texts[j].setAttribute("y", (y0 - 3).toFixed(1));
    }
  });
  svg.setAttribute("data-values", JSON.stringify(values.map((v) => Math.round(v * 1e4) / 1e4)));
}

// Lines: `series` is a list of {x: [...], y: [...], marker: [x, y] or null}, one per
// polyline of the chart, in order.
function drawLines(svg, series) {
  const [left, top, width, height] = numbers(svg.dataset.plot);
  const [x0, x1] = numbers(svg.dataset.xlim);
  let [y0, y1] = numbers(svg.dataset.ylim);
  const ylog = svg.dataset.ylog === "1";
  if (ylog) [y0, y1] = [Math.log10(y0), Math.log10(y1)];
  const xOf = (x) => left + clip01((x - x0) / (x1 - x0)) * width;
  const yOf = (y) => {
    const t = ylog ? Math.log10(Math.max(y, 1e-300)) : y;
    return top + (1 - clip01((t - y0) / (y1 - y0))) * height;
  };
  const lines = svg.querySelectorAll(".mhbook-explorer-line");
  const markers = svg.querySelectorAll(".mhbook-explorer-marker");
  series.forEach((s, k) => {
    const points = s.x.map((x, n) => `${xOf(x).toFixed(1)},${yOf(s.y[n]).toFixed(1)}`);
    lines[k].setAttribute("points", points.join(" "));
    if (s.marker) {
      markers[k].setAttribute("cx", xOf(s.marker[0]).toFixed(1));
      markers[k].setAttribute("cy", yOf(s.marker[1]).toFixed(1));
      markers[k].removeAttribute("visibility");
    } else {
      markers[k].setAttribute("visibility", "hidden");
    }
  });
}
