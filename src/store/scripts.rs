//! The Lua scripts, embedded from `lua/NAME.lua` at build time with `lua/prelude.lua` (the
//! shared helpers) in front, and run by SHA1 through `Redis::evalsha`. `lua/README.md` lists
//! the keys each one declares.

use std::sync::LazyLock;

use crate::redis::Script;

/// Every script, by name: a script's index here is what its Redis duration series is kept
/// under (`pinboard_redis_duration_seconds{script}`).
pub const NAMES: [&str; 24] = [
    "ready",
    "register",
    "heartbeat",
    "prune",
    "session_drop",
    "control_push",
    "bucket_worker",
    "release",
    "resolve",
    "wind_down",
    "drain",
    "fleet",
    "binding",
    "overwritten_clear",
    "tag",
    "schedule",
    "wake_due",
    "wake_done",
    "sweeper",
    "sweep_rows",
    "forget_namespace",
    "history",
    "ledger_prune",
    "pause",
];

/// The position of `name` in [`NAMES`]; a name missing there fails the build.
const fn index_of(name: &str) -> usize {
    let mut i = 0;
    while i < NAMES.len() {
        if str_eq(NAMES[i], name) {
            return i;
        }
        i += 1;
    }
    panic!("a script missing from NAMES")
}

const fn str_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

const PRELUDE: &str = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/lua/prelude.lua"));

/// `script!("name")` embeds `lua/name.lua` behind the helpers of `lua/prelude.lua` it uses.
macro_rules! script {
    ($name:literal) => {
        LazyLock::new(|| {
            const INDEX: usize = index_of($name);
            let body = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/lua/", $name, ".lua"));
            Script::new(INDEX, $name, with_prelude(body))
        })
    };
}

/// `body` behind the prelude's helpers it names (and those they name), in the prelude's
/// order. Only those: every `local function` of a script is a closure Redis makes each time a
/// call runs past it, whether the call uses it or not, and a steady resolve has no use for the
/// registry's prune or the epoch arithmetic. For the same reason a body may hold a line
/// starting with [`LATER_HELPERS`]: the helpers only the text after it names are made there,
/// by the calls that get that far.
fn with_prelude(body: &str) -> String {
    let helpers = helpers(PRELUDE);
    let (head, tail) = match body.find(LATER_HELPERS) {
        Some(at) => body.split_at(at + 1),
        None => (body, ""),
    };
    let front = named(&helpers, head, &vec![false; helpers.len()]);
    let later = named(&helpers, tail, &front);
    let mut source =
        String::from("-- Prepended: the helpers of lua/prelude.lua this script uses.\n");
    let push = |source: &mut String, which: &[bool]| {
        for ((_, helper), wanted) in helpers.iter().zip(which) {
            if *wanted {
                source.push_str(helper);
            }
        }
    };
    push(&mut source, &front);
    source.push_str(head);
    push(&mut source, &later);
    source.push_str(tail);
    source
}

/// The line that starts a script's later part (see [`with_prelude`]).
const LATER_HELPERS: &str = "\n-- @helpers";

/// Which of `helpers` `text` names, or those name in turn, leaving out the `known` ones.
fn named(helpers: &[(&str, &str)], text: &str, known: &[bool]) -> Vec<bool> {
    let mut used = known.to_vec();
    let mut texts = vec![text];
    while let Some(text) = texts.pop() {
        for (i, (name, helper)) in helpers.iter().enumerate() {
            if !used[i] && names(text, name) {
                used[i] = true;
                texts.push(helper);
            }
        }
    }
    used.iter().zip(known).map(|(u, k)| *u && !*k).collect()
}

/// The prelude's helpers as (name, text): each `local function NAME(` through its closing
/// `end` at the start of a line, with the comment lines just before it.
fn helpers(prelude: &str) -> Vec<(&str, &str)> {
    let mut found = Vec::new();
    let mut start = None;
    let mut name = "";
    let mut at = 0;
    for line in prelude.split_inclusive('\n') {
        let trimmed = line.trim_end();
        if start.is_none() && trimmed.starts_with("--") {
            start = Some(at);
        } else if let Some(rest) = trimmed.strip_prefix("local function ") {
            start.get_or_insert(at);
            name = rest.split('(').next().unwrap_or_default();
        } else if trimmed == "end" && !name.is_empty() {
            found.push((name, &prelude[start.take().unwrap_or(at)..at + line.len()]));
            name = "";
        } else if trimmed.is_empty() && name.is_empty() {
            start = None;
        }
        at += line.len();
    }
    found
}

