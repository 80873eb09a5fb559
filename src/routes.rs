//! The route table: which path goes to which handler, under which credential scope and method,
//! and whether it waits for the node to be the serving fleet; the console's files
//! ([`operator::console`], when it is on); and what the metrics listener answers
//! ([`on_metrics_listener`]). Everything that is not a route here is the data plane
//! (`{ns}/{id}{rest}`, [`crate::proxy`]).
//!
//! Routes sit on top of the per-core state ([`Core`]); handlers get the state and, for a
//! registry route, the credential this table authorized. A handler ends in a [`Fail`] to
//! refuse or to fail; the node answers an error from its origin ([`answers::for_error`]).

use std::borrow::Cow;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use http::{HeaderName, HeaderValue, Method};
use tracing::debug;

use crate::access_log::Record;
use crate::answers::{self, Act, Fail, Handled};
use crate::correlation::{Correlation, REQUEST_ID};
use crate::error::{Error, Origin};
use crate::http::{Handler, Request, Response, remove_dot_segments};
use crate::metrics::RequestKind;
use crate::node::Core;
use crate::operator::console;
use crate::passport::Credential;
use crate::placement::client_ip;
use crate::{operator, proxy, registry};

/// The scope a worker's credential carries: the worker protocol routes.
pub const WORKER_SCOPE: &str = "pinboard:worker";
/// The scope an operator's credential carries: health, views, histories, drains, wind-downs,
/// moves, pauses, metrics.
pub const OPERATOR_SCOPE: &str = "pinboard:operator";

#[derive(Clone, Copy, PartialEq, Eq)]
enum Name {
    Healthz,
    Readyz,
    Metrics,
    RegistryHealth,
    Workers,
    Overview,
    History,
    Stats,
    Register,
    Heartbeat,
    Release,
    Tag,
    Schedule,
    Deregister,
    Drain,
    Undrain,
    WindDown,
    Move,
    Pause,
    Resume,
}

/// Where a route's path is matched.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mount {
    /// On the request's path as sent, before the base path: the probes and the scrape
    /// endpoint answer wherever the node is mounted. Another method falls to the data plane.
    Root,
    /// Below `base_path`, after dot segments are removed. Another method is 405.
    Base,
}

/// The method a route takes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Takes {
    /// `GET`, and `HEAD`.
    Get,
    Post,
}

struct Route {
    path: &'static str,
    mount: Mount,
    /// The credential scope required, checked first.
    scope: Option<&'static str>,
    method: Takes,
    /// Refused while this node is not the serving fleet ([`crate::fleet::Standing::check`]).
    serving_only: bool,
    name: Name,
}

const fn route(path: &'static str, scope: &'static str, method: Takes, name: Name) -> Route {
    Route {
        path,
        mount: Mount::Base,
        scope: Some(scope),
        method,
        serving_only: true,
        name,
    }
}

/// What a 405 to `CONNECT` names in `Allow`: the methods of RFC 9110 §9.3 the data plane
/// forwards (any other, but `PRI`, is forwarded too).
const FORWARDED_METHODS: &str = "GET, HEAD, POST, PUT, DELETE, OPTIONS, TRACE, PATCH";

