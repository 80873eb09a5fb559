//! Durability (contract §7) through the public API: the [`FileStore`] on real files, fenced by
//! placement epoch (a lower epoch's save refused, two writers at once ending with the higher
//! epoch's state);
//! `POST /{ns}/{id}/_wake` on a worker registered with a real `pinboard serve` and
//! redis-server, sent straight to the worker attested as the node's sweep would send it; and
//! [`Handle::schedule_wake`] end to end, `POST /registry/schedule` to the node and the node's
//! own sweep sending the `_wake` when it is due.
//!
//! Needs the `pinboard` binary next to this test (see `support/node.rs`).

mod support;

use std::fs;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use pinboard::store::bucket_of;
use pinned::{
    App, CallError, DurabilityStore, Error, Fence, FencedError, FileStore, Handle, Instance,
    Origin, Request, Response, StaleEpoch, Worker,
};
use serde_json::{Value, json};
use support::http::{Client, Reply};
use support::layout::{SHARDS, end_cold_start, keys};
use support::node::Node;
use support::redis::RedisServer;
use support::{attestation, attestation_for, block_on, eventually, registered, shuffled_epochs};

#[test]
fn the_file_store_round_trips_state_and_wakes() {
    let dir = tempfile::tempdir().unwrap();
    let store = FileStore::open(dir.path().join("a/b")).unwrap();
    assert_eq!(store.load("/threads", "t1").unwrap(), None);
    assert_eq!(store.scheduled("/threads", "t1").unwrap(), None);
    store.save("/threads", "t1", b"one").unwrap();
    store.schedule("/threads", "t1", 1_700_000_000_000).unwrap();
    store.save("/threads", "t1", b"two\n\0bytes").unwrap();
    store.save("/threads", "empty", b"").unwrap();
    assert_eq!(
        store.load("/threads", "t1").unwrap().as_deref(),
        Some(&b"two\n\0bytes"[..])
    );
    assert_eq!(
        store.scheduled("/threads", "t1").unwrap(),
        Some(1_700_000_000_000)
    );
    assert_eq!(
        store.load("/threads", "empty").unwrap(),
        Some(Vec::new()),
        "an empty state is a state"
    );
    // Namespaces keep instances apart.
    assert_eq!(store.load("/docs", "t1").unwrap(), None);

    // Another store on the same directory (a restarted worker) reads the same.
    let again = FileStore::open(store.dir()).unwrap();
    assert_eq!(
        again.load("/threads", "t1").unwrap().as_deref(),
        Some(&b"two\n\0bytes"[..])
    );
    again.cancel("/threads", "t1").unwrap();
    assert_eq!(store.scheduled("/threads", "t1").unwrap(), None);
    assert!(
        store.load("/threads", "t1").unwrap().is_some(),
        "cancel keeps the state"
    );
    store.schedule("/threads", "wake-only", 5).unwrap();
    assert_eq!(store.load("/threads", "wake-only").unwrap(), None);
    assert_eq!(store.scheduled("/threads", "wake-only").unwrap(), Some(5));

    for id in ["t1", "empty", "wake-only"] {
        store.remove("/threads", id).unwrap();
        assert_eq!(store.load("/threads", id).unwrap(), None);
        assert_eq!(store.scheduled("/threads", id).unwrap(), None);
    }
    store.remove("/threads", "never-there").unwrap();
    assert_eq!(
        fs::read_dir(store.dir()).unwrap().count(),
        0,
        "nothing left behind, temporary files included"
    );

    // A file that is not a whole state file of its instance is an error, not a state.
    store.save("/threads", "t2", b"state").unwrap();
    let path = store.path_of("/threads", "t2");
    let whole = fs::read(&path).unwrap();
    fs::write(&path, &whole[..whole.len() - 1]).unwrap();
    let torn = store.load("/threads", "t2").unwrap_err();
    assert_eq!(torn.kind(), std::io::ErrorKind::InvalidData);
    fs::copy(&path, store.path_of("/threads", "t3")).unwrap();
    assert!(
        store.load("/threads", "t3").is_err(),
        "another instance's file"
    );
}

