// The Instances page: placements found by namespace, id prefix and tag (the overview's
// filters), a page at a time (`limit` and the node's `next` cursor: a million placements are
// never read at once), a paused badge on a paused id (listed even without an owner), and one
// instance's row (`overview?ns=&id=`: owner session, epoch, wind-down deadline, pause, tag)
// with its acts (wind down, pause or resume, move) and its ownership history where the node
// keeps one (`/registry/history` answering 200; any other answer means no ledger, and nothing
// is shown).

import { move, pause, resume, windDown } from "./actions.js";
import { get, said } from "./api.js";
import { byId, clear, el, setText, when } from "./dom.js";

let search = null; // the filters of the listing shown, and the cursor of its next page
let pageNumber = 0;
let shown = null; // the instance shown: {ns, id, env, paused}

// The overview's groups flattened: one row per placement.
function entriesOf(overview) {
  const rows = [];
  for (const group of overview.namespaces) {
    for (const entry of group.entries) {
      rows.push({ ns: group.namespace, env: group.env, hostname: group.hostname, ...entry });
    }
  }
  return rows;
}

function cell(text, attrs = {}) {
  return el("td", attrs, text);
}

// An operator's pause, as the overview says it: who, when, why.
function pauseText(paused) {
  return `since ${when(paused.at)}${paused.by ? ` by ${paused.by}` : ""}${paused.reason ? `: ${paused.reason}` : ""}`;
}

function showPage(overview) {
  const tbody = byId("instances").tBodies[0];
  clear(tbody);
  const rows = entriesOf(overview);
  for (const row of rows) {
    const open = el("button", { type: "button", class: "link", onclick: () => openInstance(row.ns, row.id) }, row.id);
    tbody.append(
      el(
        "tr",
        { "data-key": `${row.ns}/${row.id}` },
        cell(row.ns),
        cell(row.env),
        el("td", { class: "id" }, open),
        cell(row.sessionId ?? ""),
        cell(row.epoch ?? ""),
        cell(row.tag ?? "", { class: "tag" }),
        cell(row.expiry === undefined ? "" : when(row.expiry)),
        el("td", { class: "paused" }, row.paused && el("span", { class: "badge paused", title: pauseText(row.paused) }, "paused")),
      ),
    );
  }
  const next = byId("next-page");
  next.hidden = !overview.next;
  search.cursor = overview.next;
  setText(
    byId("search-status"),
    `page ${pageNumber}: ${rows.length} placement${rows.length === 1 ? "" : "s"}${overview.next ? ", more on the next page" : ", the last page"}`,
  );
}

async function load() {
  setText(byId("search-error"), "");
  try {
    const { ns, prefix, tag, limit, cursor } = search;
    const overview = await get("overview", { ns, prefix, tag, limit, cursor });
    pageNumber += 1;
    showPage(overview);
  } catch (e) {
    setText(byId("search-error"), said(e));
  }
}

function field(dl, name, value) {
  dl.append(el("dt", {}, name), el("dd", { "data-field": name }, value));
}

async function openInstance(ns, id) {
  const panel = byId("instance");
  panel.hidden = false;
  setText(byId("instance-name"), `${ns}/${id}`);
  setText(byId("instance-error"), "");
  const fields = byId("instance-fields");
  clear(fields);
  byId("instance-history").hidden = true;
  shown = { ns, id, env: null, paused: false };
  byId("instance-resume").hidden = true;
  byId("instance-pause").hidden = false;
  try {
    const overview = await get("overview", { ns, id });
    const [row] = entriesOf(overview);
    if (!row) {
      field(fields, "placement", "none: the id is not placed (or its owner is gone)");
      return;
    }
    // Hostname-aware mode (rows of a hostname) names the env a wind-down acts in.
    shown.env = row.hostname ? row.env : null;
    shown.paused = Boolean(row.paused);
    byId("instance-resume").hidden = !shown.paused;
    byId("instance-pause").hidden = shown.paused;
    const owner = overview.workers.find((w) => w.sessionId === row.sessionId);
    field(fields, "owner session", row.sessionId ?? "none: paused before it was placed, or its owner is gone");
    field(fields, "owner worker", owner ? `${owner.clientId}${owner.hostname ? ` on ${owner.hostname}` : ""}` : "");
    field(fields, "env", row.env);
    field(fields, "epoch", row.epoch ?? "");
    field(fields, "wind-down deadline", row.expiry === undefined ? "none" : when(row.expiry));
    field(fields, "paused", row.paused ? pauseText(row.paused) : "no");
    field(fields, "tag", row.tag ?? "none");
  } catch (e) {
    setText(byId("instance-error"), said(e));
    return;
  }
  showHistory(ns, id, shown.env);
}

// The ownership ledger, where the node has one: shown only on a 200. In hostname-aware mode
// the history is asked for in the row's env.
async function showHistory(ns, id, env) {
  let history;
  try {
    history = await get("history", { ns, id, env });
  } catch {
    return;
  }
  if (!history || !Array.isArray(history.entries) || shown.ns !== ns || shown.id !== id) {
    return;
  }
  const tbody = byId("instance-history").querySelector("tbody");
  clear(tbody);
  for (const e of history.entries) {
    tbody.append(
      el("tr", {}, cell(when(e.at)), cell(e.epoch ?? ""), cell(e.from ?? ""), cell(e.to ?? ""), cell(e.reason ?? ""), cell(e.by ?? "")),
    );
  }
  byId("instance-history").hidden = false;
}

export function setUp() {
  byId("search").addEventListener("submit", (e) => {
    e.preventDefault();
    const form = e.target.elements;
    search = {
      ns: form.ns.value.trim(),
      prefix: form.prefix.value.trim(),
      tag: form.tag.value,
      limit: form.limit.value,
      cursor: null,
    };
    pageNumber = 0;
    byId("instance").hidden = true;
    load();
  });
  byId("next-page").addEventListener("click", () => {
    if (search && search.cursor) {
      load();
    }
  });
  byId("instance-wind-down").addEventListener("click", () => {
    if (shown) {
      const { ns, id, env } = shown;
      windDown(ns, id, 30, env, () => openInstance(ns, id));
    }
  });
  byId("instance-pause").addEventListener("click", () => {
    if (shown) {
      const { ns, id, env } = shown;
      pause(ns, id, "", env, () => openInstance(ns, id));
    }
  });
  byId("instance-resume").addEventListener("click", () => {
    if (shown) {
      const { ns, id, env } = shown;
      resume(ns, id, env, () => openInstance(ns, id));
    }
  });
  byId("instance-move").addEventListener("submit", (e) => {
    e.preventDefault();
    if (shown) {
      const { ns, id, env } = shown;
      move(ns, id, e.target.elements.to.value.trim(), null, env, () => openInstance(ns, id));
    }
  });
}
