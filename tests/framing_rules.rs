//! Issue 23's framing findings, each repro against the real node, real workers and a real
//! redis-server: header values never written raw (M1), chunk lines and trailers end at CRLF
//! only (L5), HTTP/1.1's rules on the forward path (L6), and the client's Passport credential
//! kept from the worker (L7).

mod support;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use support::fleet::Fixture;
use support::http::{Client, Reply};
use support::node::{config_file, credential};
use support::worker::{Serve, TestWorker};

fn raw(f: &Fixture, request: &str) -> Reply {
    Client::connect(f.node.addr).request(request.as_bytes())
}

/// What the echoing worker saw of a forwarded request.
fn echoed(r: &Reply) -> Value {
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

fn error_of(r: &Reply) -> (u16, String) {
    let error = r.json()["error"].as_str().unwrap_or_default().to_owned();
    (r.status, error)
}

/// L6: `Connection: host, x-forwarded-for` dropped `Host` before forwarding.
#[test]
fn connection_never_drops_host() {
    let (f, _worker, _) = Fixture::with_worker(&[], "w");
    let r = raw(
        &f,
        "GET /threads/a1/x HTTP/1.1\r\nHost: edge.example\r\n\
         Connection: host, x-forwarded-for, x-extra\r\nX-Extra: 1\r\n\r\n",
    );
    let headers = &echoed(&r)["headers"];
    assert_eq!(headers["host"], "edge.example", "{headers}");
    assert_eq!(headers["x-forwarded-for"], "127.0.0.1", "{headers}");
    assert!(headers.get("x-extra").is_none(), "{headers}");
}

/// L6: an HTTP/1.1 request without `Host` was forwarded (RFC 9112 §3.2: 400).
#[test]
fn an_http11_request_without_host_is_400() {
    let (f, worker, _) = Fixture::with_worker(&[], "w");
    let r = raw(&f, "GET /threads/a1/x HTTP/1.1\r\n\r\n");
    assert_eq!(error_of(&r), (400, "missing Host header".into()));
    assert!(worker.requests().is_empty());
    // HTTP/1.0 has no such rule.
    let r = raw(&f, "GET /threads/a1/x HTTP/1.0\r\n\r\n");
    assert_eq!(echoed(&r)["path"], "/threads/a1/x");
}

/// L6: `GET http://a.example/t/c42/x` was placed by the `Host` header, not the target's
/// authority (RFC 9112 §3.2.2).
#[test]
fn an_absolute_form_target_routes_by_its_authority() {
    let f = Fixture::new(&[("PINBOARD_HOSTNAME_AWARE", "true")]);
    f.warm();
    let (a, evil) = (TestWorker::start("a"), TestWorker::start("evil"));
    for (worker, host) in [(&a, "a.example"), (&evil, "evil.example")] {
        let r = f.register(
            worker,
            host,
            json!({"namespaces": ["/threads"], "hostname": host, "env": host}),
        );
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let r = raw(
        &f,
        "GET http://a.example/threads/c42/x?q=1 HTTP/1.1\r\nHost: evil.example\r\n\r\n",
    );
    let seen = echoed(&r);
    assert_eq!(seen["path"], "/threads/c42/x?q=1");
    assert_eq!(seen["headers"]["host"], "a.example");
    assert_eq!(a.requests().len(), 1);
    assert!(evil.requests().is_empty(), "placed by the Host header");
    let row = f.cli(&[
        "HGET",
        &f.keys.placements(
            pinboard::store::bucket_of("c42", 4),
            "a.example",
            "/threads",
        ),
        "c42",
    ]);
    assert!(row.contains("\"a.example\""), "{row}");
}

/// L6: `CONNECT /t/x` and `PRI /t/x` were forwarded.
#[test]
fn connect_and_pri_are_not_forwarded() {
    let (f, worker, _) = Fixture::with_worker(&[], "w");
    for connect in [
        "CONNECT /threads/a1/x HTTP/1.1\r\nHost: e\r\n\r\n",
        "CONNECT worker.example:443 HTTP/1.1\r\nHost: worker.example:443\r\n\r\n",
    ] {
        let mut c = Client::connect(f.node.addr);
        let r = c.request(connect.as_bytes());
        assert_eq!(
            error_of(&r),
            (405, "method not allowed".into()),
            "{connect}"
        );
        assert!(r.header("allow").is_some_and(|a| a.contains("GET")));
        assert!(c.is_closed());
    }
    let mut c = Client::connect(f.node.addr);
    let r = c.request(b"PRI /threads/a1/x HTTP/1.1\r\nHost: e\r\n\r\n");
    assert_eq!(error_of(&r), (400, "bad request".into()));
    assert!(c.is_closed());
    assert!(worker.requests().is_empty(), "{:?}", worker.requests());
}

const H2C: &str = "GET /threads/a1/x HTTP/1.1\r\nHost: e\r\nConnection: Upgrade, HTTP2-Settings\r\n\
                   Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n\r\n";
const WEBSOCKET: &str = "GET /threads/a1/x HTTP/1.1\r\nHost: e\r\nConnection: Upgrade\r\n\
                         Upgrade: websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
                         Sec-WebSocket-Version: 13\r\n\r\n";

/// L6: any `101` from a worker was tunnelled, `Upgrade: h2c` included.
#[test]
fn only_websocket_is_tunnelled() {
    let (f, worker, _) = Fixture::with_worker(&[], "w");
    // An h2c upgrade goes on as a plain request: the worker cannot tell it was asked.
    let headers = &echoed(&raw(&f, H2C))["headers"];
    for gone in ["upgrade", "connection", "http2-settings"] {
        assert!(headers.get(gone).is_none(), "{gone} in {headers}");
    }
    // A worker that switches anyway (this one answers 101 to anything) is a bad gateway.
    worker.set_serve(Serve::Upgrade);
    assert_eq!(raw(&f, H2C).status, 502);
    // WebSocket still switches.
    let mut c = Client::connect(f.node.addr);
    let r = c.request(WEBSOCKET.as_bytes());
    assert_eq!(r.status, 101, "{r:?}");
    assert_eq!(r.header("upgrade"), Some("websocket"));
    assert_eq!(c.read_raw(6), b"hello\n");
}

/// `forwards.upgrade_protocols` lists the protocols an operator lets through; a worker's switch
/// to one the request did not ask for is still a bad gateway.
#[test]
fn an_operator_may_allow_other_upgrades() {
    let (f, worker, _) = Fixture::with_worker(
        &[("PINBOARD_FORWARDS__UPGRADE_PROTOCOLS", "websocket, H2C")],
        "w",
    );
    let headers = &echoed(&raw(&f, H2C))["headers"];
    assert_eq!(headers["upgrade"], "h2c", "{headers}");
    assert_eq!(headers["connection"], "upgrade", "{headers}");
    // This worker switches to websocket, which the h2c request did not ask for.
    worker.set_serve(Serve::Upgrade);
    assert_eq!(raw(&f, H2C).status, 502);
}

/// L7: with data-plane rules, `Authorization: Bearer …` reached the worker beside the
/// attested `acct` claim.
#[test]
fn the_passport_credential_is_dropped_unless_kept() {
    let (_dir, file) = config_file("[namespaces.\"/threads\"]\nscopes = [\"threads:read\"]\n");
    let reader = credential(&json!({
        "sub": "user-1", "scope": "threads:read", "exp": 4_000_000_000u64
    }));
    let request =
        format!("GET /threads/p1/x HTTP/1.1\r\nHost: e\r\nAuthorization: Bearer {reader}\r\n\r\n");
    for (keep, forwarded) in [("false", None), ("true", Some(format!("Bearer {reader}")))] {
        let (f, _worker, _) = Fixture::with_worker(
            &[
                ("PINBOARD_CONFIG", file.as_str()),
                ("PINBOARD_FORWARDS__KEEP_AUTHORIZATION", keep),
            ],
            "w",
        );
        let headers = echoed(&raw(&f, &request))["headers"].clone();
        assert_eq!(
            headers.get("authorization").and_then(Value::as_str),
            forwarded.as_deref(),
            "keep_authorization = {keep}: {headers}"
        );
        assert!(headers.get("pinboard-attestation").is_some());
    }
}

/// L5: a bare LF in a chunk extension or a trailer was accepted; a lenient proxy in front
/// would read another body (or this smuggled request) from the same bytes.
#[test]
fn a_bare_lf_in_a_chunk_line_is_400_and_nothing_is_smuggled() {
    let (f, worker, _) = Fixture::with_worker(&[], "w");
    let head = "POST /threads/a1/x HTTP/1.1\r\nHost: e\r\nTransfer-Encoding: chunked\r\n\r\n";
    for body in [
        "5;a\nb\r\nhello\r\n0\r\n\r\n",
        "5\r\nhello\r\n0\r\nX: a\nGET /threads/evil/x HTTP/1.1\r\nHost: e\r\n\r\n",
        "5\r\nhello\r\n0\r\nX: a\0\r\n\r\n",
        "5\r;x\r\nhello\r\n0\r\n\r\n",
    ] {
        let mut c = Client::connect(f.node.addr);
        let r = c.request(format!("{head}{body}").as_bytes());
        assert_eq!(error_of(&r), (400, "bad request".into()), "{body:?}");
        assert!(c.is_closed(), "{body:?}");
    }
    assert!(
        worker.requests().iter().all(|s| !s.path.contains("evil")),
        "{:?}",
        worker.requests()
    );
    // A well-formed body with extensions and trailers still goes through.
    let ok = "5;a=b\r\nhello\r\n0\r\nX-T:\t1\r\n\r\n";
    let seen = echoed(&raw(&f, &format!("{head}{ok}")));
    assert_eq!(seen["path"], "/threads/a1/x");
}

/// M1: a registration `secret` with CRLF in it was written raw into the probe's
/// `Pinboard-Proxy-Secret`, and every probe carried a second request of the attacker's
/// choosing. Whatever refuses it (the registry's field rules, or the probe's writer), not one
/// byte of it reaches the advertise host.
#[test]
fn a_crlf_secret_never_reaches_the_worker() {
    let f = Fixture::new(&[]);
    f.warm();
    // The advertise host: records every byte of every connection made to it.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let received = Arc::new(Mutex::new(Vec::new()));
    let sink = received.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            let sink = sink.clone();
            std::thread::spawn(move || {
                conn.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
                let mut buf = [0u8; 4096];
                while let Ok(n @ 1..) = conn.read(&mut buf) {
                    sink.lock().unwrap().extend_from_slice(&buf[..n]);
                    let _ = conn.write_all(b"HTTP/1.1 403 Forbidden\r\ncontent-length: 0\r\n\r\n");
                }
            });
        }
    });
    let challenger = TestWorker::start("c");
    let secret = "AAAAAAAAAAAAAAAA\r\nX-Injected: yes\r\n\r\n\
                  POST /internal/admin/delete-everything HTTP/1.1\r\nHost: victim\r\n\
                  Content-Length: 0\r\n\r\n";
    let r = f.register(
        &challenger,
        "w1",
        json!({"advertiseUrl": url, "secret": secret}),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    // Any probe that was made would have arrived well within the verify timeout (500 ms).
    std::thread::sleep(Duration::from_millis(700));
    let received = String::from_utf8_lossy(&received.lock().unwrap()).into_owned();
    assert!(
        !received.contains("X-Injected") && !received.contains("/internal/"),
        "the secret's request reached the advertise host:\n{received}"
    );
}

