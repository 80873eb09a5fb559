//! Issue 23's L4, L2 and L3 against the real binary: a path that splits when decoded is never
//! forwarded; lookups of names whose name server never answers do not grow the node's threads
//! past the resolver's pool; a SIGHUP whose key file is a FIFO neither blocks the node nor
//! keeps SIGTERM from stopping it.

mod support;

use std::net::UdpSocket;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::json;
use support::certs::{Ca, LOCAL};
use support::fleet::{Fixture, SHARDS, register_body};
use support::http::{get, post_json};
use support::node::{Node, eventually, token_for_hosts};
use support::redis::RedisServer;
use support::tls::{client_config, presented, session};
use support::worker::TestWorker;

/// What the node's and the libraries' tests are held to (`pinned/tests/data`).
fn paths_that_split() -> Vec<String> {
    serde_json::from_str(include_str!("../pinned/tests/data/paths-that-split.json")).unwrap()
}

/// An encoded `/` or `\`, or a raw `\`: what the node refuses (dot segments it removes).
fn holds_a_separator(rest: &str) -> bool {
    let lower = rest.to_ascii_lowercase();
    lower.contains("%2f") || lower.contains("%5c") || rest.contains('\\')
}

#[test]
fn l4_a_path_that_splits_when_decoded_is_never_forwarded() {
    let (f, worker, _) = Fixture::with_worker(&[], "w1");
    let served = get(f.node.addr, "/threads/abc/a%20b/%41", None);
    assert_eq!(served.status, 200, "{}", served.text());
    for rest in paths_that_split() {
        let path = format!("/threads/abc{rest}");
        let r = get(f.node.addr, &path, None);
        if holds_a_separator(&rest) {
            assert_eq!(
                (r.status, r.text().as_str()),
                (400, "invalid instance id"),
                "{path}"
            );
            assert_eq!(r.header("content-type"), Some("text/plain; charset=utf-8"));
        }
    }
    // What reached the worker: the control case, and dot segments only as the node removed
    // them; no separator that a decoding server would split on.
    let seen = worker.requests();
    assert_eq!(seen[0].path, "/threads/abc/a%20b/%41");
    for request in &seen {
        let rest = request.path.trim_start_matches("/threads/abc");
        assert!(
            !pinboard::http::splits_when_decoded(rest),
            "{}",
            request.path
        );
    }
}

/// Whether this process may give a child a mount namespace of its own (and bind port 53):
/// root with `unshare` on the path.
fn can_unshare() -> bool {
    let root = unsafe { libc::geteuid() } == 0;
    root && Command::new("unshare")
        .args(["--mount", "true"])
        .status()
        .is_ok_and(|s| s.success())
}