/// Every route the node answers itself.
const ROUTES: [Route; 20] = [
    Route {
        path: "/healthz",
        mount: Mount::Root,
        scope: None,
        method: Takes::Get,
        serving_only: false,
        name: Name::Healthz,
    },
    Route {
        path: "/readyz",
        mount: Mount::Root,
        scope: None,
        method: Takes::Get,
        serving_only: false,
        name: Name::Readyz,
    },
    Route {
        path: "/metrics",
        mount: Mount::Root,
        scope: Some(OPERATOR_SCOPE),
        method: Takes::Get,
        serving_only: false,
        name: Name::Metrics,
    },
    // It answers while booting or draining: no serving check.
    Route {
        serving_only: false,
        ..route(
            "/registry/health",
            OPERATOR_SCOPE,
            Takes::Get,
            Name::RegistryHealth,
        )
    },
    route(
        "/registry/workers",
        OPERATOR_SCOPE,
        Takes::Get,
        Name::Workers,
    ),
    route(
        "/registry/overview",
        OPERATOR_SCOPE,
        Takes::Get,
        Name::Overview,
    ),
    route(
        "/registry/history",
        OPERATOR_SCOPE,
        Takes::Get,
        Name::History,
    ),
    route("/registry/stats", OPERATOR_SCOPE, Takes::Get, Name::Stats),
    route(
        "/registry/register",
        WORKER_SCOPE,
        Takes::Post,
        Name::Register,
    ),
    route(
        "/registry/heartbeat",
        WORKER_SCOPE,
        Takes::Post,
        Name::Heartbeat,
    ),
    route(
        "/registry/release",
        WORKER_SCOPE,
        Takes::Post,
        Name::Release,
    ),
    route("/registry/tag", WORKER_SCOPE, Takes::Post, Name::Tag),
    route(
        "/registry/schedule",
        WORKER_SCOPE,
        Takes::Post,
        Name::Schedule,
    ),
    route(
        "/registry/deregister",
        WORKER_SCOPE,
        Takes::Post,
        Name::Deregister,
    ),
    route("/registry/drain", OPERATOR_SCOPE, Takes::Post, Name::Drain),
    route(
        "/registry/undrain",
        OPERATOR_SCOPE,
        Takes::Post,
        Name::Undrain,
    ),
    route(
        "/registry/wind_down",
        OPERATOR_SCOPE,
        Takes::Post,
        Name::WindDown,
    ),
    route("/registry/move", OPERATOR_SCOPE, Takes::Post, Name::Move),
    route("/registry/pause", OPERATOR_SCOPE, Takes::Post, Name::Pause),
    route(
        "/registry/resume",
        OPERATOR_SCOPE,
        Takes::Post,
        Name::Resume,
    ),
];

impl Route {
    /// What the request metrics count it as, by the credential it takes.
    fn kind(&self) -> RequestKind {
        match self.scope {
            None => RequestKind::Health,
            Some(WORKER_SCOPE) => RequestKind::Registry,
            Some(_) => RequestKind::Operator,
        }
    }
}

fn method_matches(route: &Route, method: &Method) -> bool {
    match route.method {
        Takes::Get => matches!(*method, Method::GET | Method::HEAD),
        Takes::Post => *method == Method::POST,
    }
}

impl Handler for Core {
    type Note = Record;

    /// Every answer carries the request's `X-Request-Id` (a relayed one gets it where its head
    /// is rewritten), and the request's record is filled on the way for [`Handler::answered`].
    async fn handle(&self, req: &mut Request<'_>, record: &mut Record) -> Result<Response, Error> {
        let correlation = begin(req, record);
        let handled = dispatch(self, req, &correlation, record).await;
        settle(self, req, record, handled).map(|a| end(a, correlation, record))
    }

    /// The request metrics, and the access log's line.
    fn answered(&self, record: Record, req: &Request<'_>, response: &Response, sent: u64) {
        let took = record.started.map_or(Duration::ZERO, |at| at.elapsed());
        self.counters()
            .answered(record.kind, response.status.as_u16(), took);
        self.counters().served_over(req.version());
        let live = self.live();
        if let Some(log) = &live.access_log {
            // The client as `trusted_proxies` says (nginx's `real_ip`): behind a load
            // balancer, the address it forwarded for.
            let client = client_ip(req.peer.ip(), &live.config().trusted_proxies, req);
            log.write(&record, client, Some(req), response, sent);
        }
    }

    /// A head refused before routing: counted and logged as a data-plane answer, with a new
    /// request id.
    fn refused(&self, peer: SocketAddr, response: &mut Response) {
        let correlation = Correlation::of(&http::HeaderMap::new(), rand::random);
        response.headers.push(request_id_header(&correlation));
        self.counters()
            .answered(RequestKind::Data, response.status.as_u16(), Duration::ZERO);
        if let Some(log) = &self.live().access_log {
            let record = Record {
                correlation: Some(correlation),
                ..Record::default()
            };
            log.write(&record, peer.ip(), None, response, 0);
        }
    }
}

