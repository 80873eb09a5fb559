//! The node on a real 3-master Redis Cluster: every script touches one slot (the registry's
//! `{r}` or a bucket's `{b}`), so registration, heartbeats, placement, forwarding, release and
//! deregistration work unchanged with buckets spread over all three masters.

mod support;

use serde_json::{Value, json};
use support::cluster::{cluster_cli, register, warm_node};
use support::http::{get, post_json};
use support::node::Node;
use support::redis::RedisCluster;
use support::worker::TestWorker;

#[test]
fn the_worker_protocol_and_the_data_plane_on_a_cluster() {
    let keys = support::keys(16);
    let cluster = RedisCluster::start();
    let node = Node::start(&cluster.url(), &[("PINBOARD_SHARDS", "16")]);
    let cli = |args: &[&str]| cluster_cli(&cluster, args);
    // The buckets' slots really are spread over the masters.
    let owners: std::collections::BTreeSet<usize> = (0..16)
        .map(|b| cluster.owner_of(cluster.slot_of(&keys.bucket(b).workers)))
        .collect();
    assert_eq!(owners.len(), 3, "buckets on every master");

    let token = node.worker_token("acct");
    let worker = TestWorker::start("cluster-secret");
    let session = register(&node, &worker);
    assert!(!cli(&["HGET", keys.sessions(), &session]).is_empty());
    for b in 0..16 {
        assert!(
            !cli(&["HGET", &keys.bucket(b).workers, &session]).is_empty(),
            "bucket {b}"
        );
        cli(&["SET", &keys.bucket(b).boot_time, "0"]);
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
        &keys.placements(bucket, "default", "/threads"),
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
        let copy = cli(&["HGET", &keys.bucket(b).workers, &session]);
        copy.is_empty() || copy.contains("\"dropped\"")
    }));
}

/// This file's client places 200 ids in a row from one address: past the default placement
/// rate (`limits.new_placements_per_ip_per_s`, which `tests/client_limits.rs` tests).
const ONE_CLIENT_PLACES_FREELY: &[(&str, &str)] =
    &[("PINBOARD_LIMITS__NEW_PLACEMENTS_PER_IP_PER_S", "0")];

