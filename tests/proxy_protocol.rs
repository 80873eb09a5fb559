//! The PROXY protocol (v1 and v2) and the forwarded headers, end to end: a real node whose
//! `proxy_protocol.trusted` names 127.0.0.2 (the "balancer", a second loopback address), real
//! workers that echo what they were sent, a real redis-server; clients connect from 127.0.0.2 or
//! from 127.0.0.1 (anyone else) and write the headers by hand, well-formed and hostile.

mod support;

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use serde_json::Value;
use support::fleet::Fixture;
use support::http::{Client, Reply, tcp_from};
use support::node::eventually;
use support::tls::{client_config, https_node, session_over};
use support::worker::TestWorker;

const BALANCER: &str = "127.0.0.2";
const ANYONE: &str = "127.0.0.1";
const V2_SIGNATURE: &[u8] = b"\r\n\r\n\0\r\nQUIT\n";

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

/// A connection from `source` that has written `preface` (a PROXY header, or anything).
fn client_after(source: &str, addr: SocketAddr, preface: &[u8]) -> Client {
    let mut tcp = tcp_from(ip(source), addr).expect("connect to node");
    tcp.write_all(preface).unwrap();
    let io = Box::new(tcp.try_clone().unwrap());
    Client::over(tcp, io)
}

/// A v2 header: `command` 0 LOCAL / 1 PROXY, `family` the family and transport byte.
fn v2(command: u8, family: u8, payload: &[u8]) -> Vec<u8> {
    let len = (payload.len() as u16).to_be_bytes();
    [V2_SIGNATURE, &[0x20 | command, family], &len, payload].concat()
}

/// A v2 PROXY header over TCP/IPv4 from `source:port`, with a NOOP TLV.
fn v2_tcp4(source: [u8; 4], port: u16) -> Vec<u8> {
    let mut payload = source.to_vec();
    payload.extend([127, 0, 0, 1]);
    payload.extend(port.to_be_bytes());
    payload.extend(8080u16.to_be_bytes());
    payload.extend([0x04, 0, 3, b'n', b'o', b'p']);
    v2(1, 0x11, &payload)
}

/// Whether the node closed a connection from `source` that wrote `preface` without answering a
/// byte: an end of stream, or a reset (the node closes with the client's unread bytes still
/// queued, which Linux answers with RST).
fn closed_unanswered(source: &str, addr: SocketAddr, preface: &[u8]) -> bool {
    let mut tcp = tcp_from(ip(source), addr).expect("connect to node");
    tcp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let _ = tcp.write_all(preface);
    let mut byte = [0u8; 1];
    match tcp.read(&mut byte) {
        Ok(0) => true,
        Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
        Ok(_) => false,
    }
}

fn get(path: &str, extra: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nHost: edge.example\r\n{extra}\r\n").into_bytes()
}

/// What the worker was sent, from its echo.
fn seen(r: &Reply) -> Value {
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["headers"].clone()
}

fn fleet(env: &[(&str, &str)]) -> (Fixture, TestWorker) {
    let mut env = env.to_vec();
    env.push(("PINBOARD_PROXY_PROTOCOL__TRUSTED", BALANCER));
    env.push(("PINBOARD_HTTP__HEADER_TIMEOUT_MS", "1000"));
    let (f, worker, _) = Fixture::with_worker(&env, "w");
    (f, worker)
}

