//! A worker as the registry and a supervisor see it (shared by `pinned`'s and `pinned-tower`'s
//! integration tests): a heartbeat the test sends for a worker's session, and a worker
//! process's exit.

use std::net::SocketAddr;
use std::process::Child;
use std::time::{Duration, Instant};

use super::http::{Reply, post_json};

/// A heartbeat for `session` sent by the test itself with `token` to the node at `node`: what
/// the registry makes of the session (200 while it lives, 409 once it is gone).
pub fn heartbeat(node: SocketAddr, session: &str, token: &str) -> Reply {
    let body = serde_json::json!({
        "sessionId": session, "headroom": 1, "draining": false,
        "challenge": "c", "challengeValue": "v",
    });
    post_json(node, "/registry/heartbeat", Some(token), &body.to_string())
}

/// [`heartbeat`] for `session` with a worker credential of `account`: its status.
pub fn session_status(node: &super::node::Node, account: &str, session: &str) -> u16 {
    heartbeat(node.addr, session, &node.worker_token(account)).status
}

/// The exit code of `child`, once it exits within `limit` (the test fails otherwise, naming
/// `what` and showing `log`).
pub fn exit_code(
    child: &mut Child,
    limit: Duration,
    what: &str,
    log: impl Fn() -> String,
) -> Option<i32> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status.code();
        }
        assert!(Instant::now() < deadline, "{what} did not exit:\n{}", log());
        std::thread::sleep(Duration::from_millis(20));
    }
}