fn raw_bytes(f: &Fixture, request: &[u8]) -> Reply {
    Client::connect(f.node.addr).request(request)
}

/// Issue 25: the node's own head parser (httparse into reused storage) on hostile heads. Each
/// is refused with the status the spec gives it, before anything reaches the worker, and the
/// node keeps serving; what it accepts reaches the worker byte for byte.
#[test]
fn hostile_heads_are_refused_before_the_worker() {
    let cap = 2048;
    let (f, worker, _) = Fixture::with_worker(&[("PINBOARD_HTTP__MAX_HEADER_BYTES", "2048")], "w");
    let fields = |n: usize| -> String { (0..n).map(|i| format!("X-F{i}: {i}\r\n")).collect() };
    for (bad, status) in [
        // More fields than the parser holds (96): 400, not a panic nor a reset.
        (format!("GET /threads/a1/x HTTP/1.1\r\nHost: h\r\n{}\r\n", fields(96)).into_bytes(), 400),
        (b"GET /threads/a1/x HTTP/1.1\r\nHost: h\r\nX: a\0b\r\n\r\n".to_vec(), 400),
        (b"GET /threads/a1/x HTTP/1.1\r\nHost : h\r\n\r\n".to_vec(), 400),
        (b"GET /threads/a1/x HTTP/1.1\r\nHost: h\r\nX: a\r\n folded\r\n\r\n".to_vec(), 400),
        (b"GET  /threads/a1/x HTTP/1.1\r\nHost: h\r\n\r\n".to_vec(), 400),
        (b"GET /threads/a1/x\r\nHost: h\r\n\r\n".to_vec(), 400),
        (b"GET /threads/a1/x HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello".to_vec(), 400),
        (b"GET /threads/a1/x HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello".to_vec(), 400),
        (b"GET /threads/a1/x HTTP/1.1\r\nHost: h\r\nX-\xff: 1\r\n\r\n".to_vec(), 400),
    ] {
        let r = raw_bytes(&f, &bad);
        assert_eq!(r.status, status, "{:?}: {}", String::from_utf8_lossy(&bad), r.text());
    }
    assert!(
        worker.requests().is_empty(),
        "a refused head reached the worker"
    );

    // Obs-text and HTABs inside a value, names in any case, 50 fields (the test worker reads 64): forwarded as sent.
    let mut sent =
        b"GET /threads/a1/x HTTP/1.1\r\nHost: h\r\nX-Obs: caf\xc3\xa9\xff\tb\r\n".to_vec();
    sent.extend_from_slice(format!("X-MiXeD: 1\r\n{}\r\n", fields(50)).as_bytes());
    let r = raw_bytes(&f, &sent);
    let seen = &echoed(&r)["headers"];
    // The worker reads the value lossily as UTF-8: the é whole, the lone 0xff replaced.
    assert_eq!(seen["x-obs"], "caf\u{e9}\u{fffd}\tb", "{seen}");
    assert_eq!(seen["x-mixed"], "1", "{seen}");
    assert_eq!(seen["x-f49"], "49", "{seen}");

    // A head of exactly the cap is served; one byte more is 431.
    let at_cap = |len: usize| {
        let start = "GET /threads/a1/x HTTP/1.1\r\nHost: h\r\nX-Pad: ";
        let pad = len - start.len() - "\r\n\r\n".len();
        format!("{start}{}\r\n\r\n", "p".repeat(pad))
    };
    assert_eq!(at_cap(cap).len(), cap);
    let r = raw(&f, &at_cap(cap));
    assert_eq!(
        echoed(&r)["headers"]["x-pad"].as_str().map(str::len),
        Some(cap - 48)
    );
    let r = raw(&f, &at_cap(cap + 1));
    assert_eq!(error_of(&r), (431, "request header too large".into()));
}

