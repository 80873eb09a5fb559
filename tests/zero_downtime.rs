//! Changing a running node without failing a request (issue 24): the stop delay for load
//! balancers (`http.shutdown_delay_ms`), against the real binary, a real redis-server and a
//! real worker.

mod support;

use std::net::TcpStream;
use std::time::Duration;

use support::fleet::Fixture;
use support::http::{Client, get};
use support::node::eventually;

/// Long enough that the requests the test makes right after SIGTERM all fall inside it, on a
/// slow machine too; the test never measures it.
const DELAY_MS: &str = "5000";

/// On SIGTERM `/readyz` turns 503 at once while the node goes on accepting and forwarding (new
/// connections each time) for `http.shutdown_delay_ms`; then it stops accepting, finishes what
/// is in flight and exits 0.
#[test]
fn a_shutdown_delay_fails_readiness_and_serves_on_before_the_drain() {
    let (mut f, _worker, _) =
        Fixture::with_worker(&[("PINBOARD_HTTP__SHUTDOWN_DELAY_MS", DELAY_MS)], "delay");
    let addr = f.node.addr;
    assert_eq!(get(addr, "/threads/abc", None).status, 200);

    f.node.terminate();
    f.node.logs("serving on for http.shutdown_delay_ms");
    for _ in 0..5 {
        assert_eq!(get(addr, "/readyz", None).status, 503, "{}", f.node.log());
        let r = get(addr, "/threads/abc", None);
        assert_eq!(r.status, 200, "{r:?}\n{}", f.node.log());
    }
    // A request whose head is half sent before the delay ends keeps the node draining, so the
    // closed listener is seen while the node is alive (once it exits, a parallel test may bind
    // the freed port).
    let mut in_flight = Client::connect(addr);
    in_flight.send(b"GET /threads/abc HTTP/1.1\r\nHost: t\r\n");
    assert!(
        eventually(Duration::from_secs(30), || TcpStream::connect(addr)
            .is_err()),
        "the listener closes once the delay is over:\n{}",
        f.node.log()
    );
    in_flight.send(b"\r\n");
    let r = in_flight.read(false);
    assert_eq!((r.status, r.header("connection")), (200, Some("close")));
    let status = f.node.wait(Duration::from_secs(20));
    assert_eq!(status.code(), Some(0), "{}", f.node.log());
}
