//! Moving one instance and pausing it (issue 27, parts 2 and 3), against the real binary, a
//! real redis-server and real workers: `pinned-example` workers sharing a durable directory
//! (the ticker, whose count outlives a placement; the counter, which lives with one), and the
//! tests' own hand-made workers where a worker only has to answer.
//!
//! A move fences the row like a wind-down, names the successor, and tells the owner (`"moved":
//! true`); the owner's release leaves a placeholder naming the successor, and the next
//! placement goes there (`released` then `moved` in the ledger, by the operator). A pause
//! makes every node answer the id 503 `instance paused` + `Retry-After: 1` without touching
//! its placement; a resume serves it again at the same epoch. A pause outlives its owner and
//! the sweeper, and stops an unplaced id from being placed; the overview lists paused ids.
//!
//! The `pinned-example` tests need that binary next to this test's (`cargo test --workspace`
//! builds it; `cargo build -p pinned --bin pinned-example` does too), or `PINNED_EXAMPLE_BIN`.

mod support;

use std::process::Child;
use std::time::Duration;

use serde_json::{Value, json};
use support::fleet::{Fixture, SHARDS};
use support::http::{Reply, get, post_json};
use support::node::{Node, eventually, token};
use support::process::{Output, PinnedExample, ticks_logged};
use support::worker::TestWorker;

/// The operator whose `sub` the ledger and the pauses name.
const OPERATOR: &str = "ops-alice";

fn ops() -> String {
    token(OPERATOR, &["pinboard:operator"], &["*"])
}

/// The node's answer to an operator's `route` with `body`, which must be a 200.
fn act(f: &Fixture, route: &str, body: Value) -> Value {
    let r = f.post(route, &ops(), &body);
    assert_eq!(
        r.status,
        200,
        "{route} {body}: {}\n{}",
        r.text(),
        f.node.log()
    );
    r.json()
}

fn move_to(f: &Fixture, id: &str, to: &str, deadline: Value) -> Value {
    act(
        f,
        "move",
        json!({"namespace": "/threads", "id": id, "to": to, "deadline": deadline}),
    )
}

fn pause(f: &Fixture, id: &str, reason: Option<&str>) {
    let mut body = json!({"namespace": "/threads", "id": id});
    if let Some(reason) = reason {
        body["reason"] = reason.into();
    }
    assert_eq!(act(f, "pause", body), json!({"ok": true}));
}

fn resume(f: &Fixture, id: &str) {
    let body = json!({"namespace": "/threads", "id": id});
    assert_eq!(act(f, "resume", body), json!({"ok": true}));
}

/// Asserts that `route` with `body` is refused 403 to an operator of `/docs` only (the
/// namespace named) and to a worker's credential.
fn refused_out_of_scope(f: &Fixture, route: &str, body: &Value) {
    let elsewhere = token("ops-bob", &["pinboard:operator"], &["/docs"]);
    for (who, error) in [
        (&elsewhere, "namespace not allowed: /threads"),
        (&f.token, "forbidden"),
    ] {
        let r = f.post(route, who, body);
        assert_eq!(
            (r.status, r.json()),
            (403, json!({"error": error})),
            "{route} {body}"
        );
    }
}

/// The ledger of `/threads`'s `id`, newest first, as (reason, from, to, by).
fn history(f: &Fixture, id: &str) -> Vec<(String, Value, Value, Value)> {
    let r = get(
        f.node.addr,
        &format!("/registry/history?ns=/threads&id={id}&limit=1000"),
        Some(&ops()),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    (r.json()["entries"].as_array().unwrap().iter())
        .map(|e| {
            let reason = e["reason"].as_str().unwrap().to_owned();
            let by = e.get("by").cloned().unwrap_or(Value::Null);
            (reason, e["from"].clone(), e["to"].clone(), by)
        })
        .collect()
}

/// An entry of [`history`].
fn entry(
    reason: &str,
    from: &Value,
    to: &Value,
    by: Option<&str>,
) -> (String, Value, Value, Value) {
    (
        reason.into(),
        from.clone(),
        to.clone(),
        by.map_or(Value::Null, Value::from),
    )
}

/// The overview's entries for `id` (`?ns=/threads&id=`: one `HGET`), and the same id found in
/// the whole listing.
fn listed(f: &Fixture, id: &str) -> (Vec<Value>, Vec<Value>) {
    let exact = get(
        f.node.addr,
        &format!("/registry/overview?ns=/threads&id={id}"),
        Some(&ops()),
    );
    let whole = get(f.node.addr, "/registry/overview?ns=/threads", Some(&ops()));
    let of = |r: Reply| -> Vec<Value> {
        assert_eq!(r.status, 200, "{}", r.text());
        (r.json()["namespaces"].as_array().unwrap().iter())
            .flat_map(|g| g["entries"].as_array().unwrap().clone())
            .filter(|e| e["id"] == id)
            .collect()
    };
    (of(exact), of(whole))
}

/// Asserts the data plane's answer to a paused id.
fn answers_paused(r: &Reply) {
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.json(), json!({"error": "instance paused"}));
    assert_eq!(r.header("retry-after"), Some("1"));
}