#[test]
fn hostile_ids_stay_inside_the_directory_and_apart() {
    let outer = tempfile::tempdir().unwrap();
    let store = FileStore::open(outer.path().join("store")).unwrap();
    let long = "x".repeat(300);
    let longer = "x".repeat(301);
    let huge = "../".repeat(4000);
    let shared: Vec<String> = serde_json::from_str(include_str!("data/hostile-ids.json")).unwrap();
    let hostile: Vec<&str> = shared
        .iter()
        .map(String::as_str)
        .chain([long.as_str(), longer.as_str(), huge.as_str()])
        .collect();
    for (n, id) in hostile.iter().enumerate() {
        store.save("/t", id, n.to_string().as_bytes()).unwrap();
        store.schedule("/t", id, n as u64).unwrap();
        let path = store.path_of("/t", id);
        assert_eq!(path.parent(), Some(store.dir()), "{id:?}");
    }
    // Hostile namespaces too, and a namespace/id split that would join to the same text.
    store.save("/../t", "x", b"ns").unwrap();
    store.save("/t.x", "y", b"dot-ns").unwrap();
    for (n, id) in hostile.iter().enumerate() {
        let state = store.load("/t", id).unwrap();
        assert_eq!(state, Some(n.to_string().into_bytes()), "{id:?}");
        assert_eq!(store.scheduled("/t", id).unwrap(), Some(n as u64), "{id:?}");
    }
    assert_eq!(
        store.load("/../t", "x").unwrap().as_deref(),
        Some(&b"ns"[..])
    );
    assert_eq!(store.load("/t", "x.y").unwrap(), None);
    assert_eq!(
        store.load("/t.x", "y").unwrap().as_deref(),
        Some(&b"dot-ns"[..])
    );

    // Every file is a plain file directly in the store, and nothing was written beside it.
    let outside: Vec<_> = fs::read_dir(outer.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(outside, ["store"]);
    let inside: Vec<_> = fs::read_dir(store.dir())
        .unwrap()
        .map(|e| e.unwrap())
        .collect();
    assert_eq!(inside.len(), hostile.len() + 2);
    for entry in inside {
        assert!(entry.file_type().unwrap().is_file());
        let name = entry.file_name().into_string().unwrap();
        assert!(!name.starts_with('.') && name.len() <= 255, "{name}");
    }
}

fn fence(digits: &str) -> Fence {
    Fence::parse(digits).unwrap()
}

/// The refusal a fenced write from `offered` meets where `stored` is.
fn stale(stored: &str, offered: &str) -> StaleEpoch {
    StaleEpoch {
        stored: fence(stored),
        offered: fence(offered),
    }
}

/// The `StaleEpoch` of a refused fenced write (the test fails on anything else).
fn refused<T: std::fmt::Debug>(result: Result<T, FencedError<std::io::Error>>) -> StaleEpoch {
    match result {
        Err(FencedError::Stale(stale)) => stale,
        other => panic!("not refused as stale: {other:?}"),
    }
}

#[test]
fn the_file_store_refuses_a_save_from_a_lower_epoch_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = FileStore::open(dir.path()).unwrap();
    let (ns, id) = ("/threads", "f");
    store.save_fenced(ns, id, &fence("5"), b"five").unwrap();
    store.schedule(ns, id, 99).unwrap();
    // The same owner saves again; a higher epoch (the next owner) replaces it.
    store
        .save_fenced(ns, id, &fence("5"), b"five again")
        .unwrap();
    store.save_fenced(ns, id, &fence("6"), b"six").unwrap();
    let path = store.path_of(ns, id);
    let before = fs::read(&path).unwrap();
    assert_eq!(before, b"pinned-durable/1 %2Fthreads.f 99 3 6\nsix");

    let refusal = refused(store.save_fenced(ns, id, &fence("5"), b"late"));
    assert_eq!(refusal, stale("6", "5"));
    assert_eq!(refusal.to_string(), "stale epoch: stored 6, offered 5");
    assert_eq!(fs::read(&path).unwrap(), before, "nothing written");
    assert_eq!(store.load(ns, id).unwrap().as_deref(), Some(&b"six"[..]));
    assert_eq!(store.scheduled(ns, id).unwrap(), Some(99));
    let leftovers: Vec<_> = fs::read_dir(store.dir()).unwrap().collect();
    assert_eq!(leftovers.len(), 1, "no temporary file left by the refusal");

    // Past 2^53 and 2^64, and across lengths, epochs compare as numbers, never as floats or
    // as text: 2^53 + 1 is refused after 2^53 + 2; "10" beats "9".
    let (id2, id3) = ("big", "lengths");
    let beyond = [
        ("9007199254740994", "9007199254740993"),
        ("18446744073709551616", "18446744073709551615"),
    ];
    for (higher, lower) in beyond {
        store
            .save_fenced(ns, id2, &fence(higher), higher.as_bytes())
            .unwrap();
        let late = store.save_fenced(ns, id2, &fence(lower), b"late");
        assert_eq!(refused(late), stale(higher, lower));
    }
    let top = "18446744073709551616";
    assert_eq!(
        store.load(ns, id2).unwrap().as_deref(),
        Some(top.as_bytes())
    );
    store.save_fenced(ns, id3, &fence("9"), b"nine").unwrap();
    store.save_fenced(ns, id3, &fence("10"), b"ten").unwrap();
    assert_eq!(
        refused(store.save_fenced(ns, id3, &fence("9"), b"nine")),
        stale("10", "9")
    );
    // Leading zeros are the same epoch (stored without them).
    store
        .save_fenced(ns, id3, &fence("0010"), b"ten again")
        .unwrap();
    assert!(
        fs::read(store.path_of(ns, id3))
            .unwrap()
            .starts_with(b"pinned-durable/1 %2Fthreads.lengths - 9 10\n")
    );
}

