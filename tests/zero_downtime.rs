//! Changing a running node without failing a request (issue 24): the stop delay for load
//! balancers (`http.shutdown_delay_ms`), the binary upgrade (`pinboard serve --upgrade`, SIGUSR2)
//! and `pinboard reload`, against the real binary, a real redis-server and a real worker.

mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use support::fleet::Fixture;
use support::http::{Client, get};
use support::node::{Node, eventually};
use support::redis::RedisServer;

/// Long enough that the requests the test makes right after SIGTERM all fall inside it, on a
/// slow machine too; the test never measures it.
const DELAY_MS: &str = "5000";

/// On SIGTERM `/readyz` turns 503 at once while the node goes on accepting and forwarding (new
/// connections each time) for `http.shutdown_delay_ms`; then it stops accepting, finishes what
/// is in flight and exits 0.
#[test]
fn a_shutdown_delay_fails_readiness_and_serves_on_before_the_drain() {
    let (mut f, _worker, _) =
        Fixture::with_worker(&[("PINBOARD_HTTP__SHUTDOWN_DELAY_MS", DELAY_MS)], "delay");
    let addr = f.node.addr;
    assert_eq!(get(addr, "/threads/abc", None).status, 200);

    f.node.terminate();
    f.node.logs("serving on for http.shutdown_delay_ms");
    for _ in 0..5 {
        assert_eq!(get(addr, "/readyz", None).status, 503, "{}", f.node.log());
        let r = get(addr, "/threads/abc", None);
        assert_eq!(r.status, 200, "{r:?}\n{}", f.node.log());
    }
    // A request whose head is half sent before the delay ends keeps the node draining, so the
    // closed listener is seen while the node is alive (once it exits, a parallel test may bind
    // the freed port).
    let mut in_flight = Client::connect(addr);
    in_flight.send(b"GET /threads/abc HTTP/1.1\r\nHost: t\r\n");
    assert!(
        eventually(Duration::from_secs(30), || TcpStream::connect(addr)
            .is_err()),
        "the listener closes once the delay is over:\n{}",
        f.node.log()
    );
    in_flight.send(b"\r\n");
    let r = in_flight.read(false);
    assert_eq!((r.status, r.header("connection")), (200, Some("close")));
    let status = f.node.wait(Duration::from_secs(20));
    assert_eq!(status.code(), Some(0), "{}", f.node.log());
}

/// What one load client saw.
#[derive(Default)]
struct Seen {
    answered: u64,
    /// Connections refused, or requests that got no whole answer (a reset, an early close).
    failures: Vec<String>,
    /// Answers that were not 2xx.
    statuses: Vec<u16>,
}

/// One client of the load: requests `path` over a keep-alive connection, again and again,
/// opening a new connection only when an answer says `Connection: close`, until `stop`.
fn load_client(addr: SocketAddr, path: String, answered: &AtomicU64, stop: &AtomicBool) -> Seen {
    let mut seen = Seen::default();
    let mut conn: Option<TcpStream> = None;
    while !stop.load(Ordering::Relaxed) {
        let mut stream = match conn.take() {
            Some(stream) => stream,
            None => match TcpStream::connect(addr) {
                Ok(stream) => {
                    stream
                        .set_read_timeout(Some(Duration::from_secs(20)))
                        .unwrap();
                    stream
                }
                Err(e) => {
                    seen.failures.push(format!("connect: {e}"));
                    continue;
                }
            },
        };
        let request = format!("GET {path} HTTP/1.1\r\nHost: t\r\n\r\n");
        match stream
            .write_all(request.as_bytes())
            .and_then(|()| read_answer(&mut stream))
        {
            Ok((status, close)) => {
                seen.answered += 1;
                answered.fetch_add(1, Ordering::Relaxed);
                if !(200..300).contains(&status) {
                    seen.statuses.push(status);
                }
                if !close {
                    conn = Some(stream);
                }
            }
            Err(e) => seen.failures.push(format!("request: {e}")),
        }
    }
    seen
}

