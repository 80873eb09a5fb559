//! Workers behind `https` advertise URLs, end to end through the real node and redis-server,
//! with certificates the test makes: probes, forwards on pooled TLS connections, upgrades,
//! `/registry/stats`, and what a certificate that does not verify costs (a refused
//! registration, a 502 forward). The hand-made worker is reached through a TLS terminator in
//! front of it (`support/tls_front.rs`), so every way it answers stays available; the
//! `pinned-example` binary serves TLS itself.
//!
//! The `pinned-example` tests need that binary next to this test's (`cargo test --workspace`
//! builds it; `cargo build -p pinned --bin pinned-example` does too), or `PINNED_EXAMPLE_BIN`.

mod support;

use std::process::Child;
use std::time::Duration;

use serde_json::json;
use support::certs::{Ca, Pair};
use support::fleet::Fixture;
use support::http::{Client, Reply, get};
use support::node::{eventually, token};
use support::process::{Output, PinnedExample};
use support::tls_front::TlsFront;
use support::worker::{Serve, TestWorker, TunnelEnd};

const WAIT: Duration = Duration::from_secs(5);

/// The spec's answer to every failed registration probe.
const PROBE_FAILED: &str = r#"{"error":"registration probe failed"}"#;

/// A worker certificate for both ways a test names it.
fn worker_pair(ca: &Ca) -> Pair {
    ca.leaf("worker", &["localhost", "127.0.0.1"])
}

/// A warm node trusting `ca` for its workers (one core, so one pool), and a test worker behind
/// a TLS front presenting `pair`.
fn fleet(ca: &Ca, pair: &Pair) -> (Fixture, TestWorker, TlsFront) {
    let f = Fixture::new(&[
        ("PINBOARD_FORWARDS__CA_FILE", ca.cert_str()),
        ("PINBOARD_THREADS", "1"),
    ]);
    f.warm();
    let worker = TestWorker::start("tls-worker");
    let front = TlsFront::start(worker.addr, &pair.cert, &pair.key);
    (f, worker, front)
}

fn register_at(f: &Fixture, worker: &TestWorker, client: &str, url: &str) -> Reply {
    f.register(worker, client, json!({ "advertiseUrl": url }))
}