/// Issue 10's repro: a bucket's slot migrated key by key. While its keys are split between two
/// masters a resolve must not run against half of them (it once placed a placed id again, with
/// a new epoch, on the importing node): every answer is 200 or 503 + Retry-After, and no id
/// changes owner or epoch, during the migration or after it.
#[test]
fn a_slot_migrated_key_by_key_never_re_places_an_id() {
    let keys = support::keys(16);
    let cluster = RedisCluster::start();
    let (node, _worker) = warm_node(&cluster, "300000", ONE_CLIENT_PLACES_FREELY, "migrating");
    let cli = |args: &[&str]| cluster_cli(&cluster, args);
    // 200 placed ids; the bucket of the first one moves.
    let ids: Vec<String> = (0..200).map(|i| format!("m-{i}")).collect();
    let row = |id: &str| {
        let b = pinboard::store::bucket_of(id, 16);
        cli(&["HGET", &keys.placements(b, "default", "/threads"), id])
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
    let fixed = keys.bucket(bucket);
    let slot = cluster.slot_of(&fixed.workers);
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
    // Half moved: the copies and liveness entries, namespace list, boot time and epoch
    // counter, not the rows.
    cluster.mark_migrating(slot, from, to);
    check_all("marked");
    let half = [
        fixed.workers.clone(),
        keys.nsw(bucket, "", "/threads").to_string(),
        fixed.boot_time.clone(),
        fixed.epoch.clone(),
        fixed.alive.clone(),
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
    let rows = keys.placements(bucket, "default", "/threads");
    cluster.migrate_keys(from, to, &[rows.as_str()]);
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

/// What a client may see while slots move: 200, or 503 + `Retry-After: 1`. `None` for those,
/// else what was wrong.
fn violation(id: &str, r: &support::http::Reply) -> Option<String> {
    match r.status {
        200 => None,
        503 if r.header("retry-after") == Some("1") => None,
        status => Some(format!(
            "{id}: {status} retry-after={:?} {}",
            r.header("retry-after"),
            r.text()
        )),
    }
}

/// A whole master resharded onto another by `redis-cli --cluster reshard`, one key per
/// MIGRATE, while a client keeps asking for 200 placed ids: the master holding the registry
/// slot and several buckets hands every slot over. Every answer is 200 or 503 + Retry-After,
/// and afterwards every id answers 200 from the same row, byte for byte.
///
/// It found a defect, fixed since: a redirect (MOVED, ASK) still pending after the cluster
/// client's last attempt was answered 500 `internal error`; a slot in motion is now a transient
/// Redis failure, 503 `registry unavailable, retry`.
#[test]
fn a_master_resharded_under_load_never_re_places_an_id() {
    use std::collections::BTreeMap;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};
    let keys = support::keys(16);

    let cluster = RedisCluster::start();
    let (node, _worker) = warm_node(&cluster, "300000", ONE_CLIENT_PLACES_FREELY, "resharding");
    let cli = |args: &[&str]| cluster_cli(&cluster, args);
    let ids: Vec<String> = (0..200).map(|i| format!("m-{i}")).collect();
    let row = |id: &str| {
        let b = pinboard::store::bucket_of(id, 16);
        cli(&["HGET", &keys.placements(b, "default", "/threads"), id])
    };
    for id in &ids {
        let r = get(node.addr, &format!("/threads/{id}"), None);
        assert_eq!(r.status, 200, "{id}: {}", r.text());
    }
    let before: Vec<String> = ids.iter().map(|id| row(id)).collect();
    assert!(before.iter().all(|r| r.contains("epoch")), "{before:?}");

    // The master of the registry slot goes, with every bucket it serves.
    let from = cluster.owner_of(cluster.slot_of(keys.sessions()));
    let to = (from + 1) % 3;
    let bucket_master = |b: u32| cluster.owner_of(cluster.slot_of(&keys.bucket(b).workers));
    let moving: Vec<u32> = (0..16).filter(|&b| bucket_master(b) == from).collect();
    let moving_ids = ids
        .iter()
        .filter(|id| moving.contains(&pinboard::store::bucket_of(id, 16)))
        .count();
    assert!(moving_ids >= 20, "{moving_ids} ids in buckets {moving:?}");
    let slots = cluster.slot_count(from);
    // Ballast in the moving buckets' slots (their hash tag, not Pinboard's prefix): with one
    // key per MIGRATE each of those slots stays open for a while. A resolve is redirected (ASK,
    // then TRYAGAIN) as long as its bucket's slot is open: the `overwritten` hash it declares
    // exists on neither side while no id of the bucket was ever re-placed.
    for b in &moving {
        let ballast: Vec<String> = (0..1000)
            .flat_map(|n| [format!("ballast:{{{b}}}:{n}"), "x".to_string()])
            .collect();
        let mut mset = vec!["MSET"];
        mset.extend(ballast.iter().map(String::as_str));
        assert_eq!(cli(&mset), "OK");
    }

    let stop = Arc::new(AtomicBool::new(false));
    let requests = Arc::new(AtomicUsize::new(0));
    let by_status: Arc<Mutex<BTreeMap<String, usize>>> = Arc::default();
    let violations: Arc<Mutex<Vec<String>>> = Arc::default();
    let client = {
        let (stop, requests) = (stop.clone(), requests.clone());
        let (by_status, violations) = (by_status.clone(), violations.clone());
        let (addr, ids) = (node.addr, ids.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                for id in &ids {
                    let r = get(addr, &format!("/threads/{id}"), None);
                    requests.fetch_add(1, Ordering::Relaxed);
                    let kind = match r.status {
                        200 => "200".to_string(),
                        status => format!("{status} {}", r.text()),
                    };
                    *by_status.lock().unwrap().entry(kind).or_default() += 1;
                    if let Some(v) = violation(id, &r) {
                        violations.lock().unwrap().push(v);
                    }
                }
            }
        })
    };
    // The client is under way before the first slot moves.
    assert!(support::node::eventually(Duration::from_secs(5), || {
        requests.load(Ordering::Relaxed) > 0
    }));
    let started = Instant::now();
    let at_start = requests.load(Ordering::Relaxed);
    let out = cluster.reshard(from, to, slots, 1);
    let during = requests.load(Ordering::Relaxed) - at_start;
    let took = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    client.join().unwrap();

    let moved = out.lines().filter(|l| l.starts_with("Moving slot")).count();
    eprintln!(
        "resharded {slots} slots (buckets {moving:?}, {moving_ids} ids) from master {from} to \
         {to} in {took:?}; {moved} slot moves logged; {during} requests during it"
    );
    for (kind, n) in by_status.lock().unwrap().iter() {
        eprintln!("  {n:>6} × {kind}");
    }
    assert_eq!(cluster.slot_count(from), 0, "master {from} kept slots");
    assert_eq!(
        cluster.slot_count(to) + cluster.slot_count((from + 2) % 3),
        16384
    );
    assert!(during > 0, "no request was made during the reshard");
    assert!(
        support::node::eventually(Duration::from_secs(10), || {
            ids.iter()
                .all(|id| get(node.addr, &format!("/threads/{id}"), None).status == 200)
        }),
        "not every id answers 200 after the reshard\n{}",
        node.log()
    );
    let after: Vec<String> = ids.iter().map(|id| row(id)).collect();
    let changed: Vec<(&String, &String, &String)> = ids
        .iter()
        .zip(before.iter().zip(&after))
        .filter(|(_, (b, a))| b != a)
        .map(|(id, (b, a))| (id, b, a))
        .collect();
    assert!(
        changed.is_empty(),
        "rows changed (id, before, after): {changed:?}"
    );
    for b in 0..16 {
        let overwritten = keys.overwritten(b, "default", "/threads");
        assert_eq!(
            cli(&["EXISTS", &overwritten]),
            "0",
            "bucket {b} re-placed an id"
        );
    }
    let violations = violations.lock().unwrap();
    let log = node.log();
    let failed: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("request failed"))
        .collect();
    assert!(
        violations.is_empty(),
        "{} answers neither 200 nor 503 + Retry-After: 1, e.g. {:?}\nnode: {failed:#?}",
        violations.len(),
        &violations[..violations.len().min(10)],
    );
}

