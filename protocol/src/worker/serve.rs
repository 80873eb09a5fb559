//! What a worker serves (contract §4, §11), decided without any I/O so that either worker
//! library answers alike: which route a path is ([`route`]), the `_pinned/challenge` and
//! `_pinned/stats` answers, and the checks an instance request passes before the application
//! sees it ([`Core::admit_request`]) — each refusal an [`Answer`] the library writes out in its
//! own response type.

use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use http::header::{ALLOW, RETRY_AFTER};
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use serde_json::{Map, Value, json};
use tracing::debug;

use super::attest::{self, Attestation, Binding, Invalid};
use super::epoch::Epoch;
use super::goodbye::Goodbyes;
use super::held::{Admission, HeldMap};
use super::state::{State, random_hex};
use crate::Purpose;
use crate::header::{ATTESTATION, EPOCH, LEASE_UNHEALTHY, PROXY_SECRET, REFUSAL};

/// What every worker keeps, whatever its runtime: its secret and addresses, the protocol state
/// behind one lock and the instances it holds. Lock order: a shard of the held map, then the
/// state (an admission reads the state's [`Gate`](super::held::Gate) while it holds its key's
/// shard); never the other way round, and neither across an await.
pub struct Core {
    /// Random per process; Pinboard signs attestations with it and presents it on the probe.
    pub secret: String,
    pub client_id: String,
    pub namespaces: Vec<String>,
    pub advertise_url: String,
    /// The advertise URL's own path: Pinboard puts it before every path it sends.
    pub base: String,
    pub started: Instant,
    state: Mutex<State>,
    /// The instances held, and those released in the last minute.
    pub held: HeldMap,
    /// The goodbyes of the instances' open WebSockets.
    pub goodbyes: Goodbyes,
}

/// The worker's standing with the registry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    pub session_id: Option<String>,
    /// The lease is known to be live: renewed less than a lease TTL ago.
    pub lease_healthy: bool,
    /// This worker's own draining flag.
    pub draining: bool,
    /// The registry's view: the own flag or an operator's drain.
    pub registry_draining: bool,
    pub drain_deadline: Option<Duration>,
    pub degraded: bool,
    pub superseded: bool,
    /// Stopped: the registry refused the credential past the lease ([`Event::CredentialRefused`](super::control::Event::CredentialRefused)).
    pub credential_refused: bool,
    pub headroom: u64,
}

/// The instance an admitted request is for.
#[derive(Clone, Debug)]
pub struct Instance {
    /// `/` plus the namespace segment.
    pub ns: String,
    pub id: String,
    /// The path after `/{ns}/{id}`, possibly empty.
    pub rest: String,
    /// The placement epoch the request was forwarded under.
    pub epoch: Epoch,
    /// True on the first request at this epoch: the instance was just placed here (or placed
    /// here again after another worker may have held it), so in-memory state is not current.
    pub activated: bool,
    pub attestation: Attestation,
}

/// An answer the worker writes itself, never the application's.
#[derive(Clone, Debug, PartialEq)]
pub struct Answer {
    pub status: StatusCode,
    pub content_type: &'static str,
    pub body: Vec<u8>,
    pub headers: Vec<(HeaderName, HeaderValue)>,
}

impl Answer {
    pub fn text(status: StatusCode, body: &str) -> Answer {
        Answer {
            status,
            content_type: "text/plain; charset=utf-8",
            body: body.as_bytes().to_vec(),
            headers: Vec::new(),
        }
    }

    pub fn json(status: StatusCode, body: &Value) -> Answer {
        Answer {
            status,
            content_type: "application/json",
            body: body.to_string().into_bytes(),
            headers: Vec::new(),
        }
    }

    fn with(mut self, name: HeaderName, value: &'static str) -> Answer {
        self.headers.push((name, HeaderValue::from_static(value)));
        self
    }

    /// 403 `{"detail":"invalid attestation"}`.
    pub fn invalid_attestation() -> Answer {
        Answer::json(
            StatusCode::FORBIDDEN,
            &json!({ "detail": "invalid attestation" }),
        )
    }

    /// The in-band refusal (503, `Retry-After: 1`, `Pinned-Refusal: lease-unhealthy`): Pinboard
    /// re-places the instance.
    pub fn lease_unhealthy() -> Answer {
        Answer::json(
            StatusCode::SERVICE_UNAVAILABLE,
            &json!({ "detail": "lease unhealthy" }),
        )
        .with(RETRY_AFTER, "1")
        .with(REFUSAL, LEASE_UNHEALTHY)
    }

    pub fn not_found() -> Answer {
        Answer::json(StatusCode::NOT_FOUND, &json!({ "detail": "not found" }))
    }

    /// 405 naming what `Allow`s.
    pub fn method_not_allowed(allow: &'static str) -> Answer {
        Answer::text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed").with(ALLOW, allow)
    }
}

