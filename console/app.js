// The console's entry: signing in and out, and the pages (#/fleet, #/instances, #/actions,
// #/charts), one shown at a time; a page that polls (Fleet, Charts) polls only while shown.

import * as actions from "./actions.js";
import { claimsOf, credential, forget, get, keep, said } from "./api.js";
import * as charts from "./charts.js";
import { byId, setText } from "./dom.js";
import * as fleet from "./fleet.js";
import * as instances from "./instances.js";

const PAGES = {
  fleet,
  instances: null,
  actions: null,
  charts,
};

let current = null;

function pageOfHash() {
  const name = location.hash.replace(/^#\//, "");
  return Object.hasOwn(PAGES, name) ? name : "fleet";
}

function show(name) {
  if (current && PAGES[current]) {
    PAGES[current].stop();
  }
  for (const section of document.querySelectorAll(".page")) {
    section.hidden = section.id !== `page-${name}`;
  }
  for (const link of byId("nav").querySelectorAll("a")) {
    link.classList.toggle("current", link.dataset.page === name);
  }
  current = name;
  if (PAGES[name]) {
    PAGES[name].start();
  }
}

function signedIn(token) {
  const claims = claimsOf(token) || {};
  const route = claims.pinboard || {};
  const scope = Array.isArray(route.namespaces) ? route.namespaces.join(" ") : "?";
  setText(byId("who"), `${claims.sub ?? "?"} · namespaces ${scope}`);
  byId("sign-in").hidden = true;
  byId("nav").hidden = false;
  byId("sign-out").hidden = false;
  show(pageOfHash());
}

function signedOut() {
  if (current && PAGES[current]) {
    PAGES[current].stop();
  }
  current = null;
  forget();
  for (const section of document.querySelectorAll(".page")) {
    section.hidden = true;
  }
  byId("sign-in").hidden = false;
  byId("nav").hidden = true;
  byId("sign-out").hidden = true;
  setText(byId("who"), "");
}

// The credential is tried on /registry/health (any operator credential may read it): a node
// that refuses it says why, and nothing is kept.
async function signIn(token) {
  keep(token);
  try {
    await get("health");
  } catch (e) {
    forget();
    setText(byId("sign-in-error"), said(e));
    return;
  }
  setText(byId("sign-in-error"), "");
  byId("token").value = "";
  signedIn(token);
}

byId("sign-in-form").addEventListener("submit", (e) => {
  e.preventDefault();
  const token = byId("token").value.trim().replace(/^Bearer\s+/i, "");
  if (token) {
    signIn(token);
  }
});
byId("sign-out").addEventListener("click", signedOut);
window.addEventListener("hashchange", () => {
  if (credential()) {
    show(pageOfHash());
  }
});

actions.setUp();
instances.setUp();
const kept = credential();
if (kept) {
  signedIn(kept);
} else {
  signedOut();
}
