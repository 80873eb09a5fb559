//! The example worker binary against a real `pinboard serve` and redis-server: it prints its
//! address and session, counts and echoes through the node, and on SIGTERM releases and
//! deregisters before exiting 0. With a shared `--durable-dir`, a ticker outlives the worker
//! it ran on: SIGKILLed, the node's sweep wakes it on another; and a worker paused past its
//! lease that resumes and saves is refused by the store (fenced by epoch), the new owner's
//! state standing.
//!
//! Needs the `pinboard` binary next to this test (see `support/node.rs`).

mod support;

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pinboard::store::bucket_of;
use pinned::{DurabilityStore, Fence, FileStore};
use serde_json::{Value, json};
use support::http::{Client, get, post_json};
use support::layout::{SHARDS, end_cold_start, keys};
use support::node::{Node, token};
use support::process::{Output, PinnedExample, ticks_logged};
use support::redis::RedisServer;
use support::tokens::{expiring_worker_token, replace_token};
use support::{eventually, workers};

struct Example {
    child: Child,
    lines: Receiver<String>,
    /// Its log (stderr), line by line as it is written.
    log: Arc<Mutex<Vec<String>>>,
    addr: SocketAddr,
    session: String,
}

impl Example {
    fn start(node: &Node, extra: &[&str]) -> Example {
        Example::start_as(node, "example-1", extra)
    }

    /// A worker registered as `client_id`, with `extra` arguments.
    fn start_as(node: &Node, client_id: &str, extra: &[&str]) -> Example {
        let token = token("acct-1", &["pinboard:worker"], &["*"]);
        Example::launch(node, client_id, extra, &[("PINNED_TOKEN", &token)])
    }

    /// A worker registered as `client_id` with `extra` arguments and the credential `env`
    /// gives (`PINNED_TOKEN` or `PINNED_TOKEN_FILE`).
    fn launch(node: &Node, client_id: &str, extra: &[&str], env: &[(&str, &str)]) -> Example {
        let example = PinnedExample {
            bin: Path::new(env!("CARGO_BIN_EXE_pinned-example")),
            registry: &node.url(),
            namespaces: "/threads,/docs",
            client_id,
        };
        let (child, Output { lines, log }) = example.spawn(extra, env);
        let line = |prefix: &str| {
            let line = lines
                .recv_timeout(Duration::from_secs(15))
                .unwrap_or_else(|_| panic!("no {prefix:?} line:\n{}", node.log()));
            assert!(line.starts_with(prefix), "{line:?}");
            line
        };
        let listening = line("listening ");
        let addr = listening
            .split_whitespace()
            .nth(1)
            .unwrap()
            .parse()
            .unwrap();
        assert!(
            listening.ends_with(&format!("advertise=http://{addr}")),
            "{listening}"
        );
        let session = line("registered session=")["registered session=".len()..].to_owned();
        Example {
            child,
            lines,
            log,
            addr,
            session,
        }
    }

    /// The log lines written so far.
    fn log(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    /// SIGKILL: no release, no deregistration, no goodbye; returns once it is gone.
    fn kill(&mut self) {
        self.child.kill().expect("SIGKILL pinned-example");
        self.child.wait().expect("reap pinned-example");
    }

    /// SIGTERM, then the exit code (bounded wait).
    fn terminate(&mut self) -> Option<i32> {
        let pid = self.child.id().to_string();
        assert!(
            Command::new("kill")
                .args(["-TERM", &pid])
                .status()
                .unwrap()
                .success()
        );
        self.exit_code(Duration::from_secs(20))
    }

    /// The exit code, once it exits within `limit` (the test fails otherwise).
    fn exit_code(&mut self, limit: Duration) -> Option<i32> {
        let log = self.log.clone();
        workers::exit_code(&mut self.child, limit, "pinned-example", || {
            log.lock().unwrap().join("\n")
        })
    }
}

impl Drop for Example {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn registers_then_deregisters_on_sigterm() {
    let redis = RedisServer::start();
    let node = Node::start(&redis.url(), &[("PINBOARD_LEASE_TTL_MS", "3000")]);
    let mut example = Example::start(&node, &["--driver", "epoll"]);
    assert_eq!(
        workers::session_status(&node, "acct-1", &example.session),
        200
    );
    // Unattested requests are refused by the library before the example sees them.
    assert_eq!(get(example.addr, "/threads/a/count", None).status, 403);

