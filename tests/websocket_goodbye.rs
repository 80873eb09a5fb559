//! The node's goodbye to WebSocket clients at shutdown: a tunnel still open when
//! `http.shutdown_grace_ms` ends gets a close frame 1001 (going away) from the node, put between
//! two of the worker's frames, instead of a reset. A real WebSocket client (tungstenite)
//! through the real `pinboard` binary, its placement in a real redis-server, to a scripted
//! worker that sends its frames (a large one in pieces across the deadline, one that never
//! ends, its own Close) exactly when the test says.
//!
//! The worker libraries' own goodbye (1012 when an instance is wound down, moved or evicted)
//! is tested with them: `pinned-tower/tests/websocket.rs` (the axum example) and
//! `clients/python/tests/test_websocket_goodbye.py`.

mod support;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

use serde_json::json;
use support::fleet::Fixture;
use tungstenite::protocol::CloseFrame;
use tungstenite::protocol::frame::coding::CloseCode;
use tungstenite::{Message, WebSocket};

/// The grace the node is given: short, so that the tests wait little.
const GRACE_MS: u64 = 300;
const GRACE: Duration = Duration::from_millis(GRACE_MS);
/// A bound for what must happen soon (a frame relayed, the node gone).
const SOON: Duration = Duration::from_secs(5);

/// A worker that answers the node's probe and accepts every upgrade, then hands the upgraded
/// connection to the test, which sends what it likes on it.
struct ScriptedWorker {
    url: String,
    upgraded: Receiver<TcpStream>,
}

impl ScriptedWorker {
    fn start() -> ScriptedWorker {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (hand, upgraded) = channel();
        std::thread::spawn(move || {
            for conn in listener.incoming().map_while(Result::ok) {
                let hand = hand.clone();
                std::thread::spawn(move || answer(conn, &hand));
            }
        });
        ScriptedWorker { url, upgraded }
    }

    /// The next upgraded connection, once the node forwarded one.
    fn upgraded(&self) -> TcpStream {
        self.upgraded
            .recv_timeout(SOON)
            .expect("an upgrade forwarded to the worker")
    }
}

/// One connection to the scripted worker: the probe answered (`{"value":"v"}` for any
/// challenge), or the upgrade switched (to the protocol asked) and handed over.
fn answer(mut conn: TcpStream, hand: &std::sync::mpsc::Sender<TcpStream>) {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match conn.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => return,
        }
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    if head.starts_with("GET /_pinned/challenge") {
        let body = r#"{"value":"v"}"#;
        let _ = write!(
            conn,
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
             connection: close\r\n\r\n{body}",
            body.len()
        );
        return;
    }
    let field = |wanted: &str| {
        head.lines().find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.eq_ignore_ascii_case(wanted)
                .then(|| value.trim().to_owned())
        })
    };
    let key = field("sec-websocket-key").expect("an upgrade with a Sec-WebSocket-Key");
    let protocol = field("upgrade").expect("an upgrade");
    let accept = tungstenite::handshake::derive_accept_key(key.as_bytes());
    let _ = write!(
        conn,
        "HTTP/1.1 101 Switching Protocols\r\nupgrade: {protocol}\r\nconnection: upgrade\r\n\
         sec-websocket-accept: {accept}\r\n\r\n"
    );
    let _ = hand.send(conn);
}

/// A server's frame (unmasked) of `opcode` with a payload of `len` bytes: its header.
fn header(opcode: u8, len: usize) -> Vec<u8> {
    let mut out = vec![0x80 | opcode];
    match len {
        0..126 => out.push(len as u8),
        126..=0xFFFF => {
            out.push(126);
            out.extend_from_slice(&(len as u16).to_be_bytes());
        }
        _ => {
            out.push(127);
            out.extend_from_slice(&(len as u64).to_be_bytes());
        }
    }
    out
}

fn frame(opcode: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = header(opcode, payload.len());
    out.extend_from_slice(payload);
    out
}

