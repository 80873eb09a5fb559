//! The operator routes over buckets of more than one page: `GET /registry/overview` and an
//! id-less `POST /registry/wind_down` read the placements hashes one `HSCAN … COUNT 250` at a
//! time, never with one whole-hash read, and answer exactly as the spec says. On one
//! redis-server (where the test also reads the server's SLOWLOG to see every command the node
//! sent) and on a 3-master Redis Cluster.

mod support;

use std::collections::BTreeSet;

use serde_json::{Value, json};
use support::fleet::{Fixture, SHARDS};
use support::http::{Client, Reply, get};
use support::node::{Node, token};
use support::redis::{RedisCluster, RedisServer};
use support::worker::TestWorker;

use pinboard::store::{Keys, PAGE, SCRIPT_PAGE, bucket_of};

/// Rows in the one full bucket: more than ten pages of `HSCAN … COUNT 250`.
const FULL: usize = 2_600;
/// Rows spread over the other buckets.
const SPREAD: usize = 300;
/// A wind-down fence still pending (epoch ms, year 2096).
const PENDING: u64 = 4_000_000_000_000;

/// `n` ids `{prefix}{i}` that fall in `bucket`, and `spread` more that fall elsewhere.
fn ids(prefix: &str, bucket: u32, shards: u32, n: usize, spread: usize) -> Vec<String> {
    let (mut inside, mut outside) = (Vec::new(), Vec::new());
    for i in 0.. {
        if inside.len() == n && outside.len() == spread {
            break;
        }
        let id = format!("{prefix}{i}");
        if bucket_of(&id, shards) == bucket {
            if inside.len() < n {
                inside.push(id);
            }
        } else if outside.len() < spread {
            outside.push(id);
        }
    }
    inside.extend(outside);
    inside
}

/// The rows the tests write, by id: most owned by `session`, some tagged, some fenced (past or
/// pending), some of an owner that is gone, some placeholders of the durability sweep.
fn row_of(i: usize, session: &str) -> Value {
    let epoch = (1000 + i).to_string();
    let mut row = match i % 13 {
        5 => json!({"sessionId": "gone-session", "epoch": epoch}),
        9 => json!({"sessionId": "", "hostname": "h"}),
        _ => json!({"sessionId": session, "epoch": epoch}),
    };
    if i % 7 == 3 {
        row["tag"] = json!(if i.is_multiple_of(2) { "ws:W" } else { "ws:V" });
    }
    match i % 11 {
        4 => row["expiry"] = json!(1),
        8 => row["expiry"] = json!(PENDING),
        _ => {}
    }
    row
}

/// Writes `rows` into the (default env) placements hashes of `ns`, one HSET per bucket, through
/// `cli` (a redis-cli of the test's own, not the node).
fn write_rows(cli: &dyn Fn(&[&str]) -> String, keys: &Keys, ns: &str, rows: &[(String, Value)]) {
    let shards = keys.shards();
    for bucket in 0..shards {
        let key = keys.placements(bucket, "default", ns);
        let encoded: Vec<(String, String)> = rows
            .iter()
            .filter(|(id, _)| bucket_of(id, shards) == bucket)
            .map(|(id, row)| (id.clone(), row.to_string()))
            .collect();
        // Batches of 500 fields, well under any argument-length limit.
        for batch in encoded.chunks(500) {
            let mut args = vec!["HSET", key.as_str()];
            for (id, row) in batch {
                args.extend([id.as_str(), row.as_str()]);
            }
            cli(&args);
        }
    }
}

