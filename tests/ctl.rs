//! `pinboard ctl` end to end: the real binary asking a real node (real redis-server, hand-made
//! workers registered and placed on through the node's own routes) for its workers,
//! placements and health, and draining, undraining, winding down, moving, pausing and resuming; its tables, `--json`
//! documents, exit codes and every refusal line, the node's exact error strings included.

mod support;

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};
use support::fleet::{Fixture, register_body};
use support::http::{Client, get, post_json};
use support::node::{token, token_signed_with};
use support::worker::TestWorker;

/// What one `pinboard ctl` run did.
#[derive(Debug)]
struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// `pinboard ctl ARGS` with none of this process's `PINBOARD_*` variables, `env` instead.
fn ctl(args: &[&str], env: &[(&str, &str)]) -> Run {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_pinboard"));
    for (key, _) in std::env::vars().filter(|(k, _)| k.starts_with("PINBOARD_")) {
        cmd.env_remove(key);
    }
    let out = cmd
        .arg("ctl")
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    Run {
        code: out.status.code(),
        stdout: String::from_utf8(out.stdout).unwrap(),
        stderr: String::from_utf8(out.stderr).unwrap(),
    }
}

/// `pinboard ctl` pointed at one node with one credential (in `PINBOARD_TOKEN`).
struct Ctl {
    url: String,
    token: String,
}

impl Ctl {
    /// `pinboard ctl` for `f`'s node with an operator credential over every namespace (`ops`).
    fn operator(f: &Fixture) -> Ctl {
        Ctl {
            url: f.node.url(),
            token: token("ops", &["pinboard:operator"], &["*"]),
        }
    }

    fn run(&self, args: &[&str]) -> Run {
        let mut all = vec!["--url", self.url.as_str()];
        all.extend_from_slice(args);
        ctl(&all, &[("PINBOARD_TOKEN", self.token.as_str())])
    }

    /// The stdout of a run that must succeed, silently on stderr.
    fn ok(&self, args: &[&str]) -> String {
        let run = self.run(args);
        assert!(
            run.code == Some(0) && run.stderr.is_empty(),
            "{args:?}: {run:?}"
        );
        run.stdout
    }

    /// The one stderr line of a run that must exit `code` with nothing on stdout.
    fn refused(&self, args: &[&str], code: i32) -> String {
        refused_with(self.run(args), code, &self.token)
    }

    fn json(&self, args: &[&str]) -> Value {
        let mut all = args.to_vec();
        all.push("--json");
        let out = self.ok(&all);
        serde_json::from_str(&out)
            .unwrap_or_else(|e| panic!("{args:?}: one JSON document? {e}: {out}"))
    }
}

/// A warm node with two hand-made workers registered as `w1` and `w2`: the fixture, the workers
/// (kept for as long as they serve) and their sessions.
fn fleet_of_two() -> (Fixture, [TestWorker; 2], [String; 2]) {
    let f = Fixture::new(&[]);
    f.warm();
    let workers = [TestWorker::start("ctl-w1"), TestWorker::start("ctl-w2")];
    let sessions = [
        f.registered(&workers[0], "w1"),
        f.registered(&workers[1], "w2"),
    ];
    (f, workers, sessions)
}

/// The stderr line of `run`, which must have exited `code`, printed nothing on stdout, one line
/// on stderr, and never `secret`.
fn refused_with(run: Run, code: i32, secret: &str) -> String {
    assert_eq!(run.code, Some(code), "{run:?}");
    assert!(run.stdout.is_empty(), "{run:?}");
    assert_eq!(run.stderr.lines().count(), 1, "{run:?}");
    assert!(
        !run.stderr.contains(secret),
        "the credential was printed: {run:?}"
    );
    run.stderr.trim_end().to_owned()
}