/// A node with a grace of [`GRACE`] (and `env`), past its cold start, the scripted worker
/// registered on `/threads`.
fn fleet(env: &[(&str, &str)]) -> (Fixture, ScriptedWorker) {
    let grace = GRACE_MS.to_string();
    let mut env = env.to_vec();
    env.push(("PINBOARD_HTTP__SHUTDOWN_GRACE_MS", &grace));
    let f = Fixture::new(&env);
    f.warm();
    let worker = ScriptedWorker::start();
    let body = json!({
        "clientId": "scripted", "secret": "scripted-worker-secret-0123456789",
        "namespaces": ["/threads"], "advertiseUrl": worker.url, "headroom": 10,
        "draining": false, "challenge": "c", "challengeValue": "v",
    });
    let registered = f.post("register", &f.token, &body);
    assert_eq!(
        registered.status,
        200,
        "{}\n{}",
        registered.text(),
        f.node.log()
    );
    (f, worker)
}

/// A WebSocket client through the node to `/threads/{id}`, and the worker's side of it.
fn connect(f: &Fixture, worker: &ScriptedWorker, id: &str) -> (WebSocket<TcpStream>, TcpStream) {
    let stream = TcpStream::connect(f.node.addr).unwrap();
    stream.set_read_timeout(Some(SOON)).unwrap();
    let url = format!("ws://{}/threads/{id}", f.node.addr);
    let (client, answer) = tungstenite::client(url.as_str(), stream)
        .unwrap_or_else(|e| panic!("the handshake through the node: {e}\n{}", f.node.log()));
    assert_eq!(answer.status(), 101);
    (client, worker.upgraded())
}

/// What the client reads next: a message, or its error as text.
fn next(client: &mut WebSocket<TcpStream>) -> Result<Message, String> {
    client.read().map_err(|e| e.to_string())
}

fn going_away() -> Message {
    Message::Close(Some(CloseFrame {
        code: CloseCode::Away,
        reason: "".into(),
    }))
}

/// Whether the worker's side of the tunnel ends (an end of stream, or a reset) within [`SOON`].
fn ends(mut conn: TcpStream) -> bool {
    conn.set_read_timeout(Some(SOON)).unwrap();
    let mut sink = [0u8; 4096];
    loop {
        match conn.read(&mut sink) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) => return e.kind() != std::io::ErrorKind::WouldBlock,
        }
    }
}

#[test]
fn an_open_websocket_is_told_going_away_when_the_grace_ends() {
    let (mut f, worker) = fleet(&[]);
    let (mut client, mut upstream) = connect(&f, &worker, "room-1");
    upstream.write_all(&frame(0x1, b"welcome")).unwrap();
    assert_eq!(next(&mut client), Ok(Message::text("welcome")));
    client.send(Message::text("hi")).unwrap();

    let stopped = Instant::now();
    f.node.terminate();
    assert_eq!(next(&mut client), Ok(going_away()), "{}", f.node.log());
    let told = stopped.elapsed();
    assert!(told >= GRACE, "told before the grace ended: {told:?}");
    // The client answers the close (tungstenite does) and sees the connection end cleanly.
    assert!(
        matches!(client.read(), Err(tungstenite::Error::ConnectionClosed)),
        "a clean close after the handshake"
    );
    assert!(ends(upstream), "the worker's connection ends too");
    assert!(f.node.wait(SOON).success(), "{}", f.node.log());
}

