//! A node, its private redis-server, and the calls tests make on the registry as a worker
//! would: register, heartbeat, and direct looks at what the registry left in Redis.

use serde_json::{Value, json};

use std::time::Duration;

use super::http::{Reply, get, post_json};
use super::node::{Node, eventually};
use super::redis::RedisServer;
use super::worker::TestWorker;
use pinboard::store::{Keys, bucket_of};

/// The fixture's node runs this many buckets.
pub const SHARDS: u32 = 4;

pub struct Fixture {
    pub redis: RedisServer,
    pub node: Node,
    /// A worker credential for account `acct-a` on every namespace.
    pub token: String,
    /// The node's key names.
    pub keys: Keys,
}

impl Fixture {
    pub fn new(env: &[(&str, &str)]) -> Fixture {
        Fixture::on(RedisServer::start(), env)
    }

    /// A node on a redis-server the test started its own way (with persistence, say).
    pub fn on(redis: RedisServer, env: &[(&str, &str)]) -> Fixture {
        let mut env = env.to_vec();
        let shards = SHARDS.to_string();
        env.push(("PINBOARD_SHARDS", &shards));
        env.push(("PINBOARD_VERIFY_TIMEOUT_MS", "500"));
        let node = Node::start(&redis.url(), &env);
        let token = node.worker_token("acct-a");
        Fixture {
            redis,
            node,
            token,
            keys: super::keys(SHARDS),
        }
    }

    /// A fixture past its cold start with one [`TestWorker`] registered as `w1` on `/threads`
    /// and `/docs`: (fixture, worker, its session).
    pub fn with_worker(env: &[(&str, &str)], label: &str) -> (Fixture, TestWorker, String) {
        let f = Fixture::new(env);
        f.warm();
        let worker = TestWorker::start(label);
        let session = f.registered(&worker, "w1");
        (f, worker, session)
    }

    /// The node's `/metrics` text, scraped with an operator credential over every namespace.
    pub fn metrics(&self) -> String {
        let operator = super::node::token("ops", &["pinboard:operator"], &["*"]);
        let r = get(self.node.addr, "/metrics", Some(&operator));
        assert_eq!(r.status, 200, "{}", r.text());
        r.text()
    }

    /// One sample of [`Fixture::metrics`], 0 when absent.
    pub fn metric(&self, sample: &str) -> f64 {
        super::metric(&self.metrics(), sample).unwrap_or(0.0)
    }

    pub fn post(&self, route: &str, token: &str, body: &Value) -> Reply {
        post_json(
            self.node.addr,
            &format!("/registry/{route}"),
            Some(token),
            &body.to_string(),
        )
    }

    pub fn register_body(&self, worker: &TestWorker, client: &str, extra: Value) -> Value {
        register_body(worker, client, extra)
    }

    pub fn register(&self, worker: &TestWorker, client: &str, extra: Value) -> Reply {
        let body = self.register_body(worker, client, extra);
        self.post("register", &self.token, &body)
    }

    pub fn registered(&self, worker: &TestWorker, client: &str) -> String {
        let r = self.register(worker, client, json!({}));
        assert_eq!(r.status, 200, "{}\n{}", r.text(), self.node.log());
        r.json()["sessionId"].as_str().unwrap().to_string()
    }

    /// [`registered`](Self::registered) at another advertise URL (a TLS front's, say).
    pub fn registered_at(&self, worker: &TestWorker, url: &str) -> String {
        let r = self.register(worker, "w1", json!({ "advertiseUrl": url }));
        assert_eq!(r.status, 200, "{}\n{}", r.text(), self.node.log());
        r.json()["sessionId"].as_str().unwrap().to_string()
    }

    pub fn heartbeat(&self, worker: &TestWorker, session: &str, extra: Value) -> Reply {
        let (challenge, value) = worker.challenge();
        let mut body = json!({
            "sessionId": session, "headroom": 5, "draining": false,
            "challenge": challenge, "challengeValue": value,
        });
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        self.post("heartbeat", &self.token, &body)
    }

    pub fn cli(&self, args: &[&str]) -> String {
        self.redis.cli(args)
    }

    pub fn session_record(&self, session: &str) -> Option<Value> {
        let raw = self.cli(&["HGET", self.keys.sessions(), session]);
        (!raw.is_empty()).then(|| serde_json::from_str(&raw).unwrap())
    }