/// Whether `text` names `name` as a whole identifier.
fn names(text: &str, name: &str) -> bool {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    text.match_indices(name)
        .any(|(i, _)| !text[..i].ends_with(ident) && !text[i + name.len()..].starts_with(ident))
}

/// Readiness probe for `GET /readyz`: proves the scripting path works; returns the server clock
/// in milliseconds.
pub static READY: LazyLock<Script> = script!("ready");
/// The registry half of a registration: ownership, bindings, pruning, the session record.
pub static REGISTER: LazyLock<Script> = script!("register");
/// The registry half of a heartbeat: lease, flags, superseded check, control queue peek.
pub static HEARTBEAT: LazyLock<Script> = script!("heartbeat");
/// The mirror poll's prune of the registry slot.
pub static PRUNE: LazyLock<Script> = script!("prune");
/// Drops a session from the registry slot (deregister, voided registration).
pub static SESSION_DROP: LazyLock<Script> = script!("session_drop");
/// Queues control messages to a session.
pub static CONTROL_PUSH: LazyLock<Script> = script!("control_push");
/// A worker's copy in one bucket: put (register, reclaim), renew (heartbeat) or drop.
pub static BUCKET_WORKER: LazyLock<Script> = script!("bucket_worker");
/// Compare-and-delete of placement rows in one bucket.
pub static RELEASE: LazyLock<Script> = script!("release");
/// Placement: the one live owner of (env, namespace, id), or why not.
pub static RESOLVE: LazyLock<Script> = script!("resolve");
/// An operator wind-down: stamps or clears rows' wind-down expiry, compare-and-set.
pub static WIND_DOWN: LazyLock<Script> = script!("wind_down");
/// An operator drain of a client: set (timed or cordon) or clear.
pub static DRAIN: LazyLock<Script> = script!("drain");
/// The fleet license claim and membership entry of a node.
pub static FLEET: LazyLock<Script> = script!("fleet");
/// Hostname-aware: the env, takeover and quarantine of a (hostname, namespace).
pub static BINDING: LazyLock<Script> = script!("binding");
/// Clears an overwritten marker at or below a served epoch.
pub static OVERWRITTEN_CLEAR: LazyLock<Script> = script!("overwritten_clear");
/// Compare-and-set of a placement's owner tag.
pub static TAG: LazyLock<Script> = script!("tag");
/// Compare-and-set of ids' wake entries (the wake schedule, contract §7).
pub static SCHEDULE: LazyLock<Script> = script!("schedule");
/// The durability sweep: due ids without a placed row paged in as placeholders.
pub static WAKE_DUE: LazyLock<Script> = script!("wake_due");
/// The durability sweep: a woken id leaves the schedule (unless scheduled again).
pub static WAKE_DONE: LazyLock<Script> = script!("wake_done");
/// The sweeper lease: claim (or renew) and release.
pub static SWEEPER: LazyLock<Script> = script!("sweeper");
/// The sweeper's GC of one page of a bucket: dead-owner rows, or markers without a row.
pub static SWEEP_ROWS: LazyLock<Script> = script!("sweep_rows");
/// The sweeper forgets an (env, namespace) pair that holds nothing, unless registered since.
pub static FORGET_NAMESPACE: LazyLock<Script> = script!("forget_namespace");
/// One page of an id's ownership ledger, by its chain (`GET /registry/history`).
pub static HISTORY: LazyLock<Script> = script!("history");
/// The sweeper prunes `ledger:last` fields whose entry the stream's cap trimmed.
pub static LEDGER_PRUNE: LazyLock<Script> = script!("ledger_prune");
/// An operator's pause or resume of one id: the paused field of its row, compare-and-set.
pub static PAUSE: LazyLock<Script> = script!("pause");

