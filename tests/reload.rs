//! A running node reloads its configuration (SIGHUP; `docs/configuration.md#reloading`): the
//! Passport keys rotate with requests in flight and no credential of either key refused during
//! the overlap, a file that does not validate changes nothing, a live setting is seen by the
//! next request, and a restart-only one is named and kept. Real node, real Redis, real worker.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use support::fleet::Fixture;
use support::http::get;
use support::node::{SECRET, config_file, eventually, token_signed_with};
use support::worker::{Serve, TestWorker};

const NEW_SECRET: &str = "the-next-secret-of-at-least-32-bytes!";
/// The environment's `hs256_secret` (which wins over the file's): no test token is signed with
/// it, so the keys in force are the file's `hs256_secrets`.
const ENV_SECRET: &str = "a-secret-nobody-signs-with-0123456789";

fn signed(secret: &str, sub: &str, scopes: &[&str]) -> String {
    token_signed_with(secret, sub, scopes, &["*"], &["127.0.0.1"])
}

/// The configuration file: `passport` (the `[passport]` table's lines), a data-plane rule on
/// `/threads`, and `more`.
fn file_text(passport: &str, more: &str) -> String {
    format!("[passport]\n{passport}\n\n[namespaces.\"/threads\"]\nscopes = [\"r\"]\n\n{more}")
}

/// A node reading `text` from a file, warmed, with a worker on `/threads`.
fn node_with_file(text: &str) -> (Fixture, TestWorker, tempfile::TempDir, String) {
    let (dir, path) = config_file(text);
    let f = Fixture::new(&[
        ("PINBOARD_CONFIG", &path),
        ("PINBOARD_PASSPORT__HS256_SECRET", ENV_SECRET),
    ]);
    f.warm();
    let worker = TestWorker::start("w1");
    f.registered(&worker, "w1");
    (f, worker, dir, path)
}

/// Replaces the file whole (as an editor or a config tool does: a reload still reading the
/// last one never sees half of this one).
fn rewrite(path: &str, text: &str) {
    let next = format!("{path}.next");
    std::fs::write(&next, text).unwrap();
    std::fs::rename(&next, path).unwrap();
}

/// Rewrites the file, sends SIGHUP, and waits for the `n`th line saying `what`.
fn reload(f: &Fixture, path: &str, text: &str, what: &str, n: usize) {
    rewrite(path, text);
    f.node.signal("HUP");
    let seen = eventually(Duration::from_secs(10), || {
        f.node.log().matches(what).count() >= n
    });
    assert!(
        seen,
        "no {what:?} (#{n}) after the reload:\n{}",
        f.node.log()
    );
}

/// Clients sending, until stopped, an operator call and a data-plane request with credentials
/// of one key; the statuses that were not 200.
struct Load {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<(usize, Vec<String>)>>,
}

impl Load {
    fn start(f: &Fixture, secret: &str, clients: usize) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..clients)
            .map(|client| {
                let (stop, addr) = (stop.clone(), f.node.addr);
                let operator = signed(secret, "ops", &["pinboard:operator"]);
                let reader = signed(secret, "reader", &["r"]);
                std::thread::spawn(move || {
                    let (mut sent, mut failed) = (0, Vec::new());
                    let mut n = 0;
                    while !stop.load(Ordering::Relaxed) {
                        n += 1;
                        for (path, token) in [
                            ("/registry/workers".to_owned(), &operator),
                            (format!("/threads/c{client}-{}/x", n % 20), &reader),
                        ] {
                            let r = get(addr, &path, Some(token));
                            sent += 1;
                            if r.status != 200 {
                                failed.push(format!("{path}: {} {}", r.status, r.text()));
                            }
                        }
                    }
                    (sent, failed)
                })
            })
            .collect();
        Load { stop, threads }
    }

    /// Stops the clients: how many requests they sent, and the failures.
    fn stop(self) -> (usize, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        let (mut sent, mut failed) = (0, Vec::new());
        for thread in self.threads {
            let (n, f) = thread.join().unwrap();
            sent += n;
            failed.extend(f);
        }
        (sent, failed)
    }
}

