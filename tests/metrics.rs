//! `/metrics` end to end: the real node on a real redis-server with a test worker, scraped with
//! an operator credential on the main listener and without one on the metrics listener
//! (`metrics_listen`); both answers carry the same families, and `promtool check metrics`
//! (Debian's `prometheus` package) finds nothing to say about them.

mod support;

use std::collections::BTreeSet;
use std::io::Write;
use std::process::{Command, Stdio};

use support::fleet::Fixture;
use support::http::{Client, get, post_json};
use support::node::serve_until_exit;

/// The families of a Prometheus text: `name type`, from its `# TYPE` lines.
fn families(text: &str) -> BTreeSet<&str> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .collect()
}

/// `promtool check metrics` must accept `text` and say nothing about it (a lint: a missing
/// HELP, a counter without `_total`, a unit that is not a base unit…). Without promtool the
/// check is skipped with a note, unless `CI` is set: CI installs it (`.ci/run`).
fn promtool_accepts(text: &str) {
    if !support::process::installed_or_skipped("promtool", "prometheus", "the /metrics lint") {
        return;
    }
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && said.trim().is_empty(),
        "promtool check metrics: {}\n{said}\non:\n{text}",
        out.status
    );
}

#[test]
fn both_listeners_answer_the_same_families_and_promtool_accepts_them() {
    let (mut f, _worker, _) =
        Fixture::with_worker(&[("PINBOARD_METRICS_LISTEN", "127.0.0.1:0")], "w-secret");
    let addr = f.node.addr;
    let scrapes = f.node.metrics_addr();
    assert_eq!(get(addr, "/threads/m1/x", None).status, 200);
    let unknown = get(addr, "/nowhere/m1", None);
    assert_eq!(unknown.status, 404);
    assert_eq!(unknown.json()["error"], "unknown namespace");
    let r = post_json(addr, "/registry/heartbeat", None, "{}");
    assert_eq!(r.status, 401, "{}", r.text());

    // The main listener keeps the spec's rules; the metrics listener asks for nothing.
    assert_eq!(get(addr, "/metrics", None).status, 401);
    let operator = f.metrics();
    let open = get(scrapes, "/metrics", None);
    assert_eq!(open.status, 200, "{}", open.text());
    assert_eq!(
        open.header("content-type"),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    let open = open.text();
    assert_eq!(families(&operator), families(&open));
    for text in [&operator, &open] {
        promtool_accepts(text);
        assert_eq!(
            support::metric(text, "pinboard_resolutions_total{outcome=\"forward\"}"),
            Some(1.0)
        );
        assert_eq!(
            support::metric(text, "pinboard_resolutions_total{outcome=\"unknown-ns\"}"),
            Some(1.0)
        );
    }
    // The process's own families, read from /proc at the scrape, and the build.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let started = support::metric(&open, "process_start_time_seconds").unwrap();
    assert!(started > now - 120.0 && started <= now + 1.0, "{started}");
    assert!(support::metric(&open, "process_open_fds").unwrap() > 10.0);
    assert!(support::metric(&open, "process_resident_memory_bytes").unwrap() > 1e6);
    assert!(support::metric(&open, "process_cpu_seconds_total").is_some());
    let build = open
        .lines()
        .find(|l| l.starts_with("pinboard_build_info{"))
        .unwrap();
    assert!(
        build.contains(&format!("version=\"{}\"", env!("CARGO_PKG_VERSION")))
            && build.contains("commit=\"")
            && build.ends_with("} 1"),
        "{build}"
    );

    // Only /metrics, GET or HEAD, on the metrics listener; OpenMetrics when asked for.
    for path in [
        "/",
        "/healthz",
        "/registry/workers",
        "/threads/m1/x",
        "/metrics/",
    ] {
        let r = get(scrapes, path, None);
        assert_eq!(
            (r.status, r.text().as_str()),
            (404, r#"{"error":"not found"}"#),
            "{path}"
        );
    }
    let mut c = Client::connect(scrapes);
    c.send(b"HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    let head = c.read(true);
    assert_eq!(head.status, 200);
    assert!(head.body.is_empty());
    let post = c.request(b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n");
    assert_eq!((post.status, post.header("allow")), (405, Some("GET")));
    let om = c.request(
        b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: application/openmetrics-text\r\n\r\n",
    );
    assert_eq!(
        om.header("content-type"),
        Some("application/openmetrics-text; version=1.0.0; charset=utf-8")
    );
    assert!(om.text().ends_with("# EOF\n"));

    // The graceful stop closes the metrics listener too, with a scraper's connection open.
    assert!(f.node.stop().success(), "{}", f.node.log());
    assert!(std::net::TcpStream::connect(scrapes).is_err());
}

/// `metrics = false` takes `/metrics` off the main listener only: an operator who sets
/// `metrics_listen` wants the scrapes there.
#[test]
fn metrics_false_leaves_the_metrics_listener_serving() {
    let f = Fixture::new(&[
        ("PINBOARD_METRICS", "false"),
        ("PINBOARD_METRICS_LISTEN", "127.0.0.1:0"),
    ]);
    let operator = support::node::token("ops", &["pinboard:operator"], &["*"]);
    let r = get(f.node.addr, "/metrics", Some(&operator));
    assert_eq!(
        (r.status, r.text().as_str()),
        (404, r#"{"error":"unknown namespace"}"#)
    );
    let r = get(f.node.metrics_addr(), "/metrics", None);
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.text().contains("# TYPE pinboard_serving gauge"));
}

/// An address the metrics listener cannot have stops startup like a bad setting.
#[test]
fn a_busy_or_foreign_metrics_address_exits_2_naming_the_key() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let busy = taken.local_addr().unwrap().to_string();
    // TEST-NET-1 (RFC 5737): never an address of this host.
    for addr in [busy.as_str(), "192.0.2.1:9901"] {
        let (code, stderr) =
            serve_until_exit("redis://127.0.0.1:1", &[("PINBOARD_METRICS_LISTEN", addr)]);
        assert_eq!(code, Some(2), "{addr}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
        assert!(
            stderr.starts_with(&format!(
                "config error: metrics_listen: cannot listen on {addr}: "
            )),
            "{stderr}"
        );
    }
}