/// What a request's path is to a worker.
#[derive(Debug, PartialEq, Eq)]
pub enum Route<'p> {
    /// Outside the advertise URL's path.
    Elsewhere,
    Challenge,
    Stats,
    /// An instance request of a registered namespace: `/{ns}/{id}{rest}`.
    Instance {
        ns: &'p str,
        id: &'p str,
        rest: &'p str,
    },
    /// Not the worker's: a worker of its own routes 404s it, a layer hands it on.
    Other,
}

/// The route `path` takes on a worker whose advertise URL has the path `base`, serving
/// `namespaces`.
pub fn route<'p>(path: &'p str, base: &str, namespaces: &[String]) -> Route<'p> {
    let Some(path) = path.strip_prefix(base) else {
        return Route::Elsewhere;
    };
    match path {
        "/_pinned/challenge" => Route::Challenge,
        "/_pinned/stats" => Route::Stats,
        _ => match split_instance(path, namespaces) {
            Some((ns, id, rest)) => Route::Instance { ns, id, rest },
            None => Route::Other,
        },
    }
}

/// The answer to a `/_pinned/*` request with `method` other than GET or HEAD.
pub fn pinned_route_method(method: &Method) -> Option<Answer> {
    (!matches!(*method, Method::GET | Method::HEAD))
        .then(|| Answer::method_not_allowed("GET, HEAD"))
}

impl Core {
    pub fn new(
        client_id: String,
        namespaces: Vec<String>,
        advertise_url: String,
        base: String,
        headroom: u64,
        expected_instances: usize,
    ) -> Core {
        Core {
            secret: random_hex(32),
            client_id,
            namespaces,
            advertise_url,
            base,
            started: Instant::now(),
            state: Mutex::new(State::new(headroom)),
            held: HeldMap::new(expected_instances),
            goodbyes: Goodbyes::default(),
        }
    }

    pub fn state(&self) -> MutexGuard<'_, State> {
        // Nothing panics while holding the lock, but a poisoned lock still holds consistent
        // data: every update is a single assignment or map operation.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The worker's standing with the registry, as of now.
    pub fn status(&self) -> Status {
        let state = self.state();
        Status {
            session_id: state.session.clone(),
            lease_healthy: state.lease_healthy(Instant::now()),
            draining: state.draining,
            registry_draining: state.registry_draining,
            drain_deadline: state.drain_deadline,
            degraded: state.degraded,
            superseded: state.superseded,
            credential_refused: state.credential_refused,
            headroom: state.headroom,
        }
    }

    /// Decides whether a forward to `(ns, id)` at `epoch` is served, and records the
    /// instance as held at that epoch when it is: the held map's decision, under the gate the
    /// state sets at this moment.
    pub fn admit(&self, ns: &str, id: &str, epoch: &Epoch, now: Instant) -> Admission {
        self.held
            .admit(ns, id, epoch, now, || self.state().gate(now))
    }

    /// The request's attestation (its first `Pinboard-Attestation`), when valid for this
    /// session and issued for `purpose`.
    pub fn attested(
        &self,
        headers: &HeaderMap,
        purpose: Purpose,
    ) -> Result<(Binding, Attestation), Invalid> {
        let token = headers
            .get(ATTESTATION)
            .and_then(|v| v.to_str().ok())
            .ok_or(Invalid::Malformed)?;
        let session = self.state().session.clone().ok_or(Invalid::Audience)?;
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let (binding, attestation) = attest::verify(token, self.secret.as_bytes(), &session, now)?;
        if binding.purpose != purpose {
            return Err(Invalid::Purpose);
        }
        Ok((binding, attestation))
    }

    /// `GET /_pinned/challenge?{query}`: the value of a current challenge, to the node's probe
    /// (the secret) or an attested call.
    pub fn challenge(&self, headers: &HeaderMap, query: &str) -> Answer {
        let secret = headers
            .get(PROXY_SECRET)
            .is_some_and(|v| constant_time_eq(v.as_bytes(), self.secret.as_bytes()));
        if !secret && self.attested(headers, Purpose::Challenge).is_err() {
            return Answer::text(StatusCode::FORBIDDEN, "invalid proxy secret");
        }
        let challenge = query_param(query, "challenge");
        let state = self.state();
        match challenge.as_deref().and_then(|c| state.challenge_value(c)) {
            Some(value) => Answer::json(StatusCode::OK, &json!({ "value": value })),
            None => Answer::text(StatusCode::NOT_FOUND, "unknown challenge"),
        }
    }

    /// `GET /_pinned/stats` (attested): the worker described, plus `extra` fields.
    pub fn stats(&self, headers: &HeaderMap, extra: Map<String, Value>) -> Answer {
        if let Err(why) = self.attested(headers, Purpose::Stats) {
            debug!(reason = %why, "refusing a stats call");
            return Answer::invalid_attestation();
        }
        let now = Instant::now();
        // The held map before the state lock, never under it (the lock order).
        let instances = self.held.instances();
        let state = self.state();
        let count: usize = instances.values().map(Vec::len).sum();
        let mut body = json!({
            "sessionId": state.session,
            "clientId": self.client_id,
            "advertiseUrl": self.advertise_url,
            "namespaces": self.namespaces,
            "instances": instances,
            "instanceCount": count,
            "headroom": state.headroom,
            "draining": state.draining || state.registry_draining,
            "degraded": state.degraded,
            "leaseHealthy": state.lease_healthy(now),
            "uptimeMs": now.duration_since(self.started).as_millis() as u64,
        });
        if let Value::Object(fields) = &mut body {
            fields.extend(extra);
        }
        Answer::json(StatusCode::OK, &body)
    }

