//! Hand-made workers for registry and data-plane tests: a real HTTP/1.1 server on a loopback
//! port (keep-alive included) that answers Pinboard's ownership probe the way a test tells it
//! to — honestly, with another worker's value, slowly, with an error, or without a body — and
//! answers instance requests by echoing what arrived, or by misbehaving on purpose. It records
//! every request it saw.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How the worker answers the ownership probe.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Mode {
    /// Answers `{"value": V}` for challenges it issued, 404 for others, 403 without the secret.
    Honest,
    /// Answers every challenge with a value of its own (another worker at this URL).
    WrongValue,
    /// Answers honestly after a delay.
    Slow(Duration),
    /// Answers 500.
    Failing,
    /// Answers 200 with no body.
    Bodyless,
}

/// How the worker answers instance requests (`/{ns}/{id}...`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Serve {
    /// 200 with a JSON echo of the request (and `Pinboard-Internal` / hop-by-hop headers the
    /// proxy must strip).
    Echo,
    /// The same echo, chunked.
    EchoChunked,
    /// The same echo, delimited by closing the connection.
    EchoUntilClose,
    /// 503 + `Retry-After: 1` + `Pinned-Refusal: lease-unhealthy`.
    Refuse,
    /// Never answers (the connection stays open).
    Hang,
    /// Closes the connection without answering.
    Drop,
    /// `101 Switching Protocols` + `Upgrade: websocket` with a greeting (`hello\n`) sent in the
    /// same write as the head, then raw bytes echoed back uppercased. `quit` makes the worker
    /// close the connection; at the client's end of stream it answers `bye\n` (the client's
    /// half-close must not cut off what the worker still sends) and closes.
    Upgrade,
    /// 413 as soon as the head has arrived, the body left unread, then the connection closed
    /// (a reset, when the body is still coming): a worker refusing a body past its own cap.
    TooLarge,
    /// 200 with a `Content-Length` of 10 GB, then zeros as fast as the connection takes them
    /// until a write fails ([`TestWorker::streamed`] counts them).
    Endless,
    /// These bytes as the whole answer, the connection kept open: a worker framing its answer
    /// however the test says.
    Raw(&'static [u8]),
}

/// How an upgraded connection ended on the worker's side.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum TunnelEnd {
    /// The client's side ended (end of stream reached the worker).
    ClientClosed,
    /// The worker closed it after `quit`.
    WorkerClosed,
    /// A read or write failed.
    Failed,
}

#[derive(Clone, Debug)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// Which connection (counted from 0) carried it.
    pub conn: usize,
    /// When its head had arrived.
    pub at: std::time::Instant,
}

impl Seen {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

struct State {
    secret: String,
    mode: Mode,
    serve: Serve,
    values: HashMap<String, String>,
    seen: Vec<Seen>,
    tunnels: Vec<TunnelEnd>,
    /// Bytes of [`Serve::Endless`] bodies written, and such answers still being written.
    streamed: u64,
    streaming: usize,
    /// How many of the next `_wake`s answer 202 `{"activating":true}` (then the echo, a 200).
    activating: usize,
    /// The path its advertise URL carries (`""` for none): taken off each request's path once.
    base: String,
    /// How long a connection may wait idle for its next request before the worker closes it
    /// (uvicorn's `timeout_keep_alive`); 30 s unless set.
    idle_close: Duration,
    /// What `GET /_pinned/stats` answers (200, JSON) when set; the echo otherwise.
    stats: Option<Arc<Vec<u8>>>,
}

pub struct TestWorker {
    pub addr: SocketAddr,
    state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
}

impl TestWorker {
    /// A worker whose secret is `label` made long enough for the registry's 16-byte minimum
    /// (`{label}-0123456789abcdef`; [`TestWorker::secret`] gives it back).
    pub fn start(label: &str) -> TestWorker {
        let secret = format!("{label}-0123456789abcdef");
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(State {
            secret,
            mode: Mode::Honest,
            serve: Serve::Echo,
            activating: 0,
            base: String::new(),
            idle_close: Duration::from_secs(30),
            stats: None,
            values: HashMap::new(),
            seen: Vec::new(),
            tunnels: Vec::new(),
            streamed: 0,
            streaming: 0,
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let (s, st) = (state.clone(), stop.clone());
        let conns = Arc::new(AtomicUsize::new(0));
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if st.load(Ordering::SeqCst) {
                    return;
                }
                if let Ok(conn) = conn {
                    let (s, st) = (s.clone(), st.clone());
                    let n = conns.fetch_add(1, Ordering::SeqCst);
                    std::thread::spawn(move || serve(conn, n, &s, &st));
                }
            }
        });
        TestWorker { addr, state, stop }
    }

