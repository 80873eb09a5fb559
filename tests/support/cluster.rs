//! A node on a [`RedisCluster`], and what tests do to it as a worker and through `redis-cli -c`.

use serde_json::json;

use super::http::post_json;
use super::node::Node;
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