/// What a dispatch ended in, as the answer sent: a refusal as it is, an error by its origin.
fn settle(
    core: &Core,
    req: &Request<'_>,
    record: &mut Record,
    handled: Handled,
) -> Result<Response, Error> {
    match handled {
        Ok(answer) | Err(Fail::Answer(answer)) => Ok(answer),
        Err(Fail::Error(e)) => {
            // Contract §8: a Redis call that failed for a transient reason (disconnected,
            // timed out, LOADING, MASTERDOWN, CLUSTERDOWN, TRYAGAIN) is the client's to
            // retry.
            if e.origin() == Origin::Redis && e.is_retryable() {
                debug!(path = req.path(), error = %e, "registry unavailable");
                record.outcome(core.counters(), "unavailable");
            }
            answers::for_error(e)
        }
    }
}

/// What the metrics listener (`metrics_listen`) answers: `GET /metrics` without a credential;
/// with the console on, the console and the operator routes (`{base_path}/registry/…` of
/// `pinboard:operator`, credential-checked exactly as on `listen`) that it calls; no worker
/// route and no data plane. Anything else is 404 `not found`.
pub async fn on_metrics_listener(
    core: &Core,
    req: &mut Request<'_>,
    record: &mut Record,
) -> Result<Response, Error> {
    let correlation = begin(req, record);
    record.kind = RequestKind::Operator;
    let handled = dispatch_metrics_listener(core, req).await;
    settle(core, req, record, handled).map(|a| end(a, correlation, record))
}

async fn dispatch_metrics_listener(core: &Core, req: &mut Request<'_>) -> Handled {
    let raw = req.path();
    if raw == "/metrics" {
        return Ok(match *req.method() {
            Method::GET | Method::HEAD => operator::scrape(core, req).await,
            _ => answers::method_not_allowed("GET"),
        });
    }
    if !core.live().config().console {
        return Ok(answers::not_found());
    }
    let base = core.shared.config.base_path.as_str();
    if console::is_console_path(raw) {
        return Ok(console::serve(req, base));
    }
    let uri = req.head.uri.clone();
    let clean = remove_dot_segments(uri.path());
    let operator_route = strip_base(&clean, base).and_then(|path| {
        ROUTES
            .iter()
            .find(|r| r.mount == Mount::Base && r.scope == Some(OPERATOR_SCOPE) && r.path == path)
    });
    match operator_route {
        Some(route) => call(core, req, route).await,
        None => Ok(answers::not_found()),
    }
}

fn request_id_header(correlation: &Correlation) -> (HeaderName, HeaderValue) {
    // Visible ASCII only (checked, or made here): always a valid header value.
    let value = HeaderValue::from_str(correlation.request_id()).expect("visible ASCII");
    (HeaderName::from_static(REQUEST_ID), value)
}

/// A request's start: when, and its ids (the client's, or new ones).
pub fn begin(req: &Request<'_>, record: &mut Record) -> Correlation {
    record.started = Some(Instant::now());
    Correlation::of(&req.head.headers, rand::random)
}

/// A request's answer: a node answer gets the request's id (a relayed one already has it), and
/// the ids go to the record.
pub fn end(answer: Response, correlation: Correlation, record: &mut Record) -> Response {
    let answer = if answer.is_relayed() {
        answer
    } else {
        let (name, value) = request_id_header(&correlation);
        answer.header(name, value)
    };
    record.correlation = Some(correlation);
    answer
}

