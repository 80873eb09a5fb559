//! The worker against a real `pinboard serve` and a real redis-server: registration,
//! heartbeats, re-registration (reclaiming or evicting held instances), release, tag,
//! supersession, wind-down messages, the graceful shutdown, and a credential that rotates
//! through a token file or expires.
//!
//! Placements are written straight into Redis in the contract's layout (§5) and requests are
//! sent to the worker attested as Pinboard would forward them, so these tests need only the
//! registry's worker routes, not the data plane. The ones that need more say so.
//!
//! Needs the `pinboard` binary next to this test (see `support/node.rs`).

mod support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pinned::{
    App, CallError, Config, Error, Event, Handle, Instance, Request, Response, Takeover, Worker,
};
use serde_json::{Value, json};
use support::http::{Client, Reply, get, post_json};
use support::node::{Node, token};
use support::redis::RedisServer;
use support::tokens::{expiring_worker_token, replace_token};
use support::{attestation, block_on, eventually, registered, workers};

const LEASE_MS: u64 = 2000;
const LEASE: Duration = Duration::from_millis(LEASE_MS);
const ACCOUNT: &str = "acct-1";

/// Answers with what it was told about the instance; records every event.
#[derive(Clone, Default)]
struct Recorder {
    events: Arc<Mutex<Vec<Event>>>,
}

impl Recorder {
    fn events(&self) -> Vec<Event> {
        self.events.lock().unwrap().clone()
    }
}

impl App for Recorder {
    async fn handle(
        &self,
        worker: &Handle,
        instance: &Instance,
        _: &mut Request<'_>,
    ) -> Result<Response, Error> {
        Ok(Response::json_value(
            http::StatusCode::OK,
            &json!({
                "ns": instance.ns, "id": instance.id, "rest": instance.rest,
                "epoch": instance.epoch.as_str(), "activated": instance.activated,
                "session": worker.session_id(),
            }),
        ))
    }

    async fn on_event(&self, _: &Handle, event: Event) {
        self.events.lock().unwrap().push(event);
    }
}

struct Fleet {
    redis: RedisServer,
    node: Node,
}

impl Fleet {
    fn start(env: &[(&str, &str)]) -> Fleet {
        let redis = RedisServer::start();
        let lease = LEASE_MS.to_string();
        let mut env = env.to_vec();
        env.push(("PINBOARD_LEASE_TTL_MS", &lease));
        let node = Node::start(&redis.url(), &env);
        Fleet { redis, node }
    }

    fn worker(&self, app: &Recorder, configure: impl FnOnce(&mut Config)) -> Worker {
        let namespaces = ["/threads", "/docs"];
        registered(&self.node, ACCOUNT, &namespaces, app.clone(), configure)
    }

    /// The placements hash of `(ns, id)` in single mode (contract §5).
    fn placements_key(ns: &str, id: &str) -> String {
        let keys = pinboard::store::Keys::new("pinboard:", 16);
        keys.placements(pinboard::store::bucket_of(id, 16), "default", ns)
            .to_string()
    }

    /// Writes a placement row as a claim would.
    fn place(&self, ns: &str, id: &str, session: &str, epoch: &str) {
        let row = json!({ "sessionId": session, "epoch": epoch }).to_string();
        self.redis
            .cli(&["HSET", &Fleet::placements_key(ns, id), id, &row]);
    }

    fn row(&self, ns: &str, id: &str) -> Option<Value> {
        let raw = self
            .redis
            .cli(&["HGET", &Fleet::placements_key(ns, id), id]);
        (!raw.is_empty()).then(|| serde_json::from_str(&raw).unwrap())
    }

    /// A heartbeat for `session` sent by the test itself.
    fn heartbeat(&self, session: &str) -> Reply {
        let token = token(ACCOUNT, &["pinboard:worker"], &["*"]);
        workers::heartbeat(self.node.addr, session, &token)
    }
}

/// A request to the worker as Pinboard forwards it: attested for its current session, at
/// `epoch`.
fn forward(handle: &Handle, path: &str, epoch: &str) -> Reply {
    let session = handle.session_id().expect("a session");
    let token = attestation(handle.secret(), &session, path, epoch);
    Client::connect(handle.local_addr()).request(
        format!(
            "GET {path} HTTP/1.1\r\nHost: w\r\nPinboard-Attestation: {token}\r\nPinboard-Epoch: {epoch}\r\n\r\n"
        )
        .as_bytes(),
    )
}

fn registrations(events: &[Event]) -> Vec<(String, bool)> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Registered {
                session_id,
                reregistered,
            } => Some((session_id.clone(), *reregistered)),
            _ => None,
        })
        .collect()
}

