//! HTTP/1.1 upgrades (WebSocket and others) end to end: a client through the real node to a
//! hand-made worker that switches protocols and echoes raw bytes, over real sockets, with the
//! placement decided in a real redis-server.

mod support;

use std::time::Duration;

use serde_json::json;
use support::attest::claims_of;
use support::fleet::Fixture;
use support::http::{Client, Reply, get};
use support::node::eventually;
use support::worker::{Serve, TestWorker, TunnelEnd};

/// A bounded wait for what happens on the far side of the tunnel.
const WAIT: Duration = Duration::from_secs(5);

const UPGRADE_HEAD: &str = "Host: edge\r\nConnection: keep-alive, Upgrade\r\nUpgrade: websocket\r\n\
     Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\
     Pinboard-Epoch: 1\r\nPinboard-Attestation: forged\r\n\r\n";

fn upgrade_request(path: &str) -> String {
    format!("GET {path} HTTP/1.1\r\n{UPGRADE_HEAD}")
}

fn warm_fleet(env: &[(&str, &str)]) -> (Fixture, TestWorker, String) {
    let f = Fixture::new(env);
    f.warm();
    let worker = TestWorker::start("worker-secret");
    let session = f.registered(&worker, "w1");
    (f, worker, session)
}

/// The client's side of a switch: the relayed 101, checked, and the worker's greeting.
fn switched(c: &mut Client, r: &Reply) {
    assert_eq!(r.status, 101, "{r:?}");
    assert_eq!(r.header("upgrade"), Some("websocket"));
    assert!(
        r.header("connection")
            .is_some_and(|v| v.eq_ignore_ascii_case("upgrade")),
        "{r:?}"
    );
    assert_eq!(
        r.header("sec-websocket-accept"),
        Some("s3pPLMBiTxaQ9kYGzzhZRbK+xOo=")
    );
    assert!(
        r.headers.iter().all(|(n, _)| !n.starts_with("pinboard-")),
        "{r:?}"
    );
    assert!(r.header("content-length").is_none() && r.header("transfer-encoding").is_none());
    assert_eq!(c.read_raw(6), b"hello\n", "sent with the worker's 101 head");
}

fn tunnel_round_trips(driver: &str) {
    let (f, worker, session) =
        warm_fleet(&[("PINBOARD_DRIVER", driver), ("PINBOARD_THREADS", "1")]);
    let mut c = Client::connect(f.node.addr);

    // A plain request first, so the worker connection it leaves in the pool carries the
    // upgrade next.
    let plain = c.request(b"GET /threads/ws HTTP/1.1\r\nHost: edge\r\n\r\n");
    assert_eq!(plain.status, 200, "{}", plain.text());
    let pooled = plain.json()["conn"].as_u64().unwrap() as usize;

    worker.set_serve(Serve::Upgrade);
    // The client's first bytes of the new protocol share the write (and packet) with the head.
    c.send(format!("{}early", upgrade_request("/threads/ws/chat?room=1")).as_bytes());
    let r = c.read(false);
    switched(&mut c, &r);
    assert_eq!(c.read_raw(5), b"EARLY");
    for i in 0..5 {
        c.send(format!("ping-{i}").as_bytes());
        assert_eq!(c.read_raw(6), format!("PING-{i}").as_bytes());
    }
    // More than one read's worth each way.
    let big: Vec<u8> = (0..64 * 1024).map(|i| b'a' + (i % 26) as u8).collect();
    c.send(&big);
    assert_eq!(c.read_raw(big.len()), big.to_ascii_uppercase());

    // What the worker was asked: the upgrade kept, the request attested and fenced.
    let seen = worker.requests().pop().unwrap();
    assert_eq!(seen.path, "/threads/ws/chat?room=1");
    assert_eq!(
        seen.conn, pooled,
        "the pooled connection carried the upgrade"
    );
    assert_eq!(seen.header("upgrade"), Some("websocket"));
    assert_eq!(seen.header("connection"), Some("upgrade"));
    assert_eq!(
        seen.header("sec-websocket-key"),
        Some("dGhlIHNhbXBsZSBub25jZQ==")
    );
    let epoch = seen.header("pinboard-epoch").unwrap();
    assert_ne!(epoch, "1", "the client's Pinboard-Epoch is not forwarded");
    assert_eq!(f.row("/threads", "ws").unwrap()["epoch"], epoch);
    let claims = claims_of(
        seen.header("pinboard-attestation").unwrap(),
        &worker.secret(),
    );
    assert_eq!(claims["aud"], session);

    // The client leaves: the worker's side of the tunnel ends too.
    drop(c);
    assert!(
        eventually(WAIT, || worker.tunnel_ends() == [TunnelEnd::ClientClosed]),
        "{:?}",
        worker.tunnel_ends()
    );

    // The upgraded connection never went back to the pool: the next forward opens another.
    worker.set_serve(Serve::Echo);
    let after = get(f.node.addr, "/threads/ws", None);
    assert_eq!(after.status, 200, "{}", after.text());
    assert_ne!(after.json()["conn"].as_u64().unwrap() as usize, pooled);
}

