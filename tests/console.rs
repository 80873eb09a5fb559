//! The node's side of the operator console, on the real binary and a real redis-server: the
//! embedded files and their headers, the redirect, 404 and 405; off by default (the paths are
//! then the data plane's); on the metrics listener (the console and the operator routes,
//! credential-checked, no worker route, no data plane); and what the console reads that the
//! operator routes gained: `/registry/health`'s serving, license and windows per bucket,
//! `/registry/workers`' in-flight and drain fields, `/registry/overview` a page at a time over
//! thousands of rows in every bucket, and one id at a time.

mod support;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use serde_json::{Value, json};
use support::fleet::{Fixture, SHARDS};
use support::http::{Client, Reply, get, post_json};
use support::node::{eventually, token};
use support::worker::Serve;

use pinboard::store::bucket_of;

const ON: (&str, &str) = ("PINBOARD_CONSOLE", "true");

fn operator() -> String {
    token("ops", &["pinboard:operator"], &["*"])
}

fn request(addr: SocketAddr, method: &str, path: &str) -> Reply {
    let head = method == "HEAD";
    let mut client = Client::connect(addr);
    client.send(format!("{method} {path} HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes());
    client.read(head)
}

/// The headers every console answer carries.
fn guarded(r: &Reply) {
    let csp = r.header("content-security-policy").unwrap_or_default();
    for directive in [
        "default-src 'self'",
        "script-src 'self'",
        "connect-src 'self'",
        "img-src 'self' data:",
        "frame-ancestors 'none'",
    ] {
        assert!(csp.contains(directive), "{directive} not in {csp}");
    }
    assert!(
        !csp.contains("unsafe-inline") && !csp.contains("unsafe-eval"),
        "{csp}"
    );
    assert_eq!(r.header("x-content-type-options"), Some("nosniff"));
    assert_eq!(r.header("x-frame-options"), Some("DENY"));
    assert_eq!(r.header("referrer-policy"), Some("no-referrer"));
    assert_eq!(r.header("cache-control"), Some("no-cache"));
    assert!(r.header("x-request-id").is_some());
}

fn file(name: &str) -> Vec<u8> {
    std::fs::read(format!("{}/console/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

/// The console's files as `addr` serves them at `/_console/`, the index naming `base_path`.
fn serves_the_console(addr: SocketAddr, base_path: &str) {
    let index = get(addr, "/_console/", None);
    assert_eq!(index.status, 200, "{}", index.text());
    assert_eq!(
        index.header("content-type"),
        Some("text/html; charset=utf-8")
    );
    guarded(&index);
    let meta = format!(r#"<meta name="pinboard-base-path" content="{base_path}">"#);
    assert!(index.text().contains(&meta), "{}", index.text());
    // Only the <meta> differs from the file.
    let on_disk = String::from_utf8(file("index.html")).unwrap().replacen(
        r#"<meta name="pinboard-base-path" content="">"#,
        &meta,
        1,
    );
    assert_eq!(index.text(), on_disk);

    for (name, kind) in [
        ("app.js", "text/javascript; charset=utf-8"),
        ("charts.js", "text/javascript; charset=utf-8"),
        ("style.css", "text/css; charset=utf-8"),
    ] {
        let r = get(addr, &format!("/_console/{name}"), None);
        assert_eq!(r.status, 200, "{name}");
        assert_eq!(r.header("content-type"), Some(kind), "{name}");
        assert_eq!(r.body, file(name), "{name}");
        guarded(&r);
        let head = request(addr, "HEAD", &format!("/_console/{name}"));
        assert_eq!(head.status, 200);
        assert!(head.body.is_empty());
        assert_eq!(
            head.header("content-length"),
            Some(file(name).len().to_string().as_str())
        );
        guarded(&head);
    }

    let bare = get(addr, "/_console", None);
    assert_eq!(bare.status, 301);
    assert_eq!(bare.header("location"), Some("/_console/"));
    guarded(&bare);
    // Whatever follows, a query string included, it is the same answer.
    assert_eq!(get(addr, "/_console/?x=1", None).status, 200);

    for missing in [
        "/_console/nope.js",
        "/_console/README.md",
        "/_console/tests/test_console.py",
        "/_console/../Cargo.toml",
        "/_console/app.js/",
        "/_console//app.js",
    ] {
        let r = get(addr, missing, None);
        assert_eq!(r.status, 404, "{missing}");
        assert_eq!(r.json(), json!({"error": "not found"}), "{missing}");
    }
    for method in ["POST", "PUT", "DELETE"] {
        let r = request(addr, method, "/_console/");
        assert_eq!(r.status, 405, "{method}");
        assert_eq!(r.header("allow"), Some("GET, HEAD"));
    }
}

#[test]
fn the_console_is_served_from_the_binary_outside_the_base_path() {
    let f = Fixture::new(&[
        ON,
        ("PINBOARD_BASE_PATH", "/edge"),
        ("PINBOARD_METRICS_LISTEN", "127.0.0.1:0"),
    ]);
    serves_the_console(f.node.addr, "/edge");
    // Under the base path it is no console path: the base path's answer for it.
    let under = get(f.node.addr, "/edge/_console/", None);
    assert_ne!(under.status, 200);
    assert_eq!(
        under.status,
        get(f.node.addr, "/edge/_consolf/", None).status
    );
    // The metrics listener answers the operator routes under the base path, as `listen` does.
    let metrics = f.node.metrics_addr();
    serves_the_console(metrics, "/edge");
    let ops = operator();
    assert_eq!(
        get(metrics, "/edge/registry/health", Some(&ops)).status,
        200
    );
    assert_eq!(get(metrics, "/registry/health", Some(&ops)).status, 404);
}

/// Off (the default), every console path answers what the same path of another name does: the
/// data plane's answer, on the main listener; 404 on the metrics listener.
#[test]
fn off_by_default_the_paths_are_what_they_were() {
    for env in [vec![], vec![("PINBOARD_CONSOLE", "false")]] {
        let mut env = env;
        env.push(("PINBOARD_METRICS_LISTEN", "127.0.0.1:0"));
        let f = Fixture::new(&env);
        f.warm();
        let addr = f.node.addr;
        for (path, twin) in [
            ("/_console", "/_consolf"),
            ("/_console/", "/_consolf/"),
            ("/_console/app.js", "/_consolf/app.js"),
            ("/_console/index.html", "/_consolf/index.html"),
        ] {
            let (r, other) = (get(addr, path, None), get(addr, twin, None));
            assert_ne!(r.status, 200, "{path}");
            assert_eq!((r.status, &r.body), (other.status, &other.body), "{path}");
            assert!(r.header("content-security-policy").is_none());
        }
        let metrics = f.node.metrics_addr();
        for path in ["/_console/", "/registry/workers", "/registry/health"] {
            let r = get(metrics, path, Some(&operator()));
            assert_eq!(r.status, 404, "{path}");
            assert_eq!(r.json(), json!({"error": "not found"}));
        }
    }
}

/// With the console on, the metrics listener serves it and the operator routes it calls,
/// checked as on the main listener, under `base_path`; never a worker route or the data plane.
#[test]
fn the_metrics_listener_serves_the_console_and_the_operator_routes_only() {
    let (f, worker, session) = Fixture::with_worker(
        &[ON, ("PINBOARD_METRICS_LISTEN", "127.0.0.1:0")],
        "metrics-console",
    );
    let addr = f.node.metrics_addr();
    serves_the_console(addr, "");
    assert_eq!(
        get(addr, "/metrics", None).status,
        200,
        "still no credential"
    );

    let ops = operator();
    let workers = get(addr, "/registry/workers", Some(&ops));
    assert_eq!(workers.status, 200, "{}", workers.text());
    assert_eq!(workers.json()["workers"][0]["sessionId"], session);
    for route in ["health", "overview", "stats", "history?ns=/threads&id=a1"] {
        let r = get(addr, &format!("/registry/{route}"), Some(&ops));
        assert_eq!(r.status, 200, "{route}: {}", r.text());
    }
    // Credential-checked as on listen.
    let r = get(addr, "/registry/workers", None);
    assert_eq!(
        (r.status, r.json()),
        (401, json!({"error": "unauthorized"}))
    );
    let r = get(addr, "/registry/workers", Some(&f.token));
    assert_eq!((r.status, r.json()), (403, json!({"error": "forbidden"})));
    let scoped = token("ops", &["pinboard:operator"], &["/other"]);
    let r = post_json(
        addr,
        "/registry/wind_down",
        Some(&scoped),
        r#"{"namespace":"/threads","id":"a1","deadline":30}"#,
    );
    assert_eq!(r.status, 403);
    assert_eq!(
        r.json(),
        json!({"error": "namespace not allowed: /threads"})
    );
    let r = post_json(
        addr,
        "/registry/drain",
        Some(&ops),
        r#"{"clientId":"w1","deadline":null}"#,
    );
    assert_eq!((r.status, r.json()), (200, json!({"drained": true})));
    let r = get(addr, "/registry/workers", Some(&ops));
    assert_eq!(
        r.json()["workers"][0]["operatorDrain"],
        json!({"deadline": null})
    );
    // A worker route is not served, with or without its credential, nor an unknown registry
    // path, nor the data plane.
    let (challenge, value) = worker.challenge();
    let heartbeat = json!({"sessionId": session, "headroom": 5, "draining": false,
        "challenge": challenge, "challengeValue": value});
    let r = post_json(
        addr,
        "/registry/heartbeat",
        Some(&f.token),
        &heartbeat.to_string(),
    );
    assert_eq!((r.status, r.json()), (404, json!({"error": "not found"})));
    assert_eq!(get(addr, "/registry/nope", Some(&ops)).status, 404);
    for path in ["/threads/a1/x", "/docs/d1"] {
        let r = get(addr, path, None);
        assert_eq!(
            (r.status, r.json()),
            (404, json!({"error": "not found"})),
            "{path}"
        );
    }
    assert!(worker.requests().is_empty(), "the data plane was reached");
    // The main listener is unchanged: the heartbeat is its to answer.
    assert_eq!(f.post("heartbeat", &f.token, &heartbeat).status, 200);
}

#[test]
fn health_says_serving_the_license_and_each_buckets_cold_start() {
    let f = Fixture::new(&[("PINBOARD_LEASE_TTL_MS", "60000")]);
    let ops = operator();
    let health = |f: &Fixture| {
        let r = get(f.node.addr, "/registry/health", Some(&ops));
        assert_eq!(r.status, 200);
        r.json()
    };
    let h = health(&f);
    assert_eq!(h["serving"], true);
    assert_eq!(h["license"], json!({"held": true, "epoch": 0}));
    assert_eq!(h["quarantine"], json!({}));
    assert_eq!(h["quarantineMs"], 0);

    // Bucket 2 started its window now; bucket 0 a lease ago (over).
    let now: u64 = f.cli(&["TIME"]).lines().next().unwrap().parse().unwrap();
    f.cli(&[
        "SET",
        &f.keys.bucket(2).boot_time,
        &(now * 1000).to_string(),
    ]);
    f.cli(&["SET", &f.keys.bucket(0).boot_time, "0"]);
    let h = health(&f);
    let windows = h["quarantine"].as_object().unwrap();
    assert_eq!(windows.keys().collect::<Vec<_>>(), ["2"], "{h}");
    let left = windows["2"].as_u64().unwrap();
    assert!((55_000..=60_000).contains(&left), "{left}");
    assert_eq!(h["quarantineMs"].as_u64(), Some(left));

    // Another fleet's license, at a higher epoch: not this node's.
    f.cli(&[
        "SET",
        f.keys.fleet(),
        r#"{"schema":1,"shards":4,"hostnameAware":false,"epoch":9}"#,
        "PX",
        "60000",
    ]);
    let h = health(&f);
    assert_eq!(h["license"], json!({"held": false, "epoch": 9}));
    assert!(
        eventually(Duration::from_secs(25), || health(&f)["serving"] == false),
        "{}",
        f.node.log()
    );
}

#[test]
fn workers_show_in_flight_forwards_and_which_drain_applies() {
    let (f, worker, _session) = Fixture::with_worker(
        &[("PINBOARD_FORWARDS__TIMEOUT_MS", "3000")],
        "console-workers",
    );
    let ops = operator();
    let entry = |f: &Fixture| {
        let r = get(f.node.addr, "/registry/workers", Some(&ops));
        assert_eq!(r.status, 200);
        r.json()["workers"][0].clone()
    };
    let w = entry(&f);
    assert_eq!(
        (&w["inflight"], &w["workerDraining"], &w["operatorDrain"]),
        (&json!(0), &json!(false), &Value::Null),
        "{w}"
    );
    assert!(w.get("drain").is_none());

    // Two forwards the worker holds without answering, until the node's timeout (504).
    worker.set_serve(Serve::Hang);
    let addr = f.node.addr;
    let hung: Vec<_> = (0..2)
        .map(|i| std::thread::spawn(move || get(addr, &format!("/threads/h{i}/x"), None).status))
        .collect();
    assert!(
        eventually(Duration::from_secs(10), || entry(&f)["inflight"] == 2),
        "{}",
        entry(&f)
    );
    for thread in hung {
        assert_eq!(thread.join().unwrap(), 504);
    }
    assert_eq!(entry(&f)["inflight"], 0);

    let drain = |deadline: Value| {
        let body = json!({"clientId": "w1", "deadline": deadline});
        assert_eq!(f.post("drain", &ops, &body).status, 200);
    };
    drain(Value::Null);
    let w = entry(&f);
    assert_eq!(w["operatorDrain"], json!({"deadline": null}), "{w}");
    assert_eq!(
        (&w["draining"], &w["workerDraining"]),
        (&json!(true), &json!(false))
    );
    assert!(
        w.get("drain").is_none(),
        "a cordon has no drain deadline: {w}"
    );
    drain(json!(60));
    let w = entry(&f);
    let deadline = w["drain"]["deadline"].clone();
    assert!(deadline.as_u64().is_some(), "{w}");
    assert_eq!(w["operatorDrain"], json!({ "deadline": deadline }));
    let r = f.post("undrain", &ops, &json!({"clientId": "w1"}));
    assert_eq!(r.json(), json!({"revoked": true}));
    let w = entry(&f);
    assert_eq!(
        (&w["operatorDrain"], &w["draining"]),
        (&Value::Null, &json!(false))
    );
}

#[test]
fn workers_show_their_own_draining_flag_apart() {
    let (f, worker, session) = Fixture::with_worker(&[], "console-own-drain");
    let r = f.heartbeat(&worker, &session, json!({"draining": true}));
    assert_eq!(r.status, 200, "{}", r.text());
    let w = get(f.node.addr, "/registry/workers", Some(&operator())).json()["workers"][0].clone();
    assert_eq!(
        (&w["draining"], &w["workerDraining"], &w["operatorDrain"]),
        (&json!(true), &json!(true), &Value::Null),
        "{w}"
    );
}

/// Rows in every bucket of two namespaces, most live, some of a gone owner, fenced or tagged.
fn write_rows(f: &Fixture, session: &str) -> BTreeMap<(String, String), Value> {
    let mut rows = BTreeMap::new();
    for (ns, n) in [("/threads", 2600), ("/docs", 700)] {
        let mut by_bucket: BTreeMap<u32, Vec<String>> = BTreeMap::new();
        for i in 0..n {
            let id = format!("r{i:05}");
            let mut row = json!({"sessionId": session, "epoch": (100 + i).to_string()});
            match i % 17 {
                3 => row["sessionId"] = json!("gone"),
                5 => row["expiry"] = json!(1),
                7 => row["expiry"] = json!(4_000_000_000_000u64),
                9 => row["tag"] = json!("ws:W"),
                _ => {}
            }
            by_bucket
                .entry(bucket_of(&id, SHARDS))
                .or_default()
                .extend([id.clone(), row.to_string()]);
            rows.insert((ns.to_owned(), id), row);
        }
        for (bucket, fields) in by_bucket {
            let key = f.keys.placements(bucket, "default", ns);
            for batch in fields.chunks(1000) {
                let mut args = vec!["HSET", key.as_str()];
                args.extend(batch.iter().map(String::as_str));
                f.cli(&args);
            }
        }
    }
    rows
}

/// What a listing keeps of `rows`: live owner, fence not passed, then the filters.
fn kept(
    rows: &BTreeMap<(String, String), Value>,
    ns: Option<&str>,
    prefix: &str,
    tag: Option<&str>,
) -> Vec<(String, String)> {
    rows.iter()
        .filter(|((n, id), row)| {
            row["sessionId"] != "gone"
                && row["expiry"] != 1
                && ns.is_none_or(|ns| ns == n)
                && id.starts_with(prefix)
                && tag.is_none_or(|t| row["tag"] == t)
        })
        .map(|(key, _)| key.clone())
        .collect()
}

/// The entries of an overview answer, as ((ns, id), entry).
fn entries(overview: &Value) -> Vec<((String, String), Value)> {
    let mut all = Vec::new();
    for group in overview["namespaces"].as_array().unwrap() {
        let ns = group["namespace"].as_str().unwrap().to_owned();
        for e in group["entries"].as_array().unwrap() {
            all.push((
                (ns.clone(), e["id"].as_str().unwrap().to_owned()),
                e.clone(),
            ));
        }
    }
    all
}

/// Every page of `query` with `limit`: each page's entries and whether it had a `next`.
fn pages(f: &Fixture, query: &str, limit: usize) -> Vec<Vec<((String, String), Value)>> {
    let ops = operator();
    let mut all = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut path = format!("/registry/overview?{query}&limit={limit}");
        if let Some(c) = &cursor {
            path.push_str(&format!("&cursor={c}"));
        }
        let r = get(f.node.addr, &path, Some(&ops));
        assert_eq!(r.status, 200, "{path}: {}", r.text());
        let page = r.json();
        assert!(page["workers"].is_array() && page["bindings"].is_object());
        all.push(entries(&page));
        match &page["next"] {
            Value::Null => return all,
            Value::String(next) => cursor = Some(next.clone()),
            other => panic!("next: {other}"),
        }
        assert!(all.len() < 1000, "no end to the pages");
    }
}

#[test]
fn the_overview_pages_through_every_bucket_each_row_once() {
    let (f, _worker, session) = Fixture::with_worker(&[], "console-paging");
    let rows = write_rows(&f, &session);

    for (query, ns, prefix, tag, limit) in [
        ("", None, "", None, 100),
        ("ns=/threads", Some("/threads"), "", None, 250),
        ("ns=/docs", Some("/docs"), "", None, 1),
        ("ns=/threads&prefix=r01", Some("/threads"), "r01", None, 50),
        ("tag=ws:W", None, "", Some("ws:W"), 1000),
    ] {
        let paged = pages(&f, query, limit);
        // A page reads about `limit` rows: never many more than it asked for (a small hash
        // is handed out whole, up to 128 fields), whatever the filter keeps.
        for page in &paged {
            assert!(page.len() <= limit.max(128) + 16, "{query}: {}", page.len());
        }
        if limit == 1 {
            assert!(paged.len() > 100, "{query}: {} pages", paged.len());
        }
        let mut listed: Vec<(String, String)> =
            paged.iter().flatten().map(|(key, _)| key.clone()).collect();
        let count = listed.len();
        listed.sort();
        listed.dedup();
        assert_eq!(count, listed.len(), "{query}: a row came twice");
        let mut expected = kept(&rows, ns, prefix, tag);
        expected.sort();
        assert_eq!(listed, expected, "{query}");
        // Each entry as the row says, with its epoch.
        for (key, entry) in paged.iter().flatten() {
            let row = &rows[key];
            assert_eq!(entry["epoch"], row["epoch"]);
            assert_eq!(entry["sessionId"], session);
            assert_eq!(entry.get("tag"), row.get("tag"));
            assert_eq!(entry.get("expiry"), row.get("expiry"));
        }
        // Without limit, cursor or id: today's answer, every kept row in one body, no epoch
        // and no next.
        let whole = get(
            f.node.addr,
            &format!("/registry/overview?{query}"),
            Some(&operator()),
        )
        .json();
        assert!(whole.get("next").is_none());
        let mut all: Vec<(String, String)> = entries(&whole).into_iter().map(|(k, _)| k).collect();
        all.sort();
        assert_eq!(all, expected, "{query}");
        assert!(
            entries(&whole)
                .iter()
                .all(|(_, e)| e.get("epoch").is_none())
        );
    }
}

#[test]
fn the_overview_reads_one_id_without_a_scan() {
    let (f, _worker, session) = Fixture::with_worker(&[], "console-exact");
    let rows = write_rows(&f, &session);
    let ops = operator();
    let one = |query: &str| {
        let r = get(
            f.node.addr,
            &format!("/registry/overview?{query}"),
            Some(&ops),
        );
        assert_eq!(r.status, 200, "{query}: {}", r.text());
        let page = r.json();
        assert_eq!(page["next"], Value::Null);
        entries(&page)
    };
    f.cli(&["CONFIG", "SET", "slowlog-log-slower-than", "0"]);
    f.cli(&["SLOWLOG", "RESET"]);
    let found = one("ns=/threads&id=r00010");
    assert_eq!(found.len(), 1);
    let ((ns, id), entry) = &found[0];
    assert_eq!((ns.as_str(), id.as_str()), ("/threads", "r00010"));
    assert_eq!(entry["epoch"], "110");
    assert_eq!(entry["sessionId"], session);
    let log = f.cli(&["SLOWLOG", "GET", "-1"]);
    assert!(!log.contains("HSCAN"), "{log}");
    f.cli(&["CONFIG", "SET", "slowlog-log-slower-than", "10000"]);

    assert_eq!(
        rows[&("/threads".into(), "r00003".into())]["sessionId"],
        "gone"
    );
    for query in [
        "ns=/threads&id=r00003",  // its owner is gone
        "ns=/threads&id=r00005",  // its wind-down passed
        "ns=/threads&id=nothing", // no row
        "ns=/threads&id=r00009&tag=ws:V",
        "ns=/threads&id=r00010&prefix=x",
        "ns=/other&id=r00010",
    ] {
        assert!(one(query).is_empty(), "{query}");
    }
    let fenced = one("ns=/threads&id=r00007");
    assert_eq!(fenced[0].1["expiry"], 4_000_000_000_000u64);
}

#[test]
fn malformed_paging_is_refused() {
    let f = Fixture::new(&[]);
    let ops = operator();
    for (query, error) in [
        (
            "limit=0",
            "invalid limit: expected a whole number from 1 to 1000",
        ),
        (
            "limit=1001",
            "invalid limit: expected a whole number from 1 to 1000",
        ),
        (
            "limit=ten",
            "invalid limit: expected a whole number from 1 to 1000",
        ),
        (
            "limit=",
            "invalid limit: expected a whole number from 1 to 1000",
        ),
        ("cursor=abc", "invalid cursor"),
        ("cursor=%21%21", "invalid cursor"),
        // base64url of "9:0:/docs:default": bucket 9 of 4.
        ("cursor=OTowOi9kb2NzOmRlZmF1bHQ", "invalid cursor"),
        // base64url of "1:0:/docs:default", asked for another namespace.
        (
            "ns=/threads&cursor=MTowOi9kb2NzOmRlZmF1bHQ",
            "invalid cursor",
        ),
        ("id=abc", "id requires ns"),
        ("ns=/threads&id=a%20b", "invalid instance id"),
        ("ns=/threads&id=abc&limit=5", "id excludes limit and cursor"),
        ("ns=threads&limit=5", "invalid namespace"),
    ] {
        let r = get(
            f.node.addr,
            &format!("/registry/overview?{query}"),
            Some(&ops),
        );
        assert_eq!(r.status, 400, "{query}: {}", r.text());
        assert_eq!(r.json(), json!({ "error": error }), "{query}");
    }
    // The good twin of the cursor above is taken.
    let r = get(
        f.node.addr,
        "/registry/overview?ns=/docs&cursor=MTowOi9kb2NzOmRlZmF1bHQ",
        Some(&ops),
    );
    assert_eq!(r.status, 200, "{}", r.text());
}
