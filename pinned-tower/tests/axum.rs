//! An axum service behind the layer, registered with a real `pinboard serve` on a real
//! redis-server: requests through the node reach the handler with their instance; a forged or
//! absent attestation, a token replayed on another instance and a stale epoch are refused
//! before the handler; the service's own paths pass through; a graceful shutdown deregisters;
//! a rotated token file keeps the worker registered and an expired one stops it.
//!
//! Needs the `pinboard` binary (`cargo build -p pinboard`; see `tests/support/node.rs`).

mod support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::routing::get;
use axum::{Extension, Json, Router};
use pinboard_protocol::worker::mint::{SECRET, mint_forward};
use pinned_tower::{Config, Event, Events, Instance, Worker};
use serde_json::{Value, json};
use support::http::{Client, Reply, get as http_get};
use support::layout::end_cold_start;
use support::node::{Node, eventually, token};
use support::redis::RedisServer;
use support::tokens::{expiring_worker_token, replace_token};
use support::workers;

const LEASE: Duration = Duration::from_millis(2000);
const ACCOUNT: &str = "acct-1";

/// The handler: what the layer told it about the instance.
async fn describe(Extension(instance): Extension<Instance>) -> Json<Value> {
    Json(json!({
        "ns": instance.ns, "id": instance.id, "rest": instance.rest,
        "epoch": instance.epoch.as_str(), "activated": instance.activated,
    }))
}

/// A node (its lease [`LEASE`]) and an axum service on a tokio runtime of its own, made a
/// worker of the node by the layer.
struct Fleet {
    _redis: RedisServer,
    node: Node,
    runtime: tokio::runtime::Runtime,
    addr: SocketAddr,
    worker: Option<Worker>,
    events: Events,
}

impl Fleet {
    fn start(configure: impl FnOnce(&mut Config)) -> Fleet {
        let redis = RedisServer::start();
        let lease = LEASE.as_millis().to_string();
        let node = Node::start(&redis.url(), &[("PINBOARD_LEASE_TTL_MS", &lease)]);
        end_cold_start(&redis);
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let worker_token = token(ACCOUNT, &["pinboard:worker"], &["*"]);
        let mut config = Config::new(
            &node.url(),
            &worker_token,
            "tower-1",
            &["/threads", "/docs"],
            &format!("http://{addr}"),
        );
        config.call_timeout = Duration::from_secs(5);
        configure(&mut config);
        let _entered = runtime.enter();
        let (worker, events) = Worker::start(config).unwrap();
        let app = Router::new()
            .route("/healthz", get(|| async { "ok\n" }))
            .route("/{ns}/{id}", get(describe))
            .route("/{ns}/{id}/{*rest}", get(describe))
            .layer(worker.layer());
        runtime.spawn(async move { axum::serve(listener, app).await });
        let fleet = Fleet {
            _redis: redis,
            node,
            runtime,
            addr,
            worker: Some(worker),
            events,
        };
        assert!(
            eventually(Duration::from_secs(15), || fleet
                .worker()
                .session_id()
                .is_some()),
            "no registration:\n{}",
            fleet.node.log()
        );
        fleet
    }

    fn worker(&self) -> &Worker {
        self.worker.as_ref().unwrap()
    }

    fn session(&self) -> String {
        self.worker().session_id().unwrap()
    }

    /// A request straight to the service, with `headers`.
    fn direct(&self, path: &str, headers: &[(&str, &str)]) -> Reply {
        let mut head = format!("GET {path} HTTP/1.1\r\nHost: w\r\n");
        for (name, value) in headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        Client::connect(self.addr).request(format!("{head}\r\n").as_bytes())
    }

    /// A forward of `path` at `epoch` as Pinboard sends it, attested for `inst` with `secret`.
    fn attested(&self, path: &str, inst: &str, epoch: &str, secret: &str) -> Reply {
        let token = mint_forward(secret, &self.session(), inst, epoch);
        self.direct(
            path,
            &[("Pinboard-Attestation", &token), ("Pinboard-Epoch", epoch)],
        )
    }

    /// A heartbeat for `session` sent by the test itself with `token`.
    fn heartbeat(&self, session: &str, token: &str) -> Reply {
        workers::heartbeat(self.node.addr, session, token)
    }

    /// The events received so far.
    fn events(&mut self) -> Vec<Event> {
        std::iter::from_fn(|| self.events.try_recv().ok()).collect()
    }

    fn shutdown(&mut self) {
        let worker = self.worker.take().unwrap();
        self.runtime.block_on(worker.shutdown());
    }
}

#[test]
fn requests_through_the_node_reach_the_handler_with_their_instance() {
    let mut fleet = Fleet::start(|_| {});
    let through = http_get(fleet.node.addr, "/threads/a/x/y?q=1", None);
    assert_eq!(
        through.status,
        200,
        "{}\n{}",
        through.text(),
        fleet.node.log()
    );
    let body = through.json();
    assert_eq!(
        (&body["ns"], &body["id"], &body["rest"], &body["activated"]),
        (
            &json!("/threads"),
            &json!("a"),
            &json!("/x/y"),
            &json!(true)
        ),
        "{body}"
    );
    let again = http_get(fleet.node.addr, "/threads/a", None).json();
    assert_eq!(again["activated"], json!(false), "{again}");
    assert_eq!(again["epoch"], body["epoch"]);
    // The service's own path needs no attestation.
    assert_eq!(fleet.direct("/healthz", &[]).text(), "ok\n");
    let events = fleet.events();
    assert!(
        matches!(
            events.first(),
            Some(Event::Registered {
                reregistered: false,
                ..
            })
        ),
        "{events:?}"
    );

    // A graceful shutdown releases "a" and deregisters: the session is gone.
    let session = fleet.session();
    fleet.shutdown();
    let worker_token = token(ACCOUNT, &["pinboard:worker"], &["*"]);
    assert_eq!(fleet.heartbeat(&session, &worker_token).status, 409);
}

