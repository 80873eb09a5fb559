//! The HTTP/1.1 server layer over real sockets on both event-loop drivers, driven by small
//! handlers written for the test: JSON body caps and errors, chunked bodies, `100 Continue`,
//! handler failures and panics, and connection reuse after each.

mod support;

use std::net::SocketAddr;

use http::StatusCode;
use pinboard::error::{Error, Origin};
use pinboard::http::Shutdown;
use pinboard::http::{Handler, Http2, Limits, Request, Response, read_json, serve_connection};
use serde::Deserialize;
use support::http::Client;

struct TestRoutes;

#[derive(Deserialize)]
struct Counter {
    n: u32,
}

impl Handler for TestRoutes {
    type Note = ();

    async fn handle(&self, req: &mut Request<'_>, _: &mut ()) -> Result<Response, Error> {
        match req.path() {
            "/json" => match read_json::<Counter>(req, 1024, "{n: number}").await {
                Ok(c) => Ok(Response::json_value(
                    StatusCode::OK,
                    &serde_json::json!({ "n": c.n + 1 }),
                )),
                Err(refusal) => Ok(refusal),
            },
            "/echo" => {
                let body = req.read_body(1 << 20).await.expect("body");
                Ok(Response::new(StatusCode::OK, None, body.freeze()))
            }
            "/panic" => panic!("handler bug"),
            "/fail" => Err(Error::new(Origin::Internal, "broken invariant")),
            _ => Ok(Response::empty(StatusCode::NO_CONTENT)),
        }
    }
}

/// Serves `TestRoutes` on a fresh port from a thread running the given driver.
fn start(io_uring: bool) -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        let serve = async move {
            let listener = monoio::net::TcpListener::from_std(listener).unwrap();
            let limits = std::rc::Rc::new(Limits {
                header_timeout: std::time::Duration::from_secs(5),
                idle_timeout: std::time::Duration::from_secs(5),
                max_header_bytes: 8192,
                write_timeout: std::time::Duration::from_secs(2),
                http2: Http2::OFF,
            });
            let shutdown = Shutdown::default();
            loop {
                let (stream, peer) = listener.accept().await.unwrap();
                let (limits, shutdown) = (limits.clone(), shutdown.clone());
                monoio::spawn(async move {
                    serve_connection(stream, peer, &TestRoutes, &limits, &shutdown, None).await;
                });
            }
        };
        if io_uring {
            monoio::RuntimeBuilder::<monoio::IoUringDriver>::new()
                .enable_timer()
                .build()
                .unwrap()
                .block_on(serve)
        } else {
            monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
                .enable_timer()
                .build()
                .unwrap()
                .block_on(serve)
        }
    });
    addr
}

fn post(path: &str, body: &str) -> Vec<u8> {
    format!(
        "POST {path} HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

fn each_driver(test: impl Fn(SocketAddr)) {
    test(start(false));
    test(start(true));
}

#[test]
fn json_bodies_and_their_errors() {
    each_driver(|addr| {
        let mut c = Client::connect(addr);
        let ok = c.request(&post("/json", r#"{"n": 41}"#));
        assert_eq!((ok.status, ok.text().as_str()), (200, r#"{"n":42}"#));

        for (body, want) in [
            ("{\"n\": 41", r#"{"error":"invalid json"}"#),
            ("{\"n\": 1} trailing", r#"{"error":"invalid json"}"#),
            ("", r#"{"error":"invalid json"}"#),
            (r#"{"n": "forty"}"#, r#"{"error":"expected {n: number}"}"#),
            (r#"[1, 2]"#, r#"{"error":"expected {n: number}"}"#),
            (r#"{}"#, r#"{"error":"expected {n: number}"}"#),
        ] {
            let r = c.request(&post("/json", body));
            assert_eq!((r.status, r.text().as_str()), (400, want), "{body:?}");
        }
        // The connection survived every refusal above.
        assert_eq!(c.request(&post("/json", r#"{"n": 1}"#)).status, 200);
    });
}

#[test]
fn oversized_bodies_are_refused_without_being_read() {
    each_driver(|addr| {
        // Declared too large: answered at once, before any body byte is sent.
        let mut c = Client::connect(addr);
        let r = c.request(b"POST /json HTTP/1.1\r\nHost: t\r\nContent-Length: 5000\r\n\r\n");
        assert_eq!(
            (r.status, r.text().as_str()),
            (413, r#"{"error":"body too large"}"#)
        );
        assert_eq!(r.header("connection"), Some("close"));

        // Chunked, growing past the cap: refused once it does.
        let mut c = Client::connect(addr);
        c.send(b"POST /json HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n");
        for _ in 0..3 {
            c.send(format!("200\r\n{}\r\n", "x".repeat(0x200)).as_bytes());
        }
        let r = c.read(false);
        assert_eq!(
            (r.status, r.text().as_str()),
            (413, r#"{"error":"body too large"}"#)
        );
    });
}

#[test]
fn chunked_bodies_and_100_continue() {
    each_driver(|addr| {
        let mut c = Client::connect(addr);
        c.send(b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n5;x=y\r\nhello\r\n6\r\n world\r\n0\r\nTrailer: 1\r\n\r\n");
        let r = c.read(false);
        assert_eq!((r.status, r.text().as_str()), (200, "hello world"));

        c.send(
            b"POST /echo HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\n",
        );
        assert_eq!(c.read(false).status, 100);
        c.send(b"ping");
        let r = c.read(false);
        assert_eq!((r.status, r.text().as_str()), (200, "ping"));

        let r = c
            .request(b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n");
        assert_eq!(r.status, 500, "a broken body is the handler's failure here");
        assert!(
            c.is_closed(),
            "a connection with a broken body cannot be reused"
        );
    });
}

#[test]
fn handler_errors_and_panics_answer_500_and_the_connection_survives() {
    each_driver(|addr| {
        let mut c = Client::connect(addr);
        for path in ["/panic", "/fail", "/panic"] {
            let r = c.request(format!("GET {path} HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes());
            assert_eq!(
                (r.status, r.text().as_str()),
                (500, r#"{"error":"internal error"}"#)
            );
        }
        assert_eq!(c.request(&post("/json", r#"{"n": 1}"#)).status, 200);
    });
}

#[test]
fn unread_bodies_are_drained_or_the_connection_closed() {
    each_driver(|addr| {
        let mut c = Client::connect(addr);
        let r = c.request(&post("/ignored", "small body nobody reads"));
        assert_eq!((r.status, r.header("connection")), (204, None));
        assert_eq!(c.request(b"GET /x HTTP/1.1\r\nHost: t\r\n\r\n").status, 204);

        let r = c.request(b"POST /ignored HTTP/1.1\r\nHost: t\r\nContent-Length: 10000000\r\n\r\n");
        assert_eq!((r.status, r.header("connection")), (204, Some("close")));
    });
}
