//! The ownership ledger (issue 27) against a real node, a real redis-server and real workers:
//! every change of an instance's owner or fence appears once in its bucket's stream, with its
//! reason, sessions and epoch, appended by the script that made it; `GET /registry/history`
//! reads an id's chain newest first, a page at a time, and answers "who owned X at T" in one
//! page; the steady path and a ledger turned off write nothing; the stream keeps its cap, and
//! the sweeper prunes the index of entries the cap trimmed.

mod support;

use std::time::Duration;

use serde_json::{Value, json};
use support::fleet::{Fixture, SHARDS};
use support::http::{Client, Reply, get};
use support::node::{credential, eventually, token};
use support::worker::TestWorker;

use pinboard::store::bucket_of;

/// The operator whose `sub` the ledger names for its acts.
const OPERATOR: &str = "ops-alice";

fn ops() -> String {
    token(OPERATOR, &["pinboard:operator"], &["*"])
}

fn history_reply(f: &Fixture, query: &str, credential: Option<&str>) -> Reply {
    get(
        f.node.addr,
        &format!("/registry/history?{query}"),
        credential,
    )
}

/// The history answer for `query`, which must be a 200.
fn history(f: &Fixture, query: &str) -> Value {
    let r = history_reply(f, query, Some(&ops()));
    assert_eq!(r.status, 200, "{query}: {}\n{}", r.text(), f.node.log());
    r.json()
}

/// The entries of `/threads`'s `id`, newest first (one page of up to 1000).
fn entries(f: &Fixture, id: &str) -> Vec<Value> {
    let h = history(f, &format!("ns=/threads&id={id}&limit=1000"));
    assert_eq!((&h["next"], &h["truncated"]), (&Value::Null, &json!(false)));
    h["entries"].as_array().unwrap().clone()
}

/// (reason, from, to) of each entry.
fn moves(entries: &[Value]) -> Vec<(String, Value, Value)> {
    entries
        .iter()
        .map(|e| {
            let reason = e["reason"].as_str().unwrap().to_owned();
            (reason, e["from"].clone(), e["to"].clone())
        })
        .collect()
}

