//! The axum example (`examples/axum.rs`, built by `cargo test` beside the tests) against a real
//! `pinboard serve` and redis-server: it counts per instance through the node and on SIGTERM
//! releases, deregisters and exits 0; with a token file that expires unreplaced it exits 4,
//! saying why. Its WebSockets, through the node with a real client (tungstenite), are closed
//! 1012 `epoch … ended` when an operator winds their instance down, 1012 `moved` on a move's
//! wind-down, and 1001 by the node when it stops past its grace.
//!
//! Needs the `pinboard` binary (`cargo build -p pinboard`; see `tests/support/node.rs`).

mod support;

use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use support::http::{get, post_json};
use support::layout::end_cold_start;
use support::node::{Node, eventually, token};
use support::process::Output;
use support::redis::RedisServer;
use support::tokens::{expiring_worker_token, replace_token};
use support::workers;
use tungstenite::protocol::CloseFrame;
use tungstenite::protocol::frame::coding::CloseCode;
use tungstenite::{Message, WebSocket};

/// `target/debug/examples/axum`, beside the test executable's `deps/`.
fn example() -> PathBuf {
    let exe = std::env::current_exe().expect("the test executable's path");
    let debug = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/debug/deps");
    debug.join("examples").join("axum")
}

struct Example {
    child: Child,
    output: Output,
    session: String,
}

impl Example {
    /// Started against `node` with the credential `env` gives; returns once registered.
    fn start(node: &Node, env: &[(&str, &str)]) -> Example {
        let mut child = Command::new(example())
            .env("PINNED_REGISTRY", node.url())
            .env("PINNED_NAMESPACES", "/threads")
            .env("PINNED_LOG", "info")
            .env_remove("PINNED_TOKEN")
            .env_remove("PINNED_TOKEN_FILE")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn the axum example (built by `cargo test -p pinned-tower`)");
        let output = Output::capture(&mut child);
        let line = |prefix: &str| {
            let line = output
                .lines
                .recv_timeout(Duration::from_secs(15))
                .unwrap_or_else(|_| panic!("no {prefix:?} line:\n{}", output.log()));
            assert!(line.starts_with(prefix), "{line:?}");
            line
        };
        line("listening ");
        let session = line("registered session=")["registered session=".len()..].to_owned();
        Example {
            child,
            output,
            session,
        }
    }

    /// The exit code, once it exits within `limit` (the test fails otherwise).
    fn exit_code(&mut self, limit: Duration) -> Option<i32> {
        let output = &self.output;
        workers::exit_code(&mut self.child, limit, "the axum example", || output.log())
    }
}

impl Drop for Example {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn counts_through_the_node_and_deregisters_on_sigterm() {
    let redis = RedisServer::start();
    let node = Node::start(&redis.url(), &[("PINBOARD_LEASE_TTL_MS", "3000")]);
    end_cold_start(&redis);
    let worker_token = token("acct-1", &["pinboard:worker"], &["*"]);
    let mut example = Example::start(&node, &[("PINNED_TOKEN", &worker_token)]);
    for expected in [1, 2] {
        let reply = get(node.addr, "/threads/a/count", None);
        assert_eq!(reply.status, 200, "{}\n{}", reply.text(), node.log());
        let body = reply.json();
        assert_eq!(
            (&body["id"], &body["count"]),
            (&json!("a"), &json!(expected)),
            "{body}"
        );
    }
    let pid = example.child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    assert_eq!(example.exit_code(Duration::from_secs(20)), Some(0));
    assert_eq!(
        workers::session_status(&node, "acct-1", &example.session),
        409,
        "{}",
        node.log()
    );
}

#[test]
fn a_token_file_that_expires_unreplaced_exits_4_with_the_reason() {
    let redis = RedisServer::start();
    let node = Node::start(&redis.url(), &[("PINBOARD_LEASE_TTL_MS", "2000")]);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("token");
    let valid = Duration::from_secs(6);
    replace_token(&file, &expiring_worker_token("acct-1", valid));
    let mut example = Example::start(&node, &[("PINNED_TOKEN_FILE", file.to_str().unwrap())]);
    assert_eq!(example.exit_code(valid + Duration::from_secs(30)), Some(4));
    let log = example.output.log();
    assert!(
        log.contains("the registry refused this worker's credential for longer than its lease")
            && log.contains("status=401"),
        "{log}"
    );
}

/// A WebSocket client through `node` to the example's `{path}/ws`, and the greeting it got.
fn websocket(node: &Node, path: &str) -> (WebSocket<TcpStream>, Value) {
    let stream = TcpStream::connect(node.addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(15)))
        .unwrap();
    let url = format!("ws://{}{path}/ws", node.addr);
    let (mut client, answer) = tungstenite::client(url.as_str(), stream)
        .unwrap_or_else(|e| panic!("the handshake through the node: {e}\n{}", node.log()));
    assert_eq!(answer.status(), 101);
    let greeting = match client.read() {
        Ok(Message::Text(text)) => serde_json::from_str(text.as_str()).unwrap(),
        other => panic!("no greeting: {other:?}"),
    };
    client.send(Message::text("hi")).unwrap();
    assert_eq!(client.read().unwrap(), Message::text("echo:hi"));
    (client, greeting)
}