#[test]
fn a_file_from_before_fencing_is_epoch_0_and_unfenced_calls_keep_the_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let store = FileStore::open(dir.path()).unwrap();
    let (ns, id) = ("/threads", "old");
    // Written as the store wrote it before fencing (no epoch in the header).
    fs::write(
        store.path_of(ns, id),
        b"pinned-durable/1 %2Fthreads.old 7 3\nold",
    )
    .unwrap();
    store.save_fenced(ns, id, &fence("0"), b"zero").unwrap();
    store.save_fenced(ns, id, &fence("1"), b"one").unwrap();
    assert_eq!(
        refused(store.save_fenced(ns, id, &fence("0"), b"zero")),
        stale("1", "0")
    );
    // The calls without a fence write, and keep the stored epoch.
    store.save(ns, id, b"unfenced").unwrap();
    store.schedule(ns, id, 8).unwrap();
    store.cancel(ns, id).unwrap();
    assert_eq!(
        fs::read(store.path_of(ns, id)).unwrap(),
        b"pinned-durable/1 %2Fthreads.old - 8 1\nunfenced"
    );
    // Removed, the state and the wake go, the fence stays: a former owner cannot save the
    // instance back.
    store.remove(ns, id).unwrap();
    assert_eq!(store.load(ns, id).unwrap(), None);
    assert_eq!(
        fs::read(store.path_of(ns, id)).unwrap(),
        b"pinned-durable/1 %2Fthreads.old - - 1\n"
    );
    assert_eq!(
        refused(store.save_fenced(ns, id, &fence("0"), b"back")),
        stale("1", "0")
    );
    assert_eq!(store.load(ns, id).unwrap(), None);
}

#[test]
fn a_claim_fences_off_earlier_owners_before_the_new_one_saves() {
    let dir = tempfile::tempdir().unwrap();
    let store = FileStore::open(dir.path()).unwrap();
    let (ns, id) = ("/threads", "c");
    assert_eq!(store.claim(ns, id, &fence("3")).unwrap(), None);
    assert!(
        store.path_of(ns, id).exists(),
        "a claim with nothing saved is kept"
    );
    store.save_fenced(ns, id, &fence("3"), b"three").unwrap();
    // The next owner hydrates at 4: the state, and from now on 3 is refused.
    assert_eq!(
        store.claim(ns, id, &fence("4")).unwrap().as_deref(),
        Some(&b"three"[..])
    );
    assert_eq!(
        refused(store.save_fenced(ns, id, &fence("3"), b"late")),
        stale("4", "3")
    );
    assert_eq!(refused(store.claim(ns, id, &fence("3"))), stale("4", "3"));
    // Claiming again at the same epoch writes nothing.
    let path = store.path_of(ns, id);
    let inode = std::os::unix::fs::MetadataExt::ino(&fs::metadata(&path).unwrap());
    assert_eq!(
        store.claim(ns, id, &fence("4")).unwrap().as_deref(),
        Some(&b"three"[..])
    );
    let again = std::os::unix::fs::MetadataExt::ino(&fs::metadata(&path).unwrap());
    assert_eq!(inode, again, "not rewritten");
}

