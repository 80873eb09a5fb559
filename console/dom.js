// Building and updating the page. Everything the node says (ids, tags, hostnames, error
// strings: all of it attacker-influenced) goes in as text (text nodes, textContent) or as an
// attribute value, never as HTML: nothing here parses markup.

const SVG = "http://www.w3.org/2000/svg";

function build(node, attrs, children) {
  for (const [name, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) {
      continue;
    }
    if (name.startsWith("on")) {
      node.addEventListener(name.slice(2), value);
    } else {
      node.setAttribute(name, value === true ? "" : String(value));
    }
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) {
      continue;
    }
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

// <tag attrs...>children</tag>; a child that is not a node is text.
export function el(tag, attrs = {}, ...children) {
  return build(document.createElement(tag), attrs, children);
}

export function svg(tag, attrs = {}, ...children) {
  return build(document.createElementNS(SVG, tag), attrs, children);
}

export function byId(id) {
  return document.getElementById(id);
}

// Sets a node's text only when it changed: a refresh that changes nothing touches nothing.
export function setText(node, text) {
  const value = String(text);
  if (node.textContent !== value) {
    node.textContent = value;
  }
}

export function setClass(node, name, on) {
  node.classList.toggle(name, Boolean(on));
}

export function clear(node) {
  node.replaceChildren();
}

// Reconciles a table body with `items`, one row per key, in order: rows of keys still there
// are kept and updated in place (no flicker, a focused button stays focused), new ones made,
// gone ones removed. `make(item)` returns a new <tr>, `update(tr, item)` fills it.
export function keyedRows(tbody, items, keyOf, make, update) {
  const existing = new Map();
  for (const tr of tbody.rows) {
    existing.set(tr.dataset.key, tr);
  }
  let at = tbody.firstElementChild;
  for (const item of items) {
    const key = String(keyOf(item));
    let tr = existing.get(key);
    if (tr) {
      existing.delete(key);
    } else {
      tr = make(item);
      tr.dataset.key = key;
    }
    update(tr, item);
    if (tr !== at) {
      tbody.insertBefore(tr, at);
    } else {
      at = at.nextElementSibling;
    }
  }
  for (const tr of existing.values()) {
    tr.remove();
  }
}

// "1 min 5 s", "3.2 s", "250 ms".
export function duration(ms) {
  if (ms === null || ms === undefined) {
    return "";
  }
  const abs = Math.abs(ms);
  if (abs < 1000) {
    return `${Math.round(ms)} ms`;
  }
  if (abs < 60000) {
    return `${(ms / 1000).toFixed(1)} s`;
  }
  const minutes = Math.floor(abs / 60000);
  if (minutes < 120) {
    return `${Math.sign(ms) < 0 ? "-" : ""}${minutes} min ${Math.floor((abs % 60000) / 1000)} s`;
  }
  return `${(ms / 3600000).toFixed(1)} h`;
}

// An epoch-ms time as local time, with how far from now.
export function when(ms) {
  if (ms === null || ms === undefined) {
    return "";
  }
  const left = ms - Date.now();
  const at = new Date(ms).toLocaleTimeString();
  return left >= 0 ? `${at} (in ${duration(left)})` : `${at} (${duration(-left)} ago)`;
}
