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
    let f = Fixture::new(&[
        ("PINBOARD_LEASE_TTL_MS", "1000"),
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
    let swept = eventually(Duration::from_secs(5), || {
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
}
