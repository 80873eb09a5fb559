// The operator's acts — drain (cordon or timed), undrain, wind down an id or a namespace,
// move one instance to a named worker, pause and resume one instance — each behind a confirmation that says what will happen, each result (the node's answer, or
// its refusal with the node's error string) shown in the dialog and in the Actions page's
// results. The Fleet and Instances pages start their acts through `act` too.

import { post, said } from "./api.js";
import { byId, el, setText } from "./dom.js";

const dialog = {
  root: byId("confirm"),
  title: byId("confirm-title"),
  says: byId("confirm-says"),
  outcome: byId("confirm-outcome"),
  go: byId("confirm-go"),
  cancel: byId("confirm-cancel"),
};

let pending = null;

function close() {
  dialog.root.hidden = true;
  pending = null;
}

dialog.cancel.addEventListener("click", close);
dialog.root.addEventListener("keydown", (e) => {
  if (e.key === "Escape") {
    close();
  }
});
dialog.go.addEventListener("click", async () => {
  if (!pending) {
    return;
  }
  const { title, run, done } = pending;
  dialog.go.disabled = true;
  setText(dialog.outcome, "…");
  try {
    const answer = await run();
    record(`${title}: ${JSON.stringify(answer)}`, false);
    close();
    if (done) {
      done(answer);
    }
  } catch (e) {
    dialog.outcome.className = "error";
    setText(dialog.outcome, `Refused: ${said(e)}`);
    record(`${title}: refused: ${said(e)}`, true);
    dialog.go.hidden = true;
    setText(dialog.cancel, "Close");
  } finally {
    dialog.go.disabled = false;
  }
});

// Asks to confirm `says` (what will happen), then runs `run()` (a promise of the node's
// answer); `done(answer)` after a success.
export function act({ title, says, run, done }) {
  pending = { title, run, done };
  setText(dialog.title, title);
  setText(dialog.says, says);
  setText(dialog.outcome, "");
  dialog.outcome.className = "";
  dialog.go.hidden = false;
  setText(dialog.cancel, "Cancel");
  dialog.root.hidden = false;
  dialog.go.focus();
}

function record(text, refused) {
  const line = el("li", { class: refused ? "error" : "ok" }, `${new Date().toLocaleTimeString()} ${text}`);
  byId("results").prepend(line);
}

export function drain(clientId, deadline, done) {
  const says =
    deadline === null
      ? `Cordon worker ${clientId}: from its next heartbeat it takes no new placements; its instances stay where they are. Undrain to lift it.`
      : `Drain worker ${clientId} within ${deadline} s: it takes no new placements from its next heartbeat, and once the deadline (at least one lease) passes its lease ends and its instances move to other workers.`;
  act({
    title: deadline === null ? `Cordon ${clientId}` : `Drain ${clientId}`,
    says,
    run: () => post("drain", { clientId, deadline }),
    done,
  });
}

export function undrain(clientId, done) {
  act({
    title: `Undrain ${clientId}`,
    says: `Lift the operator drain of worker ${clientId}: from its next heartbeat it takes new placements again.`,
    run: () => post("undrain", { clientId }),
    done,
  });
}

export function windDown(namespace, id, deadline, env, done) {
  const what = id ? `instance ${namespace}/${id}` : `every placement of namespace ${namespace}`;
  const says =
    deadline === null
      ? `Clear the wind-down of ${what}: its owner is told the earlier wind-down is revoked.`
      : `Wind down ${what}: its owner is told to let go within ${deadline} s (at least one lease); past that the next request places it anew.`;
  const body = { namespace, deadline };
  if (id) {
    body.id = id;
  }
  if (env) {
    body.env = env;
  }
  act({
    title: `Wind down ${id ? `${namespace}/${id}` : namespace}`,
    says,
    run: () => post("wind_down", body),
    done,
  });
}

// The body naming one instance: env only when given (hostname-aware mode).
function instanceBody(namespace, id, env) {
  return env ? { namespace, id, env } : { namespace, id };
}

export function move(namespace, id, to, deadline, env, done) {
  const within = deadline === null ? "one lease" : `${deadline} s (at least one lease)`;
  act({
    title: `Move ${namespace}/${id}`,
    says: `Move instance ${namespace}/${id} to worker ${to}: its owner is told to let go within ${within}, and its next placement goes to ${to} when that worker is live, serves the namespace and is not draining; otherwise (the answer's "to" is null) to the usual choice.`,
    run: () => post("move", { ...instanceBody(namespace, id, env), to, deadline }),
    done,
  });
}

export function pause(namespace, id, reason, env, done) {
  const body = instanceBody(namespace, id, env);
  if (reason) {
    body.reason = reason;
  }
  act({
    title: `Pause ${namespace}/${id}`,
    says: `Pause instance ${namespace}/${id}: every node answers its requests 503 "instance paused" until it is resumed. Its placement stays as it is (an id not placed is not placed meanwhile).`,
    run: () => post("pause", body),
    done,
  });
}

export function resume(namespace, id, env, done) {
  act({
    title: `Resume ${namespace}/${id}`,
    says: `Resume instance ${namespace}/${id}: the nodes serve it again (place it, if it has no placement).`,
    run: () => post("resume", instanceBody(namespace, id, env)),
    done,
  });
}

function seconds(input) {
  const text = input.value.trim();
  return text === "" ? null : Number(text);
}

// Runs `run(field, form, event)` on a form's submit: `field(name)` is a field's value, trimmed.
function onSubmit(formId, run) {
  byId(formId).addEventListener("submit", (e) => {
    e.preventDefault();
    const form = e.target.elements;
    run((name) => form[name].value.trim(), form, e);
  });
}

export function setUp() {
  onSubmit("drain-form", (field, form) => {
    const timed = form.mode.value === "timed";
    drain(field("clientId"), timed ? seconds(form.deadline) ?? 0 : null);
  });
  onSubmit("undrain-form", (field) => undrain(field("clientId")));
  onSubmit("move-form", (field, form) =>
    move(field("namespace"), field("id"), field("to"), seconds(form.deadline), field("env")),
  );
  onSubmit("pause-form", (field, form, e) => {
    if (e.submitter && e.submitter.value === "resume") {
      resume(field("namespace"), field("id"), field("env"));
    } else {
      pause(field("namespace"), field("id"), field("reason"), field("env"));
    }
  });
  onSubmit("wind-down-form", (field, form) =>
    windDown(field("namespace"), field("id"), seconds(form.deadline), field("env")),
  );
}