/// A worker's answer is framed by the request side's rules (RFC 9112 §6.3): both framings, a
/// coding other than a lone `chunked`, a signed or repeated `Content-Length` are no answer
/// (502), and the connection it came on is never reused, so nothing of it is read as the next
/// request's answer.
#[test]
fn an_ambiguously_framed_answer_is_a_502_and_its_connection_is_dropped() {
    let (f, worker, _) = Fixture::with_worker(&[("PINBOARD_THREADS", "1")], "w");
    let get = |id: &str| {
        raw(
            &f,
            &format!("GET /threads/{id}/x HTTP/1.1\r\nHost: e\r\n\r\n"),
        )
    };
    worker.set_serve(Serve::Raw(
        b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello",
    ));
    let r = get("ok1");
    assert_eq!((r.status, r.text().as_str()), (200, "hello"));
    for answer in [
        &b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"[..],
        b"HTTP/1.1 200 OK\r\ncontent-length: +5\r\n\r\nhello",
        b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 5\r\n\r\nhello",
        b"HTTP/1.1 200 OK\r\ncontent-length: 5, 5\r\n\r\nhello",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\nhello",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    ] {
        worker.set_serve(Serve::Raw(answer));
        let r = get("bad");
        assert_eq!(
            (r.status, r.text().as_str()),
            (502, "bad gateway"),
            "{}",
            String::from_utf8_lossy(answer)
        );
    }
    worker.set_serve(Serve::Echo);
    let r = get("after");
    assert_eq!(echoed(&r)["path"], "/threads/after/x");
}