    /// Its advertise URL, with the base path [`TestWorker::set_base`] gave it.
    pub fn url(&self) -> String {
        let base = self.state.lock().unwrap().base.clone();
        format!("http://127.0.0.1:{}{base}", self.addr.port())
    }

    /// Serves under `base` (`/edge`): its advertise URL carries it, and each request's path is
    /// recorded and routed with it taken off once (a path sent with it twice keeps one).
    pub fn set_base(&self, base: &str) {
        self.state.lock().unwrap().base = base.to_owned();
    }

    pub fn secret(&self) -> String {
        self.state.lock().unwrap().secret.clone()
    }

    /// Issues a fresh challenge (as a worker does before each register/heartbeat) and returns
    /// (challenge, challengeValue).
    pub fn challenge(&self) -> (String, String) {
        let n: u64 = rand::random();
        let (c, v) = (format!("c-{n:x}"), format!("v-{n:x}"));
        self.state
            .lock()
            .unwrap()
            .values
            .insert(c.clone(), v.clone());
        (c, v)
    }

    pub fn set_mode(&self, mode: Mode) {
        self.state.lock().unwrap().mode = mode;
    }

    /// The next `n` `POST …/_wake`s answer 202 `{"activating":true}`, as a worker hydrating
    /// the instance does; later ones the usual echo (200).
    pub fn set_activating(&self, n: usize) {
        self.state.lock().unwrap().activating = n;
    }

    /// Closes a keep-alive connection once it has waited `idle` for its next request, as
    /// uvicorn (5 s), Node (5 s) and most servers do.
    pub fn set_idle_close(&self, idle: Duration) {
        self.state.lock().unwrap().idle_close = idle;
    }

    /// Answers `GET /_pinned/stats` with `body` (a JSON object, as a worker describing itself).
    pub fn set_stats(&self, body: Vec<u8>) {
        self.state.lock().unwrap().stats = Some(Arc::new(body));
    }

    pub fn set_serve(&self, serve: Serve) {
        self.state.lock().unwrap().serve = serve;
    }

    /// Ownership probes seen.
    pub fn probes(&self) -> Vec<Seen> {
        self.seen()
            .into_iter()
            .filter(|s| s.path.starts_with("/_pinned/"))
            .collect()
    }

    /// Instance requests seen.
    pub fn requests(&self) -> Vec<Seen> {
        self.seen()
            .into_iter()
            .filter(|s| !s.path.starts_with("/_pinned/"))
            .collect()
    }

    /// How each upgraded connection has ended so far.
    pub fn tunnel_ends(&self) -> Vec<TunnelEnd> {
        self.state.lock().unwrap().tunnels.clone()
    }

    /// Bytes of [`Serve::Endless`] bodies written so far, and how many are still being written.
    pub fn streamed(&self) -> (u64, usize) {
        let s = self.state.lock().unwrap();
        (s.streamed, s.streaming)
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.state.lock().unwrap().seen.clone()
    }

    /// Stops accepting and answering; connections already open are closed on their next request.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr);
    }
}

