//! The sweeper (contract §6) across real nodes sharing one real redis-server: one node at a
//! time holds the lease, another takes it over when the holder is killed, a graceful stop gives
//! it up; and its GC removes what a dead worker left behind with nobody registering.

mod support;

use std::time::{Duration, Instant};

use serde_json::json;
use support::fleet::{Fixture, SHARDS};
use support::http::get;
use support::node::{Node, eventually, token};
use support::redis::RedisServer;
use support::worker::TestWorker;

use pinboard::store::bucket_of;

const LEASE_MS: u64 = 1500;

/// A sample of this node's `/metrics`, by its line's name and labels (`0` when absent).
fn metric(node: &Node, sample: &str) -> u64 {
    let operator = token("ops", &["pinboard:operator"], &["*"]);
    let r = get(node.addr, "/metrics", Some(&operator));
    assert_eq!(r.status, 200, "{}", r.text());
    r.text()
        .lines()
        .find_map(|line| line.strip_prefix(sample)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0)
}

#[test]
fn one_node_sweeps_a_killed_holder_is_taken_over_and_a_stop_releases() {
    let redis = RedisServer::start();
    let lease = LEASE_MS.to_string();
    let start = |id: &str| {
        Node::start(
            &redis.url(),
            &[
                ("PINBOARD_LEASE_TTL_MS", lease.as_str()),
                ("PINBOARD_SWEEP_INTERVAL_MS", "100"),
                ("PINBOARD_NODE_ID", id),
            ],
        )
    };
    let mut nodes = [start("node-a"), start("node-b")];
    let key = support::keys(16).sweeper().to_owned();
    let holder = || redis.cli(&["GET", &key]);
    assert!(eventually(Duration::from_secs(5), || !holder().is_empty()));
    let first = holder();
    let (held, other) = if first == "node-a" { (0, 1) } else { (1, 0) };

    // For two leases the holder stays the holder, and only it sweeps.
    let until = Instant::now() + Duration::from_millis(2 * LEASE_MS);
    while Instant::now() < until {
        assert_eq!(holder(), first);
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(metric(&nodes[held], "pinboard_sweeps_total") > 0);
    assert_eq!(metric(&nodes[other], "pinboard_sweeps_total"), 0);

    // Killed, it cannot give the lease up: the other node takes the sweep over once the lease
    // has run out, within two leases of the kill.
    nodes[held].signal("KILL");
    let killed = Instant::now();
    let second = if first == "node-a" {
        "node-b"
    } else {
        "node-a"
    };
    assert!(
        eventually(Duration::from_millis(2 * LEASE_MS), || holder() == second),
        "after {:?} the holder is {:?}",
        killed.elapsed(),
        holder()
    );
    assert!(eventually(Duration::from_secs(2), || {
        metric(&nodes[other], "pinboard_sweeps_total") > 0
    }));

    // A graceful stop gives the lease up at once.
    let status = nodes[other].stop();
    assert_eq!(status.code(), Some(0), "{}", nodes[other].log());
    assert_eq!(holder(), "", "released on SIGTERM");
    assert!(nodes[other].log().contains("sweeper lease released"));
}

#[test]
fn a_dead_workers_rows_go_unless_scheduled_or_fenced_and_markers_without_a_row_go() {
    // A lease long enough that the survivor's heartbeats keep it live on a loaded machine.
    let f = Fixture::new(&[
        ("PINBOARD_LEASE_TTL_MS", "3000"),
        ("PINBOARD_SWEEP_INTERVAL_MS", "100"),
    ]);
    f.warm();
    let worker = TestWorker::start("dies");
    let dead = f.registered(&worker, "w-dead");
    let survivor = TestWorker::start("lives");
    let live = f.registered(&survivor, "w-live");

    // Rows of both workers, as resolves would have written them.
    let ids: Vec<String> = (0..40).map(|i| format!("id-{i}")).collect();
    for (i, id) in ids.iter().enumerate() {
        let owner = if i % 2 == 0 { &dead } else { &live };
        f.put_row("/threads", id, json!({"sessionId": owner, "epoch": "7"}));
    }
    // The dead worker's rows that must stay: one scheduled to wake, one whose wind-down fence
    // has not passed. And a placeholder row that is not scheduled: it goes.
    let far = (pinboard::clock::now_ms() + 3_600_000).to_string();
    f.put_row(
        "/threads",
        "scheduled",
        json!({"sessionId": dead, "epoch": "3"}),
    );
    let bucket = bucket_of("scheduled", SHARDS);
    f.cli(&[
        "ZADD",
        &f.keys.wake(bucket, "default", "/threads"),
        &far,
        "scheduled",
    ]);
    f.put_row(
        "/threads",
        "fenced",
        json!({"sessionId": dead, "epoch": "4", "expiry": far.parse::<u64>().unwrap()}),
    );
    f.put_row(
        "/threads",
        "placeholder",
        json!({"sessionId": "", "hostname": "h"}),
    );
    // Markers: one for an id with a row stays, one without a row goes.
    for id in ["id-1", "gone"] {
        let bucket = bucket_of(id, SHARDS);
        f.cli(&[
            "HSET",
            &f.keys.overwritten(bucket, "default", "/threads"),
            id,
            "2",
        ]);
    }

    // The survivor keeps heartbeating; the other worker never does again.
    let started = Instant::now();
    let swept = eventually(Duration::from_secs(15), || {
        assert_eq!(f.heartbeat(&survivor, &live, json!({})).status, 200);
        std::thread::sleep(Duration::from_millis(100));
        (0..40)
            .step_by(2)
            .all(|i| f.row("/threads", &ids[i]).is_none())
    });
    assert!(swept, "after {:?}:\n{}", started.elapsed(), f.node.log());
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(f.row("/threads", id).is_some(), i % 2 == 1, "{id}");
    }
    assert!(
        f.row("/threads", "scheduled").is_some(),
        "a scheduled id stays"
    );
    assert!(f.row("/threads", "fenced").is_some(), "a fenced row stays");
    assert!(
        f.row("/threads", "placeholder").is_none(),
        "an unscheduled placeholder goes"
    );
    let marker = |id: &str| {
        let bucket = bucket_of(id, SHARDS);
        f.cli(&[
            "HEXISTS",
            &f.keys.overwritten(bucket, "default", "/threads"),
            id,
        ])
    };
    assert!(eventually(Duration::from_secs(2), || marker("gone") == "0"));
    assert_eq!(marker("id-1"), "1", "a marker whose id has a row stays");

    let swept_rows = metric(&f.node, "pinboard_swept_rows_total{kind=\"placement\"}");
    assert_eq!(
        swept_rows, 21,
        "20 rows of the dead worker and the placeholder"
    );
    assert_eq!(
        metric(&f.node, "pinboard_swept_rows_total{kind=\"overwritten\"}"),
        1
    );
    assert!(f.node.log().contains("sweep"), "{}", f.node.log());

    // The fleet gauges, from the mirror poll: one live worker per namespace now, the dead
    // worker's rows gone from the count.
    let live_gauge = "pinboard_fleet_workers{namespace=\"/threads\",state=\"live\"}";
    let beat = || assert_eq!(f.heartbeat(&survivor, &live, json!({})).status, 200);
    assert!(eventually(Duration::from_secs(8), || {
        beat();
        metric(&f.node, live_gauge) == 1
    }));
    // (The view is the mirror's last, up to a poll older than the sweep.)
    let rows_gauge = "pinboard_fleet_placement_rows{namespace=\"/threads\"}";
    assert!(
        eventually(Duration::from_secs(8), || {
            beat();
            metric(&f.node, rows_gauge) == 22
        }),
        "the survivor's 20 rows, the scheduled one and the fenced one: {}",
        metric(&f.node, rows_gauge)
    );

    // Its record, its copies and its namespace-list entries go too, a lease after its death,
    // by the mirror poll: nobody registers meanwhile.
    let pruned = eventually(Duration::from_secs(12), || {
        beat();
        std::thread::sleep(Duration::from_millis(200));
        f.session_record(&dead).is_none()
            && (0..SHARDS).all(|b| {
                f.bucket_record(b, &dead).is_none()
                    && !f.in_ns_list(b, "/threads", &dead)
                    && !f.in_ns_list(b, "/docs", &dead)
            })
    });
    assert!(pruned, "{}", f.node.log());
    assert!(
        f.node
            .log()
            .contains("mirror poll pruned dead worker records")
    );
    assert!(f.session_record(&live).is_some());
}

