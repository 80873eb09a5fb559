// The node's operator routes as the console calls them: same origin, the credential pasted at
// sign-in (kept in sessionStorage) as `Authorization: Bearer`, `{base_path}/registry/...` (the
// node fills its base_path into index.html's <meta>), `/metrics` at the root. A refusal
// becomes an ApiError carrying the node's own `error` string.

const KEY = "pinboard-console-credential";

const meta = document.querySelector('meta[name="pinboard-base-path"]');
export const basePath = meta ? meta.getAttribute("content") || "" : "";

export function credential() {
  return sessionStorage.getItem(KEY);
}

export function keep(token) {
  sessionStorage.setItem(KEY, token);
}

export function forget() {
  sessionStorage.removeItem(KEY);
}

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }

  // "403 namespace not allowed: /threads": what a result line says.
  toString() {
    return `${this.status} ${this.message}`;
  }
}

// What a failure says on the page: "403 namespace not allowed: /threads" for the node's refusal.
export function said(e) {
  return e instanceof ApiError ? e.toString() : String(e);
}

// Runs `task` now and every `ms` until the function returned is called; a run still going when
// the next is due is not overlapped by it.
export function every(ms, task) {
  let busy = false;
  const run = async () => {
    if (busy) {
      return;
    }
    busy = true;
    try {
      await task();
    } finally {
      busy = false;
    }
  };
  run();
  const timer = setInterval(run, ms);
  return () => clearInterval(timer);
}

async function send(method, url, body) {
  const headers = { authorization: `Bearer ${credential() || ""}` };
  if (body !== undefined) {
    headers["content-type"] = "application/json";
  }
  let res;
  try {
    res = await fetch(url, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      cache: "no-store",
      credentials: "omit",
      redirect: "error",
    });
  } catch (e) {
    throw new ApiError(0, `the node did not answer (${e.message})`);
  }
  return res;
}

async function refusal(res) {
  const text = await res.text();
  let said = "";
  try {
    const body = JSON.parse(text);
    if (body && typeof body.error === "string") {
      said = body.error;
    }
  } catch {
    said = text.trim().slice(0, 200);
  }
  return new ApiError(res.status, said || res.statusText || "refused");
}

// A registry route: its JSON answer, or an ApiError.
export async function registry(method, route, body) {
  const res = await send(method, `${basePath}/registry/${route}`, body);
  if (!res.ok) {
    throw await refusal(res);
  }
  return res.json();
}

export function get(route, params = {}) {
  const query = new URLSearchParams();
  for (const [name, value] of Object.entries(params)) {
    if (value !== undefined && value !== null && value !== "") {
      query.set(name, value);
    }
  }
  const text = query.toString();
  return registry("GET", text ? `${route}?${text}` : route);
}

export function post(route, body) {
  return registry("POST", route, body);
}

// The node's Prometheus text (`/metrics`, at the root whatever base_path is).
export async function metrics() {
  const res = await send("GET", "/metrics");
  if (!res.ok) {
    throw await refusal(res);
  }
  return res.text();
}

// The claims of a compact JWS, for showing who is signed in (the node verifies, not this).
export function claimsOf(token) {
  try {
    const payload = token.split(".")[1].replace(/-/g, "+").replace(/_/g, "/");
    const json = decodeURIComponent(
      Array.from(atob(payload), (c) => `%${c.charCodeAt(0).toString(16).padStart(2, "0")}`).join(""),
    );
    return JSON.parse(json);
  } catch {
    return null;
  }
}
