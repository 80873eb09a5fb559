//! Helpers for pinned's integration tests: the node's own harnesses (`/tests/support`: the
//! redis-server, the raw HTTP client, the `pinboard` binary) plus what only worker tests need.
//! Every test binary uses part of this, so unused items are expected here.
#![allow(dead_code)]

#[path = "../../../tests/support/certs.rs"]
pub mod certs;
#[path = "../../../tests/support/http.rs"]
pub mod http;
/// The node's Redis layout as the worker tests write it; shared with `pinned-tower`'s tests.
pub mod layout;
#[path = "../../../tests/support/node.rs"]
pub mod node;
#[path = "../../../tests/support/process.rs"]
pub mod process;
#[path = "../../../tests/support/redis.rs"]
pub mod redis;
/// Worker credentials that expire or rotate; shared with `pinned-tower`'s tests.
pub mod tokens;
/// A heartbeat for a worker's session, a worker process's exit; shared with `pinned-tower`.
pub mod workers;

use std::future::Future;
use std::time::Duration;

pub use node::eventually;
use pinned::{App, Config, Worker};

/// A worker of `account` (with the `pinboard:worker` scope, every namespace) serving
/// `namespaces` for `app`, registered with `node`: returns once it holds a session.
pub fn registered<A: App>(
    node: &node::Node,
    account: &str,
    namespaces: &[&str],
    app: A,
    configure: impl FnOnce(&mut Config),
) -> Worker {
    let token = node::token(account, &["pinboard:worker"], &["*"]);
    let mut config = Config::new(&node.url(), &token, "worker-1", namespaces);
    config.call_timeout = Duration::from_secs(5);
    configure(&mut config);
    let worker = Worker::start(config, app).unwrap();
    let handle = worker.handle();
    assert!(
        eventually(Duration::from_secs(15), || handle.session_id().is_some()),
        "no registration:\n{}",
        node.log()
    );
    worker
}

/// Runs `future` on a throwaway monoio event loop (for [`pinned::Handle`]'s async calls from a
/// test thread).
pub fn block_on<F: Future>(future: F) -> F::Output {
    monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
        .enable_timer()
        .build()
        .expect("an epoll event loop")
        .block_on(future)
}

/// Seconds since the Unix epoch.
pub fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// An attestation as Pinboard signs it, minted with an independent JWT implementation.
/// The attestation Pinboard signs onto a forward of `path` (`/{ns}/{id}...`) at `epoch`.
pub fn attestation(secret: &str, session: &str, path: &str, epoch: &str) -> String {
    attestation_for("forward", secret, session, path, epoch)
}

/// As [`attestation`], for another `purpose` (`"wake"` for the durability sweep's `_wake`).
pub fn attestation_for(
    purpose: &str,
    secret: &str,
    session: &str,
    path: &str,
    epoch: &str,
) -> String {
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
    header.typ = Some("pinboard+jwt".into());
    let inst: String = path.split('/').take(3).collect::<Vec<_>>().join("/");
    let claims = serde_json::json!({
        "aud": session, "iat": now(), "exp": now() + 30,
        "purpose": purpose, "inst": inst, "epoch": epoch,
    });
    let key = jsonwebtoken::EncodingKey::from_secret(secret.as_bytes()).unwrap();
    jsonwebtoken::encode(&header, &claims, &key).unwrap()
}

/// One writer's epochs in a race of two fenced writers (`writer` 0 or 1): `writer + 1`,
/// `writer + 3`, … (`count` of them, none the other's), shuffled by a fixed seed: out of order,
/// as late writes are.
pub fn shuffled_epochs(writer: u64, count: u64) -> Vec<u64> {
    let mut epochs: Vec<u64> = (0..count).map(|n| 2 * n + writer + 1).collect();
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64 ^ writer;
    for i in (1..epochs.len()).rev() {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
        epochs.swap(i, (seed >> 33) as usize % (i + 1));
    }
    epochs
}
