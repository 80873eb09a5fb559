//! Child processes of a test: finding a workspace binary next to the test executable, whether
//! a system program is installed, and reading what a child prints while it runs.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::Child;
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