/// The worker is sending a large frame in pieces when the grace ends: the node passes the
/// rest of that frame, then its close frame, and nothing the worker sends after it. The client
/// reads one whole message, then the close: no protocol error.
#[test]
fn a_frame_under_way_at_the_deadline_ends_before_the_close() {
    let (mut f, worker) = fleet(&[]);
    let (mut client, mut upstream) = connect(&f, &worker, "room-2");
    let payload: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    let mut wire = header(0x2, payload.len());
    wire.extend_from_slice(&payload);
    let (now, later) = wire.split_at(70_000);
    upstream.write_all(now).unwrap();

    f.node.terminate();
    // The rest in pieces, from just after the grace's end.
    std::thread::sleep(GRACE + Duration::from_millis(100));
    for piece in later.chunks(later.len() / 5 + 1) {
        upstream.write_all(piece).unwrap();
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = upstream.write_all(&frame(0x1, b"too late"));

    assert_eq!(next(&mut client), Ok(Message::binary(payload)));
    assert_eq!(next(&mut client), Ok(going_away()), "{}", f.node.log());
    assert!(ends(upstream));
    assert!(f.node.wait(SOON).success(), "{}", f.node.log());
}

/// A frame that does not end within the node's short wait: the tunnel closes as it did before
/// the goodbye existed, without a close frame inside the worker's frame. The client sees the
/// connection cut, not a message nor a close.
#[test]
fn a_frame_that_does_not_end_in_time_is_cut_without_a_close() {
    let (mut f, worker) = fleet(&[]);
    let (mut client, mut upstream) = connect(&f, &worker, "room-3");
    upstream.write_all(&header(0x2, 100_000)).unwrap();
    upstream.write_all(&[7u8; 10_000]).unwrap();

    let stopped = Instant::now();
    f.node.terminate();
    match client.read() {
        Err(tungstenite::Error::Protocol(_) | tungstenite::Error::Io(_)) => {}
        other => panic!("expected the connection cut, got {other:?}"),
    }
    assert!(stopped.elapsed() < SOON);
    assert!(ends(upstream));
    assert!(f.node.wait(SOON).success(), "{}", f.node.log());
}

/// The worker sent its own Close (and waits for the client's answer): at the grace's end the
/// node adds no second one, it only closes.
#[test]
fn after_the_workers_close_the_node_sends_none() {
    let (mut f, worker) = fleet(&[]);
    let stream = TcpStream::connect(f.node.addr).unwrap();
    stream.set_read_timeout(Some(SOON)).unwrap();
    let url = format!("ws://{}/threads/room-4", f.node.addr);
    let (client, _) = tungstenite::client(url.as_str(), stream).unwrap();
    let mut upstream = worker.upgraded();
    let close = frame(0x8, &[0x03, 0xE8]);
    upstream.write_all(&close).unwrap();

    // The client's raw bytes from here: the worker's close, then the end, nothing else.
    let mut raw = client.into_inner();
    let mut got = vec![0u8; close.len()];
    raw.read_exact(&mut got).unwrap();
    assert_eq!(got, close);
    f.node.terminate();
    let mut rest = Vec::new();
    let _ = raw.read_to_end(&mut rest);
    assert!(rest.is_empty(), "bytes after the worker's close: {rest:?}");
    assert!(f.node.wait(SOON).success(), "{}", f.node.log());
}

/// Another protocol's tunnel (allowed by `forwards.upgrade_protocols`) has no frames the node
/// can tell: it is closed at the grace's end with nothing added.
#[test]
fn another_protocols_tunnel_is_closed_with_nothing_added() {
    let (mut f, worker) = fleet(&[("PINBOARD_FORWARDS__UPGRADE_PROTOCOLS", "websocket,chat")]);
    let mut client = TcpStream::connect(f.node.addr).unwrap();
    client.set_read_timeout(Some(SOON)).unwrap();
    write!(
        client,
        "GET /threads/room-5 HTTP/1.1\r\nhost: edge\r\nconnection: upgrade\r\nupgrade: chat\r\n\
         sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
    )
    .unwrap();
    let mut upstream = worker.upgraded();
    upstream.write_all(b"raw bytes").unwrap();
    let mut seen = Vec::new();
    let mut byte = [0u8; 1];
    while !seen.ends_with(b"raw bytes") {
        assert_eq!(client.read(&mut byte).unwrap(), 1, "{seen:?}");
        seen.push(byte[0]);
    }
    assert!(String::from_utf8_lossy(&seen).starts_with("HTTP/1.1 101"));
    f.node.terminate();
    let mut rest = Vec::new();
    let _ = client.read_to_end(&mut rest);
    assert!(rest.is_empty(), "bytes added at the close: {rest:?}");
    assert!(f.node.wait(SOON).success(), "{}", f.node.log());
}
