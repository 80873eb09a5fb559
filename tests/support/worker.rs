//! Hand-made workers for registry tests: a real HTTP server on a loopback port that answers
//! Pinboard's ownership probe the way a test tells it to — honestly, with another worker's
//! value, slowly, with an error, or without a body — and records every probe it saw.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

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

#[derive(Clone, Debug)]
pub struct Probe {
    pub path: String,
    pub secret: Option<String>,
}

struct State {
    secret: String,
    mode: Mode,
    values: HashMap<String, String>,
    probes: Vec<Probe>,
}

pub struct TestWorker {
    pub addr: SocketAddr,
    state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
}

impl TestWorker {
    pub fn start(secret: &str) -> TestWorker {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(State {
            secret: secret.into(),
            mode: Mode::Honest,
            values: HashMap::new(),
            probes: Vec::new(),
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let (s, st) = (state.clone(), stop.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if st.load(Ordering::SeqCst) {
                    return;
                }
                if let Ok(conn) = conn {
                    let s = s.clone();
                    std::thread::spawn(move || serve(conn, &s));
                }
            }
        });
        TestWorker { addr, state, stop }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.addr.port())
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

    pub fn probes(&self) -> Vec<Probe> {
        self.state.lock().unwrap().probes.clone()
    }
}

impl Drop for TestWorker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr);
    }
}

fn serve(mut conn: TcpStream, state: &Mutex<State>) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        match conn.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut req = httparse::Request::new(&mut headers);
    if req.parse(&buf).is_err() {
        return;
    }
    let path = req.path.unwrap_or("").to_string();
    let secret = req
        .headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("pinboard-proxy-secret"))
        .map(|h| String::from_utf8_lossy(h.value).into_owned());
    let (mode, expected_secret, value) = {
        let mut s = state.lock().unwrap();
        s.probes.push(Probe {
            path: path.clone(),
            secret: secret.clone(),
        });
        let challenge = path
            .split_once("challenge=")
            .map(|(_, c)| c.to_string())
            .unwrap_or_default();
        (s.mode, s.secret.clone(), s.values.get(&challenge).cloned())
    };
    let (status, body) = match mode {
        _ if !path.starts_with("/_pinned/challenge") => ("404 Not Found", String::new()),
        Mode::Failing => ("500 Internal Server Error", "oops".into()),
        Mode::Bodyless => ("200 OK", String::new()),
        Mode::WrongValue => ("200 OK", r#"{"value":"someone-else"}"#.into()),
        Mode::Honest | Mode::Slow(_) => {
            if let Mode::Slow(d) = mode {
                std::thread::sleep(d);
            }
            if secret.as_deref() != Some(expected_secret.as_str()) {
                ("403 Forbidden", "invalid proxy secret".into())
            } else {
                match value {
                    Some(v) => ("200 OK", serde_json::json!({ "value": v }).to_string()),
                    None => ("404 Not Found", "unknown challenge".into()),
                }
            }
        }
    };
    let _ = conn.write_all(
        format!(
            "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    );
}
