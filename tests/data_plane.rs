//! The data plane end to end: clients through the real node to hand-made workers, over real
//! sockets, with placements decided by the resolve script in a real redis-server.

mod support;

use std::time::Duration;

use base64::Engine;
use serde_json::{Value, json};
use support::attest::claims_of;
use support::fleet::Fixture;
use support::http::{Client, Reply, get};
use support::node::{config_file, credential};
use support::worker::{Serve, TestWorker};

fn echo(r: &Reply) -> Value {
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

fn warm_fleet(env: &[(&str, &str)]) -> (Fixture, TestWorker, String) {
    let f = Fixture::new(env);
    f.warm();
    let worker = TestWorker::start("worker-secret");
    let session = f.registered(&worker, "w1");
    (f, worker, session)
}

#[test]
fn forwards_with_epoch_attestation_and_rewritten_headers() {
    let (f, worker, session) = warm_fleet(&[]);
    let mut c = Client::connect(f.node.addr);
    let r = c.request(
        b"GET /threads/abc/messages?limit=2 HTTP/1.1\r\nHost: edge\r\nPinboard-Epoch: 1\r\n\
          Pinboard-Attestation: forged\r\nX-Forwarded-For: 6.6.6.6\r\nConnection: keep-alive, x-hop\r\n\
          X-Hop: 1\r\nX-Custom: kept\r\n\r\n",
    );
    let seen = echo(&r);
    assert_eq!(seen["path"], "/threads/abc/messages?limit=2");
    let headers = &seen["headers"];
    assert_eq!(headers["x-custom"], "kept");
    assert_eq!(headers["host"], "edge");
    assert_eq!(headers["x-forwarded-for"], "127.0.0.1");
    assert!(headers.get("x-hop").is_none() && headers.get("connection").is_none());
    let epoch = headers["pinboard-epoch"].as_str().unwrap();
    assert!(
        epoch.len() >= 13 && epoch.bytes().all(|b| b.is_ascii_digit()),
        "{epoch}"
    );
    let claims = claims_of(
        headers["pinboard-attestation"].as_str().unwrap(),
        &worker.secret(),
    );
    assert_eq!(claims["aud"], session);
    assert_eq!(
        claims["exp"].as_u64().unwrap() - claims["iat"].as_u64().unwrap(),
        30
    );
    // The worker's own Pinboard-* and hop-by-hop headers do not reach the client.
    assert_eq!(r.header("x-accel-buffering"), Some("no"));
    assert!(r.header("pinboard-internal").is_none() && r.header("keep-alive").is_none());

    // The row: contract §5 shape.
    let row = f.row("/threads", "abc").unwrap();
    assert_eq!(row, json!({"sessionId": session, "epoch": epoch}));

    // The same id again: the same owner and epoch, over the pooled connection.
    let again = echo(&c.request(b"GET /threads/abc HTTP/1.1\r\nHost: edge\r\n\r\n"));
    assert_eq!(again["headers"]["pinboard-epoch"], epoch);
    assert_eq!(
        again["conn"], seen["conn"],
        "the upstream connection is reused"
    );
    assert_eq!(worker.requests().len(), 2);
}

#[test]
fn refusals_and_route_misses() {
    let f = Fixture::new(&[]);
    let worker = TestWorker::start("s");
    f.registered(&worker, "w1");
    // A cold bucket: quarantined for one lease.
    let r = get(f.node.addr, "/threads/abc", None);
    assert_eq!(
        (r.status, r.text().as_str()),
        (503, r#"{"error":"registry cold start, retry"}"#)
    );
    let wait: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert!((14..=15).contains(&wait), "{wait}");
    f.warm();

    let r = get(f.node.addr, "/nowhere/abc", None);
    assert_eq!(
        (r.status, r.text().as_str()),
        (404, r#"{"error":"unknown namespace"}"#)
    );
    for bad in [
        "/threads/",
        "/threads",
        "/threads/a%20b",
        &format!("/threads/{}", "x".repeat(257)),
    ] {
        let r = get(f.node.addr, bad, None);
        assert_eq!(
            (r.status, r.header("content-type")),
            (400, Some("text/plain; charset=utf-8")),
            "{bad}"
        );
    }
    // A worker that is draining leaves a namespace with no backends.
    let session = f.registered(&worker, "w1");
    assert_eq!(
        f.heartbeat(&worker, &session, json!({"draining": true}))
            .status,
        200
    );
    let r = get(f.node.addr, "/threads/fresh", None);
    assert_eq!(
        (r.status, r.text().as_str()),
        (503, r#"{"error":"no live backends for namespace"}"#)
    );
    assert_eq!(r.header("retry-after"), Some("1"));
}

#[test]
fn bodies_stream_both_ways() {
    let (f, worker, _) = warm_fleet(&[]);
    let mut c = Client::connect(f.node.addr);
    let body = "x".repeat(100_000);
    let r = c.request(
        format!(
            "POST /threads/a/echo HTTP/1.1\r\nHost: e\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    );
    assert_eq!(echo(&r)["body"].as_str().unwrap().len(), 100_000);
    c.send(b"POST /threads/a/echo HTTP/1.1\r\nHost: e\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n");
    let r = c.read(false);
    assert_eq!(echo(&r)["body"], "hello world");

    worker.set_serve(Serve::EchoChunked);
    let r = c.request(b"GET /threads/a/x HTTP/1.1\r\nHost: e\r\n\r\n");
    assert_eq!(r.header("transfer-encoding"), Some("chunked"));
    assert_eq!(echo(&r)["path"], "/threads/a/x");

    worker.set_serve(Serve::EchoUntilClose);
    let r = c.request(b"GET /threads/a/y HTTP/1.1\r\nHost: e\r\n\r\n");
    assert_eq!(
        r.header("transfer-encoding"),
        Some("chunked"),
        "re-framed so the client connection survives"
    );
    assert_eq!(echo(&r)["path"], "/threads/a/y");
    worker.set_serve(Serve::Echo);
    let head = c.request(b"HEAD /threads/a/z HTTP/1.1\r\nHost: e\r\n\r\n");
    assert_eq!(head.status, 200);
    assert!(head.header("content-length").is_some());
    assert_eq!(
        echo(&c.request(b"GET /threads/a/after HTTP/1.1\r\nHost: e\r\n\r\n"))["path"],
        "/threads/a/after"
    );
}

#[test]
fn unreachable_and_slow_workers() {
    let (f, worker, _) = warm_fleet(&[("PINBOARD_FORWARDS__TIMEOUT_MS", "500")]);
    worker.set_serve(Serve::Hang);
    let r = get(f.node.addr, "/threads/slow", None);
    assert_eq!((r.status, r.text().as_str()), (504, "upstream timeout"));

    worker.set_serve(Serve::Drop);
    let r = get(f.node.addr, "/threads/dropped", None);
    assert_eq!((r.status, r.text().as_str()), (502, "bad gateway"));

    worker.stop();
    std::thread::sleep(Duration::from_millis(50));
    let r = get(f.node.addr, "/threads/fresh-id", None);
    assert_eq!((r.status, r.text().as_str()), (502, "bad gateway"));
    assert!(
        f.row("/threads", "fresh-id").is_none(),
        "a fresh placement that never reached the worker is released"
    );
    // A degraded-free, still-registered record is not marked degraded by a failed forward.
    let session = f.cli(&["HKEYS", f.keys.sessions()]);
    assert!(
        f.session_record(&session)
            .unwrap()
            .get("degradedSince")
            .is_none()
    );
}

#[test]
fn in_band_refusal_re_places_once() {
    let f = Fixture::new(&[]);
    f.warm();
    let refusing = TestWorker::start("a");
    let serving = TestWorker::start("b");
    refusing.set_serve(Serve::Refuse);
    f.registered(&refusing, "refusing");
    let good = f.registered(&serving, "serving");
    // Whatever the first choice, every id ends on the serving worker.
    for i in 0..6 {
        let r = get(f.node.addr, &format!("/threads/id-{i}"), None);
        assert!(echo(&r)["headers"]["pinboard-attestation"].is_string());
        assert_eq!(
            f.row("/threads", &format!("id-{i}")).unwrap()["sessionId"],
            good
        );
        assert!(r.header("pinned-refusal").is_none());
    }
    // A request with a body is not replayed: a refusal answers 503 at once.
    serving.set_serve(Serve::Refuse);
    let mut c = Client::connect(f.node.addr);
    let r = c.request(b"POST /threads/new-one HTTP/1.1\r\nHost: e\r\nContent-Length: 2\r\n\r\nhi");
    assert_eq!(
        (r.status, r.text().as_str()),
        (503, r#"{"error":"worker refused activation, retry"}"#)
    );
    assert_eq!(r.header("retry-after"), Some("1"));
    assert!(
        f.row("/threads", "new-one").is_none(),
        "the refused placement is released"
    );
    // Both refuse: the retry refuses too.
    let r = get(f.node.addr, "/threads/nobody-takes-it", None);
    assert_eq!(
        (r.status, r.text().as_str()),
        (503, r#"{"error":"worker refused activation, retry"}"#)
    );
}

#[test]
fn inflight_cap_per_worker() {
    let (f, worker, _) = warm_fleet(&[
        ("PINBOARD_THREADS", "1"),
        ("PINBOARD_FORWARDS__MAX_INFLIGHT", "1"),
        ("PINBOARD_FORWARDS__TIMEOUT_MS", "1500"),
    ]);
    worker.set_serve(Serve::Hang);
    let addr = f.node.addr;
    let slow = std::thread::spawn(move || get(addr, "/threads/one", None));
    std::thread::sleep(Duration::from_millis(300));
    let r = get(f.node.addr, "/threads/two", None);
    assert_eq!(
        (r.status, r.text().as_str()),
        (503, r#"{"error":"worker inflight cap exceeded, retry"}"#)
    );
    assert_eq!(r.header("retry-after"), Some("1"));
    assert_eq!(slow.join().unwrap().status, 504);
}

#[test]
fn concurrent_clients_agree_on_one_owner_and_move_together() {
    let f = Fixture::new(&[("PINBOARD_LEASE_TTL_MS", "1500")]);
    f.warm();
    let workers: Vec<TestWorker> = (0..3)
        .map(|i| TestWorker::start(&format!("s{i}")))
        .collect();
    let sessions: Vec<String> = workers
        .iter()
        .enumerate()
        .map(|(i, w)| f.registered(w, &format!("w{i}")))
        .collect();
    let hit_all = |f: &Fixture| -> Vec<(String, String)> {
        std::thread::scope(|scope| {
            let handles: Vec<_> = (0..24)
                .map(|_| {
                    scope.spawn(|| {
                        let seen = echo(&get(f.node.addr, "/threads/contended", None));
                        let claims = &seen["headers"];
                        let token = claims["pinboard-attestation"].as_str().unwrap().to_string();
                        let aud = serde_json::from_slice::<Value>(
                            &base64::engine::general_purpose::URL_SAFE_NO_PAD
                                .decode(token.split('.').nth(1).unwrap())
                                .unwrap(),
                        )
                        .unwrap()["aud"]
                            .as_str()
                            .unwrap()
                            .to_string();
                        (aud, claims["pinboard-epoch"].as_str().unwrap().to_string())
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    };
    // Keep every worker alive through the test: the lease is short.
    let keepalive = |f: &Fixture| {
        for (w, s) in workers.iter().zip(&sessions) {
            f.heartbeat(w, s, json!({}));
        }
    };
    let first = hit_all(&f);
    let owner = first[0].clone();
    assert!(
        first.iter().all(|o| *o == owner),
        "one owner, one epoch: {first:?}"
    );

    // The owner dies: it stops answering and its lease runs out.
    let dead = sessions.iter().position(|s| *s == owner.0).unwrap();
    workers[dead].stop();
    for _ in 0..4 {
        std::thread::sleep(Duration::from_millis(500));
        for (i, (w, s)) in workers.iter().zip(&sessions).enumerate() {
            if i != dead {
                f.heartbeat(w, s, json!({}));
            }
        }
    }
    let second = hit_all(&f);
    let new_owner = second[0].clone();
    assert!(
        second.iter().all(|o| *o == new_owner),
        "one new owner: {second:?}"
    );
    assert_ne!(new_owner.0, owner.0);
    assert!(
        new_owner.1.parse::<u64>().unwrap() > owner.1.parse::<u64>().unwrap(),
        "higher epoch"
    );
    keepalive(&f);
}

/// Spec, placement step 3: `boot_time` is SET NX by the resolve, per bucket.
#[test]
fn cold_start_window_starts_at_the_first_resolve_in_a_bucket() {
    let f = Fixture::new(&[]);
    let worker = TestWorker::start("s");
    f.registered(&worker, "w1");
    let operator = support::node::token("ops", &["pinboard:operator"], &["*"]);
    let quarantine_ms = || {
        get(f.node.addr, "/registry/health", Some(&operator)).json()["quarantineMs"]
            .as_u64()
            .unwrap()
    };
    let boot_time = |b: u32| f.cli(&["GET", &f.keys.bucket(b).boot_time]);
    assert_eq!(quarantine_ms(), 0, "registered, no request yet");
    assert!((0..4).all(|b| boot_time(b).is_empty()));

    let id = "a";
    let bucket = pinboard::store::bucket_of(id, 4);
    let r = get(f.node.addr, &format!("/threads/{id}"), None);
    assert_eq!(r.status, 503, "{}", r.text());
    assert!(quarantine_ms() > 0);
    for b in 0..4 {
        assert_eq!(
            !boot_time(b).is_empty(),
            b == bucket,
            "only bucket {bucket} started"
        );
    }
    // An id of another bucket, warm already, is not held by that window.
    let other = (0..)
        .map(|n| format!("o{n}"))
        .find(|id| pinboard::store::bucket_of(id, 4) != bucket)
        .unwrap();
    let other_bucket = pinboard::store::bucket_of(&other, 4);
    f.cli(&["SET", &f.keys.bucket(other_bucket).boot_time, "0"]);
    assert_eq!(
        get(f.node.addr, &format!("/threads/{other}"), None).status,
        200
    );
    assert_eq!(get(f.node.addr, "/threads/a", None).status, 503);
}

/// `forwards.max_inflight` bounds the forwards one node has in flight to one worker, whichever
/// core each client's connection landed on.
#[test]
fn inflight_cap_is_per_worker_node_wide() {
    let (f, worker, _) = warm_fleet(&[
        ("PINBOARD_THREADS", "2"),
        ("PINBOARD_FORWARDS__MAX_INFLIGHT", "3"),
        ("PINBOARD_FORWARDS__TIMEOUT_MS", "5000"),
    ]);
    worker.set_serve(Serve::Hang);
    let mut hanging: Vec<Client> = (0..3)
        .map(|i| {
            let mut c = Client::connect(f.node.addr);
            c.send(format!("GET /threads/h{i} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes());
            c
        })
        .collect();
    assert!(
        support::node::eventually(Duration::from_secs(5), || worker.requests().len() == 3),
        "all three forwards are in flight: {}",
        worker.requests().len()
    );
    // However the connections spread over the two cores, the fourth and later are refused.
    for i in 0..8 {
        let r = get(f.node.addr, &format!("/threads/x{i}"), None);
        assert_eq!(
            (r.status, r.text().as_str(), r.header("retry-after")),
            (
                503,
                r#"{"error":"worker inflight cap exceeded, retry"}"#,
                Some("1")
            ),
        );
    }
    assert_eq!(worker.requests().len(), 3);
    for c in &mut hanging {
        assert_eq!(c.read(false).status, 504);
    }
    worker.set_serve(Serve::Echo);
    assert_eq!(get(f.node.addr, "/threads/x0", None).status, 200);
}

/// Spec: "Each new placement decrements the stored value until the next heartbeat" — in the
/// listing, whatever buckets the placements fell in.
#[test]
fn listed_headroom_counts_placements_since_the_heartbeat() {
    let (f, worker, session) = warm_fleet(&[]);
    let operator = support::node::token("ops", &["pinboard:operator"], &["*"]);
    let listed = || {
        get(f.node.addr, "/registry/workers", Some(&operator)).json()["workers"][0]["headroom"]
            .as_f64()
            .unwrap()
    };
    assert_eq!(
        f.heartbeat(&worker, &session, json!({"headroom": 50}))
            .status,
        200
    );
    assert_eq!(listed(), 50.0);
    // Two ids in two different buckets, and one of them again (no new placement).
    let first = "p0";
    let second = (1..)
        .map(|n| format!("p{n}"))
        .find(|id| pinboard::store::bucket_of(id, 4) != pinboard::store::bucket_of(first, 4))
        .unwrap();
    for id in [first, second.as_str(), first] {
        assert_eq!(
            get(f.node.addr, &format!("/threads/{id}"), None).status,
            200
        );
    }
    assert_eq!(listed(), 48.0);
    assert_eq!(
        f.heartbeat(&worker, &session, json!({"headroom": 50}))
            .status,
        200
    );
    assert_eq!(listed(), 50.0, "a heartbeat replaces it");
}

/// Contract §7: ownerless placeholder rows (no `sessionId`, or an empty one) are free.
#[test]
fn placeholder_rows_are_placed_not_refused() {
    let (f, _worker, session) = warm_fleet(&[]);
    f.put_row("/threads", "p1", json!({"hostname": "h"}));
    f.put_row("/threads", "p2", json!({"sessionId": "", "hostname": "h"}));
    f.put_row("/threads", "p3", json!({"sessionId": "", "expiry": 1}));
    for id in ["p1", "p2", "p3"] {
        let r = get(f.node.addr, &format!("/threads/{id}"), None);
        assert_eq!(r.status, 200, "{id}: {}", r.text());
        let row = f.row("/threads", id).unwrap();
        assert_eq!(row["sessionId"], session, "{id}: {row}");
        assert!(row["epoch"].as_str().is_some_and(|e| !e.is_empty()));
    }
    let bucket = pinboard::store::bucket_of("p1", 4);
    let overwritten = f.cli(&["HLEN", &f.keys.overwritten(bucket, "default", "/threads")]);
    assert_eq!(overwritten, "0", "a placeholder had no owner to fence off");
}

/// Spec: `/registry/health` "answers while booting or draining"; contract §8: with Redis
/// away, from what the node knows, while every other route answers 503 + Retry-After.
#[test]
fn registry_health_answers_while_redis_is_down() {
    let mut f = Fixture::new(&[]);
    let worker = TestWorker::start("s");
    let session = f.registered(&worker, "w1");
    let operator = support::node::token("ops", &["pinboard:operator"], &["*"]);
    let health = || get(f.node.addr, "/registry/health", Some(&operator));
    assert_eq!(
        get(f.node.addr, "/threads/a", None).status,
        503,
        "cold start"
    );
    let seen = health().json()["quarantineMs"].as_u64().unwrap();
    assert!(seen > 0);

    f.redis.stop();
    let h = health();
    assert_eq!(h.status, 200, "{}", h.text());
    let q = h.json()["quarantineMs"].as_u64().unwrap();
    assert!(q <= seen && q > 0, "the last window seen: {q} vs {seen}");
    let spec_refusals = [
        r#"{"error":"registry unavailable, retry"}"#,
        r#"{"error":"not the serving fleet"}"#,
    ];
    for _ in 0..4 {
        let r = get(f.node.addr, "/threads/a", None);
        assert_eq!(r.status, 503, "{}", r.text());
        assert!(spec_refusals.contains(&r.text().as_str()), "{}", r.text());
        assert_eq!(r.header("retry-after"), Some("1"));
        let r = f.heartbeat(&worker, &session, json!({}));
        assert_eq!(r.status, 503, "{}", r.text());
        assert!(spec_refusals.contains(&r.text().as_str()), "{}", r.text());
    }
    let counted = health().json()["resolutions"]["unavailable"]
        .as_u64()
        .unwrap();
    assert!(counted >= 1, "{counted}");

    f.redis.restart();
    let back = support::node::eventually(Duration::from_secs(15), || {
        f.heartbeat(&worker, &session, json!({})).status != 503
    });
    assert!(back, "{}", f.node.log());
}

#[test]
fn registry_health_counts_this_nodes_outcomes() {
    let f = Fixture::new(&[]);
    let worker = TestWorker::start("s");
    f.registered(&worker, "w1");
    let operator = support::node::token("ops", &["pinboard:operator"], &["*"]);
    let health = || {
        let r = get(f.node.addr, "/registry/health", Some(&operator));
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()
    };
    assert_eq!(health()["quarantineMs"], 0, "no resolve yet, no window");
    assert_eq!(get(f.node.addr, "/threads/a", None).status, 503);
    let q = health()["quarantineMs"].as_u64().unwrap();
    assert!(
        (14_000..=15_000).contains(&q),
        "the first resolve started its bucket's cold start: {q}"
    );
    f.warm();
    assert_eq!(get(f.node.addr, "/threads/a", None).status, 200);
    assert_eq!(get(f.node.addr, "/nowhere/a", None).status, 404);
    worker.set_serve(Serve::Refuse);
    assert_eq!(get(f.node.addr, "/threads/b", None).status, 503);

    let h = health();
    let resolutions = &h["resolutions"];
    assert_eq!(resolutions["quarantine"], 1);
    assert_eq!(resolutions["forward"], 2, "a and b: {h}");
    assert_eq!(resolutions["unknown-ns"], 1);
    assert_eq!(resolutions["nack"], 1);
    assert_eq!(
        resolutions["no-backends"], 1,
        "the refusing worker excluded, none remained"
    );
    assert_eq!(h["quarantineMs"], 0);
    assert!(
        h["connections"].as_u64().unwrap() >= 1,
        "this request's own connection"
    );
    assert!(h["uptimeMs"].as_u64().unwrap() > 0 && h["rssBytes"].as_u64().unwrap() > 1_000_000);

    assert_eq!(get(f.node.addr, "/registry/health", None).status, 401);
    assert_eq!(
        get(f.node.addr, "/registry/health", Some(&f.token)).status,
        403
    );
}

fn owner_of(f: &Fixture, env: &str, ns: &str, id: &str) -> String {
    let bucket = pinboard::store::bucket_of(id, 4);
    let raw = f.cli(&["HGET", &f.keys.placements(bucket, env, ns), id]);
    serde_json::from_str::<Value>(&raw).unwrap()["sessionId"]
        .as_str()
        .unwrap()
        .to_string()
}

fn get_with(f: &Fixture, path: &str, headers: &str) -> Reply {
    Client::connect(f.node.addr).request(format!("GET {path} HTTP/1.1\r\n{headers}\r\n").as_bytes())
}

#[test]
fn affinity_keeps_a_client_on_one_worker() {
    let f = Fixture::new(&[("PINBOARD_AFFINITY", "header:x-user")]);
    f.warm();
    let (a, b) = (TestWorker::start("a"), TestWorker::start("b"));
    f.registered(&a, "a");
    f.registered(&b, "b");
    for user in ["alice", "bob", "carol"] {
        let owners: Vec<String> = (0..5)
            .map(|i| {
                let id = format!("{user}-{i}");
                assert_eq!(
                    get_with(
                        &f,
                        &format!("/threads/{id}"),
                        &format!("Host: e\r\nX-User: {user}\r\n")
                    )
                    .status,
                    200
                );
                owner_of(&f, "default", "/threads", &id)
            })
            .collect();
        assert!(owners.iter().all(|o| *o == owners[0]), "{user}: {owners:?}");
    }

    // Affinity by client address, believing X-Forwarded-For only from a trusted proxy.
    let f = Fixture::new(&[("PINBOARD_TRUSTED_PROXIES", "127.0.0.0/8")]);
    f.warm();
    let (a, b) = (TestWorker::start("a"), TestWorker::start("b"));
    f.registered(&a, "a");
    f.registered(&b, "b");
    for client in ["203.0.113.7", "198.51.100.1"] {
        let owners: Vec<String> = (0..4)
            .map(|i| {
                let id = format!("ip-{client}-{i}");
                let headers = format!("Host: e\r\nX-Forwarded-For: 10.9.9.9, {client}\r\n");
                let r = get_with(&f, &format!("/threads/{id}"), &headers);
                assert_eq!(
                    echo(&r)["headers"]["x-forwarded-for"],
                    "127.0.0.1",
                    "the observed peer is forwarded"
                );
                owner_of(&f, "default", "/threads", &id)
            })
            .collect();
        assert!(
            owners.iter().all(|o| *o == owners[0]),
            "{client}: {owners:?}"
        );
    }
}

#[test]
fn hostname_aware_data_plane() {
    let f = Fixture::new(&[("PINBOARD_HOSTNAME_AWARE", "true")]);
    f.warm();
    let a = TestWorker::start("a");
    let r = f.register(
        &a,
        "a",
        json!({"namespaces": ["/threads"], "hostname": "h1", "env": "e1"}),
    );
    let session_a = r.json()["sessionId"].as_str().unwrap().to_string();

    let r = get_with(&f, "/threads/x1", "Host: H1:8080\r\n");
    assert_eq!(echo(&r)["path"], "/threads/x1");
    let bucket = pinboard::store::bucket_of("x1", 4);
    let row: Value =
        serde_json::from_str(&f.cli(&["HGET", &f.keys.placements(bucket, "e1", "/threads"), "x1"]))
            .unwrap();
    assert_eq!(
        (row["sessionId"].as_str(), row["hostname"].as_str()),
        (Some(session_a.as_str()), Some("h1"))
    );

    let r = Client::connect(f.node.addr).request(b"GET /threads/x1 HTTP/1.0\r\n\r\n");
    assert_eq!(
        (r.status, r.text().as_str()),
        (400, r#"{"error":"missing Host header"}"#)
    );
    let r = get_with(&f, "/threads/x1", "Host: h9\r\n");
    assert_eq!(
        (r.status, r.text().as_str()),
        (503, r#"{"error":"no live workers for hostname"}"#)
    );
    assert_eq!(r.header("retry-after"), Some("1"));

    // Another hostname of the same env: the row belongs to h1's worker; the env's takeover
    // rule (wind_down by default) fences it for a lease.
    let c = TestWorker::start("c");
    f.register(
        &c,
        "c",
        json!({"namespaces": ["/threads"], "hostname": "h2", "env": "e1"}),
    );
    let r = get_with(&f, "/threads/x1", "Host: h2\r\n");
    assert_eq!(
        (r.status, r.text().as_str()),
        (503, r#"{"error":"takeover in progress, retry"}"#)
    );
    let wait: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert!((14..=15).contains(&wait), "{wait}");

    // A higher-epoch registration displaces h1's binding: new ids wait a lease, ids with a
    // row bypass the quarantine.
    let b = TestWorker::start("b");
    let r = f.register(
        &b,
        "b",
        json!({"namespaces": ["/threads"], "hostname": "h1", "env": "e2", "epoch": 1}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let r = get_with(&f, "/threads/brand-new", "Host: h1\r\n");
    assert_eq!(
        (r.status, r.text().as_str()),
        (503, r#"{"error":"hostname binding displaced, retry"}"#)
    );
    assert!(r.header("retry-after").unwrap().parse::<u64>().unwrap() >= 14);

    // Bindings that name an env nobody agreed a takeover for are inconsistent.
    f.cli(&["HDEL", f.keys.bind_envs(), "e1"]);
    let r = get_with(&f, "/threads/x2", "Host: h2\r\n");
    assert_eq!(
        (r.status, r.text().as_str()),
        (503, r#"{"error":"hostname bindings inconsistent, retry"}"#)
    );

    // deny: a row held by another hostname is not taken over.
    let g = Fixture::new(&[("PINBOARD_HOSTNAME_AWARE", "true")]);
    g.warm();
    let (p, q) = (TestWorker::start("p"), TestWorker::start("q"));
    g.register(
        &p,
        "p",
        json!({"namespaces": ["/threads"], "hostname": "hp", "env": "shared", "takeover": "deny"}),
    );
    g.register(
        &q,
        "q",
        json!({"namespaces": ["/threads"], "hostname": "hq", "env": "shared", "takeover": "deny"}),
    );
    assert_eq!(get_with(&g, "/threads/held", "Host: hp\r\n").status, 200);
    let r = get_with(&g, "/threads/held", "Host: hq\r\n");
    assert_eq!(
        (r.status, r.text().as_str()),
        (503, r#"{"error":"placement held by another hostname"}"#)
    );
}

fn attested_claims(seen: &Value) -> Value {
    let token = seen["headers"]["pinboard-attestation"].as_str().unwrap();
    let claims = token.split('.').nth(1).unwrap();
    serde_json::from_slice(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(claims)
            .unwrap(),
    )
    .unwrap()
}

#[test]
fn caller_attestation() {
    let f = Fixture::new(&[]);
    f.warm();
    let (a, b) = (TestWorker::start("secret-a"), TestWorker::start("secret-b"));
    let sa = f
        .register(&a, "a", json!({"namespaces": ["/threads"]}))
        .json()["sessionId"]
        .as_str()
        .unwrap()
        .to_string();
    f.registered(&b, "b");
    // The caller instance: placed on A.
    let bucket = pinboard::store::bucket_of("caller-1", 4);
    f.cli(&[
        "HSET",
        &f.keys.placements(bucket, "default", "/threads"),
        "caller-1",
        &json!({"sessionId": sa, "epoch": "1"}).to_string(),
    ]);
    let call = |path: &str, extra: &str| {
        get_with(
            &f,
            path,
            &format!(
                "Host: e\r\nPinboard-From: /threads/caller-1\r\nPinboard-Session: {sa}\r\n{extra}"
            ),
        )
    };
    let ok = |path: &str| {
        call(
            path,
            "Pinboard-Session-Secret: secret-a-0123456789abcdef\r\nPinboard-Subrequest-Depth: 3\r\n",
        )
    };

    for i in 0..4 {
        let seen = echo(&ok(&format!("/threads/target-{i}")));
        let claims = attested_claims(&seen);
        assert_eq!(
            (claims["caller"].as_str(), claims["depth"].as_u64()),
            (Some("/threads/caller-1"), Some(3))
        );
        assert!(
            seen["headers"].get("pinboard-session-secret").is_none(),
            "never forwarded"
        );
        assert_eq!(
            owner_of(&f, "default", "/threads", &format!("target-{i}")),
            sa,
            "a caller prefers its own session"
        );
    }

    let refusal = |r: Reply| {
        (
            r.status,
            r.json()["error"].as_str().unwrap_or_default().to_string(),
        )
    };
    assert_eq!(
        refusal(call("/threads/t", "")),
        (
            403,
            "caller attestation requires session credentials".into()
        )
    );
    assert_eq!(
        refusal(call("/threads/t", "Pinboard-Session-Secret: wrong\r\n")),
        (403, "invalid session secret".into())
    );
    let r = get_with(
        &f,
        "/threads/t",
        "Host: e\r\nPinboard-From: /threads/caller-1\r\nPinboard-Session: nobody\r\nPinboard-Session-Secret: x\r\n",
    );
    assert_eq!(refusal(r), (403, "unknown session".into()));
    let with_from = |from: &str, depth: &str| {
        get_with(
            &f,
            "/threads/t",
            &format!(
                "Host: e\r\nPinboard-From: {from}\r\nPinboard-Session: {sa}\r\nPinboard-Session-Secret: secret-a-0123456789abcdef\r\n{depth}"
            ),
        )
    };
    assert_eq!(
        refusal(with_from("caller-1", "")),
        (403, "malformed caller claim".into())
    );
    assert_eq!(
        refusal(with_from("/threads/not-held", "")),
        (403, "caller placement mismatch".into())
    );
    for depth in ["x", "1234567890", ""] {
        let r = with_from(
            "/threads/caller-1",
            &format!("Pinboard-Subrequest-Depth: {depth}\r\n"),
        );
        assert_eq!(
            refusal(r),
            (403, "malformed subrequest depth".into()),
            "{depth:?}"
        );
    }
    let r = with_from("/threads/caller-1", "Pinboard-Subrequest-Depth: 51\r\n");
    assert_eq!(
        (r.status, r.text().as_str()),
        (508, r#"{"error":"subrequest depth exceeded"}"#)
    );
    assert_eq!(
        with_from("/threads/caller-1", "Pinboard-Subrequest-Depth: 50\r\n").status,
        200
    );
    let r = get_with(
        &f,
        "/docs/elsewhere",
        &format!(
            "Host: e\r\nPinboard-From: /threads/caller-1\r\nPinboard-Session: {sa}\r\nPinboard-Session-Secret: secret-a-0123456789abcdef\r\n"
        ),
    );
    assert_eq!(refusal(r), (403, "target outside caller scope".into()));
}

#[test]
fn data_plane_passport() {
    let (_dir, file) = config_file("[namespaces.\"/threads\"]\nscopes = [\"threads:read\"]\n");
    let f = Fixture::new(&[("PINBOARD_CONFIG", file.as_str())]);
    f.warm();
    let a = TestWorker::start("secret-a");
    let sa = f.registered(&a, "a");
    let bearer = |t: &str| format!("Host: e\r\nAuthorization: Bearer {t}\r\n");
    let refusal = |r: Reply| {
        (
            r.status,
            r.json()["error"].as_str().unwrap_or_default().to_string(),
        )
    };

    assert_eq!(
        refusal(get(f.node.addr, "/threads/p1", None)),
        (401, "authentication required".into())
    );
    assert_eq!(
        refusal(get_with(&f, "/threads/p1", &bearer("garbage"))),
        (401, "invalid credential".into())
    );
    let reader = credential(&json!({
        "sub": "user-1", "scope": "threads:read pinboard:worker other", "team": "blue",
        "pinboard": {"namespaces": ["*"]}, "exp": 4_000_000_000u64
    }));
    let lacking = credential(&json!({"sub": "user-2", "scope": "other", "exp": 4_000_000_000u64}));
    assert_eq!(
        refusal(get_with(&f, "/threads/p1", &bearer(&lacking))),
        (403, "insufficient scope".into())
    );
    assert_eq!(
        refusal(get_with(&f, "/docs/p1", &bearer(&reader))),
        (403, "namespace not allowed".into())
    );
    let fenced = credential(
        &json!({"sub": "u", "scope": "threads:read", "pinboard": {"namespaces": ["/docs"]}, "exp": 4_000_000_000u64}),
    );
    assert_eq!(
        refusal(get_with(&f, "/threads/p1", &bearer(&fenced))),
        (403, "namespace not allowed".into())
    );

    let seen = echo(&get_with(&f, "/threads/p1", &bearer(&reader)));
    assert!(
        seen["headers"].get("authorization").is_none(),
        "the credential the passport consumed stays at the node (forwards.keep_authorization)"
    );
    let acct = &attested_claims(&seen)["acct"];
    assert_eq!(acct["sub"], "user-1");
    assert_eq!(acct["scopes"], json!(["threads:read", "other"]));
    assert_eq!(acct["claims"]["team"], "blue");
    assert!(acct["claims"].get("pinboard").is_none());

    // A verified caller bypasses the passport.
    assert_eq!(owner_of(&f, "default", "/threads", "p1"), sa);
    let r = get_with(
        &f,
        "/threads/p2",
        &format!(
            "Host: e\r\nPinboard-From: /threads/p1\r\nPinboard-Session: {sa}\r\nPinboard-Session-Secret: secret-a-0123456789abcdef\r\n"
        ),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(attested_claims(&echo(&r)).get("acct").is_none());
}

/// Redis calls per command since the last `CONFIG RESETSTAT`, from `INFO commandstats`
/// (without the INFO and CONFIG calls the test itself makes; commands run by scripts count).
fn command_counts(f: &Fixture) -> std::collections::BTreeMap<String, u64> {
    f.cli(&["INFO", "commandstats"])
        .lines()
        .filter_map(|line| {
            let (name, stats) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = stats.split(',').find_map(|kv| kv.strip_prefix("calls="))?;
            Some((name.to_string(), calls.parse().ok()?))
        })
        .filter(|(name, _)| name != "info" && !name.starts_with("config"))
        .collect()
}

#[test]
fn a_placed_id_costs_one_redis_round_trip() {
    // A one-hour lease: no fleet claim or heartbeat lands inside the measured window.
    let (f, _worker, _) = warm_fleet(&[("PINBOARD_LEASE_TTL_MS", "3600000")]);
    let mut c = Client::connect(f.node.addr);
    assert_eq!(
        c.request(b"GET /threads/steady HTTP/1.1\r\nHost: e\r\n\r\n")
            .status,
        200
    );
    // Commands a script runs count too: one EVALSHA per request, and inside it the steady
    // path's reads (the row, the owner's copy, the overwritten marker, the clock).
    let per_request = [("evalsha", 1), ("hget", 2), ("hexists", 1), ("time", 1)];
    let expected = |n: u64| -> std::collections::BTreeMap<String, u64> {
        per_request
            .iter()
            .map(|(c, k)| (c.to_string(), k * n))
            .collect()
    };
    let mut steady = |n: u64| {
        f.cli(&["CONFIG", "RESETSTAT"]);
        for _ in 0..n {
            assert_eq!(
                c.request(b"GET /threads/steady/x HTTP/1.1\r\nHost: e\r\n\r\n")
                    .status,
                200
            );
        }
        command_counts(&f)
    };
    // The node's background work of its first moments as the serving fleet (the sweeper's
    // first claim and pass, the mirror's first poll, each within 100 ms of the first claim) is
    // over once, past those 100 ms, one request costs exactly its own calls.
    std::thread::sleep(Duration::from_millis(300));
    assert!(support::node::eventually(
        Duration::from_secs(5),
        || steady(1) == expected(1)
    ));
    assert_eq!(steady(25), expected(25));
}

#[test]
fn metrics_speak_prometheus_text_unless_openmetrics_is_asked_for() {
    let (f, _worker, _) = warm_fleet(&[]);
    assert_eq!(get(f.node.addr, "/threads/m1", None).status, 200);
    assert_eq!(get(f.node.addr, "/nowhere/m1", None).status, 404);
    let operator = support::node::token("ops", &["pinboard:operator"], &["*"]);
    let r = get(f.node.addr, "/metrics", Some(&operator));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.header("content-type"),
        Some("text/plain; version=0.0.4; charset=utf-8"),
        "Prometheus text unless OpenMetrics is asked for"
    );
    let text = r.text();
    for line in [
        "# TYPE pinboard_resolutions_total counter",
        "pinboard_resolutions_total{outcome=\"forward\"} 1",
        "pinboard_resolutions_total{outcome=\"unknown-ns\"} 1",
        "pinboard_serving 1",
    ] {
        assert!(text.contains(line), "{line} in:\n{text}");
    }
    assert!(!text.contains("# EOF"), "{text}");
    assert!(
        text.lines().any(|l| l.starts_with("pinboard_connections ")),
        "{text}"
    );
    let mut c = Client::connect(f.node.addr);
    let open = c.request(
        format!(
            "GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {operator}\r\n\
             Accept: application/openmetrics-text; version=1.0.0, text/plain;q=0.5\r\n\r\n"
        )
        .as_bytes(),
    );
    assert_eq!(
        open.header("content-type"),
        Some("application/openmetrics-text; version=1.0.0; charset=utf-8")
    );
    assert!(open.text().contains("# TYPE pinboard_resolutions counter"));
    assert!(open.text().ends_with("# EOF\n"));

    let refusal = |token: Option<&str>| {
        let r = get(f.node.addr, "/metrics", token);
        (
            r.status,
            r.json()["error"].as_str().unwrap_or_default().to_string(),
        )
    };
    assert_eq!(refusal(None), (401, "unauthorized".into()));
    assert_eq!(
        refusal(Some(&f.token)),
        (403, "forbidden".into()),
        "a worker credential"
    );
    let narrow = support::node::token("ops", &["pinboard:operator"], &["/threads"]);
    assert_eq!(
        refusal(Some(&narrow)),
        (403, "forbidden".into()),
        "not every namespace"
    );
    let hostnames = pinboard::passport::mint(
        support::node::SECRET,
        &pinboard::passport::TokenRequest {
            sub: "ops".into(),
            scopes: vec!["pinboard:operator".into()],
            namespaces: vec!["*".into()],
            hostnames: vec!["h1".into()],
            ttl_secs: 60,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(
        refusal(Some(&hostnames)),
        (403, "forbidden".into()),
        "restricted hostnames"
    );

    let off = Fixture::new(&[("PINBOARD_METRICS", "false")]);
    let r = get(off.node.addr, "/metrics", Some(&operator));
    assert_eq!(
        (r.status, r.text().as_str()),
        (404, r#"{"error":"unknown namespace"}"#)
    );
}

/// A steady resolve reads the owner's liveness entry, not its copy, and names no URL or
/// secret: a node that has never met the session (another node of the fleet, or this one
/// after a restart) reads them from the copy once, and forwards at the row's epoch.
#[test]
fn a_node_that_never_met_the_owner_reads_its_copy_once() {
    let (f, worker, session) = warm_fleet(&[]);
    let placed = echo(&get(f.node.addr, "/threads/met", None));
    let epoch = placed["headers"]["pinboard-epoch"].clone();
    let other = support::node::Node::start(
        &f.redis.url(),
        &[
            ("PINBOARD_SHARDS", "4"),
            ("PINBOARD_VERIFY_TIMEOUT_MS", "500"),
        ],
    );
    for _ in 0..3 {
        let seen = echo(&get(other.addr, "/threads/met", None));
        assert_eq!(seen["headers"]["pinboard-epoch"], epoch);
        let claims = claims_of(
            seen["headers"]["pinboard-attestation"].as_str().unwrap(),
            &worker.secret(),
        );
        assert_eq!(claims["aud"], session);
    }
    let bucket = pinboard::store::bucket_of("met", 4);
    let alive = f.cli(&["HGET", &f.keys.bucket(bucket).alive, &session]);
    // `{expiry} {hostname}`, the hostname empty in single mode (the cli trims the space).
    assert!(alive.trim_end().parse::<u64>().is_ok(), "{alive:?}");
    // A deregistered owner's entry goes with its copy: its rows are free again.
    assert_eq!(
        f.post("deregister", &f.token, &json!({"sessionId": session}))
            .status,
        200
    );
    assert!(
        f.cli(&["HGET", &f.keys.bucket(bucket).alive, &session])
            .is_empty()
    );
}
