//! Runs the real `pinboard` binary as a child process for integration tests: configured through
//! the environment, listening on a port the kernel picks (or a given one, to restart a node in
//! place), logging to a file the test can read.
//!
//! The binary is the one cargo built for the node crate's own tests; other crates of the
//! workspace (the worker library) find it through `PINBOARD_BIN`, else next to their test
//! executable (`target/debug/pinboard`, which `cargo test --workspace` builds).

use std::io::Read;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
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
        Node::try_spawn(redis_url, env).unwrap_or_else(|(code, log)| {
            panic!("pinboard exited with {code:?} before listening:\n{log}")
        })
    }

    /// Like [`Node::spawn`], but a node that exits before it listens is an answer: its exit
    /// code and log.
    pub fn try_spawn(redis_url: &str, env: &[(&str, &str)]) -> Result<Node, (Option<i32>, String)> {
        Node::try_spawn_under(&[], redis_url, env)
    }

    /// `pinboard serve --upgrade` on `listen` (a running node's address), as [`Node::try_spawn`].
    pub fn try_take_over(
        listen: SocketAddr,
        redis_url: &str,
        env: &[(&str, &str)],
    ) -> Result<Node, (Option<i32>, String)> {
        let listen = listen.to_string();
        let mut all = vec![("PINBOARD_LISTEN", listen.as_str())];
        all.extend_from_slice(env);
        Node::try_spawn_with(&[], &["--upgrade"], redis_url, &all)
    }

    /// Like [`Node::spawn`], the binary run by `wrapper` (a program and its arguments, the
    /// binary's path and `serve` after them: `unshare …`, say).
    pub fn spawn_under(wrapper: &[&str], redis_url: &str, env: &[(&str, &str)]) -> Node {
        Node::try_spawn_with(wrapper, &[], redis_url, env).unwrap_or_else(|(code, log)| {
            panic!("pinboard exited with {code:?} before listening:\n{log}")
        })
    }

    fn try_spawn_under(
        wrapper: &[&str],
        redis_url: &str,
        env: &[(&str, &str)],
    ) -> Result<Node, (Option<i32>, String)> {
        Node::try_spawn_with(wrapper, &[], redis_url, env)
    }

    /// `serve` run by `wrapper`, with `args` after it.
    fn try_spawn_with(
        wrapper: &[&str],
        args: &[&str],
        redis_url: &str,
        env: &[(&str, &str)],
    ) -> Result<Node, (Option<i32>, String)> {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("node.log");
        let mut all = vec![
            ("PINBOARD_THREADS", "2"),
            ("PINBOARD_LOG", "info,pinboard=debug"),
        ];
        all.extend_from_slice(env);
        let child = serve(wrapper, args, redis_url, &all, &log);
        let mut node = Node {
            child,
            addr: "0.0.0.0:0".parse().unwrap(),
            log,
            _dir: dir,
        };
        node.addr = node.wait_for_listen()?;
        Ok(node)
    }

    /// Until `/readyz` answers 200 several times in a row (each core has its own Redis
    /// connection, and connections land on cores at random).
    pub fn wait_until_ready(&self) {
        let ready = eventually(Duration::from_secs(20), || {
            (0..6).all(|_| crate::support::http::get(self.addr, "/readyz", None).status == 200)
        });
        assert!(ready, "pinboard never became ready:\n{}", self.log());
    }

    /// The address it listens on, or its exit code and log if it exits first.
    fn wait_for_listen(&mut self) -> Result<SocketAddr, (Option<i32>, String)> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let log = self.log();
            if let Some(line) = log.lines().find(|l| l.contains("pinboard listening")) {
                let addr = line
                    .split_whitespace()
                    .find_map(|w| w.strip_prefix("addr="))
                    .expect("listen line names addr");
                return Ok(addr.parse().unwrap());
            }
            if let Some(status) = self.child.try_wait().unwrap() {
                return Err((status.code(), self.log()));
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

    /// The lines of the log that contain `what`.
    pub fn log_lines(&self, what: &str) -> Vec<String> {
        self.log()
            .lines()
            .filter(|l| l.contains(what))
            .map(str::to_owned)
            .collect()
    }

    /// Until the log says `what` (5 s at most: then the test fails, showing the log).
    pub fn logs(&self, what: &str) {
        assert!(
            eventually(Duration::from_secs(5), || self.log().contains(what)),
            "{what} is not in the log:\n{}",
            self.log()
        );
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The process's resident set size, from `/proc/{pid}/status`.
    pub fn rss_bytes(&self) -> u64 {
        self.status_field("VmRSS:") * 1024
    }

    /// How many threads the process runs, from `/proc/{pid}/status`.
    pub fn threads(&self) -> u64 {
        self.status_field("Threads:")
    }

    /// The number a line of `/proc/{pid}/status` starting with `field` holds.
    fn status_field(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or_else(|| panic!("{field} in /proc/PID/status"))
    }

    /// Where the node's metrics listener listens, from its log (`metrics listening addr=…`).
    pub fn metrics_addr(&self) -> SocketAddr {
        let log = self.log();
        let line = log
            .lines()
            .find(|l| l.contains("metrics listening"))
            .unwrap_or_else(|| panic!("no metrics listener in the log:\n{log}"));
        line.split_whitespace()
            .find_map(|w| w.strip_prefix("addr="))
            .expect("the line names addr")
            .parse()
            .unwrap()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
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

/// An HS256 credential signed with the test secret, for loopback backends.
pub fn token(sub: &str, scopes: &[&str], namespaces: &[&str]) -> String {
    token_for_hosts(sub, scopes, namespaces, &["127.0.0.1", "localhost"])
}

/// [`token`] for the backend hosts (patterns) `backend_hosts`.
pub fn token_for_hosts(
    sub: &str,
    scopes: &[&str],
    namespaces: &[&str],
    backend_hosts: &[&str],
) -> String {
    token_signed_with(SECRET, sub, scopes, namespaces, backend_hosts)
}

/// [`token_for_hosts`] signed with `secret` (a key the node is given besides the test one).
pub fn token_signed_with(
    secret: &str,
    sub: &str,
    scopes: &[&str],
    namespaces: &[&str],
    backend_hosts: &[&str],
) -> String {
    mint(
        secret,
        &TokenRequest {
            sub: sub.into(),
            scopes: scopes.iter().map(|s| s.to_string()).collect(),
            namespaces: namespaces.iter().map(|s| s.to_string()).collect(),
            backend_hosts: backend_hosts.iter().map(|s| s.to_string()).collect(),
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

/// A configuration file holding `text`, for `PINBOARD_CONFIG` (settings with no environment
/// form, like `namespaces`): its directory, which removes it when dropped, and its path.
pub fn config_file(text: &str) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pinboard.toml");
    std::fs::write(&file, text).unwrap();
    let path = file.to_str().unwrap().to_owned();
    (dir, path)
}

/// An HS256 credential carrying exactly `claims` (a data-plane passport's, say), signed with
/// the test secret.
pub fn credential(claims: &serde_json::Value) -> String {
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
    header.typ = Some("JWT".into());
    let key = jsonwebtoken::EncodingKey::from_secret(SECRET.as_bytes()).unwrap();
    jsonwebtoken::encode(&header, claims, &key).unwrap()
}

/// `pinboard serve` on `redis_url` with the test HS256 secret, on a port the kernel picks,
/// none of this process's `PINBOARD_*` settings, and `env` over that; its stderr to `stderr`.
/// Run by `wrapper` when it names a program, with `args` after `serve`.
fn serve(
    wrapper: &[&str],
    args: &[&str],
    redis_url: &str,
    env: &[(&str, &str)],
    stderr: &Path,
) -> Child {
    let mut cmd = match wrapper {
        [program, args @ ..] => {
            let mut cmd = Command::new(program);
            cmd.args(args).arg(binary());
            cmd
        }
        [] => Command::new(binary()),
    };
    for (key, _) in std::env::vars().filter(|(k, _)| k.starts_with("PINBOARD_")) {
        cmd.env_remove(key);
    }
    cmd.arg("serve")
        .args(args)
        .env("PINBOARD_LISTEN", "127.0.0.1:0")
        .env("PINBOARD_REDIS_URL", redis_url)
        .env("PINBOARD_PASSPORT__HS256_SECRET", SECRET)
        .env("NO_COLOR", "1")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(stderr).unwrap())
        .spawn()
        .expect("spawn pinboard")
}

/// `pinboard serve` on `redis_url` with `env` (the default log filter: what an operator sees),
/// which must exit within 20 s (the test fails otherwise): its exit code and stderr.
pub fn serve_until_exit(redis_url: &str, env: &[(&str, &str)]) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let stderr = dir.path().join("stderr");
    let mut child = serve(&[], &[], redis_url, env, &stderr);
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "pinboard serve did not exit on {redis_url}:\n{}",
                std::fs::read_to_string(&stderr).unwrap()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (status.code(), std::fs::read_to_string(&stderr).unwrap())
}

/// Asserts that `pinboard serve` on `redis_url` with `env` exits 2 with one line on stderr,
/// about `redis_url` and saying `reason`, and holding none of `secrets`: the line.
pub fn refused_at_start(
    redis_url: &str,
    env: &[(&str, &str)],
    reason: &str,
    secrets: &[&str],
) -> String {
    let (code, stderr) = serve_until_exit(redis_url, env);
    assert_eq!(code, Some(2), "{redis_url}: {stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
    assert!(
        stderr.starts_with("config error: redis_url: ") && stderr.contains(reason),
        "{redis_url}: {reason}: {stderr}"
    );
    for secret in secrets {
        assert!(!stderr.contains(secret), "{stderr}");
    }
    stderr
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