/// A `pinned-example` worker of the fixture's node: its session and log.
struct Example {
    child: Child,
    output: Output,
    session: String,
}

impl Example {
    /// Registered as `client_id` on `/threads`, with `extra` arguments.
    fn start(node: &Node, client_id: &str, extra: &[&str]) -> Example {
        let example = PinnedExample {
            bin: &PinnedExample::sibling(),
            registry: &node.url(),
            namespaces: "/threads",
            client_id,
        };
        let token = node.worker_token("acct-a");
        let (child, output) = example.spawn(extra, &[("PINNED_TOKEN", &token)]);
        let session = loop {
            let line = (output.lines)
                .recv_timeout(Duration::from_secs(15))
                .unwrap_or_else(|_| panic!("{client_id} did not register:\n{}", output.log()));
            if let Some(session) = line.strip_prefix("registered session=") {
                break session.to_owned();
            }
        };
        Example {
            child,
            output,
            session,
        }
    }

    /// The ticks it logged for `/threads/{id}`, in order (one line per `_wake` it ran).
    fn ticks(&self, id: &str) -> Vec<u64> {
        ticks_logged(&self.output.log.lock().unwrap(), id)
    }
}

impl Drop for Example {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The node's log and the workers', for a failure's message.
fn logs(f: &Fixture, workers: &[&Example]) -> String {
    let workers: Vec<String> = workers.iter().map(|w| w.output.log()).collect();
    format!(
        "{}\n--- workers ---\n{}",
        f.node.log(),
        workers.join("\n---\n")
    )
}

/// The ticks saved for `/threads/{id}`, as its owner reads them from the store (`/ticks`).
fn saved_ticks(f: &Fixture, id: &str) -> Option<u64> {
    let r = get(f.node.addr, &format!("/threads/{id}/ticks"), None);
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["ticks"].as_u64()
}

#[test]
fn a_ticker_moves_to_the_named_worker_with_its_durable_state() {
    let f = Fixture::new(&[
        ("PINBOARD_LEASE_TTL_MS", "3000"),
        ("PINBOARD_SWEEP_INTERVAL_MS", "200"),
    ]);
    f.warm();
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("tickers");
    let durable = ["--durable-dir", store.to_str().unwrap(), "--tick-secs", "1"];
    let workers = [
        Example::start(&f.node, "example-1", &durable),
        Example::start(&f.node, "example-2", &durable),
    ];
    let everyone: Vec<&Example> = workers.iter().collect();
    let started = post_json(f.node.addr, "/threads/tick/ticker", None, "");
    assert_eq!(started.status, 200, "{}", logs(&f, &everyone));
    let owner_session = || {
        f.row("/threads", "tick")
            .and_then(|r| r["sessionId"].as_str().map(str::to_owned))
    };
    let from = (workers.iter())
        .position(|w| Some(&w.session) == owner_session().as_ref())
        .unwrap_or_else(|| panic!("{:?} is neither worker's", owner_session()));
    let (owner, heir) = (&workers[from], &workers[1 - from]);
    let heir_client = ["example-1", "example-2"][1 - from];
    assert!(
        eventually(Duration::from_secs(30), || saved_ticks(&f, "tick")
            >= Some(2)),
        "{}",
        logs(&f, &everyone)
    );

    // The operator moves it: the row is fenced for a minute and names the heir; the owner
    // hears a move, saves nothing more (a ticker saves at every tick) and releases at once.
    let moved = move_to(&f, "tick", heir_client, json!(60));
    assert_eq!(moved, json!({"queued": true, "to": heir.session}));
    let fenced = f.row("/threads", "tick").unwrap();
    assert_eq!(fenced["mv"], json!({"to": heir.session, "by": OPERATOR}));
    let fence = fenced["expiry"].as_u64().unwrap();
    let now = pinboard::clock::now_ms();
    assert!(
        fence > now + 50_000 && fence <= now + 60_000,
        "{fence} {now}"
    );
    let at_move = saved_ticks(&f, "tick").unwrap();

    // Once the owner let go (its release leaves the successor named), the next placement (the
    // sweep's next wake, or a request) goes to the heir, long before the fence passes.
    let released = eventually(Duration::from_secs(20), || {
        owner_session().as_ref() != Some(&owner.session)
    });
    assert!(
        released,
        "{:?}\n{}",
        f.row("/threads", "tick"),
        logs(&f, &everyone)
    );
    assert!(saved_ticks(&f, "tick").unwrap() >= at_move);
    assert_eq!(
        owner_session().as_ref(),
        Some(&heir.session),
        "{}",
        logs(&f, &everyone)
    );
    let placed = f.row("/threads", "tick").unwrap();
    assert!(
        placed.get("mv").is_none() && placed.get("expiry").is_none(),
        "{placed}"
    );

    // It goes on ticking there, from the count the first worker saved.
    assert!(
        eventually(Duration::from_secs(20), || heir.ticks("tick").len() >= 2),
        "{}",
        logs(&f, &everyone)
    );
    let on_heir = heir.ticks("tick");
    assert!(on_heir[0] > at_move, "{on_heir:?} after {at_move}");
    assert!(on_heir.windows(2).all(|w| w[1] == w[0] + 1), "{on_heir:?}");
    let last_on_owner = owner.ticks("tick").last().copied().unwrap_or(0);
    assert!(
        last_on_owner < on_heir[0],
        "{last_on_owner} then {on_heir:?}"
    );

    // The ledger: the operator's fence, the owner's release, the placement on the heir by
    // the move, named for the operator.
    let (a, b) = (json!(owner.session), json!(heir.session));
    let h = history(&f, "tick");
    assert_eq!(
        h[..3],
        [
            entry("moved", &Value::Null, &b, Some(OPERATOR)),
            entry("released", &a, &Value::Null, None),
            entry("wind-down", &a, &a, Some(OPERATOR)),
        ],
        "{h:?}"
    );
    assert_eq!(h.last().unwrap().0, "placed");
}

/// Two hand-made workers placed on by the fixture: `one` (`w1`) holds `/threads/a1`.
struct Two {
    f: Fixture,
    one: (TestWorker, String),
    two: (TestWorker, String),
}

fn two(env: &[(&str, &str)]) -> Two {
    let (f, one, s1) = Fixture::with_worker(env, "one");
    let r = get(f.node.addr, "/threads/a1/x", None);
    assert_eq!(r.status, 200, "{}", r.text());
    let two = TestWorker::start("two");
    let s2 = f.registered(&two, "w2");
    Two {
        f,
        one: (one, s1),
        two: (two, s2),
    }
}

/// The wind-down messages the next heartbeat of `worker` gets.
fn messages(f: &Fixture, worker: &(TestWorker, String)) -> Vec<Value> {
    let r = f.heartbeat(&worker.0, &worker.1, json!({}));
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["messages"].as_array().cloned().unwrap_or_default()
}

#[test]
fn a_release_leaves_the_successor_named_and_the_next_placement_goes_there() {
    let Two { f, one, two } = two(&[("PINBOARD_LEASE_TTL_MS", "3000")]);
    let e1 = f.row("/threads", "a1").unwrap()["epoch"].clone();
    assert_eq!(
        move_to(&f, "a1", "w2", Value::Null),
        json!({"queued": true, "to": two.1})
    );
    // The owner is told it is a move, at a deadline of one lease.
    let told = messages(&f, &one);
    assert_eq!(told.len(), 1, "{told:?}");
    assert_eq!(
        (&told[0]["id"], &told[0]["moved"]),
        (&json!("a1"), &json!(true))
    );
    let deadline = told[0]["deadline"].as_u64().unwrap();
    assert!((2..=3).contains(&deadline), "{deadline}");
    // Until it lets go, the owner serves it.
    let before = two.0.requests().len();
    assert_eq!(get(f.node.addr, "/threads/a1/x", None).status, 200);
    assert_eq!(two.0.requests().len(), before);

    let release = json!([{"sessionId": one.1, "namespace": "/threads", "id": "a1", "epoch": e1}]);
    assert_eq!(
        f.post("release", &f.token, &release).json(),
        json!({"released": 1})
    );
    let placeholder = f.row("/threads", "a1").unwrap();
    assert_eq!(placeholder["sessionId"], "");
    assert_eq!(placeholder["mv"]["to"], json!(two.1));
    // A placeholder is no live placement: the overview does not list it.
    assert_eq!(listed(&f, "a1"), (vec![], vec![]));

    let r = get(f.node.addr, "/threads/a1/x", None);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        two.0.requests().len(),
        before + 1,
        "served by the successor"
    );
    let row = f.row("/threads", "a1").unwrap();
    assert_eq!(row["sessionId"], json!(two.1));
    assert!(
        row.get("mv").is_none() && row.get("expiry").is_none(),
        "{row}"
    );
    assert!(
        messages(&f, &two).is_empty(),
        "the successor inherits no fence"
    );
    let (s1, s2) = (json!(one.1), json!(two.1));
    assert_eq!(
        history(&f, "a1"),
        [
            entry("moved", &Value::Null, &s2, Some(OPERATOR)),
            entry("released", &s1, &Value::Null, None),
            entry("wind-down", &s1, &s1, Some(OPERATOR)),
            entry("placed", &Value::Null, &s1, None),
        ]
    );
}

