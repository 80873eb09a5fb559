//! The node on a Redis that wants a login, real redis-server and the real binary: an ACL user
//! (`redis://user:password@`), the `default` user's password (`redis://:password@`), a cluster
//! whose every node wants it; a login refused at start (exit 2, one line, the password masked)
//! and while running (503 + `Retry-After`, never 500, until it is put right).

mod support;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;
use support::cluster::{cluster_cli, warm_node};
use support::fleet::Fixture;
use support::http::get;
use support::node::{Node, SECRET, eventually};
use support::redis::{ADMIN_PASSWORD, RedisCluster, RedisServer, escape};
use support::worker::TestWorker;

/// The node's user.
const USER: &str = "pinboard";
/// A password with what a URL must escape (`@`, `:`, `/`, `%`, `#`, `?`): the node is given it
/// percent-encoded.
const PASSWORD: &str = "p@ss:w/rd%#?-0123";

/// Warms the fixture, registers a worker and forwards a request to it: the worker and its
/// session.
fn serves(f: &Fixture, label: &str) -> (TestWorker, String) {
    f.warm();
    let worker = TestWorker::start(label);
    let session = f.registered(&worker, "w1");
    let r = get(f.node.addr, "/threads/a1/x", None);
    assert_eq!(r.status, 200, "{}\n{}", r.text(), f.node.log());
    assert_eq!(r.json()["path"], "/threads/a1/x");
    (worker, session)
}

/// The `user=` of every connection `redis` lists (this redis-cli's own among them).
fn users(redis: &RedisServer) -> Vec<String> {
    redis
        .cli(&["CLIENT", "LIST"])
        .lines()
        .filter_map(|l| l.split(' ').find_map(|f| f.strip_prefix("user=")))
        .map(str::to_owned)
        .collect()
}

/// While the node's login is refused: `/readyz` turns 503 and stays so; the data plane and a
/// registry route answer 503 + `Retry-After: 1` with the spec's body, never 500.
fn unavailable_until_fixed(f: &Fixture, worker: &TestWorker, session: &str) {
    let addr = f.node.addr;
    assert!(
        eventually(Duration::from_secs(15), || {
            (0..6).all(|_| get(addr, "/readyz", None).status == 503)
        }),
        "readyz stayed 200 with the login refused:\n{}",
        f.node.log()
    );
    for i in 0..10 {
        for r in [
            get(addr, &format!("/threads/a{i}/x"), None),
            f.heartbeat(worker, session, json!({})),
        ] {
            assert_eq!(r.status, 503, "{}\n{}", r.text(), f.node.log());
            assert_eq!(r.header("retry-after"), Some("1"));
            let error = r.json()["error"].clone();
            assert!(
                error == "registry unavailable, retry" || error == "not the serving fleet",
                "{error}"
            );
        }
    }
    assert!(get(addr, "/readyz", None).body.is_empty());
}

/// Until the node's log says `what`.
fn logs(node: &Node, what: &str) {
    assert!(
        eventually(Duration::from_secs(5), || node.log().contains(what)),
        "{what} is not in the log:\n{}",
        node.log()
    );
}

#[test]
fn an_acl_user_registers_and_forwards() {
    let f = Fixture::on(RedisServer::start_acl(USER, PASSWORD), &[]);
    serves(&f, "acl");
    // Every connection of the node (one per core at least) is logged in as the user: the only
    // `default` one (what a connection is before AUTH) is this redis-cli's.
    let users = users(&f.redis);
    assert!(
        users.iter().filter(|u| *u == USER).count() >= 2,
        "{users:?}"
    );
    assert_eq!(
        users.iter().filter(|u| *u == "default").count(),
        1,
        "{users:?}"
    );
    assert!(!f.node.log().contains(PASSWORD));
}

#[test]
fn the_password_only_form_then_requirepass_changed_live() {
    let redis = RedisServer::start_with(&["--requirepass", PASSWORD]);
    assert!(redis.url().starts_with("redis://:p%40ss%3Aw%2Frd%25"));
    let mut f = Fixture::on(redis, &[]);
    let (worker, session) = serves(&f, "requirepass");

    // Changed under the node: its connections stay logged in until they are dropped, and then
    // every reconnect is refused.
    f.redis.set_requirepass("changed-under-the-node");
    f.cli(&["CLIENT", "KILL", "TYPE", "normal"]);
    unavailable_until_fixed(&f, &worker, &session);
    logs(&f.node, "WRONGPASS");

    f.redis.set_requirepass(PASSWORD);
    f.node.wait_until_ready();
    assert_eq!(get(f.node.addr, "/threads/a1/x", None).status, 200);
    assert!(!f.node.log().contains(PASSWORD));
}