#[test]
fn a_key_rotates_with_requests_in_flight_and_no_token_of_either_key_is_refused() {
    let old = format!("hs256_secrets = [{SECRET:?}]");
    let (f, _worker, _dir, path) = node_with_file(&file_text(&old, ""));
    let old_clients = Load::start(&f, SECRET, 3);
    std::thread::sleep(Duration::from_millis(300));

    // 1. The new key beside the old one.
    let both = format!("hs256_secrets = [{SECRET:?}, {NEW_SECRET:?}]");
    reload(
        &f,
        &path,
        &file_text(&both, ""),
        "SIGHUP: reloaded the configuration",
        1,
    );
    let reloaded = f.node.log_lines("SIGHUP: reloaded the configuration");
    assert!(
        reloaded[0].contains("passport.hs256_secrets"),
        "the changed key is named: {reloaded:?}"
    );
    let new_clients = Load::start(&f, NEW_SECRET, 3);
    std::thread::sleep(Duration::from_millis(500));
    // Reloads while both keys are in force change nothing for either.
    for n in 2..=4 {
        reload(
            &f,
            &path,
            &file_text(&both, ""),
            "SIGHUP: reloaded the configuration",
            n,
        );
    }
    let (sent, failed) = old_clients.stop();
    assert!(sent > 20, "the old key's clients ran: {sent}");
    assert!(
        failed.is_empty(),
        "the old key refused in the overlap: {failed:?}"
    );

    // 2. The old key removed: its tokens are refused from the reload on, the new key's never.
    let new_only = format!("hs256_secrets = [{NEW_SECRET:?}]");
    reload(
        &f,
        &path,
        &file_text(&new_only, ""),
        "SIGHUP: reloaded the configuration",
        5,
    );
    let operator = signed(SECRET, "ops", &["pinboard:operator"]);
    assert_eq!(
        get(f.node.addr, "/registry/workers", Some(&operator)).status,
        401
    );
    let reader = signed(SECRET, "reader", &["r"]);
    assert_eq!(get(f.node.addr, "/threads/a/x", Some(&reader)).status, 401);
    std::thread::sleep(Duration::from_millis(300));
    let (sent, failed) = new_clients.stop();
    assert!(sent > 20, "the new key's clients ran: {sent}");
    assert!(failed.is_empty(), "the new key refused: {failed:?}");

    // 3. A key past its `not_after` verifies nothing, though still configured.
    let retired = format!(
        "hs256_secrets = [{NEW_SECRET:?}, {{ key = {SECRET:?}, not_after = 1970-01-02T00:00:00Z }}]"
    );
    reload(
        &f,
        &path,
        &file_text(&retired, ""),
        "SIGHUP: reloaded the configuration",
        6,
    );
    assert_eq!(
        get(f.node.addr, "/registry/workers", Some(&operator)).status,
        401
    );
    let fresh = signed(NEW_SECRET, "ops", &["pinboard:operator"]);
    assert_eq!(
        get(f.node.addr, "/registry/workers", Some(&fresh)).status,
        200
    );
}

#[test]
fn a_file_that_does_not_validate_changes_nothing_and_says_which_key() {
    let old = format!("hs256_secrets = [{SECRET:?}]");
    let (f, _worker, _dir, path) = node_with_file(&file_text(&old, ""));
    let operator = signed(SECRET, "ops", &["pinboard:operator"]);
    let refused = "SIGHUP: the configuration was refused; the running one stays";
    // Each bad file also drops the old secret: had any part of it been applied, the old
    // key's credential would be refused.
    let new_only = format!("hs256_secrets = [{NEW_SECRET:?}]");
    for (n, (bad, key)) in [
        (
            file_text(&new_only, "[forwards]\ntimeout_ms = 0"),
            "forwards.timeout_ms",
        ),
        (
            file_text(
                &format!("{new_only}\ned25519_public_keys = [\"/no/such/key.pem\"]"),
                "",
            ),
            "passport.ed25519_public_keys",
        ),
        (
            file_text(&new_only, "[limits]\nno_such_limit = 1"),
            "limits.no_such_limit",
        ),
        (format!("{}\n[[[", file_text(&new_only, "")), "line"),
        (
            file_text("hs256_secrets = [\"short\"]", ""),
            "passport.hs256_secret",
        ),
    ]
    .into_iter()
    .enumerate()
    {
        reload(&f, &path, &bad, refused, n + 1);
        let lines = f.node.log_lines(refused);
        assert!(lines[n].contains(key), "{key} is named: {}", lines[n]);
        let r = get(f.node.addr, "/registry/workers", Some(&operator));
        assert_eq!(r.status, 200, "the running keys stay after {key}");
    }
    assert!(!f.node.log().contains("SIGHUP: reloaded the configuration"));
    // A file removed: refused too.
    std::fs::remove_file(&path).unwrap();
    f.node.signal("HUP");
    assert!(eventually(Duration::from_secs(10), || {
        f.node.log().matches(refused).count() == 6
    }));
    assert_eq!(
        get(f.node.addr, "/registry/workers", Some(&operator)).status,
        200
    );
}