#[test]
fn a_move_to_a_worker_that_cannot_take_it_fences_and_the_placement_is_the_normal_choice() {
    let Two { f, one, two } = two(&[
        ("PINBOARD_LEASE_TTL_MS", "1500"),
        ("PINBOARD_SWEEP_INTERVAL_MS", "100"),
    ]);
    // w2 cordoned; w3 serves /docs only.
    let r = f.post(
        "drain",
        &ops(),
        &json!({"clientId": "w2", "deadline": null}),
    );
    assert_eq!(r.json(), json!({"drained": true}));
    let three = TestWorker::start("three");
    let r = f.register(&three, "w3", json!({"namespaces": ["/docs"]}));
    assert_eq!(r.status, 200, "{}", r.text());
    for to in ["w2", "w3", "nobody", ""] {
        let moved = move_to(&f, "a1", to, json!(0));
        assert_eq!(moved, json!({"queued": true, "to": null}), "{to}");
        let row = f.row("/threads", "a1").unwrap();
        assert!(
            row.get("mv").is_none() && row["expiry"].is_u64(),
            "{to}: {row}"
        );
    }
    // Every one of them a move: the owner hears `moved` each time.
    let told = messages(&f, &one);
    assert_eq!(told.len(), 4, "{told:?}");
    assert!(told.iter().all(|m| m["moved"] == true), "{told:?}");
    // An id without a row: nothing to fence, nothing written; `to` still says who would
    // take it.
    let none = move_to(&f, "nothing", "w2", Value::Null);
    assert_eq!(none, json!({"queued": false, "to": null}));
    let r = f.post("undrain", &ops(), &json!({"clientId": "w2"}));
    assert_eq!(r.json(), json!({"revoked": true}));
    let none = move_to(&f, "nothing", "w2", Value::Null);
    assert_eq!(none, json!({"queued": false, "to": two.1}));
    assert_eq!(f.row("/threads", "nothing"), None);
    // A plain wind-down drops a move's successor: the last act wins.
    assert_eq!(move_to(&f, "a1", "w2", json!(0))["to"], json!(two.1));
    let r = f.post(
        "wind_down",
        &ops(),
        &json!({"namespace": "/threads", "id": "a1", "deadline": 0}),
    );
    assert_eq!(r.json(), json!({"queued": true}));
    assert!(f.row("/threads", "a1").unwrap().get("mv").is_none());

    // Past the fence the next request places it afresh, as any placement: not a move.
    let fence = f.row("/threads", "a1").unwrap()["expiry"].as_u64().unwrap();
    let passed = eventually(Duration::from_secs(10), || {
        f.heartbeat(&one.0, &one.1, json!({}));
        f.heartbeat(&two.0, &two.1, json!({}));
        std::thread::sleep(Duration::from_millis(100));
        pinboard::clock::now_ms() > fence + 100
    });
    assert!(passed);
    let r = get(f.node.addr, "/threads/a1/x", None);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(history(&f, "a1")[0].0, "placed");
}

