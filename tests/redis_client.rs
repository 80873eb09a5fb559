//! The per-core Redis client against a real redis-server (and a real 3-master cluster), on both
//! monoio drivers.

mod support;

use std::cell::RefCell;
use std::collections::HashSet;
use std::future::Future;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use pinboard::redis::{Redis, RedisError, RedisOptions, RedisTarget, Reply};
use pinboard::store::scripts::READY;
use pinboard::store::{Keys, bucket_of};
use support::redis::{RedisCluster, RedisServer};

/// Bound on every test body: a hang fails the test instead of the suite.
const TEST_BOUND: Duration = Duration::from_secs(60);
const CONNECT_WITHIN: Duration = Duration::from_secs(10);

/// Runs the test body once on io_uring and once on epoll.
fn each_driver<F, Fut>(body: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = ()>,
{
    monoio::RuntimeBuilder::<monoio::IoUringDriver>::new()
        .enable_timer()
        .build()
        .expect("io_uring runtime")
        .block_on(bounded(body()));
    monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
        .enable_timer()
        .build()
        .expect("epoll runtime")
        .block_on(bounded(body()));
}

async fn bounded(body: impl Future<Output = ()>) {
    monoio::time::timeout(TEST_BOUND, body)
        .await
        .expect("test body timed out");
}

fn client(url: &str, opts: RedisOptions) -> Redis {
    Redis::connect(&RedisTarget::parse(url).expect("valid url"), opts)
}

async fn connected(url: &str) -> Redis {
    let redis = client(url, RedisOptions::default());
    wait_until("client connected", || redis.is_connected()).await;
    redis
}

async fn wait_until(what: &str, condition: impl Fn() -> bool) {
    let deadline = Instant::now() + CONNECT_WITHIN;
    while !condition() {
        assert!(
            Instant::now() < deadline,
            "{what}: not within {CONNECT_WITHIN:?}"
        );
        monoio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn bulk(s: &str) -> Reply {
    Reply::Bulk(s.into())
}

fn ok() -> Reply {
    Reply::Simple("OK".into())
}

#[test]
fn pipelined_requests_get_their_own_replies() {
    each_driver(|| async {
        let server = RedisServer::start();
        let redis = connected(&server.url()).await;
        redis
            .cmd(&[b"SET", b"text", b"not a number"])
            .await
            .unwrap();
        let tasks: Vec<_> = (0..1000)
            .map(|i| {
                let redis = redis.clone();
                monoio::spawn(async move {
                    let key = format!("key:{i}");
                    let value = format!("value-{i}");
                    let set = redis.cmd(&[b"SET", key.as_bytes(), value.as_bytes()]).await;
                    assert_eq!(set, Ok(ok()));
                    // Error replies in between must not shift anyone's reply.
                    if i % 3 == 0 {
                        let err = redis.cmd(&[b"INCR", b"text"]).await.unwrap_err();
                        assert!(
                            matches!(&err, RedisError::Reply(m) if m.starts_with("ERR")),
                            "{err:?}"
                        );
                        assert!(!err.retryable());
                    }
                    let counter = redis.cmd(&[b"INCR", b"counter"]).await.unwrap();
                    let got = redis.cmd(&[b"GET", key.as_bytes()]).await;
                    assert_eq!(got, Ok(bulk(&value)));
                    counter.as_int().unwrap()
                })
            })
            .collect();
        let mut counters = HashSet::new();
        for task in tasks {
            counters.insert(task.await);
        }
        assert_eq!(counters, (1..=1000).collect::<HashSet<_>>());
        assert_eq!(server.cli(&["GET", "counter"]), "1000");
        assert_eq!(
            redis.cmd(&[b"GET", b"missing"]).await.map(|r| r.is_nil()),
            Ok(true)
        );
    });
}

#[test]
fn server_death_fails_in_flight_requests_then_reconnects() {
    each_driver(|| async {
        let mut server = RedisServer::start();
        // Long enough that only the kill can end the blocked requests below.
        let opts = RedisOptions {
            request_timeout: Duration::from_secs(30),
            ..RedisOptions::default()
        };
        let redis = client(&server.url(), opts);
        wait_until("client connected", || redis.is_connected()).await;
        let send = |args: &'static [&'static [u8]]| {
            let redis = redis.clone();
            monoio::spawn(async move { redis.cmd(args).await })
        };
        // BLPOP blocks the connection server-side; everything pipelined behind it waits too.
        let mut in_flight = vec![send(&[b"BLPOP", b"queue", b"0"])];
        in_flight.extend((0..100).map(|_| send(&[b"GET", b"k"])));
        monoio::time::sleep(Duration::from_millis(100)).await;
        server.stop();
        let killed = Instant::now();
        for request in in_flight {
            assert_eq!(request.await, Err(RedisError::Disconnected));
        }
        assert!(
            killed.elapsed() < Duration::from_secs(5),
            "in-flight requests hung"
        );
        wait_until("disconnect noticed", || !redis.is_connected()).await;
        let refused = redis.cmd(&[b"PING"]).await.unwrap_err();
        assert_eq!(refused, RedisError::Disconnected);
        assert!(refused.retryable());

        server.restart();
        wait_until("reconnected", || redis.is_connected()).await;
        assert_eq!(redis.cmd(&[b"SET", b"k", b"back"]).await, Ok(ok()));
        assert_eq!(redis.cmd(&[b"GET", b"k"]).await, Ok(bulk("back")));
    });
}

#[test]
fn evalsha_loads_the_script_when_the_server_lacks_it() {
    each_driver(|| async {
        let server = RedisServer::start();
        let redis = connected(&server.url()).await;
        let exists = || server.cli(&["SCRIPT", "EXISTS", READY.sha()]);
        assert_eq!(exists(), "0");
        for _ in 0..2 {
            let now_ms = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .as_millis() as i64;
            let clock = redis
                .evalsha(&READY, &[], &[])
                .await
                .unwrap()
                .as_int()
                .unwrap();
            assert!(
                (clock - now_ms).abs() < 60_000,
                "server clock {clock} vs {now_ms}"
            );
            assert_eq!(exists(), "1");
            // Already loaded: no NOSCRIPT round this time.
            assert!(redis.evalsha(&READY, &[], &[]).await.is_ok());
            // Forget it: the next call takes the NOSCRIPT path again.
            assert_eq!(server.cli(&["SCRIPT", "FLUSH"]), "OK");
            assert_eq!(exists(), "0");
        }
    });
}

#[test]
fn auth_and_select_on_every_connect() {
    each_driver(|| async {
        let server = RedisServer::start_with(&["--requirepass", "s3cret"]);
        let wrong = format!("redis://:wrong@127.0.0.1:{}", server.port());
        logs_in_and_selects_on_every_connect(server, &wrong).await;
    });
}

#[test]
fn acl_user_and_select_on_every_connect() {
    each_driver(|| async {
        let server = RedisServer::start_acl("app", "p@ss:w/rd%");
        assert!(server.url().contains("app:p%40ss%3Aw%2Frd%25@"));
        let wrong = format!("redis://app:wrong@127.0.0.1:{}", server.port());
        logs_in_and_selects_on_every_connect(server, &wrong).await;
    });
}

/// A client on `server.url()` with database 3 logs in and selects it, again after a reconnect;
/// one on `wrong` never connects.
async fn logs_in_and_selects_on_every_connect(mut server: RedisServer, wrong: &str) {
    let redis = connected(&format!("{}/3", server.url())).await;
    assert_eq!(redis.cmd(&[b"SET", b"where", b"db3"]).await, Ok(ok()));
    assert_eq!(server.cli(&["-n", "3", "GET", "where"]), "db3");
    assert_eq!(server.cli(&["-n", "0", "EXISTS", "where"]), "0");

    // And again after a reconnect.
    server.stop();
    wait_until("disconnect noticed", || !redis.is_connected()).await;
    server.restart();
    wait_until("reconnected", || redis.is_connected()).await;
    assert_eq!(redis.cmd(&[b"SET", b"again", b"db3"]).await, Ok(ok()));
    assert_eq!(server.cli(&["-n", "3", "GET", "again"]), "db3");

    let rejected = client(wrong, RedisOptions::default());
    monoio::time::sleep(Duration::from_millis(300)).await;
    assert!(!rejected.is_connected());
    assert_eq!(
        rejected.cmd(&[b"PING"]).await,
        Err(RedisError::Disconnected)
    );
}

#[test]
fn timed_out_request_does_not_shift_later_replies() {
    each_driver(|| async {
        let server = RedisServer::start();
        let opts = RedisOptions {
            request_timeout: Duration::from_secs(1),
            ..RedisOptions::default()
        };
        let redis = client(&server.url(), opts);
        wait_until("client connected", || redis.is_connected()).await;
        redis.cmd(&[b"SET", b"k", b"v"]).await.unwrap();
        let started = Instant::now();
        let blocked = redis.cmd(&[b"BLPOP", b"queue", b"0"]).await;
        assert_eq!(blocked, Err(RedisError::Timeout));
        assert!(started.elapsed() < Duration::from_secs(10));
        // Queue a GET behind the still-blocked BLPOP, then unblock it: its late reply arrives
        // first and must be discarded, not handed to the GET.
        let get = monoio::spawn({
            let redis = redis.clone();
            async move { redis.cmd(&[b"GET", b"k"]).await }
        });
        monoio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(server.cli(&["LPUSH", "queue", "x"]), "1");
        assert_eq!(get.await, Ok(bulk("v")));
        assert!(redis.is_connected());
    });
}

#[test]
fn dropping_the_last_handle_closes_the_connection() {
    each_driver(|| async {
        let server = RedisServer::start();
        let clients = || server.cli(&["INFO", "clients"]);
        let redis = connected(&server.url()).await;
        let clone = redis.clone();
        // redis-cli itself is one of the connected clients.
        assert!(clients().contains("connected_clients:2"), "{}", clients());
        drop(redis);
        drop(clone);
        let deadline = Instant::now() + CONNECT_WITHIN;
        while !clients().contains("connected_clients:1") {
            assert!(
                Instant::now() < deadline,
                "connection still open: {}",
                clients()
            );
            monoio::time::sleep(Duration::from_millis(20)).await;
        }
    });
}

#[test]
fn cluster_routes_each_key_to_its_master() {
    let cluster = RedisCluster::start();
    each_driver(|| async {
        let redis = connected(&cluster.url()).await;
        let mut owners = HashSet::new();
        for tag in 0..=50 {
            let key = format!("{{{tag}}}:k");
            let value = tag.to_string();
            assert_eq!(
                redis.cmd(&[b"SET", key.as_bytes(), value.as_bytes()]).await,
                Ok(ok())
            );
            assert_eq!(redis.cmd(&[b"GET", key.as_bytes()]).await, Ok(bulk(&value)));
            let owner = cluster.owner_of(cluster.slot_of(&key));
            owners.insert(owner);
            assert_eq!(cluster.nodes()[owner].cli(&["GET", &key]), value);
        }
        assert_eq!(owners.len(), 3, "keys cover every master");
        assert!(redis.cmd(&[b"PING"]).await.is_ok());

        let keys = Keys::new("pinboard:", 16);
        for id in ["thread-1", "thread-2", "thread-3", "thread-4"] {
            for node in cluster.nodes() {
                node.cli(&["SCRIPT", "FLUSH"]);
            }
            let key = keys.placements(bucket_of(id, 16), "default", "/threads");
            let reply = redis
                .evalsha(&READY, &[key.as_bytes()], &[id.as_bytes()])
                .await;
            assert!(reply.unwrap().as_int().is_some());
            let owner = &cluster.nodes()[cluster.owner_of(cluster.slot_of(&key))];
            assert_eq!(owner.cli(&["SCRIPT", "EXISTS", READY.sha()]), "1");
        }
    });
}

#[test]
fn cluster_follows_ask_and_moved_while_a_slot_migrates() {
    let cluster = RedisCluster::start();
    each_driver(|| follows_ask_and_moved(&cluster));
}

/// Every node wants a login: the redirected requests are sent on logged-in connections too.
#[test]
fn cluster_with_a_login_follows_ask_and_moved() {
    let cluster = RedisCluster::start_acl("app", "p@ss:w/rd%");
    each_driver(|| follows_ask_and_moved(&cluster));
}

/// One slot migrated while the client uses it: ASK while its keys move, MOVED once it has.
async fn follows_ask_and_moved(cluster: &RedisCluster) {
    let redis = connected(&cluster.url()).await;
    let (old, new) = ("{moving}:old", "{moving}:new");
    redis.cmd(&[b"DEL", new.as_bytes()]).await.unwrap();
    assert_eq!(redis.cmd(&[b"SET", old.as_bytes(), b"1"]).await, Ok(ok()));

    let slot = cluster.slot_of(old);
    let from = cluster.owner_of(slot);
    let to = (from + 1) % 3;
    cluster.start_migration(slot, from, to);
    // The key now lives on `to` while `from` still owns the slot: `from` answers ASK.
    assert_eq!(redis.cmd(&[b"GET", old.as_bytes()]).await, Ok(bulk("1")));
    assert_eq!(redis.cmd(&[b"SET", new.as_bytes(), b"2"]).await, Ok(ok()));
    let keys_in_slot =
        |node: usize| cluster.nodes()[node].cli(&["CLUSTER", "COUNTKEYSINSLOT", &slot.to_string()]);
    assert_eq!(
        (keys_in_slot(from), keys_in_slot(to)),
        ("0".into(), "2".into())
    );

    cluster.finish_migration(slot, to);
    // The client still maps the slot to `from`, which now answers MOVED.
    assert_eq!(redis.cmd(&[b"GET", new.as_bytes()]).await, Ok(bulk("2")));
    assert_eq!(
        redis.cmd(&[b"INCR", old.as_bytes()]).await,
        Ok(Reply::Int(2))
    );
    assert_eq!(cluster.owner_of(slot), to);
    assert!(redis.is_connected());
}

#[test]
fn cluster_recovers_when_a_master_restarts() {
    // RefCell: the body stops and restarts a node between awaits.
    let cluster = RefCell::new(RedisCluster::start());
    each_driver(|| async {
        let victim = 0;
        let key_owned = |by_victim: bool| {
            let cluster = cluster.borrow();
            (0..)
                .map(|tag| format!("{{{tag}}}:k"))
                .find(|key| (cluster.owner_of(cluster.slot_of(key)) == victim) == by_victim)
                .expect("some key on every side")
        };
        let (lost, kept) = (key_owned(true), key_owned(false));
        let url = cluster.borrow().url();
        let redis = connected(&url).await;

        // Well inside the cluster's node timeout: the others never declare the victim failed.
        cluster.borrow_mut().node_mut(victim).stop();
        wait_until("master loss noticed", || !redis.is_connected()).await;
        assert_eq!(
            redis.cmd(&[b"GET", lost.as_bytes()]).await,
            Err(RedisError::Disconnected)
        );
        assert_eq!(redis.cmd(&[b"SET", kept.as_bytes(), b"up"]).await, Ok(ok()));

        cluster.borrow_mut().node_mut(victim).restart();
        cluster.borrow().wait_ok();
        wait_until("master back", || redis.is_connected()).await;
        assert_eq!(
            redis.cmd(&[b"SET", lost.as_bytes(), b"back"]).await,
            Ok(ok())
        );
        assert_eq!(
            redis.cmd(&[b"GET", lost.as_bytes()]).await,
            Ok(bulk("back"))
        );
    });
}
