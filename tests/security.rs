//! The security review's findings (issue 8), each as the attacker sent it: raw bytes from a
//! client, a credential of another account, a client that never reads. Every test runs the
//! real node against a real redis-server and a real HTTP worker, and failed before its fix.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::json;
use support::attest::claims_of;
use support::fleet::Fixture;
use support::http::{Client, get, tight_client};
use support::node::{eventually, token};
use support::worker::TestWorker;

fn warm_fleet(env: &[(&str, &str)]) -> (Fixture, TestWorker, String) {
    let f = Fixture::new(env);
    f.warm();
    let worker = TestWorker::start("victim");
    let session = f.registered(&worker, "w1");
    (f, worker, session)
}

/// Paths of the instance requests the worker received (probes left out).
fn served(worker: &TestWorker) -> Vec<String> {
    worker.requests().into_iter().map(|s| s.path).collect()
}

/// C1: `Content-Length: 49, 49` was read as 49 by the head decoder and as nothing by the
/// forward, which wrote `content-length: 0` upstream: the body became the next request on the
/// pooled worker connection (an attested `/_pinned/stats`, or any instance at any epoch).
#[test]
fn c1_a_list_form_content_length_is_refused_not_smuggled() {
    let (f, worker, _) = warm_fleet(&[]);
    let smuggled = "GET /_pinned/stats HTTP/1.1\r\nHost: w\r\nX-Ignore: ";
    let stolen = "GET /docs/stolen/count HTTP/1.1\r\nHost: w\r\nPinboard-Epoch: 99999999999999999999\r\nX-Ignore: ";
    for prefix in [smuggled, stolen] {
        for framing in [
            format!("Content-Length: {0}, {0}", prefix.len()),
            format!("Content-Length: {0}\r\nContent-Length: {0}", prefix.len()),
            format!("Content-Length: {0},{0}", prefix.len()),
        ] {
            let mut c = Client::connect(f.node.addr);
            c.send(
                format!(
                    "POST /threads/demo/echo HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\n{framing}\r\n\r\n"
                )
                .as_bytes(),
            );
            std::thread::sleep(Duration::from_millis(300));
            c.send(prefix.as_bytes());
            c.send(b"GET /threads/demo/count HTTP/1.1\r\nHost: x\r\n\r\n");
            let refused = c.read(false);
            assert_eq!(
                (refused.status, refused.json()),
                (400, json!({"error": "bad request"}))
            );
            assert!(
                c.read_until_eof(Duration::from_secs(5)).is_some(),
                "the connection closes after the refusal"
            );
        }
    }
    assert!(
        served(&worker).is_empty(),
        "nothing reached the worker: {:?}",
        served(&worker)
    );
    assert!(f.row("/docs", "stolen").is_none());

    // The same body with one honest length is one request upstream, with that body.
    let mut c = Client::connect(f.node.addr);
    let r = c.request(
        format!(
            "POST /threads/demo/echo HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{smuggled}",
            smuggled.len()
        )
        .as_bytes(),
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["body"], smuggled);
    assert_eq!(
        r.json()["headers"]["content-length"],
        smuggled.len().to_string()
    );
    let r = c.request(b"GET /threads/demo/count HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(r.json()["path"], "/threads/demo/count");
    assert_eq!(
        served(&worker),
        ["/threads/demo/echo", "/threads/demo/count"]
    );
}

/// Two `Host` headers are ambiguous to whatever reads them next (hostname-aware placement,
/// the worker's own routing): refused.
#[test]
fn a_repeated_host_is_refused() {
    let (f, worker, _) = warm_fleet(&[]);
    let mut c = Client::connect(f.node.addr);
    let r = c.request(b"GET /threads/a HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n");
    assert_eq!(r.status, 400);
    assert!(served(&worker).is_empty());
}

/// Inbound `Pinboard-*` headers in any spelling (`Pinboard_Epoch` reads as `Pinboard-Epoch` to
/// CGI-style stacks) never reach the worker; the node's own carry the binding of contract §11.
#[test]
fn inbound_pinboard_headers_are_stripped_and_the_attestation_is_bound() {
    let (f, worker, session) = warm_fleet(&[]);
    let mut c = Client::connect(f.node.addr);
    let r = c.request(
        b"GET /threads/abc/x HTTP/1.1\r\nHost: e\r\nPinboard_Epoch: 1\r\nPINBOARD_ATTESTATION: forged\r\n\
          Pinboard-Epoch: 2\r\nPinboard-Epoch: 3\r\npinboard-anything: x\r\n\r\n",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let seen = &worker.requests()[0];
    let pinboard: Vec<_> = seen
        .headers
        .iter()
        .filter(|(n, _)| n.starts_with("pinboard"))
        .collect();
    assert_eq!(pinboard.len(), 2, "only the node's two: {pinboard:?}");
    let epoch = seen.header("pinboard-epoch").unwrap();
    assert_eq!(f.row("/threads", "abc").unwrap()["epoch"], epoch);
    let claims = claims_of(
        seen.header("pinboard-attestation").unwrap(),
        &worker.secret(),
    );
    assert_eq!(claims["aud"], session);
    assert_eq!(claims["purpose"], "forward");
    assert_eq!(claims["inst"], "/threads/abc");
    assert_eq!(claims["epoch"], epoch);
}

/// H1: `prevSessionId` moved any session's rows to the registering one, whatever its account.
#[test]
fn h1_another_accounts_session_cannot_be_reclaimed() {
    let (f, victim, victim_session) = warm_fleet(&[]);
    let mut c = Client::connect(f.node.addr);
    assert_eq!(
        c.request(b"GET /threads/demo HTTP/1.1\r\nHost: x\r\n\r\n")
            .status,
        200
    );
    let row = f.row("/threads", "demo").unwrap();
    assert_eq!(row["sessionId"], victim_session);

    let mallory = TestWorker::start("mallory");
    let steal = json!({
        "prevSessionId": victim_session,
        "instances": {"/threads": ["demo"]},
    });
    // Another account; then the victim's own account under another clientId.
    let other_account = token("mallory", &["pinboard:worker"], &["*"]);
    for (credential, client) in [(other_account.as_str(), "m1"), (f.token.as_str(), "m2")] {
        let body = f.register_body(&mallory, client, steal.clone());
        let r = f.post("register", credential, &body);
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(
            r.json()["duplicates"],
            json!([{"ns": "/threads", "id": "demo"}]),
            "every listed id comes back as a duplicate"
        );
        assert_eq!(
            f.row("/threads", "demo").unwrap(),
            row,
            "the row did not move"
        );
    }
    let r = c.request(b"GET /threads/demo HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(r.status, 200);
    assert_eq!(
        (served(&victim).len(), served(&mallory).len()),
        (2, 0),
        "the victim's users still reach the victim only"
    );

    // The owner itself, re-registering under its own client, still reclaims (and keeps the
    // epoch).
    let own = f.register_body(
        &victim,
        "w1",
        json!({"prevSessionId": victim_session, "instances": {"/threads": ["demo"]}}),
    );
    let r = f.post("register", &f.token, &own);
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.json().get("duplicates").is_none(), "{}", r.text());
    let reclaimed = f.row("/threads", "demo").unwrap();
    assert_eq!(reclaimed["sessionId"], r.json()["sessionId"]);
    assert_eq!(reclaimed["epoch"], row["epoch"]);
}

/// Writes `total` bytes of `unit` repeated, until done or the peer stops taking them; returns
/// how much went out.
fn pipeline(stream: &mut TcpStream, unit: &[u8], total: usize) -> usize {
    let block: Vec<u8> = unit
        .iter()
        .copied()
        .cycle()
        .take(unit.len() * 4096)
        .collect();
    let mut sent = 0;
    while sent < total {
        match stream.write(&block) {
            Ok(n) => sent += n,
            Err(_) => break,
        }
    }
    sent
}

/// H2: the node flushed answers only when no further request was buffered, so a client that
/// pipelines and never reads made its output grow without bound (100 MB of requests took the
/// node to 1.1 GB). Now it stops reading past 64 KiB of unsent answers, and closes the client
/// after `http.write_timeout_ms` without progress.
#[test]
fn h2_a_pipelining_client_that_never_reads_costs_bounded_memory() {
    let f = Fixture::new(&[("PINBOARD_HTTP__WRITE_TIMEOUT_MS", "1500")]);
    let before = f.node.rss_bytes();
    let mut attacker = tight_client(f.node.addr);
    let started = Instant::now();
    let sent = pipeline(&mut attacker, b"GET / HTTP/1.1\r\n\r\n", 100 << 20);
    let during = f.node.rss_bytes();
    // Meanwhile everyone else is served.
    assert_eq!(get(f.node.addr, "/healthz", None).status, 200);
    eprintln!(
        "pipelined {} MB unread in {:?}: node RSS {} MB before, {} MB during",
        sent >> 20,
        started.elapsed(),
        before >> 20,
        during >> 20
    );
    assert!(
        sent < 100 << 20,
        "the node stopped reading: only {sent} bytes went in"
    );
    assert!(
        during < 100 << 20,
        "RSS {during} bytes while the client never reads"
    );
    // The client took nothing for the write timeout: closed.
    let mut sink = Vec::new();
    attacker
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let closed = loop {
        let mut chunk = [0u8; 65536];
        match attacker.read(&mut chunk) {
            Ok(0) => break true,
            Ok(n) => sink.extend_from_slice(&chunk[..n.min(16)]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break true,
            Err(_) => break false,
        }
    };
    assert!(closed, "a client that never reads is closed");
}

/// H3: with no write timeout, two clients that never read their large answers held a worker's
/// inflight slots (max 2) for as long as they liked: every other client got 503. Now each is
/// closed after `http.write_timeout_ms`, which frees its upstream connection and slot.
#[test]
fn h3_a_client_that_never_reads_releases_its_inflight_slot() {
    let (f, worker, _) = warm_fleet(&[
        ("PINBOARD_THREADS", "1"),
        ("PINBOARD_FORWARDS__MAX_INFLIGHT", "2"),
        ("PINBOARD_HTTP__WRITE_TIMEOUT_MS", "1000"),
    ]);
    // Larger than what the kernel buffers between the node and a client that does not read.
    let body = "x".repeat(16 << 20);
    let request = format!(
        "POST /threads/big/echo HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut stuck: Vec<TcpStream> = (0..2)
        .map(|_| {
            let mut s = tight_client(f.node.addr);
            s.write_all(request.as_bytes()).unwrap();
            s
        })
        .collect();
    // Both answers are on their way and stuck: the worker answered them.
    assert!(eventually(Duration::from_secs(10), || served(&worker)
        .len()
        >= 2));
    let started = Instant::now();
    let mut refused = 0;
    let freed = eventually(Duration::from_secs(15), || {
        let r = get(f.node.addr, "/threads/other", None);
        if r.status == 503 {
            assert_eq!(
                r.json(),
                json!({"error": "worker inflight cap exceeded, retry"})
            );
            refused += 1;
        }
        r.status == 200
    });
    assert!(freed, "the slots were released:\n{}", f.node.log());
    eprintln!(
        "slots freed {:?} after the stuck answers began ({refused} refused meanwhile)",
        started.elapsed()
    );
    // Both stuck clients are closed by the node (the health call itself is the one left).
    let ops = token("ops", &["pinboard:operator"], &["*"]);
    let closed = eventually(Duration::from_secs(10), || {
        get(f.node.addr, "/registry/health", Some(&ops)).json()["connections"] == 1
    });
    assert!(closed, "the clients that never read were closed");
    for s in &mut stuck {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut all = Vec::new();
        // What the kernel had buffered for it, then the end (or a reset) of the connection.
        let _ = s.read_to_end(&mut all);
        assert!(
            all.len() < body.len(),
            "cut off: {} bytes of the answer",
            all.len()
        );
    }
}

/// Past `max_connections` a new connection is closed at accept, and counted.
#[test]
fn connections_past_the_cap_are_closed_at_accept() {
    let f = Fixture::new(&[("PINBOARD_MAX_CONNECTIONS", "4")]);
    // Accepts are asynchronous: each of the four is known accepted (and counted) once it has
    // been answered, and stays open.
    let idle: Vec<TcpStream> = (0..4)
        .map(|_| {
            let mut conn = TcpStream::connect(f.node.addr).unwrap();
            conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            conn.write_all(b"GET /healthz HTTP/1.1\r\n\r\n").unwrap();
            let mut answer = [0u8; 512];
            let n = conn.read(&mut answer).unwrap();
            assert!(
                answer[..n].starts_with(b"HTTP/1.1 200"),
                "{:?}",
                &answer[..n]
            );
            conn
        })
        .collect();
    let mut extra = TcpStream::connect(f.node.addr).unwrap();
    extra
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let _ = extra.write_all(b"GET /healthz HTTP/1.1\r\n\r\n");
    let mut answer = Vec::new();
    let _ = extra.read_to_end(&mut answer);
    assert!(
        answer.is_empty(),
        "refused without an answer: {:?}",
        String::from_utf8_lossy(&answer)
    );
    drop(idle);
    let ops = token("ops", &["pinboard:operator"], &["*"]);
    // The node sees the four close asynchronously: until it has, a scrape's own connection is
    // past the cap and closed at accept too (and counted), which is a retry here, not a failure.
    let refused_scrapes = std::cell::Cell::new(0);
    let scrape = || -> Option<String> {
        let mut conn = TcpStream::connect(f.node.addr).ok()?;
        conn.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        let head = format!(
            "GET /metrics HTTP/1.1\r\nAuthorization: Bearer {ops}\r\nConnection: close\r\n\r\n"
        );
        let mut answer = Vec::new();
        let read = conn
            .write_all(head.as_bytes())
            .and_then(|()| conn.read_to_end(&mut answer));
        if read.is_err() || answer.is_empty() {
            refused_scrapes.set(refused_scrapes.get() + 1);
            return None;
        }
        Some(String::from_utf8_lossy(&answer).into_owned())
    };
    let scraped = eventually(Duration::from_secs(5), || {
        scrape().is_some_and(|text| {
            let counted = format!(
                "pinboard_connections_refused_total{{reason=\"max_connections\"}} {}\n",
                1 + refused_scrapes.get()
            );
            text.contains(&counted)
        })
    });
    assert!(
        scraped,
        "{}",
        get(f.node.addr, "/metrics", Some(&ops)).text()
    );
}

/// M1: `/threads/../_pinned/stats` was placed as id `..` and forwarded, attested, to a worker
/// whose stack might normalize it to its own `/_pinned/stats`.
#[test]
fn m1_dot_segments_never_reach_a_worker() {
    let (f, worker, _) = warm_fleet(&[]);
    for path in [
        "/threads/../_pinned/stats",
        "/threads/%2e%2e/_pinned/stats",
        "/threads/.%2E/_pinned/stats",
        "/threads/x/../../_pinned/stats",
    ] {
        let r = get(f.node.addr, path, None);
        assert_eq!(
            (r.status, r.json()),
            (404, json!({"error": "unknown namespace"})),
            "{path}"
        );
    }
    for path in ["/threads/..", "/..", "/threads/%2e%2e"] {
        let r = get(f.node.addr, path, None);
        assert_eq!(
            (r.status, r.json()),
            (404, json!({"error": "not found"})),
            "{path}"
        );
    }
    // `/threads/.` is `/threads/`: no id.
    for path in ["/threads/.", "/threads/./", "/threads/x/.."] {
        let r = get(f.node.addr, path, None);
        assert_eq!(
            (r.status, r.text().as_str()),
            (400, "invalid instance id"),
            "{path}"
        );
    }
    assert!(served(&worker).is_empty());
    for id in ["..", "."] {
        assert!(f.row("/threads", id).is_none());
    }
    // Resolved, not refused: the worker gets the clean path, the query as sent.
    for (path, clean) in [
        ("/threads/a/x/../y?q=../1", "/threads/a/y?q=../1"),
        ("/threads/./a/%2e/z", "/threads/a/z"),
        ("/docs/../threads/b", "/threads/b"),
    ] {
        let r = get(f.node.addr, path, None);
        assert_eq!(r.status, 200, "{path}: {}", r.text());
        assert_eq!(r.json()["path"], clean);
    }
    // Neither a dot segment nor the worker's own routes can be a namespace.
    let w = TestWorker::start("w2");
    for (ns, error) in [
        ("/_pinned", "invalid namespace: /_pinned"),
        ("/..", "invalid namespace: /.."),
        ("/.", "invalid namespace: /."),
    ] {
        let r = f.register(&w, "w2", json!({"namespaces": [ns]}));
        assert_eq!((r.status, r.json()), (400, json!({"error": error})), "{ns}");
    }
}

/// M2: a named advertise host was resolved by the blocking resolver on the core. Names now
/// resolve off the core; one that does not resolve fails like an unreachable worker.
#[test]
fn m2_named_advertise_hosts_resolve_off_the_core() {
    let f = Fixture::new(&[]);
    f.warm();
    let worker = TestWorker::start("named");
    let by_name = format!("http://localhost:{}", worker.addr.port());
    let r = f.register(&worker, "w1", json!({"advertiseUrl": by_name}));
    assert_eq!(r.status, 200, "{}", r.text());
    let r = get(f.node.addr, "/threads/n1", None);
    assert_eq!(r.status, 200, "{}", r.text());

    // A name that does not resolve: a probe failure like any unreachable worker.
    let any_host = pinboard::passport::mint(
        support::node::SECRET,
        &pinboard::passport::TokenRequest {
            sub: "acct-a".into(),
            scopes: vec!["pinboard:worker".into()],
            namespaces: vec!["*".into()],
            backend_hosts: vec!["*".into()],
            ttl_secs: 3600,
            ..Default::default()
        },
    )
    .unwrap();
    let nowhere = json!({"advertiseUrl": "http://no-such-host.invalid:8081"});
    let body = f.register_body(&worker, "w2", nowhere);
    let r = f.post("register", &any_host, &body);
    assert_eq!(
        (r.status, r.json()),
        (400, json!({"error": "registration probe failed"}))
    );
    // The core that tried it serves on.
    assert_eq!(get(f.node.addr, "/threads/n1", None).status, 200);
}

/// Worker secrets key every attestation: a guessable one is refused.
#[test]
fn short_worker_secrets_are_refused() {
    let f = Fixture::new(&[]);
    let worker = TestWorker::start("w");
    for secret in ["", "short", "fifteen-bytes!!"] {
        let r = f.register(&worker, "w1", json!({"secret": secret}));
        assert_eq!(r.status, 400, "{secret:?}");
        if !secret.is_empty() {
            assert_eq!(
                r.json(),
                json!({"error": "secret must be at least 16 bytes"})
            );
        }
    }
    let r = f.register(&worker, "w1", json!({"secret": "sixteen-bytes!!!"}));
    assert_eq!(r.status, 400, "the probe needs the worker's own secret");
    assert_eq!(r.json(), json!({"error": "registration probe failed"}));
}

// Issue 23: security, round three.

/// Every command the server ran since the last reset, as (µs, arguments): SLOWLOG with a
/// threshold of 0 logs them all.
fn slowlog(f: &Fixture) -> Vec<(u64, Vec<String>)> {
    let log: serde_json::Value =
        serde_json::from_str(&f.cli(&["--json", "SLOWLOG", "GET", "-1"])).unwrap();
    log.as_array()
        .unwrap()
        .iter()
        .map(|entry| {
            let args = entry[3].as_array().unwrap().iter();
            let args = args.map(|a| a.as_str().unwrap().to_string()).collect();
            (entry[2].as_u64().unwrap(), args)
        })
        .collect()
}

fn log_every_command(f: &Fixture) {
    f.cli(&["CONFIG", "SET", "slowlog-log-slower-than", "0"]);
    f.cli(&["CONFIG", "SET", "slowlog-max-len", "1000000"]);
    f.cli(&["SLOWLOG", "RESET"]);
}

/// H1: the bounds at the edge, each refusal naming its setting. Nothing is written.
#[test]
fn h1_a_registration_past_the_caps_is_refused_naming_the_setting() {
    let f = Fixture::new(&[("PINBOARD_REGISTRY__MAX_INSTANCES_PER_REGISTER", "1000")]);
    let worker = TestWorker::start("greedy");
    let namespaces = |n: usize| -> Vec<String> { (0..n).map(|i| format!("/n{i}")).collect() };
    let r = f.register(&worker, "g", json!({"namespaces": namespaces(65)}));
    assert_eq!(
        (r.status, r.json()),
        (
            400,
            json!({"error": "too many namespaces: 65 (registry.max_namespaces_per_worker is 64)"})
        )
    );
    // 100,000 namespaces in 1.3 MB once held Redis 2.35 s a bucket: refused before any call.
    let r = f.register(&worker, "g", json!({"namespaces": namespaces(100_000)}));
    assert_eq!(r.status, 400, "{}", r.text());
    let ids = |n: usize| -> Vec<String> { (0..n).map(|i| format!("i{i}")).collect() };
    let r = f.register(
        &worker,
        "g",
        json!({"instances": {"/threads": ids(600), "/docs": ids(401)}}),
    );
    assert_eq!(
        (r.status, r.json()),
        (
            400,
            json!({"error": "too many instances: 1001 (registry.max_instances_per_register is 1000)"})
        )
    );
    assert_eq!(f.cli(&["HLEN", f.keys.sessions()]), "0");
    // At the caps it registers.
    let r = f.register(
        &worker,
        "g",
        json!({"namespaces": namespaces(64), "instances": {"/n0": ids(1000)}}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["duplicates"].as_array().unwrap().len(), 1000);
}

/// H1: one credential registering at the caps (64 namespaces, one of them the victim's, and
/// 100,000 held ids), after trying 20,000 namespaces, while a legitimate worker heartbeats on a
/// 3 s lease and clients use its namespace: the victim's session never lapses and every request
/// is served. The registration went to Redis in pages (no copy holds a namespace list; every
/// `bucket_worker.lua` call reclaimed at most 100 ids), not one call per bucket.
#[test]
fn h1_a_registration_at_the_caps_never_lapses_another_workers_session() {
    let (f, victim, session) = Fixture::with_worker(&[("PINBOARD_LEASE_TTL_MS", "3000")], "victim");
    let stop = std::sync::atomic::AtomicBool::new(false);
    let attacker = TestWorker::start("attacker");
    std::thread::scope(|s| {
        let beats = s.spawn(|| {
            let mut answers = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                answers.push(f.heartbeat(&victim, &session, json!({})).status);
                std::thread::sleep(Duration::from_millis(500));
            }
            answers
        });
        let requests = s.spawn(|| {
            let mut answers = Vec::new();
            let mut i = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let r = get(f.node.addr, &format!("/docs/d{}", i % 50), None);
                answers.push((r.status, r.text()));
                i += 1;
                std::thread::sleep(Duration::from_millis(20));
            }
            answers
        });
        log_every_command(&f);
        let flood: Vec<String> = (0..20_000).map(|i| format!("/f{i}")).collect();
        let r = f.register(&attacker, "attacker", json!({"namespaces": flood}));
        assert_eq!(r.status, 400, "{}", r.text());
        let mut namespaces: Vec<String> = (0..63).map(|i| format!("/f{i}")).collect();
        namespaces.push("/docs".into());
        let held: Vec<String> = (0..100_000).map(|i| format!("held-{i}")).collect();
        for _ in 0..2 {
            let r = f.register(
                &attacker,
                "attacker",
                json!({"namespaces": namespaces, "instances": {"/f0": held}}),
            );
            assert_eq!(r.status, 200, "{}", r.text());
        }
        // New placements in the shared namespace decode both workers' copies.
        for i in 0..50 {
            assert_eq!(
                get(f.node.addr, &format!("/docs/new-{i}"), None).status,
                200
            );
        }
        std::thread::sleep(Duration::from_millis(1500));
        // Read while the victim still heartbeats: once it stops, its 3 s lease may run out
        // before a slow machine gets here.
        for bucket in 0..support::fleet::SHARDS {
            let copy = f
                .bucket_record(bucket, &session)
                .expect("the victim's copy");
            assert!(copy.get("namespaces").is_none(), "{copy}");
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let beats = beats.join().unwrap();
        assert!(beats.iter().all(|s| *s == 200), "{beats:?}");
        let requests = requests.join().unwrap();
        let failed: Vec<_> = requests.iter().filter(|(s, _)| *s != 200).collect();
        assert!(
            failed.is_empty(),
            "{} of {}: {failed:?}",
            failed.len(),
            requests.len()
        );
    });
    let log = slowlog(&f);
    let bucket_calls: Vec<&(u64, Vec<String>)> = log
        .iter()
        .filter(|(_, args)| {
            args[0].eq_ignore_ascii_case("EVALSHA") && args[3].ends_with("}:workers")
        })
        .collect();
    // 2 registrations × 100,000 ids / 100 per call, besides the heartbeats' renews.
    assert!(bucket_calls.len() >= 2_000, "{} calls", bucket_calls.len());
    // Reported, not asserted (timing): `scripts/abuse registration` measures it.
    let longest = log.iter().map(|(us, _)| *us).max().unwrap_or(0);
    println!("longest Redis call during the registrations: {longest} µs");
}

/// M1: the secret is written into the probe's `Pinboard-Proxy-Secret` header: CR, LF, NUL, a
/// space or a byte past ASCII would let it write headers (or a whole second request) of the
/// worker's choosing to the advertise host.
#[test]
fn m1_a_worker_secret_must_be_visible_ascii() {
    let f = Fixture::new(&[]);
    let worker = TestWorker::start("w");
    for secret in [
        "AAAAAAAAAAAAAAAA\r\nX-Injected: yes\r\n\r\nPOST /internal/admin HTTP/1.1\r\nHost: a\r\n\r\n",
        "AAAAAAAAAAAAAAAA\nX-Injected: yes",
        "AAAAAAAAAAAAAAAA\0",
        "AAAAAAAA AAAAAAAA",
        "AAAAAAAAAAAAAAAA\t",
        "AAAAAAAAAAAAAAAA\u{7f}",
        "AAAAAAAAAAAAAAAé",
    ] {
        let r = f.register(&worker, "w1", json!({"secret": secret}));
        assert_eq!(
            (r.status, r.json()),
            (400, json!({"error": "secret must be visible ASCII"})),
            "{secret:?}"
        );
    }
    assert!(worker.requests().is_empty(), "no probe was sent");
    assert_eq!(f.cli(&["HLEN", f.keys.sessions()]), "0");
}

/// M2: binding epochs were compared through a Lua double (and stored through cjson's 14
/// digits): `10^14 + 1` was stored as `1e+14`, so an equal epoch displaced the binding, and
/// `2^64 - 1` became a value above every epoch. Now digits, compared exactly, at any size.
#[test]
fn m2_binding_epochs_are_exact_integers() {
    let f = Fixture::new(&[("PINBOARD_HOSTNAME_AWARE", "true")]);
    let worker = TestWorker::start("w");
    let register = |client: &str, hostname: &str, env: &str, epoch: &str| {
        let mut body = f.register_body(
            &worker,
            client,
            json!({"namespaces": ["/threads"], "hostname": hostname, "env": env}),
        );
        // As raw digits: a JSON number above 2^53 does not survive serde_json's Value.
        body["epoch"] = json!("EPOCH");
        let body = body.to_string().replace("\"EPOCH\"", epoch);
        support::http::post_json(f.node.addr, "/registry/register", Some(&f.token), &body)
    };
    for (i, (held, equal, above)) in [
        ("100000000000001", "100000000000001", "100000000000002"),
        ("9007199254740993", "9007199254740993", "9007199254740994"),
        ("9007199254740992", "9007199254740992", "9007199254740993"),
        (
            "18446744073709551614",
            "18446744073709551614",
            "18446744073709551615",
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let host = format!("h{i}");
        let r = register(&format!("a{i}"), &host, &format!("a{i}"), held);
        assert_eq!(r.status, 200, "{}", r.text());
        let stored = f.cli(&["HGET", f.keys.bind_hosts(), &format!("{host}/threads")]);
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&stored).unwrap(),
            json!({"env": format!("a{i}"), "epoch": held})
        );
        let r = register(&format!("b{i}"), &host, &format!("b{i}"), equal);
        assert_eq!(
            (r.status, r.json()["error"].as_str().unwrap_or_default()),
            (
                409,
                format!(
                    "hostname {host}/threads is bound to env a{i} at epoch {held}, not b{i} — register with a higher epoch to displace"
                )
                .as_str()
            )
        );
        let r = register(&format!("b{i}"), &host, &format!("b{i}"), above);
        assert_eq!(r.status, 200, "{above} displaces {held}: {}", r.text());
    }
    // 2^64 - 1 is the largest epoch; past it, no integer the node takes.
    let r = register("c", "h3", "c", "18446744073709551615");
    assert_eq!(r.status, 409, "{}", r.text());
    let r = register("c", "h3", "c", "18446744073709551616");
    assert_eq!(r.status, 400, "{}", r.text());
}

/// M2: placement epochs are minted as max(now, previous + 1, counter + 1) in digits, not in
/// Lua numbers: a row at 2^53 + 1 whose owner died is re-placed at exactly 2^53 + 2, and a
/// counter at 10^17 - 1 mints 10^17 (a double would have rounded both).
#[test]
fn m2_placement_epochs_are_minted_exactly_above_2_pow_53() {
    let (f, worker, _) = warm_fleet(&[]);
    f.put_row(
        "/threads",
        "big-epoch",
        json!({"sessionId": "a-dead-session", "epoch": "9007199254740993"}),
    );
    assert_eq!(get(f.node.addr, "/threads/big-epoch/x", None).status, 200);
    assert_eq!(
        f.row("/threads", "big-epoch").unwrap()["epoch"],
        "9007199254740994"
    );
    let seen = worker.requests();
    let forwarded = seen
        .iter()
        .rfind(|s| s.path == "/threads/big-epoch/x")
        .unwrap();
    assert_eq!(forwarded.header("pinboard-epoch"), Some("9007199254740994"));

    let id = "next-epoch";
    let bucket = pinboard::store::bucket_of(id, support::fleet::SHARDS);
    f.cli(&["SET", &f.keys.bucket(bucket).epoch, "99999999999999999"]);
    assert_eq!(
        get(f.node.addr, &format!("/threads/{id}/x"), None).status,
        200
    );
    assert_eq!(
        f.row("/threads", id).unwrap()["epoch"],
        "100000000000000000"
    );
    assert_eq!(
        f.cli(&["GET", &f.keys.bucket(bucket).epoch]),
        "100000000000000000"
    );
}