#[test]
fn a_successor_never_placed_is_swept_a_lease_after_the_fence() {
    let Two { f, one, two } = two(&[
        ("PINBOARD_LEASE_TTL_MS", "1000"),
        ("PINBOARD_SWEEP_INTERVAL_MS", "100"),
    ]);
    let e1 = f.row("/threads", "a1").unwrap()["epoch"].clone();
    assert_eq!(move_to(&f, "a1", "w2", Value::Null)["to"], json!(two.1));
    let release = json!([{"sessionId": one.1, "namespace": "/threads", "id": "a1", "epoch": e1}]);
    assert_eq!(
        f.post("release", &f.token, &release).json(),
        json!({"released": 1})
    );
    let fence = f.row("/threads", "a1").unwrap()["expiry"].as_u64().unwrap();
    // Nobody asks for it: the placeholder stays a lease past the fence, then goes.
    let gone = eventually(Duration::from_secs(10), || {
        f.heartbeat(&one.0, &one.1, json!({}));
        f.heartbeat(&two.0, &two.1, json!({}));
        std::thread::sleep(Duration::from_millis(100));
        f.row("/threads", "a1").is_none()
    });
    assert!(gone, "{}", f.node.log());
    assert!(pinboard::clock::now_ms() >= fence + 1000);
}

