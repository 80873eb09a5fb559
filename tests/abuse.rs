//! Abuse (issue 13): hostile clients and a hostile worker, each checked for the answer or the
//! close the node owes it (docs/api.md), against the real binary, a real redis-server and a
//! real HTTP worker. What they cost the node and its other clients while they last (latency,
//! RSS, descriptors) is measured by `scripts/abuse` (reliability.md); here only what can be
//! told for certain: answers, closes, and bytes that stay bounded.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::thread;
use std::time::{Duration, Instant};

use support::fleet::Fixture;
use support::http::{Client, get, is_timeout, tight_client};
use support::node::{eventually, token};
use support::worker::Serve;

const HEADER_TIMEOUT: (&str, &str) = ("PINBOARD_HTTP__HEADER_TIMEOUT_MS", "500");

/// Writes `head`, then `piece` over and over (for at most 8 s, or `total` bytes of pieces)
/// on another thread, until the node stops taking them; the thread returns what went out.
fn send_endlessly(
    client: &Client,
    head: String,
    piece: Vec<u8>,
    total: Option<usize>,
) -> thread::JoinHandle<usize> {
    let mut w = client.writer();
    w.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
    thread::spawn(move || {
        let mut sent = 0;
        if w.write_all(head.as_bytes()).is_err() {
            return sent;
        }
        let deadline = Instant::now() + Duration::from_secs(8);
        while Instant::now() < deadline && total.is_none_or(|t| sent < t) {
            if w.write_all(&piece).is_err() {
                break;
            }
            sent += piece.len();
        }
        sent
    })
}

/// A chunk of 64 KiB, framed.
fn chunk() -> Vec<u8> {
    format!("10000\r\n{}\r\n", "x".repeat(0x10000)).into_bytes()
}