#[test]
fn registers_heartbeats_tags_releases_and_deregisters() {
    let fleet = Fleet::start(&[]);
    let app = Recorder::default();
    let worker = fleet.worker(&app, |_| {});
    let handle = worker.handle().clone();
    let session = handle.session_id().unwrap();
    assert!(handle.status().lease_healthy);
    assert!(eventually(Duration::from_secs(2), || registrations(
        &app.events()
    ) == [(
        session.clone(),
        false
    )]));

    // Heartbeats keep the session past several lease TTLs.
    std::thread::sleep(Duration::from_millis(LEASE_MS * 3));
    assert_eq!(handle.session_id(), Some(session.clone()));
    assert!(handle.status().lease_healthy, "{}", fleet.node.log());
    assert_eq!(
        registrations(&app.events()).len(),
        1,
        "{}",
        fleet.node.log()
    );
    assert_eq!(
        fleet.heartbeat(&session).status,
        200,
        "the registry knows the session"
    );

    // The own draining flag goes out on the next heartbeat and comes back as the registry's.
    handle.set_draining(true);
    assert!(eventually(Duration::from_secs(3), || handle
        .status()
        .registry_draining));
    let drain = Event::Drain {
        draining: true,
        deadline: None,
    };
    assert!(eventually(Duration::from_secs(1), || app
        .events()
        .contains(&drain)));
    handle.set_draining(false);
    assert!(eventually(Duration::from_secs(3), || !handle
        .status()
        .registry_draining));

    // Holding an instance, tagging it, releasing it: each quotes the epoch held.
    fleet.place("/threads", "t1", &session, "100");
    let served = forward(&handle, "/threads/t1/x", "100");
    assert_eq!(served.status, 200, "{served:?}");
    assert_eq!(served.json()["activated"], true);
    assert!(block_on(handle.tag("/threads", "t1", "ws:W")).unwrap());
    assert_eq!(fleet.row("/threads", "t1").unwrap()["tag"], "ws:W");
    assert!(block_on(handle.release("/threads", "t1")).unwrap());
    assert_eq!(fleet.row("/threads", "t1"), None);
    assert!(handle.held().is_empty());
    assert!(matches!(
        block_on(handle.release("/threads", "t1")),
        Err(CallError::NotHeld { .. })
    ));
    let stale = forward(&handle, "/threads/t1", "100");
    assert_eq!(
        (stale.status, stale.text().as_str()),
        (409, "stale placement epoch")
    );

    // A row re-placed under the worker's feet: release frees nothing, tag writes nothing.
    fleet.place("/docs", "d1", &session, "200");
    assert_eq!(forward(&handle, "/docs/d1", "200").status, 200);
    fleet.place("/docs", "d1", &session, "201");
    assert!(!block_on(handle.tag("/docs", "d1", "x")).unwrap());
    assert!(!block_on(handle.release("/docs", "d1")).unwrap());
    assert!(fleet.row("/docs", "d1").is_some());

    // Graceful shutdown releases what is held, then deregisters.
    fleet.place("/threads", "t2", &session, "300");
    assert_eq!(forward(&handle, "/threads/t2", "300").status, 200);
    worker.shutdown();
    assert_eq!(fleet.row("/threads", "t2"), None, "{}", fleet.node.log());
    let gone = fleet.heartbeat(&session);
    assert_eq!(
        (gone.status, gone.json()),
        (
            409,
            json!({ "error": "unknown session", "reregister": true })
        )
    );
}

#[test]
fn reregisters_reclaiming_held_instances_at_their_epoch() {
    let mut fleet = Fleet::start(&[]);
    let app = Recorder::default();
    let worker = fleet.worker(&app, |_| {});
    let handle = worker.handle().clone();
    let first = handle.session_id().unwrap();
    fleet.place("/threads", "t1", &first, "100");
    assert_eq!(forward(&handle, "/threads/t1", "100").status, 200);

    // The node goes away for longer than a lease: the session expires meanwhile, and the
    // worker's next heartbeat learns it lost the session. Back within a second lease, before
    // the record (and, by the sweeper, its rows) could be pruned.
    let addr = fleet.node.addr.to_string();
    assert!(fleet.node.stop().success());
    std::thread::sleep(Duration::from_millis(LEASE_MS * 5 / 4));
    assert!(!handle.status().lease_healthy);
    fleet.node = Node::start(
        &fleet.redis.url(),
        &[
            ("PINBOARD_LEASE_TTL_MS", &LEASE_MS.to_string()),
            ("PINBOARD_LISTEN", &addr),
        ],
    );
    assert!(
        eventually(Duration::from_secs(15), || handle
            .session_id()
            .is_some_and(|s| s != first)),
        "{}",
        fleet.node.log()
    );
    let second = handle.session_id().unwrap();
    assert_eq!(
        registrations(&app.events()),
        [(first, false), (second.clone(), true)]
    );
    assert!(
        !app.events()
            .iter()
            .any(|e| matches!(e, Event::Evicted { .. }))
    );
    assert_eq!(handle.held().len(), 1);
    assert_eq!(handle.held()[0].epoch.as_str(), "100");
    assert_eq!(
        fleet.row("/threads", "t1").unwrap(),
        json!({ "sessionId": second, "epoch": "100" })
    );
    let again = forward(&handle, "/threads/t1", "100");
    assert_eq!(
        (again.status, again.json()["activated"].clone()),
        (200, json!(false))
    );
    worker.shutdown();
}

