//! The node on a real 3-master Redis Cluster: every script touches one slot (the registry's
//! `{r}` or a bucket's `{b}`), so registration, heartbeats, placement, forwarding, release and
//! deregistration work unchanged with buckets spread over all three masters.

mod support;

use serde_json::{Value, json};
use support::http::{get, post_json};
use support::node::Node;
use support::redis::RedisCluster;
use support::worker::TestWorker;

/// `redis-cli -c` against the cluster: it follows redirects to the key's master.
fn cluster_cli(cluster: &RedisCluster, args: &[&str]) -> String {
    let mut all = vec!["-c"];
    all.extend_from_slice(args);
    cluster.nodes()[0].cli(&all)
}

/// Registers `worker` for `/threads` as client `c1` of account `acct`; its session.
fn register(node: &Node, worker: &TestWorker) -> String {
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

#[test]
fn the_worker_protocol_and_the_data_plane_on_a_cluster() {
    let cluster = RedisCluster::start();
    let node = Node::start(&cluster.url(), &[("PINBOARD_SHARDS", "16")]);
    let cli = |args: &[&str]| cluster_cli(&cluster, args);
    // The buckets' slots really are spread over the masters.
    let owners: std::collections::BTreeSet<usize> = (0..16)
        .map(|b| cluster.owner_of(cluster.slot_of(&format!("pinboard:{{{b}}}:workers"))))
        .collect();
    assert_eq!(owners.len(), 3, "buckets on every master");

    let token = node.worker_token("acct");
    let worker = TestWorker::start("cluster-secret");
    let session = register(&node, &worker);
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

    let bucket = pinboard::store::bucket_of("id-3", 16);
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
    assert!((0..16).all(|b| {
        let copy = cli(&["HGET", &format!("pinboard:{{{b}}}:workers"), &session]);
        copy.is_empty() || copy.contains("\"dropped\"")
    }));
}

/// Issue 10's repro: a bucket's slot migrated key by key. While its keys are split between two
/// masters a resolve must not run against half of them (it once placed a placed id again, with
/// a new epoch, on the importing node): every answer is 200 or 503 + Retry-After, and no id
/// changes owner or epoch, during the migration or after it.
#[test]
fn a_slot_migrated_key_by_key_never_re_places_an_id() {
    let cluster = RedisCluster::start();
    // The worker never heartbeats here: its lease must outlive the test.
    let node = Node::start(
        &cluster.url(),
        &[
            ("PINBOARD_SHARDS", "16"),
            ("PINBOARD_LEASE_TTL_MS", "300000"),
        ],
    );
    let cli = |args: &[&str]| cluster_cli(&cluster, args);
    let worker = TestWorker::start("migrating");
    register(&node, &worker);
    for b in 0..16 {
        cli(&["SET", &format!("pinboard:{{{b}}}:boot_time"), "0"]);
    }
    // 200 placed ids; the bucket of the first one moves.
    let ids: Vec<String> = (0..200).map(|i| format!("m-{i}")).collect();
    let row = |id: &str| {
        let b = pinboard::store::bucket_of(id, 16);
        cli(&[
            "HGET",
            &format!("pinboard:{{{b}}}:default:/threads:placements"),
            id,
        ])
    };
    for id in &ids {
        assert_eq!(get(node.addr, &format!("/threads/{id}"), None).status, 200);
    }
    let before: Vec<String> = ids.iter().map(|id| row(id)).collect();
    let bucket = pinboard::store::bucket_of(&ids[0], 16);
    let moving: Vec<&String> = ids
        .iter()
        .filter(|id| pinboard::store::bucket_of(id, 16) == bucket)
        .collect();
    assert!(moving.len() >= 5, "{} ids in bucket {bucket}", moving.len());
    let key = |suffix: &str| format!("pinboard:{{{bucket}}}:{suffix}");
    let slot = cluster.slot_of(&key("workers"));
    let from = cluster.owner_of(slot);
    let to = (from + 1) % 3;

    let check_all = |phase: &str| {
        for id in &ids {
            let r = get(node.addr, &format!("/threads/{id}"), None);
            match r.status {
                200 => {}
                503 => assert_eq!(
                    r.header("retry-after"),
                    Some("1"),
                    "{phase} {id}: {}",
                    r.text()
                ),
                other => panic!("{phase} {id}: {other} {}", r.text()),
            }
        }
    };
    // Half moved: the copies, namespace list, boot time and epoch counter, not the rows.
    cluster.mark_migrating(slot, from, to);
    check_all("marked");
    let half = [
        key("workers"),
        key("nsw:/threads"),
        key("boot_time"),
        key("epoch"),
    ];
    let half: Vec<&str> = half.iter().map(String::as_str).collect();
    cluster.migrate_keys(from, to, &half);
    check_all("half moved");
    for id in &moving {
        let served = get(node.addr, &format!("/threads/{id}"), None);
        assert_ne!(
            served.status, 200,
            "{id} cannot be resolved against half its keys"
        );
    }
    let on_target =
        cluster.nodes()[to].cli(&["CLUSTER", "GETKEYSINSLOT", &slot.to_string(), "100"]);
    assert!(
        !on_target.contains("placements") && !on_target.contains("overwritten"),
        "nothing was placed on the importing node: {on_target}"
    );
    // The rest, then the slot is the target's.
    cluster.migrate_keys(from, to, &[key("default:/threads:placements").as_str()]);
    cluster.finish_migration(slot, to);
    assert!(support::node::eventually(
        std::time::Duration::from_secs(10),
        || {
            moving
                .iter()
                .all(|id| get(node.addr, &format!("/threads/{id}"), None).status == 200)
        }
    ));
    check_all("after");
    let after: Vec<String> = ids.iter().map(|id| row(id)).collect();
    assert_eq!(before, after, "no id changed owner or epoch");
}
