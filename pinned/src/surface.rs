//! What the worker serves (contract §4): `GET /_pinned/challenge`, `GET /_pinned/stats`, its
//! instances `/{ns}/{id}...`, and with a durability store `POST /{ns}/{id}/_wake` (§7) — each
//! gated as the spec says (proxy secret or attestation, attestation, attestation plus a
//! well-formed and current placement epoch) before the application sees a request. The
//! routes and checks are the core's (`pinboard_protocol::worker::serve`); this writes them
//! out on `pinboard-http`, and runs the app and the `_wake` hook.

use std::sync::Arc;
use std::time::Instant;

use http::{Method, StatusCode};
use pinboard_http::error::{Error, Origin};
use pinboard_http::{Handler, Request, Response, splits_when_decoded};
use pinboard_protocol::Purpose;
use pinboard_protocol::worker::fencing::Fence;
use pinboard_protocol::worker::serve::{Answer, Instance, Route, pinned_route_method, route};
use serde_json::json;
use tracing::warn;

use crate::app::App;
use crate::durable::{Begin, DurabilityStore};
use crate::handle::Handle;
use crate::state::Shared;

pub(crate) struct Surface<A> {
    shared: Arc<Shared>,
    app: Arc<A>,
    handle: Handle,
}

impl<A: App> Surface<A> {
    pub fn new(shared: Arc<Shared>, app: Arc<A>) -> Surface<A> {
        let handle = Handle::new(shared.clone());
        Surface {
            shared,
            app,
            handle,
        }
    }

    async fn instance(&self, req: &mut Request<'_>, instance: Instance) -> Result<Response, Error> {
        if let Some(store) = &self.shared.config.durability
            && instance.rest == "/_wake"
        {
            return Ok(self.wake(instance, store.clone()).await);
        }
        let answer = self.app.handle(&self.handle, &instance, req).await?;
        if self.shared.withholds_answer(&instance) {
            return Ok(write(Answer::lease_unhealthy()));
        }
        Ok(answer)
    }

    /// An admitted `_wake`: runs [`App::on_wake`] on the stored state (claimed at the wake's
    /// epoch, [`DurabilityStore::claim`]), unless one runs already or has just finished (the
    /// sweep asking again after a 202), and answers 200 if it is done within `wake_wait`, else
    /// 202 while it goes on in the background.
    async fn wake(&self, instance: Instance, store: Arc<dyn DurabilityStore>) -> Response {
        let (ns, id) = (instance.ns.clone(), instance.id.clone());
        match self
            .shared
            .wakes
            .begin(&ns, &id, &instance.epoch, Instant::now())
        {
            Begin::Running => return activating(),
            Begin::Done => return resident(),
            Begin::Start => {}
        }
        let (done, finished) = local_sync::oneshot::channel();
        let (app, handle, shared) = (self.app.clone(), self.handle.clone(), self.shared.clone());
        monoio::spawn(async move {
            // Claimed at the wake's epoch before the hook hydrates: a former owner's late save
            // is refused from now on; a later owner's claim fails this (stale) wake.
            let fence = Fence::from(&instance);
            let result = match store.claim(&instance.ns, &instance.id, &fence) {
                Ok(state) => app.on_wake(&handle, &instance, state).await,
                Err(e) => Err(Error::because(Origin::Host, "claiming durable state", e)),
            };
            let (ns, id) = (&instance.ns, &instance.id);
            if let Err(e) = &result {
                warn!(%ns, %id, epoch = %instance.epoch, error = %e, "wake failed");
            }
            shared.wakes.finish(ns, id, result.is_ok(), Instant::now());
            let _ = done.send(result.is_ok());
        });
        match monoio::time::timeout(self.shared.config.wake_wait, finished).await {
            Ok(Ok(true)) => {
                self.shared.wakes.collect(&ns, &id);
                resident()
            }
            Ok(_) => Response::json_value(
                StatusCode::INTERNAL_SERVER_ERROR,
                &json!({ "detail": "wake failed" }),
            ),
            Err(_) => activating(),
        }
    }
}

impl<A: App> Handler for Surface<A> {
    type Note = ();