impl Drop for TestWorker {
    fn drop(&mut self) {
        self.stop();
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Serves requests on one connection until the peer closes, an answer closes it, or the worker
/// stops.
fn serve(mut conn: TcpStream, n: usize, state: &Mutex<State>, stop: &AtomicBool) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16384];
    loop {
        let idle = state.lock().unwrap().idle_close;
        let _ = conn.set_read_timeout(Some(idle));
        let head_end = loop {
            if let Some(i) = find(&buf, b"\r\n\r\n") {
                break i + 4;
            }
            match conn.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(k) => buf.extend_from_slice(&chunk[..k]),
            }
        };
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut req = httparse::Request::new(&mut headers);
        if req.parse(&buf[..head_end]).is_err() {
            return;
        }
        let method = req.method.unwrap_or("").to_string();
        let path = req.path.unwrap_or("");
        let base = state.lock().unwrap().base.clone();
        let path = path
            .strip_prefix(base.as_str())
            .filter(|rest| !base.is_empty() && rest.starts_with('/'))
            .unwrap_or(path)
            .to_string();
        let headers: Vec<(String, String)> = req
            .headers
            .iter()
            .map(|h| {
                (
                    h.name.to_ascii_lowercase(),
                    String::from_utf8_lossy(h.value).into_owned(),
                )
            })
            .collect();
        buf.drain(..head_end);
        let get = |name: &str| {
            headers
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.clone())
        };
        if !path.starts_with("/_pinned/") && state.lock().unwrap().serve == Serve::TooLarge {
            state.lock().unwrap().seen.push(Seen {
                method,
                path,
                headers,
                body: Vec::new(),
                conn: n,
                at: std::time::Instant::now(),
            });
            let answer = "HTTP/1.1 413 Payload Too Large\r\ncontent-type: text/plain\r\n\
                          content-length: 9\r\nconnection: close\r\n\r\ntoo large";
            let _ = conn.write_all(answer.as_bytes());
            return;
        }
        let mut body = Vec::new();
        if let Some(len) = get("content-length") {
            let len: usize = len.parse().unwrap();
            while buf.len() < len {
                match conn.read(&mut chunk) {
                    Ok(0) | Err(_) => return,
                    Ok(k) => buf.extend_from_slice(&chunk[..k]),
                }
            }
            body = buf.drain(..len).collect();
        } else if get("transfer-encoding").is_some() {
            loop {
                let line = loop {
                    if let Some(i) = find(&buf, b"\r\n") {
                        break i;
                    }
                    match conn.read(&mut chunk) {
                        Ok(0) | Err(_) => return,
                        Ok(k) => buf.extend_from_slice(&chunk[..k]),
                    }
                };
                let size =
                    usize::from_str_radix(std::str::from_utf8(&buf[..line]).unwrap(), 16).unwrap();
                buf.drain(..line + 2);
                while buf.len() < size + 2 {
                    match conn.read(&mut chunk) {
                        Ok(0) | Err(_) => return,
                        Ok(k) => buf.extend_from_slice(&chunk[..k]),
                    }
                }
                body.extend(buf.drain(..size));
                buf.drain(..2);
                if size == 0 {
                    break;
                }
            }
        }
        let seen = Seen {
            method,
            path: path.clone(),
            headers,
            body,
            conn: n,
            at: std::time::Instant::now(),
        };
        let (mode, serve, secret, value, activating, stats) = {
            let mut s = state.lock().unwrap();
            s.seen.push(seen.clone());
            let activating = path.ends_with("/_wake") && s.activating > 0;
            if activating {
                s.activating -= 1;
            }
            let challenge = path
                .split_once("challenge=")
                .map(|(_, c)| c.to_string())
                .unwrap_or_default();
            (
                s.mode,
                s.serve,
                s.secret.clone(),
                s.values.get(&challenge).cloned(),
                activating,
                s.stats.clone().filter(|_| path == "/_pinned/stats"),
            )
        };
        let keep = if path.starts_with("/_pinned/challenge") {
            answer_probe(&mut conn, mode, &seen, &secret, value)
        } else if let Some(stats) = stats {
            let json = [("content-type", "application/json")];
            respond(&mut conn, "200 OK", &json, Framing::Length, &stats)
        } else if activating {
            let body = r#"{"activating":true}"#;
            let head = format!(
                "HTTP/1.1 202 Accepted\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                body.len()
            );
            conn.write_all(format!("{head}{body}").as_bytes()).is_ok()
        } else if serve == Serve::Upgrade {
            // What follows the head (bytes sent right after it) already belongs to the tunnel.
            let end = upgrade_echo(&mut conn, std::mem::take(&mut buf));
            state.lock().unwrap().tunnels.push(end);
            false
        } else if serve == Serve::Endless {
            endless(&mut conn, state);
            false
        } else {
            answer_instance(&mut conn, serve, &seen)
        };
        if !keep {
            return;
        }
    }
}