    /// The checks of an instance request `/{ns}/{id}{rest}`, in order, once its path was found
    /// not to split when decoded: a valid attestation for `purpose` (`wake` for `_wake`, else
    /// `forward`), one well-formed `Pinboard-Epoch`, the token bound to this instance and
    /// epoch, then the epoch guard and, for a new activation, a live lease. The admitted
    /// [`Instance`], or the answer refusing it.
    pub fn admit_request(
        &self,
        headers: &HeaderMap,
        ns: &str,
        id: &str,
        rest: &str,
        purpose: Purpose,
    ) -> Result<Instance, Answer> {
        let (binding, attestation) = self.attested(headers, purpose).map_err(|why| {
            debug!(%ns, %id, reason = %why, "refusing an unattested instance request");
            Answer::invalid_attestation()
        })?;
        let mut epochs = headers.get_all(EPOCH).iter();
        let (first, repeated) = (epochs.next(), epochs.next().is_some());
        let Some(epoch) = first.and_then(|v| Epoch::parse(v.as_bytes())) else {
            return Err(Answer::text(
                StatusCode::BAD_REQUEST,
                "malformed placement epoch",
            ));
        };
        // The token names the placement it was minted for: another instance's or another
        // epoch's token, or a second `Pinboard-Epoch` beside it, is a replay.
        let bound = if binding.inst.as_deref() != Some(&format!("{ns}/{id}")) {
            Err(Invalid::Instance)
        } else if repeated || binding.epoch.as_deref() != Some(epoch.as_str()) {
            Err(Invalid::Epoch)
        } else {
            Ok(())
        };
        if let Err(why) = bound {
            debug!(%ns, %id, %epoch, reason = %why, "refusing a replayed attestation");
            return Err(Answer::invalid_attestation());
        }
        let activated = match self.admit(ns, id, &epoch, Instant::now()) {
            Admission::Serve { activated: true } => {
                // A newer epoch here: the older one's WebSockets are over.
                self.goodbyes.newer_epoch(ns, id, &epoch);
                true
            }
            Admission::Serve { activated: false } => false,
            Admission::Stale => {
                debug!(%ns, %id, %epoch, "refusing a forward at a stale epoch");
                return Err(Answer::text(StatusCode::CONFLICT, "stale placement epoch"));
            }
            Admission::Refused => {
                debug!(%ns, %id, %epoch, "refusing: lease unhealthy or stopping");
                return Err(Answer::lease_unhealthy());
            }
        };
        Ok(Instance {
            ns: ns.to_owned(),
            id: id.to_owned(),
            rest: rest.to_owned(),
            epoch,
            activated,
            attestation,
        })
    }

    /// Whether an answer the application produced for `instance` must be withheld: admitted on
    /// a live lease, it may still come past it (the worker was paused while the app ran), when
    /// the instance may be another worker's. It is then refused like a forward that came past
    /// the lease ([`Answer::lease_unhealthy`]).
    pub fn withholds_answer(&self, instance: &Instance) -> bool {
        let lapsed = !self.state().lease_healthy(Instant::now());
        if lapsed {
            debug!(ns = %instance.ns, id = %instance.id, epoch = %instance.epoch,
                "refusing: the lease lapsed while the app answered");
        }
        lapsed
    }
}

/// `/{segment}/{id}{rest}` → `("/{segment}", id, rest)` when `/{segment}` is one of
/// `namespaces` and `id` is not empty.
pub fn split_instance<'p>(
    path: &'p str,
    namespaces: &[String],
) -> Option<(&'p str, &'p str, &'p str)> {
    let after_ns = path.get(1..)?.find('/')? + 1;
    let (ns, tail) = path.split_at(after_ns);
    if !namespaces.iter().any(|n| n == ns) {
        return None;
    }
    let tail = &tail[1..];
    let id_end = tail.find('/').unwrap_or(tail.len());
    let (id, rest) = tail.split_at(id_end);
    (!id.is_empty()).then_some((ns, id, rest))
}

/// The first value of `name` in a query string, percent-decoded.
pub fn query_param(query: &str, name: &str) -> Option<String> {
    query.split('&').find_map(|pair| {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        (percent_decode(key) == name).then(|| percent_decode(value))
    })
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let hex = |i: usize| {
        let digit = |b: Option<&u8>| b.and_then(|b| (*b as char).to_digit(16));
        Some(digit(bytes.get(i + 1))? * 16 + digit(bytes.get(i + 2))?)
    };
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match (bytes[i], hex(i)) {
            (b'%', Some(byte)) => {
                // Two hex digits make at most 255.
                out.push(byte as u8);
                i += 3;
                continue;
            }
            (b'+', _) => out.push(b' '),
            (b, _) => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