    async fn handle(&self, req: &mut Request<'_>, _: &mut ()) -> Result<Response, Error> {
        let shared = &self.shared;
        let (ns, id, rest) = match route(req.path(), &shared.base, &shared.namespaces) {
            Route::Challenge | Route::Stats if pinned_route_method(req.method()).is_some() => {
                return Ok(write(pinned_route_method(req.method()).expect("checked")));
            }
            Route::Challenge => {
                let query = req.head.uri.query().unwrap_or("");
                return Ok(write(shared.challenge(&req.head.headers, query)));
            }
            Route::Stats => {
                let mut threads = serde_json::Map::new();
                threads.insert("threads".into(), json!(shared.config.threads));
                return Ok(write(shared.stats(&req.head.headers, threads)));
            }
            Route::Elsewhere | Route::Other => return Ok(write(Answer::not_found())),
            Route::Instance { ns, id, rest } => (ns, id, rest),
        };
        // Pinboard never sends such a path; a server in front that decodes would route it as
        // another (`..%2F..%2Fadmin` as `../../admin`).
        if splits_when_decoded(rest) {
            return Ok(write(Answer::text(
                StatusCode::BAD_REQUEST,
                "invalid instance path",
            )));
        }
        // A `_wake` is the durability sweep's, never a client's: it takes a wake token, and is
        // mounted only with a durability store (contract §4, §7).
        let purpose = if rest == "/_wake" {
            if shared.config.durability.is_none() {
                return Ok(write(Answer::not_found()));
            }
            if *req.method() != Method::POST {
                return Ok(write(Answer::method_not_allowed("POST")));
            }
            Purpose::Wake
        } else {
            Purpose::Forward
        };
        let (ns, id, rest) = (ns.to_owned(), id.to_owned(), rest.to_owned());
        match shared.admit_request(&req.head.headers, &ns, &id, &rest, purpose) {
            Ok(instance) => self.instance(req, instance).await,
            Err(refused) => Ok(write(refused)),
        }
    }
}

/// The core's answer as a `pinboard-http` response.
fn write(answer: Answer) -> Response {
    let mut response = Response::new(answer.status, Some(answer.content_type), answer.body.into());
    for (name, value) in answer.headers {
        response = response.header(name, value);
    }
    response
}

fn activating() -> Response {
    Response::json_value(StatusCode::ACCEPTED, &json!({ "activating": true }))
}

fn resident() -> Response {
    Response::json_value(StatusCode::OK, &json!({ "ok": true }))
}

#[cfg(test)]
mod tests {
    use std::thread::JoinHandle;
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    use jsonwebtoken::Algorithm;
    use pinboard_http::DriverKind;
    use serde_json::Value;

    use super::*;
    use crate::config::Config;
    use crate::registry::Registry;
    use crate::runtime::{bind, choose_driver, spawn_serving, uring_available};
    use crate::test_http::{Client, Reply};
    use pinboard_protocol::worker::mint::{mint, mint_forward, mint_with};

    /// Answers with what it was told about the instance, and the request body.
    struct Describe;

    impl App for Describe {
        async fn handle(
            &self,
            _: &Handle,
            instance: &Instance,
            req: &mut Request<'_>,
        ) -> Result<Response, Error> {
            let body = req.read_body(1024).await.unwrap_or_default();
            Ok(Response::json_value(
                StatusCode::OK,
                &json!({
                    "ns": instance.ns, "id": instance.id, "rest": instance.rest,
                    "epoch": instance.epoch.as_str(), "activated": instance.activated,
                    "caller": instance.attestation.caller, "depth": instance.attestation.depth,
                    "acct": instance.attestation.acct, "query": req.head.uri.query(),
                    "body": String::from_utf8_lossy(&body),
                }),
            ))
        }
    }

    /// The serving threads alone, over a real socket, with the registry's part of the state
    /// set by hand: these tests are about what the worker answers, not how it registers.
    struct Serving {
        shared: Arc<Shared>,
        threads: Vec<JoinHandle<()>>,
    }

    impl Serving {
        fn start(advertise_path: &str) -> Serving {
            Serving::on(DriverKind::Auto, advertise_path)
        }