#[test]
fn tunnel_round_trips_on_epoll() {
    tunnel_round_trips("epoll");
}

#[test]
fn tunnel_round_trips_on_io_uring() {
    tunnel_round_trips("io_uring");
}

#[test]
fn either_side_closing_ends_the_tunnel() {
    let (f, worker, _) = warm_fleet(&[]);
    worker.set_serve(Serve::Upgrade);

    // The client half-closes: the worker sees the end of stream, and what it still sends
    // after it reaches the client before the close.
    let mut c = Client::connect(f.node.addr);
    let r = c.request(upgrade_request("/threads/half").as_bytes());
    switched(&mut c, &r);
    c.send(b"abc");
    assert_eq!(c.read_raw(3), b"ABC");
    c.shutdown_write();
    assert_eq!(c.read_until_eof(WAIT).as_deref(), Some(&b"bye\n"[..]));
    assert_eq!(worker.tunnel_ends(), [TunnelEnd::ClientClosed]);

    // The worker closes: the client's connection ends (no further HTTP on it).
    let mut c = Client::connect(f.node.addr);
    let r = c.request(upgrade_request("/threads/closing").as_bytes());
    switched(&mut c, &r);
    c.send(b"quit");
    assert_eq!(c.read_until_eof(WAIT).as_deref(), Some(&b""[..]));
    // The worker records its end after closing, so the client may see it first.
    assert!(
        eventually(WAIT, || worker.tunnel_ends()
            == [TunnelEnd::ClientClosed, TunnelEnd::WorkerClosed]),
        "{:?}",
        worker.tunnel_ends()
    );

    // The node carries on: other connections are served.
    assert_eq!(get(f.node.addr, "/healthz", None).status, 200);
}

#[test]
fn a_declined_upgrade_is_an_ordinary_answer() {
    let (f, _worker, _) = warm_fleet(&[]);
    let mut c = Client::connect(f.node.addr);
    let r = c.request(upgrade_request("/threads/plain").as_bytes());
    assert_eq!(r.status, 200, "{}", r.text());
    let seen = r.json();
    assert_eq!(seen["headers"]["upgrade"], "websocket");
    assert_eq!(seen["headers"]["connection"], "upgrade");
    assert!(r.header("pinboard-internal").is_none());
    // Still HTTP on both connections: the next request rides the same ones.
    let again = c.request(b"GET /threads/plain/next HTTP/1.1\r\nHost: edge\r\n\r\n");
    assert_eq!(again.status, 200, "{}", again.text());
    assert_eq!(again.json()["path"], "/threads/plain/next");
    assert_eq!(again.json()["conn"], seen["conn"]);
}

#[test]
fn a_switch_nobody_asked_for_is_a_bad_gateway() {
    let (f, worker, _) = warm_fleet(&[]);
    worker.set_serve(Serve::Upgrade);
    // `Upgrade` without `Connection: upgrade` asks for nothing (RFC 9110 §7.8), so it is not
    // sent on, and a 101 cannot be relayed.
    let mut c = Client::connect(f.node.addr);
    let r = c.request(b"GET /threads/x HTTP/1.1\r\nHost: edge\r\nUpgrade: websocket\r\n\r\n");
    assert_eq!((r.status, r.text().as_str()), (502, "bad gateway"));
    assert!(worker.requests()[0].header("upgrade").is_none());
}

#[test]
fn upgrade_route_misses_and_refusals() {
    let f = Fixture::new(&[]);
    f.warm();
    let refusing = TestWorker::start("a");
    let serving = TestWorker::start("b");
    refusing.set_serve(Serve::Refuse);
    serving.set_serve(Serve::Upgrade);
    f.registered(&refusing, "refusing");
    let good = f.registered(&serving, "serving");

    let r = Client::connect(f.node.addr).request(upgrade_request("/nowhere/abc").as_bytes());
    assert_eq!(
        (r.status, r.text().as_str()),
        (404, r#"{"error":"not found"}"#)
    );

    // Whichever worker is picked first, an upgrade refused in band is placed again, once.
    for i in 0..4 {
        let mut c = Client::connect(f.node.addr);
        let r = c.request(upgrade_request(&format!("/threads/ws-{i}")).as_bytes());
        switched(&mut c, &r);
        c.send(b"hi");
        assert_eq!(c.read_raw(2), b"HI");
        assert_eq!(
            f.row("/threads", &format!("ws-{i}")).unwrap()["sessionId"],
            good
        );
    }
    // Nobody left who accepts: the refusal string.
    serving.set_serve(Serve::Refuse);
    let r = Client::connect(f.node.addr).request(upgrade_request("/threads/nobody").as_bytes());
    assert_eq!(
        (r.status, r.json()),
        (503, json!({"error": "worker refused activation, retry"}))
    );
}