/// Which handler answers a request; notes its kind in `record`.
async fn dispatch(
    core: &Core,
    req: &mut Request<'_>,
    correlation: &Correlation,
    record: &mut Record,
) -> Handled {
    // Neither is forwarded (issue 23, L6). CONNECT asks for a tunnel to another host, which the
    // node never opens (RFC 9110 §9.3.6); `PRI` is HTTP/2's connection preface (RFC 9113
    // §3.4), no HTTP/1.1 request. What follows either on the connection is not HTTP/1.1: closed.
    if req.method() == Method::CONNECT {
        return Ok(answers::method_not_allowed(FORWARDED_METHODS).closing());
    }
    if req.method().as_str() == "PRI" {
        return Ok(answers::bad_request("bad request").closing());
    }
    let raw = req.path();
    if let Some(route) = ROUTES
        .iter()
        .find(|r| r.mount == Mount::Root && r.path == raw && method_matches(r, req.method()))
    {
        // Without a metrics registry the path is like any other data-plane miss.
        if route.name == Name::Metrics && !core.live().config().metrics {
            return Ok(answers::unknown_namespace());
        }
        record.kind = route.kind();
        return call(core, req, route).await;
    }
    let base = core.shared.config.base_path.as_str();
    // Outside the base, like `/metrics`; off, the path is the data plane's.
    if console::is_console_path(raw) && core.live().config().console {
        record.kind = RequestKind::Operator;
        return Ok(console::serve(req, base));
    }
    // The URI shares its bytes (a reference count, no copy): the path below the base can be
    // borrowed from it while the request itself is handed on mutably. Dot segments are removed
    // here, once, before any route or instance is read off the path.
    let uri = req.head.uri.clone();
    let clean = remove_dot_segments(uri.path());
    let Some(path) = strip_base(&clean, base) else {
        return Ok(answers::not_found());
    };
    if path == "/registry" || path.starts_with("/registry/") {
        record.kind = RequestKind::Registry;
        return match ROUTES
            .iter()
            .find(|r| r.mount == Mount::Base && r.path == path)
        {
            Some(route) => {
                record.kind = route.kind();
                call(core, req, route).await
            }
            // Unknown registry paths authenticate as worker routes before answering, so
            // probing them tells an unauthenticated caller nothing about which routes exist.
            None => {
                authorize(core, req, WORKER_SCOPE)?;
                core.shared.standing().check()?;
                Ok(answers::not_found())
            }
        };
    }
    // The data plane: `/{ns}/{id}{rest}`. A path that names no namespace is a route miss.
    if path.len() > 1 && path.starts_with('/') {
        // What the worker is sent: the clean path and the query as it came.
        let with_query: Cow<'_, str> = match (&clean, uri.query()) {
            (Cow::Borrowed(_), _) => {
                Cow::Borrowed(uri.path_and_query().map_or(path, |pq| pq.as_str()))
            }
            (Cow::Owned(p), Some(q)) => Cow::Owned(format!("{p}?{q}")),
            (Cow::Owned(p), None) => Cow::Borrowed(p.as_str()),
        };
        let path_and_query = &with_query[base.len()..];
        return proxy::handle(core, req, path, path_and_query, correlation, record).await;
    }
    Ok(answers::not_found())
}

