//! Runs the real `pinboard` binary as a child process for integration tests: configured through
//! the environment, listening on a port the kernel picks (or a given one, to restart a node in
//! place), logging to a file the test can read.
//!
//! The binary is the one cargo built for the node crate's own tests; other crates of the
//! workspace (the worker library) find it through `PINBOARD_BIN`, else next to their test
//! executable (`target/debug/pinboard`, which `cargo test --workspace` builds).

use std::io::Read;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use pinboard::passport::{TokenRequest, mint};

pub const SECRET: &str = "integration-test-secret-0123456789";

fn binary() -> PathBuf {
    if let Some(path) = option_env!("CARGO_BIN_EXE_pinboard") {
        return path.into();
    }
    super::process::sibling_binary("pinboard", "PINBOARD_BIN", "cargo build -p pinboard")
}

pub struct Node {
    child: Child,
    pub addr: SocketAddr,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Node {
    /// Starts a node on `redis_url` with a test HS256 secret, plus `env` overrides
    /// (`("PINBOARD_THREADS", "1")`, ...). Returns once it is ready.
    pub fn start(redis_url: &str, env: &[(&str, &str)]) -> Node {
        let node = Node::spawn(redis_url, env);
        node.wait_until_ready();
        node
    }

    /// Like [`Node::start`], but returns once it listens, ready or not.
    pub fn spawn(redis_url: &str, env: &[(&str, &str)]) -> Node {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("node.log");
        let mut cmd = Command::new(binary());
        cmd.arg("serve");
        for (key, _) in std::env::vars().filter(|(k, _)| k.starts_with("PINBOARD_")) {
            cmd.env_remove(key);
        }
        cmd.env("PINBOARD_LISTEN", "127.0.0.1:0")
            .env("PINBOARD_REDIS_URL", redis_url)
            .env("PINBOARD_PASSPORT__HS256_SECRET", SECRET)
            .env("PINBOARD_THREADS", "2")
            .env("PINBOARD_LOG", "info,pinboard=debug")
            .env("NO_COLOR", "1");
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        let child = cmd.spawn().expect("spawn pinboard");
        let mut node = Node {
            child,
            addr: "0.0.0.0:0".parse().unwrap(),
            log,
            _dir: dir,
        };
        node.addr = node.wait_for_listen();
        node
    }

    /// Until `/readyz` answers 200 several times in a row (each core has its own Redis
    /// connection, and connections land on cores at random).
    fn wait_until_ready(&self) {
        let ready = eventually(Duration::from_secs(20), || {
            (0..6).all(|_| crate::support::http::get(self.addr, "/readyz", None).status == 200)
        });
        assert!(ready, "pinboard never became ready:\n{}", self.log());
    }

    fn wait_for_listen(&mut self) -> SocketAddr {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let log = self.log();
            if let Some(line) = log.lines().find(|l| l.contains("pinboard listening")) {
                let addr = line
                    .split_whitespace()
                    .find_map(|w| w.strip_prefix("addr="))
                    .expect("listen line names addr");
                return addr.parse().unwrap();
            }
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("pinboard exited with {status} before listening:\n{log}");
            }
            assert!(
                Instant::now() < deadline,
                "pinboard did not listen in time:\n{log}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn log(&self) -> String {
        let mut text = String::new();
        if let Ok(mut f) = std::fs::File::open(&self.log) {
            let _ = f.read_to_string(&mut text);
        }
        text
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The process's resident set size, from `/proc/{pid}/status`.
    pub fn rss_bytes(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let kib: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .expect("VmRSS in /proc/PID/status");
        kib * 1024
    }

    /// Sends SIGTERM and waits (bounded) for the process to exit.
    pub fn stop(&mut self) -> ExitStatus {
        self.terminate();
        self.wait(Duration::from_secs(20))
    }

    /// Sends SIGTERM without waiting.
    pub fn terminate(&self) {
        self.signal("TERM");
    }

    /// Sends the signal named (`HUP`, `TERM`, ...) without waiting.
    pub fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .args([&format!("-{name}"), &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Waits (bounded) for the process to exit.
    pub fn wait(&mut self, limit: Duration) -> ExitStatus {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "pinboard did not exit in time:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// A worker credential for account `sub` on every namespace and loopback backends.
    pub fn worker_token(&self, sub: &str) -> String {
        token(sub, &["pinboard:worker"], &["*"])
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An HS256 credential signed with the test secret.
pub fn token(sub: &str, scopes: &[&str], namespaces: &[&str]) -> String {
    mint(
        SECRET,
        &TokenRequest {
            sub: sub.into(),
            scopes: scopes.iter().map(|s| s.to_string()).collect(),
            namespaces: namespaces.iter().map(|s| s.to_string()).collect(),
            backend_hosts: vec!["127.0.0.1".into(), "localhost".into()],
            ports: vec![],
            hostnames: vec![],
            envs: vec![],
            ttl_secs: 3600,
            issuer: None,
            audience: None,
        },
    )
    .expect("mint test token")
}

/// Polls `check` every 50 ms until it holds or `limit` passes.
pub fn eventually(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if check() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    check()
}