        fn on(driver: DriverKind, advertise_path: &str) -> Serving {
            let config = Config::new("http://127.0.0.1:9", "token", "c-1", &["/threads", "/docs"]);
            let registry = Registry::new(
                config.validate().unwrap(),
                pinboard_http::tls::ClientTls::new(None, pinboard_http::tls::Alpn::Http1).unwrap(),
                pinboard_protocol::worker::credential::Credential::new("token", None).unwrap(),
                Duration::from_secs(1),
            );
            let listeners = bind(config.listen, 1).unwrap();
            let addr = listeners[0].local_addr().unwrap();
            let advertise = format!("http://{addr}{advertise_path}");
            let driver = choose_driver(driver).unwrap();
            let base = advertise_path.to_owned();
            let shared = Arc::new(Shared::new(config, registry, advertise, base, addr, driver));
            let threads = spawn_serving(&shared, &Arc::new(Describe), listeners, None).unwrap();
            Serving { shared, threads }
        }

        /// As after a registration: session `sess-1`, a live lease.
        fn registered() -> Serving {
            let serving = Serving::start("");
            let mut state = serving.shared.state();
            state.session = Some("sess-1".into());
            state.lease_until = Some(Instant::now() + Duration::from_secs(60));
            drop(state);
            serving
        }

        /// A token of session `sess-1` for a `/_pinned/*` route.
        fn token(&self, purpose: &str) -> String {
            mint(&self.shared.secret, "sess-1", now(), purpose)
        }

        /// A request to instance `inst` forwarded at `epoch`, attested as Pinboard does.
        fn forward(&self, path: &str, inst: &str, epoch: &str) -> Reply {
            let token = mint_forward(&self.shared.secret, "sess-1", inst, epoch);
            let headers = [
                ("Pinboard-Attestation", token.as_str()),
                ("Pinboard-Epoch", epoch),
            ];
            self.get(path, &headers)
        }

        fn get(&self, path: &str, headers: &[(&str, &str)]) -> Reply {
            self.send("GET", path, headers, "")
        }

        fn send(&self, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Reply {
            let mut head = format!(
                "{method} {path} HTTP/1.1\r\nHost: w\r\nContent-Length: {}\r\n",
                body.len()
            );
            for (name, value) in headers {
                head.push_str(&format!("{name}: {value}\r\n"));
            }
            Client::connect(self.shared.local_addr).request(format!("{head}\r\n{body}").as_bytes())
        }
    }

    impl Drop for Serving {
        fn drop(&mut self) {
            self.shared.serving_stop.fire();
            for thread in self.threads.drain(..) {
                thread.join().unwrap();
            }
        }
    }

    fn now() -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs()
    }

    fn text(reply: &Reply, status: u16, body: &str) {
        assert_eq!(
            (reply.status, reply.text().as_str()),
            (status, body),
            "{reply:?}"
        );
        assert_eq!(
            reply.header("content-type"),
            Some("text/plain; charset=utf-8")
        );
    }

    fn json_reply(reply: &Reply, status: u16) -> Value {
        assert_eq!(reply.status, status, "{reply:?}");
        assert_eq!(reply.header("content-type"), Some("application/json"));
        reply.json()
    }

    #[test]
    fn challenge_answers_the_current_and_previous_only() {
        let w = Serving::start("");
        let secret = w.shared.secret.clone();
        let with_secret = [("Pinboard-Proxy-Secret", secret.as_str())];
        let (c1, v1) = w.shared.state().next_challenge();
        let (c2, v2) = w.shared.state().next_challenge();
        let probe = |c: &str| w.get(&format!("/_pinned/challenge?challenge={c}"), &with_secret);
        assert_eq!(json_reply(&probe(&c2), 200), json!({ "value": v2 }));
        assert_eq!(json_reply(&probe(&c1), 200), json!({ "value": v1 }));
        w.shared.state().next_challenge();
        text(&probe(&c1), 404, "unknown challenge");
        assert_eq!(json_reply(&probe(&c2), 200), json!({ "value": v2 }));
        text(&probe("nope"), 404, "unknown challenge");
        text(
            &w.get("/_pinned/challenge", &with_secret),
            404,
            "unknown challenge",
        );
        // Other parameters around it, and percent-encoding, are fine.
        let encoded: String = c2.chars().map(|ch| format!("%{:02X}", ch as u8)).collect();
        let reply = w.get(
            &format!("/_pinned/challenge?x=1&challenge={encoded}&y"),
            &with_secret,
        );
        assert_eq!(json_reply(&reply, 200), json!({ "value": v2 }));
    }