/// A master killed on a cluster that keeps serving what it still covers: the ids of the dead
/// master's buckets answer 503 `registry unavailable, retry` + Retry-After, every other id
/// keeps answering 200, and nothing answers 500 — before and after the survivors mark the
/// dead master failed (the cluster's node timeout, 5 s).
#[test]
fn a_killed_master_fails_only_its_slots() {
    use std::time::{Duration, Instant};
    let keys = support::keys(16);

    let mut cluster = RedisCluster::start_with(&["--cluster-require-full-coverage", "no"]);
    let (node, _worker) = warm_node(
        &cluster,
        "300000",
        &[("PINBOARD_REDIS_TIMEOUT_MS", "500")],
        "killed-master",
    );
    // Four ids in each bucket.
    let mut per_bucket = [0; 16];
    let ids: Vec<String> = (0..)
        .map(|i| format!("k-{i}"))
        .filter(|id| {
            let b = pinboard::store::bucket_of(id, 16) as usize;
            per_bucket[b] += 1;
            per_bucket[b] <= 4
        })
        .take(64)
        .collect();
    let buckets: Vec<u32> = ids
        .iter()
        .map(|id| pinboard::store::bucket_of(id, 16))
        .collect();
    for id in &ids {
        let r = get(node.addr, &format!("/threads/{id}"), None);
        assert_eq!(r.status, 200, "{id}: {}", r.text());
    }
    // Everything asked of the cluster is asked before a node dies.
    let master: Vec<usize> = (0..16)
        .map(|b| cluster.owner_of(cluster.slot_of(&keys.bucket(b).workers)))
        .collect();
    // The registry slot's master stays: it holds the fleet license, whose loss is
    // `a_killed_registry_master_keeps_the_other_slots_serving_for_a_lease`'s.
    let registry = cluster.owner_of(cluster.slot_of(keys.sessions()));
    let victim = (0..3)
        .filter(|&n| n != registry)
        .max_by_key(|&n| master.iter().filter(|&&m| m == n).count())
        .unwrap();
    let dead = |i: usize| master[buckets[i] as usize] == victim;
    let dead_ids = (0..ids.len()).filter(|&i| dead(i)).count();
    assert!(
        dead_ids > 0 && dead_ids < ids.len(),
        "{dead_ids} ids on master {victim}"
    );

    cluster.node_mut(victim).stop();
    let killed = Instant::now();
    let unavailable = |r: &support::http::Reply| {
        r.status == 503
            && r.header("retry-after") == Some("1")
            && r.text() == r#"{"error":"registry unavailable, retry"}"#
    };
    // The node's connection to the dead master breaks at once; allow it a moment.
    assert!(
        support::node::eventually(Duration::from_secs(5), || {
            (0..ids.len())
                .filter(|&i| dead(i))
                .all(|i| unavailable(&get(node.addr, &format!("/threads/{}", ids[i]), None)))
        }),
        "the dead master's ids do not answer 503 registry unavailable\n{}",
        node.log()
    );
    let noticed = killed.elapsed();
    // Then through the survivors' failure detection and past it.
    let mut violations = Vec::new();
    let mut rounds = 0;
    let mut by_status = std::collections::BTreeMap::<String, usize>::new();
    while killed.elapsed() < Duration::from_secs(9) {
        rounds += 1;
        for (i, id) in ids.iter().enumerate() {
            let r = get(node.addr, &format!("/threads/{id}"), None);
            let kind = match r.status {
                200 => "200".to_string(),
                status => format!("{status} {}", r.text()),
            };
            *by_status.entry(kind).or_default() += 1;
            let fine = if dead(i) {
                unavailable(&r)
            } else {
                r.status == 200
            };
            if !fine {
                violations.push(format!(
                    "{:?} {id} (bucket {}, {}): {} retry-after={:?} {}",
                    killed.elapsed(),
                    buckets[i],
                    if dead(i) { "dead" } else { "live" },
                    r.status,
                    r.header("retry-after"),
                    r.text()
                ));
            }
        }
        let health = get(node.addr, "/healthz", None);
        if health.status != 200 {
            violations.push(format!(
                "{:?} /healthz: {}",
                killed.elapsed(),
                health.status
            ));
        }
    }
    let survivor = (victim + 1) % 3;
    let state = cluster.nodes()[survivor].cli(&["CLUSTER", "INFO"]);
    let state = state
        .lines()
        .find(|l| l.starts_with("cluster_state"))
        .unwrap_or("?");
    eprintln!(
        "killed master {victim} ({dead_ids} of {} ids); noticed within {noticed:?}; {rounds} \
         rounds; survivor {survivor} says {state}",
        ids.len()
    );
    for (kind, n) in &by_status {
        eprintln!("  {n:>6} × {kind}");
    }
    assert!(
        violations.is_empty(),
        "{} wrong answers, e.g. {:?}\n{}",
        violations.len(),
        &violations[..violations.len().min(10)],
        node.log()
    );
}