/// What the overview lists of `rows` (the spec's live placements: owner live, fence not
/// passed; then the `prefix` and `tag` filters), sorted by id.
fn expected_entries(
    rows: &[(String, Value)],
    live: &str,
    prefix: &str,
    tag: Option<&str>,
) -> Vec<Value> {
    let mut entries: Vec<(String, Value)> = rows
        .iter()
        .filter(|(id, row)| {
            row["sessionId"] == live
                && row["expiry"].as_u64().is_none_or(|e| e > 1)
                && id.starts_with(prefix)
                && tag.is_none_or(|t| row["tag"] == t)
        })
        .map(|(id, row)| {
            let mut entry = json!({"id": id, "sessionId": live});
            if let Some(expiry) = row.get("expiry") {
                entry["expiry"] = expiry.clone();
            }
            if let Some(tag) = row.get("tag") {
                entry["tag"] = tag.clone();
            }
            (id.clone(), entry)
        })
        .collect();
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    entries.into_iter().map(|(_, e)| e).collect()
}

fn namespace<'a>(overview: &'a Value, ns: &str) -> &'a Value {
    overview["namespaces"]
        .as_array()
        .unwrap_or_else(|| panic!("no namespaces: {overview}"))
        .iter()
        .find(|n| n["namespace"] == ns)
        .unwrap_or_else(|| panic!("no {ns} in {overview}"))
}

fn ok_json(r: Reply) -> Value {
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

/// Every command the server ran since the last reset, as its argument list (those scripts
/// ran included): SLOWLOG with a threshold of 0 logs them all.
fn logged_commands(redis: &RedisServer) -> Vec<Vec<String>> {
    let log: Value = serde_json::from_str(&redis.cli(&["--json", "SLOWLOG", "GET", "-1"])).unwrap();
    log.as_array()
        .unwrap()
        .iter()
        .map(|entry| {
            entry[3]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| a.as_str().unwrap().to_string())
                .collect()
        })
        .collect()
}

fn log_everything(redis: &RedisServer) {
    redis.cli(&["CONFIG", "SET", "slowlog-log-slower-than", "0"]);
    redis.cli(&["CONFIG", "SET", "slowlog-max-len", "100000"]);
    redis.cli(&["SLOWLOG", "RESET"]);
}

/// No command read a placements hash whole; and the pages the node asked for: how many HSCANs
/// of `key`, each with `COUNT 250`.
fn scans_of(commands: &[Vec<String>], key: &str) -> usize {
    for args in commands {
        let name = args[0].to_ascii_uppercase();
        let on_placements = args.get(1).is_some_and(|k| k.ends_with(":placements"));
        assert!(
            !(on_placements && ["HGETALL", "HVALS", "HKEYS"].contains(&name.as_str())),
            "a whole-hash read: {args:?}"
        );
        if name == "HSCAN" && on_placements {
            let count = args.iter().position(|a| a.eq_ignore_ascii_case("COUNT"));
            assert_eq!(
                count.map(|c| args[c + 1].as_str()),
                Some(PAGE.to_string().as_str()),
                "{args:?}"
            );
        }
        // A script gets at most SCRIPT_PAGE ids: 3 + 3 keys + 7 + 3 per row, the log keeping 31
        // and counting the rest.
        if name == "EVALSHA"
            && let Some(more) = args.last().and_then(|a| a.strip_prefix("... ("))
        {
            let more: usize = more.split(' ').next().unwrap().parse().unwrap();
            assert!(
                31 + more <= 3 + 3 + 7 + 3 * SCRIPT_PAGE,
                "{more} more: {args:?}"
            );
        }
    }
    commands
        .iter()
        .filter(|args| args[0].eq_ignore_ascii_case("HSCAN") && args[1] == key)
        .count()
}