    #[test]
    fn challenge_needs_the_secret_or_an_attestation() {
        let w = Serving::start("");
        let (c, v) = w.shared.state().next_challenge();
        let path = format!("/_pinned/challenge?challenge={c}");
        text(&w.get(&path, &[]), 403, "invalid proxy secret");
        let wrong = "0".repeat(64);
        text(
            &w.get(&path, &[("Pinboard-Proxy-Secret", &wrong)]),
            403,
            "invalid proxy secret",
        );
        let prefix = &w.shared.secret[..10];
        text(
            &w.get(&path, &[("Pinboard-Proxy-Secret", prefix)]),
            403,
            "invalid proxy secret",
        );
        // Checked before the challenge: a stale challenge without the secret is still 403.
        text(
            &w.get("/_pinned/challenge?challenge=old", &[]),
            403,
            "invalid proxy secret",
        );

        // An attestation stands in for the secret once there is a session to attest.
        let attestation = w.token("challenge");
        let attested = [("Pinboard-Attestation", attestation.as_str())];
        text(&w.get(&path, &attested), 403, "invalid proxy secret");
        w.shared.state().session = Some("sess-1".into());
        assert_eq!(
            json_reply(&w.get(&path, &attested), 200),
            json!({ "value": v })
        );
        let other_session = mint(&w.shared.secret, "sess-0", now(), "challenge");
        text(
            &w.get(&path, &[("Pinboard-Attestation", &other_session)]),
            403,
            "invalid proxy secret",
        );
        // A token issued for another route does not stand in either (contract §11).
        for other in [
            w.token("stats"),
            mint_forward(&w.shared.secret, "sess-1", "/threads/a", "1"),
        ] {
            text(
                &w.get(&path, &[("Pinboard-Attestation", &other)]),
                403,
                "invalid proxy secret",
            );
        }

        let reply = w.send("POST", &path, &[], "");
        text(&reply, 405, "method not allowed");
        assert_eq!(reply.header("allow"), Some("GET, HEAD"));
    }

    #[test]
    fn stats_are_attested() {
        let w = Serving::registered();
        let refused = w.get(
            "/_pinned/stats",
            &[("Pinboard-Proxy-Secret", &w.shared.secret.clone())],
        );
        assert_eq!(
            json_reply(&refused, 403),
            json!({ "detail": "invalid attestation" })
        );
        assert_eq!(w.forward("/threads/t1", "/threads/t1", "42").status, 200);
        assert_eq!(w.forward("/docs/d1/x", "/docs/d1", "42").status, 200);
        // A forward's or a challenge's token is no stats token.
        let forward = mint_forward(&w.shared.secret, "sess-1", "/threads/t1", "42");
        for token in [forward, w.token("challenge"), w.token("wake")] {
            let reply = w.get("/_pinned/stats", &[("Pinboard-Attestation", &token)]);
            assert_eq!(
                json_reply(&reply, 403),
                json!({ "detail": "invalid attestation" })
            );
        }
        let stats_token = w.token("stats");
        let attested = [("Pinboard-Attestation", stats_token.as_str())];
        let stats = json_reply(&w.get("/_pinned/stats", &attested), 200);
        assert_eq!(stats["sessionId"], "sess-1");
        assert_eq!(stats["clientId"], "c-1");
        assert_eq!(stats["namespaces"], json!(["/threads", "/docs"]));
        assert_eq!(
            stats["instances"],
            json!({ "/threads": ["t1"], "/docs": ["d1"] })
        );
        assert_eq!(stats["instanceCount"], 2);
        assert_eq!(stats["headroom"], 100);
        assert_eq!(
            (stats["draining"].clone(), stats["leaseHealthy"].clone()),
            (json!(false), json!(true))
        );
        assert!(stats["uptimeMs"].is_u64());
    }

