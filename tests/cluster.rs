//! The node on a real 3-master Redis Cluster: every script touches one slot (the registry's
//! `{r}` or a bucket's `{b}`), so registration, heartbeats, placement, forwarding, release and
//! deregistration work unchanged with buckets spread over all three masters.

mod support;

use serde_json::{Value, json};
use support::http::{get, post_json};
use support::node::Node;
use support::redis::RedisCluster;
use support::worker::TestWorker;

#[test]
fn the_worker_protocol_and_the_data_plane_on_a_cluster() {
    let cluster = RedisCluster::start();
    let node = Node::start(&cluster.url(), &[("PINBOARD_SHARDS", "16")]);
    let cli = |args: &[&str]| {
        let mut all = vec!["-c"];
        all.extend_from_slice(args);
        cluster.nodes()[0].cli(&all)
    };
    // The buckets' slots really are spread over the masters.
    let owners: std::collections::BTreeSet<usize> = (0..16)
        .map(|b| cluster.owner_of(cluster.slot_of(&format!("pinboard:{{{b}}}:workers"))))
        .collect();
    assert_eq!(owners.len(), 3, "buckets on every master");

    let token = node.worker_token("acct");
    let worker = TestWorker::start("cluster-secret");
    let (challenge, value) = worker.challenge();
    let body = json!({
        "clientId": "c1", "secret": worker.secret(), "namespaces": ["/threads"],
        "advertiseUrl": worker.url(), "headroom": 100, "draining": false,
        "challenge": challenge, "challengeValue": value,
    });
    let r = post_json(
        node.addr,
        "/registry/register",
        Some(&token),
        &body.to_string(),
    );
    assert_eq!(r.status, 200, "{}\n{}", r.text(), node.log());
    let session = r.json()["sessionId"].as_str().unwrap().to_string();
    assert!(!cli(&["HGET", "pinboard:{r}:sessions", &session]).is_empty());
    for b in 0..16 {
        assert!(
            !cli(&["HGET", &format!("pinboard:{{{b}}}:workers"), &session]).is_empty(),
            "bucket {b}"
        );
        cli(&["SET", &format!("pinboard:{{{b}}}:boot_time"), "0"]);
    }

    for i in 0..24 {
        let r = get(node.addr, &format!("/threads/id-{i}/x"), None);
        assert_eq!(r.status, 200, "id-{i}: {}", r.text());
        assert_eq!(r.json()["path"], format!("/threads/id-{i}/x"));
    }
    let (challenge, value) = worker.challenge();
    let beat = json!({"sessionId": session, "headroom": 50, "draining": false, "challenge": challenge, "challengeValue": value});
    assert_eq!(
        post_json(
            node.addr,
            "/registry/heartbeat",
            Some(&token),
            &beat.to_string()
        )
        .status,
        200
    );

    let bucket = pinboard::redis::bucket_of("id-3", 16);
    let row: Value = serde_json::from_str(&cli(&[
        "HGET",
        &format!("pinboard:{{{bucket}}}:default:/threads:placements"),
        "id-3",
    ]))
    .unwrap();
    let release = json!([{"sessionId": session, "namespace": "/threads", "id": "id-3", "epoch": row["epoch"]}]);
    let r = post_json(
        node.addr,
        "/registry/release",
        Some(&token),
        &release.to_string(),
    );
    assert_eq!(r.json(), json!({"released": 1}));
    let r = post_json(
        node.addr,
        "/registry/deregister",
        Some(&token),
        &json!({"sessionId": session}).to_string(),
    );
    assert_eq!(r.status, 200);
    assert!(
        (0..16).all(|b| cli(&["HGET", &format!("pinboard:{{{b}}}:workers"), &session]).is_empty())
    );
}