/// Every script, for the checks below and for `lua/README.md`.
pub static ALL: [&LazyLock<Script>; 24] = [
    &READY,
    &REGISTER,
    &HEARTBEAT,
    &SESSION_DROP,
    &PRUNE,
    &CONTROL_PUSH,
    &BUCKET_WORKER,
    &RELEASE,
    &RESOLVE,
    &WIND_DOWN,
    &DRAIN,
    &FLEET,
    &BINDING,
    &OVERWRITTEN_CLEAR,
    &TAG,
    &SCHEDULE,
    &SWEEPER,
    &SWEEP_ROWS,
    &FORGET_NAMESPACE,
    &WAKE_DUE,
    &WAKE_DONE,
    &HISTORY,
    &LEDGER_PRUNE,
    &PAUSE,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_script_gets_the_helpers_it_names_and_no_other() {
        let names: Vec<&str> = helpers(PRELUDE).into_iter().map(|(n, _)| n).collect();
        assert_eq!(
            names,
            [
                "now_ms",
                "epoch_digits",
                "epoch_cmp",
                "epoch_next",
                "epoch_max",
                "owner_of",
                "placeholder_of",
                "ledger_field",
                "ledger_append",
                "prune_registry"
            ]
        );
        let defines = |script: &Script, helper: &str| {
            script.source.contains(&format!("local function {helper}("))
        };
        for script in ALL {
            assert!(script.source.starts_with("-- Prepended"), "{}", script.name);
            // Whatever the script (or a helper it got) names, it got.
            for helper in &names {
                if super::names(&script.source, helper) {
                    assert!(defines(script, helper), "{} lacks {helper}", script.name);
                }
            }
        }
        // A steady resolve makes no closure it has no use for: the epoch arithmetic comes
        // after its answer, and the registry's prune not at all; the register gets what it
        // asks for, and what that asks for in turn.
        assert!(!defines(&RESOLVE, "prune_registry"));
        assert!(defines(&RESOLVE, "owner_of") && defines(&RESOLVE, "epoch_max"));
        let at = |what: &str| RESOLVE.source.find(what).unwrap();
        let steady = at("redis.call('HEXISTS', overwritten, id)");
        assert!(at("local function now_ms(") < steady && at("local function owner_of(") < steady);
        for later in [
            "epoch_digits",
            "epoch_cmp",
            "epoch_next",
            "epoch_max",
            "ledger_field",
            "ledger_append",
        ] {
            assert!(at(&format!("local function {later}(")) > steady, "{later}");
        }
        assert!(at("local function epoch_digits(") < at("local function epoch_max("));
        assert!(defines(&REGISTER, "prune_registry") && defines(&REGISTER, "epoch_digits"));
        assert!(!defines(&READY, "owner_of") && !defines(&READY, "epoch_cmp"));
        assert!(super::names("a(epoch_cmp(x))", "epoch_cmp"));
        assert!(!super::names("my_epoch_cmp(x)", "epoch_cmp"));
    }

    /// The layout lives in `src/store/keys.rs`: no script spells a key (no `pinboard:`, no
    /// `{r}`/`{b}` tag, no suffix of the layout concatenated onto a prefix), and each one reads
    /// its keys from `KEYS` only.
    #[test]
    fn no_script_names_a_key() {
        let suffixes = [
            "'sessions'",
            "'clients'",
            "'control:",
            "'drain:",
            "'bind:",
            "'fleet'",
            "'members'",
            "'workers'",
            "'alive'",
            "'nsw:",
            ":placements'",
            ":overwritten'",
            "'boot_time'",
            "'epoch'",
            "'sweeper'",
            "'namespaces'",
            ":wake'",
            "'ledger'",
            "'ledger:last'",
        ];
        for script in ALL {
            for needle in suffixes.iter().chain(&["pinboard:", "{r}", ".. ':'"]) {
                assert!(
                    !script.source.contains(needle),
                    "{} spells a key: {needle}",
                    script.name
                );
            }
        }
    }
}