#[test]
fn a_balancers_header_names_the_client_for_the_worker_the_log_and_every_request_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let log_env = log.display().to_string();
    let (f, _worker) = fleet(&[
        ("PINBOARD_ACCESS_LOG", "json"),
        ("PINBOARD_ACCESS_LOG_PATH", &log_env),
    ]);
    let addr = f.node.addr;

    // v1: the client's address, on both requests of a keep-alive connection.
    let mut c = client_after(
        BALANCER,
        addr,
        b"PROXY TCP4 203.0.113.7 127.0.0.1 51234 8080\r\n",
    );
    for id in ["pp-a", "pp-b"] {
        let headers = seen(&c.request(&get(&format!("/threads/{id}"), "")));
        assert_eq!(headers["x-forwarded-for"], "203.0.113.7");
        assert_eq!(headers["x-forwarded-proto"], "http");
        assert_eq!(headers["x-forwarded-host"], "edge.example");
    }

    // v2 over IPv4 with a TLV, and over IPv6; the request follows in the same write.
    let mut preface = v2_tcp4([198, 51, 100, 9], 40000);
    preface.extend(get("/threads/pp-c", ""));
    let headers = seen(&client_after(BALANCER, addr, &preface).read(false));
    assert_eq!(headers["x-forwarded-for"], "198.51.100.9");
    let mut six = [0u8; 36];
    six[..16].copy_from_slice(
        &"2001:db8::7"
            .parse::<std::net::Ipv6Addr>()
            .unwrap()
            .octets(),
    );
    six[31] = 1;
    let mut c = client_after(BALANCER, addr, &v2(1, 0x21, &six));
    assert_eq!(
        seen(&c.request(&get("/threads/pp-d", "")))["x-forwarded-for"],
        "2001:db8::7"
    );

    // LOCAL (a balancer's health check) and v1 UNKNOWN: the balancer is the client.
    let mut c = client_after(BALANCER, addr, &v2(0, 0x00, &[]));
    assert_eq!(
        seen(&c.request(&get("/threads/pp-e", "")))["x-forwarded-for"],
        BALANCER
    );
    let mut c = client_after(BALANCER, addr, b"PROXY UNKNOWN\r\n");
    assert_eq!(
        seen(&c.request(&get("/threads/pp-f", "")))["x-forwarded-for"],
        BALANCER
    );

    // The access log names the client the header gave.
    assert!(
        eventually(Duration::from_secs(5), || {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            text.contains(
                "\"client\":\"203.0.113.7\",\"method\":\"GET\",\"path\":\"/threads/pp-a\",\
                 \"protocol\":\"HTTP/1.1\",\"scheme\":\"http\"",
            ) && text.contains("\"client\":\"198.51.100.9\"")
        }),
        "{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
}

#[test]
fn a_balancer_connection_without_a_valid_header_is_closed_unanswered_and_counted() {
    let (f, _worker) = fleet(&[]);
    let addr = f.node.addr;
    let hostile: Vec<(&str, Vec<u8>)> = vec![
        ("plain HTTP", get("/threads/x", "")),
        (
            "v1 with 3 fields",
            b"PROXY TCP4 203.0.113.7 127.0.0.1 1\r\n".to_vec(),
        ),
        (
            "v1 port out of range",
            b"PROXY TCP4 1.2.3.4 1.2.3.4 70000 1\r\n".to_vec(),
        ),
        ("v1 IPv6 as TCP4", b"PROXY TCP4 ::1 ::1 1 1\r\n".to_vec()),
        (
            "v1 line too long",
            [b"PROXY TCP4 ".as_slice(), &[b'9'; 200]].concat(),
        ),
        ("v2 version 1", {
            let mut h = v2_tcp4([1, 2, 3, 4], 1);
            h[12] = 0x11;
            h
        }),
        ("v2 over UDP", v2(1, 0x12, &[0; 12])),
        ("v2 addresses cut short", v2(1, 0x21, &[0; 12])),
        (
            "v2 TLV past the end",
            v2(1, 0x11, &[[0u8; 12].as_slice(), &[4, 0, 50, 1]].concat()),
        ),
        ("v2 over 4096 bytes", v2(1, 0x11, &[0; 5000])),
    ];
    for (what, preface) in &hostile {
        assert!(closed_unanswered(BALANCER, addr, preface), "{what}");
    }
    // A truncated header, then silence: closed once `http.header_timeout_ms` passes.
    let truncated = &v2_tcp4([1, 2, 3, 4], 1)[..20];
    assert!(closed_unanswered(BALANCER, addr, truncated), "truncated v2");
    assert!(
        closed_unanswered(BALANCER, addr, b"PROXY TCP4 1.2.3.4"),
        "cut v1"
    );

    let refused = r#"pinboard_connections_refused_total{reason="proxy_header"}"#;
    let expected = (hostile.len() + 2) as f64;
    assert!(
        eventually(Duration::from_secs(5), || f.metric(refused) == expected),
        "{} of {expected}",
        f.metric(refused)
    );
    // The node still serves the balancer and everyone else.
    let mut c = client_after(
        BALANCER,
        addr,
        b"PROXY TCP4 203.0.113.7 127.0.0.1 1 8080\r\n",
    );
    assert_eq!(c.request(&get("/threads/x", "")).status, 200);
}