#[test]
fn two_stores_writing_at_once_end_with_the_highest_epochs_state() {
    let dir = tempfile::tempdir().unwrap();
    // Two stores on one directory, as two worker processes have: only the directory's flock
    // keeps one's check and write from interleaving with the other's.
    let writers: Vec<_> = (0..2u64)
        .map(|writer| {
            let store = FileStore::open(dir.path()).unwrap();
            std::thread::spawn(move || {
                let mut written = 0;
                for epoch in shuffled_epochs(writer, 150) {
                    let state = format!("{writer}:{epoch}");
                    let at = fence(&epoch.to_string());
                    match store.save_fenced("/t", "x", &at, state.as_bytes()) {
                        Ok(()) => written += 1,
                        Err(FencedError::Stale(stale)) => assert!(stale.stored > at, "{stale}"),
                        Err(e) => panic!("{e}"),
                    }
                }
                written
            })
        })
        .collect();
    let written: u64 = writers.into_iter().map(|w| w.join().unwrap()).sum();
    assert!(
        written >= 2,
        "each wrote at least its highest epoch or below it"
    );
    let store = FileStore::open(dir.path()).unwrap();
    assert_eq!(
        store.load("/t", "x").unwrap().as_deref(),
        Some(&b"1:300"[..]),
        "the highest epoch's state stands"
    );
    assert_eq!(
        refused(store.save_fenced("/t", "x", &fence("299"), b"late")),
        stale("300", "299")
    );
}

const ACCOUNT: &str = "acct-1";

/// Counts its wakes; each waits while `hold` is set, fails while `fail` is.
#[derive(Clone, Default)]
struct Sleeper {
    hold: Arc<AtomicBool>,
    fail: Arc<AtomicBool>,
    wakes: Arc<Mutex<Vec<Woken>>>,
}

/// A wake the hook saw: (ns, id, epoch, activated, state).
type Woken = (String, String, String, bool, Option<Vec<u8>>);

impl Sleeper {
    fn wakes(&self) -> usize {
        self.wakes.lock().unwrap().len()
    }
}

impl App for Sleeper {
    async fn handle(
        &self,
        _: &Handle,
        instance: &Instance,
        _: &mut Request<'_>,
    ) -> Result<Response, Error> {
        Ok(Response::json_value(
            http::StatusCode::OK,
            &json!({ "rest": instance.rest, "activated": instance.activated }),
        ))
    }

    async fn on_wake(
        &self,
        _: &Handle,
        instance: &Instance,
        state: Option<Vec<u8>>,
    ) -> Result<(), Error> {
        self.wakes.lock().unwrap().push((
            instance.ns.clone(),
            instance.id.clone(),
            instance.epoch.as_str().to_owned(),
            instance.activated,
            state,
        ));
        while self.hold.load(Ordering::SeqCst) {
            monoio::time::sleep(Duration::from_millis(10)).await;
        }
        if self.fail.load(Ordering::SeqCst) {
            return Err(Error::new(Origin::Internal, "told to fail"));
        }
        Ok(())
    }
}

struct Fleet {
    redis: RedisServer,
    node: Node,
}

impl Fleet {
    fn start() -> Fleet {
        Fleet::start_with(&[])
    }

    /// A node with these settings besides a 5 s lease.
    fn start_with(env: &[(&str, &str)]) -> Fleet {
        let redis = RedisServer::start();
        let mut env = env.to_vec();
        env.push(("PINBOARD_LEASE_TTL_MS", "5000"));
        let node = Node::start(&redis.url(), &env);
        Fleet { redis, node }
    }

