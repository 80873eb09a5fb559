//! What an operator watches a node by, end to end on the real binary: every answer's
//! `X-Request-Id`, the trace context forwarded to workers, the request metrics after a known
//! sequence of answers (a 200, a 404, a 502, a 504, a 401, a refused head), and the access log's
//! lines, reopened on `SIGUSR1`.

mod support;

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use support::fleet::Fixture;
use support::http::{Client, Reply, get};
use support::node::eventually;
use support::worker::Serve;

const TRACE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// Every sample of a `/metrics` text, by its name and labels.
fn samples(text: &str) -> HashMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (name, value) = l.rsplit_once(' ')?;
            Some((name.to_owned(), value.parse().ok()?))
        })
        .collect()
}

fn access_lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

fn generated_id(r: &Reply) -> String {
    let id = r.header("x-request-id").expect("every answer has an id");
    assert!(
        id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()),
        "{id}"
    );
    id.to_owned()
}

#[test]
fn every_answer_is_identified_counted_and_logged() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let log_env = log.display().to_string();
    let (f, worker, session) = Fixture::with_worker(
        &[
            ("PINBOARD_ACCESS_LOG", "json"),
            ("PINBOARD_ACCESS_LOG_PATH", &log_env),
            ("PINBOARD_FORWARDS__TIMEOUT_MS", "700"),
            // The test's client is a trusted proxy: the log names whom it forwarded for.
            ("PINBOARD_TRUSTED_PROXIES", "127.0.0.1/32"),
        ],
        "observed",
    );
    let before = samples(&f.metrics());

    // 200: the client's id and trace kept, towards the worker and back.
    let mut c = Client::connect(f.node.addr);
    let ok = c.request(
        format!(
            "GET /threads/a1/x?secret=1 HTTP/1.1\r\nHost: edge\r\nX-Request-Id: my-id\r\n\
             traceparent: {TRACE}\r\ntracestate: vendor=1\r\nX-Forwarded-For: 203.0.113.9\r\n\r\n"
        )
        .as_bytes(),
    );
    assert_eq!(ok.status, 200, "{}", ok.text());
    assert_eq!(ok.header("x-request-id"), Some("my-id"));
    let seen = &worker.requests()[0];
    assert_eq!(seen.header("x-request-id"), Some("my-id"));
    assert_eq!(seen.header("traceparent"), Some(TRACE));
    assert_eq!(seen.header("tracestate"), Some("vendor=1"));

    // 404 from the node: a new id on the answer.
    let missing = get(f.node.addr, "/nowhere/a1", None);
    assert_eq!(missing.status, 404);
    let missing_id = generated_id(&missing);

    // Without a trace context a new trace starts, and the worker gets its traceparent.
    let r = get(f.node.addr, "/threads/a2/x", None);
    assert_eq!(r.status, 200);
    let started = worker.requests()[1]
        .header("traceparent")
        .unwrap()
        .to_owned();
    assert!(
        started.starts_with("00-") && started.len() == 55 && started != TRACE,
        "{started}"
    );
    assert_eq!(
        worker.requests()[1].header("x-request-id").unwrap(),
        generated_id(&r)
    );

    // 502: the worker drops the connection on a POST (never sent again).
    worker.set_serve(Serve::Drop);
    let mut c = Client::connect(f.node.addr);
    let bad =
        c.request(b"POST /threads/a1/pay HTTP/1.1\r\nHost: edge\r\nContent-Length: 2\r\n\r\nhi");
    assert_eq!(bad.status, 502, "{}", bad.text());
    generated_id(&bad);

    // 504: the worker never answers.
    worker.set_serve(Serve::Hang);
    let slow = get(f.node.addr, "/threads/a1/slow", None);
    assert_eq!(slow.status, 504, "{}", slow.text());
    worker.set_serve(Serve::Echo);

    // 401 on a registry route, and a head refused before routing.
    let unauthorized = get(f.node.addr, "/registry/workers", None);
    assert_eq!(unauthorized.status, 401);
    generated_id(&unauthorized);
    let mut c = Client::connect(f.node.addr);
    let refused = c.request(b"NOT HTTP AT ALL\r\n\r\n");
    assert_eq!(refused.status, 400);
    generated_id(&refused);

    let after = samples(&f.metrics());
    let delta = |name: &str| {
        after.get(name).copied().unwrap_or(0.0) - before.get(name).copied().unwrap_or(0.0)
    };
    let requests = |kind: &str, code: &str| {
        delta(&format!(
            r#"pinboard_http_requests_total{{kind="{kind}",code="{code}"}}"#
        ))
    };
    assert_eq!(requests("data", "2xx"), 2.0);
    assert_eq!(requests("data", "4xx"), 2.0, "the 404 and the refused head");
    assert_eq!(requests("data", "5xx"), 2.0, "the 502 and the 504");
    assert_eq!(requests("registry", "4xx"), 0.0);
    assert_eq!(
        requests("operator", "4xx"),
        1.0,
        "the 401 on an operator route"
    );
    assert_eq!(requests("operator", "2xx"), 1.0, "the first scrape");
    assert_eq!(
        delta(r#"pinboard_http_request_duration_seconds_count{kind="data"}"#),
        6.0
    );
    assert_eq!(
        delta(r#"pinboard_http_request_duration_seconds_bucket{le="+Inf",kind="data"}"#),
        6.0
    );
    assert!(delta(r#"pinboard_http_request_duration_seconds_sum{kind="data"}"#) >= 0.7);
    for (sample, n) in [
        ("pinboard_upstream_duration_seconds_count", 4.0),
        (r#"pinboard_upstream_errors_total{kind="reset"}"#, 1.0),
        (r#"pinboard_upstream_errors_total{kind="timeout"}"#, 1.0),
        // Five resolves: the 404 and the four forwards.
        (
            r#"pinboard_redis_duration_seconds_count{script="resolve"}"#,
            5.0,
        ),
        // The decisions stay counted as such; their 502 and 504 show in the series above.
        (r#"pinboard_resolutions_total{outcome="forward"}"#, 4.0),
        (r#"pinboard_resolutions_total{outcome="unknown-ns"}"#, 1.0),
    ] {
        assert_eq!(delta(sample), n, "{sample}");
    }
    let url = worker.url();
    assert_eq!(
        after.get(&format!(r#"pinboard_upstream_inflight{{worker="{url}"}}"#)),
        Some(&0.0)
    );

    // The access log: one line per answer, within a flush period.
    let lines = || access_lines(&log);
    assert!(
        eventually(Duration::from_secs(5), || lines().len() >= 8),
        "{:?}",
        lines()
    );
    let lines = lines();
    let by_status =
        |status: u64| -> Vec<&Value> { lines.iter().filter(|l| l["status"] == status).collect() };
    // Each core writes its own lines: the file is in order per core only.
    let first = lines
        .iter()
        .find(|l| l["request_id"] == "my-id")
        .expect("the client's id in the log");
    assert_eq!(first["trace_id"], "4bf92f3577b34da6a3ce929d0e0e4736");
    assert_eq!(first["path"], "/threads/a1/x", "no query string");
    assert_eq!(
        (&first["protocol"], &first["scheme"]),
        (&"HTTP/1.1".into(), &"http".into())
    );
    assert_eq!(
        (&first["ns"], &first["id"]),
        (&"/threads".into(), &"a1".into())
    );
    assert_eq!(first["outcome"], "forward");
    assert_eq!(first["session"], session.as_str());
    assert_eq!(first["client"], "203.0.113.9");
    assert!(
        first["epoch"]
            .as_str()
            .unwrap()
            .bytes()
            .all(|b| b.is_ascii_digit())
    );
    assert!(first["upstream_ms"].as_f64().unwrap() > 0.0);
    assert!(first["resolve_ms"].as_f64().unwrap() > 0.0);
    assert!(first["bytes_out"].as_u64().unwrap() > 100);
    assert!(!first["node_id"].as_str().unwrap().is_empty());
    let [not_found] = by_status(404)[..] else {
        panic!("{lines:?}")
    };
    assert_eq!(not_found["request_id"], missing_id.as_str());
    assert_eq!(
        not_found["client"], "127.0.0.1",
        "no X-Forwarded-For: the peer"
    );
    assert_eq!(not_found["error"], "unknown namespace");
    assert_eq!(not_found["outcome"], "unknown-ns");
    let [bad_gateway] = by_status(502)[..] else {
        panic!("{lines:?}")
    };
    assert_eq!(
        (&bad_gateway["method"], &bad_gateway["bytes_in"]),
        (&"POST".into(), &2.into())
    );
    assert_eq!(bad_gateway["error"], "bad gateway");
    let [timed_out] = by_status(504)[..] else {
        panic!("{lines:?}")
    };
    assert!(timed_out["total_ms"].as_f64().unwrap() >= 700.0);
    let [head_refused] = by_status(400)[..] else {
        panic!("{lines:?}")
    };
    assert_eq!(head_refused["error"], "bad request");
    assert!(head_refused.get("protocol").is_none(), "{head_refused}");

    // logrotate: the file moved away, SIGUSR1, and the next lines go to a new file.
    let rotated = dir.path().join("access.log.1");
    std::fs::rename(&log, &rotated).unwrap();
    f.node.signal("USR1");
    f.node.logs("SIGUSR1: reopening the access log");
    for _ in 0..4 {
        assert_eq!(get(f.node.addr, "/threads/a1/x", None).status, 200);
    }
    assert!(
        eventually(Duration::from_secs(5), || access_lines(&log).len() == 4),
        "{:?}",
        access_lines(&log)
    );
    assert_eq!(access_lines(&rotated).len(), lines.len());
}

/// A file the node cannot open stops it at start, naming the key.
#[test]
fn an_access_log_path_that_cannot_be_opened_stops_the_start() {
    let redis = support::redis::RedisServer::start();
    let (code, out) = support::node::serve_until_exit(
        &redis.url(),
        &[
            ("PINBOARD_ACCESS_LOG", "text"),
            ("PINBOARD_ACCESS_LOG_PATH", "/nonexistent-dir/access.log"),
        ],
    );
    assert_eq!(code, Some(2), "{out}");
    assert!(
        out.contains("config error: access_log_path: cannot open /nonexistent-dir/access.log"),
        "{out}"
    );
}

#[test]
fn an_unknown_access_log_format_is_refused() {
    let redis = support::redis::RedisServer::start();
    let (code, out) =
        support::node::serve_until_exit(&redis.url(), &[("PINBOARD_ACCESS_LOG", "combined")]);
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains("config error: access_log:"), "{out}");
}
