//! The axum example (`examples/axum.rs`, built by `cargo test` beside the tests) against a real
//! `pinboard serve` and redis-server: it counts per instance through the node and on SIGTERM
//! releases, deregisters and exits 0; with a token file that expires unreplaced it exits 4,
//! saying why.
//!
//! Needs the `pinboard` binary (`cargo build -p pinboard`; see `tests/support/node.rs`).

mod support;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::json;
use support::http::get;
use support::layout::end_cold_start;
use support::node::{Node, token};
use support::process::Output;
use support::redis::RedisServer;
use support::tokens::{expiring_worker_token, replace_token};
use support::workers;

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