/// The `_wake`s `worker` received for `/threads/{id}`.
fn wakes_of(worker: &TestWorker, id: &str) -> Vec<support::worker::Seen> {
    let path = format!("/threads/{id}/_wake");
    worker
        .requests()
        .into_iter()
        .filter(|s| s.path == path)
        .collect()
}

#[test]
fn a_scheduled_instance_whose_worker_died_wakes_on_another_with_nobody_asking() {
    let f = Fixture::new(&[
        ("PINBOARD_LEASE_TTL_MS", "1000"),
        ("PINBOARD_SWEEP_INTERVAL_MS", "100"),
    ]);
    f.warm();
    let dying = TestWorker::start("dying-worker");
    let old = f.registered(&dying, "w-old");
    let heir = TestWorker::start("heir-worker");
    let new = f.registered(&heir, "w-new");
    // t1 is the dying worker's at epoch 5, and it scheduled a wake after its lease runs out.
    f.put_row("/threads", "t1", json!({"sessionId": old, "epoch": "5"}));
    let wake_at = pinboard::clock::now_ms() + 1500;
    let schedule = json!([{"sessionId": old, "namespace": "/threads", "id": "t1", "epoch": "5", "wakeAt": wake_at}]);
    assert_eq!(
        f.post("schedule", &f.token, &schedule).json(),
        json!({"scheduled": 1})
    );
    // The heir is still hydrating at the first wake, resident at the second.
    heir.set_activating(1);

    // The dying worker never heartbeats again; nobody asks for t1.
    let woken = eventually(Duration::from_secs(10), || {
        assert_eq!(f.heartbeat(&heir, &new, json!({})).status, 200);
        std::thread::sleep(Duration::from_millis(100));
        wakes_of(&heir, "t1").len() >= 2
    });
    assert!(woken, "{}", f.node.log());
    assert!(wakes_of(&dying, "t1").is_empty());
    let wakes = wakes_of(&heir, "t1");
    let epoch = wakes[0].header("pinboard-epoch").unwrap().to_owned();
    assert!(epoch.parse::<u64>().unwrap() > 5, "a fresh epoch: {epoch}");
    for wake in &wakes {
        assert_eq!(wake.method, "POST");
        assert!(wake.at.elapsed() < Duration::from_secs(30));
        let claims = support::attest::claims_of(
            wake.header("pinboard-attestation").unwrap(),
            &heir.secret(),
        );
        assert_eq!(claims["aud"], new.as_str());
        assert_eq!(claims["purpose"], "wake");
        assert_eq!(claims["inst"], "/threads/t1");
        assert_eq!(claims["epoch"], epoch.as_str());
        assert_eq!(wake.header("pinboard-epoch"), Some(epoch.as_str()));
    }
    assert_eq!(
        f.row("/threads", "t1").unwrap(),
        json!({"sessionId": new, "epoch": epoch})
    );
    // The 200 took the entry off the schedule: no third wake.
    let bucket = bucket_of("t1", SHARDS);
    let entry = || f.cli(&["ZSCORE", &f.keys.wake(bucket, "default", "/threads"), "t1"]);
    assert!(eventually(Duration::from_secs(2), || entry().is_empty()));
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(wakes_of(&heir, "t1").len(), 2);
    let overwritten = bucket_of("t1", SHARDS);
    assert_eq!(
        f.cli(&[
            "HGET",
            &f.keys.overwritten(overwritten, "default", "/threads"),
            "t1"
        ]),
        "5",
        "the dead owner's row was displaced like a resolve displaces it"
    );
}