    #[test]
    fn instances_require_a_valid_attestation() {
        let w = Serving::registered();
        let epoch = ("Pinboard-Epoch", "7");
        let refused = json!({ "detail": "invalid attestation" });
        assert_eq!(json_reply(&w.get("/threads/a", &[epoch]), 403), refused);
        let secret = w.shared.secret.clone();
        let forward = |secret: &str, aud: &str, iat: u64| {
            let claims = json!({
                "aud": aud, "iat": iat, "exp": iat + 30,
                "purpose": "forward", "inst": "/threads/a", "epoch": "7",
            });
            mint_with(Algorithm::HS256, "pinboard+jwt", secret, &claims)
        };
        assert_eq!(
            w.get(
                "/threads/a",
                &[
                    ("Pinboard-Attestation", &forward(&secret, "sess-1", now())),
                    epoch
                ]
            )
            .status,
            200,
            "the control case passes"
        );
        for token in [
            forward("another-secret-another-secret-00", "sess-1", now()),
            forward(&secret, "sess-0", now()),
            forward(&secret, "sess-1", now() - 61),
            // Well past the 30 s of skew, however long the test takes to send it.
            forward(&secret, "sess-1", now() + 40),
            mint_with(
                Algorithm::HS384,
                "pinboard+jwt",
                &secret,
                &json!({ "aud": "sess-1", "iat": now(), "exp": now() + 30, "purpose": "forward", "inst": "/threads/a", "epoch": "7" }),
            ),
            "garbage".into(),
        ] {
            let reply = w.get("/threads/a", &[("Pinboard-Attestation", &token), epoch]);
            assert_eq!(json_reply(&reply, 403), refused, "{token}");
        }
        // The proxy secret does not stand in for an attestation here.
        let reply = w.get("/threads/a", &[("Pinboard-Proxy-Secret", &secret), epoch]);
        assert_eq!(json_reply(&reply, 403), refused);
        assert_eq!(
            w.shared.held.held().len(),
            1,
            "only the control case activated"
        );
    }

    #[test]
    fn a_path_that_splits_when_decoded_is_refused_before_admission() {
        let w = Serving::registered();
        let shared: Vec<String> =
            serde_json::from_str(include_str!("../tests/data/paths-that-split.json")).unwrap();
        for rest in &shared {
            // Attested for its own instance and epoch: only the path is wrong.
            let reply = w.forward(&format!("/threads/a{rest}"), "/threads/a", "7");
            text(&reply, 400, "invalid instance path");
        }
        assert!(w.shared.held.held().is_empty(), "nothing was activated");
        // Encoded bytes that decode to no separator are the app's.
        assert_eq!(
            w.forward("/threads/a/x%20y/%41/a.b", "/threads/a", "7")
                .status,
            200
        );
    }

    #[test]
    fn a_token_is_bound_to_its_route_instance_and_epoch() {
        let w = Serving::registered();
        let secret = w.shared.secret.clone();
        let refused = json!({ "detail": "invalid attestation" });
        let send = |path: &str, token: &str, epochs: &[&str]| {
            let mut headers = vec![("Pinboard-Attestation", token)];
            headers.extend(epochs.iter().map(|e| ("Pinboard-Epoch", *e)));
            w.get(path, &headers)
        };
        let token = mint_forward(&secret, "sess-1", "/threads/a", "7");
        // Another instance, another namespace, another epoch: each a replay.
        for (path, epochs) in [
            ("/threads/b", &["7"][..]),
            ("/docs/a", &["7"]),
            ("/threads/a", &["8"]),
            ("/threads/a", &["7", "7"]),
            ("/threads/a", &["7", "8"]),
        ] {
            assert_eq!(
                json_reply(&send(path, &token, epochs), 403),
                refused,
                "{path} {epochs:?}"
            );
        }
        // A token without an instance, or for another purpose, is no forward token.
        for other in [w.token("stats"), w.token("challenge"), w.token("forward")] {
            assert_eq!(
                json_reply(&send("/threads/a", &other, &["7"]), 403),
                refused
            );
        }
        assert!(w.shared.held.held().is_empty());
        // Without a durability store there is no `_wake` (tests/durable.rs has the rest).
        let wake = |purpose: &str| {
            let claims = json!({
                "aud": "sess-1", "iat": now(), "exp": now() + 30,
                "purpose": purpose, "inst": "/threads/a", "epoch": "7",
            });
            mint_with(Algorithm::HS256, "pinboard+jwt", &secret, &claims)
        };
        for purpose in ["wake", "forward"] {
            let reply = send("/threads/a/_wake", &wake(purpose), &["7"]);
            assert_eq!(json_reply(&reply, 404), json!({ "detail": "not found" }));
        }
        assert_eq!(send("/threads/a", &token, &["7"]).status, 200);
    }