fn epoch_of(f: &Fixture, id: &str) -> String {
    f.row("/threads", id).unwrap()["epoch"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// How many entries the ledger stream of `bucket` holds.
fn xlen(f: &Fixture, bucket: u32) -> u64 {
    f.cli(&["XLEN", &f.keys.bucket(bucket).ledger])
        .parse()
        .unwrap()
}

fn served_by(f: &Fixture, id: &str, worker: &TestWorker) {
    let r = get(f.node.addr, &format!("/threads/{id}/x"), None);
    assert_eq!(r.status, 200, "{}\n{}", r.text(), f.node.log());
    assert!(
        worker
            .requests()
            .iter()
            .any(|s| s.path == format!("/threads/{id}/x")),
        "{id} not served by {}",
        worker.url()
    );
}

fn wind_down(f: &Fixture, id: &str, deadline: Value) {
    let body = json!({"namespace": "/threads", "id": id, "deadline": deadline});
    let r = f.post("wind_down", &ops(), &body);
    assert_eq!(r.json(), json!({"queued": true}), "{}", f.node.log());
}

/// Waits, heartbeating `survivor`, until `done()`.
fn waiting_on(f: &Fixture, survivor: (&TestWorker, &str), done: impl Fn() -> bool) {
    let waited = eventually(Duration::from_secs(15), || {
        assert_eq!(f.heartbeat(survivor.0, survivor.1, json!({})).status, 200);
        std::thread::sleep(Duration::from_millis(100));
        done()
    });
    assert!(waited, "{}", f.node.log());
}

#[test]
fn placements_releases_wind_downs_and_a_re_placement_each_append_once() {
    let (f, first, s1) = Fixture::with_worker(&[("PINBOARD_LEASE_TTL_MS", "2000")], "first");

    served_by(&f, "a1", &first);
    let e1 = epoch_of(&f, "a1");
    let placed = entries(&f, "a1");
    assert_eq!(placed.len(), 1, "{placed:?}");
    assert_eq!(
        placed[0],
        json!({"at": placed[0]["at"], "epoch": e1, "from": null, "to": s1, "reason": "placed"})
    );
    let at = placed[0]["at"].as_u64().unwrap();
    let now = pinboard::clock::now_ms();
    assert!(at <= now && now - at < 10_000, "at {at}, now {now}");

    // The worker gives it back; the next request places it afresh.
    let release = json!([{"sessionId": s1, "namespace": "/threads", "id": "a1", "epoch": e1}]);
    let r = f.post("release", &f.token, &release);
    assert_eq!(r.json(), json!({"released": 1}));
    // A stale release frees nothing and appends nothing.
    assert_eq!(
        f.post("release", &f.token, &release).json(),
        json!({"released": 0})
    );
    served_by(&f, "a1", &first);
    let e2 = epoch_of(&f, "a1");
    // An operator fences it, then lifts the fence.
    wind_down(&f, "a1", json!(60));
    let fence = f.row("/threads", "a1").unwrap()["expiry"].as_u64().unwrap();
    wind_down(&f, "a1", Value::Null);

    // The owner stops heartbeating; once its lease ran out a request re-places the id on the
    // other worker.
    let second = TestWorker::start("second");
    let s2 = f.registered(&second, "w2");
    let dead_at = pinboard::clock::now_ms() + 2000;
    waiting_on(&f, (&second, &s2), || {
        pinboard::clock::now_ms() > dead_at + 200
    });
    served_by(&f, "a1", &second);
    let e3 = epoch_of(&f, "a1");

    let all = entries(&f, "a1");
    assert_eq!(
        moves(&all),
        [
            ("re-placed-dead-owner".into(), json!(s1), json!(s2)),
            ("wind-down".into(), json!(s1), json!(s1)),
            ("wind-down".into(), json!(s1), json!(s1)),
            ("placed".into(), Value::Null, json!(s1)),
            ("released".into(), json!(s1), Value::Null),
            ("placed".into(), Value::Null, json!(s1)),
        ]
    );
    let epochs: Vec<&str> = all.iter().map(|e| e["epoch"].as_str().unwrap()).collect();
    assert_eq!(epochs, [&e3, &e2, &e2, &e2, &e1, &e1]);
    assert!(e3.parse::<u64>().unwrap() > e2.parse::<u64>().unwrap());
    // The operator's acts name the operator and the fence, set then cleared; no other does.
    assert_eq!(
        (&all[2]["by"], &all[2]["fence"]),
        (&json!(OPERATOR), &json!(fence))
    );
    assert_eq!(
        (&all[1]["by"], &all[1]["fence"]),
        (&json!(OPERATOR), &Value::Null)
    );
    for e in [&all[0], &all[3], &all[4], &all[5]] {
        assert!(e.get("by").is_none() && e.get("fence").is_none(), "{e}");
    }
    let times: Vec<u64> = all.iter().map(|e| e["at"].as_u64().unwrap()).collect();
    assert!(times.windows(2).all(|w| w[0] >= w[1]), "{times:?}");
    // Six changes, six entries: the bucket holds no other.
    assert_eq!(xlen(&f, bucket_of("a1", SHARDS)), 6);

    // Who owned a1 at T: one call with since=T; its last entry is the one in force at T.
    let at_time = |t: u64| {
        let h = history(&f, &format!("ns=/threads&id=a1&since={t}"));
        assert_eq!(h["next"], Value::Null, "one page");
        h["entries"].as_array().unwrap().clone()
    };
    let before_release = times[4] - 1;
    let page = at_time(before_release);
    assert_eq!(page.len(), 6);
    assert_eq!(page[5]["to"], json!(s1), "s1 held it before the release");
    let released = at_time(times[4]);
    assert_eq!(released.len(), 5);
    assert_eq!(released[4]["to"], Value::Null, "nobody held it right after");
    let now = at_time(pinboard::clock::now_ms());
    assert_eq!(moves(&now), [moves(&all)[0].clone()], "s2 holds it now");
    let before_all = at_time(times[5] - 1);
    assert_eq!(before_all.len(), 6);
    assert!(
        before_all[5]["at"].as_u64().unwrap() > times[5] - 1,
        "before its first entry the id had no owner: the oldest entry is after T"
    );
}

#[test]
fn the_steady_path_appends_nothing() {
    let (f, worker, session) = Fixture::with_worker(&[], "steady");
    served_by(&f, "s1", &worker);
    let bucket = bucket_of("s1", SHARDS);
    assert_eq!(xlen(&f, bucket), 1);
    let mut client = Client::connect(f.node.addr);
    for _ in 0..1000 {
        let r = client.request(b"GET /threads/s1/x HTTP/1.1\r\nHost: t\r\n\r\n");
        assert_eq!(r.status, 200);
    }
    assert_eq!(xlen(&f, bucket), 1, "1000 steady requests appended nothing");
    let e = entries(&f, "s1");
    assert_eq!(moves(&e), [("placed".into(), Value::Null, json!(session))]);
}

#[test]
fn a_reclaim_by_the_next_session_is_one_entry() {
    let (f, worker, first) = Fixture::with_worker(&[], "reclaims");
    served_by(&f, "r1", &worker);
    let epoch = epoch_of(&f, "r1");
    // The worker comes back under a new session, holding r1 still; r2 it never held here.
    let r = f.register(
        &worker,
        "w1",
        json!({"prevSessionId": first, "instances": {"/threads": ["r1", "r2"]}}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let next = r.json()["sessionId"].as_str().unwrap().to_owned();
    assert_eq!(
        r.json()["duplicates"],
        json!([{"ns": "/threads", "id": "r2"}])
    );
    let e = entries(&f, "r1");
    assert_eq!(
        moves(&e),
        [
            ("reclaimed".into(), json!(first), json!(next)),
            ("placed".into(), Value::Null, json!(first)),
        ]
    );
    assert_eq!(e[0]["epoch"], json!(epoch), "a reclaim keeps the epoch");
    assert!(entries(&f, "r2").is_empty());
}

/// A node sweeping every 100 ms with a lease of a second, `id` placed on a worker that will
/// never heartbeat again (its session `dying`, the row's epoch), and a live one (`heir`).
struct Succession {
    f: Fixture,
    dying: String,
    epoch: String,
    heir: (TestWorker, String),
    _dead: TestWorker,
}

/// A lease of a second, a sweep every 100 ms.
const SWEEPING: &[(&str, &str)] = &[
    ("PINBOARD_LEASE_TTL_MS", "1000"),
    ("PINBOARD_SWEEP_INTERVAL_MS", "100"),
];

fn succession(id: &str) -> Succession {
    let f = Fixture::new(SWEEPING);
    f.warm();
    let dead = TestWorker::start("dying");
    let dying = f.registered(&dead, "w-dying");
    served_by(&f, id, &dead);
    let epoch = epoch_of(&f, id);
    let heir = TestWorker::start("heir");
    let session = f.registered(&heir, "w-heir");
    Succession {
        f,
        dying,
        epoch,
        heir: (heir, session),
        _dead: dead,
    }
}

#[test]
fn the_sweepers_gc_of_a_dead_owners_row_is_one_entry() {
    let Succession {
        f,
        dying,
        epoch,
        heir,
        ..
    } = succession("g1");
    // The dying worker never heartbeats again: a lease past its expiry its row goes.
    waiting_on(&f, (&heir.0, &heir.1), || f.row("/threads", "g1").is_none());
    let e = entries(&f, "g1");
    assert_eq!(
        moves(&e),
        [
            ("swept".into(), json!(dying), Value::Null),
            ("placed".into(), Value::Null, json!(dying)),
        ]
    );
    assert_eq!(e[0]["epoch"], json!(epoch));
}

#[test]
fn a_wake_of_a_dead_owners_instance_is_its_placeholder_then_its_placement() {
    let Succession {
        f,
        dying: old,
        epoch,
        heir: (heir, new),
        ..
    } = succession("t1");
    let wake_at = pinboard::clock::now_ms() + 1200;
    let schedule = json!([{"sessionId": old, "namespace": "/threads", "id": "t1",
        "epoch": epoch, "wakeAt": wake_at}]);
    assert_eq!(
        f.post("schedule", &f.token, &schedule).json(),
        json!({"scheduled": 1})
    );
    let woken =
        |worker: &TestWorker| (worker.requests().iter()).any(|s| s.path == "/threads/t1/_wake");
    waiting_on(&f, (&heir, &new), || woken(&heir));
    let e = entries(&f, "t1");
    assert_eq!(
        moves(&e),
        [
            ("woken".into(), Value::Null, json!(new)),
            ("woken".into(), json!(old), Value::Null),
            ("placed".into(), Value::Null, json!(old)),
        ]
    );
    assert_eq!(e[1]["epoch"], json!(epoch), "the dead owner's row, retired");
    assert_eq!(
        e[0]["epoch"],
        json!(epoch_of(&f, "t1")),
        "the wake's placement"
    );
}

#[test]
fn history_pages_newest_first_by_limit_and_cursor() {
    let (f, worker, _) = Fixture::with_worker(&[], "pages");
    served_by(&f, "p1", &worker);
    for i in 0..6 {
        wind_down(&f, "p1", if i % 2 == 0 { json!(60) } else { Value::Null });
    }
    let all = entries(&f, "p1");
    assert_eq!(all.len(), 7);
    let mut paged = Vec::new();
    let mut query = "ns=/threads&id=p1&limit=3".to_owned();
    let mut pages = 0;
    loop {
        let h = history(&f, &query);
        pages += 1;
        let page = h["entries"].as_array().unwrap();
        assert!(page.len() <= 3);
        paged.extend(page.iter().cloned());
        match h["next"].as_str() {
            Some(next) => query = format!("ns=/threads&id=p1&limit=3&cursor={next}"),
            None => break,
        }
    }
    assert_eq!((pages, &paged), (3, &all));
    // The default page is 100.
    let h = history(&f, "ns=/threads&id=p1");
    assert_eq!(h["entries"].as_array().unwrap().len(), 7);
    // since: every entry newer than it, and the first at or before it.
    let times: Vec<u64> = all.iter().map(|e| e["at"].as_u64().unwrap()).collect();
    let since = times[4];
    let h = history(&f, &format!("ns=/threads&id=p1&since={since}"));
    let cut = times.iter().position(|t| *t <= since).unwrap();
    assert_eq!(h["entries"].as_array().unwrap(), &all[..=cut]);
    assert_eq!(h["next"], Value::Null);
    // An id without history, and one of another namespace.
    assert_eq!(
        history(&f, "ns=/threads&id=never"),
        json!({"entries": [], "next": null, "truncated": false})
    );
    assert_eq!(
        history(&f, "ns=/docs&id=p1"),
        json!({"entries": [], "next": null, "truncated": false})
    );
}

#[test]
fn bad_asks_are_400_and_out_of_scope_403() {
    let (f, worker, _) = Fixture::with_worker(&[], "asks");
    // Two ids of one bucket.
    let bucket = bucket_of("b1", SHARDS);
    let b2 = (2..)
        .map(|i| format!("b{i}"))
        .find(|id| bucket_of(id, SHARDS) == bucket)
        .unwrap();
    served_by(&f, "b1", &worker);
    served_by(&f, &b2, &worker);
    let ops = ops();
    let refused = |query: &str, who: Option<&str>| {
        let r = history_reply(&f, query, who);
        (r.status, r.json())
    };
    // (query, the 400's error)
    let mut cases: Vec<(String, &str)> = Vec::new();
    for query in ["id=b1", "ns=threads&id=b1", "ns=/a/b&id=b1", "ns=&id=b1"] {
        cases.push((query.into(), "invalid namespace"));
    }
    for id in ["", "&id=", "&id=a%2Fb", "&id=.."] {
        cases.push((format!("ns=/threads{id}"), "invalid instance id"));
    }
    let env = "env requires hostname-aware mode";
    cases.push(("ns=/threads&id=b1&env=prod".into(), env));
    let limit = "invalid limit: expected a whole number from 1 to 1000";
    for bad in ["0", "1001", "x", "-1"] {
        cases.push((format!("ns=/threads&id=b1&limit={bad}"), limit));
    }
    for bad in ["x", "-5", "1.5", "+1"] {
        let since = "invalid since: expected a time in ms";
        cases.push((format!("ns=/threads&id=b1&since={bad}"), since));
    }
    for bad in ["abc", "1", "1-", "-", "+", "1-2-3"] {
        cases.push((format!("ns=/threads&id=b1&cursor={bad}"), "invalid cursor"));
    }
    for (query, error) in &cases {
        assert_eq!(
            refused(query, Some(&ops)),
            (400, json!({ "error": error })),
            "{query}"
        );
    }
    // A cursor naming another id's entry reads nothing of it.
    let index = f.cli(&["HGETALL", &f.keys.bucket(bucket).ledger_last]);
    let lines: Vec<&str> = index.lines().collect();
    let b2_entry = lines
        .chunks(2)
        .find(|pair| pair[0].ends_with(&format!("\0{b2}")))
        .map(|pair| pair[1])
        .unwrap();
    assert_eq!(
        refused(&format!("ns=/threads&id=b1&cursor={b2_entry}"), Some(&ops)),
        (400, json!({"error": "invalid cursor"}))
    );
    let own = history_reply(
        &f,
        &format!("ns=/threads&id={b2}&cursor={b2_entry}"),
        Some(&ops),
    );
    assert_eq!(own.json()["entries"].as_array().unwrap().len(), 1);
    // A cursor of an entry no longer kept: nothing, and the chain said cut.
    assert_eq!(
        history(&f, "ns=/threads&id=b1&cursor=1-0"),
        json!({"entries": [], "next": null, "truncated": true})
    );
    // Out of scope: another namespace's operator, a worker credential, none at all.
    let elsewhere = token("ops-bob", &["pinboard:operator"], &["/docs"]);
    assert_eq!(
        refused("ns=/threads&id=b1", Some(&elsewhere)),
        (403, json!({"error": "namespace not allowed: /threads"}))
    );
    assert_eq!(
        refused("ns=/threads&id=b1", Some(&f.token)),
        (403, json!({"error": "forbidden"}))
    );
    assert_eq!(
        refused("ns=/threads&id=b1", None),
        (401, json!({"error": "unauthorized"}))
    );
    // Only GET.
    let r = f.post("history", &ops, &json!({}));
    assert_eq!(r.status, 405);
}

/// A raw GET with a `Host` header: hostname-aware mode places by it.
fn get_from(f: &Fixture, host: &str, path: &str) -> Reply {
    let raw = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    Client::connect(f.node.addr).request(raw.as_bytes())
}

#[test]
fn hostname_aware_a_takeover_fence_is_an_entry_and_env_is_judged() {
    let f = Fixture::new(&[("PINBOARD_HOSTNAME_AWARE", "true")]);
    f.warm();
    let (a, c) = (TestWorker::start("a"), TestWorker::start("c"));
    let r = f.register(
        &a,
        "a",
        json!({"namespaces": ["/threads"], "hostname": "h1", "env": "e1"}),
    );
    let sa = r.json()["sessionId"].as_str().unwrap().to_owned();
    f.register(
        &c,
        "c",
        json!({"namespaces": ["/threads"], "hostname": "h2", "env": "e1"}),
    );
    assert_eq!(get_from(&f, "h1", "/threads/x1/y").status, 200);
    // Another hostname of the env asks for it: the row is fenced for a lease (wind_down).
    let r = get_from(&f, "h2", "/threads/x1/y");
    assert_eq!(r.status, 503, "{}", r.text());
    let r = get_from(&f, "h2", "/threads/x1/y");
    assert_eq!(r.status, 503, "the fence is set once");
    let h = history(&f, "ns=/threads&id=x1&env=E1");
    let e = h["entries"].as_array().unwrap();
    assert_eq!(
        moves(e),
        [
            ("takeover".into(), json!(sa), json!(sa)),
            ("placed".into(), Value::Null, json!(sa)),
        ]
    );
    assert!(e[0]["fence"].as_u64().unwrap() > e[0]["at"].as_u64().unwrap());
    assert!(e[0].get("by").is_none());

    let refused = |query: &str, who: &str| {
        let r = history_reply(&f, query, Some(who));
        (r.status, r.json())
    };
    assert_eq!(
        refused("ns=/threads&id=x1", &ops()),
        (
            400,
            json!({"error": "env is required in hostname-aware mode"})
        )
    );
    let claims = |envs: Value, hostnames: Option<Value>| {
        let mut pinboard = json!({"namespaces": ["/threads"], "allowedBackendHosts": [],
            "envs": envs});
        if let Some(h) = hostnames {
            pinboard["hostnames"] = h;
        }
        credential(&json!({"sub": "ops-e", "scope": "pinboard:operator",
            "exp": pinboard::clock::now_secs() + 600, "pinboard": pinboard}))
    };
    assert_eq!(
        refused("ns=/threads&id=x1&env=e1", &claims(json!(["e2"]), None)),
        (403, json!({"error": "env not allowed: e1"}))
    );
    assert_eq!(
        refused("ns=/threads&id=x1&env=e1", &claims(json!(["e1"]), None)).0,
        200
    );
    // Limited to some hostnames: the history of an id whose row names one of them.
    let only = |host: &str| claims(json!(["e1"]), Some(json!([host])));
    assert_eq!(refused("ns=/threads&id=x1&env=e1", &only("h1")).0, 200);
    assert_eq!(
        refused("ns=/threads&id=x1&env=e1", &only("h2")),
        (403, json!({"error": "forbidden"}))
    );
}

#[test]
fn with_the_ledger_off_nothing_is_appended() {
    let (f, worker, session) =
        Fixture::with_worker(&[("PINBOARD_LEDGER__ENABLED", "false")], "off");
    served_by(&f, "o1", &worker);
    let epoch = epoch_of(&f, "o1");
    wind_down(&f, "o1", json!(60));
    let release =
        json!([{"sessionId": session, "namespace": "/threads", "id": "o1", "epoch": epoch}]);
    assert_eq!(
        f.post("release", &f.token, &release).json(),
        json!({"released": 1})
    );
    for bucket in 0..SHARDS {
        let keys = f.keys.bucket(bucket);
        assert_eq!(f.cli(&["EXISTS", &keys.ledger, &keys.ledger_last]), "0");
    }
    assert!(entries(&f, "o1").is_empty());
}

#[test]
fn the_stream_keeps_its_cap_and_the_sweeper_prunes_what_it_trimmed() {
    let (f, worker, _) = Fixture::with_worker(
        &[
            ("PINBOARD_LEDGER__MAX_ENTRIES_PER_BUCKET", "100"),
            ("PINBOARD_SWEEP_INTERVAL_MS", "100"),
        ],
        "capped",
    );
    served_by(&f, "c1", &worker);
    let bucket = bucket_of("c1", SHARDS);
    let keys = f.keys.bucket(bucket);
    // Index fields of ids whose entries the cap has trimmed (older than any entry kept), here
    // and in a bucket whose stream holds nothing: the sweeper prunes them.
    let empty = (0..SHARDS).find(|b| *b != bucket).unwrap();
    for b in [bucket, empty] {
        for ghost in ["ghost-1", "ghost-2"] {
            f.cli(&["HSET", &f.keys.bucket(b).ledger_last, ghost, "1-0"]);
        }
    }
    for i in 0..350 {
        wind_down(&f, "c1", if i % 2 == 0 { json!(60) } else { Value::Null });
    }
    let kept = xlen(&f, bucket);
    assert!((100..=250).contains(&kept), "{kept} entries kept of 351");
    // The chain ends where the cap cut it.
    let h = history(&f, "ns=/threads&id=c1&limit=1000");
    assert_eq!(h["entries"].as_array().unwrap().len() as u64, kept);
    assert_eq!((&h["next"], &h["truncated"]), (&Value::Null, &json!(true)));
    let field_count = |b: u32| f.cli(&["HLEN", &f.keys.bucket(b).ledger_last]);
    assert!(
        eventually(Duration::from_secs(5), || field_count(bucket) == "1"
            && field_count(empty) == "0"),
        "{} {}\n{}",
        field_count(bucket),
        field_count(empty),
        f.node.log()
    );
    assert_eq!(f.cli(&["HEXISTS", &keys.ledger_last, "ghost-1"]), "0");
    assert!(f.node.log().contains("ledger="), "{}", f.node.log());
}