#[test]
fn overview_and_wind_down_page_through_a_bucket_of_several_pages() {
    let f = Fixture::new(&[("PINBOARD_LEASE_TTL_MS", "60000")]);
    let worker = TestWorker::start("paged");
    let session = f.registered(&worker, "c");
    let cli = |args: &[&str]| f.cli(args);
    let rows: Vec<(String, Value)> = ids("p-", 0, SHARDS, FULL, SPREAD)
        .into_iter()
        .enumerate()
        .map(|(i, id)| (id, row_of(i, &session)))
        .collect();
    write_rows(&cli, &f.keys, "/threads", &rows);
    let full = f.keys.placements(0, "default", "/threads");
    assert_eq!(f.cli(&["HLEN", &full]), FULL.to_string());
    assert_eq!(f.cli(&["OBJECT", "ENCODING", &full]), "hashtable");
    let ops = token("ops", &["pinboard:operator"], &["*"]);

    log_everything(&f.redis);
    let all = ok_json(get(f.node.addr, "/registry/overview", Some(&ops)));
    let commands = logged_commands(&f.redis);
    assert!(
        scans_of(&commands, &full) >= 3,
        "{} commands",
        commands.len()
    );
    let threads = namespace(&all, "/threads");
    let want = expected_entries(&rows, &session, "", None);
    assert!(want.len() > 2 * 1000, "{}", want.len());
    assert_eq!(threads["entries"], Value::Array(want));
    assert_eq!(threads["sessionIds"], json!([session]));
    assert_eq!(all["workers"].as_array().unwrap().len(), 1);

    // HTTP/1.1 gets the listing streamed (chunked), on a connection that stays open; HEAD
    // and HTTP/1.0 get it whole, with its length: the same bytes.
    let raw =
        |request: &str| format!("{request}\r\nHost: t\r\nAuthorization: Bearer {ops}\r\n\r\n");
    let mut client = Client::connect(f.node.addr);
    let streamed = client.request(raw("GET /registry/overview HTTP/1.1").as_bytes());
    assert_eq!(streamed.header("transfer-encoding"), Some("chunked"));
    assert!(streamed.header("content-length").is_none());
    assert!(streamed.header("date").is_some());
    assert_eq!(streamed.header("content-type"), Some("application/json"));
    let again = client.request(raw("GET /registry/overview HTTP/1.1").as_bytes());
    assert_eq!(again.body, streamed.body, "the connection is reused");
    let head = client.request(raw("HEAD /registry/overview HTTP/1.1").as_bytes());
    assert_eq!(
        head.header("content-length"),
        Some(streamed.body.len().to_string().as_str())
    );
    let old =
        Client::connect(f.node.addr).request(raw("GET /registry/overview HTTP/1.0").as_bytes());
    assert_eq!(
        old.header("content-length"),
        Some(streamed.body.len().to_string().as_str())
    );
    assert_eq!(old.body, streamed.body);
    let closing = Client::connect(f.node.addr).request(
        format!("GET /registry/overview HTTP/1.1\r\nHost: t\r\nConnection: close\r\nAuthorization: Bearer {ops}\r\n\r\n").as_bytes(),
    );
    assert_eq!(closing.header("connection"), Some("close"));
    assert_eq!(closing.body, streamed.body);

    // The filters apply to every page.
    let one = ok_json(get(
        f.node.addr,
        "/registry/overview?ns=/threads&prefix=p-1&tag=ws:W",
        Some(&ops),
    ));
    assert_eq!(one["namespaces"].as_array().unwrap().len(), 1, "{one}");
    let want = expected_entries(&rows, &session, "p-1", Some("ws:W"));
    assert!(want.len() > 10, "{}", want.len());
    assert_eq!(one["namespaces"][0]["entries"], Value::Array(want));

    // Without an id: every row of the namespace is fenced, each owner that has a record is
    // told once per row, whatever pages HSCAN cut.
    log_everything(&f.redis);
    let r = f.post(
        "wind_down",
        &ops,
        &json!({"namespace": "/threads", "deadline": 60}),
    );
    let commands = logged_commands(&f.redis);
    assert!(
        scans_of(&commands, &full) >= 3,
        "{} commands",
        commands.len()
    );
    let owned: BTreeSet<&str> = rows
        .iter()
        .filter(|(_, row)| row["sessionId"] == session.as_str())
        .map(|(id, _)| id.as_str())
        .collect();
    assert_eq!(ok_json(r), json!({"queued": owned.len()}));
    let queue = f.keys.control(&session);
    let queued: Vec<Value> = f
        .cli(&["HVALS", &queue])
        .lines()
        .map(|m| serde_json::from_str(m).unwrap())
        .collect();
    assert_eq!(queued.len(), owned.len(), "one message per row");
    let told: BTreeSet<&str> = queued.iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert_eq!(told, owned);
    assert!(queued.iter().all(|m| m["ns"] == "/threads"));
    for (id, before) in &rows {
        let row = f.row("/threads", id).unwrap();
        let fence = row["expiry"]
            .as_u64()
            .unwrap_or_else(|| panic!("{id}: {row}"));
        assert!(fence > 1_000_000_000_000 && fence < PENDING, "{id}: {row}");
        assert_eq!(row["sessionId"], before["sessionId"], "{id}");
        assert_eq!(row["tag"], before["tag"], "{id}");
    }
    // The worker hears them on its next heartbeat.
    let beat = f.heartbeat(&worker, &session, json!({})).json();
    assert_eq!(beat["messages"].as_array().unwrap().len(), owned.len());

    // And the fenced rows are still live placements with their pending fence (its expiry).
    let after = ok_json(get(
        f.node.addr,
        "/registry/overview?ns=/threads",
        Some(&ops),
    ));
    let entries = namespace(&after, "/threads")["entries"].as_array().unwrap();
    assert_eq!(entries.len(), owned.len());
    assert!(entries.iter().all(|e| e["expiry"].is_u64()));
}

