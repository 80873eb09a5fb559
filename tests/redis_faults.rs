//! When Redis cannot answer (contract §8): the node answers 503 `registry unavailable, retry` +
//! `Retry-After: 1` on the data plane and the registry, never 500, keeps `/registry/health`
//! at 200, and recovers by itself once Redis is back. Real redis-servers, killed and paused.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::json;
use support::fleet::Fixture;
use support::http::get;
use support::node::{eventually, token};
use support::redis::RedisServer;
use support::worker::TestWorker;

/// The answers a request may get while Redis is away: served, or one of the spec's 503s.
fn acceptable(status: u16, body: &str, retry_after: Option<&str>) -> bool {
    match status {
        200 => true,
        503 => {
            retry_after.is_some()
                && [
                    r#"{"error":"registry unavailable, retry"}"#,
                    r#"{"error":"not the serving fleet"}"#,
                ]
                .contains(&body)
        }
        _ => false,
    }
}

/// Requests `ids` round and round from two threads until `stop`; returns (answers, 503s) and
/// panics on any answer that is neither 200 nor a spec 503.
fn load(addr: std::net::SocketAddr, ids: Vec<String>, stop: Arc<AtomicBool>) -> (u64, u64) {
    let (mut answers, mut unavailable) = (0, 0);
    while !stop.load(Ordering::SeqCst) {
        for id in &ids {
            let r = get(addr, &format!("/threads/{id}"), None);
            let body = r.text();
            assert!(
                acceptable(r.status, &body, r.header("retry-after")),
                "{id}: {} {body}",
                r.status
            );
            answers += 1;
            unavailable += u64::from(r.status == 503);
        }
    }
    (answers, unavailable)
}

