//! The worker protocol end to end: the real binary, a real redis-server, hand-made workers
//! answering (or failing) the ownership probe. Every status and error string of the spec's
//! worker-protocol section, and what each route leaves in Redis.

mod support;

use std::time::Duration;

use serde_json::{Value, json};
use support::fleet::Fixture;
use support::http::{Reply, post_json};
use support::node::token;
use support::worker::{Mode, Serve, TestWorker};

fn error_of(r: &Reply) -> (u16, String) {
    (
        r.status,
        r.json()["error"].as_str().unwrap_or_default().to_string(),
    )
}

#[test]
fn register_writes_the_session_everywhere() {
    let f = Fixture::new(&[]);
    let worker = TestWorker::start("worker-secret-1");
    let r = f.register(&worker, "client-1", json!({"headroom": 7}));
    assert_eq!(r.status, 200, "{}", r.text());
    let answer = r.json();
    let session = answer["sessionId"].as_str().unwrap();
    assert_eq!(session.len(), 32);
    assert_eq!(answer["expiresInMs"], 15000);
    assert_eq!(answer["draining"], false);
    assert!(answer.get("duplicates").is_none() && answer.get("drainDeadline").is_none());

    // The probe carried the secret and the challenge.
    let probes = worker.probes();
    assert_eq!(probes.len(), 1);
    assert!(
        probes[0]
            .path
            .starts_with("/_pinned/challenge?challenge=c-")
    );
    assert_eq!(
        probes[0].header("pinboard-proxy-secret"),
        Some(worker.secret().as_str())
    );

    let record = f.session_record(session).unwrap();
    assert_eq!(record["clientId"], "client-1");
    assert_eq!(record["account"], "acct-a");
    assert_eq!(record["advertiseUrl"], worker.url());
    assert_eq!(record["headroom"], 7.0);
    for bucket in 0..4 {
        let copy = f
            .bucket_record(bucket, session)
            .expect("a copy in every bucket");
        assert_eq!(copy["secret"], worker.secret());
        assert!(
            f.in_ns_list(bucket, "/threads", session) && f.in_ns_list(bucket, "/docs", session)
        );
    }

    // The same client registering again replaces its session.
    let again = f.registered(&worker, "client-1");
    assert!(f.session_record(session).is_none());
    assert!(!f.in_ns_list(0, "/threads", session) && f.in_ns_list(0, "/threads", &again));
}