#[test]
fn a_live_setting_is_seen_by_the_next_request_and_a_restart_only_one_is_named_and_kept() {
    let old = format!("hs256_secrets = [{SECRET:?}]");
    let (f, worker, _dir, path) =
        node_with_file(&file_text(&old, "[forwards]\ntimeout_ms = 60000"));
    let reader = signed(SECRET, "reader", &["r"]);
    assert_eq!(get(f.node.addr, "/threads/a/x", Some(&reader)).status, 200);

    let short = file_text(&old, "[forwards]\ntimeout_ms = 300");
    reload(&f, &path, &short, "SIGHUP: reloaded the configuration", 1);
    worker.set_serve(Serve::Hang);
    let r = get(f.node.addr, "/threads/a/x", Some(&reader));
    assert_eq!(r.status, 504, "the new timeout: {}", r.text());
    assert!(r.text().contains("upstream timeout"), "{}", r.text());
    worker.set_serve(Serve::Echo);

    // Rules reload too: a namespace without a rule is refused to every credential, until
    // the rule is added.
    let both = signed(SECRET, "reader", &["r", "d"]);
    assert_eq!(get(f.node.addr, "/docs/a/x", Some(&both)).status, 403);
    let ruled = format!("{short}\n[namespaces.\"/docs\"]\nscopes = [\"d\"]\n");
    reload(&f, &path, &ruled, "SIGHUP: reloaded the configuration", 2);
    assert_eq!(get(f.node.addr, "/docs/a/x", Some(&both)).status, 200);
    assert_eq!(get(f.node.addr, "/docs/a/x", Some(&reader)).status, 403);

    // A restart-only key: named in a warning, kept at its running value; the rest applies.
    let moved = format!(
        "lease_ttl_ms = 20000\nprefix = \"other:\"\n{}",
        ruled.replace("timeout_ms = 300", "timeout_ms = 60000")
    );
    reload(&f, &path, &moved, "change only at a restart", 1);
    let warned = f.node.log_lines("change only at a restart");
    assert!(
        warned[0].contains("keys=prefix, lease_ttl_ms"),
        "{warned:?}"
    );
    worker.set_serve(Serve::Echo);
    assert_eq!(get(f.node.addr, "/threads/a/x", Some(&reader)).status, 200);
    assert_eq!(
        get(f.node.addr, "/healthz", None).status,
        200,
        "still on its address"
    );
}

#[test]
fn the_access_log_and_the_log_level_follow_a_reload() {
    let old = format!("hs256_secrets = [{SECRET:?}]");
    let (dir, path) = config_file(&file_text(&old, ""));
    // `PINBOARD_LOG` empty: the file's `log_level` decides.
    let f = Fixture::new(&[
        ("PINBOARD_CONFIG", &path),
        ("PINBOARD_PASSPORT__HS256_SECRET", ENV_SECRET),
        ("PINBOARD_LOG", ""),
    ]);
    f.warm();
    let worker = TestWorker::start("w1");
    f.registered(&worker, "w1");
    let reader = signed(SECRET, "reader", &["r"]);

    // The access log turned on: the next requests are lines in the new file.
    let access = dir.path().join("access.log");
    let logged = format!("access_log = \"json\"\naccess_log_path = {:?}\n", access);
    let text = format!("{logged}{}", file_text(&old, ""));
    reload(&f, &path, &text, "SIGHUP: reloaded the configuration", 1);
    for n in 0..3 {
        assert_eq!(
            get(f.node.addr, &format!("/threads/a{n}/x"), Some(&reader)).status,
            200
        );
    }
    let lines = || std::fs::read_to_string(&access).unwrap_or_default();
    assert!(
        eventually(Duration::from_secs(5), || lines()
            .matches("/threads/a")
            .count()
            == 3),
        "{}",
        lines()
    );

    // log_level = "warn": a reload's INFO line is no longer written (its own included: the
    // level is applied first), its WARN line is.
    let quiet = format!("log_level = \"warn\"\n{text}");
    rewrite(&path, &quiet);
    f.node.signal("HUP");
    let moved = format!("prefix = \"other:\"\n{quiet}");
    reload(&f, &path, &moved, "change only at a restart", 1);
    assert_eq!(
        f.node
            .log()
            .matches("SIGHUP: reloaded the configuration")
            .count(),
        1,
        "{}",
        f.node.log()
    );
}
