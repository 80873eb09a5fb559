//! A started worker over real sockets, through the public API only, before any registry has
//! accepted it: what it sends to register, how it answers the ownership probe across retries,
//! that nothing is served without a session, and that it stops cleanly.
//!
//! The "registry" here is a bare listener that reads each request and hangs up without
//! answering: the worker's real requests are seen byte for byte, and since every attempt fails
//! the worker retries, each time with a fresh challenge. The flows that need a registry
//! answering are in `registry.rs`.

mod support;

use std::io::{BufRead, BufReader, Read};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use pinned::{
    App, Config, DriverKind, Error, Handle, Instance, Request, Response, StartError, Worker,
};
use serde_json::{Value, json};
use support::http::{Reply, get};
use support::{attestation, eventually};

struct Nothing;

impl App for Nothing {
    async fn handle(
        &self,
        _: &Handle,
        _: &Instance,
        _: &mut Request<'_>,
    ) -> Result<Response, Error> {
        unreachable!("no request is admitted without a session")
    }
}

/// One request the worker sent to the registry, read off the socket.
struct Sent {
    /// Held open: the worker waits for an answer until this is dropped.
    _conn: TcpStream,
    head: String,
    body: Value,
}

impl Sent {
    fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().find_map(|line| {
            let (n, v) = line.split_once(':')?;
            n.eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }
}

fn next_request(registry: &TcpListener) -> Sent {
    let (conn, _) = registry.accept().unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let mut head = String::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        if line == "\r\n" || line.is_empty() {
            break;
        }
        head.push_str(&line);
    }
    let length: usize = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length:")
                .map(|v| v.trim().parse().unwrap())
        })
        .expect("a content-length");
    let mut body = vec![0; length];
    reader.read_exact(&mut body).unwrap();
    Sent {
        _conn: conn,
        head,
        body: serde_json::from_slice(&body).unwrap(),
    }
}

fn probe(handle: &Handle, challenge: &Value, secret: Option<&str>) -> Reply {
    let challenge = challenge.as_str().unwrap();
    let mut client = support::http::Client::connect(handle.local_addr());
    let secret = secret
        .map(|s| format!("Pinboard-Proxy-Secret: {s}\r\n"))
        .unwrap_or_default();
    client.request(
        format!("GET /_pinned/challenge?challenge={challenge} HTTP/1.1\r\nHost: w\r\n{secret}\r\n")
            .as_bytes(),
    )
}

fn config(registry: &TcpListener) -> Config {
    let url = format!("http://{}", registry.local_addr().unwrap());
    let mut config = Config::new(&url, "the-token", "worker-1", &["/threads", "/docs"]);
    config.headroom = 7;
    config
}

#[test]
fn registers_with_a_fresh_challenge_each_attempt_and_answers_the_probe() {
    let registry = TcpListener::bind("127.0.0.1:0").unwrap();
    let worker = Worker::start(config(&registry), Nothing).unwrap();
    let handle = worker.handle().clone();
    assert_eq!(
        handle.advertise_url(),
        format!("http://{}", handle.local_addr())
    );

    let first = next_request(&registry);
    assert!(
        first
            .head
            .starts_with("POST /registry/register HTTP/1.1\r\n"),
        "{}",
        first.head
    );
    assert_eq!(first.header("authorization"), Some("Bearer the-token"));
    assert_eq!(first.header("content-type"), Some("application/json"));
    let secret = handle.secret().to_owned();
    assert!(secret.len() >= 64 && secret.bytes().all(|b| b.is_ascii_hexdigit()));
    let body = &first.body;
    let (c1, v1) = (body["challenge"].clone(), body["challengeValue"].clone());
    assert!(c1.is_string() && v1.is_string() && c1 != v1);
    assert_eq!(
        *body,
        json!({
            "clientId": "worker-1", "secret": secret, "namespaces": ["/threads", "/docs"],
            "advertiseUrl": handle.advertise_url(), "headroom": 7, "draining": false,
            "challenge": c1, "challengeValue": v1,
        }),
        "single mode sends no hostname fields, and a first registration no instances"
    );

    // The probe Pinboard makes while the registration is in flight.
    assert_eq!(
        probe(&handle, &c1, Some(&secret)).json(),
        json!({ "value": v1 })
    );
    let refused = probe(&handle, &c1, None);
    assert_eq!(
        (refused.status, refused.text().as_str()),
        (403, "invalid proxy secret")
    );
    let refused = probe(&handle, &c1, Some(&"f".repeat(64)));
    assert_eq!(
        (refused.status, refused.text().as_str()),
        (403, "invalid proxy secret")
    );

    // Unanswered: the worker retries with a fresh challenge; the previous one still answers.
    drop(first);
    let second = next_request(&registry);
    assert_eq!(second.body["secret"], secret, "one secret per process");
    let (c2, v2) = (
        second.body["challenge"].clone(),
        second.body["challengeValue"].clone(),
    );
    assert!(c2 != c1 && v2 != v1);
    assert_eq!(
        probe(&handle, &c2, Some(&secret)).json(),
        json!({ "value": v2 })
    );
    assert_eq!(
        probe(&handle, &c1, Some(&secret)).json(),
        json!({ "value": v1 })
    );

    drop(second);
    let third = next_request(&registry);
    let (c3, v3) = (
        third.body["challenge"].clone(),
        third.body["challengeValue"].clone(),
    );
    assert_eq!(
        probe(&handle, &c3, Some(&secret)).json(),
        json!({ "value": v3 })
    );
    assert_eq!(
        probe(&handle, &c2, Some(&secret)).json(),
        json!({ "value": v2 })
    );
    let stale = probe(&handle, &c1, Some(&secret));
    assert_eq!(
        (stale.status, stale.text().as_str()),
        (404, "unknown challenge")
    );
    assert_eq!(
        stale.header("content-type"),
        Some("text/plain; charset=utf-8")
    );

    // Shutdown does not wait for the unanswered registration, and closes the listener.
    let started = Instant::now();
    let addr = handle.local_addr();
    worker.shutdown();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert!(TcpStream::connect(addr).is_err());
    drop(third);
}