    assert_eq!(example.terminate(), Some(0));
    assert_eq!(
        workers::session_status(&node, "acct-1", &example.session),
        409,
        "{}",
        node.log()
    );
    assert!(example.lines.try_recv().is_err(), "nothing more printed");
}

#[test]
fn counts_and_echoes_through_the_node() {
    let redis = RedisServer::start();
    let node = Node::start(&redis.url(), &[("PINBOARD_LEASE_TTL_MS", "3000")]);
    let mut example = Example::start(&node, &[]);
    // Past the registry's cold-start quarantine the first count places the instance.
    assert!(eventually(Duration::from_secs(10), || {
        get(node.addr, "/threads/a/count", None).status == 200
    }));
    let second = get(node.addr, "/threads/a/count", None).json();
    assert_eq!(second["count"], 2);
    assert_eq!(
        (second["ns"].clone(), second["id"].clone()),
        (json!("/threads"), json!("a"))
    );
    assert_eq!(second["session"], json!(example.session));
    assert!(
        second["epoch"]
            .as_str()
            .unwrap()
            .bytes()
            .all(|b| b.is_ascii_digit())
    );

    // Another bucket: its own cold start begins with its first request.
    let post_echo = || {
        Client::connect(node.addr).request(
            b"POST /docs/d/echo HTTP/1.1\r\nHost: t\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n\r\nhello",
        )
    };
    assert!(eventually(Duration::from_secs(10), || post_echo().status == 200));
    let echo = post_echo();
    assert_eq!((echo.status, echo.text().as_str()), (200, "hello"));
    assert_eq!(echo.header("content-type"), Some("text/plain"));

    // Without --durable-dir there is no `_wake` (contract §7), and no ticker.
    let not_found = json!({ "detail": "not found" });
    let wake = post_json(node.addr, "/threads/a/_wake", None, "");
    assert_eq!((wake.status, wake.json()), (404, not_found.clone()));
    let ticks = get(node.addr, "/threads/a/ticks", None);
    assert_eq!((ticks.status, ticks.json()), (404, not_found));

    // Released, the next count is a new placement: a new epoch, the counter from 1.
    let released = post_json(node.addr, "/threads/a/release", None, "");
    assert_eq!(released.json(), json!({ "released": true }));
    let fresh = get(node.addr, "/threads/a/count", None).json();
    assert_eq!(fresh["count"], 1);
    assert_ne!(fresh["epoch"], second["epoch"]);

    assert_eq!(example.terminate(), Some(0));
    assert_eq!(
        workers::session_status(&node, "acct-1", &example.session),
        409
    );
}

/// POSTs through the node after 6 s without traffic (longer than uvicorn's and Node's 5 s
/// keep-alive, shorter than this worker's 75 s): each on a connection that can carry it, all 200.
#[test]
fn posts_after_six_idle_seconds_all_answer_200() {
    let redis = RedisServer::start();
    let node = Node::start(&redis.url(), &[("PINBOARD_LEASE_TTL_MS", "3000")]);
    let _example = Example::start(&node, &[]);
    let posts = |n: usize| -> Vec<u16> {
        let threads: Vec<_> = (0..n)
            .map(|i| {
                let addr = node.addr;
                std::thread::spawn(move || {
                    let raw = format!(
                        "POST /docs/idle-{i}/echo HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\nhello"
                    );
                    Client::connect(addr).request(raw.as_bytes()).status
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    };
    // Past the cold start, with several pooled connections to the worker.
    assert!(eventually(Duration::from_secs(10), || posts(6) == [200; 6]));
    std::thread::sleep(Duration::from_secs(6));
    assert_eq!(posts(6), [200; 6], "{}", node.log());
}

#[test]
fn a_durable_dir_serves_wake_and_tickers() {
    let redis = RedisServer::start();
    let node = Node::start(&redis.url(), &[("PINBOARD_LEASE_TTL_MS", "3000")]);
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("tickers");
    let durable = ["--durable-dir", store.to_str().unwrap(), "--tick-secs", "2"];
    let mut example = Example::start(&node, &durable);
    assert!(store.is_dir(), "the store's directory is created");
    assert!(eventually(Duration::from_secs(10), || {
        get(node.addr, "/threads/t/ticks", None).status == 200
    }));
    let ticks = get(node.addr, "/threads/t/ticks", None).json();
    assert_eq!(ticks, json!({ "ticks": null, "nextWakeMs": null }));
    // A client's `_wake` through the node is a forward, not the sweeper's wake: the library
    // refuses its token (contract §11) before the example sees it.
    let wake = post_json(node.addr, "/threads/t/_wake", None, "");
    assert_eq!(
        (wake.status, wake.json()),
        (403, json!({ "detail": "invalid attestation" }))
    );
    // The counters are served as ever.
    assert_eq!(get(node.addr, "/threads/t/count", None).json()["count"], 1);
    assert_eq!(example.terminate(), Some(0));
}

/// The ticks `example` logged for `/threads/{id}`, in order.
fn ticks(example: &Example, id: &str) -> Vec<u64> {
    ticks_logged(&example.log(), id)
}

/// Contract §7 end to end, with nothing faked: two example workers share one durable
/// directory; the worker holding a ticker is SIGKILLed; with nobody requesting the instance,
/// the node's sweep places it on the other worker and wakes it there, and it goes on ticking
/// from the count the dead worker saved.
#[test]
fn a_ticker_outlives_its_killed_worker_with_nobody_asking() {
    let redis = RedisServer::start();
    let node = Node::start(
        &redis.url(),
        &[
            ("PINBOARD_LEASE_TTL_MS", "3000"),
            ("PINBOARD_SWEEP_INTERVAL_MS", "200"),
        ],
    );
    end_cold_start(&redis);
    let dir = tempfile::tempdir().unwrap();
    let store_dir = dir.path().join("tickers");
    let durable = [
        "--durable-dir",
        store_dir.to_str().unwrap(),
        "--tick-secs",
        "1",
    ];
    let mut workers = [
        Example::start_as(&node, "example-1", &durable),
        Example::start_as(&node, "example-2", &durable),
    ];
    // What the workers saved, read as a third party would: the store's own file.
    let store = FileStore::open(&store_dir).unwrap();
    let saved = || {
        let state = store.load("/threads", "tick").unwrap()?;
        serde_json::from_slice::<Value>(&state).unwrap()["ticks"].as_u64()
    };
    let placements = keys().placements(bucket_of("tick", SHARDS), "default", "/threads");
    let owner_session = || {
        let row = redis.cli(&["HGET", &placements.to_string(), "tick"]);
        serde_json::from_str::<Value>(&row).ok()?["sessionId"]
            .as_str()
            .map(str::to_owned)
    };
    let logs = |workers: &[Example]| {
        let logs: Vec<String> = workers.iter().map(|w| w.log().join("\n")).collect();
        format!("{}\n--- workers ---\n{}", node.log(), logs.join("\n---\n"))
    };

    let started = post_json(node.addr, "/threads/tick/ticker", None, "");
    assert_eq!(started.status, 200, "{}", logs(&workers));
    assert_eq!(started.json()["ticks"], 0);
    let owner = workers
        .iter()
        .position(|w| Some(&w.session) == owner_session().as_ref())
        .unwrap_or_else(|| panic!("{:?} is neither worker's", owner_session()));
    let heir = 1 - owner;
    // Woken by the sweep on its owner, a tick a second.
    assert!(
        eventually(Duration::from_secs(30), || saved() >= Some(2)),
        "{}",
        logs(&workers)
    );
    assert!(!ticks(&workers[owner], "tick").is_empty());
    assert!(ticks(&workers[heir], "tick").is_empty());

    workers[owner].kill();
    let at_kill = saved().expect("a saved ticker");
    // From here on nobody asks the node for the instance: only its sweep can wake it.
    let continued = eventually(Duration::from_secs(60), || {
        saved().is_some_and(|ticks| ticks >= at_kill + 2)
            && ticks(&workers[heir], "tick").len() >= 2
    });
    assert!(continued, "at the kill: {at_kill}\n{}", logs(&workers));
    // On the heir, from the dead worker's last saved count, one tick per wake.
    let on_heir = ticks(&workers[heir], "tick");
    let expected: Vec<u64> = (at_kill + 1..).take(on_heir.len()).collect();
    assert_eq!(on_heir, expected, "{}", logs(&workers));
    assert_eq!(owner_session().as_ref(), Some(&workers[heir].session));

    // A request now reaches the heir, which reads the count from the same store.
    let before = saved().unwrap();
    let read = get(node.addr, "/threads/tick/ticks", None);
    assert_eq!(read.status, 200, "{}", logs(&workers));
    let ticks = read.json()["ticks"].as_u64().unwrap();
    assert!(ticks >= before, "{ticks} < {before}");
    assert!(read.json()["nextWakeMs"].is_u64());

    // Stopped, it is forgotten: no state, no wake.
    let stopped = Client::connect(node.addr)
        .request(b"DELETE /threads/tick/ticker HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\n\r\n");
    assert_eq!(stopped.json(), json!({ "stopped": true }));
    assert_eq!(saved(), None);
    assert_eq!(store.scheduled("/threads", "tick").unwrap(), None);
    assert_eq!(workers[heir].terminate(), Some(0));
}

/// Sends `signal` (`STOP`, `CONT`) to the worker's process.
fn signal(example: &Example, signal: &str) {
    let pid = example.child.id().to_string();
    let sent = Command::new("kill")
        .args([&format!("-{signal}"), &pid])
        .status();
    assert!(sent.unwrap().success(), "kill -{signal} {pid}");
}

/// The lease of [`short_lease_node`]: what a paused worker is stopped past.
const SHORT_LEASE: Duration = Duration::from_millis(2000);

/// A redis-server and a node on it with a [`SHORT_LEASE`], its cold start ended.
fn short_lease_node() -> (RedisServer, Node) {
    let redis = RedisServer::start();
    let lease = SHORT_LEASE.as_millis().to_string();
    let node = Node::start(&redis.url(), &[("PINBOARD_LEASE_TTL_MS", &lease)]);
    end_cold_start(&redis);
    (redis, node)
}

#[test]
fn a_worker_paused_past_its_lease_serves_nothing_when_it_wakes() {
    let (_redis, node) = short_lease_node();
    let workers = [
        Example::start_as(&node, "example-1", &[]),
        Example::start_as(&node, "example-2", &[]),
    ];
    let session_of = |reply: &support::http::Reply| reply.json()["session"].clone();
    let first = get(node.addr, "/threads/p/count", None);
    assert_eq!(first.status, 200, "{}", node.log());
    let owner = workers
        .iter()
        .position(|w| json!(w.session) == session_of(&first))
        .expect("one of the two serves it");
    let heir = json!(workers[1 - owner].session);

    // The owner freezes (a GC pause, a stopped VM). A request sent now is forwarded to it
    // (its lease still runs) and waits in its socket.
    signal(&workers[owner], "STOP");
    let addr = node.addr;
    let waiting = std::thread::spawn(move || get(addr, "/threads/p/count", None));
    std::thread::sleep(SHORT_LEASE + Duration::from_millis(500));
    // Past the lease the registry places the instance on the other worker.
    assert!(
        eventually(Duration::from_secs(10), || {
            let moved = get(node.addr, "/threads/p/count", None);
            moved.status == 200 && session_of(&moved) == heir
        }),
        "{}",
        node.log()
    );

    // The owner wakes up believing it still owns "p", to the forward that waited: it must
    // refuse it (the node then re-places the request on the new owner), never serve it.
    signal(&workers[owner], "CONT");
    let late = waiting.join().unwrap();
    assert!(
        late.status == 503 || (late.status == 200 && session_of(&late) == heir),
        "the paused worker answered {} {}",
        late.status,
        late.text()
    );
}

/// `PUT path` with `body` through the node at `addr`.
fn put(addr: SocketAddr, path: &str, body: &str) -> support::http::Reply {
    let raw = format!(
        "PUT {path} HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    Client::connect(addr).request(raw.as_bytes())
}

/// Issue 28's paused former owner, with nothing faked: two example workers share one durable
/// directory. The owner of `/threads/n` is SIGSTOPped while it holds a note it is about to
/// save, past its lease; the node places the instance on the other worker at a higher epoch,
/// which saves its own note. SIGCONTed, the former owner saves its late note with its old
/// epoch: the store refuses it, and the new owner's note stands.
#[test]
fn a_paused_former_owners_late_save_is_refused_and_the_new_owners_note_stands() {
    let (redis, node) = short_lease_node();
    let dir = tempfile::tempdir().unwrap();
    let store_dir = dir.path().join("notes");
    let durable = ["--durable-dir", store_dir.to_str().unwrap()];
    let former = Example::start_as(&node, "example-1", &durable);
    let logs = |workers: &[&Example]| {
        let logs: Vec<String> = workers.iter().map(|w| w.log().join("\n")).collect();
        format!("{}\n--- workers ---\n{}", node.log(), logs.join("\n---\n"))
    };
    let logged = |worker: &Example, what: &str| {
        let needle = format!("{what} ns=/threads id=n ");
        worker.log().iter().any(|line| line.contains(&needle))
    };

    // The only worker yet takes the note, and waits 1.5 s before saving it: it is paused then.
    let addr = node.addr;
    let late = std::thread::spawn(move || put(addr, "/threads/n/note?after_ms=1500", "late"));
    assert!(
        eventually(Duration::from_secs(10), || logged(&former, "note saving")),
        "{}",
        logs(&[&former])
    );
    signal(&former, "STOP");
    let placements = keys().placements(bucket_of("n", SHARDS), "default", "/threads");
    let row = redis.cli(&["HGET", &placements.to_string(), "n"]);
    let former_epoch = serde_json::from_str::<Value>(&row).unwrap()["epoch"]
        .as_str()
        .unwrap()
        .to_owned();

    // Past its lease, the instance is placed on the other worker, at a higher epoch, which
    // saves its own note.
    let heir = Example::start_as(&node, "example-2", &durable);
    std::thread::sleep(SHORT_LEASE + Duration::from_millis(500));
    let mut saved = None;
    assert!(
        eventually(Duration::from_secs(10), || {
            let reply = put(node.addr, "/threads/n/note", "heir");
            let done = reply.status == 200;
            saved = Some(reply);
            done
        }),
        "{saved:?}\n{}",
        logs(&[&heir])
    );
    let saved = saved.unwrap().json();
    let heir_epoch = saved["epoch"].as_str().unwrap().to_owned();
    assert_eq!(saved["saved"], true);
    assert!(logged(&heir, "note saved"), "{}", logs(&[&heir]));
    let (at_former, at_heir) = (
        Fence::parse(&former_epoch).unwrap(),
        Fence::parse(&heir_epoch).unwrap(),
    );
    assert!(at_heir > at_former, "{heir_epoch} after {former_epoch}");

    // The former owner resumes and saves its late note at its old epoch: refused.
    signal(&former, "CONT");
    let refusal = format!("stale epoch: stored {heir_epoch}, offered {former_epoch}");
    assert!(
        eventually(Duration::from_secs(10), || {
            logged(&former, "note refused") && former.log().iter().any(|l| l.contains(&refusal))
        }),
        "{}",
        logs(&[&former, &heir])
    );
    assert!(!logged(&former, "note saved"), "{}", logs(&[&former]));
    // Its answer is withheld (its lease lapsed): the node answers the late request a 503.
    let late = late.join().unwrap();
    assert_ne!(late.status, 200, "{late:?}");

    // The heir's note stands, in the store and through the node.
    let store = FileStore::open(&store_dir).unwrap();
    assert_eq!(
        store.load("/threads", "n").unwrap().as_deref(),
        Some(&b"heir"[..])
    );
    let header = format!("pinned-durable/1 %2Fthreads.n - 4 {heir_epoch}\nheir");
    assert_eq!(
        std::fs::read(store.path_of("/threads", "n")).unwrap(),
        header.as_bytes()
    );
    let read = get(node.addr, "/threads/n/note", None);
    assert_eq!(read.json(), json!({ "note": "heir" }), "{}", logs(&[&heir]));
}

#[test]
fn a_token_file_that_expires_unreplaced_exits_4_with_the_reason() {
    let redis = RedisServer::start();
    let node = Node::start(&redis.url(), &[("PINBOARD_LEASE_TTL_MS", "2000")]);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("token");
    let valid = Duration::from_secs(6);
    replace_token(&file, &expiring_worker_token("acct-1", valid));
    let path = file.to_str().unwrap();
    let mut example = Example::launch(&node, "example-1", &[], &[("PINNED_TOKEN_FILE", path)]);
    assert_eq!(
        workers::session_status(&node, "acct-1", &example.session),
        200
    );

    assert_eq!(example.exit_code(valid + Duration::from_secs(30)), Some(4));
    let log = example.log().join("\n");
    assert!(
        log.contains("the registry refused this worker's credential for longer than its lease")
            && log.contains("status=401"),
        "{log}"
    );
}

#[test]
fn token_and_token_file_together_are_a_configuration_error() {
    let redis = RedisServer::start();
    let node = Node::start(&redis.url(), &[]);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("token");
    replace_token(&file, &token("acct-1", &["pinboard:worker"], &["*"]));
    let output = Command::new(env!("CARGO_BIN_EXE_pinned-example"))
        .args(["--registry", &node.url(), "--namespaces", "/threads"])
        .args(["--token", "t", "--token-file", file.to_str().unwrap()])
        .env_remove("PINNED_TOKEN")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--token-file"), "{stderr}");
    // A file that holds no token fails the start, naming the setting.
    std::fs::write(&file, "").unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_pinned-example"))
        .args(["--registry", &node.url(), "--namespaces", "/threads"])
        .args(["--token-file", file.to_str().unwrap()])
        .env_remove("PINNED_TOKEN")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("token_file"), "{stderr}");
}