/// The rows of an aligned table (the lines up to the first empty one, a count line left out),
/// each cell under its header: a column starts where its header does, and headers are two
/// spaces or more apart.
fn table(text: &str) -> Vec<BTreeMap<String, String>> {
    let mut lines = text.lines().take_while(|l| !l.is_empty());
    let header = lines.next().expect("a header line");
    let starts: Vec<usize> = (0..header.len())
        .filter(|&i| header.as_bytes()[i] != b' ' && (i == 0 || header[..i].ends_with("  ")))
        .collect();
    let cell = |line: &str, c: usize| {
        let end = starts
            .get(c + 1)
            .copied()
            .unwrap_or(usize::MAX)
            .min(line.len());
        line.get(starts[c].min(line.len())..end)
            .unwrap_or("")
            .trim()
            .to_owned()
    };
    // The count line under a listing ("2 workers") is no row.
    let is_count = |l: &str| {
        l.split_once(' ')
            .is_some_and(|(n, noun)| n.parse::<u64>().is_ok() && !noun.contains(' '))
    };
    lines
        .filter(|l| !is_count(l))
        .map(|line| {
            (0..starts.len())
                .map(|c| (cell(header, c), cell(line, c)))
                .collect()
        })
        .collect()
}

fn row<'a>(
    rows: &'a [BTreeMap<String, String>],
    column: &str,
    value: &str,
) -> &'a BTreeMap<String, String> {
    rows.iter()
        .find(|r| r[column] == value)
        .unwrap_or_else(|| panic!("no row with {column} = {value}: {rows:?}"))
}

/// The seconds of a relative time under a minute ("in 42s" after `prefix` "in ").
fn seconds(text: &str, prefix: &str) -> Option<u64> {
    text.strip_prefix(prefix)?.strip_suffix('s')?.parse().ok()
}

fn last_line(text: &str) -> &str {
    text.lines().last().unwrap_or("")
}

