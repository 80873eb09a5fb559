//! The example worker binary against a real `pinboard serve` and redis-server: it prints its
//! address and session, counts and echoes through the node, and on SIGTERM releases and
//! deregisters before exiting 0.
//!
//! Needs the `pinboard` binary next to this test (see `support/node.rs`).

mod support;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

use serde_json::json;
use support::eventually;
use support::http::{Client, get, post_json};
use support::node::{Node, token};
use support::redis::RedisServer;

struct Example {
    child: Child,
    lines: Receiver<String>,
    addr: SocketAddr,
    session: String,
}

impl Example {
    fn start(node: &Node, extra: &[&str]) -> Example {
        let mut child = Command::new(env!("CARGO_BIN_EXE_pinned-example"))
            .args(["--registry", &node.url(), "--namespaces", "/threads,/docs"])
            .args(["--client-id", "example-1"])
            .args(extra)
            .env(
                "PINNED_TOKEN",
                token("acct-1", &["pinboard:worker"], &["*"]),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn pinned-example");
        let (send, lines) = channel();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        std::thread::spawn(move || {
            for line in stdout.lines().map_while(Result::ok) {
                let _ = send.send(line);
            }
        });
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
            addr,
            session,
        }
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
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code();
            }
            assert!(Instant::now() < deadline, "pinned-example did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Example {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn heartbeat_status(node: &Node, session: &str) -> u16 {
    let body = json!({
        "sessionId": session, "headroom": 1, "draining": false,
        "challenge": "c", "challengeValue": "v",
    });
    let token = token("acct-1", &["pinboard:worker"], &["*"]);
    post_json(
        node.addr,
        "/registry/heartbeat",
        Some(&token),
        &body.to_string(),
    )
    .status
}

#[test]
fn registers_then_deregisters_on_sigterm() {
    let redis = RedisServer::start();
    let node = Node::start(&redis.url(), &[("PINBOARD_LEASE_TTL_MS", "3000")]);
    let mut example = Example::start(&node, &["--driver", "epoll"]);
    assert_eq!(heartbeat_status(&node, &example.session), 200);
    // Unattested requests are refused by the library before the example sees them.
    assert_eq!(get(example.addr, "/threads/a/count", None).status, 403);

    assert_eq!(example.terminate(), Some(0));
    assert_eq!(
        heartbeat_status(&node, &example.session),
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
    assert_eq!(heartbeat_status(&node, &example.session), 409);
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
