//! The node on a Redis that speaks TLS only, real redis-server (built with TLS) and the real
//! binary: `rediss://user:password@` to an ACL-protected server verified with `redis_ca_file`,
//! `rediss-cluster://` to a 3-master cluster with a login on every node, a certificate that
//! does not verify (at start: exit 2, one line naming `redis_url`; on a live node: 503 +
//! `Retry-After` and `/readyz` 503 until it verifies again), and `rediss://` to a server that
//! does not speak TLS (exit 2 or `/readyz` 503, never a hang).

mod support;

use std::io::{Read, Write};
use std::net::{TcpListener, ToSocketAddrs};
use std::time::{Duration, Instant};

use support::certs::{Ca, LOCAL, Pair};
use support::cluster::{logged_in_on_every_master, warm_node};
use support::fleet::Fixture;
use support::http::get;
use support::node::{Node, eventually, refused_at_start, serve_until_exit};
use support::redis::{RedisCluster, RedisServer, ServerTls, escape};

/// The node's user.
const USER: &str = "pinboard";
/// A password with what a URL must escape.
const PASSWORD: &str = "tls-p@ss:w/rd%-0123";

/// A private CA, and a Redis pair it signed for localhost and 127.0.0.1.
fn pki() -> (Ca, ServerTls) {
    let pki = Ca::new();
    let tls = server_tls(&pki, &pki.leaf("redis", &LOCAL));
    (pki, tls)
}

/// A server presenting `pair`, trusting `pki`'s CA.
fn server_tls(pki: &Ca, pair: &Pair) -> ServerTls {
    ServerTls::new(&pair.cert, &pair.key, &pki.cert)
}

fn ca_setting(pki: &Ca) -> String {
    pki.cert.display().to_string()
}

/// Lines of `log` at warn level that contain `what`.
fn warnings(log: &str, what: &str) -> usize {
    log.lines()
        .filter(|l| l.contains(" WARN ") && l.contains(what))
        .count()
}

#[test]
fn an_acl_user_over_tls_registers_forwards_and_survives_a_certificate_change() {
    let (pki, tls) = pki();
    let ca = ca_setting(&pki);
    let redis = RedisServer::start_tls(&tls, Some((USER, PASSWORD)));
    let url = redis.url();
    assert!(url.starts_with("rediss://pinboard:"), "{url}");
    let mut f = Fixture::on(redis, &[("PINBOARD_REDIS_CA_FILE", &ca)]);
    let (worker, session) = f.serves("tls-acl");
    // The server listens on TLS only: every connection of the node (one per core at least)
    // came through it, and is logged in as the user.
    f.redis.assert_logged_in_as(USER, 2);

    // Connections dropped: they come back, through TLS and the login again.
    f.cli(&["CLIENT", "KILL", "USER", USER]);
    assert!(
        eventually(Duration::from_secs(15), || {
            (0..6).all(|_| get(f.node.addr, "/threads/a1/x", None).status == 200)
        }),
        "the node did not come back after its connections were dropped:\n{}",
        f.node.log()
    );

    // The server down for a while, then back with a certificate the CA did not sign: every
    // reconnect fails verification. The node warns of the streak's first failure (refused),
    // and of the first that is the configuration's, once per core's connection; the rest go
    // to debug, however long it lasts.
    f.redis.stop();
    f.node.logs("Connection refused");
    pki.untrusted("redis", &LOCAL);
    f.redis.restart();
    f.unavailable_until_fixed(&worker, &session);
    f.node.logs("invalid peer certificate");
    std::thread::sleep(Duration::from_secs(3));
    let log = f.node.log();
    let warned = warnings(&log, "invalid peer certificate");
    let retries = log
        .lines()
        .filter(|l| l.contains("invalid peer certificate"))
        .count();
    assert!((1..=2).contains(&warned), "{warned} warnings:\n{log}");
    assert!(retries > warned, "no retry after the first failure:\n{log}");

    // A pair the CA signed again: ready, and serving (the restarted Redis lost the registry).
    pki.leaf("redis", &LOCAL);
    f.redis.restart();
    f.node.wait_until_ready();
    f.serves("tls-acl-again");
    let log = f.node.log();
    assert!(!log.contains(PASSWORD) && !log.contains(&escape(PASSWORD)));
}

#[test]
fn a_tls_cluster_with_a_login_on_every_node() {
    let (pki, tls) = pki();
    let ca = ca_setting(&pki);
    let cluster = RedisCluster::start_tls(&tls, Some((USER, PASSWORD)));
    let url = cluster.url();
    assert!(url.starts_with("rediss-cluster://pinboard:"), "{url}");
    let (node, _worker) = warm_node(
        &cluster,
        "300000",
        &[("PINBOARD_REDIS_CA_FILE", &ca)],
        "cluster-tls",
    );
    // The buckets are spread over the three masters: each found through CLUSTER SLOTS (over
    // TLS, announcing its TLS port), verified, and logged in to, also again once its
    // connections are dropped.
    logged_in_on_every_master(&cluster, &node, USER);
    assert!(!node.log().contains(PASSWORD));
}