    #[test]
    fn the_epoch_must_be_digits_and_current() {
        let w = Serving::registered();
        let get = |path: &str, epoch: Option<&str>| {
            let token = mint_forward(
                &w.shared.secret,
                "sess-1",
                "/threads/a",
                epoch.unwrap_or(""),
            );
            let mut headers = vec![("Pinboard-Attestation", token.as_str())];
            headers.extend(epoch.map(|e| ("Pinboard-Epoch", e)));
            w.get(path, &headers)
        };
        for bad in [
            None,
            Some(""),
            Some("12a"),
            Some("-1"),
            Some("1.5"),
            Some("7 8"),
            Some("0x1f"),
        ] {
            text(&get("/threads/a", bad), 400, "malformed placement epoch");
        }
        assert!(w.shared.held.held().is_empty());

        let first = json_reply(&get("/threads/a/x/y?q=1", Some("1700000000005")), 200);
        assert_eq!(
            first,
            json!({
                "ns": "/threads", "id": "a", "rest": "/x/y", "epoch": "1700000000005",
                "activated": true, "caller": null, "depth": null, "acct": null, "query": "q=1",
                "body": "",
            })
        );
        assert_eq!(
            json_reply(&get("/threads/a", Some("1700000000005")), 200)["activated"],
            false
        );
        text(
            &get("/threads/a", Some("1700000000004")),
            409,
            "stale placement epoch",
        );
        assert_eq!(
            json_reply(&get("/threads/a", Some("1700000000009")), 200)["activated"],
            true
        );
        let held = w.shared.held.held();
        assert_eq!(held.len(), 1);
        assert_eq!(
            (held[0].0.as_str(), held[0].1.as_str(), held[0].2.as_str()),
            ("/threads", "a", "1700000000009")
        );
    }

    #[test]
    fn the_application_sees_the_claims_and_the_body() {
        let w = Serving::registered();
        let claims = json!({
            "aud": "sess-1", "iat": now(), "exp": now() + 30, "caller": "/docs/d9", "depth": 3,
            "purpose": "forward", "inst": "/docs/d1", "epoch": "3",
            "acct": { "sub": "alice", "scopes": ["read"], "claims": { "sub": "alice" } },
        });
        let token = mint_with(Algorithm::HS256, "pinboard+jwt", &w.shared.secret, &claims);
        let headers = [
            ("Pinboard-Attestation", token.as_str()),
            ("Pinboard-Epoch", "3"),
        ];
        let seen = json_reply(&w.send("POST", "/docs/d1", &headers, "hello"), 200);
        assert_eq!(
            (seen["caller"].clone(), seen["depth"].clone()),
            (json!("/docs/d9"), json!(3))
        );
        assert_eq!(seen["acct"], claims["acct"]);
        assert_eq!(
            (seen["rest"].clone(), seen["body"].clone()),
            (json!(""), json!("hello"))
        );
    }

