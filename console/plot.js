// A line plot drawn in SVG by hand: a time axis over the window shown, a value axis from 0 to
// a rounded maximum, one path per series and a legend with each series' latest value. Redrawn
// whole at each sample (a few hundred points): simple, and no flicker, since the SVG element
// itself stays.

import { clear, svg } from "./dom.js";

const WIDTH = 800;
const HEIGHT = 220;
const LEFT = 56;
const RIGHT = 12;
const TOP = 12;
const BOTTOM = 26;

// 1, 2 or 5 times a power of ten, at or above `value`.
function niceCeiling(value) {
  if (!(value > 0)) {
    return 1;
  }
  const power = 10 ** Math.floor(Math.log10(value));
  for (const step of [1, 2, 5, 10]) {
    if (value <= step * power) {
      return step * power;
    }
  }
  return 10 * power;
}

function label(value) {
  if (value >= 1000) {
    return `${(value / 1000).toFixed(value >= 10000 ? 0 : 1)}k`;
  }
  return value >= 10 || value === 0 ? value.toFixed(0) : value.toPrecision(2);
}

// Draws `series` ([{name, cls, points: [[t ms, value | null]]}]) over [`from`, `to`] (ms) into
// the <svg> `root`; `unit` follows the legend's values.
export function draw(root, series, from, to, unit) {
  clear(root);
  const values = series.flatMap((s) => s.points.map((p) => p[1])).filter((v) => v !== null && Number.isFinite(v));
  const top = niceCeiling(Math.max(0, ...values));
  const x = (t) => LEFT + ((t - from) / (to - from)) * (WIDTH - LEFT - RIGHT);
  const y = (v) => TOP + (1 - v / top) * (HEIGHT - TOP - BOTTOM);

  for (const fraction of [0, 0.25, 0.5, 0.75, 1]) {
    const at = y(top * fraction);
    root.append(
      svg("line", { class: "grid", x1: LEFT, x2: WIDTH - RIGHT, y1: at, y2: at }),
      svg("text", { class: "axis", x: LEFT - 6, y: at + 4, "text-anchor": "end" }, label(top * fraction)),
    );
  }
  const minutes = (to - from) / 60000;
  for (let m = 0; m <= minutes; m += 1) {
    const at = x(to - m * 60000);
    root.append(
      svg("line", { class: "tick", x1: at, x2: at, y1: HEIGHT - BOTTOM, y2: HEIGHT - BOTTOM + 4 }),
      svg("text", { class: "axis", x: at, y: HEIGHT - 6, "text-anchor": "middle" }, m === 0 ? "now" : `-${m} min`),
    );
  }

  let legendX = LEFT + 8;
  for (const s of series) {
    // A gap (null) ends a segment: a path of move-to and line-to commands.
    let d = "";
    let drawing = false;
    for (const [t, v] of s.points) {
      if (v === null || !Number.isFinite(v)) {
        drawing = false;
        continue;
      }
      d += `${drawing ? "L" : "M"}${x(t).toFixed(1)},${y(v).toFixed(1)}`;
      drawing = true;
    }
    if (d) {
      root.append(svg("path", { class: `line ${s.cls}`, d }));
    }
    const latest = [...s.points].reverse().find((p) => p[1] !== null && Number.isFinite(p[1]));
    const text = `${s.name} ${latest ? label(latest[1]) : "–"}${unit}`;
    root.append(
      svg("rect", { class: `swatch ${s.cls}`, x: legendX, y: TOP + 2, width: 10, height: 10 }),
      svg("text", { class: "legend", x: legendX + 14, y: TOP + 11 }, text),
    );
    legendX += 14 + text.length * 7 + 16;
  }
}
