//! The worker over TLS, against a real `pinboard serve` and redis-server, with certificates the
//! test makes: a listener given a certificate pair serves HTTPS (Pinboard probes and forwards
//! to it, verifying it against its `forwards.ca_file`), and an `https` registry is called over
//! TLS, verified against `registry_ca_file`.
//!
//! Needs the `pinboard` binary next to this test (see `support/node.rs`).

mod support;

use std::time::Duration;

use pinboard_http::tls::{Alpn, ClientTls};
use pinboard_http::{WorkerAddr, fetch};
use pinned::{App, Config, Error, Handle, Instance, Request, Response, StartError, Worker};
use serde_json::json;
use support::certs::Ca;
use support::http::{Client, get};
use support::layout::end_cold_start;
use support::node::{Node, token};
use support::redis::RedisServer;
use support::{block_on, eventually, registered};

/// Answers which instance it served.
struct Echo;

impl App for Echo {
    async fn handle(
        &self,
        worker: &Handle,
        instance: &Instance,
        _: &mut Request<'_>,
    ) -> Result<Response, Error> {
        Ok(Response::json_value(
            http::StatusCode::OK,
            &json!({"ns": instance.ns, "id": instance.id, "session": worker.session_id()}),
        ))
    }
}

#[test]
fn a_worker_with_a_certificate_serves_https_and_pinboard_reaches_it() {
    let ca = Ca::new();
    let pair = ca.leaf("worker", &["localhost", "127.0.0.1"]);
    let redis = RedisServer::start();
    end_cold_start(&redis);
    let node = Node::start(
        &redis.url(),
        &[
            ("PINBOARD_FORWARDS__CA_FILE", ca.cert_str()),
            ("PINBOARD_LEASE_TTL_MS", "2000"),
        ],
    );

    // Registered: the node's probe went over TLS and verified the certificate.
    let worker = registered(&node, "acct-1", &["/threads"], Echo, |c| {
        c.tls_cert_file = Some(pair.cert.clone());
        c.tls_key_file = Some(pair.key.clone());
    });
    let handle = worker.handle();
    let addr = handle.local_addr();
    assert_eq!(handle.advertise_url(), format!("https://{addr}"));
    let session = handle.session_id().unwrap();

    // Forwarded through the node over TLS.
    let r = get(node.addr, "/threads/abc", None);
    assert_eq!(r.status, 200, "{}\n{}", r.text(), node.log());
    assert_eq!(
        r.json(),
        json!({"ns": "/threads", "id": "abc", "session": session})
    );

    // Heartbeats (every third of the lease) keep probing it over TLS: it stays healthy.
    std::thread::sleep(Duration::from_millis(2500));
    let status = handle.status();
    assert!(status.lease_healthy && !status.degraded, "{}", node.log());
    assert!(!node.log().contains("probe failed"), "{}", node.log());

    // Straight to the listener: HTTPS answers, trusting the CA; plain HTTP gets no answer.
    let target = WorkerAddr::parse(handle.advertise_url()).unwrap();
    let nowhere = |tls: &ClientTls| {
        block_on(fetch(
            &target,
            tls,
            http::Method::GET,
            "/nowhere",
            &[],
            b"",
            Duration::from_secs(5),
            4096,
        ))
    };
    let trusting = ClientTls::new(Some(&ca.cert), Alpn::Http1).unwrap();
    let answer = nowhere(&trusting).unwrap();
    assert_eq!(answer.status, 404);
    let mut plain = Client::connect(addr);
    plain.send(b"GET /nowhere HTTP/1.1\r\nHost: w\r\n\r\n");
    let unanswered = plain
        .read_until_eof(Duration::from_secs(5))
        .expect("a plain request to a TLS listener is closed");
    // At most a TLS alert record (content type 21), never an HTTP answer.
    assert!(
        unanswered.is_empty() || unanswered[0] == 21,
        "{unanswered:?}"
    );
    // Without the CA, the same certificate does not verify.
    let roots_only = ClientTls::new(None, Alpn::Http1).unwrap();
    let refused = nowhere(&roots_only).err().expect("an unknown issuer");
    assert!(refused.to_string().contains("UnknownIssuer"), "{refused}");

    worker.shutdown();
}

#[test]
fn an_https_registry_is_called_over_tls_and_verified_with_registry_ca_file() {
    let ca = Ca::new();
    let node_pair = ca.leaf("node", &["localhost", "127.0.0.1"]);
    let redis = RedisServer::start();
    end_cold_start(&redis);
    let node = Node::spawn(
        &redis.url(),
        &[
            ("PINBOARD_TLS__CERT_FILE", node_pair.cert_str()),
            ("PINBOARD_TLS__KEY_FILE", node_pair.key_str()),
        ],
    );
    let registry = format!("https://localhost:{}", node.addr.port());
    let token = token("acct-1", &["pinboard:worker"], &["*"]);
    let config = |client: &str| {
        let mut config = Config::new(&registry, &token, client, &["/threads"]);
        config.call_timeout = Duration::from_secs(5);
        config
    };

    let mut trusting = config("trusting");
    trusting.registry_ca_file = Some(ca.cert.clone());
    let worker = Worker::start(trusting, Echo).unwrap();
    assert!(
        eventually(Duration::from_secs(15), || worker
            .handle()
            .session_id()
            .is_some()),
        "no registration over https:\n{}",
        node.log()
    );

    // The system roots alone do not vouch for the node: no registration.
    let doubting = Worker::start(config("doubting"), Echo).unwrap();
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(doubting.handle().session_id(), None);
    drop(doubting);

    // A CA file that is not there fails the start, naming the setting.
    let mut missing = config("missing");
    missing.registry_ca_file = Some(ca.path("absent.pem"));
    match Worker::start(missing, Echo) {
        Err(StartError::Config(e)) => assert!(e.starts_with("registry_ca_file: "), "{e}"),
        other => panic!("started without its CA file: {:?}", other.err()),
    }
    worker.shutdown();
}

#[test]
fn a_certificate_pair_that_does_not_load_fails_the_start() {
    let ca = Ca::new();
    let pair = ca.leaf("worker", &["127.0.0.1"]);
    let other = ca.leaf("other", &["127.0.0.1"]);
    let start = |cert: &std::path::Path, key: &std::path::Path| {
        let mut config = Config::new("http://127.0.0.1:9", "t", "c", &["/threads"]);
        config.tls_cert_file = Some(cert.to_owned());
        config.tls_key_file = Some(key.to_owned());
        match Worker::start(config, Echo) {
            Err(StartError::Config(e)) => e,
            other => panic!("started: {:?}", other.err()),
        }
    };
    let absent = ca.path("absent.pem");
    assert!(start(&absent, &pair.key).starts_with("tls_cert_file: "));
    assert!(start(&pair.cert, &absent).starts_with("tls_key_file: "));
    // A key that is not the certificate's.
    assert!(start(&pair.cert, &other.key).starts_with("tls_key_file: "));
}