#[test]
fn redis_killed_mid_load_never_answers_500_and_recovers() {
    let redis = RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
    let mut f = Fixture::on(redis, &[("PINBOARD_REDIS_TIMEOUT_MS", "500")]);
    f.warm();
    let worker = TestWorker::start("w");
    f.registered(&worker, "w1");
    let ids: Vec<String> = (0..20).map(|i| format!("k{i}")).collect();
    for id in &ids {
        assert_eq!(
            get(f.node.addr, &format!("/threads/{id}"), None).status,
            200
        );
    }
    let rows: Vec<_> = ids.iter().map(|id| f.row("/threads", id)).collect();

    let stop = Arc::new(AtomicBool::new(false));
    let loaders: Vec<_> = (0..2)
        .map(|_| {
            let (ids, stop, addr) = (ids.clone(), stop.clone(), f.node.addr);
            std::thread::spawn(move || load(addr, ids, stop))
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    f.redis.stop();
    let ops = token("ops", &["pinboard:operator"], &["*"]);
    std::thread::sleep(Duration::from_millis(1000));
    assert_eq!(get(f.node.addr, "/registry/health", Some(&ops)).status, 200);
    f.redis.restart();
    // Back by itself: every id served again, by the same owner at the same epoch.
    assert!(
        eventually(Duration::from_secs(15), || ids.iter().all(|id| get(
            f.node.addr,
            &format!("/threads/{id}"),
            None
        )
        .status
            == 200)),
        "{}",
        f.node.log()
    );
    stop.store(true, Ordering::SeqCst);
    let (mut answers, mut unavailable) = (0, 0);
    for l in loaders {
        let (a, u) = l.join().unwrap();
        answers += a;
        unavailable += u;
    }
    eprintln!("{answers} answers during the kill, {unavailable} of them 503");
    assert!(unavailable > 0, "the kill was seen");
    let after: Vec<_> = ids.iter().map(|id| f.row("/threads", id)).collect();
    assert_eq!(rows, after, "no id moved");
    let health = get(f.node.addr, "/registry/health", Some(&ops)).json();
    assert!(
        health["resolutions"]["unavailable"].as_u64().unwrap() > 0,
        "{health}"
    );
}

#[test]
fn redis_paused_past_the_timeout_answers_503_then_serves() {
    let redis = RedisServer::start();
    let f = Fixture::on(redis, &[("PINBOARD_REDIS_TIMEOUT_MS", "300")]);
    f.warm();
    let worker = TestWorker::start("w");
    let session = f.registered(&worker, "w1");
    assert_eq!(get(f.node.addr, "/threads/p", None).status, 200);

    // Paused for as long as the checks below take: the node's connection stays open, its
    // commands go unanswered and time out. (A `DEBUG SLEEP` from a redis-cli spawned on the
    // side, as this test once used, starts and ends on the clock: a loaded machine could start
    // it too late for the first request, or end it before the heartbeat.)
    f.redis.pause();
    let r = get(f.node.addr, "/threads/p", None);
    assert_eq!(
        (r.status, r.text().as_str(), r.header("retry-after")),
        (503, r#"{"error":"registry unavailable, retry"}"#, Some("1"))
    );
    let beat = f.heartbeat(&worker, &session, json!({}));
    assert_eq!(beat.status, 503, "{}", beat.text());
    f.redis.resume();
    assert!(eventually(Duration::from_secs(5), || get(
        f.node.addr,
        "/threads/p",
        None
    )
    .status
        == 200));
    assert_eq!(f.heartbeat(&worker, &session, json!({})).status, 200);
}

/// Contract §8 past one lease: with Redis away longer than the fleet license lives, the node
/// has lost its license and must not place or forward, but it says why as the contract does:
/// 503 `registry unavailable, retry` + `Retry-After: 1` on the data plane and the registry,
/// counted `unavailable` (not `not-serving`); `/readyz` 503; the log says Redis is the trouble.
/// Once Redis answers again the node claims the license back and serves.
#[test]
fn redis_away_past_a_lease_says_registry_unavailable_until_it_is_back() {
    let redis = RedisServer::start();
    let f = Fixture::on(
        redis,
        &[
            ("PINBOARD_LEASE_TTL_MS", "1500"),
            ("PINBOARD_REDIS_TIMEOUT_MS", "300"),
        ],
    );
    f.warm();
    let worker = TestWorker::start("w");
    let session = f.registered(&worker, "w1");
    assert_eq!(get(f.node.addr, "/threads/p", None).status, 200);
    let ops = token("ops", &["pinboard:operator"], &["*"]);

    f.redis.pause();
    // Well past the lease the license was last claimed for.
    std::thread::sleep(Duration::from_millis(3000));
    f.node
        .logs("Redis timed out, and the fleet license has lapsed");
    let unavailable = (503, r#"{"error":"registry unavailable, retry"}"#, Some("1"));
    for i in 0..6 {
        let r = get(f.node.addr, &format!("/threads/p{i}"), None);
        assert_eq!(
            (r.status, r.text().as_str(), r.header("retry-after")),
            unavailable,
            "{}",
            f.node.log()
        );
        let beat = f.heartbeat(&worker, &session, json!({}));
        assert_eq!(
            (
                beat.status,
                beat.text().as_str(),
                beat.header("retry-after")
            ),
            unavailable
        );
        let r = get(f.node.addr, "/registry/workers", Some(&ops));
        assert_eq!(
            (r.status, r.text().as_str()),
            (unavailable.0, unavailable.1)
        );
        assert_eq!(get(f.node.addr, "/readyz", None).status, 503);
    }
    let health = get(f.node.addr, "/registry/health", Some(&ops));
    assert_eq!(health.status, 200);
    let resolutions = &health.json()["resolutions"];
    assert!(
        resolutions["unavailable"].as_u64().unwrap() >= 18,
        "{resolutions}"
    );
    assert_eq!(resolutions["not-serving"], 0, "{resolutions}");
    let log = f.node.log();
    assert!(!log.contains("peer disagrees"), "{log}");

    f.redis.resume();
    // The worker's lease ran out meanwhile: it registers again, and is served.
    assert!(
        eventually(Duration::from_secs(10), || get(
            f.node.addr,
            "/readyz",
            None
        )
        .status
            == 200),
        "{}",
        f.node.log()
    );
    f.node.logs("serving: holding the fleet license");
    assert!(eventually(Duration::from_secs(10), || {
        f.register(&worker, "w1", json!({})).status == 200
            && get(f.node.addr, "/threads/p", None).status == 200
    }));
}

/// One Redis connection kept open by the test, asked with inline commands: it stays usable
/// while `maxclients` turns every new connection away.
struct Held(std::io::BufReader<std::net::TcpStream>);

impl Held {
    fn open(redis: &RedisServer) -> Held {
        let stream = std::net::TcpStream::connect(("127.0.0.1", redis.port())).unwrap();
        Held(std::io::BufReader::new(stream))
    }

    /// The reply to `command`: a status or error line, an integer, or a bulk string's text.
    fn ask(&mut self, command: &str) -> String {
        use std::io::{BufRead, Read, Write};
        write!(self.0.get_mut(), "{command}\r\n").unwrap();
        let mut line = String::new();
        self.0.read_line(&mut line).unwrap();
        let line = line.trim_end();
        let Some(len) = line.strip_prefix('$') else {
            return line[1..].to_owned();
        };
        let mut bulk = vec![0; len.parse::<usize>().unwrap() + 2];
        self.0.read_exact(&mut bulk).unwrap();
        String::from_utf8_lossy(&bulk[..bulk.len() - 2]).into_owned()
    }
}

#[test]
fn one_core_cut_off_from_redis_makes_the_node_unready_whichever_core_is_asked() {
    let redis = RedisServer::start();
    let f = Fixture::on(redis, &[("PINBOARD_THREADS", "2")]);
    f.warm();
    let worker = TestWorker::start("w");
    f.registered(&worker, "w1");
    f.node.wait_until_ready();

    // One core's connection dropped, and no room for it to come back: Redis takes no more
    // clients than it has now.
    let mut held = Held::open(&f.redis);
    let own = held.ask("CLIENT ID");
    let theirs: Vec<String> = held
        .ask("CLIENT LIST")
        .lines()
        .filter_map(|l| l.split_whitespace().next()?.strip_prefix("id="))
        .filter(|id| *id != own)
        .map(str::to_owned)
        .collect();
    assert_eq!(theirs.len(), 2, "one connection per core");
    assert_eq!(
        held.ask(&format!("CONFIG SET maxclients {}", theirs.len())),
        "OK"
    );
    assert_eq!(held.ask(&format!("CLIENT KILL ID {}", theirs[0])), "1");
    f.node.logs("redis connection lost");

    // Whichever core a probe reaches, the node is not ready (the one still connected used to
    // say 200 for it), while that core serves what it accepts and the other answers the
    // spec's 503.
    assert!(
        eventually(Duration::from_secs(5), || {
            (0..12).all(|_| get(f.node.addr, "/readyz", None).status == 503)
        }),
        "{}",
        f.node.log()
    );
    let statuses: Vec<u16> = (0..24)
        .map(|i| {
            let r = get(f.node.addr, &format!("/threads/c{i}"), None);
            assert!(acceptable(r.status, &r.text(), r.header("retry-after")));
            r.status
        })
        .collect();
    assert!(statuses.contains(&200), "{statuses:?}");
    // `/metrics` names the core (a scrape the cut-off core takes may fail to read the fleet).
    let ops = token("ops", &["pinboard:operator"], &["*"]);
    let connected = || {
        let r = get(f.node.addr, "/metrics", Some(&ops));
        let text = r.text();
        (r.status == 200).then(|| {
            (0..2)
                .map(|core| {
                    let sample = format!("pinboard_redis_connected{{core=\"{core}\"}}");
                    support::metric(&text, &sample)
                        .unwrap_or_else(|| panic!("no {sample} in\n{text}"))
                })
                .collect::<Vec<f64>>()
        })
    };
    let mut cut_off = None;
    assert!(
        eventually(Duration::from_secs(5), || {
            cut_off = connected();
            cut_off.is_some()
        }),
        "{}",
        f.node.log()
    );
    let mut cut_off = cut_off.unwrap();
    cut_off.sort_by(f64::total_cmp);
    assert_eq!(cut_off, [0.0, 1.0]);

    // Room again: the core reconnects by itself, and the node is ready and serves on every core.
    assert_eq!(held.ask("CONFIG SET maxclients 10000"), "OK");
    f.node.wait_until_ready();
    for i in 0..12 {
        let r = get(f.node.addr, &format!("/threads/c{i}"), None);
        assert_eq!(r.status, 200, "{}\n{}", r.text(), f.node.log());
    }
    assert!(eventually(Duration::from_secs(2), || connected()
        .is_some_and(|c| c == [1.0, 1.0])));
}