#[test]
fn l2_lookups_a_name_server_never_answers_do_not_grow_the_nodes_threads() {
    if !can_unshare() {
        eprintln!("skipped: a private /etc/resolv.conf needs root and unshare");
        return;
    }
    // A name server that never answers: a socket on port 53 of a loopback address of this
    // test's own, never read; the node sees it as its only one.
    let octet = 2 + std::process::id() % 250;
    let silent = UdpSocket::bind(format!("127.0.{octet}.53:53")).expect("bind port 53");
    let dir = tempfile::tempdir().unwrap();
    let resolv = dir.path().join("resolv.conf");
    std::fs::write(
        &resolv,
        format!("nameserver 127.0.{octet}.53\noptions timeout:30 attempts:1\n"),
    )
    .unwrap();
    let resolv = resolv.to_str().unwrap();
    let redis = RedisServer::start();
    let shards = SHARDS.to_string();
    let node = Node::spawn_under(
        &[
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            r#"mount --bind "$0" /etc/resolv.conf && exec "$@""#,
            resolv,
        ],
        &redis.url(),
        &[
            ("PINBOARD_SHARDS", &shards),
            ("PINBOARD_VERIFY_TIMEOUT_MS", "300"),
        ],
    );
    node.wait_until_ready();
    let before = node.threads();

    let worker = TestWorker::start("dns");
    // A credential for named workers, as an operator mints one.
    let token = token_for_hosts(
        "acct-dns",
        &["pinboard:worker"],
        &["*"],
        &["*.blackhole.test"],
    );
    let port = worker.url().rsplit(':').next().unwrap().to_owned();
    let refused: Vec<_> = std::thread::scope(|s| {
        let askers: Vec<_> = (0..16)
            .map(|t| {
                let (worker, token, port, addr) = (&worker, &token, &port, node.addr);
                s.spawn(move || {
                    (0..25)
                        .map(|n| {
                            let url = format!("http://w{t}-{n}.blackhole.test:{port}");
                            let body = register_body(
                                worker,
                                &format!("c{t}-{n}"),
                                json!({ "advertiseUrl": url }),
                            );
                            let r = post_json(
                                addr,
                                "/registry/register",
                                Some(token),
                                &body.to_string(),
                            );
                            (r.status, r.json()["error"].clone())
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        askers.into_iter().flat_map(|a| a.join().unwrap()).collect()
    });
    let during = node.threads();
    assert_eq!(refused.len(), 400);
    for answer in &refused {
        assert_eq!(answer, &(400, json!("registration probe failed")));
    }
    // 400 lookups, each waiting 30 s for an answer: the pool's 4 threads at most.
    assert!(
        during <= before + 4,
        "{before} threads before, {during} after:\n{}",
        node.log()
    );
    // The node goes on serving, and its resolver still answers (a lookup that finds the queue
    // full fails at once rather than waiting).
    assert_eq!(get(node.addr, "/healthz", None).status, 200);
    drop(silent);
}

/// A node serving HTTPS with a pair `pki` signed, ready: (node, its redis).
fn https_node(pki: &Ca, cert: &Path, key: &Path) -> (Node, RedisServer) {
    let redis = RedisServer::start();
    let node = Node::spawn(
        &redis.url(),
        &[
            ("PINBOARD_TLS__CERT_FILE", cert.to_str().unwrap()),
            ("PINBOARD_TLS__KEY_FILE", key.to_str().unwrap()),
        ],
    );
    let config = client_config(pki);
    let up = eventually(Duration::from_secs(20), || {
        session(node.addr, &config).is_ok()
    });
    assert!(up, "no TLS handshake:\n{}", node.log());
    (node, redis)
}

#[test]
fn l3_a_sighup_on_a_fifo_key_blocks_nothing_and_sigterm_stops_the_node() {
    let pki = Ca::new();
    let first = pki.leaf("node", &LOCAL);
    let (mut node, _redis) = https_node(&pki, &first.cert, &first.key);

    // The key path becomes a FIFO nobody writes to.
    std::fs::remove_file(&first.key).unwrap();
    let fifo = std::ffi::CString::new(first.key_str()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    node.signal("HUP");
    node.logs("not a regular file");
    // The reload checks the files the configuration names before it reads them.
    let refusal = node.log_lines("the configuration was refused");
    assert!(
        refusal.iter().any(|l| l.contains(first.key_str())),
        "the path is named: {refusal:?}"
    );
    // The pair in use stays, and later SIGHUPs are still taken.
    let (_, fresh) = session(node.addr, &client_config(&pki)).unwrap();
    assert!(presented(&fresh, &first));
    for _ in 0..3 {
        node.signal("HUP");
    }

    // A normal reload still works after it.
    let second = pki.leaf("second", &LOCAL);
    std::fs::remove_file(&first.key).unwrap();
    std::fs::copy(&second.key, &first.key).unwrap();
    std::fs::copy(&second.cert, &first.cert).unwrap();
    node.signal("HUP");
    let swapped = eventually(Duration::from_secs(5), || {
        let (_, fresh) = session(node.addr, &client_config(&pki)).unwrap();
        presented(&fresh, &second)
    });
    assert!(swapped, "{}", node.log());

    // SIGTERM stops the node within its normal stop time.
    let stopping = Instant::now();
    let status = node.stop();
    assert!(status.success(), "{status:?}\n{}", node.log());
    assert!(stopping.elapsed() < Duration::from_secs(10));
}