    fn worker(&self, app: &Sleeper, store: Option<Arc<FileStore>>) -> Worker {
        registered(&self.node, ACCOUNT, &["/threads"], app.clone(), |config| {
            config.durability = store.map(|s| s as Arc<dyn DurabilityStore>);
            config.wake_wait = Duration::from_millis(300);
        })
    }

    /// A worker on a store in `dir` where `/threads/a` has the state `saved`.
    fn durable_worker(&self, app: &Sleeper, dir: &Path) -> (Arc<FileStore>, Worker) {
        let store = Arc::new(FileStore::open(dir).unwrap());
        store.save("/threads", "a", b"saved").unwrap();
        let worker = self.worker(app, Some(store.clone()));
        (store, worker)
    }
}

/// `method path` to the worker with these headers.
fn send(handle: &Handle, method: &str, path: &str, headers: &[(&str, &str)]) -> Reply {
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: w\r\nContent-Length: 0\r\n");
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    Client::connect(handle.local_addr()).request(format!("{head}\r\n").as_bytes())
}

/// The sweep's `_wake` of `/threads/{id}` at `epoch`, attested for `inst` at `token_epoch`.
fn wake_as(handle: &Handle, purpose: &str, id: &str, inst: &str, epochs: (&str, &str)) -> Reply {
    let session = handle.session_id().unwrap();
    let token = attestation_for(purpose, handle.secret(), &session, inst, epochs.1);
    let headers = [
        ("Pinboard-Attestation", token.as_str()),
        ("Pinboard-Epoch", epochs.0),
    ];
    send(handle, "POST", &format!("/threads/{id}/_wake"), &headers)
}

fn wake(handle: &Handle, id: &str, epoch: &str) -> Reply {
    wake_as(
        handle,
        "wake",
        id,
        &format!("/threads/{id}"),
        (epoch, epoch),
    )
}

fn json_of(reply: &Reply, status: u16) -> Value {
    assert_eq!(reply.status, status, "{reply:?}");
    reply.json()
}

