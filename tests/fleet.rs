//! The fleet license and membership across real nodes sharing one real redis-server: a node
//! serves only while it holds the license and its live peers agree with it.

mod support;

use std::time::Duration;

use support::http::{get, post_json};
use support::node::{Node, eventually, token};
use support::redis::RedisServer;

fn ready(node: &Node) -> bool {
    (0..4).all(|_| get(node.addr, "/readyz", None).status == 200)
}

fn not_ready(node: &Node) -> bool {
    (0..4).all(|_| get(node.addr, "/readyz", None).status == 503)
}

#[test]
fn disagreeing_nodes_do_not_serve_until_a_higher_epoch_wins() {
    let redis = RedisServer::start();
    let lease = [("PINBOARD_LEASE_TTL_MS", "1000"), ("PINBOARD_SHARDS", "4")];
    let a = Node::start(&redis.url(), &lease);
    let license = redis.cli(&["GET", support::keys(1).fleet()]);
    assert_eq!(
        license,
        r#"{"schema":1,"shards":4,"hostnameAware":false,"epoch":0}"#
    );
    let ttl: i64 = redis
        .cli(&["PTTL", support::keys(1).fleet()])
        .parse()
        .unwrap();
    assert!(
        (0..=1000).contains(&ttl),
        "claimed with a TTL of one lease: {ttl}"
    );

    // Same epoch, another shard count: it does not hold the license, and its membership
    // makes the fleet disagree, so neither serves.
    let mut b = Node::spawn(
        &redis.url(),
        &[("PINBOARD_LEASE_TTL_MS", "1000"), ("PINBOARD_SHARDS", "8")],
    );
    assert!(eventually(Duration::from_secs(5), || not_ready(&b)));
    assert!(eventually(Duration::from_secs(5), || not_ready(&a)));
    let worker = token("acct", &["pinboard:worker"], &["*"]);
    let r = post_json(b.addr, "/registry/register", Some(&worker), "{}");
    assert_eq!(
        (r.status, r.text().as_str(), r.header("retry-after")),
        (503, r#"{"error":"not the serving fleet"}"#, Some("1"))
    );
    let r = post_json(b.addr, "/registry/no-such-route", Some(&worker), "{}");
    assert_eq!(
        r.status, 503,
        "unknown registry paths pass the serving check first"
    );
    assert_eq!(
        post_json(b.addr, "/registry/x", None, "{}").status,
        401,
        "but authenticate before it"
    );
    let r = get(b.addr, "/threads/abc", None);
    assert_eq!(
        (r.status, r.text().as_str()),
        (503, r#"{"error":"not the serving fleet"}"#)
    );
    let operator = token("ops", &["pinboard:operator"], &["*"]);
    let health = get(b.addr, "/registry/health", Some(&operator));
    assert_eq!(health.status, 200, "health answers while not serving");
    assert_eq!(health.json()["resolutions"]["not-serving"], 1);

    // The odd one leaves: its membership expires, and the fleet serves again.
    assert!(b.stop().success());
    assert!(
        eventually(Duration::from_secs(5), || ready(&a)),
        "{}",
        a.log()
    );

    // A higher epoch takes the license over; the lower-epoch node stops serving.
    let c = Node::start(
        &redis.url(),
        &[
            ("PINBOARD_LEASE_TTL_MS", "1000"),
            ("PINBOARD_SHARDS", "8"),
            ("PINBOARD_FLEET_EPOCH", "1"),
        ],
    );
    assert!(eventually(Duration::from_secs(5), || not_ready(&a)));
    assert!(ready(&c));
    assert_eq!(
        redis.cli(&["GET", support::keys(1).fleet()]),
        r#"{"schema":1,"shards":8,"hostnameAware":false,"epoch":1}"#
    );
}