/// The registry slot's master killed: registration and heartbeats fail (503 registry
/// unavailable) and the fleet license cannot be renewed, but the license the node holds lives
/// a lease, so until it lapses the ids of the other masters keep being served; after it, the
/// node stops serving like any node without the license, and says why: 503 registry
/// unavailable (contract §8), not `not the serving fleet`.
#[test]
fn a_killed_registry_master_keeps_the_other_slots_serving_for_a_lease() {
    use std::time::{Duration, Instant};

    let keys = support::keys(16);
    let mut cluster = RedisCluster::start_with(&["--cluster-require-full-coverage", "no"]);
    let (node, _worker) = warm_node(
        &cluster,
        "9000",
        &[("PINBOARD_REDIS_TIMEOUT_MS", "500")],
        "registry-master",
    );
    let registry = cluster.owner_of(cluster.slot_of(keys.sessions()));
    let owner = |id: &str| {
        cluster.owner_of(cluster.slot_of(&keys.bucket(pinboard::store::bucket_of(id, 16)).workers))
    };
    let (live, dead): (Vec<String>, Vec<String>) = (0..48)
        .map(|i| format!("r-{i}"))
        .partition(|id| owner(id) != registry);
    assert!(!live.is_empty() && !dead.is_empty());
    // Every id placed before the kill (a loaded machine may refuse one for a moment: a
    // worker's late heartbeat is a 503 with Retry-After).
    for id in live.iter().chain(&dead) {
        let placed = support::node::eventually(Duration::from_secs(10), || {
            get(node.addr, &format!("/threads/{id}"), None).status == 200
        });
        let last = get(node.addr, &format!("/threads/{id}"), None);
        assert!(
            placed,
            "{id}: {} {}\n{}",
            last.status,
            last.text(),
            node.log()
        );
    }

    cluster.node_mut(registry).stop();
    let killed = Instant::now();
    let operator = support::node::token("ops", &["pinboard:operator"], &["*"]);
    let workers = || get(node.addr, "/registry/workers", Some(&operator));
    assert!(support::node::eventually(Duration::from_secs(3), || {
        let r = workers();
        r.status == 503 && r.text() == r#"{"error":"registry unavailable, retry"}"#
    }));
    // Well inside the lease the license was last renewed for (every third of one).
    while killed.elapsed() < Duration::from_secs(4) {
        for id in &live {
            let r = get(node.addr, &format!("/threads/{id}"), None);
            assert_eq!(
                r.status,
                200,
                "{id} at {:?}: {}",
                killed.elapsed(),
                r.text()
            );
        }
    }
    // Once it has lapsed, no id is served.
    assert!(
        support::node::eventually(Duration::from_secs(10), || {
            let r = get(node.addr, &format!("/threads/{}", live[0]), None);
            r.status == 503 && r.text() == r#"{"error":"registry unavailable, retry"}"#
        }),
        "{}",
        node.log()
    );
}