/// A route's checks in order (credential, serving fleet, method), then its handler.
async fn call(core: &Core, req: &mut Request<'_>, route: &Route) -> Handled {
    let credential = match route.scope {
        Some(scope) => match credential_for(core, req, scope) {
            Ok(credential) => Some(credential),
            Err(refused) => {
                if route.name == Name::Heartbeat {
                    // The body is not read before the credential passes: the refusal is said
                    // once per credential (its bytes), not per session.
                    let token = req.header(http::header::AUTHORIZATION);
                    let refusal = registry::HeartbeatRefusal {
                        status: refused.answer.status,
                        why: &refused.why,
                        sub: refused.sub.as_deref(),
                        session: None,
                    };
                    refusal.say_once(core, token.map_or(&b""[..], |t| t.as_bytes()));
                }
                return Err(refused.answer.into());
            }
        },
        None => None,
    };
    if route.serving_only {
        core.shared.standing().check()?;
    }
    if !method_matches(route, req.method()) {
        return Ok(answers::method_not_allowed(match route.method {
            Takes::Get => "GET",
            Takes::Post => "POST",
        }));
    }
    let Some(credential) = credential.as_ref() else {
        return match route.name {
            Name::Healthz => Ok(operator::healthz()),
            _ => Ok(operator::readyz(core).await),
        };
    };
    // Registrations, schedules and operator acts: a refusal is one log line (`Act`).
    let mut act = Act::default();
    let act_name = match route.name {
        Name::Register => "registration",
        Name::Schedule => "schedule",
        Name::Drain => "operator drain",
        Name::Undrain => "operator undrain",
        Name::WindDown => "operator wind_down",
        Name::Move => "operator move",
        Name::Pause => "operator pause",
        Name::Resume => "operator resume",
        _ => "",
    };
    let answered = match route.name {
        Name::Metrics => Ok(operator::metrics(core, req, credential).await),
        Name::RegistryHealth => operator::registry_health(core).await,
        Name::Workers => operator::workers(core, credential).await,
        Name::Overview => operator::overview(core, req, credential).await,
        Name::History => operator::history(core, req, credential).await,
        Name::Stats => operator::stats(core, credential).await,
        Name::Register => registry::register(core, req, credential, &mut act).await,
        Name::Heartbeat => registry::heartbeat(core, req, credential).await,
        Name::Release => registry::release(core, req, credential).await,
        Name::Tag => registry::tag(core, req, credential).await,
        Name::Schedule => registry::schedule(core, req, credential).await,
        Name::Deregister => registry::deregister(core, req, credential).await,
        Name::Drain => operator::drain(core, req, credential, &mut act).await,
        Name::Undrain => operator::undrain(core, req, credential, &mut act).await,
        Name::WindDown => operator::wind_down(core, req, credential, &mut act).await,
        Name::Move => operator::move_instance(core, req, credential, &mut act).await,
        Name::Pause => operator::pause(core, req, credential, &mut act).await,
        Name::Resume => operator::resume(core, req, credential, &mut act).await,
        Name::Healthz | Name::Readyz => unreachable!("open routes are answered above"),
    };
    if !act_name.is_empty() {
        answers::log_refusal(act_name, credential, &act, &answered);
    }
    answered
}

/// The credential of a request to a route that requires `scope`, or the answer refusing it:
/// 401 without a valid credential; 403 when it lacks `scope`, an account (`sub`) or a
/// well-formed `pinboard` claim.
pub fn authorize(core: &Core, req: &Request<'_>, scope: &str) -> Handled<Credential> {
    credential_for(core, req, scope).map_err(|refused| refused.answer.into())
}

/// A credential refused on a route: the answer, why (for the log) and its `sub` when it
/// verified.
struct Refused {
    answer: Response,
    why: String,
    sub: Option<String>,
}

/// [`authorize`], with why a refused credential is refused.
fn credential_for(core: &Core, req: &Request<'_>, scope: &str) -> Result<Credential, Refused> {
    let credential = (core.live().settings.passport)
        .verify_headers(&req.head.headers)
        .map_err(|e| Refused {
            answer: answers::unauthorized(),
            why: e.to_string(),
            sub: None,
        })?;
    let why = if !credential.has_scope(scope) {
        format!("the credential lacks the scope {scope}")
    } else if credential.sub.is_none() {
        "the credential names no account (sub)".to_owned()
    } else if let Err(malformed) = credential.route_claim() {
        malformed.to_string()
    } else {
        return Ok(credential);
    };
    Err(Refused {
        answer: answers::forbidden(),
        why,
        sub: credential.sub,
    })
}

/// The path below `base` (`""` serves everything), or `None` outside it: `/apix` is not
/// under `/api`.
fn strip_base<'p>(path: &'p str, base: &str) -> Option<&'p str> {
    path.strip_prefix(base)
        .filter(|rest| rest.is_empty() || rest.starts_with('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_path_matches_whole_segments() {
        assert_eq!(strip_base("/a/b", ""), Some("/a/b"));
        assert_eq!(strip_base("/api/registry/x", "/api"), Some("/registry/x"));
        assert_eq!(strip_base("/api", "/api"), Some(""));
        assert_eq!(strip_base("/apix/registry", "/api"), None);
        assert_eq!(strip_base("/other", "/api"), None);
    }

    #[test]
    fn every_route_is_listed_once() {
        for (i, a) in ROUTES.iter().enumerate() {
            for b in &ROUTES[i + 1..] {
                assert!(a.path != b.path && a.name != b.name, "{}", a.path);
            }
        }
    }
}