#[test]
fn nothing_is_served_without_a_session() {
    let registry = TcpListener::bind("127.0.0.1:0").unwrap();
    let worker = Worker::start(config(&registry), Nothing).unwrap();
    let handle = worker.handle();
    assert_eq!(handle.session_id(), None);
    let addr = handle.local_addr();
    // Any audience will do: there is no session for it to match.
    let send = |path: &str| {
        let token = attestation(handle.secret(), "", path, "1");
        let mut client = support::http::Client::connect(addr);
        client.request(
            format!(
                "GET {path} HTTP/1.1\r\nHost: w\r\nPinboard-Attestation: {token}\r\nPinboard-Epoch: 1\r\n\r\n"
            )
            .as_bytes(),
        )
    };
    let refused = json!({ "detail": "invalid attestation" });
    for path in ["/threads/a", "/docs/b/c", "/_pinned/stats"] {
        let reply = send(path);
        assert_eq!(
            (reply.status, reply.json()),
            (403, refused.clone()),
            "{path}"
        );
    }
    assert_eq!(get(addr, "/_pinned/stats", None).status, 403);
    let missing = get(addr, "/other/a", None);
    assert_eq!(
        (missing.status, missing.json()),
        (404, json!({ "detail": "not found" }))
    );
    assert!(handle.held().is_empty());
}

#[test]
fn every_serving_thread_answers_on_one_port() {
    let registry = TcpListener::bind("127.0.0.1:0").unwrap();
    let mut config = config(&registry);
    config.threads = 3;
    config.driver = DriverKind::Epoll;
    let worker = Worker::start(config, Nothing).unwrap();
    let addr = worker.handle().local_addr();
    // Held open at once, the connections spread over the threads' listeners.
    let mut clients: Vec<_> = (0..12)
        .map(|_| support::http::Client::connect(addr))
        .collect();
    for client in &mut clients {
        let reply =
            client.request(b"GET /_pinned/challenge?challenge=x HTTP/1.1\r\nHost: w\r\n\r\n");
        assert_eq!(reply.status, 403);
    }
    drop(clients);
    worker.shutdown();
    assert!(eventually(Duration::from_secs(1), || TcpStream::connect(
        addr
    )
    .is_err()));
}

#[test]
fn start_refuses_what_could_never_work() {
    let registry = TcpListener::bind("127.0.0.1:0").unwrap();
    let mut bad = config(&registry);
    bad.namespaces = vec!["threads".into()];
    match Worker::start(bad, Nothing) {
        Err(StartError::Config(message)) => assert!(message.contains("\"threads\""), "{message}"),
        other => panic!("expected a configuration error, got {:?}", other.err()),
    }
    let mut taken = config(&registry);
    taken.listen = registry.local_addr().unwrap();
    assert!(matches!(
        Worker::start(taken, Nothing),
        Err(StartError::Io(_))
    ));
}