#[test]
fn reregistration_evicts_what_it_cannot_reclaim() {
    let fleet = Fleet::start(&[]);
    let app = Recorder::default();
    let worker = fleet.worker(&app, |_| {});
    let handle = worker.handle().clone();
    let first = handle.session_id().unwrap();
    fleet.place("/threads", "t1", &first, "100");
    assert_eq!(forward(&handle, "/threads/t1", "100").status, 200);

    // Redis loses everything: the session and the row.
    fleet.redis.cli(&["FLUSHALL"]);
    assert!(
        eventually(Duration::from_secs(15), || handle
            .session_id()
            .is_some_and(|s| s != first)),
        "{}",
        fleet.node.log()
    );
    assert!(eventually(Duration::from_secs(2), || app
        .events()
        .contains(&Event::Evicted {
            ns: "/threads".into(),
            id: "t1".into()
        })));
    assert!(handle.held().is_empty());
    let stale = forward(&handle, "/threads/t1", "100");
    assert_eq!(
        (stale.status, stale.text().as_str()),
        (409, "stale placement epoch")
    );
    worker.shutdown();
}

#[test]
fn a_higher_epoch_registration_supersedes_this_one() {
    let fleet = Fleet::start(&[("PINBOARD_HOSTNAME_AWARE", "true")]);
    let hostname_aware = |env: &str, epoch: u64| {
        let env = env.to_owned();
        move |config: &mut Config| {
            config.namespaces = vec!["/threads".into()];
            config.registration.hostname = Some("app.example.com".into());
            config.registration.env = Some(env);
            config.registration.takeover = Some(Takeover::WindDown);
            config.registration.epoch = Some(epoch);
        }
    };
    let (old_app, new_app) = (Recorder::default(), Recorder::default());
    let old = fleet.worker(&old_app, hostname_aware("blue", 1));
    let old_handle = old.handle().clone();
    old_handle.session_id().unwrap();
    let _new = fleet.worker(&new_app, |config| {
        hostname_aware("green", 2)(config);
        config.client_id = "worker-2".into();
    });
    assert!(
        eventually(Duration::from_secs(10), || old_handle.status().superseded),
        "{}",
        fleet.node.log()
    );
    assert!(
        old_app
            .events()
            .iter()
            .any(|e| matches!(e, Event::Superseded { .. }))
    );
    let refused = forward(&old_handle, "/threads/t1", "5");
    assert_eq!(refused.status, 503);
    assert_eq!(refused.header("pinned-refusal"), Some("lease-unhealthy"));
    // No more heartbeats: the superseded worker stays superseded.
    std::thread::sleep(Duration::from_millis(LEASE_MS));
    assert!(old_handle.status().superseded);
    assert_eq!(registrations(&old_app.events()).len(), 1);
}

#[test]
fn wind_down_reaches_the_application_once() {
    let fleet = Fleet::start(&[]);
    let app = Recorder::default();
    let worker = fleet.worker(&app, |_| {});
    let handle = worker.handle().clone();
    let session = handle.session_id().unwrap();
    fleet.place("/threads", "t1", &session, "100");
    assert_eq!(forward(&handle, "/threads/t1", "100").status, 200);

    let operator = token(ACCOUNT, &["pinboard:operator"], &["*"]);
    let body = json!({ "namespace": "/threads", "id": "t1", "deadline": 60 }).to_string();
    let queued = post_json(
        fleet.node.addr,
        "/registry/wind_down",
        Some(&operator),
        &body,
    );
    assert_eq!(
        (queued.status, queued.json()),
        (200, json!({ "queued": true }))
    );
    assert!(eventually(Duration::from_secs(5), || handle
        .messages()
        .len()
        == 1));
    let message = &handle.messages()[0];
    assert_eq!(
        (message.ns.as_str(), message.id.as_str()),
        ("/threads", "t1")
    );
    let deadline = message.deadline.expect("a deadline");
    assert!(deadline <= Duration::from_secs(60) && deadline > Duration::from_secs(50));

    // Acked on the next heartbeat: several heartbeats later it came only once.
    std::thread::sleep(Duration::from_millis(LEASE_MS * 2));
    let wind_downs = app
        .events()
        .iter()
        .filter(|e| matches!(e, Event::WindDown(_)))
        .count();
    assert_eq!(wind_downs, 1);
    assert_eq!(handle.messages().len(), 1);
    worker.shutdown();
}

