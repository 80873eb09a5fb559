//! Child processes of a test: finding a workspace binary next to the test executable, starting
//! `pinned-example`, whether a system program is installed, and reading what a child prints
//! while it runs.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::sync::{Arc, Mutex};

/// The binary `name` of another package of the workspace: at `$env_var` when set, else next to
/// the test executable (`target/debug/deps/..`), where `cargo test --workspace` builds it.
pub fn sibling_binary(name: &str, env_var: &str, build: &str) -> PathBuf {
    if let Some(path) = std::env::var_os(env_var) {
        return path.into();
    }
    let exe = std::env::current_exe().expect("the test executable's path");
    let bin = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/debug/deps")
        .join(name);
    assert!(
        bin.exists(),
        "no {name} binary at {}: run `{build}` first, or set {env_var}",
        bin.display()
    );
    bin
}

/// A `pinned-example` to start: the binary, and what it registers with.
pub struct PinnedExample<'a> {
    pub bin: &'a Path,
    pub registry: &'a str,
    /// Comma-separated (`/threads,/docs`).
    pub namespaces: &'a str,
    pub client_id: &'a str,
}

impl PinnedExample<'_> {
    /// The binary next to this test's ([`sibling_binary`]).
    pub fn sibling() -> PathBuf {
        sibling_binary(
            "pinned-example",
            "PINNED_EXAMPLE_BIN",
            "cargo build -p pinned --bin pinned-example",
        )
    }

    /// Started with `extra` arguments and the credential `env` gives (`PINNED_TOKEN` or
    /// `PINNED_TOKEN_FILE`; this process's own are not passed on), its log at `info`: the child
    /// and its output, captured.
    pub fn spawn(&self, extra: &[&str], env: &[(&str, &str)]) -> (Child, Output) {
        let mut child = Command::new(self.bin)
            .args(["--registry", self.registry, "--namespaces", self.namespaces])
            .args(["--client-id", self.client_id])
            .args(extra)
            .env_remove("PINNED_TOKEN")
            .env_remove("PINNED_TOKEN_FILE")
            .envs(env.iter().copied())
            .env("PINNED_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn pinned-example");
        let output = Output::capture(&mut child);
        (child, output)
    }
}

/// The ticks a `pinned-example` `log` shows for `/threads/{id}`, in order (`tick ns=… id=…
/// ticks=N`, one line per `_wake` its ticker ran).
pub fn ticks_logged(log: &[String], id: &str) -> Vec<u64> {
    let instance = format!(" ns=/threads id={id} ");
    log.iter()
        .filter(|line| line.contains(" tick ") && line.contains(&instance))
        .filter_map(|line| {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix("ticks="))
        })
        .map(|n| n.parse().unwrap())
        .collect()
}

/// Whether `program` (from Debian's `package`) runs here. Without it, `what` is skipped with a
/// note; under CI (`CI` set) that fails instead, since `.ci/run` installs it.
pub fn installed_or_skipped(program: &str, package: &str, what: &str) -> bool {
    match std::process::Command::new(program)
        .arg("--version")
        .output()
    {
        Ok(_) => true,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            assert!(
                std::env::var_os("CI").is_none(),
                "{program} is not installed (Debian: apt-get install {package})"
            );
            eprintln!("note: {program} not found, {what} skipped (apt-get install {package})");
            false
        }
        Err(e) => panic!("{program}: {e}"),
    }
}

/// A child's stdout, line by line as it comes, and its stderr (its log) as written so far.
pub struct Output {
    pub lines: Receiver<String>,
    pub log: Arc<Mutex<Vec<String>>>,
}

impl Output {
    /// Takes the child's piped stdout and stderr and reads each on a thread of its own.
    pub fn capture(child: &mut Child) -> Output {
        let (send, lines) = channel();
        let stdout = BufReader::new(child.stdout.take().expect("stdout piped"));
        std::thread::spawn(move || {
            for line in stdout.lines().map_while(Result::ok) {
                let _ = send.send(line);
            }
        });
        let log = Arc::new(Mutex::new(Vec::new()));
        let stderr = BufReader::new(child.stderr.take().expect("stderr piped"));
        let written = log.clone();
        std::thread::spawn(move || {
            for line in stderr.lines().map_while(Result::ok) {
                written.lock().unwrap().push(line);
            }
        });
        Output { lines, log }
    }

    /// The log so far, one line each.
    pub fn log(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }
}