#[test]
fn an_https_worker_is_probed_forwarded_to_on_pooled_connections_and_asked_for_stats() {
    let ca = Ca::new();
    let (f, worker, front) = fleet(&ca, &worker_pair(&ca));

    // By IP literal (verified against the certificate's IP address) and by name (SNI).
    for (client, url) in [("by-ip", front.url()), ("by-name", front.url_by_name())] {
        let r = register_at(&f, &worker, client, &url);
        assert_eq!(r.status, 200, "{url}: {}\n{}", r.text(), f.node.log());
    }
    let session = f.registered_at(&worker, &front.url());
    assert_eq!(
        worker.probes().len(),
        3,
        "each probe went through the TLS front"
    );

    // The heartbeat's probe too.
    let hb = f.heartbeat(&worker, &session, json!({}));
    assert_eq!(hb.status, 200, "{}", hb.text());
    assert!(!f.node.log().contains("heartbeat probe failed"));

    // Forwards: the second rides the pooled TLS connection of the first.
    let before = front.handshakes();
    let mut c = Client::connect(f.node.addr);
    let first = c.request(b"GET /threads/a/x HTTP/1.1\r\nHost: edge\r\n\r\n");
    assert_eq!(first.status, 200, "{}\n{}", first.text(), f.node.log());
    assert_eq!(first.json()["path"], "/threads/a/x");
    let body = "hello over tls";
    let second = c.request(
        format!(
            "POST /threads/a/y HTTP/1.1\r\nHost: edge\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    );
    assert_eq!(second.status, 200, "{}", second.text());
    assert_eq!(second.json()["body"], body);
    assert_eq!(second.json()["conn"], first.json()["conn"]);
    assert_eq!(
        front.handshakes(),
        before + 1,
        "one handshake for both forwards"
    );

    // /registry/stats asks the worker over TLS too.
    let ops = token("ops", &["pinboard:operator"], &["*"]);
    let stats = get(f.node.addr, "/registry/stats", Some(&ops)).json();
    let entry = stats["workers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["sessionId"] == session)
        .cloned()
        .unwrap();
    assert_eq!(entry["stats"]["path"], "/_pinned/stats", "{entry}");
}

#[test]
fn an_upgrade_tunnels_to_an_https_worker_and_half_closes_through_tls() {
    let ca = Ca::new();
    let (f, worker, front) = fleet(&ca, &worker_pair(&ca));
    f.registered_at(&worker, &front.url());
    worker.set_serve(Serve::Upgrade);

    let upgrade = "GET /threads/ws HTTP/1.1\r\nHost: edge\r\nConnection: Upgrade\r\n\
                   Upgrade: websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
                   Sec-WebSocket-Version: 13\r\n\r\n";
    let mut c = Client::connect(f.node.addr);
    let r = c.request(upgrade.as_bytes());
    assert_eq!(r.status, 101, "{r:?}\n{}", f.node.log());
    assert_eq!(r.header("upgrade"), Some("websocket"));
    assert_eq!(c.read_raw(6), b"hello\n");
    c.send(b"ping");
    assert_eq!(c.read_raw(4), b"PING");
    let big: Vec<u8> = (0..64 * 1024).map(|i| b'a' + (i % 26) as u8).collect();
    c.send(&big);
    assert_eq!(c.read_raw(big.len()), big.to_ascii_uppercase());

    // The client's half-close reaches the worker as close_notify + FIN (the front turns it
    // into a FIN), and what the worker sends after it still reaches the client.
    c.shutdown_write();
    assert_eq!(c.read_until_eof(WAIT).as_deref(), Some(&b"bye\n"[..]));
    assert!(
        eventually(WAIT, || worker.tunnel_ends() == [TunnelEnd::ClientClosed]),
        "{:?}",
        worker.tunnel_ends()
    );

    // The worker closing ends the client's connection.
    let mut c = Client::connect(f.node.addr);
    let r = c.request(upgrade.replace("/threads/ws", "/threads/ws2").as_bytes());
    assert_eq!(r.status, 101, "{r:?}");
    assert_eq!(c.read_raw(6), b"hello\n");
    c.send(b"quit");
    assert_eq!(c.read_until_eof(WAIT).as_deref(), Some(&b""[..]));
}

#[test]
fn a_certificate_that_does_not_verify_fails_the_registration_probe() {
    let ca = Ca::new();
    let (f, worker, mut front) = fleet(&ca, &ca.untrusted("self-signed", &["127.0.0.1"]));

    let r = register_at(&f, &worker, "w1", &front.url());
    assert_eq!((r.status, r.text().as_str()), (400, PROBE_FAILED));
    assert!(worker.probes().is_empty(), "no request got through");
    // The reason is the node's to log, at warn.
    let logged = |reason: &str| {
        eventually(WAIT, || {
            f.node.log().lines().any(|l| {
                l.contains("WARN") && l.contains("registration probe failed") && l.contains(reason)
            })
        })
    };
    assert!(logged("UnknownIssuer"), "{}", f.node.log());

    // Signed by the trusted CA, but for another name.
    let port = front.addr;
    front.stop();
    let elsewhere = ca.leaf("elsewhere", &["worker.example"]);
    let _front = TlsFront::on(port, worker.addr, &elsewhere.cert, &elsewhere.key);
    let r = register_at(
        &f,
        &worker,
        "w1",
        &format!("https://127.0.0.1:{}", port.port()),
    );
    assert_eq!((r.status, r.text().as_str()), (400, PROBE_FAILED));
    assert!(logged("not valid for name"), "{}", f.node.log());

    // A plain-HTTP worker advertised as https fails its handshake the same way.
    let r = register_at(
        &f,
        &worker,
        "w1",
        &format!("https://127.0.0.1:{}", worker.addr.port()),
    );
    assert_eq!((r.status, r.text().as_str()), (400, PROBE_FAILED));
}

#[test]
fn a_forward_to_a_worker_whose_certificate_stops_verifying_is_a_bad_gateway() {
    let ca = Ca::new();
    let (f, worker, mut front) = fleet(&ca, &worker_pair(&ca));
    f.registered_at(&worker, &front.url());
    let ok = get(f.node.addr, "/threads/b/x", None);
    assert_eq!(ok.status, 200, "{}", ok.text());

    // The worker comes back on its port with a certificate nobody vouches for: the pooled
    // connection is gone with the old front, and a fresh one fails its handshake.
    let port = front.addr;
    front.stop();
    let rogue = ca.untrusted("rogue", &["127.0.0.1"]);
    let _front = TlsFront::on(port, worker.addr, &rogue.cert, &rogue.key);
    let r = get(f.node.addr, "/threads/b/x", None);
    assert_eq!((r.status, r.text().as_str()), (502, "bad gateway"));
    assert_eq!(worker.requests().len(), 1, "nothing reached the worker");
    assert!(
        eventually(WAIT, || f.node.log().contains("UnknownIssuer")),
        "{}",
        f.node.log()
    );
}

/// A `pinned-example` process: its stdout lines as they come, its log (stderr) as written.
struct Example {
    child: Child,
    output: Output,
}

impl Example {
    fn start(f: &Fixture, client_id: &str, pair: &Pair) -> Example {
        let tls = [
            "--tls-cert-file",
            pair.cert_str(),
            "--tls-key-file",
            pair.key_str(),
        ];
        let example = PinnedExample {
            bin: &PinnedExample::sibling(),
            registry: &f.node.url(),
            namespaces: "/threads",
            client_id,
        };
        let (child, output) = example.spawn(&tls, &[("PINNED_TOKEN", &f.token)]);
        Example { child, output }
    }

    /// The next stdout line, which must start with `prefix`.
    fn line(&self, prefix: &str) -> String {
        let line = self
            .output
            .lines
            .recv_timeout(Duration::from_secs(15))
            .unwrap_or_else(|_| panic!("no {prefix:?} line:\n{}", self.log()));
        assert!(line.starts_with(prefix), "{line:?}");
        line
    }

    fn log(&self) -> String {
        self.output.log()
    }
}

impl Drop for Example {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn pinned_example_serving_https_registers_serves_forwards_and_stats() {
    let ca = Ca::new();
    let f = Fixture::new(&[("PINBOARD_FORWARDS__CA_FILE", ca.cert_str())]);
    f.warm();
    let example = Example::start(&f, "example-tls", &worker_pair(&ca));
    let listening = example.line("listening ");
    let advertise = listening
        .split_whitespace()
        .find_map(|w| w.strip_prefix("advertise="))
        .unwrap()
        .to_owned();
    assert!(advertise.starts_with("https://127.0.0.1:"), "{listening}");
    let registered = example.line("registered session=");
    let session = registered
        .trim_start_matches("registered session=")
        .to_owned();

    for count in 1..=2 {
        let r = get(f.node.addr, "/threads/tls/count", None);
        assert_eq!(r.status, 200, "{}\n{}", r.text(), f.node.log());
        assert_eq!(r.json()["count"], count);
        assert_eq!(r.json()["session"], session);
    }

    let ops = token("ops", &["pinboard:operator"], &["*"]);
    let stats = get(f.node.addr, "/registry/stats", Some(&ops)).json();
    let entry = &stats["workers"][0];
    assert_eq!(entry["sessionId"], session, "{stats}");
    assert_eq!(entry["stats"]["advertiseUrl"], advertise, "{stats}");
    assert_eq!(entry["stats"]["instances"]["/threads"], json!(["tls"]));
}

#[test]
fn pinned_example_with_an_untrusted_certificate_is_refused_registration() {
    let ca = Ca::new();
    let f = Fixture::new(&[("PINBOARD_FORWARDS__CA_FILE", ca.cert_str())]);
    f.warm();
    let example = Example::start(&f, "example-rogue", &ca.untrusted("rogue", &["127.0.0.1"]));
    example.line("listening ");
    assert!(
        eventually(Duration::from_secs(10), || example
            .log()
            .contains("registry answered 400: registration probe failed")),
        "{}",
        example.log()
    );
    assert!(f.node.log().contains("UnknownIssuer"), "{}", f.node.log());
}