#[test]
fn bad_moves_are_400_and_out_of_scope_403() {
    let Two { f, .. } = two(&[]);
    let ops = ops();
    let refused = |body: Value, who: &str| {
        let r = f.post("move", who, &body);
        (r.status, r.json())
    };
    let shape = "expected {namespace, id, env?, to: clientId, deadline?}";
    let cases = [
        (
            json!({"namespace": "threads", "id": "a1", "to": "w2"}),
            "invalid namespace",
        ),
        (
            json!({"namespace": "/a/b", "id": "a1", "to": "w2"}),
            "invalid namespace",
        ),
        (
            json!({"namespace": "/threads", "id": "a/b", "to": "w2"}),
            "invalid instance id",
        ),
        (
            json!({"namespace": "/threads", "id": "", "to": "w2"}),
            "invalid instance id",
        ),
        (
            json!({"namespace": "/threads", "id": "a1", "to": "w2", "env": "prod"}),
            "env requires hostname-aware mode",
        ),
        (json!({"namespace": "/threads", "id": "a1"}), shape),
        (json!({"namespace": "/threads", "id": "a1", "to": 7}), shape),
        (
            json!({"namespace": "/threads", "id": "a1", "to": "w2", "deadline": -1}),
            shape,
        ),
        (
            json!({"namespace": "/threads", "id": "a1", "to": "w2", "deadline": "soon"}),
            shape,
        ),
        (json!(["a1"]), shape),
    ];
    for (body, error) in cases {
        assert_eq!(
            refused(body.clone(), &ops),
            (400, json!({"error": error})),
            "{body}"
        );
    }
    let r = post_json(f.node.addr, "/registry/move", Some(&ops), "{");
    assert_eq!(
        (r.status, r.json()),
        (400, json!({"error": "invalid json"}))
    );
    let body = json!({"namespace": "/threads", "id": "a1", "to": "w2"});
    refused_out_of_scope(&f, "move", &body);
    let r = post_json(f.node.addr, "/registry/move", None, &body.to_string());
    assert_eq!(
        (r.status, r.json()),
        (401, json!({"error": "unauthorized"}))
    );
    assert_eq!(get(f.node.addr, "/registry/move", Some(&ops)).status, 405);
    // Nothing of it was written.
    let row = f.row("/threads", "a1").unwrap();
    assert!(
        row.get("mv").is_none() && row.get("expiry").is_none(),
        "{row}"
    );
}