fn closed(code: CloseCode, reason: &str) -> Message {
    Message::Close(Some(CloseFrame {
        code,
        reason: reason.into(),
    }))
}

#[test]
fn websockets_are_closed_1012_when_their_instance_is_wound_down_or_moved() {
    let redis = RedisServer::start();
    let node = Node::start(&redis.url(), &[("PINBOARD_LEASE_TTL_MS", "2000")]);
    end_cold_start(&redis);
    let worker_token = token("acct-1", &["pinboard:worker"], &["*"]);
    let example = Example::start(&node, &[("PINNED_TOKEN", &worker_token)]);

    // An operator's wind-down: closed once its deadline (a lease, at least) is reached.
    let (mut wound, greeting) = websocket(&node, "/threads/a");
    let epoch = greeting["epoch"].as_str().unwrap().to_owned();
    let operator = token("ops", &["pinboard:operator"], &["*"]);
    let body = json!({ "namespace": "/threads", "id": "a", "deadline": 1 }).to_string();
    let queued = post_json(node.addr, "/registry/wind_down", Some(&operator), &body);
    assert_eq!(queued.status, 200, "{}", queued.text());
    let reason = format!("epoch {epoch} ended");
    assert_eq!(
        wound.read().unwrap(),
        closed(CloseCode::Restart, &reason),
        "{}",
        example.output.log()
    );
    assert!(matches!(
        wound.read(),
        Err(tungstenite::Error::ConnectionClosed)
    ));
    assert!(eventually(Duration::from_secs(5), || example
        .output
        .log()
        .contains("websocket ended")));

    // A move's wind-down, queued to the session as the node queues one (`moved: true`).
    let (mut moved, _) = websocket(&node, "/threads/b");
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let message = json!({
        "type": "wind_down", "ns": "/threads", "id": "b", "deadline": now_ms + 500, "moved": true,
    });
    let queue = format!("pinboard:{{r}}:control:{}", example.session);
    redis.cli(&["HSET", &queue, "900001", &message.to_string()]);
    assert_eq!(
        moved.read().unwrap(),
        closed(CloseCode::Restart, "moved"),
        "{}",
        example.output.log()
    );
}

#[test]
fn a_node_stopping_past_its_grace_tells_the_examples_websockets_going_away() {
    let redis = RedisServer::start();
    let mut node = Node::start(
        &redis.url(),
        &[
            ("PINBOARD_LEASE_TTL_MS", "3000"),
            ("PINBOARD_HTTP__SHUTDOWN_GRACE_MS", "300"),
        ],
    );
    end_cold_start(&redis);
    let worker_token = token("acct-1", &["pinboard:worker"], &["*"]);
    let example = Example::start(&node, &[("PINNED_TOKEN", &worker_token)]);
    let (mut client, _) = websocket(&node, "/threads/c");
    node.terminate();
    assert_eq!(
        client.read().unwrap(),
        closed(CloseCode::Away, ""),
        "{}",
        node.log()
    );
    // The worker sees its side of the tunnel end.
    assert!(
        eventually(Duration::from_secs(5), || example
            .output
            .log()
            .contains("websocket ended")),
        "{}",
        example.output.log()
    );
    assert!(node.wait(Duration::from_secs(10)).success());
}