#[test]
fn an_acl_user_changed_live_is_unavailable_not_an_error() {
    let f = Fixture::on(RedisServer::start_acl(USER, PASSWORD), &[]);
    let (worker, session) = serves(&f, "acl-live");

    // Its permissions taken away on the live connections: every command answers NOPERM.
    f.cli(&["ACL", "SETUSER", USER, "-@all"]);
    unavailable_until_fixed(&f, &worker, &session);
    f.cli(&["ACL", "SETUSER", USER, "+@all"]);
    f.node.wait_until_ready();

    // Its password changed and its connections dropped: every reconnect is refused.
    f.cli(&["ACL", "SETUSER", USER, "resetpass", ">another-password"]);
    f.cli(&["CLIENT", "KILL", "USER", USER]);
    unavailable_until_fixed(&f, &worker, &session);
    logs(&f.node, "WRONGPASS");

    f.cli(&["ACL", "SETUSER", USER, "resetpass", &format!(">{PASSWORD}")]);
    f.node.wait_until_ready();
    assert_eq!(get(f.node.addr, "/threads/a1/x", None).status, 200);
    let log = f.node.log();
    assert!(!log.contains(PASSWORD) && !log.contains(&escape(PASSWORD)));
}

/// `pinboard serve` on `redis_url`, bounded: its exit code and stderr.
fn serve(redis_url: &str) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let stderr = dir.path().join("stderr");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_pinboard"));
    for (key, _) in std::env::vars().filter(|(k, _)| k.starts_with("PINBOARD_")) {
        cmd.env_remove(key);
    }
    let mut child = cmd
        .arg("serve")
        .env("PINBOARD_LISTEN", "127.0.0.1:0")
        .env("PINBOARD_REDIS_URL", redis_url)
        .env("PINBOARD_PASSPORT__HS256_SECRET", SECRET)
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&stderr).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "pinboard serve did not exit on {redis_url}:\n{}",
                std::fs::read_to_string(&stderr).unwrap()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (status.code(), std::fs::read_to_string(&stderr).unwrap())
}

#[test]
fn a_refused_login_at_start_exits_2_with_one_line() {
    let acl = RedisServer::start_acl(USER, PASSWORD);
    let port = acl.port();
    let wrong = "Wrong-Secret-Password";
    for (url, reason) in [
        (
            format!("redis://{USER}:{wrong}@127.0.0.1:{port}"),
            "WRONGPASS",
        ),
        (format!("redis://:{wrong}@127.0.0.1:{port}"), "WRONGPASS"),
        (
            format!("redis-cluster://{USER}:{wrong}@127.0.0.1:{port}"),
            "WRONGPASS",
        ),
        (format!("redis://127.0.0.1:{port}"), "NOAUTH"),
        // The right login, a database Redis does not have.
        (format!("{}/99", acl.url()), "DB index"),
    ] {
        let (code, stderr) = serve(&url);
        assert_eq!(code, Some(2), "{url}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
        assert!(
            stderr.contains("redis_url") && stderr.contains(reason),
            "{stderr}"
        );
        assert!(
            !stderr.contains(wrong) && !stderr.contains(PASSWORD),
            "{stderr}"
        );
        assert!(!stderr.contains(&escape(PASSWORD)), "{stderr}");
    }
    let (_, stderr) = serve(&format!("redis://{USER}:{wrong}@127.0.0.1:{port}"));
    assert!(
        stderr.contains(&format!("redis://{USER}:***@127.0.0.1:{port}")),
        "{stderr}"
    );
}

#[test]
fn a_cluster_with_a_login_on_every_node() {
    let cluster = RedisCluster::start_acl(USER, PASSWORD);
    let (node, _worker) = warm_node(&cluster, "300000", &[], "cluster-acl");
    // The buckets are spread over the three masters: each one found through CLUSTER SLOTS, and
    // each logged in to.
    for i in 0..24 {
        let r = get(node.addr, &format!("/threads/id-{i}/x"), None);
        assert_eq!(r.status, 200, "id-{i}: {}\n{}", r.text(), node.log());
    }
    for redis in cluster.nodes() {
        let users = users(redis);
        assert!(users.iter().any(|u| u == USER), "{users:?}");
        assert_eq!(
            users.iter().filter(|u| *u == "default").count(),
            1,
            "{users:?}"
        );
    }

    // Connections dropped on every master: they come back, logged in again.
    for redis in cluster.nodes() {
        redis.cli(&["CLIENT", "KILL", "USER", USER]);
    }
    assert!(
        eventually(Duration::from_secs(15), || {
            (0..24).all(|i| get(node.addr, &format!("/threads/id-{i}/x"), None).status == 200)
        }),
        "the node did not come back after its connections were dropped:\n{}",
        node.log()
    );

    // The password-only form on the same cluster: the `default` user's password.
    let admin = cluster.url().replacen(
        &format!("{USER}:{}", escape(PASSWORD)),
        &format!(":{ADMIN_PASSWORD}"),
        1,
    );
    assert!(admin.starts_with("redis-cluster://:admin"), "{admin}");
    let other = Node::start(&admin, &[("PINBOARD_SHARDS", "16")]);
    assert_eq!(
        cluster_cli(&cluster, &["EXISTS", support::keys(16).fleet()]),
        "1"
    );
    assert_eq!(get(other.addr, "/threads/id-1/x", None).status, 200);
    assert!(!node.log().contains(PASSWORD) && !other.log().contains(ADMIN_PASSWORD));
}