#[test]
fn requests_through_the_node_reach_the_instance() {
    let fleet = Fleet::start(&[]);
    let app = Recorder::default();
    let worker = fleet.worker(&app, |_| {});
    let handle = worker.handle().clone();
    // Past the registry's cold-start quarantine, the first request places the instance here.
    let mut first = get(fleet.node.addr, "/threads/t1/hello?x=1", None);
    assert!(eventually(Duration::from_secs(10), || {
        first = get(fleet.node.addr, "/threads/t1/hello?x=1", None);
        first.status == 200
    }));
    let first = first.json();
    assert_eq!(
        (
            first["ns"].clone(),
            first["id"].clone(),
            first["rest"].clone()
        ),
        (json!("/threads"), json!("t1"), json!("/hello"))
    );
    assert_eq!(first["session"], json!(handle.session_id()));
    let second = get(fleet.node.addr, "/threads/t1/hello", None).json();
    assert_eq!(second["epoch"], first["epoch"]);
    assert_eq!(second["activated"], false);
    assert_eq!(handle.held().len(), 1);

    let operator = token(ACCOUNT, &["pinboard:operator"], &["*"]);
    let stats = get(fleet.node.addr, "/registry/stats", Some(&operator)).json();
    let stats = &stats["workers"][0]["stats"];
    assert_eq!(stats["sessionId"], json!(handle.session_id()));
    assert_eq!(stats["instances"], json!({ "/threads": ["t1"] }));
    worker.shutdown();
}

/// How long the first token of the credential tests stays valid.
const FIRST_TOKEN: Duration = Duration::from_secs(6);

/// A worker whose credential is `file`, holding a token valid for [`FIRST_TOKEN`] (from the
/// instant returned on).
fn token_file_worker(fleet: &Fleet, app: &Recorder, file: &std::path::Path) -> (Worker, Instant) {
    let expires = Instant::now() + FIRST_TOKEN;
    replace_token(file, &expiring_worker_token(ACCOUNT, FIRST_TOKEN));
    let worker = fleet.worker(app, |c| {
        c.token.clear();
        c.token_file = Some(file.to_owned());
    });
    (worker, expires)
}

#[test]
fn a_replaced_token_file_keeps_the_worker_registered_past_the_first_tokens_expiry() {
    let fleet = Fleet::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("token");
    let app = Recorder::default();
    let (worker, expires) = token_file_worker(&fleet, &app, &file);
    let handle = worker.handle();
    let session = handle.session_id().unwrap();
    let first = std::fs::read_to_string(&file).unwrap();
    replace_token(&file, &token(ACCOUNT, &["pinboard:worker"], &["*"]));

    // Several leases past the first token's end: by then the node refuses it.
    std::thread::sleep(expires.saturating_duration_since(Instant::now()) + 3 * LEASE);
    let refused = workers::heartbeat(fleet.node.addr, &session, first.trim());
    assert_eq!(refused.status, 401, "{}", refused.text());
    // The worker heartbeats with the token it read again: the same session, a live lease.
    let renewed = eventually(3 * LEASE, || handle.status().lease_healthy);
    let status = handle.status();
    assert!(renewed && !status.credential_refused, "{status:?}");
    assert_eq!(status.session_id.as_deref(), Some(session.as_str()));
    assert_eq!(forward(handle, "/threads/a", "1").status, 200);
    assert_eq!(registrations(&app.events()).len(), 1, "{:?}", app.events());
    assert!(
        !app.events()
            .iter()
            .any(|e| matches!(e, Event::CredentialRefused { .. }))
    );
    worker.shutdown();
}

#[test]
fn a_token_that_expires_unreplaced_stops_the_worker() {
    let fleet = Fleet::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("token");
    let app = Recorder::default();
    let (worker, _) = token_file_worker(&fleet, &app, &file);
    let handle = worker.handle();
    assert_eq!(forward(handle, "/threads/a", "1").status, 200);
    let stopped = || {
        app.events()
            .iter()
            .any(|e| matches!(e, Event::CredentialRefused { status: 401, .. }))
    };
    assert!(
        eventually(FIRST_TOKEN + 10 * LEASE, stopped),
        "{:?}\n{}",
        app.events(),
        fleet.node.log()
    );
    let status = handle.status();
    assert!(
        status.credential_refused && !status.lease_healthy,
        "{status:?}"
    );
    // What it held is dropped (its epoch now stale here) and nothing new is taken.
    assert!(handle.held().is_empty());
    assert_eq!(forward(handle, "/threads/a", "1").status, 409);
    assert_eq!(forward(handle, "/threads/b", "1").status, 503);
    worker.shutdown();
}
