//! HTTP/2 to clients, end to end: a real node, real workers (which speak HTTP/1.1 and echo what
//! they were sent), a real redis-server, and curl (libcurl on nghttp2) as the client: h2c by
//! prior knowledge on a plain listener with `http.h2c`, `h2` by ALPN on the TLS listener, and
//! each stream the same forward as an HTTP/1.1 request (attestation, epoch, forwarded headers,
//! bodies both ways).

mod support;

use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use support::fleet::{Fixture, register_body};
use support::node::eventually;
use support::tls::https_node;
use support::worker::TestWorker;

/// What curl got: the protocol it spoke, the status, the head's lines and the body.
struct Got {
    version: String,
    status: u16,
    head: String,
    body: Vec<u8>,
}

impl Got {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!("{e}: {}", String::from_utf8_lossy(&self.body));
        })
    }
}

/// `curl ARGS URL`, its head written before its body (`-D -`), the protocol it spoke last.
fn curl(args: &[&str], url: &str) -> Got {
    let out = Command::new("curl")
        .args([
            "-sS",
            "--max-time",
            "20",
            "-D",
            "-",
            "-w",
            "\n%{http_version}",
        ])
        .args(args)
        .arg(url)
        .output()
        .expect("curl runs");
    assert!(
        out.status.success(),
        "curl {args:?} {url}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = out.stdout;
    let split = text
        .windows(4)
        .rposition(|w| w == b"\r\n\r\n")
        .expect("a head");
    let head = String::from_utf8_lossy(&text[..split]).into_owned();
    let rest = &text[split + 4..];
    let cut = rest.iter().rposition(|b| *b == b'\n').expect("the version");
    let version = String::from_utf8_lossy(&rest[cut + 1..]).into_owned();
    let status = head
        .lines()
        .rev()
        .find(|l| l.starts_with("HTTP/"))
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .expect("a status line");
    Got {
        version,
        status,
        head,
        body: rest[..cut].to_vec(),
    }
}

/// The echo's view of the request the worker was sent.
fn sent_to_worker(got: &Got) -> Value {
    assert_eq!(got.status, 200, "{}", String::from_utf8_lossy(&got.body));
    got.json()
}

fn h2c_node(env: &[(&str, &str)]) -> (Fixture, TestWorker) {
    let mut env = env.to_vec();
    env.push(("PINBOARD_HTTP__H2C", "true"));
    let (f, worker, _) = Fixture::with_worker(&env, "w");
    (f, worker)
}

#[test]
fn h2c_by_prior_knowledge_reaches_the_worker_with_attestation_and_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let log_env = log.display().to_string();
    let (f, worker) = h2c_node(&[
        ("PINBOARD_ACCESS_LOG", "json"),
        ("PINBOARD_ACCESS_LOG_PATH", &log_env),
    ]);
    let base = format!("http://{}", f.node.addr);
    let got = curl(
        &[
            "--http2-prior-knowledge",
            "-H",
            "cookie: a=1",
            "-H",
            "cookie: b=2",
        ],
        &format!("{base}/threads/h2-a/x?q=1"),
    );
    assert_eq!(got.version, "2", "{}", got.head);
    let seen = sent_to_worker(&got);
    let headers = &seen["headers"];
    assert_eq!(seen["path"], "/threads/h2-a/x?q=1");
    assert!(headers["pinboard-epoch"].as_str().is_some(), "{seen}");
    assert!(headers["pinboard-attestation"].as_str().is_some(), "{seen}");
    assert_eq!(headers["host"], f.node.addr.to_string());
    assert_eq!(headers["x-forwarded-proto"], "http");
    assert_eq!(headers["x-forwarded-for"], "127.0.0.1");
    // Cookie crumbs are one field again towards an HTTP/1.1 worker (RFC 9113 §8.2.3).
    assert_eq!(headers["cookie"], "a=1; b=2");
    assert!(
        got.head.to_ascii_lowercase().contains("x-request-id: "),
        "{}",
        got.head
    );
    let request = worker.requests().pop().expect("the worker saw it");
    assert!(request.header("pinboard-attestation").is_some());

    // A body both ways: 300 KB up (more than a stream's window), its echo back.
    let dir = tempfile::tempdir().unwrap();
    let upload = dir.path().join("upload");
    std::fs::write(&upload, "z".repeat(300_000)).unwrap();
    let got = curl(
        &[
            "--http2-prior-knowledge",
            "--data-binary",
            &format!("@{}", upload.display()),
        ],
        &format!("{base}/threads/h2-a/upload"),
    );
    assert_eq!(got.version, "2");
    let seen = sent_to_worker(&got);
    assert_eq!(seen["body"].as_str().map(str::len), Some(300_000));
    assert_eq!(seen["method"], "POST");

    // HTTP/1.1 on the same listener is untouched.
    let got = curl(&["--http1.1"], &format!("{base}/threads/h2-a"));
    assert_eq!((got.version.as_str(), got.status), ("1.1", 200));

    // The protocol is counted, and logged as nginx's `$server_protocol` names it.
    let h2 = r#"pinboard_http_requests_by_protocol_total{protocol="HTTP/2"}"#;
    assert!(f.metric(h2) >= 2.0, "{}", f.metrics());
    assert!(
        eventually(Duration::from_secs(5), || {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            text.contains(r#""path":"/threads/h2-a/upload","protocol":"HTTP/2","scheme":"http""#)
        }),
        "{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
}

#[test]
fn tls_offers_h2_by_alpn_unless_turned_off() {
    let (pki, _pair, f) = https_node(&[]);
    let ca = pki.cert.display().to_string();
    let origin = format!("https://localhost:{}", f.node.addr.port());
    let resolve = format!("localhost:{}:127.0.0.1", f.node.addr.port());
    let tls = ["--http2", "--cacert", &ca, "--resolve", &resolve];

    // The worker registers over HTTP/2 too: a registry route with a JSON body.
    let worker = TestWorker::start("w");
    let registration = register_body(&worker, "w1", serde_json::json!({})).to_string();
    let bearer = format!("authorization: Bearer {}", f.token);
    let json = "content-type: application/json";
    let args = [
        &tls[..],
        &["-H", &bearer, "-H", json, "--data", &registration],
    ]
    .concat();
    let got = curl(&args, &format!("{origin}/registry/register"));
    assert_eq!(
        (got.version.as_str(), got.status),
        ("2", 200),
        "{}",
        got.head
    );

    let got = curl(&tls, &format!("{origin}/threads/tls-a"));
    assert_eq!(got.version, "2", "{}", got.head);
    let seen = sent_to_worker(&got);
    assert_eq!(seen["headers"]["x-forwarded-proto"], "https");
    assert!(seen["headers"]["pinboard-epoch"].as_str().is_some());

    let (pki, _pair, f) = https_node(&[("PINBOARD_HTTP__H2", "false")]);
    let ca = pki.cert.display().to_string();
    let url = format!("https://localhost:{}/healthz", f.node.addr.port());
    let resolve = format!("localhost:{}:127.0.0.1", f.node.addr.port());
    let got = curl(&["--http2", "--cacert", &ca, "--resolve", &resolve], &url);
    assert_eq!((got.version.as_str(), got.status), ("1.1", 200));
}