/// Slowloris: bytes keep arriving, a header line every 100 ms, but the head never ends. The
/// header timeout bounds the whole head, not each read: 408 and closed.
#[test]
fn a_head_trickled_a_line_at_a_time_is_cut_off_at_the_header_timeout() {
    let f = Fixture::new(&[HEADER_TIMEOUT]);
    let mut stream = TcpStream::connect(f.node.addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let started = Instant::now();
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: t\r\n")
        .unwrap();
    let mut answer = Vec::new();
    let mut chunk = [0u8; 1024];
    let ended = loop {
        if started.elapsed() > Duration::from_secs(5) {
            break false;
        }
        let _ = stream.write_all(b"X-Slow: 1\r\n");
        match stream.read(&mut chunk) {
            Ok(0) => break true,
            Ok(n) => answer.extend_from_slice(&chunk[..n]),
            Err(e) if is_timeout(&e) => {}
            Err(_) => break true,
        }
    };
    let answer = String::from_utf8_lossy(&answer);
    assert!(ended, "still open after 5 s of trickling: {answer:?}");
    assert!(
        answer.starts_with("HTTP/1.1 408") && answer.ends_with(r#"{"error":"request timeout"}"#),
        "{answer:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "cut off after {:?}: each byte must not restart the header timeout",
        started.elapsed()
    );
}

/// A body that stops arriving is 408 `request timeout`, on the registry and on the data plane
/// alike; a malformed chunked body is 400 `bad request`. Both close the connection. The data
/// plane answered both with an empty 502 (the answer for a client that has gone) before.
#[test]
fn a_stalled_or_malformed_body_is_408_or_400_on_the_registry_and_the_data_plane() {
    let (f, _worker, _) = Fixture::with_worker(&[HEADER_TIMEOUT], "abuse");
    let auth = format!(
        "Authorization: Bearer {}\r\nContent-Type: application/json\r\n",
        f.token
    );
    let stalled = [
        format!(
            "POST /registry/heartbeat HTTP/1.1\r\nHost: t\r\n{auth}Content-Length: 100\r\n\r\n{{\"sessionId\""
        ),
        "POST /threads/slow/echo HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n0123456789"
            .to_string(),
    ];
    let malformed = [
        format!(
            "POST /registry/heartbeat HTTP/1.1\r\nHost: t\r\n{auth}Transfer-Encoding: chunked\r\n\r\n2\r\n{{}}\r\nzz\r\n"
        ),
        "POST /threads/bad/echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nzz\r\n"
            .to_string(),
    ];
    let cases = stalled
        .iter()
        .map(|r| (r, 408, r#"{"error":"request timeout"}"#))
        .chain(
            malformed
                .iter()
                .map(|r| (r, 400, r#"{"error":"bad request"}"#)),
        );
    for (request, status, body) in cases {
        let mut c = Client::connect(f.node.addr);
        let r = c.request(request.as_bytes());
        assert_eq!(
            (r.status, r.text().as_str()),
            (status, body),
            "{request}\n{}",
            f.node.log()
        );
        assert_eq!(r.header("connection"), Some("close"));
        assert!(c.is_closed(), "{request}");
    }
}

/// A worker may answer before it has read a whole body (413 at its head, here) and close
/// with the body still coming: that answer reaches the client, not a 502 because the rest of
/// the body could not be written. An endless chunked body, and a declared one sent whole.
#[test]
fn a_workers_early_answer_to_a_body_it_refuses_is_relayed_not_a_502() {
    let (f, worker, _) = Fixture::with_worker(&[], "abuse");
    worker.set_serve(Serve::TooLarge);
    let bodies = [
        (
            "POST /threads/endless/echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
                .to_string(),
            chunk(),
            None,
        ),
        (
            format!(
                "POST /threads/declared/echo HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n\r\n",
                16 << 20
            ),
            vec![b'x'; 1 << 16],
            Some(16 << 20),
        ),
    ];
    for (head, piece, total) in bodies {
        let mut c = Client::connect(f.node.addr);
        let sender = send_endlessly(&c, head.clone(), piece, total);
        let r = c.read(false);
        assert_eq!(
            (r.status, r.text().as_str()),
            (413, "too large"),
            "{head}\n{}",
            f.node.log()
        );
        // The rest of the body is unread: the connection cannot carry another request.
        assert_eq!(r.header("connection"), Some("close"));
        assert!(c.is_closed(), "{head}");
        sender.join().unwrap();
    }
    assert_eq!(worker.requests().len(), 2);
}

/// Pipelined requests followed by bytes that are no HTTP: each request answered, in order,
/// then 400 and the connection closed. A head of 200 headers, though under the byte cap, is
/// refused the same way (the parser holds 96).
#[test]
fn pipelined_requests_then_garbage_are_answered_then_refused_400_and_closed() {
    let f = Fixture::new(&[]);
    let mut c = Client::connect(f.node.addr);
    let mut raw = b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n".repeat(3);
    // The start of a TLS ClientHello, then an end of head.
    raw.extend_from_slice(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03garbage\r\n\r\n");
    c.send(&raw);
    for _ in 0..3 {
        assert_eq!(c.read(false).status, 200);
    }
    let r = c.read(false);
    assert_eq!(
        (r.status, r.text().as_str()),
        (400, r#"{"error":"bad request"}"#)
    );
    assert!(c.is_closed());

    let headers: String = (0..200).map(|i| format!("X-H{i}: v\r\n")).collect();
    let head = format!("GET /healthz HTTP/1.1\r\nHost: t\r\n{headers}\r\n");
    assert!(head.len() < 16384, "under http.max_header_bytes");
    let mut c = Client::connect(f.node.addr);
    let r = c.request(head.as_bytes());
    assert_eq!(
        (r.status, r.text().as_str()),
        (400, r#"{"error":"bad request"}"#)
    );
    assert!(c.is_closed());
    assert_eq!(get(f.node.addr, "/healthz", None).status, 200);
}

/// A registry body declared past the cap is refused from its head, without a byte of it sent;
/// an endless chunked one once it passes the cap. 413 `body too large`, closed.
#[test]
fn declared_and_endless_registry_bodies_are_413_and_closed() {
    let f = Fixture::new(&[]);
    let auth = format!(
        "Authorization: Bearer {}\r\nContent-Type: application/json\r\n",
        f.token
    );
    let mut c = Client::connect(f.node.addr);
    let r = c.request(
        format!(
            "POST /registry/register HTTP/1.1\r\nHost: t\r\n{auth}Content-Length: 100000000\r\n\r\n"
        )
        .as_bytes(),
    );
    assert_eq!(
        (r.status, r.text().as_str()),
        (413, r#"{"error":"body too large"}"#)
    );
    assert!(c.is_closed());

    let mut c = Client::connect(f.node.addr);
    let head = format!(
        "POST /registry/heartbeat HTTP/1.1\r\nHost: t\r\n{auth}Transfer-Encoding: chunked\r\n\r\n"
    );
    let sender = send_endlessly(&c, head, chunk(), None);
    let r = c.read(false);
    assert_eq!(
        (r.status, r.text().as_str()),
        (413, r#"{"error":"body too large"}"#)
    );
    assert!(c.is_closed());
    let sent = sender.join().unwrap();
    assert!(
        sent > 1 << 20,
        "refused at {sent} bytes, before the 1 MiB cap"
    );
}

/// Connections that never send a byte: past `max_connections` closed at accept (and counted),
/// the others closed silently once the header timeout passes. Then the node serves again.
#[test]
fn connections_that_send_nothing_are_closed_at_accept_or_at_the_header_timeout() {
    let f = Fixture::new(&[
        ("PINBOARD_THREADS", "1"),
        ("PINBOARD_MAX_CONNECTIONS", "8"),
        ("PINBOARD_HTTP__HEADER_TIMEOUT_MS", "1000"),
    ]);
    let ops = token("ops", &["pinboard:operator"], &["*"]);
    let refused = || {
        let text = get(f.node.addr, "/metrics", Some(&ops)).text();
        text.lines()
            .find_map(|l| {
                l.strip_prefix("pinboard_connections_refused_total{reason=\"max_connections\"} ")
            })
            .and_then(|n| n.parse::<u64>().ok())
            .expect("pinboard_connections_refused_total")
    };
    let before = refused();
    // Only the health call itself open (the readiness polls have been closed), and that one
    // closed by the node as it answers.
    let health = format!(
        "GET /registry/health HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {ops}\r\n\
         Connection: close\r\n\r\n"
    );
    let quiet = eventually(Duration::from_secs(5), || {
        Client::connect(f.node.addr)
            .request(health.as_bytes())
            .json()["connections"]
            == 1
    });
    assert!(quiet);
    thread::sleep(Duration::from_millis(200));
    let mut idle: Vec<TcpStream> = (0..12)
        .map(|_| {
            let conn = TcpStream::connect(f.node.addr).unwrap();
            conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            conn
        })
        .collect();
    for (i, conn) in idle.iter_mut().enumerate() {
        let mut answer = Vec::new();
        match conn.read_to_end(&mut answer) {
            Ok(_) => {}
            Err(e) if is_timeout(&e) => panic!("connection {i} still open"),
            Err(_) => {} // a reset: closed as well
        }
        assert!(
            answer.is_empty(),
            "{i}: {:?}",
            String::from_utf8_lossy(&answer)
        );
    }
    assert_eq!(refused() - before, 4, "the four past the cap");
    assert_eq!(get(f.node.addr, "/healthz", None).status, 200);
}

/// A worker answering an endless body (10 GB, as fast as it can) to a client that reads
/// nothing: the node takes from the worker only what the socket buffers between them hold,
/// never buffering on the client's behalf; after the write timeout it closes both sides.
#[test]
fn an_endless_answer_to_a_client_that_reads_nothing_is_held_back_not_buffered() {
    let (f, worker, _) =
        Fixture::with_worker(&[("PINBOARD_HTTP__WRITE_TIMEOUT_MS", "2000")], "abuse");
    worker.set_serve(Serve::Endless);
    let before = f.node.rss_bytes();
    let mut client = tight_client(f.node.addr);
    client
        .write_all(b"GET /threads/endless/stream HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    assert!(eventually(Duration::from_secs(5), || worker.streamed().1 == 1));
    thread::sleep(Duration::from_millis(1000));
    let (streamed, open) = worker.streamed();
    let during = f.node.rss_bytes();
    eprintln!(
        "worker wrote {} MiB; node RSS {} MiB before, {} MiB during",
        streamed >> 20,
        before >> 20,
        during >> 20
    );
    assert_eq!(open, 1, "still being written:\n{}", f.node.log());
    // Loopback moves gigabytes a second: a node that buffered would be far past this.
    assert!(streamed < 64 << 20, "the worker wrote {streamed} bytes");
    assert!(during < before + (32 << 20), "RSS {during} bytes");
    // The write timeout: the client is closed, the worker's connection with it.
    assert!(
        eventually(Duration::from_secs(10), || worker.streamed().1 == 0),
        "the worker is still writing:\n{}",
        f.node.log()
    );
    client
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut sink = [0u8; 65536];
    let closed = loop {
        match client.read(&mut sink) {
            Ok(0) => break true,
            Ok(_) => {}
            Err(e) => break !is_timeout(&e),
        }
    };
    assert!(closed, "the client that never read is closed");
}