/// One answer's status and whether it closes the connection (`Content-Length` framed, as the
/// test worker's and the node's answers are).
fn read_answer(stream: &mut TcpStream) -> std::io::Result<(u16, bool)> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut head = httparse::Response::new(&mut headers);
        if let httparse::Status::Complete(len) = head.parse(&buf).map_err(std::io::Error::other)? {
            let header = |name: &str| {
                head.headers
                    .iter()
                    .find(|h| h.name.eq_ignore_ascii_case(name))
                    .map(|h| String::from_utf8_lossy(h.value).to_ascii_lowercase())
            };
            let length: usize = header("content-length").map_or(0, |v| v.parse().unwrap_or(0));
            let close = header("connection").is_some_and(|v| v.contains("close"));
            let status = head.code.unwrap_or(0);
            while buf.len() < len + length {
                let n = stream.read(&mut chunk)?;
                if n == 0 {
                    return Err(std::io::ErrorKind::UnexpectedEof.into());
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            return Ok((status, close));
        }
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// The environment a node taking the fixture's node over needs to be of its fleet.
fn fleet_env() -> Vec<(&'static str, String)> {
    vec![
        ("PINBOARD_SHARDS", support::fleet::SHARDS.to_string()),
        ("PINBOARD_VERIFY_TIMEOUT_MS", "500".into()),
    ]
}

fn with<'a>(env: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    env.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

/// `pinboard serve --upgrade` under load (16 keep-alive clients through the node to a real
/// worker), twice in a row (the new process serves the control socket in turn), the middle
/// node on epoll so that each driver drains once: not one connection refused, reset or closed
/// under a request, not one answer other than 2xx; each new process writes the pid file and
/// serves on, each old one exits 0.
#[test]
fn upgrades_under_load_fail_no_request() {
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pinboard.pid");
    let mut env = fleet_env();
    env.push(("PINBOARD_PID_FILE", pid_file.display().to_string()));
    let (f, _worker, _) = Fixture::with_worker(&with(&env[2..]), "upgrade");
    let addr = f.node.addr;
    let pid_of = || {
        std::fs::read_to_string(&pid_file)
            .unwrap()
            .trim()
            .to_owned()
    };
    assert_eq!(pid_of(), f.node.pid().to_string());

    let (answered, stop) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicBool::new(false)),
    );
    let clients: Vec<_> = (0..16)
        .map(|i| {
            let (answered, stop) = (answered.clone(), stop.clone());
            let path = format!("/threads/load-{i}");
            std::thread::spawn(move || load_client(addr, path, &answered, &stop))
        })
        .collect();
    let more_than = |n: u64| {
        eventually(Duration::from_secs(30), || {
            answered.load(Ordering::Relaxed) > n
        })
    };
    assert!(more_than(500), "the load runs");

    let mut old = f.node;
    for driver in ["epoll", "auto"] {
        let mut env = with(&env);
        env.push(("PINBOARD_DRIVER", driver));
        let new = Node::try_take_over(addr, &f.redis.url(), &env)
            .unwrap_or_else(|(code, log)| panic!("the upgrade failed ({code:?}):\n{log}"));
        new.logs("upgrade: serving on the sockets taken over");
        let status = old.wait(Duration::from_secs(30));
        assert_eq!(status.code(), Some(0), "{}", old.log());
        old.logs("upgrade: the new process serves on the listening sockets");
        assert_eq!(
            pid_of(),
            new.pid().to_string(),
            "the new process owns the pid file"
        );
        let after = answered.load(Ordering::Relaxed);
        assert!(
            more_than(after + 500),
            "the load goes on against the new process"
        );
        old = new;
    }
    stop.store(true, Ordering::Relaxed);
    let seen: Vec<Seen> = clients.into_iter().map(|c| c.join().unwrap()).collect();

    let failures: Vec<_> = seen.iter().flat_map(|s| &s.failures).collect();
    let statuses: Vec<_> = seen.iter().flat_map(|s| &s.statuses).collect();
    let total: u64 = seen.iter().map(|s| s.answered).sum();
    assert!(
        failures.is_empty() && statuses.is_empty(),
        "{total} answered; failures {failures:?}; non-2xx {statuses:?}\nlast:\n{}",
        old.log()
    );
    assert_eq!(get(addr, "/threads/abc", None).status, 200);
    assert!(old.stop().success());
    assert!(!pid_file.exists(), "removed at a clean exit");
}

/// `pinboard` run with `args` and only the `PINBOARD_*` settings of `env`, as the user `uid`
/// when one is given (which may not reach the binary: an error then).
fn pinboard(
    args: &[&str],
    env: &[(&str, &str)],
    uid: Option<u32>,
) -> std::io::Result<std::process::Output> {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_pinboard"));
    cmd.args(args);
    for (key, _) in std::env::vars().filter(|(k, _)| k.starts_with("PINBOARD_")) {
        cmd.env_remove(key);
    }
    if let Some(uid) = uid {
        cmd.uid(uid).gid(uid);
    }
    cmd.envs(env.iter().copied()).output()
}

/// A port nothing listens on (bound and released: a parallel test could take it, rarely).
fn free_port() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// Root may run a peer as another user; others skip that part.
fn as_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// `nobody`.
const OTHER_UID: u32 = 65534;