#[test]
fn wake_is_attested_fenced_and_answers_202_until_resident() {
    let fleet = Fleet::start();
    let dir = tempfile::tempdir().unwrap();
    let app = Sleeper::default();
    let (_store, worker) = fleet.durable_worker(&app, dir.path());
    let handle = worker.handle().clone();
    let refused = json!({ "detail": "invalid attestation" });

    // The instance path's checks, in its order: attestation (a wake token for this instance
    // and epoch), a well-formed epoch, a current one.
    let session = handle.session_id().unwrap();
    let wrong_secret = attestation_for("wake", "not-the-secret", &session, "/threads/a", "7");
    let forward = attestation(handle.secret(), &session, "/threads/a", "7");
    for headers in [
        vec![("Pinboard-Epoch", "7")],
        vec![("Pinboard-Attestation", "garbage"), ("Pinboard-Epoch", "7")],
        vec![
            ("Pinboard-Attestation", wrong_secret.as_str()),
            ("Pinboard-Epoch", "7"),
        ],
        vec![
            ("Pinboard-Attestation", forward.as_str()),
            ("Pinboard-Epoch", "7"),
        ],
    ] {
        let reply = send(&handle, "POST", "/threads/a/_wake", &headers);
        assert_eq!(json_of(&reply, 403), refused, "{headers:?}");
    }
    for (inst, epochs) in [
        ("/threads/b", ("7", "7")),
        ("/threads/a", ("7", "8")),
        ("/threads/a", ("8", "7")),
    ] {
        let reply = wake_as(&handle, "wake", "a", inst, epochs);
        assert_eq!(json_of(&reply, 403), refused, "{inst} {epochs:?}");
    }
    let malformed = wake_as(&handle, "wake", "a", "/threads/a", ("7x", "7x"));
    assert_eq!(
        (malformed.status, malformed.text().as_str()),
        (400, "malformed placement epoch")
    );
    let token = attestation_for("wake", handle.secret(), &session, "/threads/a", "7");
    let twice = [
        ("Pinboard-Attestation", token.as_str()),
        ("Pinboard-Epoch", "7"),
        ("Pinboard-Epoch", "7"),
    ];
    assert_eq!(
        json_of(&send(&handle, "POST", "/threads/a/_wake", &twice), 403),
        refused
    );
    let get = [
        ("Pinboard-Attestation", token.as_str()),
        ("Pinboard-Epoch", "7"),
    ];
    let reply = send(&handle, "GET", "/threads/a/_wake", &get);
    assert_eq!((reply.status, reply.header("allow")), (405, Some("POST")));
    assert_eq!(app.wakes(), 0, "nothing above reached the hook");
    assert!(handle.held().is_empty());

    // A hook past wake_wait: 202 while it runs (and no second one starts), then 200 once.
    app.hold.store(true, Ordering::SeqCst);
    assert_eq!(
        json_of(&wake(&handle, "a", "7"), 202),
        json!({ "activating": true })
    );
    assert_eq!(
        json_of(&wake(&handle, "a", "7"), 202),
        json!({ "activating": true })
    );
    assert_eq!(
        handle.held().len(),
        1,
        "admitted at its epoch like any request"
    );
    app.hold.store(false, Ordering::SeqCst);
    let mut last = None;
    assert!(
        eventually(Duration::from_secs(10), || {
            let reply = wake(&handle, "a", "7");
            let done = reply.status == 200;
            last = Some(reply);
            done
        }),
        "{last:?}"
    );
    assert_eq!(last.unwrap().json(), json!({ "ok": true }));
    let wakes = app.wakes.lock().unwrap().clone();
    assert_eq!(
        wakes,
        [(
            "/threads".to_owned(),
            "a".to_owned(),
            "7".to_owned(),
            true,
            Some(b"saved".to_vec())
        )],
        "one hook, activated, on the stored state"
    );

    // The next wake runs the hook again; a quick one answers 200 at once.
    assert_eq!(
        json_of(&wake(&handle, "a", "7"), 200),
        json!({ "ok": true })
    );
    assert!(!app.wakes.lock().unwrap()[1].3, "resident already");
    // A stale epoch is fenced like a forward; a forward at the epoch sees it held.
    let stale = wake(&handle, "a", "6");
    assert_eq!(
        (stale.status, stale.text().as_str()),
        (409, "stale placement epoch")
    );
    let path = "/threads/a/x";
    let forward = attestation(handle.secret(), &session, path, "7");
    let headers = [
        ("Pinboard-Attestation", forward.as_str()),
        ("Pinboard-Epoch", "7"),
    ];
    assert_eq!(
        json_of(&send(&handle, "GET", path, &headers), 200),
        json!({ "rest": "/x", "activated": false })
    );

    // An instance never saved wakes with no state; a failing hook is a 500 and is retried.
    app.fail.store(true, Ordering::SeqCst);
    assert_eq!(
        json_of(&wake(&handle, "b", "3"), 500),
        json!({ "detail": "wake failed" })
    );
    app.fail.store(false, Ordering::SeqCst);
    assert_eq!(
        json_of(&wake(&handle, "b", "3"), 200),
        json!({ "ok": true })
    );
    let wakes = app.wakes.lock().unwrap().clone();
    assert_eq!(wakes.len(), 4);
    assert_eq!((wakes[2].3, wakes[2].4.clone()), (true, None));
    assert_eq!((wakes[3].3, wakes[3].4.clone()), (false, None));
    worker.shutdown();
}

#[test]
fn wake_is_mounted_only_with_a_store() {
    let fleet = Fleet::start();
    let app = Sleeper::default();
    let worker = fleet.worker(&app, None);
    let handle = worker.handle().clone();
    let not_found = json!({ "detail": "not found" });
    for purpose in ["wake", "forward"] {
        let reply = wake_as(&handle, purpose, "a", "/threads/a", ("7", "7"));
        assert_eq!(json_of(&reply, 404), not_found, "{purpose}");
    }
    assert_eq!(
        json_of(&send(&handle, "POST", "/threads/a/_wake", &[]), 404),
        not_found
    );
    assert_eq!(app.wakes(), 0);
    assert!(handle.held().is_empty(), "nothing admitted");
    // The rest of the instance's paths are served as ever.
    let session = handle.session_id().unwrap();
    let forward = attestation(handle.secret(), &session, "/threads/a/_wakeup", "7");
    let headers = [
        ("Pinboard-Attestation", forward.as_str()),
        ("Pinboard-Epoch", "7"),
    ];
    let reply = send(&handle, "POST", "/threads/a/_wakeup", &headers);
    assert_eq!(json_of(&reply, 200)["rest"], "/_wakeup");
    worker.shutdown();
}