/// A worker whose advertise URL carries a path gets its `_wake` under that path once (the
/// sweep once sent it with the path twice: `/edge/edge/threads/t1/_wake`).
#[test]
fn a_wake_goes_under_the_advertise_urls_path_once() {
    let f = Fixture::new(&[("PINBOARD_SWEEP_INTERVAL_MS", "100")]);
    f.warm();
    let worker = TestWorker::start("based-worker");
    worker.set_base("/edge");
    let session = f.registered(&worker, "w-based");
    f.put_row(
        "/threads",
        "t1",
        json!({"sessionId": session, "epoch": "3"}),
    );
    let schedule = json!([{"sessionId": session, "namespace": "/threads", "id": "t1", "epoch": "3",
                           "wakeAt": pinboard::clock::now_ms()}]);
    assert_eq!(
        f.post("schedule", &f.token, &schedule).json(),
        json!({"scheduled": 1})
    );
    let woken = eventually(Duration::from_secs(5), || {
        !wakes_of(&worker, "t1").is_empty()
    });
    assert!(
        woken,
        "{:?}\n{}",
        worker
            .requests()
            .iter()
            .map(|s| &s.path)
            .collect::<Vec<_>>(),
        f.node.log()
    );
}

#[test]
fn a_wake_that_schedules_again_keeps_its_new_entry() {
    let f = Fixture::new(&[("PINBOARD_SWEEP_INTERVAL_MS", "100")]);
    f.warm();
    let worker = TestWorker::start("only-worker");
    let session = f.registered(&worker, "w");
    let wake_key = f.keys.wake(bucket_of("t2", SHARDS), "default", "/threads");
    // Due now, at its live owner: woken there, at its own epoch.
    f.put_row(
        "/threads",
        "t2",
        json!({"sessionId": session, "epoch": "9"}),
    );
    let now = pinboard::clock::now_ms();
    worker.set_activating(1);
    f.cli(&["ZADD", &wake_key, &now.to_string(), "t2"]);
    // Between its first wake (202) and its second (200), the instance asks for another wake
    // an hour on: the 200 must not take the new entry away.
    assert!(eventually(Duration::from_secs(5), || !wakes_of(
        &worker, "t2"
    )
    .is_empty()));
    let later = (now + 3_600_000).to_string();
    f.cli(&["ZADD", &wake_key, &later, "t2"]);
    let wakes = wakes_of(&worker, "t2");
    assert_eq!(wakes[0].header("pinboard-epoch"), Some("9"));
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(f.cli(&["ZSCORE", &wake_key, "t2"]), later);
    assert_eq!(
        f.row("/threads", "t2").unwrap(),
        json!({"sessionId": session, "epoch": "9"}),
        "a placed row is woken where it is"
    );
}