#[test]
fn forged_absent_and_replayed_attestations_are_refused() {
    let fleet = Fleet::start(|_| {});
    let secret = fleet.worker().secret().to_owned();
    let invalid = |reply: Reply| {
        assert_eq!(reply.status, 403, "{}", reply.text());
        assert_eq!(reply.json(), json!({ "detail": "invalid attestation" }));
    };
    invalid(fleet.direct("/threads/a", &[("Pinboard-Epoch", "1")]));
    // Signed with another secret than this worker's.
    invalid(fleet.attested("/threads/a", "/threads/a", "1", SECRET));
    // This worker's token, for another instance.
    invalid(fleet.attested("/threads/a", "/threads/b", "1", &secret));
    let garbage = [("Pinboard-Attestation", "a.b.c"), ("Pinboard-Epoch", "1")];
    invalid(fleet.direct("/threads/a", &garbage));
    // The control case: the same request, rightly attested, gets through.
    assert_eq!(
        fleet
            .attested("/threads/a", "/threads/a", "1", &secret)
            .status,
        200
    );
    // A path that splits when decoded never reaches a router that decodes: the list both
    // worker libraries are held to (pinned/tests/data).
    let shared: Vec<String> = serde_json::from_str(include_str!(
        "../../pinned/tests/data/paths-that-split.json"
    ))
    .unwrap();
    for rest in &shared {
        let split = fleet.attested(&format!("/threads/b{rest}"), "/threads/b", "1", &secret);
        assert_eq!(
            (split.status, split.text().as_str()),
            (400, "invalid instance path"),
            "{rest:?}"
        );
    }
    // Encoded bytes that decode to no separator are the service's.
    let plain = fleet.attested("/threads/b/x%20y/%41/a.b", "/threads/b", "1", &secret);
    assert_eq!(plain.status, 200, "{}", plain.text());
}

#[test]
fn a_stale_epoch_is_fenced() {
    let fleet = Fleet::start(|_| {});
    let secret = fleet.worker().secret().to_owned();
    let at = |epoch: &str| fleet.attested("/docs/d", "/docs/d", epoch, &secret);
    let first = at("5");
    assert_eq!(first.status, 200, "{}", first.text());
    assert_eq!(first.json()["activated"], json!(true));
    let stale = at("4");
    assert_eq!(
        (stale.status, stale.text().as_str()),
        (409, "stale placement epoch")
    );
    let malformed = fleet.direct(
        "/docs/d",
        &[
            (
                "Pinboard-Attestation",
                &mint_forward(&secret, &fleet.session(), "/docs/d", "x"),
            ),
            ("Pinboard-Epoch", "x"),
        ],
    );
    assert_eq!(malformed.status, 400);
    // Placed here again at a higher epoch: a new activation.
    assert_eq!(at("6").json()["activated"], json!(true));
}

#[test]
fn a_rotated_token_file_keeps_it_registered_and_an_expired_one_stops_it() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("token");
    // Long enough for the node and the worker to start on a loaded machine.
    let valid = Duration::from_secs(8);
    let expires = Instant::now() + valid;
    let short = expiring_worker_token(ACCOUNT, valid);
    replace_token(&file, &short);
    let mut fleet = Fleet::start(|c| {
        c.token.clear();
        c.token_file = Some(file.clone());
    });
    let session = fleet.session();
    replace_token(&file, &token(ACCOUNT, &["pinboard:worker"], &["*"]));
    std::thread::sleep(expires.saturating_duration_since(Instant::now()) + 3 * LEASE);
    // The first token is refused by now; the worker heartbeats on with the one it read again.
    assert_eq!(fleet.heartbeat(&session, &short).status, 401);
    let renewed = eventually(3 * LEASE, || fleet.worker().status().lease_healthy);
    let status = fleet.worker().status();
    assert!(renewed && !status.credential_refused, "{status:?}");
    assert_eq!(status.session_id.as_deref(), Some(session.as_str()));

    // Now a token that expires and is never replaced: the worker stops and says so.
    let valid = Duration::from_secs(3);
    replace_token(&file, &expiring_worker_token(ACCOUNT, valid));
    let mut seen = Vec::new();
    let stopped = eventually(valid + 10 * LEASE, || {
        seen.extend(fleet.events());
        seen.iter()
            .any(|e| matches!(e, Event::CredentialRefused { status: 401, .. }))
    });
    assert!(stopped, "{seen:?}\n{}", fleet.node.log());
    let status = fleet.worker().status();
    assert!(
        status.credential_refused && !status.lease_healthy,
        "{status:?}"
    );
    let refused = fleet.attested("/threads/n", "/threads/n", "1", fleet.worker().secret());
    assert_eq!(refused.status, 503);
}