#[test]
fn an_operator_sees_and_steers_a_fleet_from_the_command_line() {
    let (f, _workers, [s1, s2]) = fleet_of_two();
    let placed = [
        "/threads/a1/x",
        "/threads/a2/x",
        "/threads/b1/x",
        "/docs/d1/x",
    ]
    .map(|path| get(f.node.addr, path, None).status);
    assert_eq!(placed, [200; 4], "{}", f.node.log());
    // A tagged placement of w1's, as a worker's tag call leaves it, and one of w2's (the data
    // plane may have placed every id on one worker).
    f.put_row(
        "/threads",
        "t9",
        json!({"sessionId": s1, "epoch": "1", "tag": "ws:W"}),
    );
    f.put_row("/threads", "t8", json!({"sessionId": s2, "epoch": "1"}));
    let ops = Ctl::operator(&f);

    // workers: both, each with its session, namespaces, state and lease.
    let out = ops.ok(&["workers"]);
    assert_eq!(last_line(&out), "2 workers", "{out}");
    let rows = table(&out);
    assert_eq!(rows.len(), 2, "{out}");
    for (client, session) in [("w1", &s1), ("w2", &s2)] {
        let r = row(&rows, "CLIENT", client);
        assert_eq!(r["SESSION"], session[..8], "{out}");
        assert_eq!(r["HOSTNAME"], "-");
        assert!(r["NAMESPACES"].contains("/threads") && r["NAMESPACES"].contains("/docs"));
        assert_eq!(r["STATE"], "serving");
        assert_eq!(r["DEGRADED"], "-");
        let lease = &r["LEASE LEFT"];
        assert!(lease.ends_with('s') && lease != "expired", "{out}");
        assert!(r["HEADROOM"].parse::<f64>().is_ok(), "{out}");
    }
    // --json: the node's own answer, one document.
    let listed = ops.json(&["workers"]);
    let direct = get(f.node.addr, "/registry/workers", Some(&ops.token)).json();
    let sessions = |v: &Value| -> Vec<String> {
        v["workers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| w["sessionId"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(sessions(&listed), sessions(&direct));
    assert_eq!(
        listed["workers"][0]["advertiseUrl"],
        direct["workers"][0]["advertiseUrl"]
    );

    // instances: every placement, its owner joined from the workers; then filtered.
    let out = ops.ok(&["instances"]);
    assert_eq!(last_line(&out), "6 instances", "{out}");
    let rows = table(&out);
    assert_eq!(row(&rows, "ID", "t8")["CLIENT"], "w2", "{out}");
    let overview = ops.json(&["instances"]);
    for group in overview["namespaces"].as_array().unwrap() {
        for entry in group["entries"].as_array().unwrap() {
            let id = entry["id"].as_str().unwrap();
            let r = row(&rows, "ID", id);
            let owner = entry["sessionId"].as_str().unwrap();
            let client = if owner == s1 { "w1" } else { "w2" };
            assert_eq!(
                (
                    r["NAMESPACE"].as_str(),
                    r["SESSION"].as_str(),
                    r["CLIENT"].as_str()
                ),
                (group["namespace"].as_str().unwrap(), &owner[..8], client),
                "{out}"
            );
            assert_eq!(
                (r["ENV"].as_str(), r["HOSTNAME"].as_str()),
                ("default", "-")
            );
        }
    }
    assert_eq!(row(&rows, "ID", "t9")["TAG"], "ws:W");
    assert_eq!(row(&rows, "ID", "a1")["TAG"], "-");
    assert_eq!(row(&rows, "ID", "a1")["WIND-DOWN"], "-");
    let out = ops.ok(&["instances", "--ns", "/threads", "--prefix", "a"]);
    let ids: Vec<String> = table(&out).iter().map(|r| r["ID"].clone()).collect();
    assert_eq!(
        (ids, last_line(&out)),
        (vec!["a1".into(), "a2".into()], "2 instances")
    );
    let out = ops.ok(&["instances", "--tag", "ws:W"]);
    assert_eq!(last_line(&out), "1 instance", "{out}");
    assert_eq!(table(&out).len(), 1, "{out}");
    assert_eq!(table(&out)[0]["ID"], "t9");
    assert_eq!(
        ops.refused(&["instances", "--ns", "threads"], 1),
        "pinboard ctl: 400 invalid namespace"
    );
    assert_eq!(
        ops.refused(&["instances", "--tag", " "], 1),
        "pinboard ctl: 400 empty tag"
    );

    // drain: a cordon shows as cordoned; undrain puts it back.
    let state =
        |client: &str| row(&table(&ops.ok(&["workers"])), "CLIENT", client)["STATE"].clone();
    assert_eq!(
        ops.ok(&["drain", "w2"]),
        "drained: w2 is cordoned: no new placements from its next heartbeat, its own keep routing\n"
    );
    assert_eq!(
        (state("w2"), state("w1")),
        ("cordoned".into(), "serving".into())
    );
    assert_eq!(
        ops.ok(&["undrain", "w2"]),
        "undrained: w2 takes placements again from its next heartbeat\n"
    );
    assert_eq!(state("w2"), "serving");
    assert_eq!(ops.ok(&["undrain", "w2"]), "w2 was not drained\n");
    // A timed drain shows its deadline, relative to now.
    assert_eq!(
        ops.json(&["drain", "w2", "--deadline", "60"]),
        json!({"drained": true})
    );
    let drain = state("w2");
    assert!(
        drain == "drain in 1m" || seconds(&drain, "drain in ").is_some_and(|s| s >= 45),
        "{drain}"
    );
    let listed = ops.json(&["workers"]);
    let w2_entry = listed["workers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["clientId"] == "w2")
        .unwrap();
    assert!(w2_entry["drain"]["deadline"].as_u64().unwrap() > 1_000_000_000_000);
    assert_eq!(
        ops.refused(&["drain", "nobody"], 1),
        "pinboard ctl: 403 forbidden"
    );
    ops.ok(&["undrain", "w2"]);

    // wind-down of one id: the row's fence is set, and the listing shows it.
    assert_eq!(
        ops.ok(&["wind-down", "/threads/a1", "--deadline", "30"]),
        "queued: wind-down of /threads/a1, the fence falls in 30s (one lease at least)\n"
    );
    let fence = f.row("/threads", "a1").unwrap()["expiry"].as_u64().unwrap();
    let now = pinboard::clock::now_ms();
    assert!(
        (now + 25_000..=now + 30_000).contains(&fence),
        "{fence} vs {now}"
    );
    let out = ops.ok(&["instances", "--ns", "/threads", "--prefix", "a1"]);
    let wind = &table(&out)[0]["WIND-DOWN"];
    assert!(
        seconds(wind, "in ").is_some_and(|s| (20..=30).contains(&s)),
        "{out}"
    );
    assert_eq!(
        ops.ok(&["wind-down", "/threads/nope"]),
        "nothing queued: /threads/nope has no placement (or its owner is gone)\n"
    );
    assert_eq!(
        ops.ok(&["wind-down", "/threads/a1", "--cancel"]),
        "queued: revocation of /threads/a1\n"
    );
    assert!(f.row("/threads", "a1").unwrap().get("expiry").is_none());
    // A whole namespace only with --yes.
    assert_eq!(
        ops.refused(&["wind-down", "/docs"], 2),
        "pinboard ctl: wind-down /docs acts on every placement of /docs: add --yes to go ahead"
    );
    assert!(f.row("/docs", "d1").unwrap().get("expiry").is_none());
    assert_eq!(
        ops.ok(&["wind-down", "/docs", "--yes", "--deadline", "20"]),
        "queued: wind-down of 1 placement in /docs, the fence falls in 20s (one lease at least)\n"
    );
    assert!(f.row("/docs", "d1").unwrap()["expiry"].as_u64().unwrap() > now);
    assert_eq!(
        ops.refused(&["wind-down", "/threads/a1", "--env", "prod"], 1),
        "pinboard ctl: 400 env requires hostname-aware mode"
    );

    // health: ready, and the data-plane requests above counted as forwards.
    let out = ops.ok(&["health"]);
    let facts: BTreeMap<&str, &str> = out
        .lines()
        .take_while(|l| !l.is_empty())
        .filter_map(|l| l.split_once("  "))
        .map(|(k, v)| (k.trim(), v.trim()))
        .collect();
    assert_eq!(facts["ready"], "yes", "{out}");
    assert!(facts["connections"].parse::<u64>().is_ok(), "{out}");
    assert_eq!(facts["quarantine"], "none", "{out}");
    assert!(facts["uptime"].ends_with(['s', 'm']), "{out}");
    assert!(facts["memory (RSS)"].ends_with(" MiB"), "{out}");
    let outcomes = table(out.split("\n\n").nth(1).unwrap());
    let forwards: u64 = row(&outcomes, "OUTCOME", "forward")["RESOLUTIONS"]
        .parse()
        .unwrap();
    assert!(forwards >= 4, "{out}");
    let health = ops.json(&["health"]);
    assert!(
        health["resolutions"]["forward"].as_u64().unwrap() >= 4,
        "{health}"
    );
    assert!(health["uptimeMs"].is_u64());

    // The credential from a file, its trailing newline trimmed.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ops.token");
    std::fs::write(&file, format!("{}\n", ops.token)).unwrap();
    let run = ctl(
        &[
            "--url",
            &ops.url,
            "--token-file",
            file.to_str().unwrap(),
            "workers",
        ],
        &[],
    );
    assert_eq!(
        (run.code, last_line(&run.stdout)),
        (Some(0), "2 workers"),
        "{run:?}"
    );

    // Refusals: the node's status and exact error string, exit 1, the credential never shown.
    let forged = Ctl {
        url: ops.url.clone(),
        token: token_signed_with(
            "another-secret-0123456789abcdef",
            "ops",
            &["pinboard:operator"],
            &["*"],
            &[],
        ),
    };
    assert_eq!(
        forged.refused(&["workers"], 1),
        "pinboard ctl: 401 unauthorized (the node refused the credential)"
    );
    let worker = Ctl {
        url: ops.url.clone(),
        token: f.token.clone(),
    };
    assert_eq!(
        worker.refused(&["health"], 1),
        "pinboard ctl: 403 forbidden"
    );
    let docs_only = Ctl {
        url: ops.url.clone(),
        token: token("ops-docs", &["pinboard:operator"], &["/docs"]),
    };
    assert_eq!(
        docs_only.refused(&["wind-down", "/threads/a2", "--deadline", "5"], 1),
        "pinboard ctl: 403 namespace not allowed: /threads"
    );
    assert!(f.row("/threads", "a2").unwrap().get("expiry").is_none());
    // Its views are cut down to what it covers.
    let out = docs_only.ok(&["instances"]);
    assert_eq!(last_line(&out), "1 instance", "{out}");
    assert_eq!(table(&out)[0]["NAMESPACE"], "/docs");
}

#[test]
fn an_operator_moves_pauses_and_resumes_one_instance_from_the_command_line() {
    let (f, _workers, [s1, s2]) = fleet_of_two();
    f.put_row("/threads", "m1", json!({"sessionId": s1, "epoch": "1"}));
    let ops = Ctl::operator(&f);

    // move: the successor's session named on the row, under a fence of one lease at least.
    assert_eq!(
        ops.ok(&["move", "/threads/m1", "--to", "w2"]),
        format!(
            "queued: move of /threads/m1 to w2 (session {}): its owner lets go within one lease, then it is placed there\n",
            &s2[..8]
        )
    );
    let moved = f.row("/threads", "m1").unwrap();
    assert_eq!(moved["mv"]["to"], json!(s2), "{moved}");
    assert!(moved["expiry"].as_u64().unwrap() > pinboard::clock::now_ms());
    // To a client that cannot take it: still fenced, the successor no longer named.
    assert_eq!(
        ops.ok(&["move", "/threads/m1", "--to", "nobody", "--deadline", "90"]),
        "queued: move of /threads/m1: its owner lets go within 1m30s (one lease at least); nobody cannot take it (unknown, draining, degraded or not serving it), so it is placed as any other\n"
    );
    let fenced = f.row("/threads", "m1").unwrap();
    assert!(fenced.get("mv").is_none(), "{fenced}");
    assert!(fenced["expiry"].as_u64().unwrap() > pinboard::clock::now_ms() + 80_000);
    // An id without a placement: nothing queued; --json is the node's answer.
    assert_eq!(
        ops.ok(&["move", "/threads/none", "--to", "w2"]),
        "nothing queued: /threads/none has no placement\n"
    );
    assert_eq!(
        ops.json(&["move", "/threads/none", "--to", "w2"]),
        json!({"queued": false, "to": s2})
    );
    assert!(f.row("/threads", "none").is_none());
    assert_eq!(
        ops.refused(&["move", "/threads", "--to", "w2"], 2),
        "pinboard ctl: move \"/threads\": expected /NS/ID"
    );
    assert_eq!(
        ops.refused(&["move", "/threads/a b", "--to", "w2"], 1),
        "pinboard ctl: 400 invalid instance id"
    );

    // pause: the data plane answers 503; the listing shows the pause, an unplaced id too.
    assert_eq!(
        ops.ok(&["pause", "/threads/p1", "--reason", "incident 7"]),
        "paused: /threads/p1 answers 503 on every node until it is resumed\n"
    );
    let refused = get(f.node.addr, "/threads/p1/x", None);
    assert_eq!(
        (refused.status, refused.json()),
        (503, json!({"error": "instance paused"}))
    );
    let out = ops.ok(&["instances", "--ns", "/threads"]);
    let listed = row(&table(&out), "ID", "p1").clone();
    assert_eq!(
        (&*listed["SESSION"], &*listed["CLIENT"]),
        ("-", "-"),
        "{out}"
    );
    assert!(listed["PAUSED"].ends_with(": incident 7"), "{out}");
    assert_eq!(row(&table(&out), "ID", "m1")["PAUSED"], "-", "{out}");
    let overview = ops.json(&["instances", "--ns", "/threads"]);
    let entries = overview["namespaces"][0]["entries"].as_array().unwrap();
    let paused = entries.iter().find(|e| e["id"] == "p1").unwrap();
    assert_eq!(paused["sessionId"], Value::Null, "{overview}");
    assert_eq!(
        (&paused["paused"]["by"], &paused["paused"]["reason"]),
        (&json!("ops"), &json!("incident 7"))
    );
    // Out of scope, and a bad target.
    let docs_only = Ctl {
        url: ops.url.clone(),
        token: token("ops-docs", &["pinboard:operator"], &["/docs"]),
    };
    assert_eq!(
        docs_only.refused(&["resume", "/threads/p1"], 1),
        "pinboard ctl: 403 namespace not allowed: /threads"
    );
    assert_eq!(
        ops.refused(&["pause", "threads/p1"], 2),
        "pinboard ctl: pause \"threads/p1\": expected /NS/ID"
    );

    // resume: served (placed) again, and no longer listed as paused.
    assert_eq!(
        ops.ok(&["resume", "/threads/p1"]),
        "resumed: /threads/p1 is served again\n"
    );
    assert_eq!(get(f.node.addr, "/threads/p1/x", None).status, 200);
    let out = ops.ok(&["instances", "--ns", "/threads", "--prefix", "p1"]);
    assert_eq!(table(&out)[0]["PAUSED"], "-", "{out}");
    assert_ne!(table(&out)[0]["SESSION"], "-", "{out}");
}

#[test]
fn bad_usage_a_missing_credential_and_an_unreachable_node() {
    let secret = token("ops", &["pinboard:operator"], &["*"]);
    let with_token = [("PINBOARD_TOKEN", secret.as_str())];

    // No credential, or two: exit 2 before anything is sent.
    assert_eq!(
        refused_with(ctl(&["workers"], &[]), 2, &secret),
        "pinboard ctl: no credential: give --token-file FILE or set PINBOARD_TOKEN"
    );
    assert_eq!(
        refused_with(ctl(&["workers"], &[("PINBOARD_TOKEN", "")]), 2, &secret),
        "pinboard ctl: no credential: give --token-file FILE or set PINBOARD_TOKEN"
    );
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ops.token");
    std::fs::write(&file, &secret).unwrap();
    let path = file.to_str().unwrap();
    assert_eq!(
        refused_with(
            ctl(&["workers", "--token-file", path], &with_token),
            2,
            &secret
        ),
        "pinboard ctl: the credential was given 2 ways (--token-file, PINBOARD_TOKEN): give exactly one"
    );
    // A token file that cannot be read, is empty, or holds more than one word.
    let missing = dir.path().join("missing");
    let line = refused_with(
        ctl(&["health", "--token-file", missing.to_str().unwrap()], &[]),
        2,
        &secret,
    );
    assert!(
        line.starts_with(&format!(
            "pinboard ctl: --token-file {}: ",
            missing.display()
        )) && line.contains("No such file"),
        "{line}"
    );
    let line = refused_with(
        ctl(
            &["health", "--token-file", dir.path().to_str().unwrap()],
            &[],
        ),
        2,
        &secret,
    );
    assert!(line.starts_with("pinboard ctl: --token-file "), "{line}");
    std::fs::write(&file, "\n").unwrap();
    assert_eq!(
        refused_with(ctl(&["health", "--token-file", path], &[]), 2, &secret),
        format!("pinboard ctl: --token-file {path}: the credential is empty")
    );
    std::fs::write(&file, format!("{secret} {secret}\n")).unwrap();
    assert_eq!(
        refused_with(ctl(&["health", "--token-file", path], &[]), 2, &secret),
        format!(
            "pinboard ctl: --token-file {path}: the credential holds a space or a control \
             character (a token is one word)"
        )
    );

    // A URL that is none, a wind-down of a whole namespace without --yes, a bad target.
    assert_eq!(
        refused_with(
            ctl(&["workers", "--url", "ftp://h:1"], &with_token),
            2,
            &secret
        ),
        "pinboard ctl: --url ftp://h:1: must be an http or https URL"
    );
    assert_eq!(
        refused_with(ctl(&["wind-down", "/threads"], &with_token), 2, &secret),
        "pinboard ctl: wind-down /threads acts on every placement of /threads: add --yes to go ahead"
    );
    assert_eq!(
        refused_with(ctl(&["wind-down", "threads/a1"], &with_token), 2, &secret),
        "pinboard ctl: wind-down \"threads/a1\": expected /NS or /NS/ID"
    );
    let run = ctl(&["drain"], &with_token);
    assert_eq!(run.code, Some(2), "{run:?}");
    assert!(run.stderr.contains("<CLIENT_ID>"), "{run:?}");

    // Nothing listening (PINBOARD_URL names it): exit 1 with the address and the reason.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let run = ctl(
        &["workers"],
        &[("PINBOARD_TOKEN", &secret), ("PINBOARD_URL", &url)],
    );
    assert_eq!(
        refused_with(run, 1, &secret),
        format!("pinboard ctl: {url}: connecting: Connection refused (os error 111)")
    );
    // Listening but never answering: --timeout bounds the wait.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", silent.local_addr().unwrap());
    let started = std::time::Instant::now();
    let run = ctl(&["health", "--url", &url, "--timeout", "1"], &with_token);
    assert_eq!(
        refused_with(run, 1, &secret),
        format!("pinboard ctl: {url}: no answer within 1s (--timeout)")
    );
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn an_https_node_whose_certificate_a_private_ca_signed() {
    let (pki, _, f) = support::tls::https_node(&[]);
    let secret = token("ops", &["pinboard:operator"], &["*"]);
    let with_token = [("PINBOARD_TOKEN", secret.as_str())];
    let port = f.node.addr.port();
    let ca = pki.cert_str();
    for url in [
        format!("https://localhost:{port}"),
        format!("https://127.0.0.1:{port}"),
    ] {
        let run = ctl(&["workers", "--url", &url, "--ca-file", ca], &with_token);
        assert_eq!(
            (run.code, run.stdout.as_str()),
            (
                Some(0),
                "CLIENT  HOSTNAME  SESSION  NAMESPACES  HEADROOM  IN FLIGHT  STATE  DEGRADED  LEASE LEFT\n0 workers\n"
            ),
            "{run:?}"
        );
        // /readyz too goes over TLS.
        let run = ctl(&["health", "--url", &url, "--ca-file", ca], &with_token);
        assert!(run.stdout.starts_with("ready         yes\n"), "{run:?}");
        // Without the CA the certificate does not verify: the handshake's reason is shown.
        let line = refused_with(ctl(&["workers", "--url", &url], &with_token), 1, &secret);
        assert!(
            line.starts_with(&format!("pinboard ctl: {url}: connecting: TLS handshake: "))
                && line.contains("UnknownIssuer"),
            "{line}"
        );
    }
    // Plain HTTP to the TLS port gets no HTTP answer.
    let url = format!("http://127.0.0.1:{port}");
    let line = refused_with(
        ctl(&["workers", "--url", &url, "--timeout", "2"], &with_token),
        1,
        &secret,
    );
    assert!(
        line.starts_with(&format!("pinboard ctl: {url}: ")),
        "{line}"
    );
    // A CA file that is no certificate: bad usage, nothing sent.
    let junk = pki.path("junk.pem");
    std::fs::write(&junk, "not a certificate\n").unwrap();
    let line = refused_with(
        ctl(
            &[
                "workers",
                "--url",
                &url,
                "--ca-file",
                junk.to_str().unwrap(),
            ],
            &with_token,
        ),
        2,
        &secret,
    );
    assert!(line.starts_with("pinboard ctl: --ca-file: "), "{line}");
}

#[test]
fn a_node_under_a_base_path_in_hostname_aware_mode() {
    let worker = TestWorker::start("ctl-based");
    let f = Fixture::new(&[
        ("PINBOARD_BASE_PATH", "/api"),
        ("PINBOARD_HOSTNAME_AWARE", "true"),
    ]);
    f.warm();
    let body = register_body(&worker, "w1", json!({"hostname": "h1", "env": "prod"}));
    let r = post_json(
        f.node.addr,
        "/api/registry/register",
        Some(&f.token),
        &body.to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let r =
        Client::connect(f.node.addr).request(b"GET /api/threads/x1/y HTTP/1.1\r\nHost: h1\r\n\r\n");
    assert_eq!(r.status, 200, "{}", r.text());

    let ops = Ctl {
        url: format!("{}/api", f.node.url()),
        token: token("ops", &["pinboard:operator"], &["*"]),
    };
    let out = ops.ok(&["workers"]);
    let w1 = row(&table(&out), "CLIENT", "w1").clone();
    assert_eq!(w1["HOSTNAME"], "h1");
    let namespaces: Vec<&str> = w1["NAMESPACES"].split(',').collect();
    assert!(
        namespaces.contains(&"/threads=prod") && namespaces.contains(&"/docs=prod"),
        "{out}"
    );
    let out = ops.ok(&["instances", "--ns", "/threads"]);
    let x1 = row(&table(&out), "ID", "x1").clone();
    assert_eq!(
        (
            x1["HOSTNAME"].as_str(),
            x1["ENV"].as_str(),
            x1["CLIENT"].as_str()
        ),
        ("h1", "prod", "w1"),
        "{out}"
    );
    // /readyz is at the root whatever the base path.
    assert!(ops.ok(&["health"]).starts_with("ready"));
    assert!(ops.ok(&["health"]).lines().next().unwrap().ends_with("yes"));

    // Hostname-aware: a wind-down names its env.
    assert_eq!(
        ops.refused(&["wind-down", "/threads/x1"], 1),
        "pinboard ctl: 400 env is required in hostname-aware mode"
    );
    assert_eq!(
        ops.ok(&[
            "wind-down",
            "/threads/x1",
            "--env",
            "prod",
            "--deadline",
            "40"
        ]),
        "queued: wind-down of /threads/x1, the fence falls in 40s (one lease at least)\n"
    );
    let out = ops.ok(&["instances"]);
    assert!(
        row(&table(&out), "ID", "x1")["WIND-DOWN"].starts_with("in "),
        "{out}"
    );

    // The URL without the base: the node's 404.
    let bare = Ctl {
        url: f.node.url(),
        token: ops.token.clone(),
    };
    assert_eq!(bare.refused(&["workers"], 1), "pinboard ctl: 404 not found");
}