fn answer_probe(
    conn: &mut TcpStream,
    mode: Mode,
    seen: &Seen,
    secret: &str,
    value: Option<String>,
) -> bool {
    let (status, body) = match mode {
        Mode::Failing => ("500 Internal Server Error", "oops".to_string()),
        Mode::Bodyless => ("200 OK", String::new()),
        Mode::WrongValue => ("200 OK", r#"{"value":"someone-else"}"#.into()),
        Mode::Honest | Mode::Slow(_) => {
            if let Mode::Slow(d) = mode {
                std::thread::sleep(d);
            }
            if seen.header("pinboard-proxy-secret") != Some(secret) {
                ("403 Forbidden", "invalid proxy secret".into())
            } else {
                match value {
                    Some(v) => ("200 OK", serde_json::json!({ "value": v }).to_string()),
                    None => ("404 Not Found", "unknown challenge".into()),
                }
            }
        }
    };
    respond(
        conn,
        status,
        &[("content-type", "application/json")],
        Framing::Length,
        body.as_bytes(),
    )
}

fn answer_instance(conn: &mut TcpStream, serve: Serve, seen: &Seen) -> bool {
    let echo = serde_json::json!({
        "method": seen.method,
        "path": seen.path,
        "headers": seen.headers.iter().cloned().collect::<std::collections::BTreeMap<_, _>>(),
        "body": String::from_utf8_lossy(&seen.body),
        "conn": seen.conn,
    })
    .to_string();
    let extra = [
        ("content-type", "application/json"),
        ("pinboard-internal", "must not leak"),
        ("keep-alive", "timeout=5"),
    ];
    match serve {
        Serve::Echo => respond(conn, "200 OK", &extra, Framing::Length, echo.as_bytes()),
        Serve::EchoChunked => respond(conn, "200 OK", &extra, Framing::Chunked, echo.as_bytes()),
        Serve::EchoUntilClose => respond(conn, "200 OK", &extra, Framing::Close, echo.as_bytes()),
        Serve::Refuse => respond(
            conn,
            "503 Service Unavailable",
            &[("retry-after", "1"), ("pinned-refusal", "lease-unhealthy")],
            Framing::Length,
            b"refused",
        ),
        Serve::Hang => {
            std::thread::sleep(Duration::from_secs(30));
            false
        }
        Serve::Drop => false,
        Serve::Raw(answer) => conn.write_all(answer).is_ok(),
        Serve::Upgrade => unreachable!("served by upgrade_echo"),
        Serve::Endless => unreachable!("served by endless"),
        Serve::TooLarge => unreachable!("answered before the body"),
    }
}

/// Answers 200 with a 10 GB length, then writes zeros until a write fails.
fn endless(conn: &mut TcpStream, state: &Mutex<State>) {
    let head = "HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\n\
                content-length: 10737418240\r\n\r\n";
    if conn.write_all(head.as_bytes()).is_err() {
        return;
    }
    state.lock().unwrap().streaming += 1;
    let block = [0u8; 65536];
    while conn.write_all(&block).is_ok() {
        state.lock().unwrap().streamed += block.len() as u64;
    }
    state.lock().unwrap().streaming -= 1;
}

/// Answers `101`, then echoes raw bytes uppercased until the client's end of stream or `quit`.
fn upgrade_echo(conn: &mut TcpStream, early: Vec<u8>) -> TunnelEnd {
    let head = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
                Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\nPinboard-Internal: must not leak\r\n\r\nhello\n";
    if conn.write_all(head.as_bytes()).is_err() {
        return TunnelEnd::Failed;
    }
    let mut data = early;
    let mut chunk = [0u8; 16384];
    loop {
        if find(&data, b"quit").is_some() {
            let _ = conn.shutdown(std::net::Shutdown::Both);
            return TunnelEnd::WorkerClosed;
        }
        if !data.is_empty() && conn.write_all(&data.to_ascii_uppercase()).is_err() {
            return TunnelEnd::Failed;
        }
        data.clear();
        match conn.read(&mut chunk) {
            Ok(0) => {
                let _ = conn.write_all(b"bye\n");
                return TunnelEnd::ClientClosed;
            }
            Ok(k) => data.extend_from_slice(&chunk[..k]),
            Err(_) => return TunnelEnd::Failed,
        }
    }
}

enum Framing {
    Length,
    Chunked,
    Close,
}

/// Writes one answer; false when the connection must close after it.
fn respond(
    conn: &mut TcpStream,
    status: &str,
    headers: &[(&str, &str)],
    framing: Framing,
    body: &[u8],
) -> bool {
    let mut out = format!("HTTP/1.1 {status}\r\n");
    for (k, v) in headers {
        out.push_str(&format!("{k}: {v}\r\n"));
    }
    let mut bytes = match framing {
        Framing::Length => format!("{out}content-length: {}\r\n\r\n", body.len()).into_bytes(),
        Framing::Chunked => format!("{out}transfer-encoding: chunked\r\n\r\n").into_bytes(),
        Framing::Close => format!("{out}connection: close\r\n\r\n").into_bytes(),
    };
    match framing {
        Framing::Chunked => {
            // Two chunks, so relaying has to handle more than one.
            let (a, b) = body.split_at(body.len() / 2);
            for part in [a, b] {
                bytes.extend_from_slice(format!("{:x}\r\n", part.len()).as_bytes());
                bytes.extend_from_slice(part);
                bytes.extend_from_slice(b"\r\n");
            }
            bytes.extend_from_slice(b"0\r\n\r\n");
        }
        _ => bytes.extend_from_slice(body),
    }
    conn.write_all(&bytes).is_ok() && !matches!(framing, Framing::Close)
}