#[test]
fn an_unreachable_owner_loses_the_placement_its_wake_made() {
    let f = Fixture::new(&[
        ("PINBOARD_LEASE_TTL_MS", "10000"),
        ("PINBOARD_SWEEP_INTERVAL_MS", "100"),
    ]);
    f.warm();
    let worker = TestWorker::start("gone-worker");
    f.registered(&worker, "w");
    // Its lease runs on, but nothing listens at its URL any more.
    worker.stop();
    let wake_key = f.keys.wake(bucket_of("t3", SHARDS), "default", "/threads");
    let now = pinboard::clock::now_ms().to_string();
    f.cli(&["ZADD", &wake_key, &now, "t3"]);
    // Each pass places t3 for its wake, fails to connect and releases the placement, so a
    // later pass (or a client) places the id afresh; the entry stays.
    assert!(
        eventually(Duration::from_secs(5), || {
            f.node.log().contains("wake failed") && f.row("/threads", "t3").is_none()
        }),
        "{}",
        f.node.log()
    );
    assert_eq!(f.cli(&["ZSCORE", &wake_key, "t3"]), now);
}

#[test]
fn metrics_answer_500_once_the_fleet_view_cannot_be_read() {
    let f = Fixture::new(&[
        ("PINBOARD_LEASE_TTL_MS", "3000"),
        ("PINBOARD_REDIS_TIMEOUT_MS", "300"),
    ]);
    let operator = token("ops", &["pinboard:operator"], &["*"]);
    let scrape = || get(f.node.addr, "/metrics", Some(&operator));
    assert_eq!(scrape().status, 200);
    // Redis stops answering: the last view serves for its 5 s, then a scrape must read the
    // registry itself and cannot.
    f.redis.pause();
    let failed = eventually(Duration::from_secs(10), || {
        let r = scrape();
        (r.status, r.text()) == (500, r#"{"error":"metrics collection failed"}"#.into())
    });
    f.redis.resume();
    assert!(failed, "{}", f.node.log());
    assert!(eventually(Duration::from_secs(5), || scrape().status == 200));
}

#[test]
fn a_hostname_aware_wake_goes_only_to_a_worker_of_the_rows_hostname() {
    let f = Fixture::new(&[
        ("PINBOARD_HOSTNAME_AWARE", "true"),
        ("PINBOARD_LEASE_TTL_MS", "1500"),
        ("PINBOARD_SWEEP_INTERVAL_MS", "100"),
    ]);
    f.warm();
    let register = |worker: &TestWorker, client: &str, hostname: &str| {
        let extra = json!({"namespaces": ["/threads"], "hostname": hostname, "env": "e1"});
        let r = f.register(worker, client, extra);
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()["sessionId"].as_str().unwrap().to_owned()
    };
    let dying = TestWorker::start("dying-h1");
    let old = register(&dying, "a", "h1");
    let other = TestWorker::start("other-h2");
    let other_session = register(&other, "b", "h2");
    // t4 is h1's, in env e1, scheduled to wake once its owner's lease has run out.
    let bucket = bucket_of("t4", SHARDS);
    let row = json!({"sessionId": old, "epoch": "5", "hostname": "h1"});
    f.cli(&[
        "HSET",
        &f.keys.placements(bucket, "e1", "/threads"),
        "t4",
        &row.to_string(),
    ]);
    let wake_key = f.keys.wake(bucket, "e1", "/threads");
    let at = (pinboard::clock::now_ms() + 1600).to_string();
    f.cli(&["ZADD", &wake_key, &at, "t4"]);

    // Due, its owner dead, and h1 without a live worker: the wake waits; the worker of h2 in
    // the same env never gets it.
    let until = Instant::now() + Duration::from_secs(4);
    while Instant::now() < until {
        assert_eq!(f.heartbeat(&other, &other_session, json!({})).status, 200);
        std::thread::sleep(Duration::from_millis(150));
    }
    assert!(wakes_of(&other, "t4").is_empty(), "{}", f.node.log());
    assert_eq!(f.cli(&["ZSCORE", &wake_key, "t4"]), at, "the entry waits");

    // A worker of h1 comes: the wake goes there.
    let heir = TestWorker::start("heir-h1");
    let heir_session = register(&heir, "c", "h1");
    assert!(
        eventually(Duration::from_secs(5), || !wakes_of(&heir, "t4").is_empty()),
        "{}",
        f.node.log()
    );
    let wake = &wakes_of(&heir, "t4")[0];
    let claims =
        support::attest::claims_of(wake.header("pinboard-attestation").unwrap(), &heir.secret());
    assert_eq!(claims["aud"], heir_session.as_str());
    assert!(wakes_of(&other, "t4").is_empty());
}

#[test]
fn a_namespace_whose_last_worker_is_pruned_is_still_swept_then_forgotten() {
    let f = Fixture::new(&[
        ("PINBOARD_LEASE_TTL_MS", "1000"),
        ("PINBOARD_SWEEP_INTERVAL_MS", "100"),
    ]);
    f.warm();
    // Nobody sweeps until the worker's record is gone: a phantom node holds the lease.
    let lease = f.keys.sweeper();
    f.cli(&["SET", lease, "phantom"]);
    let worker = TestWorker::start("only");
    let session = f.registered(&worker, "w-only");
    let field = |ns: &str| pinboard::store::pair_field("default", ns);
    let count = |ns: &str| f.cli(&["HGET", f.keys.namespaces(), &field(ns)]);
    assert_eq!(count("/threads"), "1", "a registration names its pairs");
    assert_eq!(count("/docs"), "1");
    let ids: Vec<String> = (0..10).map(|i| format!("orphan-{i}")).collect();
    for id in &ids {
        f.put_row("/threads", id, json!({"sessionId": session, "epoch": "7"}));
    }
    f.cli(&[
        "HSET",
        &f.keys
            .overwritten(bucket_of("gone", SHARDS), "default", "/docs"),
        "gone",
        "2",
    ]);

    // The worker dies without a word; the mirror poll prunes its record a lease later, and no
    // session record names /threads or /docs any more.
    assert!(
        eventually(Duration::from_secs(10), || f
            .session_record(&session)
            .is_none()),
        "{}",
        f.node.log()
    );
    assert!(ids.iter().all(|id| f.row("/threads", id).is_some()));

    // Its rows, its marker, then the pairs themselves go.
    f.cli(&["DEL", lease]);
    let clean = eventually(Duration::from_secs(10), || {
        ids.iter().all(|id| f.row("/threads", id).is_none())
            && f.cli(&["HLEN", f.keys.namespaces()]) == "0"
    });
    assert!(clean, "{}", f.node.log());
    assert!(f.node.log().contains("forgot a namespace no worker serves"));

    // A namespace a worker registers again is named again.
    let again = TestWorker::start("again");
    f.registered(&again, "w-again");
    assert_eq!(count("/threads"), "1");
}

/// Without a `node_id`, a node is named after its host and listen address: a restart in place
/// keeps the name, so the sweeper gauge `pinboard_sweeper{node}` keeps its series (a random
/// name made a new one at every start).
#[test]
fn a_node_restarted_in_place_keeps_its_name_and_its_sweeper_series() {
    let redis = RedisServer::start();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let listen = format!("127.0.0.1:{port}");
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let series = format!("pinboard_sweeper{{node=\"{}@{listen}\"}}", host.trim());
    let lease = LEASE_MS.to_string();
    let env = [
        ("PINBOARD_LISTEN", listen.as_str()),
        ("PINBOARD_LEASE_TTL_MS", lease.as_str()),
    ];
    for start in ["first", "after a restart"] {
        let mut node = Node::start(&redis.url(), &env);
        assert!(
            eventually(Duration::from_secs(10), || metric(&node, &series) == 1),
            "{start}: {series} not in /metrics:\n{}",
            node.log()
        );
        assert!(node.stop().success());
    }
}
