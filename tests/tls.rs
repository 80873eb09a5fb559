//! The HTTPS listener end to end: a real node with a certificate pair made by the test (a
//! private CA), real clients (curl, rustls), a real worker behind it and a real redis-server.

mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use rustls::ClientConfig;
use serde_json::json;
use support::certs::{Ca, LOCAL};
use support::fleet::register_body;
use support::http::{Client, Reply};
use support::node::eventually;
use support::tls::{client_config, connect, get, https_node, presented, session};
use support::worker::{Serve, TestWorker};

fn post(
    addr: SocketAddr,
    config: &Arc<ClientConfig>,
    path: &str,
    token: &str,
    body: &str,
) -> Reply {
    connect(addr, config).request(
        format!(
            "POST {path} HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {token}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    )
}

fn curl(args: &[&str]) -> (bool, String) {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "5"])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run curl");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

#[test]
fn curl_with_the_ca_answers_healthz_and_nothing_is_served_in_the_clear() {
    let (pki, _, f) = https_node(&[]);
    let url = format!("https://localhost:{}/healthz", f.node.addr.port());
    let ca = pki.cert.display().to_string();

    let (ok, text) = curl(&["--cacert", &ca, &url]);
    assert!(ok && text.contains(r#"{"ok":true}"#), "{text}");
    for version in ["--tlsv1.2 --tls-max 1.2", "--tlsv1.3"] {
        let mut args: Vec<&str> = version.split(' ').collect();
        args.extend(["--cacert", &ca, "-w", " %{http_version}", &url]);
        let (ok, text) = curl(&args);
        // ALPN offers `h2` first (`http.h2`), which curl takes.
        assert!(ok && text.ends_with(" 2"), "{version}: {text}");
    }
    // Not trusted without the CA: curl refuses the certificate.
    let (ok, text) = curl(&[&url]);
    assert!(!ok, "{text}");

    // A plain HTTP request on the TLS port is no handshake: no HTTP answer comes back.
    let mut plain = TcpStream::connect(f.node.addr).unwrap();
    plain
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    plain
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    let mut answer = Vec::new();
    let _ = plain.read_to_end(&mut answer);
    assert!(!answer.starts_with(b"HTTP/"), "{answer:?}");

    // ALPN settles on http/1.1.
    let (_, stream) = session(f.node.addr, &client_config(&pki)).unwrap();
    assert_eq!(stream.conn.alpn_protocol(), Some(&b"http/1.1"[..]));
}

#[test]
fn a_returning_client_resumes_its_session() {
    let (pki, _, f) = https_node(&[]);
    // One configuration, so one session cache, as one client process has.
    let config = client_config(&pki);
    let resumed = (0..4).any(|_| {
        let mut c = connect(f.node.addr, &config);
        assert_eq!(
            c.request(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
                .status,
            200
        );
        drop(c);
        let (_, stream) = session(f.node.addr, &config).unwrap();
        stream.conn.handshake_kind() == Some(rustls::HandshakeKind::Resumed)
    });
    assert!(resumed, "no handshake was resumed");
}

#[test]
fn a_forwarded_request_and_an_upgrade_work_over_tls() {
    let (pki, _, f) = https_node(&[]);
    let config = client_config(&pki);
    let worker = TestWorker::start("worker-secret");
    let body = register_body(&worker, "w1", json!({})).to_string();
    let r = post(f.node.addr, &config, "/registry/register", &f.token, &body);
    assert_eq!(r.status, 200, "{}\n{}", r.text(), f.node.log());

    let mut c = connect(f.node.addr, &config);
    let r = c.request(b"GET /threads/abc/notes?x=1 HTTP/1.1\r\nHost: edge\r\n\r\n");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        worker.requests().last().unwrap().path,
        "/threads/abc/notes?x=1"
    );

    // The same connection switches protocols, and bytes flow both ways through TLS.
    worker.set_serve(Serve::Upgrade);
    c.send(
        b"GET /threads/abc/ws HTTP/1.1\r\nHost: edge\r\nConnection: Upgrade\r\n\
          Upgrade: websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
          Sec-WebSocket-Version: 13\r\n\r\n",
    );
    let r = c.read(false);
    assert_eq!(r.status, 101, "{r:?}");
    assert_eq!(c.read_raw(6), b"hello\n");
    let big: Vec<u8> = (0..64 * 1024).map(|i| b'a' + (i % 26) as u8).collect();
    for round in [&b"ping"[..], &big] {
        c.send(round);
        assert_eq!(c.read_raw(round.len()), round.to_ascii_uppercase());
    }
}

#[test]
fn sighup_serves_a_new_pair_while_open_connections_keep_theirs() {
    let (pki, first, f) = https_node(&[]);
    let config = client_config(&pki);
    let (_, held) = session(f.node.addr, &config).unwrap();
    assert!(presented(&held, &first));
    let mut open = Client::over(held.sock.try_clone().unwrap(), Box::new(held));

    let second = pki.leaf("node", &LOCAL);
    f.node.signal("HUP");
    // A fresh configuration each time: a session resumed from a cached ticket shows the
    // certificate it was first made with.
    let swapped = eventually(Duration::from_secs(5), || {
        let (_, fresh) = session(f.node.addr, &client_config(&pki)).unwrap();
        presented(&fresh, &second)
    });
    assert!(swapped, "{}", f.node.log());
    assert!(
        f.node
            .log()
            .contains("SIGHUP: reloaded tls.cert_file and tls.key_file")
    );
    let r = open.request(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_eq!(
        r.status, 200,
        "the connection open across the reload still works"
    );

    // A pair that does not load keeps the one in use, and says why.
    std::fs::write(&second.key, "not a key").unwrap();
    f.node.signal("HUP");
    let refused = eventually(Duration::from_secs(5), || {
        f.node.log().contains("the certificate pair did not load")
    });
    assert!(refused, "{}", f.node.log());
    let (_, fresh) = session(f.node.addr, &client_config(&pki)).unwrap();
    assert!(presented(&fresh, &second));
    assert_eq!(get(f.node.addr, &config, "/healthz", None).status, 200);
}

#[test]
fn a_handshake_that_never_completes_is_closed_like_a_slow_head() {
    let (pki, _, f) = https_node(&[("PINBOARD_HTTP__HEADER_TIMEOUT_MS", "500")]);
    // A record header promising a ClientHello that never comes.
    let mut slow = TcpStream::connect(f.node.addr).unwrap();
    slow.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    slow.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01])
        .unwrap();
    let mut rest = Vec::new();
    let started = std::time::Instant::now();
    let _ = slow.read_to_end(&mut rest);
    assert!(started.elapsed() < Duration::from_secs(4), "not closed");
    // Garbage instead of a ClientHello is closed at once, and the node serves on.
    let mut garbage = TcpStream::connect(f.node.addr).unwrap();
    garbage
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    garbage.write_all(&[0xff; 4096]).unwrap();
    let _ = garbage.read_to_end(&mut Vec::new());
    assert_eq!(
        get(f.node.addr, &client_config(&pki), "/healthz", None).status,
        200
    );
}

/// `pinboard check-config` with the test's Passport secret and `env`, nothing else: it loads
/// the configuration, TLS files included, as `serve` does at start.
fn check_config(env: &[(&str, &str)]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_pinboard"))
        .arg("check-config")
        .env_clear()
        .env(
            "PINBOARD_PASSPORT__HS256_SECRET",
            "s3cret-0123456789abcdef0123456789",
        )
        .envs(env.iter().copied())
        .output()
        .unwrap()
}

#[test]
fn a_pair_that_does_not_load_at_start_exits_2_naming_its_key() {
    let pki = Ca::new();
    let pair = pki.leaf("node", &LOCAL);
    let other = pki.leaf("other", &LOCAL);
    let (cert, key) = (
        pair.cert.display().to_string(),
        pair.key.display().to_string(),
    );
    let missing = pki.path("missing.pem").display().to_string();
    let junk = pki.path("junk.pem");
    std::fs::write(&junk, "-----BEGIN NOTHING-----\n").unwrap();
    let junk = junk.display().to_string();
    let other_key = other.key.display().to_string();
    let cases: &[(&[(&str, &str)], &str)] = &[
        (
            &[("PINBOARD_TLS__CERT_FILE", &cert)],
            "config error: tls.key_file: required with tls.cert_file",
        ),
        (
            &[("PINBOARD_TLS__KEY_FILE", &key)],
            "config error: tls.cert_file: required with tls.key_file",
        ),
        (
            &[
                ("PINBOARD_TLS__CERT_FILE", &cert),
                ("PINBOARD_TLS__KEY_FILE", &missing),
            ],
            "config error: tls.key_file: cannot read",
        ),
        (
            &[
                ("PINBOARD_TLS__CERT_FILE", &missing),
                ("PINBOARD_TLS__KEY_FILE", &key),
            ],
            "config error: tls.cert_file: cannot read",
        ),
        (
            &[
                ("PINBOARD_TLS__CERT_FILE", &junk),
                ("PINBOARD_TLS__KEY_FILE", &key),
            ],
            "config error: tls.cert_file:",
        ),
        (
            &[
                ("PINBOARD_TLS__CERT_FILE", &cert),
                ("PINBOARD_TLS__KEY_FILE", &junk),
            ],
            "config error: tls.key_file:",
        ),
        (
            &[
                ("PINBOARD_TLS__CERT_FILE", &cert),
                ("PINBOARD_TLS__KEY_FILE", &other_key),
            ],
            "config error: tls.key_file:",
        ),
        (
            &[("PINBOARD_FORWARDS__CA_FILE", &junk)],
            "config error: forwards.ca_file:",
        ),
    ];
    for (env, expected) in cases {
        let out = check_config(env);
        let (code, stderr) = (out.status.code(), String::from_utf8_lossy(&out.stderr));
        assert_eq!(code, Some(2), "{env:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{env:?}: one line: {stderr}");
        assert!(stderr.starts_with(expected), "{env:?}: {stderr}");
    }
    // The pair that loads: check-config shows both paths, and no key material.
    let out = check_config(&[
        ("PINBOARD_TLS__CERT_FILE", &cert),
        ("PINBOARD_TLS__KEY_FILE", &key),
    ]);
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{shown}");
    assert!(shown.contains(&format!("cert_file = {cert:?}")), "{shown}");
    assert!(shown.contains(&format!("key_file = {key:?}")), "{shown}");
    assert!(!shown.contains("PRIVATE KEY"), "{shown}");
}

/// The three key encodings operators have: PKCS#8, and the traditional RSA and EC (SEC1) ones,
/// each made by `openssl` as an operator would, with a self-signed certificate.
#[test]
fn pkcs8_rsa_and_ec_keys_all_load() {
    let dir = tempfile::tempdir().unwrap();
    let openssl = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir.path())
            .output()
            .expect("run openssl (scripts/ensure-deps installs it)");
        assert!(out.status.success(), "openssl {args:?}: {out:?}");
    };
    let keys = [
        (
            "pkcs8.key",
            vec!["genpkey", "-algorithm", "ed25519", "-out", "pkcs8.key"],
            "PRIVATE KEY",
        ),
        (
            "rsa.key",
            vec!["genrsa", "-traditional", "-out", "rsa.key", "2048"],
            "RSA PRIVATE KEY",
        ),
        (
            "ec.key",
            vec![
                "ecparam",
                "-name",
                "prime256v1",
                "-genkey",
                "-noout",
                "-out",
                "ec.key",
            ],
            "EC PRIVATE KEY",
        ),
    ];
    for (key, make, label) in keys {
        openssl(&make);
        let pem = std::fs::read_to_string(dir.path().join(key)).unwrap();
        assert!(
            pem.starts_with(&format!("-----BEGIN {label}-----")),
            "{pem}"
        );
        let cert = format!("{key}.crt");
        openssl(&[
            "req",
            "-x509",
            "-key",
            key,
            "-subj",
            "/CN=localhost",
            "-days",
            "1",
            "-out",
            &cert,
        ]);
        let (cert, key) = (dir.path().join(&cert), dir.path().join(key));
        let out = check_config(&[
            ("PINBOARD_TLS__CERT_FILE", cert.to_str().unwrap()),
            ("PINBOARD_TLS__KEY_FILE", key.to_str().unwrap()),
        ]);
        assert!(
            out.status.success(),
            "{label}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Issue 23 (Info): a ClientHello with an illegal SNI (here an IP address and names with `_`
/// or `!`) made rustls log one WARN each, as often as a client cared to send one. What a
/// client sends at will is no warning for the operator: the default filter keeps rustls at
/// ERROR (`PINBOARD_LOG` still chooses otherwise).
#[test]
fn illegal_sni_from_a_client_is_no_warning_in_the_log() {
    let (_pki, _pair, f) = https_node(&[]);
    for name in ["127.0.0.1", "bad_name!", "a..b"] {
        for _ in 0..5 {
            let _ = Command::new("openssl")
                .args([
                    "s_client",
                    "-connect",
                    &f.node.addr.to_string(),
                    "-servername",
                    name,
                ])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
    let log = f.node.log();
    let warned: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("rustls"))
        .collect();
    assert!(warned.is_empty(), "{warned:#?}");
}
