// The Charts page: this node's own counters, sampled from `/metrics` every 2 s and kept for the
// last 5 minutes, plotted: data-plane answers per second by status class
// (`pinboard_http_requests_total{kind="data"}`), data-plane latency p50 and p99 (the
// `pinboard_http_request_duration_seconds{kind="data"}` histogram between two samples) and
// new placements per second (`pinboard_placements_total`). `/metrics` on the main listener
// needs an operator credential over the whole fleet; with another the page says so.

import { ApiError, every, metrics, said } from "./api.js";
import { draw } from "./plot.js";
import { buckets, parse, quantile, rate, sum } from "./prom.js";
import { byId, setText } from "./dom.js";

const EVERY_MS = 2000;
const WINDOW_MS = 5 * 60 * 1000;
const CLASSES = ["2xx", "3xx", "4xx", "5xx"];
const REQUESTS = "pinboard_http_requests_total";
const DURATION = "pinboard_http_request_duration_seconds";
const PLACEMENTS = "pinboard_placements_total";

let stopSampling = null;
let last = null; // the previous scrape: {at, samples}
let points = []; // [{at, classes: {2xx: rate…}, p50, p99, placements}]

function derive(before, after, seconds) {
  const data = { kind: "data" };
  const classes = {};
  for (const code of CLASSES) {
    classes[code] = rate(
      sum(before, REQUESTS, { ...data, code }),
      sum(after, REQUESTS, { ...data, code }),
      seconds,
    );
  }
  const from = buckets(before, DURATION, data);
  const to = buckets(after, DURATION, data);
  const ms = (q) => {
    const seconds = quantile(q, from, to);
    return seconds === null ? null : seconds * 1000;
  };
  return {
    classes,
    p50: ms(0.5),
    p99: ms(0.99),
    placements: rate(sum(before, PLACEMENTS), sum(after, PLACEMENTS), seconds),
  };
}

function redraw() {
  const to = Date.now();
  const from = to - WINDOW_MS;
  const series = (pick) => points.map((p) => [p.at, pick(p)]);
  draw(
    byId("chart-requests"),
    CLASSES.map((code) => ({ name: code, cls: `c${code}`, points: series((p) => p.classes[code]) })),
    from,
    to,
    "/s",
  );
  draw(
    byId("chart-latency"),
    [
      { name: "p50", cls: "p50", points: series((p) => p.p50) },
      { name: "p99", cls: "p99", points: series((p) => p.p99) },
    ],
    from,
    to,
    " ms",
  );
  draw(
    byId("chart-placements"),
    [{ name: "placements", cls: "placements", points: series((p) => p.placements) }],
    from,
    to,
    "/s",
  );
}

async function sample() {
  const error = byId("charts-error");
  try {
    const samples = parse(await metrics());
    const at = Date.now();
    if (last) {
      points.push({ at, ...derive(last.samples, samples, (at - last.at) / 1000) });
      points = points.filter((p) => p.at >= at - WINDOW_MS);
    }
    last = { at, samples };
    setText(error, "");
    redraw();
  } catch (e) {
    if (e instanceof ApiError && e.status === 403) {
      setText(
        error,
        "The charts read this node's /metrics, which needs an operator credential over every namespace (\"*\") without hostnames or envs limits: this one is refused (403 " +
          e.message +
          ").",
      );
      stop();
    } else {
      setText(error, said(e));
    }
  }
}

export function start() {
  last = null;
  points = [];
  redraw();
  stopSampling = every(EVERY_MS, sample);
}

export function stop() {
  if (stopSampling) {
    stopSampling();
  }
  stopSampling = null;
}