#[test]
fn a_scheduled_wake_is_sent_by_the_nodes_sweep_with_nobody_asking() {
    let fleet = Fleet::start_with(&[("PINBOARD_SWEEP_INTERVAL_MS", "100")]);
    end_cold_start(&fleet.redis);
    let keys = keys();
    let bucket = bucket_of("a", SHARDS);
    let (placements, schedule) = (
        keys.placements(bucket, "default", "/threads").to_string(),
        keys.wake(bucket, "default", "/threads").to_string(),
    );
    let dir = tempfile::tempdir().unwrap();
    let app = Sleeper::default();
    let (store, worker) = fleet.durable_worker(&app, dir.path());
    let handle = worker.handle().clone();
    let in_a_minute = SystemTime::now() + Duration::from_secs(60);
    let not_held = block_on(handle.schedule_wake("/threads", "a", in_a_minute));
    assert!(
        matches!(not_held, Err(CallError::NotHeld { .. })),
        "{not_held:?}"
    );

    // Placed here by a request through the node.
    let placed = support::http::get(fleet.node.addr, "/threads/a/x", None);
    assert_eq!(
        json_of(&placed, 200),
        json!({ "rest": "/x", "activated": true })
    );
    let row: Value = serde_json::from_str(&fleet.redis.cli(&["HGET", &placements, "a"])).unwrap();
    let epoch = row["epoch"].as_str().unwrap().to_owned();
    assert_eq!(row["sessionId"], json!(handle.session_id().unwrap()));
    let score = || fleet.redis.cli(&["ZSCORE", &schedule, "a"]);

    // The node writes the wake on its schedule (and the store remembers it); a cancel takes
    // it off both.
    let at_ms = |at: SystemTime| at.duration_since(UNIX_EPOCH).unwrap().as_millis() as u64;
    let scheduled = block_on(handle.schedule_wake("/threads", "a", in_a_minute));
    assert!(matches!(scheduled, Ok(true)), "{scheduled:?}");
    assert_eq!(score(), at_ms(in_a_minute).to_string());
    assert_eq!(
        store.scheduled("/threads", "a").unwrap(),
        Some(at_ms(in_a_minute))
    );
    let cancelled = block_on(handle.cancel_wake("/threads", "a"));
    assert!(matches!(cancelled, Ok(true)), "{cancelled:?}");
    assert_eq!(score(), "");
    assert_eq!(store.scheduled("/threads", "a").unwrap(), None);
    assert_eq!(app.wakes(), 0);

    // Due soon: the sweep sends `_wake` at the placement's epoch, the hook runs on the saved
    // state, and its 200 takes the entry off the schedule.
    let soon = SystemTime::now() + Duration::from_millis(300);
    let scheduled = block_on(handle.schedule_wake("/threads", "a", soon));
    assert!(matches!(scheduled, Ok(true)), "{scheduled:?}");
    assert!(
        eventually(Duration::from_secs(20), || app.wakes() == 1),
        "{}",
        fleet.node.log()
    );
    let woken = app.wakes.lock().unwrap()[0].clone();
    let saved = Some(b"saved".to_vec());
    assert_eq!(
        woken,
        ("/threads".into(), "a".into(), epoch.clone(), false, saved),
        "resident, at its epoch, on the stored state"
    );
    assert!(eventually(Duration::from_secs(10), || score().is_empty()));
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(app.wakes(), 1, "woken once");

    // Once the placement moved on, the node writes nothing.
    let moved = json!({ "sessionId": handle.session_id().unwrap(), "epoch": format!("{epoch}0") });
    fleet
        .redis
        .cli(&["HSET", &placements, "a", &moved.to_string()]);
    let refused = block_on(handle.schedule_wake("/threads", "a", in_a_minute));
    assert!(matches!(refused, Ok(false)), "{refused:?}");
    assert_eq!(score(), "");
    worker.shutdown();
}