    #[test]
    fn an_answer_produced_past_the_lease_is_withheld() {
        use std::io::{Read, Write};
        let w = Serving::registered();
        let token = mint_forward(&w.shared.secret, "sess-1", "/threads/a", "5");
        let mut stream = std::net::TcpStream::connect(w.shared.local_addr).unwrap();
        // Admitted on a live lease, the app waits for the body; the lease lapses meanwhile
        // (a worker paused mid-request), and only then does the app answer.
        write!(
            stream,
            "POST /threads/a HTTP/1.1\r\nHost: w\r\nContent-Length: 4\r\n\
             Connection: close\r\nPinboard-Attestation: {token}\r\nPinboard-Epoch: 5\r\n\r\n"
        )
        .unwrap();
        std::thread::sleep(Duration::from_millis(200));
        w.shared.state().lease_until = Some(Instant::now());
        stream.write_all(b"body").unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap();
        assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
        assert!(
            answer
                .to_ascii_lowercase()
                .contains("pinned-refusal: lease-unhealthy")
        );
        assert!(
            answer.ends_with(r#"{"detail":"lease unhealthy"}"#),
            "{answer}"
        );
    }

    #[test]
    fn nothing_is_served_without_a_live_lease() {
        let w = Serving::registered();
        assert_eq!(w.forward("/threads/held", "/threads/held", "5").status, 200);
        w.shared.state().lease_until = Some(Instant::now());
        // A new activation, and a held instance: a worker paused past its lease wakes up
        // to forwards that waited in its sockets while the registry moved the instance on.
        for inst in ["/threads/new", "/threads/held"] {
            let refused = w.forward(inst, inst, "5");
            assert_eq!(
                json_reply(&refused, 503),
                json!({ "detail": "lease unhealthy" }),
                "{inst}"
            );
            assert_eq!(refused.header("retry-after"), Some("1"));
            assert_eq!(refused.header("pinned-refusal"), Some("lease-unhealthy"));
        }
        w.shared.state().lease_until = Some(Instant::now() + Duration::from_secs(60));
        assert_eq!(
            w.forward("/threads/held", "/threads/held", "5").status,
            200,
            "served again once the lease is renewed"
        );
    }

    #[test]
    fn other_paths_are_not_found() {
        let w = Serving::registered();
        let attestation = w.token("forward");
        let headers = [
            ("Pinboard-Attestation", attestation.as_str()),
            ("Pinboard-Epoch", "5"),
        ];
        for path in [
            "/",
            "/threads",
            "/threads/",
            "/other/a",
            "/_pinned/else",
            "/threadsx/a",
        ] {
            assert_eq!(
                json_reply(&w.get(path, &headers), 404),
                json!({ "detail": "not found" }),
                "{path}"
            );
        }
    }

    #[test]
    fn both_drivers_serve_and_stop() {
        let mut drivers = vec![DriverKind::Epoll];
        if uring_available() {
            drivers.push(DriverKind::IoUring);
        }
        for driver in drivers {
            let w = Serving::on(driver, "");
            let (c, v) = w.shared.state().next_challenge();
            let secret = w.shared.secret.clone();
            let reply = w.get(
                &format!("/_pinned/challenge?challenge={c}"),
                &[("Pinboard-Proxy-Secret", &secret)],
            );
            assert_eq!(json_reply(&reply, 200), json!({ "value": v }), "{driver:?}");
            // Dropping fires the stop from this thread: the serving thread must wake and end.
            let addr = w.shared.local_addr;
            drop(w);
            assert!(
                std::net::TcpStream::connect(addr).is_err(),
                "{driver:?} listener closed"
            );
        }
    }

    #[test]
    fn an_advertise_path_prefixes_everything() {
        let w = Serving::start("/w1");
        let secret = w.shared.secret.clone();
        let (c, v) = w.shared.state().next_challenge();
        let with_secret = [("Pinboard-Proxy-Secret", secret.as_str())];
        let reply = w.get(
            &format!("/w1/_pinned/challenge?challenge={c}"),
            &with_secret,
        );
        assert_eq!(json_reply(&reply, 200), json!({ "value": v }));
        let outside = w.get(&format!("/_pinned/challenge?challenge={c}"), &with_secret);
        assert_eq!(json_reply(&outside, 404), json!({ "detail": "not found" }));
        assert_eq!(w.get("/w1x/_pinned/challenge", &with_secret).status, 404);
    }
}
