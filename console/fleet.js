// The Fleet page: the workers the credential sees (`/registry/workers`) and this node's health
// (`/registry/health`), refreshed every 2 s in place. Resolution outcomes are shown as rates:
// the difference between two polls over the time between them.

import { drain, undrain } from "./actions.js";
import { every, get, said } from "./api.js";
import { byId, duration, el, keyedRows, setClass, setText, when } from "./dom.js";

const EVERY_MS = 2000;

let stopPolling = null;
let lastHealth = null;

function state(w) {
  const parts = [];
  if (w.operatorDrain) {
    parts.push(
      w.operatorDrain.deadline === null ? "cordoned" : `draining until ${when(w.operatorDrain.deadline)}`,
    );
  }
  if (w.workerDraining) {
    parts.push("draining (its own)");
  }
  if (w.degradedSince !== undefined) {
    parts.push(`degraded since ${when(w.degradedSince)}`);
  }
  return parts.length ? parts.join("; ") : "serving";
}

function namespaces(w) {
  return w.namespaces.map((ns) => (w.envs && w.envs[ns] ? `${ns} (${w.envs[ns]})` : ns)).join(", ");
}

function makeRow() {
  const cells = ["client", "hostname", "namespaces", "headroom", "inflight", "state", "lease", "actions"];
  const tr = el("tr", {}, ...cells.map((name) => el("td", { class: name })));
  for (const name of ["headroom", "inflight", "lease"]) {
    tr.querySelector(`.${name}`).classList.add("num");
  }
  const client = () => tr.dataset.client;
  const refresh = () => poll();
  tr.querySelector(".actions").append(
    el("button", { type: "button", class: "cordon", onclick: () => drain(client(), null, refresh) }, "Cordon"),
    el("button", { type: "button", class: "drain", onclick: () => drain(client(), 60, refresh) }, "Drain 60 s"),
    el("button", { type: "button", class: "undrain", onclick: () => undrain(client(), refresh) }, "Undrain"),
  );
  return tr;
}

function updateRow(tr, w) {
  tr.dataset.client = w.clientId;
  const cell = (name) => tr.querySelector(`.${name}`);
  setText(cell("client"), w.clientId);
  cell("client").title = w.sessionId;
  setText(cell("hostname"), w.hostname ?? "—");
  setText(cell("namespaces"), namespaces(w));
  setText(cell("headroom"), Number(w.headroom).toFixed(0));
  setText(cell("inflight"), w.inflight ?? 0);
  setText(cell("state"), state(w));
  setText(cell("lease"), duration(Math.max(0, w.expiry - Date.now())));
  setClass(tr, "cordoned", w.operatorDrain && w.operatorDrain.deadline === null);
  setClass(tr, "draining", w.draining);
  setClass(tr, "degraded", w.degradedSince !== undefined);
  tr.querySelector(".undrain").disabled = !w.operatorDrain;
}

function showWorkers(workers) {
  keyedRows(byId("workers").tBodies[0], workers, (w) => w.sessionId, makeRow, updateRow);
  setText(byId("worker-count"), `${workers.length} live`);
}

function showHealth(health, at) {
  setText(byId("health-serving"), health.serving ? "yes" : "no: not the serving fleet");
  setClass(byId("health-serving"), "error", !health.serving);
  const license = health.license;
  setText(
    byId("health-license"),
    license === null || license === undefined
      ? "unknown (Redis cannot be asked)"
      : license.epoch === null
        ? "none in force"
        : `${license.held ? "held by this node's fleet" : "held by another fleet"}, epoch ${license.epoch}`,
  );
  const quarantine = health.quarantine ? Object.entries(health.quarantine) : [];
  setText(
    byId("health-quarantine"),
    quarantine.length
      ? quarantine.map(([bucket, ms]) => `bucket ${bucket}: ${duration(ms)} left`).join(", ")
      : health.quarantine === null
        ? `${duration(health.quarantineMs)} left at most (last seen)`
        : "over in every bucket",
  );
  setText(byId("health-connections"), health.connections);
  setText(byId("health-uptime"), duration(health.uptimeMs));
  // The protocols requests came by (HTTP/1.1, HTTP/2 by ALPN or h2c), those used so far.
  const protocols = Object.entries(health.protocols || {})
    .filter(([, total]) => total > 0)
    .map(([protocol, total]) => {
      const rate = perSecond(health, at, "protocols", protocol);
      return `${protocol} ${rate === "" ? "" : `${rate}/s, `}${total} in all`;
    });
  setText(byId("health-protocols"), protocols.length ? protocols.join(" · ") : "none yet");

  const rows = Object.entries(health.resolutions).map(([outcome, total]) => ({
    outcome,
    total,
    rate: perSecond(health, at, "resolutions", outcome),
  }));
  keyedRows(
    byId("resolutions").tBodies[0],
    rows,
    (r) => r.outcome,
    () => el("tr", {}, el("td"), el("td", { class: "num" }), el("td", { class: "num" })),
    (tr, r) => {
      setText(tr.cells[0], r.outcome);
      setText(tr.cells[1], r.rate);
      setText(tr.cells[2], r.total);
    },
  );
  lastHealth = { health, at };
}

// The rate of the counter `health[group][name]` since the last poll ("" on the first).
function perSecond(health, at, group, name) {
  const before = lastHealth && lastHealth.health[group] ? lastHealth.health[group][name] : undefined;
  const seconds = lastHealth ? (at - lastHealth.at) / 1000 : 0;
  if (before === undefined || seconds <= 0) return "";
  return ((health[group][name] - before) / seconds).toFixed(1);
}

async function poll() {
  const error = byId("fleet-error");
  try {
    const [workers, health] = await Promise.all([get("workers"), get("health")]);
    const at = Date.now();
    showWorkers(workers.workers);
    showHealth(health, at);
    setText(error, "");
    setText(byId("fleet-updated"), `updated ${new Date(at).toLocaleTimeString()}`);
  } catch (e) {
    setText(error, said(e));
  }
}

export function start() {
  lastHealth = null;
  stopPolling = every(EVERY_MS, poll);
}

export function stop() {
  if (stopPolling) {
    stopPolling();
  }
  stopPolling = null;
}