/// The one-line refusal at start (exit 2) of a node on `url`, naming `redis_url` and
/// `reason`, never the password.
fn refused(url: &str, env: &[(&str, &str)], reason: &str) -> String {
    let line = refused_at_start(url, env, reason, &[PASSWORD, &escape(PASSWORD)]);
    assert!(
        line.starts_with("config error: redis_url: rediss"),
        "{line}"
    );
    line
}

#[test]
fn a_certificate_that_does_not_verify_exits_2_with_one_line() {
    let pki = Ca::new();
    let ca = ca_setting(&pki);
    let with_ca = [("PINBOARD_REDIS_CA_FILE", ca.as_str())];

    // Signed by no CA the node trusts: with redis_ca_file, and with the system roots alone.
    let untrusted = server_tls(&pki, &pki.untrusted("untrusted", &LOCAL));
    let redis = RedisServer::start_tls(&untrusted, Some((USER, PASSWORD)));
    let masked = format!("rediss://{USER}:***@127.0.0.1:{}/0", redis.port());
    for env in [&with_ca[..], &[]] {
        let line = refused(
            &redis.url(),
            env,
            "invalid peer certificate: UnknownIssuer (trusted: ",
        );
        assert!(line.contains(&masked), "{line}");
    }
    // The first seed of a cluster that answers is checked the same way.
    let cluster_url = redis.url().replacen("rediss://", "rediss-cluster://", 1);
    refused(&cluster_url, &with_ca, "UnknownIssuer");
    drop(redis);

    // Signed by the CA, for another name than the one connected to; the right name works.
    let named = server_tls(&pki, &pki.leaf("named", &["localhost"]));
    let redis = RedisServer::start_tls(&named, Some((USER, PASSWORD)));
    refused(&redis.url(), &with_ca, "not valid for name");
    let localhost_is_this_one =
        ("localhost", redis.port())
            .to_socket_addrs()
            .is_ok_and(|mut addrs| {
                addrs
                    .next()
                    .is_some_and(|a| a.ip().is_loopback() && a.is_ipv4())
            });
    if localhost_is_this_one {
        let by_name = redis.url().replacen("127.0.0.1", "localhost", 1);
        let node = Node::start(&by_name, &with_ca);
        assert_eq!(get(node.addr, "/readyz", None).status, 200);
    } else {
        eprintln!("localhost does not resolve to 127.0.0.1 first here: not started by name");
    }

    // A CA file that is no PEM certificate is refused before Redis is tried.
    let junk = pki.path("junk.pem");
    std::fs::write(&junk, "not a certificate").unwrap();
    let (code, stderr) = serve_until_exit(
        &redis.url(),
        &[("PINBOARD_REDIS_CA_FILE", junk.to_str().unwrap())],
    );
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.starts_with("config error: redis_ca_file:")
            && stderr.trim_end().lines().count() == 1,
        "{stderr}"
    );
}

/// A stand-in for a plain-TCP Redis that answers every read with an error line at once, as
/// redis-server does to a line it does not know: what a TLS client hello gets from it when the
/// hello happens to hold a newline.
fn plain_answering_server() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while stream.read(&mut buf).is_ok_and(|n| n > 0) {
                    if stream.write_all(b"-ERR unknown command\r\n").is_err() {
                        return;
                    }
                }
            });
        }
    });
    port
}

#[test]
fn rediss_to_a_server_without_tls_never_hangs() {
    let pki = Ca::new();
    let ca = ca_setting(&pki);
    let with_ca = [("PINBOARD_REDIS_CA_FILE", ca.as_str())];

    // Answered with plain RESP: not TLS, a configuration that cannot work.
    let port = plain_answering_server();
    refused(
        &format!("rediss://127.0.0.1:{port}"),
        &with_ca,
        "TLS with the server failed: received corrupt message of type InvalidContentType \
         (does it speak TLS on that port?)",
    );

    // A real plain redis-server: it answers a hello only when the hello holds a newline, and
    // otherwise waits for one. Either the node stops at once (exit 2, one line), or its
    // handshake times out and it starts unready, answering promptly, and stays unready.
    let redis = RedisServer::start();
    let url = format!("rediss://127.0.0.1:{}", redis.port());
    let started = Instant::now();
    match Node::try_spawn(&url, &with_ca) {
        Err((code, log)) => {
            assert_eq!(code, Some(2), "{log}");
            let errors: Vec<&str> = log.lines().filter(|l| l.contains("config error")).collect();
            assert_eq!(errors.len(), 1, "{log}");
            assert!(errors[0].starts_with("config error: redis_url: rediss://127.0.0.1:"));
        }
        Ok(node) => {
            let deadline = Instant::now() + Duration::from_secs(3);
            while Instant::now() < deadline {
                let asked = Instant::now();
                let r = get(node.addr, "/readyz", None);
                assert_eq!(r.status, 503, "{}", node.log());
                assert!(asked.elapsed() < Duration::from_secs(2), "readyz took long");
                let r = get(node.addr, "/threads/a1/x", None);
                assert_eq!(r.status, 503, "{}\n{}", r.text(), node.log());
                assert_eq!(r.header("retry-after"), Some("1"));
            }
            node.logs("redis connect failed");
        }
    }
    assert!(started.elapsed() < Duration::from_secs(30));
}
