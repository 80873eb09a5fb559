//! Keep-alive connections to workers, end to end: none is reused stale (the idle timeout, the
//! check before reuse), and a request is sent again on a fresh connection only when that cannot
//! make a worker act twice (RFC 9110 §9.2.2). Real node, real redis-server, a worker that closes
//! idle connections as uvicorn does.

mod support;

use std::time::Duration;

use support::fleet::Fixture;
use support::http::{Client, Reply};
use support::worker::{Serve, TestWorker};

/// `n` POSTs with a body at once, each on its own client connection (so the node opens as many
/// worker connections): their statuses.
fn posts_at_once(f: &Fixture, n: usize, round: &str) -> Vec<u16> {
    let addr = f.node.addr;
    let threads: Vec<_> = (0..n)
        .map(|i| {
            let body = format!(r#"{{"round":"{round}","n":{i}}}"#);
            std::thread::spawn(move || {
                let raw = format!(
                    "POST /threads/t{i}/messages HTTP/1.1\r\nHost: edge\r\n\
                     Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                );
                Client::connect(addr).request(raw.as_bytes()).status
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

fn count(f: &Fixture, sample: &str) -> u64 {
    f.metric(sample) as u64
}

/// uvicorn closes a connection idle for 5 s, Node's http server too: a node that kept such a
/// connection and sent a POST into it answered 502. With the node's own idle timeout set far
/// past the worker's, only the check before reuse stands between a POST and a dead connection.
#[test]
fn a_connection_the_worker_timed_out_is_never_sent_a_request() {
    let (f, worker, _) = Fixture::with_worker(
        &[("PINBOARD_FORWARDS__UPSTREAM_IDLE_TIMEOUT_MS", "60000")],
        "idle-closer",
    );
    worker.set_idle_close(Duration::from_millis(700));
    for round in 0..3 {
        assert_eq!(
            posts_at_once(&f, 6, &round.to_string()),
            [200; 6],
            "round {round}\n{}",
            f.node.log()
        );
        // Every pooled connection is closed by the worker meanwhile.
        std::thread::sleep(Duration::from_millis(1200));
    }
    assert_eq!(
        worker.requests().len(),
        18,
        "each POST reached the worker once"
    );
    assert!(
        count(
            &f,
            r#"pinboard_upstream_pool_dropped_total{reason="closed"}"#
        ) >= 1
    );
    for kind in ["reset", "stale_retry"] {
        let sample = format!(r#"pinboard_upstream_errors_total{{kind="{kind}"}}"#);
        assert_eq!(count(&f, &sample), 0, "{kind}");
    }
}

/// `forwards.upstream_idle_timeout_ms`: a connection idle longer is not reused, whatever the
/// worker would still take.
#[test]
fn connections_idle_past_the_upstream_idle_timeout_are_dropped() {
    let (f, worker, _) = Fixture::with_worker(
        &[
            ("PINBOARD_FORWARDS__UPSTREAM_IDLE_TIMEOUT_MS", "300"),
            ("PINBOARD_THREADS", "1"),
        ],
        "patient",
    );
    let mut c = Client::connect(f.node.addr);
    let get = |c: &mut Client| c.request(b"GET /threads/k/x HTTP/1.1\r\nHost: edge\r\n\r\n");
    let conn_of = |r: Reply| {
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()["conn"].as_u64().unwrap()
    };
    let first = conn_of(get(&mut c));
    assert_eq!(conn_of(get(&mut c)), first, "reused while young");
    std::thread::sleep(Duration::from_millis(600));
    assert_ne!(
        conn_of(get(&mut c)),
        first,
        "a fresh connection after the timeout"
    );
    assert_eq!(
        count(
            &f,
            r#"pinboard_upstream_pool_dropped_total{reason="expired"}"#
        ),
        1
    );
    assert_eq!(worker.requests().len(), 3);
}

/// A worker that closes the connection after reading a request, without answering: a body-less
/// POST on a pooled connection is not sent again (the worker may have acted on it), a GET is,
/// once, on a fresh connection. One core, so every client connection finds its pool.
#[test]
fn only_idempotent_requests_are_sent_again_after_a_pooled_connection_fails() {
    let (f, worker, _) = Fixture::with_worker(&[("PINBOARD_THREADS", "1")], "dropper");
    // A pooled connection, then `request` on it while the worker drops every connection it
    // reads a request from.
    let on_a_pooled_connection_that_fails = |request: &[u8]| {
        worker.set_serve(Serve::Echo);
        let ok = Client::connect(f.node.addr)
            .request(b"GET /threads/p/x HTTP/1.1\r\nHost: edge\r\n\r\n");
        assert_eq!(ok.status, 200, "{}", ok.text());
        worker.set_serve(Serve::Drop);
        let r = Client::connect(f.node.addr).request(request);
        assert_eq!(r.status, 502, "{}", r.text());
    };

    on_a_pooled_connection_that_fails(
        b"POST /threads/p/pay HTTP/1.1\r\nHost: edge\r\nContent-Length: 0\r\n\r\n",
    );
    let pays = |w: &TestWorker| {
        w.requests()
            .iter()
            .filter(|s| s.path.ends_with("/pay"))
            .count()
    };
    assert_eq!(pays(&worker), 1, "the POST reached the worker once");
    assert_eq!(
        count(&f, r#"pinboard_upstream_errors_total{kind="reset"}"#),
        1
    );

    // A GET: sent twice, on two connections.
    on_a_pooled_connection_that_fails(b"GET /threads/p/read HTTP/1.1\r\nHost: edge\r\n\r\n");
    let reads: Vec<usize> = worker
        .requests()
        .iter()
        .filter(|s| s.path.ends_with("/read"))
        .map(|s| s.conn)
        .collect();
    assert_eq!(reads.len(), 2, "the GET was sent once more");
    assert_ne!(reads[0], reads[1], "on a fresh connection");
    assert_eq!(
        count(&f, r#"pinboard_upstream_errors_total{kind="stale_retry"}"#),
        1
    );
}