/// `--upgrade` with no node to take over, or with settings the sockets cannot follow (another
/// count of cores, another metrics address), exits 2 with a line naming the key, and the
/// running node serves on; its control socket gives nothing to another user's process (the
/// real binary, which refuses a node of another user itself, and a raw peer that asks).
#[test]
fn an_upgrade_is_refused_clearly_and_the_running_node_serves_on() {
    let redis = RedisServer::start();
    let refused = |listen: SocketAddr, env: &[(&str, &str)], line: &str| {
        let (code, log) = Node::try_take_over(listen, &redis.url(), env)
            .err()
            .expect("the upgrade is refused");
        assert_eq!(code, Some(2), "{log}");
        assert!(
            log.trim_end().ends_with(line) || log.contains(line),
            "{line}: {log}"
        );
    };
    refused(
        free_port(),
        &[],
        "config error: listen: --upgrade: no running node serves",
    );

    let node = Node::start(&redis.url(), &[]);
    refused(
        node.addr,
        &[("PINBOARD_THREADS", "3")],
        "config error: threads: --upgrade: the running node has 2 listeners and this configuration wants 3 cores",
    );
    refused(
        node.addr,
        &[("PINBOARD_METRICS_LISTEN", "127.0.0.1:0")],
        "config error: metrics_listen: --upgrade: the running node's is unset",
    );
    node.logs("upgrade abandoned; this node serves on");
    assert_eq!(get(node.addr, "/healthz", None).status, 200);

    if as_root() {
        let listen = node.addr.to_string();
        let env = [
            ("PINBOARD_LISTEN", listen.as_str()),
            ("PINBOARD_THREADS", "2"),
            ("PINBOARD_REDIS_URL", &redis.url()),
            ("PINBOARD_PASSPORT__HS256_SECRET", support::node::SECRET),
        ];
        // Where the build directory is private, `nobody` cannot run the binary: that part is
        // skipped, and said.
        match pinboard(&["serve", "--upgrade"], &env, Some(OTHER_UID)) {
            Ok(out) => {
                let stderr = String::from_utf8_lossy(&out.stderr);
                assert_eq!(out.status.code(), Some(2), "{stderr}");
                assert!(
                    stderr.contains(
                        "the process on the control socket: its uid 0 is not this node's (65534)"
                    ),
                    "{stderr}"
                );
            }
            Err(e) => eprintln!("skipped: pinboard as uid {OTHER_UID}: {e}"),
        }
        // A peer that does not check, and asks: refused, with no descriptor.
        let peer = "import socket, sys\n\
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n\
            s.connect('\\0pinboard/' + sys.argv[1])\n\
            s.sendall(b'upgrade\\n')\n\
            data, ancillary, _, _ = s.recvmsg(256, socket.CMSG_SPACE(64))\n\
            print(data.decode().strip(), len(ancillary))\n";
        let out = Command::new("/usr/bin/python3")
            .args(["-c", peer, &listen])
            .uid(OTHER_UID)
            .gid(OTHER_UID)
            .output();
        let Ok(out) = out else {
            eprintln!("skipped: /usr/bin/python3 as uid {OTHER_UID}: {out:?}");
            return;
        };
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            "refused: its uid 65534 is not this node's (0) 0",
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        node.logs("refused a take-over on the control socket");
    }
    assert_eq!(get(node.addr, "/healthz", None).status, 200);
}

/// Kills a process the test did not start itself (the one SIGUSR2 started) if the test ends
/// before it is stopped.
struct Reaped(i32);

impl Drop for Reaped {
    fn drop(&mut self) {
        // SAFETY: kill has no memory preconditions.
        unsafe { libc::kill(self.0, libc::SIGKILL) };
    }
}

/// SIGUSR2, as nginx: the node runs its own command line again with `--upgrade`; the new
/// process takes the sockets over and the pid file, the old one exits 0.
#[test]
fn sigusr2_runs_the_binary_again_to_take_the_sockets_over() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pinboard.pid");
    let (listen, pid_path) = (free_port().to_string(), pid_file.display().to_string());
    let mut old = Node::start(
        &redis.url(),
        &[
            ("PINBOARD_LISTEN", &listen),
            ("PINBOARD_PID_FILE", &pid_path),
        ],
    );
    old.signal("USR2");
    let status = old.wait(Duration::from_secs(30));
    assert_eq!(status.code(), Some(0), "{}", old.log());
    // The new process writes to the same log (its stderr is the old one's).
    old.logs("upgrade: serving on the sockets taken over");
    let new: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let new = Reaped(new);
    assert_ne!(new.0, old.pid() as i32);
    assert_eq!(get(old.addr, "/healthz", None).status, 200);
    // SAFETY: kill has no memory preconditions.
    unsafe { libc::kill(new.0, libc::SIGTERM) };
    assert!(
        eventually(Duration::from_secs(20), || !pid_file.exists()),
        "the new process stops cleanly:\n{}",
        old.log()
    );
}