#[test]
fn a_pause_answers_503_on_every_node_and_a_resume_finds_the_instance_as_it_was() {
    let f = Fixture::new(&[("PINBOARD_LEASE_TTL_MS", "3000")]);
    f.warm();
    let second = Node::start(&f.redis.url(), &[("PINBOARD_SHARDS", &SHARDS.to_string())]);
    let example = Example::start(&f.node, "example-1", &[]);
    let count = |node: &Node| get(node.addr, "/threads/c1/count", None);
    let first = count(&f.node);
    assert_eq!(first.status, 200, "{}", example.output.log());
    assert_eq!(first.json()["count"], 1);
    let epoch = first.json()["epoch"].clone();
    let row = f.row("/threads", "c1").unwrap();

    pause(&f, "c1", Some("incident 42"));
    let paused = f.row("/threads", "c1").unwrap();
    let stamp = paused["paused"].clone();
    assert_eq!(
        (&stamp["by"], &stamp["reason"]),
        (&json!(OPERATOR), &json!("incident 42"))
    );
    let mut unpaused = paused.clone();
    unpaused.as_object_mut().unwrap().remove("paused");
    assert_eq!(unpaused, row, "the placement itself is untouched");
    for node in [&f.node, &second] {
        for _ in 0..3 {
            answers_paused(&count(node));
        }
    }
    // Idempotent: a second pause keeps the first one's stamp and appends nothing.
    pause(&f, "c1", Some("again"));
    assert_eq!(f.row("/threads", "c1").unwrap()["paused"], stamp);
    // The worker still holds it (its own stats), and the overview lists it with the pause.
    let stats = get(f.node.addr, "/registry/stats", Some(&ops())).json();
    assert_eq!(
        stats["workers"][0]["stats"]["instances"]["/threads"],
        json!(["c1"]),
        "{stats}"
    );
    let (exact, whole) = listed(&f, "c1");
    assert_eq!(exact[0]["paused"], stamp);
    assert_eq!(exact[0]["sessionId"], json!(example.session));
    assert_eq!(whole[0]["paused"], stamp);
    // Counted as their own outcome, on each node.
    let health = get(second.addr, "/registry/health", Some(&ops())).json();
    assert_eq!(health["resolutions"]["paused"], 3, "{health}");
    assert_eq!(
        f.metric("pinboard_resolutions_total{outcome=\"paused\"}"),
        3.0
    );

    resume(&f, "c1");
    resume(&f, "c1");
    assert_eq!(f.row("/threads", "c1").unwrap(), row);
    let again = count(&second);
    assert_eq!(again.status, 200, "{}", again.text());
    assert_eq!(
        (&again.json()["count"], &again.json()["epoch"]),
        (&json!(2), &epoch)
    );
    let s = json!(example.session);
    let h = history(&f, "c1");
    assert_eq!(
        h,
        [
            entry("resumed", &s, &s, Some(OPERATOR)),
            entry("paused", &s, &s, Some(OPERATOR)),
            entry("placed", &Value::Null, &s, None),
        ]
    );
}

#[test]
fn a_pause_of_an_unplaced_id_keeps_it_unplaced_until_a_resume() {
    let (f, worker, session) = Fixture::with_worker(&[], "w");
    pause(&f, "fresh", None);
    let placeholder = f.row("/threads", "fresh").unwrap();
    assert_eq!(placeholder["sessionId"], "");
    assert_eq!(placeholder["paused"]["by"], OPERATOR);
    assert!(
        placeholder["paused"].get("reason").is_none(),
        "{placeholder}"
    );
    for _ in 0..3 {
        answers_paused(&get(f.node.addr, "/threads/fresh/x", None));
    }
    assert!(worker.requests().is_empty());
    // Listed, without an owner, so that an operator finds it (a pause without a reason says
    // null).
    let (exact, whole) = listed(&f, "fresh");
    assert_eq!(exact, whole);
    let mut shown = placeholder["paused"].clone();
    shown["reason"] = Value::Null;
    assert_eq!(
        exact,
        [json!({"id": "fresh", "sessionId": null, "paused": shown})]
    );
    resume(&f, "fresh");
    assert_eq!(
        f.row("/threads", "fresh"),
        None,
        "a placeholder holding nothing else goes"
    );
    let r = get(f.node.addr, "/threads/fresh/x", None);
    assert_eq!(r.status, 200, "{}", r.text());
    let s = json!(session);
    assert_eq!(
        history(&f, "fresh"),
        [
            entry("placed", &Value::Null, &s, None),
            entry("resumed", &Value::Null, &Value::Null, Some(OPERATOR)),
            entry("paused", &Value::Null, &Value::Null, Some(OPERATOR)),
        ]
    );
}