    /// A session's live copy in a bucket: `None` where there is none, or only the tombstone a
    /// drop leaves.
    pub fn bucket_record(&self, bucket: u32, session: &str) -> Option<Value> {
        let raw = self.cli(&["HGET", &self.keys.bucket(bucket).workers, session]);
        let copy: Value = serde_json::from_str(&raw).ok()?;
        (copy.get("dropped").is_none()).then_some(copy)
    }

    /// The sessions with a live copy (no tombstone) in a bucket.
    pub fn live_copies(&self, bucket: u32) -> std::collections::BTreeSet<String> {
        let all = self.cli(&["HGETALL", &self.keys.bucket(bucket).workers]);
        let lines: Vec<&str> = all.lines().collect();
        lines
            .chunks(2)
            .filter(|pair| !pair[1].contains("\"dropped\""))
            .map(|pair| pair[0].to_owned())
            .collect()
    }

    pub fn in_ns_list(&self, bucket: u32, ns: &str, session: &str) -> bool {
        self.cli(&["SISMEMBER", &self.keys.nsw(bucket, "", ns), session]) == "1"
    }

    /// Writes a placement row directly, as the resolve script will.
    pub fn put_row(&self, ns: &str, id: &str, row: Value) {
        let bucket = bucket_of(id, SHARDS);
        self.cli(&[
            "HSET",
            &self.keys.placements(bucket, "default", ns),
            id,
            &row.to_string(),
        ]);
    }

    pub fn row(&self, ns: &str, id: &str) -> Option<Value> {
        let bucket = bucket_of(id, SHARDS);
        let raw = self.cli(&["HGET", &self.keys.placements(bucket, "default", ns), id]);
        (!raw.is_empty()).then(|| serde_json::from_str(&raw).unwrap())
    }

    /// Ends the cold-start quarantine of every bucket, as if the registry had been up for a
    /// lease already.
    pub fn warm(&self) {
        for bucket in 0..SHARDS {
            self.cli(&["SET", &self.keys.bucket(bucket).boot_time, "0"]);
        }
    }

    /// Warms the fixture, registers a worker and forwards a request to it: the worker and its
    /// session.
    pub fn serves(&self, label: &str) -> (TestWorker, String) {
        self.warm();
        let worker = TestWorker::start(label);
        let session = self.registered(&worker, "w1");
        let r = get(self.node.addr, "/threads/a1/x", None);
        assert_eq!(r.status, 200, "{}\n{}", r.text(), self.node.log());
        assert_eq!(r.json()["path"], "/threads/a1/x");
        (worker, session)
    }

    /// While the node cannot use Redis (a login refused, a certificate that does not verify):
    /// `/readyz` turns 503 and stays so; the data plane and a registry route answer 503 +
    /// `Retry-After: 1` with the spec's body, never 500.
    pub fn unavailable_until_fixed(&self, worker: &TestWorker, session: &str) {
        let addr = self.node.addr;
        assert!(
            eventually(Duration::from_secs(15), || {
                (0..6).all(|_| get(addr, "/readyz", None).status == 503)
            }),
            "readyz stayed 200 with Redis unusable:\n{}",
            self.node.log()
        );
        for i in 0..10 {
            for r in [
                get(addr, &format!("/threads/a{i}/x"), None),
                self.heartbeat(worker, session, json!({})),
            ] {
                assert_eq!(r.status, 503, "{}\n{}", r.text(), self.node.log());
                assert_eq!(r.header("retry-after"), Some("1"));
                let error = r.json()["error"].clone();
                assert!(
                    error == "registry unavailable, retry" || error == "not the serving fleet",
                    "{error}"
                );
            }
        }
        assert!(get(addr, "/readyz", None).body.is_empty());
    }
}

/// A registration of `worker` as `client` on `/threads` and `/docs`, with `extra` members
/// overriding the defaults.
pub fn register_body(worker: &TestWorker, client: &str, extra: Value) -> Value {
    let (challenge, value) = worker.challenge();
    let mut body = json!({
        "clientId": client,
        "secret": worker.secret(),
        "namespaces": ["/threads", "/docs"],
        "advertiseUrl": worker.url(),
        "headroom": 10,
        "draining": false,
        "challenge": challenge,
        "challengeValue": value,
    });
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}