/// `redis-cli -c` against the cluster: it follows redirects to the key's master.
fn cluster_cli(cluster: &RedisCluster, args: &[&str]) -> String {
    let mut all = vec!["-c"];
    all.extend_from_slice(args);
    cluster.nodes()[0].cli(&all)
}

#[test]
fn overview_and_wind_down_page_through_buckets_on_a_cluster() {
    let keys = support::keys(16);
    let cluster = RedisCluster::start();
    let node = Node::start(
        &cluster.url(),
        &[
            ("PINBOARD_SHARDS", "16"),
            ("PINBOARD_LEASE_TTL_MS", "60000"),
        ],
    );
    let worker = TestWorker::start("cluster-paged");
    let (challenge, value) = worker.challenge();
    let body = json!({
        "clientId": "c1", "secret": worker.secret(), "namespaces": ["/threads"],
        "advertiseUrl": worker.url(), "headroom": 100, "draining": false,
        "challenge": challenge, "challengeValue": value,
    });
    let r = support::http::post_json(
        node.addr,
        "/registry/register",
        Some(&node.worker_token("acct")),
        &body.to_string(),
    );
    let session = ok_json(r)["sessionId"].as_str().unwrap().to_string();

    let cli = |args: &[&str]| cluster_cli(&cluster, args);
    let rows: Vec<(String, Value)> = ids("c-", 5, 16, FULL, SPREAD)
        .into_iter()
        .enumerate()
        .map(|(i, id)| (id, row_of(i, &session)))
        .collect();
    write_rows(&cli, &keys, "/threads", &rows);
    let full = keys.placements(5, "default", "/threads");
    assert_eq!(cli(&["HLEN", &full]), FULL.to_string());

    let ops = token("ops", &["pinboard:operator"], &["*"]);
    let all = ok_json(get(node.addr, "/registry/overview", Some(&ops)));
    assert_eq!(
        namespace(&all, "/threads")["entries"],
        Value::Array(expected_entries(&rows, &session, "", None))
    );

    let owned = rows
        .iter()
        .filter(|(_, row)| row["sessionId"] == session.as_str())
        .count();
    let r = support::http::post_json(
        node.addr,
        "/registry/wind_down",
        Some(&ops),
        &json!({"namespace": "/threads", "deadline": 60}).to_string(),
    );
    assert_eq!(ok_json(r), json!({"queued": owned}));
    assert_eq!(cli(&["HLEN", &keys.control(&session)]), owned.to_string());
    let fenced = cli(&["HVALS", &full])
        .lines()
        .filter(|row| row.contains("\"expiry\""))
        .count();
    assert_eq!(fenced, FULL, "every row of the full bucket is fenced");
}