#[test]
fn a_pause_outlives_its_owners_death_and_the_sweeper() {
    let f = Fixture::new(&[
        ("PINBOARD_LEASE_TTL_MS", "1000"),
        ("PINBOARD_SWEEP_INTERVAL_MS", "100"),
    ]);
    f.warm();
    let dying = TestWorker::start("dying");
    let dead = f.registered(&dying, "w-dying");
    assert_eq!(get(f.node.addr, "/threads/p1/x", None).status, 200);
    let heir = TestWorker::start("heir");
    let alive = f.registered(&heir, "w-heir");
    pause(&f, "p1", Some("hold"));
    // The owner never heartbeats again: a lease past its expiry the sweeper retires its row,
    // keeping the pause.
    let retired = eventually(Duration::from_secs(15), || {
        assert_eq!(f.heartbeat(&heir, &alive, json!({})).status, 200);
        std::thread::sleep(Duration::from_millis(100));
        f.row("/threads", "p1")
            .is_some_and(|r| r["sessionId"] == "")
    });
    assert!(retired, "{:?}\n{}", f.row("/threads", "p1"), f.node.log());
    let row = f.row("/threads", "p1").unwrap();
    assert_eq!(row["paused"]["reason"], "hold");
    // Several sweeps later it is still there, and still paused.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(f.row("/threads", "p1").unwrap(), row);
    answers_paused(&get(f.node.addr, "/threads/p1/x", None));
    assert!(heir.requests().is_empty());
    let (exact, _) = listed(&f, "p1");
    assert_eq!(exact[0]["sessionId"], Value::Null);
    assert_eq!(exact[0]["paused"]["reason"], "hold");

    // The heir's lease is a second: kept alive past the waits above, however slow the box.
    assert_eq!(f.heartbeat(&heir, &alive, json!({})).status, 200);
    resume(&f, "p1");
    assert_eq!(f.row("/threads", "p1"), None);
    assert_eq!(get(f.node.addr, "/threads/p1/x", None).status, 200);
    assert_eq!(heir.requests().len(), 1);
    let (d, h) = (json!(dead), json!(alive));
    let reasons: Vec<(String, Value, Value, Value)> = history(&f, "p1");
    assert_eq!(
        reasons,
        [
            entry("placed", &Value::Null, &h, None),
            entry("resumed", &Value::Null, &Value::Null, Some(OPERATOR)),
            entry("swept", &d, &Value::Null, None),
            entry("paused", &d, &d, Some(OPERATOR)),
            entry("placed", &Value::Null, &d, None),
        ]
    );
}

#[test]
fn bad_pauses_and_resumes_are_400_and_out_of_scope_403() {
    let (f, _worker, _) = Fixture::with_worker(&[], "w");
    assert_eq!(get(f.node.addr, "/threads/a1/x", None).status, 200);
    let ops = ops();
    for (route, shape) in [
        ("pause", "expected {namespace, id, env?, reason?}"),
        ("resume", "expected {namespace, id, env?}"),
    ] {
        let refused = |body: Value, who: &str| {
            let r = f.post(route, who, &body);
            (r.status, r.json())
        };
        let mut cases = vec![
            (
                json!({"namespace": "threads", "id": "a1"}),
                "invalid namespace",
            ),
            (
                json!({"namespace": "/threads/", "id": "a1"}),
                "invalid namespace",
            ),
            (
                json!({"namespace": "/threads", "id": "a b"}),
                "invalid instance id",
            ),
            (
                json!({"namespace": "/threads", "id": "x".repeat(257)}),
                "invalid instance id",
            ),
            (
                json!({"namespace": "/threads", "id": "a1", "env": "e"}),
                "env requires hostname-aware mode",
            ),
            (json!({"namespace": "/threads"}), shape),
            (json!({"id": "a1"}), shape),
            (json!({"namespace": "/threads", "id": 5}), shape),
        ];
        if route == "pause" {
            cases.push((
                json!({"namespace": "/threads", "id": "a1", "reason": 5}),
                shape,
            ));
            let long = "r".repeat(1025);
            cases.push((
                json!({"namespace": "/threads", "id": "a1", "reason": long}),
                shape,
            ));
        }
        for (body, error) in cases {
            assert_eq!(
                refused(body.clone(), &ops),
                (400, json!({"error": error})),
                "{route} {body}"
            );
        }
        refused_out_of_scope(&f, route, &json!({"namespace": "/threads", "id": "a1"}));
    }
    let row = f.row("/threads", "a1").unwrap();
    assert!(row.get("paused").is_none(), "{row}");
    assert_eq!(get(f.node.addr, "/threads/a1/x", None).status, 200);
}
