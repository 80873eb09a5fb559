//! Limits per client against the real binary (issue 23, M3 and M4): connections and TLS
//! handshakes in progress per address, closed at accept; new placements per second per client
//! (address, or the data-plane credential's `sub`), 429; placement rows per namespace, 503.
//! A second client address is another loopback address (127.0.0.2), which Linux routes like
//! 127.0.0.1.

mod support;

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::time::Duration;

use serde_json::json;
use support::fleet::{Fixture, SHARDS};
use support::http::{Client, Reply, tcp_from};
use support::node::{eventually, token};
use support::tls::{get as get_tls, https_node, session_over};

const FIRST: &str = "127.0.0.1";
const SECOND: &str = "127.0.0.2";
const HEALTHZ: &[u8] = b"HEAD /healthz HTTP/1.1\r\nHost: t\r\n\r\n";

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

/// A plain client connected from `source`.
fn client_from(source: &str, addr: SocketAddr) -> Client {
    let tcp = tcp_from(ip(source), addr).expect("connect to node");
    let io = Box::new(tcp.try_clone().unwrap());
    Client::over(tcp, io)
}

/// One request from `source` on a fresh connection.
fn request_from(source: &str, addr: SocketAddr, head: &str) -> Reply {
    client_from(source, addr).request(head.as_bytes())
}

fn get_from(source: &str, addr: SocketAddr, path: &str) -> Reply {
    request_from(
        source,
        addr,
        &format!("GET {path} HTTP/1.1\r\nHost: t\r\n\r\n"),
    )
}

/// `HEAD /healthz` on `tcp`: its answer's status line, `None` when the connection was closed
/// without one (as a connection refused at accept is).
fn healthz(tcp: &mut TcpStream) -> Option<String> {
    tcp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    tcp.write_all(HEALTHZ).ok()?;
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        tcp.read_exact(&mut byte).ok()?;
        head.push(byte[0]);
    }
    let head = String::from_utf8(head).unwrap();
    head.lines().next().map(str::to_owned)
}

/// Whether a new connection from `source` is closed without an answer.
fn closed_at_accept(source: &str, addr: SocketAddr) -> bool {
    tcp_from(ip(source), addr).map_or(true, |mut tcp| healthz(&mut tcp).is_none())
}

/// Whether the node has not closed `tcp` (nothing to read yet, no end of stream).
fn still_open(tcp: &TcpStream) -> bool {
    tcp.set_nonblocking(true).unwrap();
    let open =
        matches!(tcp.peek(&mut [0u8; 1]), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock);
    tcp.set_nonblocking(false).unwrap();
    open
}

/// The node's `/metrics`, scraped from `source`.
fn metrics_from(source: &str, addr: SocketAddr) -> String {
    let operator = token("ops", &["pinboard:operator"], &["*"]);
    let head =
        format!("GET /metrics HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {operator}\r\n\r\n");
    let r = request_from(source, addr, &head);
    assert_eq!(r.status, 200, "{}", r.text());
    r.text()
}

fn sample(text: &str, name: &str) -> f64 {
    support::metric(text, name).unwrap_or(0.0)
}

/// M3: one address held every connection slot of the node with idle keep-alive connections.
/// Past `limits.max_connections_per_ip` its next connection is closed at accept, counted, while
/// another address is served; the count is the node's, whichever core a connection lands on.
#[test]
fn an_address_past_its_connections_is_closed_at_accept_while_another_is_served() {
    let f = Fixture::new(&[("PINBOARD_LIMITS__MAX_CONNECTIONS_PER_IP", "6")]);
    let addr = f.node.addr;
    // Held keep-alive connections, each answered (the readiness checks' connections may take
    // a moment to be seen closed: until then a new one is refused, and tried again).
    let mut held: Vec<TcpStream> = Vec::new();
    while held.len() < 6 {
        let admitted = eventually(Duration::from_secs(5), || {
            let mut tcp = tcp_from(ip(FIRST), addr).unwrap();
            let answered = healthz(&mut tcp).is_some();
            if answered {
                held.push(tcp);
            }
            answered
        });
        assert!(admitted, "{}", f.node.log());
    }
    for _ in 0..3 {
        assert!(closed_at_accept(FIRST, addr), "a seventh connection served");
    }
    let r = get_from(SECOND, addr, "/healthz");
    assert_eq!(r.status, 200, "another address is served");
    let text = metrics_from(SECOND, addr);
    assert!(
        sample(
            &text,
            "pinboard_connections_refused_total{reason=\"per_ip\"}"
        ) >= 3.0,
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            "pinboard_connections_refused_total{reason=\"max_connections\"}"
        ),
        0.0
    );
    // A held connection still serves, and one that closes frees its place.
    let status = healthz(&mut held[0]);
    assert_eq!(status.as_deref(), Some("HTTP/1.1 200 OK"));
    held.pop();
    assert!(
        eventually(Duration::from_secs(5), || !closed_at_accept(FIRST, addr)),
        "a freed place stayed taken"
    );
}