/// `pinboard reload` sends SIGHUP to the node its pid file names (`--pid-file`, or the
/// configuration's `pid_file`), else to the one its control socket finds on `listen`; with
/// no node, it says so and exits 1.
#[test]
fn reload_signals_the_node_and_says_when_there_is_none() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pinboard.pid");
    let pid_path = pid_file.display().to_string();
    let mut node = Node::start(&redis.url(), &[("PINBOARD_PID_FILE", &pid_path)]);
    let listen = node.addr.to_string();
    let config = |pid_file: bool| {
        let mut env = vec![
            ("PINBOARD_LISTEN", listen.as_str()),
            ("PINBOARD_PASSPORT__HS256_SECRET", support::node::SECRET),
        ];
        if pid_file {
            env.push(("PINBOARD_PID_FILE", pid_path.as_str()));
        }
        env
    };
    let said = |args: &[&str], env: &[(&str, &str)]| {
        let out = pinboard(args, env, None).unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        (out.status.code(), text.trim_end().to_owned())
    };
    let pid = node.pid();
    for (args, env, from) in [
        (
            vec!["reload", "--pid-file", &pid_path],
            vec![],
            format!("pid file {pid_path}"),
        ),
        (vec!["reload"], config(true), format!("pid file {pid_path}")),
        (
            vec!["reload"],
            config(false),
            format!("the node serving {listen}"),
        ),
    ] {
        let before = node.log_lines("SIGHUP").len();
        assert_eq!(
            said(&args, &env),
            (
                Some(0),
                format!("pinboard reload: sent SIGHUP to pid {pid} ({from})")
            )
        );
        assert!(
            eventually(Duration::from_secs(5), || node.log_lines("SIGHUP").len()
                > before),
            "the SIGHUP reached the node:\n{}",
            node.log()
        );
    }
    assert!(node.stop().success());

    let (code, text) = said(&["reload", "--pid-file", &pid_path], &[]);
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.starts_with("pinboard reload: no node: cannot read the pid file"),
        "{text}"
    );
    let gone = Command::new("true").spawn().unwrap();
    let gone_pid = gone.id();
    let _ = { gone }.wait();
    std::fs::write(&pid_file, format!("{gone_pid}\n")).unwrap();
    let (code, text) = said(&["reload", "--pid-file", &pid_path], &[]);
    assert_eq!(
        (code, text),
        (
            Some(1),
            format!(
                "pinboard reload: no node: pid {gone_pid} (pid file {pid_path}) is not running (a stale pid file?)"
            )
        )
    );
    let (code, text) = said(&["reload"], &config(false));
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.starts_with(&format!(
            "pinboard reload: no node: no node serves {listen} on this host"
        )),
        "{text}"
    );
}

/// The metrics listener is handed over with the cores' listeners: scrapes go on at the same
/// address, answered by the new process.
#[test]
fn the_metrics_listener_is_handed_over_too() {
    let redis = RedisServer::start();
    let mut old = Node::start(&redis.url(), &[("PINBOARD_METRICS_LISTEN", "127.0.0.1:0")]);
    let scrapes = old.metrics_addr();
    assert_eq!(get(scrapes, "/metrics", None).status, 200);
    let metrics_listen = scrapes.to_string();
    let mut new = Node::try_take_over(
        old.addr,
        &redis.url(),
        &[("PINBOARD_METRICS_LISTEN", &metrics_listen)],
    )
    .unwrap_or_else(|(code, log)| panic!("the upgrade failed ({code:?}):\n{log}"));
    new.logs("upgrade: serving on the sockets taken over");
    let status = old.wait(Duration::from_secs(30));
    assert_eq!(status.code(), Some(0), "{}", old.log());
    // Only the new process holds the socket now.
    assert_eq!(get(scrapes, "/metrics", None).status, 200);
    assert!(new.stop().success());
}

/// A second SIGTERM during the delay exits at once (code 1), as a second stop signal does.
#[test]
fn a_second_stop_signal_during_the_delay_exits_at_once() {
    let redis = RedisServer::start();
    let mut node = Node::start(
        &redis.url(),
        &[("PINBOARD_HTTP__SHUTDOWN_DELAY_MS", "600000")],
    );
    node.terminate();
    node.logs("serving on for http.shutdown_delay_ms");
    assert_eq!(get(node.addr, "/readyz", None).status, 503);
    node.terminate();
    let status = node.wait(Duration::from_secs(20));
    assert_eq!(status.code(), Some(1), "{}", node.log());
    node.logs("second stop signal: exiting now");
}

/// A pid file that cannot be written stops startup like a bad setting, naming the key.
#[test]
fn a_pid_file_that_cannot_be_written_exits_2() {
    let redis = RedisServer::start();
    let (code, stderr) = support::node::serve_until_exit(
        &redis.url(),
        &[("PINBOARD_PID_FILE", "/nonexistent/pinboard.pid")],
    );
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("config error: pid_file: cannot write /nonexistent/pinboard.pid"),
        "{stderr}"
    );
}
