//! The node as operators and clients meet it: the real binary, a real redis-server, real
//! sockets. Health and readiness, registry authentication, HTTP/1.1 limits and keep-alive,
//! configuration errors, and the graceful stop.

mod support;

use std::process::Command;
use std::time::Duration;

use support::http::{Client, get};
use support::node::{Node, eventually, token};
use support::redis::RedisServer;

#[test]
fn healthz_and_readyz_follow_redis() {
    let mut redis = RedisServer::start();
    let node = Node::start(&redis.url(), &[]);

    let health = get(node.addr, "/healthz", None);
    assert_eq!(health.status, 200);
    assert_eq!(health.body, b"{\"ok\":true}");
    assert_eq!(health.header("content-type"), Some("application/json"));

    let ready = get(node.addr, "/readyz", None);
    assert_eq!((ready.status, ready.body.len()), (200, 0));

    redis.stop();
    assert!(
        eventually(Duration::from_secs(10), || get(node.addr, "/readyz", None)
            .status
            == 503),
        "readyz stayed ready without redis"
    );
    // Liveness does not depend on Redis.
    assert_eq!(get(node.addr, "/healthz", None).status, 200);

    redis.restart();
    // Every core must come back by itself: ask enough times to reach both cores' connections.
    assert!(
        eventually(Duration::from_secs(15), || {
            (0..8).all(|_| get(node.addr, "/readyz", None).status == 200)
        }),
        "node did not recover after redis came back:\n{}",
        node.log()
    );
}