/// M3: silent TLS handshakes from one address held slots until the header timeout. At most 16
/// connections of an address may be before the end of their handshake; past that the next is
/// closed at accept, while another address, and the same one once its handshakes are done, get
/// theirs. Finished handshakes do not count.
#[test]
fn handshakes_in_progress_are_bounded_per_address() {
    let (pki, _pair, f) = https_node(&[("PINBOARD_LIMITS__MAX_CONNECTIONS_PER_IP", "100")]);
    let addr = f.node.addr;
    let config = support::tls::client_config(&pki);
    let handshake_from = |source: &str| -> Option<Client> {
        let tcp = tcp_from(ip(source), addr).ok()?;
        let (tcp, stream) = session_over(tcp, &config).ok()?;
        Some(Client::over(tcp, Box::new(stream)))
    };
    // 16 connections that never send a byte, each a handshake in progress until the header
    // timeout (10 s by default). One the node closed at accept (an earlier connection of the
    // address was still being seen out) is replaced until 16 are held.
    let mut silent: Vec<TcpStream> = Vec::new();
    let refused = eventually(Duration::from_secs(10), || {
        silent.retain(still_open);
        while silent.len() < 16 {
            silent.push(tcp_from(ip(FIRST), addr).unwrap());
        }
        handshake_from(FIRST).is_none()
    });
    assert!(
        refused,
        "a handshake from the address was served past 16 in progress:\n{}",
        f.node.log()
    );
    let mut other = handshake_from(SECOND).expect("another address's handshake");
    let r = other.request(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_eq!(r.status, 200);
    drop(silent);
    let finished: Vec<Client> = (0..20)
        .map(|_| {
            let mut found = None;
            assert!(eventually(Duration::from_secs(5), || {
                found = handshake_from(FIRST);
                found.is_some()
            }));
            found.unwrap()
        })
        .collect();
    assert_eq!(
        finished.len(),
        20,
        "finished handshakes are no handshakes in progress"
    );
    let text = get_tls(
        addr,
        &config,
        "/metrics",
        Some(&token("ops", &["pinboard:operator"], &["*"])),
    )
    .text();
    assert!(
        sample(
            &text,
            "pinboard_connections_refused_total{reason=\"handshakes_per_ip\"}"
        ) >= 1.0,
        "{text}"
    );
}

/// New ids from `source` (with `headers`), one at a time, until one is refused: the ids
/// placed (each forwarded) and the refusal.
fn place_until_refused(
    addr: SocketAddr,
    source: &str,
    ns: &str,
    prefix: &str,
    headers: &str,
) -> (Vec<String>, Reply) {
    let mut placed = Vec::new();
    for i in 0..200 {
        let id = format!("{prefix}{i}");
        let r = request_from(
            source,
            addr,
            &format!("GET {ns}/{id}/x HTTP/1.1\r\nHost: t\r\n{headers}\r\n"),
        );
        if r.status != 200 {
            return (placed, r);
        }
        assert_eq!(r.json()["path"], format!("{ns}/{id}/x"));
        placed.push(id);
    }
    panic!("200 new placements from one client, none refused");
}

/// The refusal of a client past its placement rate, to the letter: 429, the body, and a
/// `Retry-After` of whole seconds, at least 1.
fn assert_rate_refusal(r: &Reply) {
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(r.body, br#"{"error":"placement rate exceeded, retry"}"#);
    let after: u64 = r
        .header("retry-after")
        .expect("Retry-After")
        .parse()
        .unwrap();
    assert!(after >= 1);
}

/// M4: one anonymous client made 7,300 placement rows a second. Past
/// `limits.new_placements_per_ip_per_s` its new ids are refused (429, nothing written) while
/// its ids already placed are still forwarded and another client still places; behind a
/// trusted proxy the client is the `X-Forwarded-For` hop, not the proxy.
#[test]
fn a_client_past_its_placement_rate_gets_429_and_keeps_its_instances() {
    let (f, _worker, _session) = Fixture::with_worker(
        &[
            ("PINBOARD_LIMITS__NEW_PLACEMENTS_PER_IP_PER_S", "1"),
            ("PINBOARD_TRUSTED_PROXIES", "127.0.0.3"),
        ],
        "secret-a",
    );
    let addr = f.node.addr;
    let (placed, refused) = place_until_refused(addr, FIRST, "/threads", "a", "");
    assert_rate_refusal(&refused);
    let refused_id = format!("a{}", placed.len());
    assert!(
        f.row("/threads", &refused_id).is_none(),
        "a refused id has a row"
    );
    for id in &placed {
        for _ in 0..3 {
            let r = get_from(FIRST, addr, &format!("/threads/{id}/x"));
            assert_eq!(r.status, 200, "{id}: {}", r.text());
        }
    }
    let r = get_from(SECOND, addr, "/threads/b0/x");
    assert_eq!(r.status, 200, "another address places: {}", r.text());
    // Behind a trusted proxy each forwarded-for client has its own rate.
    let proxy = "127.0.0.3";
    let (_, refused) = place_until_refused(
        addr,
        proxy,
        "/threads",
        "c",
        "X-Forwarded-For: 198.51.100.1\r\n",
    );
    assert_rate_refusal(&refused);
    let r = request_from(
        proxy,
        addr,
        "GET /threads/d0/x HTTP/1.1\r\nHost: t\r\nX-Forwarded-For: 198.51.100.2\r\n\r\n",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let text = metrics_from(SECOND, addr);
    assert!(
        sample(
            &text,
            "pinboard_resolutions_total{outcome=\"rate-limited\"}"
        ) >= 2.0,
        "{text}"
    );
}

/// M4 with the data-plane passport: new placements count against the credential's `sub`,
/// whatever address it comes from, and another credential at the same address has its own.
#[test]
fn a_credential_has_one_placement_rate_whatever_its_address() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pinboard.toml");
    std::fs::write(
        &file,
        "[limits]\nnew_placements_per_ip_per_s = 1\n\n\
         [namespaces.\"/threads\"]\nscopes = [\"threads:write\"]\n",
    )
    .unwrap();
    // One core: one bucket per client, refilled once a second.
    let (f, _worker, _session) = Fixture::with_worker(
        &[
            ("PINBOARD_CONFIG", file.to_str().unwrap()),
            ("PINBOARD_THREADS", "1"),
        ],
        "secret-a",
    );
    let addr = f.node.addr;
    let bearer = |sub: &str| {
        let credential = token(sub, &["threads:write"], &["*"]);
        format!("Authorization: Bearer {credential}\r\n")
    };
    let alice = bearer("alice");
    // The account's bucket, spent from one address, is empty at another. A refill between
    // the two (a stalled test machine) is a second round, not a failure.
    let shared = (0..5).any(|round| {
        let (_, refused) =
            place_until_refused(addr, FIRST, "/threads", &format!("r{round}-"), &alice);
        assert_rate_refusal(&refused);
        let head = format!("GET /threads/s{round}/x HTTP/1.1\r\nHost: t\r\n{alice}\r\n");
        request_from(SECOND, addr, &head).status == 429
    });
    assert!(shared, "the credential placed again from another address");
    // Another credential at the same address places.
    let bob = bearer("bob");
    let head = format!("GET /threads/bob1/x HTTP/1.1\r\nHost: t\r\n{bob}\r\n");
    let r = request_from(FIRST, addr, &head);
    assert_eq!(r.status, 200, "{}", r.text());
}

/// Ids that land in `bucket`, `count` of them.
fn ids_in_bucket(bucket: u32, prefix: &str, count: usize) -> Vec<String> {
    (0..)
        .map(|i| format!("{prefix}{i}"))
        .filter(|id| pinboard::store::bucket_of(id, SHARDS) == bucket)
        .take(count)
        .collect()
}

/// `placement.max_rows_per_namespace`: a new row past the cap (each bucket holding its share,
/// the cap over the buckets) is refused with 503 and the spec's body, writing nothing; rows that
/// exist are still served, and another namespace still places.
#[test]
fn a_namespace_past_its_rows_refuses_new_placements_and_serves_old_ones() {
    // 8 rows over 4 buckets: 2 a bucket.
    let (f, _worker, _session) = Fixture::with_worker(
        &[
            ("PINBOARD_PLACEMENT__MAX_ROWS_PER_NAMESPACE", "8"),
            ("PINBOARD_LIMITS__NEW_PLACEMENTS_PER_IP_PER_S", "0"),
        ],
        "secret-a",
    );
    let addr = f.node.addr;
    let ids = ids_in_bucket(0, "n", 3);
    for id in &ids[..2] {
        let r = get_from(FIRST, addr, &format!("/threads/{id}/x"));
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let r = get_from(FIRST, addr, &format!("/threads/{}/x", ids[2]));
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.body, br#"{"error":"namespace placement limit reached"}"#);
    assert_eq!(r.header("retry-after"), Some("1"));
    assert!(
        f.row("/threads", &ids[2]).is_none(),
        "a refused id has a row"
    );
    for id in &ids[..2] {
        let r = get_from(FIRST, addr, &format!("/threads/{id}/x"));
        assert_eq!(r.status, 200, "an existing row is served: {}", r.text());
    }
    // Another bucket of the namespace has room, and so has another namespace.
    let other = &ids_in_bucket(1, "n", 1)[0];
    assert_eq!(
        get_from(FIRST, addr, &format!("/threads/{other}/x")).status,
        200
    );
    assert_eq!(
        get_from(FIRST, addr, &format!("/docs/{}/x", ids[2])).status,
        200
    );
    // A row whose owner died is placed again: it adds no row.
    let row = f.row("/threads", &ids[0]).unwrap();
    let dead = json!({"sessionId": "gone", "epoch": row["epoch"]});
    f.put_row("/threads", &ids[0], dead);
    let r = get_from(FIRST, addr, &format!("/threads/{}/x", ids[0]));
    assert_eq!(r.status, 200, "{}", r.text());
    let text = f.metrics();
    assert!(
        sample(
            &text,
            "pinboard_resolutions_total{outcome=\"namespace-full\"}"
        ) >= 1.0,
        "{text}"
    );
}