#[test]
fn from_anyone_else_a_proxy_header_is_a_bad_request_and_forwarding_headers_are_not_believed() {
    let (f, _worker) = fleet(&[]);
    let addr = f.node.addr;
    let mut c = client_after(ANYONE, addr, b"PROXY TCP4 203.0.113.7 127.0.0.1 1 8080\r\n");
    let r = c.request(&get("/threads/x", ""));
    assert_eq!(r.status, 400, "{}", r.text());
    let mut preface = v2_tcp4([203, 0, 113, 7], 1);
    preface.extend(get("/threads/x", ""));
    let mut c = client_after(ANYONE, addr, &preface);
    let answer = c.read_until_eof(Duration::from_secs(5)).unwrap();
    assert!(
        answer.is_empty() || answer.starts_with(b"HTTP/1.1 400 "),
        "{answer:?}"
    );

    // What a client says of where it came from is dropped; the node says what it saw.
    let spoofed = "X-Forwarded-For: 6.6.6.6\r\nX-Forwarded-Proto: https\r\n\
                   X-Forwarded-Host: bank.example\r\nX-Real-IP: 6.6.6.6\r\n\
                   Forwarded: for=6.6.6.6;proto=https\r\n";
    let mut c = client_after(ANYONE, addr, b"");
    let headers = seen(&c.request(&get("/threads/x", spoofed)));
    assert_eq!(headers["x-forwarded-for"], ANYONE);
    assert_eq!(headers["x-forwarded-proto"], "http");
    assert_eq!(headers["x-forwarded-host"], "edge.example");
    assert!(headers.get("x-real-ip").is_none(), "{headers}");
    assert!(headers.get("forwarded").is_none(), "{headers}");
    // The balancer's client is anyone else too.
    let mut c = client_after(
        BALANCER,
        addr,
        b"PROXY TCP4 203.0.113.7 127.0.0.1 1 8080\r\n",
    );
    let headers = seen(&c.request(&get("/threads/x", spoofed)));
    assert_eq!(headers["x-forwarded-for"], "203.0.113.7");
    assert_eq!(headers["x-forwarded-proto"], "http");
    assert!(headers.get("x-real-ip").is_none(), "{headers}");
}

#[test]
fn a_trusted_proxys_forwarding_headers_pass() {
    let (f, _worker) = fleet(&[("PINBOARD_TRUSTED_PROXIES", ANYONE)]);
    let said = "X-Forwarded-For: 203.0.113.7\r\nX-Forwarded-Proto: https\r\n\
                X-Forwarded-Host: app.example\r\nX-Real-IP: 203.0.113.7\r\n\
                Forwarded: for=203.0.113.7;proto=https\r\n";
    let mut c = client_after(ANYONE, f.node.addr, b"");
    let headers = seen(&c.request(&get("/threads/x", said)));
    assert_eq!(headers["x-forwarded-for"], ANYONE);
    assert_eq!(headers["x-forwarded-proto"], "https");
    assert_eq!(headers["x-forwarded-host"], "app.example");
    assert_eq!(headers["x-real-ip"], "203.0.113.7");
    assert_eq!(headers["forwarded"], "for=203.0.113.7;proto=https");
}

#[test]
fn limits_per_address_count_the_client_a_header_names_not_the_balancer() {
    let (f, _worker) = fleet(&[("PINBOARD_LIMITS__MAX_CONNECTIONS_PER_IP", "2")]);
    let addr = f.node.addr;
    let from = |client: &str| format!("PROXY TCP4 {client} 127.0.0.1 1 8080\r\n").into_bytes();
    let mut held: Vec<Client> = (0..2)
        .map(|_| client_after(BALANCER, addr, &from("203.0.113.7")))
        .collect();
    for c in &mut held {
        assert_eq!(c.request(&get("/threads/x", "")).status, 200);
    }
    assert!(closed_unanswered(BALANCER, addr, &from("203.0.113.7")));
    let mut other = client_after(BALANCER, addr, &from("203.0.113.8"));
    assert_eq!(other.request(&get("/threads/x", "")).status, 200);
    let refused = r#"pinboard_connections_refused_total{reason="per_ip"}"#;
    assert_eq!(f.metric(refused), 1.0);
}

#[test]
fn over_tls_the_header_comes_first_and_the_scheme_is_https() {
    let (pki, _, f) = https_node(&[("PINBOARD_PROXY_PROTOCOL__TRUSTED", BALANCER)]);
    let worker = TestWorker::start("w");
    let body = support::fleet::register_body(&worker, "w1", serde_json::json!({}));
    let config = client_config(&pki);
    let mut tcp = tcp_from(ip(BALANCER), f.node.addr).unwrap();
    tcp.write_all(&v2_tcp4([203, 0, 113, 7], 5555)).unwrap();
    let (tcp, stream) = session_over(tcp, &config).expect("TLS after the PROXY header");
    let mut c = Client::over(tcp, Box::new(stream));
    let text = body.to_string();
    let r = c.request(
        format!(
            "POST /registry/register HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{text}",
            f.token,
            text.len()
        )
        .as_bytes(),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let headers = seen(&c.request(&get("/threads/tls", "")));
    assert_eq!(headers["x-forwarded-for"], "203.0.113.7");
    assert_eq!(headers["x-forwarded-proto"], "https");
}