#[test]
fn registry_authentication() {
    let redis = RedisServer::start();
    let node = Node::start(&redis.url(), &[]);
    let path = "/registry/no-such-route";

    let none = get(node.addr, path, None);
    assert_eq!(
        (none.status, none.json()),
        (401, serde_json::json!({"error": "unauthorized"}))
    );

    let garbage = get(node.addr, path, Some("not.a.jwt"));
    assert_eq!(
        (garbage.status, garbage.text().as_str()),
        (401, r#"{"error":"unauthorized"}"#)
    );

    let operator_only = token("acct", &["pinboard:operator"], &["*"]);
    let r = get(node.addr, path, Some(&operator_only));
    assert_eq!(
        (r.status, r.text().as_str()),
        (403, r#"{"error":"forbidden"}"#)
    );

    let malformed_claim = token("acct", &["pinboard:worker"], &["threads"]);
    let r = get(node.addr, path, Some(&malformed_claim));
    assert_eq!(
        (r.status, r.text().as_str()),
        (403, r#"{"error":"forbidden"}"#)
    );

    let worker = node.worker_token("acct");
    let r = get(node.addr, path, Some(&worker));
    assert_eq!(
        (r.status, r.text().as_str()),
        (404, r#"{"error":"not found"}"#)
    );
}

#[test]
fn route_misses_and_base_path() {
    let redis = RedisServer::start();
    let node = Node::start(&redis.url(), &[("PINBOARD_BASE_PATH", "/edge")]);
    let worker = node.worker_token("acct");

    let r = get(node.addr, "/edge/threads/abc/x", None);
    assert_eq!(
        (r.status, r.text().as_str()),
        (404, r#"{"error":"unknown namespace"}"#)
    );
    let r = get(node.addr, "/elsewhere", None);
    assert_eq!(
        (r.status, r.text().as_str()),
        (404, r#"{"error":"not found"}"#)
    );
    let r = get(node.addr, "/edgy/registry/x", Some(&worker));
    assert_eq!(
        (r.status, r.text().as_str()),
        (404, r#"{"error":"not found"}"#)
    );
    // The registry lives under the base path; probes stay at the root.
    assert_eq!(get(node.addr, "/edge/registry/x", None).status, 401);
    assert_eq!(get(node.addr, "/registry/x", None).status, 404);
    assert_eq!(get(node.addr, "/healthz", None).status, 200);
    let mut c = Client::connect(node.addr);
    let upgrade = c.request(b"GET /edge/threads/abc HTTP/1.1\r\nHost: t\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\n");
    assert_eq!(
        (upgrade.status, upgrade.text().as_str()),
        (404, r#"{"error":"not found"}"#)
    );
}

#[test]
fn keep_alive_and_connection_close() {
    let redis = RedisServer::start();
    let node = Node::start(&redis.url(), &[]);

    let mut c = Client::connect(node.addr);
    for _ in 0..3 {
        assert_eq!(
            c.request(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
                .status,
            200
        );
    }
    // Pipelined: both answers come back, in order.
    c.send(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\nGET /nope/x HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_eq!(c.read(false).status, 200);
    assert_eq!(c.read(false).status, 404);
    let head = c.request(b"HEAD /healthz HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_eq!(
        (head.status, head.header("content-length")),
        (200, Some("11"))
    );
    assert_eq!(
        c.request(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n").body,
        b"{\"ok\":true}"
    );

    let closing = c.request(b"GET /healthz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
    assert_eq!(closing.header("connection"), Some("close"));
    assert!(c.is_closed());

    let mut old = Client::connect(node.addr);
    let r = old.request(b"GET /healthz HTTP/1.0\r\n\r\n");
    assert_eq!((r.status, r.header("connection")), (200, Some("close")));
    assert!(old.is_closed());

    let mut old_keep = Client::connect(node.addr);
    let r = old_keep.request(b"GET /healthz HTTP/1.0\r\nConnection: keep-alive\r\n\r\n");
    assert_eq!(r.header("connection"), Some("keep-alive"));
    assert_eq!(
        old_keep
            .request(b"GET /healthz HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
            .status,
        200
    );
}

#[test]
fn slow_endless_and_malformed_clients_are_cut_off() {
    let redis = RedisServer::start();
    let node = Node::start(
        &redis.url(),
        &[
            ("PINBOARD_HTTP__HEADER_TIMEOUT_MS", "400"),
            ("PINBOARD_HTTP__IDLE_TIMEOUT_MS", "600"),
            ("PINBOARD_HTTP__MAX_HEADER_BYTES", "2048"),
        ],
    );

    // A head that never ends: 431 once it passes the cap.
    let mut endless = Client::connect(node.addr);
    endless.send(b"GET /healthz HTTP/1.1\r\n");
    endless.send(format!("X-Filler: {}\r\n", "a".repeat(4096)).as_bytes());
    let r = endless.read(false);
    assert_eq!(
        (r.status, r.text().as_str()),
        (431, r#"{"error":"request header too large"}"#)
    );
    assert!(endless.is_closed());

    // A head that trickles in too slowly: 408.
    let mut slow = Client::connect(node.addr);
    slow.send(b"GET /healthz HTTP/1.1\r\nHost: t\r\n");
    let r = slow.read(false);
    assert_eq!(
        (r.status, r.text().as_str()),
        (408, r#"{"error":"request timeout"}"#)
    );

    // An idle keep-alive connection is closed after the idle timeout.
    let mut idle = Client::connect(node.addr);
    assert_eq!(
        idle.request(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
            .status,
        200
    );
    std::thread::sleep(Duration::from_millis(900));
    assert!(idle.is_closed());

    // Garbage and smuggling-shaped heads: 400, connection closed.
    for bad in [
        &b"NOT HTTP AT ALL\r\n\r\n"[..],
        b"POST /healthz HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"POST /healthz HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
    ] {
        let mut c = Client::connect(node.addr);
        let r = c.request(bad);
        assert_eq!((r.status, r.text().as_str()), (400, r#"{"error":"bad request"}"#), "{:?}", String::from_utf8_lossy(bad));
        assert!(c.is_closed());
    }
    let mut c = Client::connect(node.addr);
    let r = c.request(b"POST /healthz HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: gzip\r\n\r\n");
    assert_eq!(r.status, 501);

    // The node is still fine for everyone else.
    assert_eq!(get(node.addr, "/healthz", None).status, 200);
}

#[test]
fn sigterm_finishes_in_flight_requests_then_exits_zero() {
    let redis = RedisServer::start();
    // Both drivers: under io_uring the listener's descriptor outlives its drop.
    for driver in ["epoll", "io_uring"] {
        stop_gracefully(&redis, driver);
    }
}

fn stop_gracefully(redis: &RedisServer, driver: &str) {
    let mut node = Node::start(&redis.url(), &[("PINBOARD_DRIVER", driver)]);
    let mut idle = Client::connect(node.addr);
    assert_eq!(
        idle.request(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
            .status,
        200
    );

    // A request whose head is half sent when the stop signal arrives.
    let mut in_flight = Client::connect(node.addr);
    in_flight.send(b"GET /healthz HTTP/1.1\r\nHost: t\r\n");
    std::thread::sleep(Duration::from_millis(100));
    node.terminate();
    std::thread::sleep(Duration::from_millis(300));
    // New connections are refused once stopping: asked while the node is still alive and
    // draining, because once it has exited a parallel test may bind the freed port.
    assert!(
        std::net::TcpStream::connect(node.addr).is_err(),
        "{driver}: the listener closes when the stop begins"
    );
    in_flight.send(b"\r\n");
    let r = in_flight.read(false);
    assert_eq!((r.status, r.header("connection")), (200, Some("close")));

    assert!(
        idle.is_closed(),
        "idle keep-alive connections close on stop"
    );
    let status = node.wait(Duration::from_secs(10));
    assert_eq!(status.code(), Some(0), "{}", node.log());
}

#[test]
fn both_event_loop_drivers_serve() {
    let redis = RedisServer::start();
    for driver in ["epoll", "io_uring", "auto"] {
        let node = Node::start(&redis.url(), &[("PINBOARD_DRIVER", driver)]);
        assert_eq!(get(node.addr, "/healthz", None).status, 200, "{driver}");
        assert_eq!(get(node.addr, "/readyz", None).status, 200, "{driver}");
        let log = node.log();
        let started: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("event loop started"))
            .collect();
        assert_eq!(started.len(), 2, "one line per core:\n{log}");
        if driver == "epoll" {
            assert!(
                started
                    .iter()
                    .all(|l| l.contains("driver=\"epoll\"") || l.contains("driver=epoll")),
                "{log}"
            );
        }
    }
}

/// Kubernetes injects `PINBOARD_PORT=tcp://…` and friends into every pod of a Service named
/// `pinboard`; a wrapper may export `PINBOARD_BIN`. They are named in one warning and ignored.
#[test]
fn foreign_pinboard_variables_never_stop_the_node() {
    let redis = RedisServer::start();
    let foreign = [
        ("PINBOARD_PORT", "tcp://10.0.0.1:8080"),
        ("PINBOARD_SERVICE_HOST", "10.0.0.1"),
        ("PINBOARD_PORT_8080_TCP_ADDR", "10.0.0.1"),
        ("PINBOARD_BIN", "/usr/local/bin/pinboard"),
        ("PINBOARD_LEASE_TTL", "15000"),
    ];
    let node = Node::start(&redis.url(), &foreign);
    assert_eq!(get(node.addr, "/healthz", None).status, 200);
    let log = node.log();
    let warnings: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("ignoring environment"))
        .collect();
    assert_eq!(warnings.len(), 1, "{log}");
    for (name, _) in foreign {
        assert!(warnings[0].contains(name), "{} names {name}", warnings[0]);
    }
    assert!(warnings[0].contains("PINBOARD_LEASE_TTL (did you mean PINBOARD_LEASE_TTL_MS?)"));

    // check-config says the same and succeeds; a known setting with a bad value still stops.
    let check = Command::new(env!("CARGO_BIN_EXE_pinboard"))
        .arg("check-config")
        .env("PINBOARD_PASSPORT__HS256_SECRET", support::node::SECRET)
        .envs(foreign)
        .output()
        .unwrap();
    assert_eq!(check.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&check.stderr).contains("PINBOARD_SERVICE_HOST"));
    let bad = Command::new(env!("CARGO_BIN_EXE_pinboard"))
        .arg("check-config")
        .env("PINBOARD_PASSPORT__HS256_SECRET", support::node::SECRET)
        .envs(foreign)
        .env("PINBOARD_LEASE_TTL_MS", "soon")
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("lease_ttl_ms"));
}

#[test]
fn bad_configuration_exits_2_naming_the_key() {
    let bin = env!("CARGO_BIN_EXE_pinboard");
    let run = |args: &[&str], env: &[(&str, &str)]| {
        let mut cmd = Command::new(bin);
        cmd.args(args);
        for (key, _) in std::env::vars().filter(|(k, _)| k.starts_with("PINBOARD_")) {
            cmd.env_remove(key);
        }
        cmd.envs(env.iter().copied());
        cmd.output().unwrap()
    };
    let secret = (
        "PINBOARD_PASSPORT__HS256_SECRET",
        "s3cret-value-0123456789abcdef0123",
    );
    for (env, key) in [
        (vec![secret, ("PINBOARD_SHARDS", "0")], "shards"),
        (
            vec![secret, ("PINBOARD_FORWARDS__TIMEOUT_MS", "soon")],
            "forwards.timeout_ms",
        ),
        (vec![secret, ("PINBOARD_DRIVER", "kqueue")], "driver"),
        (
            vec![("PINBOARD_PASSPORT__HS256_SECRET", "only-20-bytes-secret")],
            "passport.hs256_secret",
        ),
        (vec![secret, ("PINBOARD_LOG_FORMAT", "xml")], "log_format"),
        (
            vec![secret, ("PINBOARD_REDIS_URL", "http://x")],
            "redis_url",
        ),
        (vec![], "passport"),
    ] {
        for sub in ["serve", "check-config"] {
            let out = run(&[sub], &env);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{sub} {env:?}: {stderr}");
            assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
            assert!(stderr.contains(key), "{stderr} should name {key}");
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pinboard.toml");
    std::fs::write(
        &file,
        "shards = 4\n[forwards]\ntimeout_ms = 100\nbogus = 1\n",
    )
    .unwrap();
    let out = run(
        &["check-config", "--config", file.to_str().unwrap()],
        &[secret],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("forwards.bogus"));

    std::fs::write(&file, "shards = 4\n[forwards]\ntimeout_ms = 100\n").unwrap();
    let out = run(
        &["check-config", "--config", file.to_str().unwrap()],
        &[secret, ("PINBOARD_SHARDS", "8")],
    );
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        printed.contains("shards = 8"),
        "env wins over the file:\n{printed}"
    );
    assert!(printed.contains("timeout_ms = 100"), "{printed}");
    assert!(
        !printed.contains("s3cret-value"),
        "secret must be masked:\n{printed}"
    );
}

/// A credential minted with the secret from each of its sources (the flag, a file ending in a
/// newline, the environment) is accepted by a node configured with that secret; only the
/// newline is trimmed from a file.
#[test]
fn minted_tokens_are_accepted_by_the_node() {
    let redis = RedisServer::start();
    let node = Node::start(&redis.url(), &[]);
    let secret = support::node::SECRET;
    let dir = tempfile::tempdir().unwrap();
    let file = |name: &str, text: String| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_owned()
    };
    let lf = file("lf", format!("{secret}\n"));
    let crlf = file("crlf", format!("{secret}\r\n"));
    let spaced = file("spaced", format!("{secret} \n"));
    let mint_and_use = |source: &[&str], env: &[(&str, &str)]| {
        let mut args = vec!["token", "--sub", "acct", "--scope", "pinboard:worker"];
        args.extend_from_slice(&["--ns", "*", "--backend-host", "127.0.0.1", "--ttl", "60"]);
        args.extend_from_slice(source);
        let out = pinboard(&args, env);
        assert!(out.status.success(), "{source:?} {env:?}: {out:?}");
        let token = String::from_utf8(out.stdout).unwrap();
        get(node.addr, "/registry/x", Some(token.trim())).status
    };
    // 404: a valid worker token reaches the route (401 would be a refused credential).
    assert_eq!(mint_and_use(&["--secret", secret], &[]), 404);
    assert_eq!(mint_and_use(&["--secret-file", &lf], &[]), 404);
    assert_eq!(mint_and_use(&["--secret-file", &crlf], &[]), 404);
    assert_eq!(mint_and_use(&[], &[("PINBOARD_TOKEN_SECRET", secret)]), 404);
    // A trailing space is part of the secret: signed with another key, refused.
    assert_eq!(mint_and_use(&["--secret-file", &spaced], &[]), 401);
}

/// `pinboard token` takes its secret from exactly one place: none, two, or a file that gives
/// no secret are refused (exit 2, one line, nothing on stdout); the help warns about `ps`.
#[test]
fn token_takes_its_secret_from_exactly_one_place() {
    let secret = support::node::SECRET;
    let dir = tempfile::tempdir().unwrap();
    let file = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_owned()
    };
    let good = file("secret", secret);
    let empty = file("empty", "");
    let newline = file("newline", "\n");
    let missing = dir.path().join("missing").to_str().unwrap().to_owned();
    let a_directory = dir.path().to_str().unwrap().to_owned();
    let in_env = [("PINBOARD_TOKEN_SECRET", secret)];
    let refused = |source: &[&str], env: &[(&str, &str)]| {
        let mut args = vec!["token", "--sub", "ops", "--scope", "pinboard:operator"];
        args.extend_from_slice(&["--ns", "*"]);
        args.extend_from_slice(source);
        let out = pinboard(&args, env);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(2), "{source:?} {env:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{source:?}: printed a token");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        stderr
    };
    let no_secret =
        "pinboard token: no secret: give --secret-file FILE, PINBOARD_TOKEN_SECRET or --secret";
    assert_eq!(refused(&[], &[]).trim_end(), no_secret);
    // Empty is unset, as for the node's settings.
    assert_eq!(
        refused(&[], &[("PINBOARD_TOKEN_SECRET", "")]).trim_end(),
        no_secret
    );
    let stderr = refused(&["--secret-file", &missing], &[]);
    assert!(
        stderr.starts_with(&format!("pinboard token: --secret-file {missing}: ")),
        "{stderr}"
    );
    let stderr = refused(&["--secret-file", &a_directory], &[]);
    assert!(
        stderr.starts_with(&format!("pinboard token: --secret-file {a_directory}: ")),
        "{stderr}"
    );
    for nothing in [&empty, &newline] {
        assert_eq!(
            refused(&["--secret-file", nothing], &[]).trim_end(),
            format!("pinboard token: --secret-file {nothing}: the file is empty")
        );
    }
    let twice =
        |sources: &str| format!("pinboard token: the secret was given {sources}: give exactly one");
    assert_eq!(
        refused(&["--secret", secret, "--secret-file", &good], &[]).trim_end(),
        twice("2 ways (--secret, --secret-file)")
    );
    assert_eq!(
        refused(&["--secret-file", &good], &in_env).trim_end(),
        twice("2 ways (--secret-file, PINBOARD_TOKEN_SECRET)")
    );
    assert_eq!(
        refused(&["--secret", secret], &in_env).trim_end(),
        twice("2 ways (--secret, PINBOARD_TOKEN_SECRET)")
    );
    assert_eq!(
        refused(&["--secret", secret, "--secret-file", &good], &in_env).trim_end(),
        twice("3 ways (--secret, --secret-file, PINBOARD_TOKEN_SECRET)")
    );
    // The secret never reaches an error line.
    let stderr = refused(&["--secret", secret, "--secret-file", &good], &in_env);
    assert!(!stderr.contains(secret), "{stderr}");

    let help = String::from_utf8_lossy(&pinboard(&["token", "--help"], &[]).stdout).into_owned();
    let secret_line = help
        .lines()
        .find(|l| l.trim_start().starts_with("--secret <"))
        .unwrap_or_else(|| panic!("{help}"));
    assert!(
        secret_line.contains("`ps`") && secret_line.contains("PINBOARD_TOKEN_SECRET"),
        "{secret_line}"
    );
    assert!(help.contains("--secret-file <FILE>"), "{help}");
}

/// nginx and HAProxy operators send HUP to reload: it must not kill the node. Without TLS
/// it reloads the configuration (tests/reload.rs; tests/tls.rs for the certificate pair).
#[test]
fn sighup_without_tls_reloads_and_keeps_serving() {
    let redis = RedisServer::start();
    let mut node = Node::start(&redis.url(), &[]);
    node.signal("HUP");
    assert!(eventually(Duration::from_secs(5), || node
        .log()
        .contains("SIGHUP: reloaded the configuration")));
    assert_eq!(get(node.addr, "/healthz", None).status, 200);
    assert!(node.stop().success(), "a SIGTERM still stops it cleanly");
}

/// RFC 9110 §6.6.1: an origin with a clock sends `Date`; the node's own answers are its own.
#[test]
fn the_nodes_own_answers_carry_date() {
    let redis = RedisServer::start();
    let node = Node::start(&redis.url(), &[]);
    for path in ["/healthz", "/readyz", "/registry/workers", "/nowhere"] {
        let r = get(node.addr, path, None);
        let date = r
            .header("date")
            .unwrap_or_else(|| panic!("{path}: no Date"));
        assert!(
            date.ends_with(" GMT") && date.len() == 29,
            "{path}: IMF-fixdate, got {date:?}"
        );
    }
    let mut c = Client::connect(node.addr);
    let refused = c.request(b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n");
    assert_eq!(refused.status, 400);
    assert!(refused.header("date").is_some());
}

/// A node started on `addr`, which another process listens on: exit 2, one line naming
/// `listen`.
fn refused_as_served(addr: &str, redis_url: &str) {
    let (code, stderr) = support::node::serve_until_exit(redis_url, &[("PINBOARD_LISTEN", addr)]);
    assert_eq!(code, Some(2), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
    assert!(
        stderr.starts_with(&format!(
            "config error: listen: {addr} is already served by another process"
        )),
        "{stderr}"
    );
}

/// A port that is taken stops startup like a bad setting (exit 2, one line naming `listen`),
/// not as an internal error.
#[test]
fn a_bind_failure_says_what_it_is() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    refused_as_served(&addr, "redis://127.0.0.1:1");
    // TEST-NET-1 (RFC 5737): never an address of this host.
    let (code, stderr) = support::node::serve_until_exit(
        "redis://127.0.0.1:1",
        &[("PINBOARD_LISTEN", "192.0.2.1:8080")],
    );
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.starts_with("config error: listen: cannot listen on 192.0.2.1:8080: "),
        "{stderr}"
    );
}

fn pinboard(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_pinboard"));
    cmd.args(args);
    for (key, _) in std::env::vars().filter(|(k, _)| k.starts_with("PINBOARD_")) {
        cmd.env_remove(key);
    }
    cmd.envs(env.iter().copied()).output().unwrap()
}

#[test]
fn cli_version_short_config_help_and_token_rules() {
    let out = pinboard(&["--version"], &[]);
    let version = String::from_utf8_lossy(&out.stdout);
    assert!(
        version.starts_with("pinboard ")
            && version.contains("commit ")
            && version.contains(" build)"),
        "{version}"
    );
    // Every flag of every subcommand says what it is for.
    let ctl = |sub| ["ctl", sub, "--help"];
    let subcommands: [&[&str]; 13] = [
        &["serve", "--help"],
        &["reload", "--help"],
        &["check-config", "--help"],
        &["token", "--help"],
        &["completions", "--help"],
        &["man", "--help"],
        &["ctl", "--help"],
        &ctl("workers"),
        &ctl("instances"),
        &ctl("drain"),
        &ctl("undrain"),
        &ctl("wind-down"),
        &ctl("health"),
    ];
    for sub in subcommands {
        let help = String::from_utf8_lossy(&pinboard(sub, &[]).stdout).into_owned();
        assert!(help.contains("Usage:"), "{sub:?}: {help}");
        for line in help.lines().filter(|l| l.trim_start().starts_with('-')) {
            let described = line
                .trim()
                .split("  ")
                .filter(|p| !p.trim().is_empty())
                .count()
                >= 2;
            assert!(described, "{sub:?}: {line:?} has no help text");
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("p.toml");
    std::fs::write(&file, "shards = 4\n").unwrap();
    let secret = ("PINBOARD_PASSPORT__HS256_SECRET", support::node::SECRET);
    let out = pinboard(&["check-config", "-c", file.to_str().unwrap()], &[secret]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("shards = 4"),
        "{text}"
    );
    assert!(
        text.contains("# threads = 0: one event loop per available core ("),
        "{text}"
    );

    let mint = |extra: &[&str]| {
        let mut args = vec!["token", "--secret", support::node::SECRET, "--sub", "a"];
        args.extend_from_slice(extra);
        pinboard(&args, &[])
    };
    let out = mint(&["--scope", "pinboard:wroker", "--ns", "*"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown scope pinboard:wroker"));
    let out = mint(&["--scope", "pinboard:operator", "--ns", "threads"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("must start with /"));
    let out = mint(&["--scope", "pinboard:worker", "--ns", "/threads"]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("without --backend-host"));
    let out = mint(&[
        "--scope",
        "pinboard:worker threads:read",
        "--ns",
        "/threads",
        "--backend-host",
        "127.0.0.1",
    ]);
    assert!(out.status.success() && out.stderr.is_empty(), "{out:?}");
}

/// Quiet on a healthy start (no warning at all), one warning (then a count) while Redis is
/// away, no colour codes in a log file, the node named on every line (startup, core threads,
/// the signal thread), and JSON lines on request.
#[test]
fn logs_are_quiet_plain_and_optionally_json() {
    let mut redis = RedisServer::start();
    // A claim every second (a third of the lease), retried every 100 ms once it fails.
    let node = Node::start(
        &redis.url(),
        &[
            ("NO_COLOR", ""),
            ("PINBOARD_LOG", "info"),
            ("PINBOARD_LEASE_TTL_MS", "3000"),
            ("PINBOARD_NODE_ID", "edge-test-1"),
        ],
    );
    // Past the first mirror poll and sweeper claim.
    node.logs("sweeping: holding the sweeper lease");
    std::thread::sleep(Duration::from_millis(1500));
    node.signal("HUP");
    node.logs("SIGHUP: reloaded the configuration");
    let log = node.log();
    assert!(!log.contains('\u{1b}'), "no ANSI codes in a file:\n{log}");
    assert!(!log.contains("WARN"), "no warning on a clean start:\n{log}");
    for what in [
        "pinboard listening",
        "event loop started",
        "serving",
        "SIGHUP",
    ] {
        assert!(log.contains(what), "{what}:\n{log}");
    }
    assert!(
        log.lines().all(|l| l.ends_with(" node_id=edge-test-1")),
        "{log}"
    );

    redis.stop();
    std::thread::sleep(Duration::from_millis(2500));
    let failures = node
        .log()
        .lines()
        .filter(|l| l.contains("fleet license claim failed"))
        .count();
    assert_eq!(
        failures,
        1,
        "said once while retrying ten times a second:\n{}",
        node.log()
    );
    redis.restart();
    assert!(eventually(Duration::from_secs(10), || node
        .log()
        .contains("fleet license claim succeeded again")));

    let mut json = Command::new(env!("CARGO_BIN_EXE_pinboard"))
        .arg("serve")
        .env("PINBOARD_PASSPORT__HS256_SECRET", support::node::SECRET)
        .env("PINBOARD_LISTEN", "127.0.0.1:0")
        .env("PINBOARD_REDIS_URL", redis.url())
        .env("PINBOARD_LOG_FORMAT", "json")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(800));
    json.kill().unwrap();
    let out = json.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(text.lines().count() >= 2, "{text}");
    let mut names = std::collections::BTreeSet::new();
    for line in text.lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert!(
            v["timestamp"].is_string() && v["level"].is_string(),
            "{line}"
        );
        names.insert(
            v["node_id"]
                .as_str()
                .expect("node_id on every line")
                .to_owned(),
        );
    }
    assert_eq!(names.len(), 1, "one node, one name: {text}");
    assert!(
        text.contains("\"message\":\"pinboard listening\""),
        "{text}"
    );
}

/// Issue 24: `SO_REUSEPORT` let a second node bind a live node's listen address, and the kernel
/// split the connections between two configurations (with two Redis, two owners of one
/// instance). The second exits 2 with one line naming `listen`; the first serves on, and a
/// node started once it is gone binds the address again.
#[test]
fn a_second_node_on_a_live_listen_address_exits_2() {
    let redis = RedisServer::start();
    let first = Node::start(&redis.url(), &[]);
    let addr = first.addr.to_string();
    refused_as_served(&addr, &redis.url());
    assert_eq!(get(first.addr, "/healthz", None).status, 200);
    drop(first);
    let again = Node::start(&redis.url(), &[("PINBOARD_LISTEN", &addr)]);
    assert_eq!(get(again.addr, "/healthz", None).status, 200);
}