#[test]
fn register_credential_and_claim_refusals() {
    let f = Fixture::new(&[]);
    let worker = TestWorker::start("s");
    let body = f.register_body(&worker, "c", json!({}));
    let r = post_json(f.node.addr, "/registry/register", None, &body.to_string());
    assert_eq!(error_of(&r), (401, "unauthorized".into()));
    let operator = token("acct-a", &["pinboard:operator"], &["*"]);
    assert_eq!(
        error_of(&f.post("register", &operator, &body)),
        (403, "forbidden".into())
    );

    let narrow = token("acct-a", &["pinboard:worker"], &["/threads"]);
    let r = f.post("register", &narrow, &body);
    assert_eq!(error_of(&r), (403, "namespace not allowed: /docs".into()));

    let elsewhere = f.register_body(
        &worker,
        "c",
        json!({"advertiseUrl": format!("http://127.0.0.2:{}", worker.addr.port())}),
    );
    assert_eq!(
        error_of(&f.post("register", &f.token, &elsewhere)),
        (403, "backend host not allowed: 127.0.0.2".into())
    );
    let ported = pinboard::passport::mint(
        support::node::SECRET,
        &pinboard::passport::TokenRequest {
            sub: "acct-a".into(),
            scopes: vec!["pinboard:worker".into()],
            namespaces: vec!["*".into()],
            backend_hosts: vec!["127.0.0.1".into()],
            ports: vec![1],
            ttl_secs: 60,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(
        error_of(&f.post("register", &ported, &body)),
        (
            403,
            format!("advertiseUrl port not allowed: {}", worker.addr.port())
        )
    );
    // Claims are checked before the probe: none of the refusals above reached the worker.
    assert!(worker.probes().is_empty());

    // A clientId belongs to the account that first registered it.
    f.registered(&worker, "owned");
    let other = f.node.worker_token("acct-b");
    let body = f.register_body(&worker, "owned", json!({}));
    assert_eq!(
        error_of(&f.post("register", &other, &body)),
        (409, "client belongs to another account".into())
    );
}

#[test]
fn register_field_rules() {
    let f = Fixture::new(&[]);
    let worker = TestWorker::start("s");
    for (extra, want) in [
        (
            json!({"hostname": "h"}),
            "hostname requires hostname-aware mode",
        ),
        (json!({"env": "e"}), "env requires hostname-aware mode"),
        (
            json!({"envs": {"/threads": "e"}}),
            "envs requires hostname-aware mode",
        ),
        (
            json!({"takeover": "deny"}),
            "takeover requires hostname-aware mode",
        ),
        (json!({"epoch": 3}), "epoch requires hostname-aware mode"),
        (
            json!({"advertiseUrl": "ftp://127.0.0.1:1"}),
            "advertiseUrl must be an http or https URL",
        ),
        (
            json!({"advertiseUrl": "http://u:p@127.0.0.1:1"}),
            "advertiseUrl must not carry userinfo",
        ),
        (
            json!({"namespaces": ["threads"]}),
            "invalid namespace: threads",
        ),
        (
            json!({"instances": {"/other": ["a"]}}),
            "namespace not registered: /other",
        ),
    ] {
        let r = f.register(&worker, "c", extra.clone());
        assert_eq!(error_of(&r), (400, want.to_string()), "{extra}");
    }
    let zero_epoch = f.register(&worker, "c", json!({"epoch": 0}));
    assert_eq!(
        zero_epoch.status,
        200,
        "epoch 0 is allowed in single mode: {}",
        zero_epoch.text()
    );

    for bad in [
        json!({"namespaces": []}),
        json!({"headroom": "lots"}),
        json!({"draining": null}),
        json!({"clientId": ""}),
    ] {
        let r = f.register(&worker, "c", bad.clone());
        let (status, error) = error_of(&r);
        assert_eq!(status, 400, "{bad}");
        assert!(
            error.starts_with("expected {clientId, secret, namespaces"),
            "{bad}: {error}"
        );
    }
    let r = post_json(
        f.node.addr,
        "/registry/register",
        Some(&f.token),
        "{\"clientId\": ",
    );
    assert_eq!(error_of(&r), (400, "invalid json".into()));
    let huge = format!("{{\"pad\": \"{}\"}}", "x".repeat(8 * 1024 * 1024));
    let r = post_json(f.node.addr, "/registry/register", Some(&f.token), &huge);
    assert_eq!(error_of(&r), (413, "body too large".into()));
    // Just under the register cap is read (and then refused for its shape).
    let big = format!("{{\"pad\": \"{}\"}}", "x".repeat(2 * 1024 * 1024));
    assert_eq!(
        post_json(f.node.addr, "/registry/register", Some(&f.token), &big).status,
        400
    );
}

#[test]
fn registration_probe_failures() {
    let f = Fixture::new(&[]);
    for mode in [
        Mode::WrongValue,
        Mode::Failing,
        Mode::Bodyless,
        Mode::Slow(Duration::from_millis(1500)),
    ] {
        let worker = TestWorker::start("s");
        worker.set_mode(mode);
        let r = f.register(&worker, "c", json!({}));
        assert_eq!(
            error_of(&r),
            (400, "registration probe failed".into()),
            "{mode:?}"
        );
    }
    // Nobody listening at the advertise URL.
    let gone = TestWorker::start("s");
    let body = f.register_body(&gone, "c", json!({"advertiseUrl": "http://127.0.0.1:1"}));
    assert_eq!(
        error_of(&f.post("register", &f.token, &body)),
        (400, "registration probe failed".into())
    );
    // A worker that does not know the challenge (404) fails too; details stay in the log.
    let worker = TestWorker::start("s");
    let mut body = f.register_body(&worker, "c", json!({}));
    body["challenge"] = json!("never-issued");
    assert_eq!(
        error_of(&f.post("register", &f.token, &body)),
        (400, "registration probe failed".into())
    );
    // One line a refusal, at warn, with the probe's detail.
    let log = f.node.log();
    let refusals = f.node.log_lines("registration refused");
    assert_eq!(refusals.len(), 6, "{log}");
    assert!(
        refusals.iter().all(|l| l.contains("WARN")
            && l.contains("sub=acct-a")
            && l.contains("error=registration probe failed")
            && l.contains("detail=probe of ")),
        "{log}"
    );
    assert!(refusals[5].contains("404"), "{}", refusals[5]);
    assert_eq!(f.cli(&["HLEN", f.keys.sessions()]), "0");
}

#[test]
fn heartbeat_renews_flags_and_degrades() {
    let f = Fixture::new(&[]);
    let worker = TestWorker::start("s");
    let session = f.registered(&worker, "c");
    let before = f.session_record(&session).unwrap()["expiry"]
        .as_u64()
        .unwrap();
    std::thread::sleep(Duration::from_millis(20));

    let r = f.heartbeat(&worker, &session, json!({"headroom": 3, "draining": true}));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json(), json!({"expiresInMs": 15000, "draining": true}));
    let record = f.session_record(&session).unwrap();
    assert!(record["expiry"].as_u64().unwrap() > before);
    assert_eq!(
        (record["headroom"].as_f64(), record["draining"].as_bool()),
        (Some(3.0), Some(true))
    );
    assert_eq!(f.bucket_record(2, &session).unwrap()["draining"], true);

    // An unreachable / failing / body-less probe still renews, and marks the worker degraded.
    for mode in [Mode::Failing, Mode::Bodyless] {
        worker.set_mode(mode);
        let r = f.heartbeat(&worker, &session, json!({}));
        assert_eq!(
            r.json(),
            json!({"expiresInMs": 15000, "draining": false, "degraded": true}),
            "{mode:?}"
        );
        assert!(f.session_record(&session).unwrap()["degradedSince"].is_u64());
        assert_eq!(f.bucket_record(0, &session).unwrap()["degraded"], true);
    }
    worker.set_mode(Mode::Honest);
    let r = f.heartbeat(&worker, &session, json!({}));
    assert_eq!(r.json(), json!({"expiresInMs": 15000, "draining": false}));
    assert!(
        f.session_record(&session)
            .unwrap()
            .get("degradedSince")
            .is_none()
    );
    assert_eq!(f.bucket_record(0, &session).unwrap()["degraded"], false);
}

#[test]
fn heartbeat_refusals() {
    let f = Fixture::new(&[]);
    let worker = TestWorker::start("s");
    let session = f.registered(&worker, "c");

    let r = f.heartbeat(&worker, "no-such-session", json!({}));
    assert_eq!(
        (r.status, r.json()),
        (409, json!({"error": "unknown session", "reregister": true}))
    );
    let other = f.node.worker_token("acct-b");
    let (challenge, value) = worker.challenge();
    let body = json!({"sessionId": session, "headroom": 1, "draining": false, "challenge": challenge, "challengeValue": value});
    assert_eq!(
        error_of(&f.post("heartbeat", &other, &body)),
        (403, "forbidden".into())
    );
    // Claims that no longer cover the record.
    let narrow = token("acct-a", &["pinboard:worker"], &["/threads"]);
    assert_eq!(
        error_of(&f.post("heartbeat", &narrow, &body)),
        (403, "forbidden".into())
    );
    let r = f.post("heartbeat", &f.token, &json!({"sessionId": session}));
    assert_eq!(r.status, 400);
    assert!(error_of(&r).1.starts_with("expected {sessionId, headroom"));

    // Worker routes other than register cap bodies at 1 MiB.
    let padded = format!(
        "{{\"sessionId\": \"{session}\", \"pad\": \"{}\"}}",
        "x".repeat(1024 * 1024)
    );
    for route in ["heartbeat", "release", "tag", "deregister"] {
        let r = post_json(
            f.node.addr,
            &format!("/registry/{route}"),
            Some(&f.token),
            &padded,
        );
        assert_eq!(error_of(&r), (413, "body too large".into()), "{route}");
    }

    // Another worker's value at the advertise URL voids the registration.
    worker.set_mode(Mode::WrongValue);
    let r = f.heartbeat(&worker, &session, json!({}));
    assert_eq!(
        (r.status, r.json()),
        (
            409,
            json!({"error": "registration voided: challenge value mismatch on the advertise URL", "reregister": true})
        )
    );
    assert!(f.session_record(&session).is_none());
    assert!(
        (0..4)
            .all(|b| f.bucket_record(b, &session).is_none()
                && !f.in_ns_list(b, "/threads", &session))
    );
    worker.set_mode(Mode::Honest);
    assert_eq!(f.heartbeat(&worker, &session, json!({})).status, 409);
}

/// A worker whose heartbeats are refused 401 or 403 keeps sending them: the node says so once
/// per credential (401, and the 403s of the credential itself: its body is not read before it
/// passes) or per session (the 403s of a credential that may not keep the session), at warn,
/// with the reason.
#[test]
fn a_refused_heartbeat_is_logged_once_with_its_reason() {
    let f = Fixture::new(&[]);
    let worker = TestWorker::start("s");
    let session = f.registered(&worker, "c");
    let heartbeat = |token: &str| {
        let (challenge, value) = worker.challenge();
        let body = json!({"sessionId": session, "headroom": 1, "draining": false,
                          "challenge": challenge, "challengeValue": value});
        f.post("heartbeat", token, &body).status
    };
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
    header.typ = Some("JWT".into());
    let key = jsonwebtoken::EncodingKey::from_secret(support::node::SECRET.as_bytes()).unwrap();
    let expired = jsonwebtoken::encode(
        &header,
        &json!({"sub": "acct-a", "scope": "pinboard:worker", "exp": 1_000_000_000,
                "pinboard": {"namespaces": ["*"], "allowedBackendHosts": ["127.0.0.1"]}}),
        &key,
    )
    .unwrap();
    let operator = token("acct-a", &["pinboard:operator"], &["*"]);
    let other_account = f.node.worker_token("acct-b");
    for _ in 0..3 {
        assert_eq!(heartbeat(&expired), 401);
        assert_eq!(heartbeat(&operator), 403);
        assert_eq!(heartbeat(&other_account), 403);
    }
    assert_eq!(heartbeat(&f.token), 200);
    let log = f.node.log();
    let said = f.node.log_lines("heartbeat refused");
    assert_eq!(said.len(), 3, "{log}");
    assert!(said.iter().all(|l| l.contains("WARN")), "{log}");
    let line = |what: &str| {
        said.iter()
            .find(|l| l.contains(what))
            .unwrap_or_else(|| panic!("{what}: {log}"))
    };
    assert!(line("expired").contains("status=401"), "{log}");
    assert!(
        line("lacks the scope pinboard:worker").contains("sub=acct-a"),
        "{log}"
    );
    let other = line("another account");
    assert!(
        other.contains("status=403")
            && other.contains("sub=acct-b")
            && other.contains(&format!("session={session}")),
        "{other}"
    );
}

#[test]
fn lease_expiry_end_to_end() {
    let f = Fixture::new(&[("PINBOARD_LEASE_TTL_MS", "1000")]);
    let worker = TestWorker::start("s");
    let dead = f.registered(&worker, "quiet");
    assert_eq!(f.heartbeat(&worker, &dead, json!({})).status, 200);
    // It stops heartbeating: dead once its lease runs out ...
    std::thread::sleep(Duration::from_millis(1100));
    let r = f.heartbeat(&worker, &dead, json!({}));
    assert_eq!(
        (r.status, r.json()["reregister"].clone()),
        (409, json!(true))
    );
    assert!(f.session_record(&dead).is_some(), "dead, not yet pruned");
    // ... and pruned, records and namespace lists, by the next register past TTL + lease.
    std::thread::sleep(Duration::from_millis(1000));
    let other = TestWorker::start("t");
    f.registered(&other, "fresh");
    assert!(f.session_record(&dead).is_none());
    for bucket in 0..4 {
        assert!(f.bucket_record(bucket, &dead).is_none());
        assert!(!f.in_ns_list(bucket, "/threads", &dead) && !f.in_ns_list(bucket, "/docs", &dead));
    }
}

#[test]
fn release_is_compare_and_delete() {
    let f = Fixture::new(&[]);
    let worker = TestWorker::start("s");
    let session = f.registered(&worker, "c");
    f.put_row(
        "/threads",
        "t1",
        json!({"sessionId": session, "epoch": "5"}),
    );
    f.put_row("/threads", "t2", json!({"sessionId": session}));
    f.put_row(
        "/docs",
        "d1",
        json!({"sessionId": "someone-else", "epoch": "5"}),
    );

    let release = |rows: Value| f.post("release", &f.token, &rows);
    let one = |ns: &str, id: &str, epoch: Option<&str>| {
        let mut row = json!({"sessionId": session, "namespace": ns, "id": id});
        if let Some(e) = epoch {
            row["epoch"] = json!(e);
        }
        row
    };
    assert_eq!(
        release(json!([one("/threads", "t1", Some("4"))])).json(),
        json!({"released": 0})
    );
    assert_eq!(
        release(json!([one("/threads", "t1", None)])).json(),
        json!({"released": 0})
    );
    assert!(f.row("/threads", "t1").is_some());
    let r = release(json!([
        one("/threads", "t1", Some("5")),
        one("/threads", "t2", None),
        one("/docs", "d1", Some("5")),
        one("/docs", "none", None)
    ]));
    assert_eq!(r.json(), json!({"released": 2}));
    assert!(f.row("/threads", "t1").is_none() && f.row("/threads", "t2").is_none());
    assert!(
        f.row("/docs", "d1").is_some(),
        "another session's row stays"
    );

    f.put_row(
        "/threads",
        "t3",
        json!({"sessionId": session, "epoch": "9"}),
    );
    let mut unknown = one("/threads", "t3", Some("9"));
    unknown["sessionId"] = json!("nobody");
    assert_eq!(
        (release(json!([one("/threads", "t3", Some("9")), unknown])).status),
        409
    );
    assert!(
        f.row("/threads", "t3").is_some(),
        "a refused request releases nothing"
    );
    assert_eq!(
        error_of(&release(json!([one("threads", "t3", Some("9"))]))),
        (400, "invalid namespace".into())
    );
    assert_eq!(
        error_of(&release(json!([one("/misc", "t3", Some("9"))]))),
        (400, "namespace not registered: /misc".into())
    );
    let other = f.node.worker_token("acct-b");
    assert_eq!(
        error_of(&f.post(
            "release",
            &other,
            &json!([one("/threads", "t3", Some("9"))])
        )),
        (403, "forbidden".into())
    );
    let narrow = token("acct-a", &["pinboard:worker"], &["/docs"]);
    assert_eq!(
        error_of(&f.post(
            "release",
            &narrow,
            &json!([one("/threads", "t3", Some("9"))])
        )),
        (403, "namespace not allowed: /threads".into())
    );
    for bad in [
        json!([]),
        json!({}),
        json!([one("/threads", "t3", Some("9a"))]),
    ] {
        assert_eq!(release(bad.clone()).status, 400, "{bad}");
    }
    assert_eq!(
        release(json!([one("/threads", "t3", Some("9"))])).json(),
        json!({"released": 1})
    );

    // Release skips the expiry check: a lapsed (not yet pruned) session may still give back.
    let f2 = Fixture::new(&[("PINBOARD_LEASE_TTL_MS", "1000")]);
    let w2 = TestWorker::start("s2");
    let lapsed = f2.registered(&w2, "c2");
    f2.put_row("/threads", "x", json!({"sessionId": lapsed, "epoch": "1"}));
    std::thread::sleep(Duration::from_millis(1100));
    let rows = json!([{"sessionId": lapsed, "namespace": "/threads", "id": "x", "epoch": "1"}]);
    assert_eq!(
        f2.post("release", &f2.token, &rows).json(),
        json!({"released": 1})
    );
}

#[test]
fn tag_is_compare_and_set_and_survives_reclaim() {
    let f = Fixture::new(&[]);
    let worker = TestWorker::start("s");
    let session = f.registered(&worker, "c");
    f.put_row(
        "/threads",
        "t1",
        json!({"sessionId": session, "epoch": "5"}),
    );
    let tag = |epoch: &str, tag: &str| {
        f.post("tag", &f.token, &json!({"sessionId": session, "namespace": "/threads", "id": "t1", "epoch": epoch, "tag": tag}))
    };
    assert_eq!(tag("4", "ws:W").json(), json!({"tagged": false}));
    assert_eq!(tag("5", "ws:W").json(), json!({"tagged": true}));
    assert_eq!(f.row("/threads", "t1").unwrap()["tag"], "ws:W");
    assert_eq!(tag("5", "").status, 400);
    assert_eq!(tag("5", &"x".repeat(257)).status, 400);
    assert_eq!(
        tag("5", &"é".repeat(256)).status,
        200,
        "256 characters, not bytes"
    );
    assert_eq!(tag("5", "ws:W").status, 200);
    let r = f.post("tag", &f.token, &json!({"sessionId": "nobody", "namespace": "/threads", "id": "t1", "epoch": "5", "tag": "t"}));
    assert_eq!(
        (r.status, r.json()),
        (409, json!({"error": "unknown session", "reregister": true}))
    );

    let other = f.node.worker_token("acct-b");
    let body = json!({"sessionId": session, "namespace": "/threads", "id": "t1", "epoch": "5", "tag": "t"});
    assert_eq!(
        error_of(&f.post("tag", &other, &body)),
        (403, "forbidden".into())
    );
    let narrow = token("acct-a", &["pinboard:worker"], &["/docs"]);
    assert_eq!(
        error_of(&f.post("tag", &narrow, &body)),
        (403, "namespace not allowed: /threads".into())
    );
    let mut bad_ns = body.clone();
    bad_ns["namespace"] = json!("/no/pe");
    assert_eq!(
        error_of(&f.post("tag", &f.token, &bad_ns)),
        (400, "invalid namespace".into())
    );
    bad_ns["namespace"] = json!("/misc");
    assert_eq!(
        error_of(&f.post("tag", &f.token, &bad_ns)),
        (400, "namespace not registered: /misc".into())
    );

    // Re-registering with prevSessionId reclaims the row, keeping epoch and tag.
    let body = f.register_body(
        &worker,
        "c",
        json!({"prevSessionId": session, "instances": {"/threads": ["t1", "t9"]}}),
    );
    let r = f.post("register", &f.token, &body);
    assert_eq!(r.status, 200, "{}", r.text());
    let new_session = r.json()["sessionId"].as_str().unwrap().to_string();
    assert_eq!(
        r.json()["duplicates"],
        json!([{"ns": "/threads", "id": "t9"}])
    );
    assert_eq!(
        f.row("/threads", "t1").unwrap(),
        json!({"sessionId": new_session, "epoch": "5", "tag": "ws:W"})
    );
}

#[test]
fn reclaim_rebinds_only_rows_of_the_previous_session_and_requeues_wind_downs() {
    let f = Fixture::new(&[]);
    let worker = TestWorker::start("s");
    let old = f.registered(&worker, "c");
    let wind_down_at = 4_000_000_000_000u64;
    f.put_row("/threads", "mine", json!({"sessionId": old, "epoch": "7"}));
    f.put_row(
        "/threads",
        "winding",
        json!({"sessionId": old, "epoch": "8", "expiry": wind_down_at}),
    );
    f.put_row(
        "/docs",
        "theirs",
        json!({"sessionId": "someone-else", "epoch": "3"}),
    );

    let body = f.register_body(
        &worker,
        "c",
        json!({
            "prevSessionId": old,
            "instances": {"/threads": ["mine", "winding", "gone"], "/docs": ["theirs"]}
        }),
    );
    let r = f.post("register", &f.token, &body);
    assert_eq!(r.status, 200, "{}", r.text());
    let answer = r.json();
    let new = answer["sessionId"].as_str().unwrap();
    let mut duplicates: Vec<Value> = answer["duplicates"].as_array().unwrap().clone();
    duplicates.sort_by_key(|d| d["id"].as_str().unwrap().to_string());
    assert_eq!(
        duplicates,
        vec![
            json!({"ns": "/threads", "id": "gone"}),
            json!({"ns": "/docs", "id": "theirs"})
        ]
    );
    assert_eq!(
        f.row("/threads", "mine").unwrap(),
        json!({"sessionId": new, "epoch": "7"})
    );
    assert_eq!(
        f.row("/docs", "theirs").unwrap()["sessionId"],
        "someone-else"
    );

    // The wind-down follows the row to the new session and is re-delivered until acked.
    let r = f.heartbeat(&worker, new, json!({}));
    let messages = r.json()["messages"].clone();
    assert_eq!(messages.as_array().unwrap().len(), 1, "{}", r.text());
    let m = &messages[0];
    assert_eq!(
        (m["type"].as_str(), m["ns"].as_str(), m["id"].as_str()),
        (Some("wind_down"), Some("/threads"), Some("winding"))
    );
    let deadline = m["deadline"].as_u64().unwrap();
    assert!(
        deadline > 1_000_000 && deadline <= wind_down_at / 1000,
        "relative seconds: {deadline}"
    );
    let again = f.heartbeat(&worker, new, json!({}));
    assert_eq!(again.json()["messages"][0]["msgId"], m["msgId"]);
    let acked = f.heartbeat(&worker, new, json!({"acks": [m["msgId"].clone()]}));
    assert!(acked.json().get("messages").is_none(), "{}", acked.text());
    let ttl: i64 = f.cli(&["PTTL", &f.keys.control(new)]).parse().unwrap();
    assert_eq!(ttl, -2, "an emptied queue is gone");
}

#[test]
fn deregister_drops_the_session() {
    let f = Fixture::new(&[]);
    let worker = TestWorker::start("s");
    let session = f.registered(&worker, "c");
    f.put_row(
        "/threads",
        "t1",
        json!({"sessionId": session, "epoch": "1"}),
    );
    let other = f.node.worker_token("acct-b");
    assert_eq!(
        error_of(&f.post("deregister", &other, &json!({"sessionId": session}))),
        (403, "forbidden".into())
    );
    let r = f.post("deregister", &f.token, &json!({"sessionId": session}));
    assert_eq!((r.status, r.json()), (200, json!({})));
    assert!(f.session_record(&session).is_none());
    assert!(
        (0..4)
            .all(|b| f.bucket_record(b, &session).is_none()
                && !f.in_ns_list(b, "/threads", &session))
    );
    assert!(
        f.row("/threads", "t1").is_some(),
        "placements are left to dead-owner eviction"
    );
    let r = f.post("deregister", &f.token, &json!({"sessionId": session}));
    assert_eq!(
        (r.status, r.json()),
        (409, json!({"error": "unknown session", "reregister": true}))
    );
    assert_eq!(
        error_of(&f.post("deregister", &f.token, &json!({"session": 1}))),
        (400, "expected {sessionId}".into())
    );
}

#[test]
fn unknown_routes_and_methods() {
    let f = Fixture::new(&[]);
    let r = support::http::get(f.node.addr, "/registry/register", Some(&f.token));
    assert_eq!((r.status, r.header("allow")), (405, Some("POST")));
    let r = post_json(f.node.addr, "/registry/nope", Some(&f.token), "{}");
    assert_eq!(error_of(&r), (404, "not found".into()));
}

/// A credential of account `acct-a` with `scope`, restricted to `hostnames` and `envs`.
fn hostname_token(scope: &str, hostnames: &[&str], envs: &[&str]) -> String {
    pinboard::passport::mint(
        support::node::SECRET,
        &pinboard::passport::TokenRequest {
            sub: "acct-a".into(),
            scopes: vec![scope.into()],
            namespaces: vec!["*".into()],
            backend_hosts: vec!["127.0.0.1".into()],
            hostnames: hostnames.iter().map(|s| s.to_string()).collect(),
            envs: envs.iter().map(|s| s.to_string()).collect(),
            ttl_secs: 60,
            ..Default::default()
        },
    )
    .unwrap()
}

#[test]
fn hostname_aware_fields_bindings_and_supersession() {
    let f = Fixture::new(&[("PINBOARD_HOSTNAME_AWARE", "true")]);
    let worker = TestWorker::start("s");
    let one_ns = |extra: Value| {
        let mut e = json!({"namespaces": ["/threads"]});
        for (k, v) in extra.as_object().unwrap() {
            e[k] = v.clone();
        }
        e
    };
    assert_eq!(
        error_of(&f.register(&worker, "c0", json!({}))),
        (400, "hostname is required in hostname-aware mode".into())
    );
    assert_eq!(
        error_of(&f.register(&worker, "c0", json!({"hostname": "a:b"}))),
        (400, "invalid hostname: a:b".into())
    );
    assert_eq!(
        error_of(&f.register(&worker, "c0", json!({"hostname": "h", "env": "e/1"}))),
        (400, "invalid env: e/1".into())
    );
    assert_eq!(
        error_of(&f.register(
            &worker,
            "c0",
            json!({"hostname": "h", "envs": {"/threads": "*"}})
        )),
        (400, "invalid env: *".into())
    );
    assert_eq!(
        error_of(&f.register(
            &worker,
            "c0",
            json!({"hostname": "h", "envs": {"/nope": "e"}})
        )),
        (400, "namespace not registered: /nope".into())
    );
    let r = f.register(
        &worker,
        "c0",
        json!({"hostname": "h", "takeover": "sideways"}),
    );
    assert!(error_of(&r).1.starts_with("expected {"), "{}", r.text());

    let body = f.register_body(&worker, "c0", json!({"hostname": "h9"}));
    assert_eq!(
        error_of(&f.post(
            "register",
            &hostname_token("pinboard:worker", &["h1"], &[]),
            &body
        )),
        (403, "hostname not allowed: h9".into())
    );
    let body = f.register_body(&worker, "c0", json!({"hostname": "h1", "env": "e5"}));
    assert_eq!(
        error_of(&f.post(
            "register",
            &hostname_token("pinboard:worker", &["h1"], &["e1"]),
            &body
        )),
        (403, "env not allowed: e5".into())
    );

    // First come: hostname lowercased, env defaults to it, bindings written.
    let r = f.register(
        &worker,
        "c1",
        one_ns(json!({"hostname": "H1", "env": "e1"})),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let first = r.json()["sessionId"].as_str().unwrap().to_string();
    assert_eq!(f.session_record(&first).unwrap()["hostname"], "h1");
    assert!(f.in_ns_list(0, "h1/threads", &first));
    assert_eq!(
        serde_json::from_str::<Value>(&f.cli(&["HGET", f.keys.bind_hosts(), "h1/threads"]))
            .unwrap(),
        json!({"env": "e1", "epoch": "0"})
    );
    assert_eq!(
        serde_json::from_str::<Value>(&f.cli(&["HGET", f.keys.bind_envs(), "e1"])).unwrap(),
        json!({"takeover": "wind_down", "epoch": "0"})
    );
    let same_env = f.register(
        &worker,
        "c1b",
        one_ns(json!({"hostname": "h1", "env": "e1"})),
    );
    assert_eq!(
        same_env.status, 200,
        "another worker of the same env joins freely"
    );

    // Another env for the same (hostname, ns) needs a higher epoch.
    let r = f.register(
        &worker,
        "c2",
        one_ns(json!({"hostname": "h1", "env": "e2"})),
    );
    assert_eq!(
        error_of(&r),
        (409, "hostname h1/threads is bound to env e1 at epoch 0, not e2 — register with a higher epoch to displace".into())
    );
    let r = f.register(
        &worker,
        "c2",
        one_ns(json!({"hostname": "h1", "env": "e2", "epoch": 1})),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let until: u64 = f
        .cli(&["HGET", f.keys.bind_quarantine(), "h1/threads"])
        .parse()
        .unwrap();
    assert!(
        until > 0,
        "the displaced (hostname, ns) is quarantined for a lease"
    );

    // The displaced worker hears it on its next heartbeat, and its records go.
    let r = f.heartbeat(&worker, &first, json!({}));
    assert_eq!(
        (r.status, r.json()),
        (
            409,
            json!({"error": "registration superseded: h1/threads now bound to env e2 at epoch 1", "superseded": true})
        )
    );
    assert!(f.session_record(&first).is_none() && !f.in_ns_list(0, "h1/threads", &first));

    // Env takeover agreements conflict the same way.
    let r = f.register(
        &worker,
        "c3",
        one_ns(json!({"hostname": "h2", "env": "e2", "takeover": "deny"})),
    );
    assert_eq!(
        error_of(&r),
        (409, "env e2 agreed takeover wind_down at epoch 1, not deny — register with a higher epoch to displace".into())
    );
    let r = f.register(
        &worker,
        "c3",
        one_ns(json!({"hostname": "h2", "env": "e2", "takeover": "deny", "epoch": 2})),
    );
    assert_eq!(r.status, 200, "{}", r.text());

    // The overview shows the bindings and groups the serving sessions per (hostname, env, ns).
    let ops = token("ops", &["pinboard:operator"], &["*"]);
    let overview =
        support::http::get(f.node.addr, "/registry/overview?ns=/threads", Some(&ops)).json();
    assert_eq!(
        overview["bindings"]["hostnames"]["h1/threads"], "e2",
        "{overview}"
    );
    assert_eq!(
        overview["bindings"]["hostnames"]["h2/threads"], "e2",
        "{overview}"
    );
    assert_eq!(overview["bindings"]["envs"]["e2"], "deny", "{overview}");
    let groups: Vec<(String, String)> = overview["namespaces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            (
                g["hostname"].as_str().unwrap().to_string(),
                g["env"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert!(
        groups.contains(&("h2".to_string(), "e2".to_string())),
        "{groups:?}"
    );
    let only_h1 = hostname_token("pinboard:operator", &["h1"], &[]);
    let scoped = support::http::get(f.node.addr, "/registry/overview", Some(&only_h1)).json();
    assert!(
        scoped["workers"]
            .as_array()
            .unwrap()
            .iter()
            .all(|w| w["hostname"] == "h1"),
        "{scoped}"
    );
    assert!(
        scoped["bindings"]["hostnames"].get("h2/threads").is_none(),
        "{scoped}"
    );
}

/// Reads every key of the layout and checks the registry's invariants: each namespace list
/// names only sessions with a copy in that bucket, each copy belongs to a session the registry
/// has, each client maps to a stored session, and no placement row names an unknown session.
fn assert_consistent(f: &Fixture) {
    let sessions: std::collections::BTreeSet<String> = f
        .cli(&["HKEYS", f.keys.sessions()])
        .lines()
        .map(str::to_owned)
        .collect();
    for bucket in 0..4 {
        // A dropped session's tombstone is no copy.
        let copies = f.live_copies(bucket);
        assert!(
            copies.is_subset(&sessions),
            "bucket {bucket} copies {copies:?} vs sessions {sessions:?}"
        );
        for list in f.cli(&["KEYS", &f.keys.nsw_named(bucket, "*")]).lines() {
            for member in f.cli(&["SMEMBERS", list]).lines() {
                assert!(
                    copies.contains(member),
                    "{list} names {member} without a copy"
                );
            }
        }
        for placements in f
            .cli(&["KEYS", &f.keys.placements(bucket, "*", "*")])
            .lines()
        {
            let all = f.cli(&["HGETALL", placements]);
            for raw in all.lines().skip(1).step_by(2) {
                let row: Value = serde_json::from_str(raw).unwrap();
                assert!(
                    sessions.contains(row["sessionId"].as_str().unwrap()),
                    "{placements}: {row} owned by an unknown session"
                );
            }
        }
    }
    for raw in f.cli(&["HVALS", f.keys.clients()]).lines() {
        let client: Value = serde_json::from_str(raw).unwrap();
        assert!(
            sessions.contains(client["sessionId"].as_str().unwrap()),
            "client {client} maps to no session"
        );
    }
}

#[test]
fn concurrent_workers_leave_redis_consistent() {
    let f = Fixture::new(&[]);
    let rounds = 8;
    std::thread::scope(|scope| {
        for w in 0..6 {
            let f = &f;
            scope.spawn(move || {
                let worker = TestWorker::start(&format!("secret-{w}"));
                let client = format!("client-{w}");
                let mut session = f.registered(&worker, &client);
                for round in 0..rounds {
                    let id = format!("w{w}-r{round}");
                    f.put_row("/threads", &id, json!({"sessionId": session, "epoch": round.to_string()}));
                    assert_eq!(f.heartbeat(&worker, &session, json!({"headroom": round})).status, 200);
                    if round % 3 == 2 {
                        // Re-register, reclaiming the row still held.
                        let body = f.register_body(&worker, &client, json!({"prevSessionId": session, "instances": {"/threads": [id]}}));
                        let r = f.post("register", &f.token, &body);
                        assert_eq!(r.status, 200, "{}", r.text());
                        session = r.json()["sessionId"].as_str().unwrap().to_string();
                        assert!(r.json().get("duplicates").is_none(), "{}", r.text());
                    }
                    let rows = json!([{"sessionId": session, "namespace": "/threads", "id": id, "epoch": round.to_string()}]);
                    assert_eq!(f.post("release", &f.token, &rows).json(), json!({"released": 1}));
                }
                if w % 2 == 0 {
                    assert_eq!(f.post("deregister", &f.token, &json!({"sessionId": session})).status, 200);
                }
            });
        }
    });
    assert_consistent(&f);
    assert_eq!(f.cli(&["HLEN", f.keys.sessions()]), "3");
    for bucket in 0..4 {
        assert_eq!(f.live_copies(bucket).len(), 3, "bucket {bucket}");
    }
}

/// The last step of a heartbeat (renewing the bucket copies) can land after a deregister,
/// a voided or a replacing registration removed them. That interleaving is too narrow to hit
/// from outside, so the test stages its end state: the copy is dropped (the tombstone a drop
/// leaves, out of its lists), the heartbeat arrives.
#[test]
fn a_heartbeat_never_recreates_a_dropped_copy() {
    let f = Fixture::new(&[]);
    let worker = TestWorker::start("s");
    let session = f.registered(&worker, "racer");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    let tombstone = json!({"expiry": now as u64, "dropped": true}).to_string();
    f.cli(&["HSET", &f.keys.bucket(1).workers, &session, &tombstone]);
    f.cli(&["SREM", &f.keys.nsw(1, "", "/threads"), &session]);
    assert_eq!(f.heartbeat(&worker, &session, json!({})).status, 200);
    assert!(f.bucket_record(1, &session).is_none() && !f.in_ns_list(1, "/threads", &session));
    assert!(f.bucket_record(0, &session).is_some() && f.in_ns_list(0, "/threads", &session));
    // A real drop leaves that tombstone: a deregister, then the stale heartbeat's renew.
    assert_eq!(
        f.post("deregister", &f.token, &json!({"sessionId": session}))
            .status,
        200
    );
    assert!((0..4).all(|b| f.bucket_record(b, &session).is_none()));
    assert!(
        f.cli(&["HGET", &f.keys.bucket(2).workers, &session])
            .contains("dropped")
    );
}

/// Issue 10, item 4: a bucket that lost its keys (its worker copies and namespace lists
/// deleted, as by a failover that lost writes) heals at the workers' next heartbeat, and every
/// id placed there is served again by its owner at its epoch.
#[test]
fn a_bucket_that_lost_its_keys_heals_at_the_next_heartbeat() {
    let f = Fixture::new(&[]);
    f.warm();
    let worker = TestWorker::start("s");
    let session = f.registered(&worker, "healer");
    let ids: Vec<String> = (0..40)
        .map(|i| format!("heal-{i}"))
        .filter(|id| pinboard::store::bucket_of(id, 4) == 1)
        .collect();
    assert!(ids.len() >= 3, "{ids:?}");
    let get = |id: &str| support::http::get(f.node.addr, &format!("/threads/{id}"), None);
    for id in &ids {
        assert_eq!(get(id).status, 200);
    }
    let rows: Vec<Value> = ids
        .iter()
        .map(|id| f.row("/threads", id).unwrap())
        .collect();

    f.cli(&["DEL", &f.keys.bucket(1).workers, &f.keys.bucket(1).alive]);
    for ns in ["/threads", "/docs"] {
        f.cli(&["DEL", &f.keys.nsw(1, "", ns)]);
    }
    let lost = get(&ids[0]);
    assert_eq!(lost.status, 404, "{}", lost.text());
    assert_eq!(lost.json(), json!({"error": "unknown namespace"}));

    assert_eq!(f.heartbeat(&worker, &session, json!({})).status, 200);
    assert!(f.bucket_record(1, &session).is_some());
    assert!(f.in_ns_list(1, "/threads", &session) && f.in_ns_list(1, "/docs", &session));
    for (id, row) in ids.iter().zip(&rows) {
        assert_eq!(get(id).status, 200, "{id}");
        assert_eq!(
            f.row("/threads", id).as_ref(),
            Some(row),
            "{id}: same owner, same epoch"
        );
    }
    assert!(
        f.node.log().contains("worker copy restored"),
        "{}",
        f.node.log()
    );
}

#[test]
fn operator_drain_and_undrain() {
    let f = Fixture::new(&[]);
    let worker = TestWorker::start("s");
    let session = f.registered(&worker, "drained-client");
    let ops = token("ops", &["pinboard:operator"], &["*"]);
    let drain = |token: &str, body: Value| f.post("drain", token, &body);

    // A cordon: draining from the next heartbeat on, with no deadline and no TTL.
    let r = drain(
        &ops,
        json!({"clientId": "drained-client", "deadline": null}),
    );
    assert_eq!((r.status, r.json()), (200, json!({"drained": true})));
    assert_eq!(f.cli(&["PTTL", &f.keys.drain("drained-client")]), "-1");
    let beat = f.heartbeat(&worker, &session, json!({}));
    assert_eq!(beat.json(), json!({"expiresInMs": 15000, "draining": true}));
    assert_eq!(f.bucket_record(0, &session).unwrap()["draining"], true);

    let undrain = |token: &str| f.post("undrain", token, &json!({"clientId": "drained-client"}));
    assert_eq!(undrain(&ops).json(), json!({"revoked": true}));
    assert_eq!(undrain(&ops).json(), json!({"revoked": false}));
    assert_eq!(
        f.heartbeat(&worker, &session, json!({})).json()["draining"],
        false
    );

    // A timed drain: at least a lease away, it bounds the lease and shows as drainDeadline.
    let r = drain(&ops, json!({"clientId": "drained-client", "deadline": 0}));
    assert_eq!(r.status, 200);
    let ttl: u64 = f
        .cli(&["PTTL", &f.keys.drain("drained-client")])
        .parse()
        .unwrap();
    let week = 7 * 24 * 3600 * 1000;
    assert!(ttl > week && ttl <= week + 15_000, "{ttl}");
    let beat = f.heartbeat(&worker, &session, json!({})).json();
    assert_eq!(beat["draining"], true);
    let left = beat["drainDeadline"].as_u64().unwrap();
    assert!((14..=15).contains(&left), "{left}");
    let record = f.session_record(&session).unwrap();
    let deadline: Value =
        serde_json::from_str(&f.cli(&["GET", &f.keys.drain("drained-client")])).unwrap();
    assert_eq!(
        record["expiry"], deadline["deadline"],
        "the lease is bounded by the drain"
    );

    // Refusals: unknown or out-of-scope clients, the wrong scope, a bad body.
    let refusal = |r: Reply| {
        (
            r.status,
            r.json()["error"].as_str().unwrap_or_default().to_string(),
        )
    };
    assert_eq!(
        refusal(drain(&ops, json!({"clientId": "nobody", "deadline": null}))),
        (403, "forbidden".into())
    );
    let narrow = token("ops", &["pinboard:operator"], &["/docs"]);
    assert_eq!(
        refusal(drain(
            &narrow,
            json!({"clientId": "drained-client", "deadline": null})
        )),
        (403, "forbidden".into())
    );
    assert_eq!(
        refusal(f.post("undrain", &narrow, &json!({"clientId": "drained-client"}))),
        (403, "forbidden".into())
    );
    assert_eq!(
        refusal(drain(
            &f.token,
            json!({"clientId": "drained-client", "deadline": null})
        )),
        (403, "forbidden".into())
    );
    let r = drain(
        &ops,
        json!({"clientId": "drained-client", "deadline": "soon"}),
    );
    assert_eq!(
        refusal(r),
        (400, "expected {clientId, deadline: seconds | null}".into())
    );
    let r = drain(&ops, json!({"clientId": "drained-client", "deadline": -5}));
    assert_eq!(r.status, 400);
}

/// The (first) log line of `message`, once the log has it.
fn log_line(f: &Fixture, message: &str) -> String {
    f.node.logs(message);
    f.node.log_lines(message).swap_remove(0)
}

/// Spec: draining is "the worker's own flag OR an operator drain". The views and the draining
/// gauge show an operator drain at once, before the worker's next heartbeat, and a timed one
/// with its deadline. Each operator act is one `info` line, each refusal one `warn` line, both
/// naming the credential's subject.
#[test]
fn an_operator_drain_shows_in_the_views_and_the_gauge_and_the_log() {
    let f = Fixture::new(&[("PINBOARD_LEASE_TTL_MS", "3000")]);
    let worker = TestWorker::start("cordoned");
    let session = f.registered(&worker, "w2");
    let ops = token("ops-alice", &["pinboard:operator"], &["*"]);
    let listed = |view: &str| {
        let r = support::http::get(f.node.addr, view, Some(&ops)).json();
        r["workers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|w| w["sessionId"] == session.as_str())
            .unwrap()
            .clone()
    };
    let gauge = "pinboard_fleet_workers{namespace=\"/threads\",state=\"draining\"}";
    let draining_gauge = || {
        let r = support::http::get(f.node.addr, "/metrics", Some(&ops));
        r.text()
            .lines()
            .find_map(|l| l.strip_prefix(gauge)?.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    assert_eq!(listed("/registry/workers")["draining"], false);

    let r = f.post("drain", &ops, &json!({"clientId": "w2", "deadline": null}));
    assert_eq!(r.status, 200);
    for view in ["/registry/workers", "/registry/overview"] {
        let entry = listed(view);
        assert_eq!(entry["draining"], true, "{view}: {entry}");
        assert!(
            entry.get("drain").is_none(),
            "a cordon has no deadline: {entry}"
        );
    }
    assert!(
        support::node::eventually(Duration::from_secs(8), || draining_gauge() == 1),
        "{}",
        f.node.log()
    );
    let line = log_line(&f, "operator drain");
    assert!(
        line.contains("INFO")
            && line.contains("sub=ops-alice")
            && line.contains("clientId=w2")
            && line.contains("deadline=null"),
        "{line}"
    );

    // Timed: the deadline shows, in epoch ms like the stored drain's.
    f.post("drain", &ops, &json!({"clientId": "w2", "deadline": 60}));
    let stored: Value = serde_json::from_str(&f.cli(&["GET", &f.keys.drain("w2")])).unwrap();
    let entry = listed("/registry/workers");
    assert_eq!(entry["draining"], true);
    assert_eq!(entry["drain"], json!({"deadline": stored["deadline"]}));
    assert!(f.node.log().contains("deadline=60"), "{}", f.node.log());

    let r = f.post("undrain", &ops, &json!({"clientId": "w2"}));
    assert_eq!(r.json(), json!({"revoked": true}));
    assert_eq!(listed("/registry/workers")["draining"], false);
    assert!(support::node::eventually(
        Duration::from_secs(8),
        || draining_gauge() == 0
    ));
    let line = log_line(&f, "operator undrain");
    assert!(
        line.contains("sub=ops-alice") && line.contains("revoked=true"),
        "{line}"
    );

    // A wind-down is one line; so is each refusal, at warn.
    let r = f.post(
        "wind_down",
        &ops,
        &json!({"namespace": "/threads", "id": "t9", "deadline": 5}),
    );
    assert_eq!(r.json(), json!({"queued": false}));
    let line = log_line(&f, "operator wind_down");
    assert!(
        line.contains("INFO") && line.contains("sub=ops-alice") && line.contains("id=t9"),
        "{line}"
    );
    let r = f.post(
        "drain",
        &ops,
        &json!({"clientId": "nobody", "deadline": null}),
    );
    assert_eq!(r.status, 403);
    let line = log_line(&f, "operator drain refused");
    assert!(
        line.contains("WARN")
            && line.contains("sub=ops-alice")
            && line.contains("about=nobody")
            && line.contains("status=403")
            && line.contains("error=forbidden"),
        "{line}"
    );
    let r = f.register(&worker, "w3", json!({"namespaces": ["threads"]}));
    assert_eq!(r.status, 400);
    let line = log_line(&f, "registration refused");
    assert!(
        line.contains("WARN") && line.contains("sub=acct-a") && line.contains("about=w3"),
        "{line}"
    );
    let r = f.post("schedule", &f.token, &json!([]));
    assert_eq!(r.status, 400);
    let line = log_line(&f, "schedule refused");
    assert!(
        line.contains("WARN") && line.contains("sub=acct-a"),
        "{line}"
    );
    assert_eq!(
        f.node.log().matches("refused").count(),
        3,
        "one line a refusal: {}",
        f.node.log()
    );
}

#[test]
fn operator_wind_down() {
    let f = Fixture::new(&[]);
    let worker = TestWorker::start("s");
    let session = f.registered(&worker, "c");
    let ops = token("ops", &["pinboard:operator"], &["*"]);
    f.put_row(
        "/threads",
        "t1",
        json!({"sessionId": session, "epoch": "5", "tag": "keep"}),
    );
    let wind = |token: &str, body: Value| f.post("wind_down", token, &body);

    let r = wind(
        &ops,
        json!({"namespace": "/threads", "id": "t1", "deadline": 60}),
    );
    assert_eq!((r.status, r.json()), (200, json!({"queued": true})));
    let row = f.row("/threads", "t1").unwrap();
    assert_eq!(
        (row["epoch"].as_str(), row["tag"].as_str()),
        (Some("5"), Some("keep")),
        "the fence keeps the row"
    );
    let fence = row["expiry"].as_u64().unwrap();
    let beat = f.heartbeat(&worker, &session, json!({})).json();
    let m = &beat["messages"][0];
    assert_eq!(
        (m["type"].as_str(), m["ns"].as_str(), m["id"].as_str()),
        (Some("wind_down"), Some("/threads"), Some("t1"))
    );
    assert!(
        (59..=60).contains(&m["deadline"].as_u64().unwrap()),
        "{beat}"
    );

    // null clears the fence, and the owner hears the revocation.
    let r = wind(
        &ops,
        json!({"namespace": "/threads", "id": "t1", "deadline": null}),
    );
    assert_eq!(r.json(), json!({"queued": true}));
    assert!(f.row("/threads", "t1").unwrap().get("expiry").is_none());
    let beat = f
        .heartbeat(&worker, &session, json!({"acks": [m["msgId"].clone()]}))
        .json();
    assert_eq!(beat["messages"].as_array().unwrap().len(), 1, "{beat}");
    assert!(beat["messages"][0]["deadline"].is_null(), "{beat}");

    // A short deadline still fences for at least a lease; no row: nothing queued.
    wind(
        &ops,
        json!({"namespace": "/threads", "id": "t1", "deadline": 1}),
    );
    assert!(
        f.row("/threads", "t1").unwrap()["expiry"].as_u64().unwrap() >= fence - 60_000 + 14_000
    );
    assert_eq!(
        wind(
            &ops,
            json!({"namespace": "/threads", "id": "none", "deadline": 5})
        )
        .json(),
        json!({"queued": false})
    );

    // Without an id: every placement of the namespace.
    f.put_row("/docs", "d1", json!({"sessionId": session, "epoch": "1"}));
    f.put_row("/docs", "d2", json!({"sessionId": session, "epoch": "2"}));
    f.put_row(
        "/docs",
        "d3",
        json!({"sessionId": "gone-session", "epoch": "3"}),
    );
    let r = wind(&ops, json!({"namespace": "/docs", "deadline": 30}));
    assert_eq!(
        r.json(),
        json!({"queued": 2}),
        "the row of a gone owner is fenced, not queued"
    );
    assert!(f.row("/docs", "d3").unwrap()["expiry"].is_u64());

    let refusal = |r: Reply| {
        (
            r.status,
            r.json()["error"].as_str().unwrap_or_default().to_string(),
        )
    };
    assert_eq!(
        refusal(wind(
            &ops,
            json!({"namespace": "/threads", "id": "t1", "deadline": 1, "env": "e"})
        )),
        (400, "env requires hostname-aware mode".into())
    );
    assert_eq!(
        refusal(wind(&ops, json!({"namespace": "threads", "deadline": 1}))),
        (400, "invalid namespace".into())
    );
    assert!(
        refusal(wind(
            &ops,
            json!({"namespace": "/threads", "deadline": "x"})
        ))
        .1
        .starts_with("expected {namespace")
    );
    let narrow = token("ops", &["pinboard:operator"], &["/docs"]);
    assert_eq!(
        refusal(wind(
            &narrow,
            json!({"namespace": "/threads", "id": "t1", "deadline": 1})
        )),
        (403, "namespace not allowed: /threads".into())
    );
    assert_eq!(
        refusal(wind(
            &f.token,
            json!({"namespace": "/threads", "id": "t1", "deadline": 1})
        )),
        (403, "forbidden".into())
    );
}

#[test]
fn a_wind_down_fence_outlives_its_owner_and_reaches_the_next() {
    let f = Fixture::new(&[]);
    f.warm();
    let worker = TestWorker::start("s");
    let session = f.registered(&worker, "c");
    let fence = 4_000_000_000_000u64;
    f.put_row(
        "/threads",
        "ghosted",
        json!({"sessionId": "dead-owner", "epoch": "1", "expiry": fence}),
    );
    let r = support::http::get(f.node.addr, "/threads/ghosted", None);
    assert_eq!(r.status, 200, "{}", r.text());
    let row = f.row("/threads", "ghosted").unwrap();
    assert_eq!(
        (row["sessionId"].as_str(), row["expiry"].as_u64()),
        (Some(session.as_str()), Some(fence))
    );
    let beat = f.heartbeat(&worker, &session, json!({})).json();
    assert_eq!(beat["messages"][0]["id"], "ghosted", "{beat}");
}

#[test]
fn operator_views_of_workers_and_their_stats() {
    let f = Fixture::new(&[]);
    let (a, b) = (TestWorker::start("secret-a"), TestWorker::start("secret-b"));
    let sa = f.registered(&a, "a");
    let sb = f.register(&b, "b", json!({"namespaces": ["/docs"]})).json()["sessionId"]
        .as_str()
        .unwrap()
        .to_string();
    let ops = token("ops", &["pinboard:operator"], &["*"]);

    let workers = support::http::get(f.node.addr, "/registry/workers", Some(&ops)).json();
    let list = workers["workers"].as_array().unwrap();
    let mut expected = vec![sa.clone(), sb.clone()];
    expected.sort();
    assert_eq!(
        list.iter()
            .map(|w| w["sessionId"].as_str().unwrap().to_string())
            .collect::<Vec<_>>(),
        expected
    );
    let wa = list.iter().find(|w| w["sessionId"] == sa).unwrap();
    assert_eq!(wa["namespaces"], json!(["/docs", "/threads"]));
    assert_eq!(
        (wa["clientId"].as_str(), wa["advertiseUrl"].as_str()),
        (Some("a"), Some(a.url().as_str()))
    );
    assert!(
        wa.get("secret").is_none() && wa.get("account").is_none(),
        "{wa}"
    );
    assert!(wa["expiry"].is_u64() && wa["headroom"].is_number() && wa["draining"] == false);

    let narrow = token("ops", &["pinboard:operator"], &["/threads"]);
    let workers = support::http::get(f.node.addr, "/registry/workers", Some(&narrow)).json();
    assert_eq!(workers["workers"].as_array().unwrap().len(), 1, "{workers}");
    assert_eq!(workers["workers"][0]["namespaces"], json!(["/threads"]));
    assert_eq!(
        support::http::get(f.node.addr, "/registry/workers", Some(&f.token)).status,
        403
    );

    // Stats: each worker's own /_pinned/stats, attested for its session.
    b.stop();
    let stats = support::http::get(f.node.addr, "/registry/stats", Some(&ops)).json();
    let entries = stats["workers"].as_array().unwrap();
    let ea = entries.iter().find(|e| e["sessionId"] == sa).unwrap();
    assert_eq!(ea["stats"]["path"], "/_pinned/stats", "{ea}");
    let token_seen = ea["stats"]["headers"]["pinboard-attestation"]
        .as_str()
        .unwrap();
    assert_eq!(
        support::attest::claims_of(token_seen, &a.secret())["aud"],
        sa
    );
    let eb = entries.iter().find(|e| e["sessionId"] == sb).unwrap();
    assert_eq!(
        (eb["error"].as_str(), eb["clientId"].as_str()),
        (Some("unreachable"), Some("b"))
    );
}

#[test]
fn operator_overview_with_filters() {
    let f = Fixture::new(&[]);
    let (a, b) = (TestWorker::start("a"), TestWorker::start("b"));
    let sa = f.registered(&a, "a");
    let sb = f
        .register(&b, "b", json!({"namespaces": ["/threads"]}))
        .json()["sessionId"]
        .as_str()
        .unwrap()
        .to_string();
    f.put_row(
        "/threads",
        "H~1",
        json!({"sessionId": sa, "epoch": "1", "tag": "ws:W"}),
    );
    f.put_row("/threads", "H~2", json!({"sessionId": sb, "epoch": "2"}));
    f.put_row(
        "/threads",
        "other",
        json!({"sessionId": sa, "epoch": "3", "tag": "ws:W"}),
    );
    f.put_row(
        "/threads",
        "orphan",
        json!({"sessionId": "gone", "epoch": "4"}),
    );
    f.put_row(
        "/threads",
        "fenced",
        json!({"sessionId": sa, "epoch": "5", "expiry": 1}),
    );
    f.put_row("/docs", "d1", json!({"sessionId": sa, "epoch": "6"}));
    let ops = token("ops", &["pinboard:operator"], &["*"]);
    let overview = |query: &str| {
        support::http::get(
            f.node.addr,
            &format!("/registry/overview{query}"),
            Some(&ops),
        )
    };

    let all = overview("").json();
    assert!(all.get("workers").is_some(), "{all}");
    assert_eq!(all["workers"].as_array().unwrap().len(), 2);
    assert_eq!(all["bindings"], json!({"hostnames": {}, "envs": {}}));
    let threads = all["namespaces"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["namespace"] == "/threads")
        .unwrap()
        .clone();
    assert_eq!(
        (threads["hostname"].clone(), threads["env"].clone()),
        (Value::Null, json!("default"))
    );
    let mut ids: Vec<String> = threads["sessionIds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_string())
        .collect();
    ids.sort();
    let mut want = vec![sa.clone(), sb.clone()];
    want.sort();
    assert_eq!(ids, want);
    let entries: Vec<&str> = threads["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].as_str().unwrap())
        .collect();
    assert_eq!(entries, vec!["H~1", "H~2", "other"], "live placements only");
    assert_eq!(
        threads["entries"][0],
        json!({"id": "H~1", "sessionId": sa, "tag": "ws:W"})
    );

    let one = overview("?ns=/threads&prefix=H~&tag=ws:W").json();
    let encoded = overview("?ns=%2Fthreads&prefix=H%7E&tag=ws%3AW").json();
    assert_eq!(encoded, one, "query values are percent-decoded");
    let namespaces = one["namespaces"].as_array().unwrap();
    assert_eq!(namespaces.len(), 1, "ns drops other namespaces");
    assert_eq!(
        namespaces[0]["entries"],
        json!([{"id": "H~1", "sessionId": sa, "tag": "ws:W"}])
    );

    let refusal = |r: Reply| {
        (
            r.status,
            r.json()["error"].as_str().unwrap_or_default().to_string(),
        )
    };
    assert_eq!(
        refusal(overview("?ns=threads")),
        (400, "invalid namespace".into())
    );
    assert_eq!(refusal(overview("?tag=")), (400, "empty tag".into()));
    let narrow = token("ops", &["pinboard:operator"], &["/docs"]);
    let docs = support::http::get(f.node.addr, "/registry/overview", Some(&narrow)).json();
    assert_eq!(docs["workers"].as_array().unwrap().len(), 1, "{docs}");
    assert_eq!(docs["namespaces"].as_array().unwrap().len(), 1);
    assert_eq!(docs["namespaces"][0]["namespace"], "/docs");
}

/// `envs` names every registered namespace's env, `takeover` is the effective one.
#[test]
fn hostname_aware_listing_shows_each_namespaces_env_and_effective_takeover() {
    let f = Fixture::new(&[("PINBOARD_HOSTNAME_AWARE", "true")]);
    let (a, b) = (TestWorker::start("a"), TestWorker::start("b"));
    let r = f.register(
        &a,
        "a",
        json!({"hostname": "Chat.Example", "namespaces": ["/chat"]}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let r = f.register(
        &b,
        "b",
        json!({"hostname": "docs.example", "env": "prod", "envs": {"/docs": "blue"},
               "namespaces": ["/docs", "/threads"], "takeover": "deny"}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let ops = token("ops", &["pinboard:operator"], &["*"]);
    for route in ["/registry/workers", "/registry/overview"] {
        let listed = support::http::get(f.node.addr, route, Some(&ops)).json();
        let workers = listed["workers"].as_array().unwrap();
        let by_host = |h: &str| workers.iter().find(|w| w["hostname"] == h).unwrap();
        let wa = by_host("chat.example");
        assert_eq!(wa["envs"], json!({"/chat": "chat.example"}), "{route}");
        assert_eq!(wa["takeover"], "wind_down", "{route}");
        let wb = by_host("docs.example");
        assert_eq!(
            wb["envs"],
            json!({"/docs": "blue", "/threads": "prod"}),
            "{route}"
        );
        assert_eq!(wb["takeover"], "deny", "{route}");
    }
}

#[test]
fn single_mode_listing_shows_the_default_takeover() {
    let f = Fixture::new(&[]);
    let worker = TestWorker::start("s");
    f.registered(&worker, "c");
    let ops = token("ops", &["pinboard:operator"], &["*"]);
    let listed = support::http::get(f.node.addr, "/registry/workers", Some(&ops)).json();
    assert_eq!(listed["workers"][0]["takeover"], "wind_down");
    assert_eq!(listed["workers"][0]["envs"], json!({}));
}

/// A worker registering after its operator drain's deadline: 200 draining, a normal lease, no
/// placements, nothing reclaimed; its heartbeats succeed (no register/409 loop).
#[test]
fn a_registration_past_a_timed_drains_deadline_lives_a_normal_lease() {
    let f = Fixture::new(&[]);
    f.warm();
    let worker = TestWorker::start("s");
    let session = f.registered(&worker, "c");
    f.put_row(
        "/threads",
        "held",
        json!({"sessionId": session, "epoch": "5"}),
    );
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let past = json!({"deadline": now_ms - 1000}).to_string();
    f.cli(&["SET", &f.keys.drain("c"), &past]);

    let again = json!({"prevSessionId": session, "instances": {"/threads": ["held"]}});
    let r = f.register(&worker, "c", again);
    assert_eq!(r.status, 200, "{}", r.text());
    let answer = r.json();
    assert_eq!(answer["draining"], true);
    assert_eq!(
        answer["duplicates"],
        json!([{"ns": "/threads", "id": "held"}])
    );
    let fresh = answer["sessionId"].as_str().unwrap().to_string();
    let record = f.session_record(&fresh).unwrap();
    assert!(
        record["expiry"].as_u64().unwrap() > now_ms + 10_000,
        "a normal lease: {record}"
    );
    assert_eq!(
        f.row("/threads", "held").unwrap()["sessionId"],
        session,
        "not reclaimed"
    );
    for _ in 0..2 {
        let beat = f.heartbeat(&worker, &fresh, json!({}));
        assert_eq!(beat.status, 200, "{}", beat.text());
        assert_eq!(beat.json()["draining"], true);
    }
    assert!(
        f.session_record(&fresh).unwrap()["expiry"]
            .as_u64()
            .unwrap()
            > now_ms + 10_000
    );
    let r = support::http::get(f.node.addr, "/threads/new-id", None);
    assert_eq!(
        (r.status, r.text().as_str()),
        (503, r#"{"error":"no live backends for namespace"}"#),
        "a draining worker takes no placements"
    );
}

/// `/registry/stats` keeps 8 calls in flight as a sliding window: one that ends lets the next
/// start. With 7 workers that never answer and 2 that do, every call is under way before the
/// first hung one times out (3 s); fixed batches of 8 would hold the ninth back until then.
#[test]
fn stats_keep_eight_calls_in_flight_as_a_sliding_window() {
    let f = Fixture::new(&[]);
    let workers: Vec<TestWorker> = (0..9)
        .map(|i| TestWorker::start(&format!("w{i}")))
        .collect();
    for (i, w) in workers.iter().enumerate() {
        f.registered(w, &format!("c{i}"));
        if i < 7 {
            w.set_serve(Serve::Hang);
        }
    }
    let ops = token("ops", &["pinboard:operator"], &["*"]);
    let stats = support::http::get(f.node.addr, "/registry/stats", Some(&ops)).json();
    let entries = stats["workers"].as_array().unwrap();
    assert_eq!(entries.len(), 9);
    let unreachable = entries
        .iter()
        .filter(|e| e["error"] == "unreachable")
        .count();
    assert_eq!(unreachable, 7, "{stats}");
    let arrivals: Vec<std::time::Instant> = workers
        .iter()
        .map(|w| {
            let calls: Vec<_> = w
                .seen()
                .into_iter()
                .filter(|s| s.path == "/_pinned/stats")
                .collect();
            assert_eq!(calls.len(), 1);
            calls[0].at
        })
        .collect();
    let first = *arrivals.iter().min().unwrap();
    let last = *arrivals.iter().max().unwrap();
    assert!(
        last - first < std::time::Duration::from_secs(3),
        "the ninth call started {:?} after the first: it waited for a batch",
        last - first
    );
}

/// A worker's `/_pinned/stats` as `pinned` answers it, holding `per_ns` ids (36 characters,
/// like a UUID) in each of `/threads` and `/docs`.
fn pinned_stats(session: &str, per_ns: usize) -> Vec<u8> {
    let ids = |ns: &str| -> Vec<String> {
        (0..per_ns)
            .map(|i| format!("{ns:.2}-{i:033}").replace('/', "x"))
            .collect()
    };
    serde_json::to_vec(&json!({
        "sessionId": session, "clientId": "c", "advertiseUrl": "http://127.0.0.1:1",
        "namespaces": ["/threads", "/docs"],
        "instances": {"/threads": ids("/threads"), "/docs": ids("/docs")},
        "instanceCount": 2 * per_ns, "headroom": 10, "draining": false, "degraded": false,
        "leaseHealthy": true, "threads": 2, "uptimeMs": 1,
    }))
    .unwrap()
}

/// Two workers holding 40,000 instances each answer some 1.6 MB of stats apiece: both are
/// relayed whole (a 1 MiB cap once made them `unreachable`), cut to the credential's
/// namespaces. An answer over the 64 MiB cap is `unreachable`, and the log says why.
#[test]
fn stats_relay_large_answers_up_to_the_cap() {
    let f = Fixture::new(&[]);
    let workers: Vec<TestWorker> = (0..3)
        .map(|i| TestWorker::start(&format!("big-{i}")))
        .collect();
    let sessions: Vec<String> = workers
        .iter()
        .enumerate()
        .map(|(i, w)| f.registered(w, &format!("big-{i}")))
        .collect();
    for (w, session) in workers.iter().zip(&sessions).take(2) {
        let body = pinned_stats(session, 20_000);
        assert!(body.len() > 1024 * 1024, "{}", body.len());
        w.set_stats(body);
    }
    workers[2].set_stats(vec![b' '; 64 * 1024 * 1024 + 1]);

    let narrow = token("ops", &["pinboard:operator"], &["/threads"]);
    let r = support::http::get(f.node.addr, "/registry/stats", Some(&narrow));
    assert_eq!(r.status, 200, "{}", f.node.log());
    let stats = r.json();
    for session in &sessions[..2] {
        let entry = stats["workers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["sessionId"] == *session)
            .unwrap();
        assert!(entry.get("error").is_none(), "{}", f.node.log());
        let relayed = &entry["stats"];
        // Restated over the visible namespace (issue 23: the worker's own count leaked the
        // size of namespaces outside the credential).
        assert_eq!(relayed["instanceCount"], 20_000);
        assert_eq!(relayed["namespaces"], json!(["/threads"]));
        let instances = relayed["instances"].as_object().unwrap();
        assert_eq!(instances.keys().collect::<Vec<_>>(), ["/threads"]);
        assert_eq!(instances["/threads"].as_array().unwrap().len(), 20_000);
    }
    let over = stats["workers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["sessionId"] == sessions[2])
        .unwrap();
    assert_eq!(over["error"], "unreachable");
    let line = log_line(&f, "worker stats unreachable");
    assert!(
        line.contains("WARN")
            && line.contains(&sessions[2])
            && line.contains("response body too large"),
        "{line}"
    );
}

/// Spec: "'' quotes an epoch-less row": `epoch: ""` frees an epoch-less row and no other.
#[test]
fn schedule_is_compare_and_set_on_the_row() {
    let f = Fixture::new(&[]);
    let worker = TestWorker::start("s");
    let session = f.registered(&worker, "c");
    for (id, epoch) in [("t1", "5"), ("t2", "6"), ("t3", "7")] {
        f.put_row(
            "/threads",
            id,
            json!({"sessionId": session, "epoch": epoch}),
        );
    }
    let entry = |id: &str| {
        let bucket = pinboard::store::bucket_of(id, support::fleet::SHARDS);
        f.cli(&["ZSCORE", &f.keys.wake(bucket, "default", "/threads"), id])
    };
    // Wake times an hour ahead: the node's own durability sweep must not wake (and so remove)
    // an entry between two of the test's calls, as it did to times already past.
    let later = pinboard::clock::now_ms() + 3_600_000;
    let at = |ms: u64| json!(later + ms);
    let at_text = |ms: u64| (later + ms).to_string();
    let row = |id: &str, epoch: &str, at: Value| json!({"sessionId": session, "namespace": "/threads", "id": id, "epoch": epoch, "wakeAt": at});
    // Matching rows are scheduled; a stale epoch and an id without a row are not.
    let r = f.post(
        "schedule",
        &f.token,
        &json!([
            row("t1", "5", at(1000)),
            row("t2", "6", at(2000)),
            row("t3", "1", at(3000)),
            row("none", "5", at(4000))
        ]),
    );
    assert_eq!(
        (r.status, r.json()),
        (200, json!({"scheduled": 2})),
        "{}",
        r.text()
    );
    assert_eq!(
        (
            entry("t1").as_str(),
            entry("t2").as_str(),
            entry("t3").as_str()
        ),
        (at_text(1000).as_str(), at_text(2000).as_str(), "")
    );
    // null removes; a later wakeAt moves the entry.
    let r = f.post(
        "schedule",
        &f.token,
        &json!([row("t1", "5", Value::Null), row("t2", "6", at(2500))]),
    );
    assert_eq!(r.json(), json!({"scheduled": 2}));
    assert_eq!(
        (entry("t1").as_str(), entry("t2").as_str()),
        ("", at_text(2500).as_str())
    );
    let r = f.post("schedule", &f.token, &json!([row("t1", "5", Value::Null)]));
    assert_eq!(r.json(), json!({"scheduled": 0}), "nothing left to remove");

    // Bodies outside the schema change nothing.
    let shape =
        "expected [{sessionId, namespace, id, epoch: digits, wakeAt: ms | null}] (non-empty)";
    for body in [
        json!([]),
        json!([row("t2", "x6", json!(1))]),
        json!([row("t2", "", json!(1))]),
        json!([{"sessionId": session, "namespace": "/threads", "id": "t2", "epoch": "6"}]),
        json!([row("t2", "6", json!("soon"))]),
        json!([row("t2", "6", json!(-1))]),
        json!({"sessionId": session}),
    ] {
        assert_eq!(
            error_of(&f.post("schedule", &f.token, &body)),
            (400, shape.into()),
            "{body}"
        );
    }
    assert_eq!(entry("t2"), at_text(2500));

    let r = f.post("schedule", &f.token, &json!([{"sessionId": "nobody", "namespace": "/threads", "id": "t2", "epoch": "6", "wakeAt": 1}]));
    assert_eq!(
        (r.status, r.json()),
        (409, json!({"error": "unknown session", "reregister": true}))
    );
    // Another account's credential, or one outside the namespace, schedules nothing, even
    // alongside rows it could schedule.
    let other = f.node.worker_token("acct-b");
    assert_eq!(
        error_of(&f.post("schedule", &other, &json!([row("t2", "6", json!(9))]))),
        (403, "forbidden".into())
    );
    let narrow = token("acct-a", &["pinboard:worker"], &["/docs"]);
    assert_eq!(
        error_of(&f.post("schedule", &narrow, &json!([row("t2", "6", json!(9))]))),
        (403, "namespace not allowed: /threads".into())
    );
    let mut bad_ns = row("t2", "6", json!(9));
    bad_ns["namespace"] = json!("/no/pe");
    assert_eq!(
        error_of(&f.post(
            "schedule",
            &f.token,
            &json!([row("t3", "7", json!(9)), bad_ns.clone()])
        )),
        (400, "invalid namespace".into())
    );
    bad_ns["namespace"] = json!("/misc");
    assert_eq!(
        error_of(&f.post("schedule", &f.token, &json!([bad_ns]))),
        (400, "namespace not registered: /misc".into())
    );
    assert_eq!(
        (entry("t2").as_str(), entry("t3").as_str()),
        (at_text(2500).as_str(), ""),
        "refused requests wrote nothing"
    );
    let r = support::http::post_json(
        f.node.addr,
        "/registry/schedule",
        Some(&f.token),
        &format!("[{}]", "x".repeat(1 << 20)),
    );
    assert_eq!(error_of(&r), (413, "body too large".into()));
    let r = support::http::post_json(f.node.addr, "/registry/schedule", Some(&f.token), "[{");
    assert_eq!(error_of(&r), (400, "invalid json".into()));
}

#[test]
fn release_accepts_epoch_empty_for_an_epoch_less_row() {
    let f = Fixture::new(&[]);
    let session = f.registered(&TestWorker::start("s"), "c");
    for (id, row) in [
        ("with", json!({"sessionId": session, "epoch": "5"})),
        ("without", json!({"sessionId": session})),
    ] {
        f.put_row("/threads", id, row);
    }
    let release = |id: &str, epoch: &str| {
        let rows =
            json!([{"sessionId": session, "namespace": "/threads", "id": id, "epoch": epoch}]);
        f.post("release", &f.token, &rows)
    };
    assert_eq!(release("with", "").json(), json!({"released": 0}));
    assert!(f.row("/threads", "with").is_some());
    assert_eq!(release("without", "").json(), json!({"released": 1}));
    assert!(f.row("/threads", "without").is_none());
    assert_eq!(
        release("with", "5a").status,
        400,
        "anything else is still refused"
    );
}