/// Found by `scripts/chaos --profile cluster` (master-kill): a worker that lost its session
/// while a master was down (or while the node's slot map still named it, just after a
/// failover) registered again; the bucket writes failed on that master and the registration
/// answered 503, but it had written a session, and its copies in the other buckets, with the
/// rows it reclaimed there. Placements landed on that session, and its worker, which never
/// learnt of it, refused each forward (403 `invalid attestation`: audience is not this
/// worker's session, 4,700 in one round); its retry could reclaim nothing (the previous
/// session had been replaced) and evicted every instance it held.
///
/// Now a registration writes nothing unless every bucket answers: the 503 leaves the previous
/// session as it was, and the retry once the master is back reclaims every row it still has.
#[test]
fn a_registration_while_a_master_is_down_writes_nothing_and_the_retry_reclaims() {
    use std::time::Duration;
    let keys = support::keys(16);

    let mut cluster = RedisCluster::start_with(&["--cluster-require-full-coverage", "no"]);
    let (node, worker) = warm_node(
        &cluster,
        "300000",
        &[("PINBOARD_REDIS_TIMEOUT_MS", "500")],
        "registration-cut-short",
    );
    let first = cluster_cli(&cluster, &["HGET", keys.clients(), "c1"]);
    let first: Value = serde_json::from_str(&first).unwrap();
    let first = first["sessionId"].as_str().unwrap().to_string();
    let ids: Vec<String> = (0..48).map(|i| format!("cut-{i}")).collect();
    for id in &ids {
        let r = get(node.addr, &format!("/threads/{id}"), None);
        assert_eq!(r.status, 200, "{id}: {}", r.text());
    }
    let master_of = |b: u32| cluster.owner_of(cluster.slot_of(&keys.bucket(b).workers));
    let masters: Vec<usize> = (0..16).map(master_of).collect();
    let registry = cluster.owner_of(cluster.slot_of(keys.sessions()));
    let victim = (0..3).find(|&n| n != registry).unwrap();
    let on_victim = |id: &str| masters[pinboard::store::bucket_of(id, 16) as usize] == victim;
    let (lost, kept): (Vec<&String>, Vec<&String>) = ids.iter().partition(|id| on_victim(id));
    assert!(!lost.is_empty() && !kept.is_empty());

    let token = node.worker_token("acct");
    let reregister = || {
        let (challenge, value) = worker.challenge();
        let body = json!({
            "clientId": "c1", "secret": worker.secret(), "namespaces": ["/threads"],
            "advertiseUrl": worker.url(), "headroom": 100, "draining": false,
            "challenge": challenge, "challengeValue": value,
            "prevSessionId": first, "instances": {"/threads": ids},
        });
        post_json(
            node.addr,
            "/registry/register",
            Some(&token),
            &body.to_string(),
        )
    };

    cluster.node_mut(victim).stop();
    let r = reregister();
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.text(), r#"{"error":"registry unavailable, retry"}"#);
    // Nothing written: the previous session is the client's and the only one, and no bucket
    // that answers holds a copy of another.
    let sessions = cluster.nodes()[registry].cli(&["-c", "HKEYS", keys.sessions()]);
    assert_eq!(sessions, first, "sessions after the 503");
    let pointer = cluster.nodes()[registry].cli(&["-c", "HGET", keys.clients(), "c1"]);
    assert!(pointer.contains(&first), "{pointer}");
    for b in (0..16).filter(|&b| masters[b as usize] != victim) {
        let owner = masters[b as usize];
        let copies = cluster.nodes()[owner].cli(&["HKEYS", &keys.bucket(b).workers]);
        assert_eq!(copies, first, "bucket {b}'s copies after the 503");
    }

    // The master back (empty: its buckets' rows are gone), the retry reclaims the others.
    cluster.node_mut(victim).restart();
    cluster.wait_ok();
    let mut last = None;
    assert!(
        support::node::eventually(Duration::from_secs(20), || {
            let r = reregister();
            let ok = r.status == 200;
            last = Some(r);
            ok
        }),
        "{:?}\n{}",
        last.map(|r| (r.status, r.text())),
        node.log()
    );
    let answer = last.unwrap().json();
    let mut evicted: Vec<String> = answer["duplicates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["id"].as_str().unwrap().to_string())
        .collect();
    evicted.sort();
    let mut expected: Vec<String> = lost.iter().map(|id| id.to_string()).collect();
    expected.sort();
    assert_eq!(
        evicted, expected,
        "only the ids whose rows died with the master are evicted"
    );
}

/// The ownership ledger on a cluster: each bucket's stream and index live in the bucket's own
/// slot, so the scripts that append (here: placements on every master, a release, an
/// operator's wind-down) and the history's reads touch one slot each.
#[test]
fn the_ledger_and_its_history_on_a_cluster() {
    let keys = support::keys(16);
    let cluster = RedisCluster::start();
    let (node, _worker) = warm_node(&cluster, "60000", &[], "ledger-secret");
    let cli = |args: &[&str]| cluster_cli(&cluster, args);
    for b in 0..16 {
        let slot = cluster.slot_of(&keys.bucket(b).workers);
        assert_eq!(cluster.slot_of(&keys.bucket(b).ledger), slot, "bucket {b}");
        assert_eq!(
            cluster.slot_of(&keys.bucket(b).ledger_last),
            slot,
            "bucket {b}"
        );
    }
    assert!(support::cluster::all_forward(&node), "{}", node.log());
    let ops = support::node::token("ops", &["pinboard:operator"], &["*"]);
    let history = |id: &str| {
        let path = format!("/registry/history?ns=/threads&id={id}");
        let r = get(node.addr, &path, Some(&ops));
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()["entries"].as_array().unwrap().clone()
    };
    let reasons = |id: &str| -> Vec<String> {
        history(id)
            .iter()
            .map(|e| e["reason"].as_str().unwrap().to_owned())
            .collect()
    };
    // Every id placed once, on every master.
    let session = history("id-0")[0]["to"].as_str().unwrap().to_owned();
    for i in 0..24 {
        assert_eq!(reasons(&format!("id-{i}")), ["placed"], "id-{i}");
    }
    let total: u64 = (0..16)
        .map(|b| {
            cli(&["XLEN", &keys.bucket(b).ledger])
                .parse::<u64>()
                .unwrap()
        })
        .sum();
    assert_eq!(total, 24, "one entry per placement, whichever master");

    // The worker gives id-3 back at the epoch its entry names; an operator fences id-5.
    let epoch = &history("id-3")[0]["epoch"];
    let release =
        json!([{"sessionId": session, "namespace": "/threads", "id": "id-3", "epoch": epoch}]);
    let (path, body) = ("/registry/release", release.to_string());
    let r = post_json(node.addr, path, Some(&node.worker_token("acct")), &body);
    assert_eq!(r.json(), json!({"released": 1}));
    let wind = json!({"namespace": "/threads", "id": "id-5", "deadline": 30});
    let r = post_json(
        node.addr,
        "/registry/wind_down",
        Some(&ops),
        &wind.to_string(),
    );
    assert_eq!(r.json(), json!({"queued": true}));
    assert_eq!(reasons("id-3"), ["released", "placed"]);
    assert_eq!(reasons("id-5"), ["wind-down", "placed"]);
    assert_eq!(history("id-5")[0]["by"], "ops");
}
