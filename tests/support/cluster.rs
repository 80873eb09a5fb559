//! A node on a [`RedisCluster`], and what tests do to it as a worker and through `redis-cli -c`.

use std::time::Duration;

use serde_json::json;

use super::http::{get, post_json};
use super::node::{Node, eventually};
use super::redis::RedisCluster;
use super::worker::TestWorker;

/// `redis-cli -c` against the cluster: it follows redirects to the key's master.
pub fn cluster_cli(cluster: &RedisCluster, args: &[&str]) -> String {
    let mut all = vec!["-c"];
    all.extend_from_slice(args);
    cluster.nodes()[0].cli(&all)
}

/// Registers `worker` for `/threads` as client `c1` of account `acct`; its session.
pub fn register(node: &Node, worker: &TestWorker) -> String {
    let (challenge, value) = worker.challenge();
    let body = json!({
        "clientId": "c1", "secret": worker.secret(), "namespaces": ["/threads"],
        "advertiseUrl": worker.url(), "headroom": 100, "draining": false,
        "challenge": challenge, "challengeValue": value,
    });
    let token = node.worker_token("acct");
    let r = post_json(
        node.addr,
        "/registry/register",
        Some(&token),
        &body.to_string(),
    );
    assert_eq!(r.status, 200, "{}\n{}", r.text(), node.log());
    r.json()["sessionId"].as_str().unwrap().to_string()
}

/// A node on `cluster` (16 buckets, a lease of `lease_ms`, and `env`) with one registered
/// worker, every bucket past its cold start. The worker never heartbeats: the lease must
/// outlive what the test asks of it.
pub fn warm_node(
    cluster: &RedisCluster,
    lease_ms: &str,
    env: &[(&str, &str)],
    secret: &str,
) -> (Node, TestWorker) {
    let keys = super::keys(16);
    let mut all = vec![
        ("PINBOARD_SHARDS", "16"),
        ("PINBOARD_LEASE_TTL_MS", lease_ms),
    ];
    all.extend_from_slice(env);
    let node = Node::start(&cluster.url(), &all);
    let worker = TestWorker::start(secret);
    register(&node, &worker);
    for b in 0..16 {
        cluster_cli(cluster, &["SET", &keys.bucket(b).boot_time, "0"]);
    }
    (node, worker)
}

/// Whether a forward to each of 24 instance ids answers 200: with `warm_node`'s 16 buckets
/// spread over the masters, every master is asked.
pub fn all_forward(node: &Node) -> bool {
    (0..24).all(|i| get(node.addr, &format!("/threads/id-{i}/x"), None).status == 200)
}

/// Asserts that `node` forwards through every master of `cluster` logged in as `user` (no
/// connection of the `default` user but the helper's redis-cli), then that it comes back, all
/// forwarding within 15 s, once `user`'s connections are killed on every master.
pub fn logged_in_on_every_master(cluster: &RedisCluster, node: &Node, user: &str) {
    assert!(all_forward(node), "{}", node.log());
    for redis in cluster.nodes() {
        redis.assert_logged_in_as(user, 1);
    }
    for redis in cluster.nodes() {
        redis.cli(&["CLIENT", "KILL", "USER", user]);
    }
    assert!(
        eventually(Duration::from_secs(15), || all_forward(node)),
        "the node did not come back after its connections were dropped:\n{}",
        node.log()
    );
}
