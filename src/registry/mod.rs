//! The registry: the worker protocol under `{base_path}/registry/` (register, heartbeat,
//! release, tag, deregister), the dispatch of the operator routes living there, the
//! authentication every registry route shares, and the answer for paths that name no route.
//!
//! What is stored where, and every script, is the store's (`crate::store`).

mod deregister;
mod fields;
mod heartbeat;
mod probe;
mod register;
mod release;

use http::{Method, StatusCode};
use serde::Serialize;

use crate::error::{Error, Origin};
use crate::http::{Request, Response};
use crate::node::Core;
use crate::passport::{Credential, RouteClaim};
use crate::store::scripts::CONTROL_PUSH;
use crate::store::{Drain, Session};

pub use fields::{valid_id, valid_namespace};

pub const WORKER_SCOPE: &str = "pinboard:worker";
pub const OPERATOR_SCOPE: &str = "pinboard:operator";

/// 503 `{"error":"not the serving fleet"}` + `Retry-After: 1`.
pub fn not_serving() -> Response {
    crate::placement::unavailable("not the serving fleet", std::time::Duration::ZERO)
}

fn method_not_allowed(allow: &'static str) -> Response {
    Response::error(StatusCode::METHOD_NOT_ALLOWED, "method not allowed")
        .header(http::header::ALLOW, http::HeaderValue::from_static(allow))
}

pub async fn handle(core: &Core, req: &mut Request<'_>, path: &str) -> Result<Response, Error> {
    let route = &path["/registry".len()..];
    // Unknown registry paths authenticate as worker routes before answering, so probing
    // them tells an unauthenticated caller nothing about which routes exist.
    let scope = match route {
        "/health" | "/workers" | "/overview" | "/stats" | "/drain" | "/undrain" | "/wind_down" => {
            OPERATOR_SCOPE
        }
        _ => WORKER_SCOPE,
    };
    let credential = match authorize(core, req, scope) {
        Ok(credential) => credential,
        Err(refusal) => return Ok(refusal),
    };
    if route == "/health" {
        // It answers while booting or draining: no serving check.
        if !matches!(*req.method(), Method::GET | Method::HEAD) {
            return Ok(method_not_allowed("GET"));
        }
        return crate::operator::registry_health(core).await;
    }
    if !core.shared.is_serving() {
        return Ok(not_serving());
    }
    if matches!(route, "/workers" | "/overview" | "/stats") {
        if !matches!(*req.method(), Method::GET | Method::HEAD) {
            return Ok(method_not_allowed("GET"));
        }
        return match route {
            "/workers" => crate::operator::workers(core, &credential).await,
            "/overview" => match crate::operator::OverviewFilter::parse(req.head.uri.query()) {
                Ok(filter) => crate::operator::overview(core, &credential, &filter).await,
                Err(refusal) => Ok(refusal),
            },
            _ => crate::operator::stats(core, &credential).await,
        };
    }
    let known = matches!(
        route,
        "/register"
            | "/heartbeat"
            | "/release"
            | "/tag"
            | "/deregister"
            | "/drain"
            | "/undrain"
            | "/wind_down"
    );
    if !known {
        return Ok(Response::error(StatusCode::NOT_FOUND, "not found"));
    }
    if req.method() != Method::POST {
        return Ok(method_not_allowed("POST"));
    }
    match route {
        "/register" => register::register(core, req, &credential).await,
        "/heartbeat" => heartbeat::heartbeat(core, req, &credential).await,
        "/release" => release::release(core, req, &credential).await,
        "/tag" => release::tag(core, req, &credential).await,
        "/drain" => crate::operator::drain(core, req, &credential).await,
        "/undrain" => crate::operator::undrain(core, req, &credential).await,
        "/wind_down" => crate::operator::wind_down(core, req, &credential).await,
        _ => deregister::deregister(core, req, &credential).await,
    }
}

/// The credential of a registry request, or the answer refusing it: 401 without a valid
/// credential; 403 when it lacks `scope`, an account (`sub`) or a well-formed `pinboard` claim.
pub fn authorize(core: &Core, req: &Request<'_>, scope: &str) -> Result<Credential, Response> {
    let authorization = req
        .header(http::header::AUTHORIZATION)
        .map(|v| v.as_bytes());
    let credential = core
        .shared
        .passport
        .verify(authorization)
        .map_err(|_| Response::error(StatusCode::UNAUTHORIZED, "unauthorized"))?;
    let forbidden = || Response::error(StatusCode::FORBIDDEN, "forbidden");
    if !credential.has_scope(scope) || credential.sub.is_none() {
        return Err(forbidden());
    }
    credential.route_claim().map_err(|_| forbidden())?;
    Ok(credential)
}

/// The route claim of a credential [`authorize`] accepted.
fn claim_of(credential: &Credential) -> Result<&RouteClaim, Error> {
    credential.route_claim().map_err(|_| {
        Error::new(
            Origin::Internal,
            "authorized credential without a route claim",
        )
    })
}

/// The account of a credential [`authorize`] accepted.
fn account_of(credential: &Credential) -> String {
    credential.sub.clone().unwrap_or_default()
}

fn new_session_id() -> String {
    let bytes: [u8; 16] = rand::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `409 {"error":"unknown session","reregister":true}` (contract §5).
fn unknown_session() -> Response {
    Response::json_value(
        StatusCode::CONFLICT,
        &serde_json::json!({"error": "unknown session", "reregister": true}),
    )
}

/// The session a worker route names, refused as the spec says: 409 when the registry has no
/// record (or, with `live`, when its lease ran out), 403 when another account registered it.
async fn owned_session(
    core: &Core,
    credential: &Credential,
    session_id: &str,
    live: bool,
) -> Result<Result<Session, Response>, Error> {
    let Some(session) = core.store.session(session_id).await? else {
        return Ok(Err(unknown_session()));
    };
    if live && session.expiry <= now_ms() {
        return Ok(Err(unknown_session()));
    }
    if credential.sub.as_deref() != Some(session.account.as_str()) {
        return Ok(Err(fields::forbidden_generic()));
    }
    Ok(Ok(session))
}

/// Wall-clock ms, for checks the scripts repeat against Redis's own clock.
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The remaining seconds of a timed drain, rounded up (`None` for a cordon).
fn drain_secs_left(drain: &Drain, now: u64) -> Option<u64> {
    drain.deadline.map(|d| secs_left(d, now))
}

/// Seconds from `now` to the `deadline` (both ms), rounded up; 0 once it passed.
fn secs_left(deadline: u64, now: u64) -> u64 {
    deadline.saturating_sub(now).div_ceil(1000)
}

#[derive(Serialize)]
struct WindDown<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    ns: &'a str,
    id: &'a str,
    /// Absolute ms; absent revokes an earlier wind-down.
    #[serde(skip_serializing_if = "Option::is_none")]
    deadline: Option<u64>,
}

/// Queues a `wind_down` message to `session_id` for each (ns, id, deadline ms or none to
/// revoke).
pub(crate) async fn control_push(
    core: &Core,
    session_id: &str,
    wind_downs: &[(String, String, Option<u64>)],
) -> Result<(), Error> {
    if wind_downs.is_empty() {
        return Ok(());
    }
    let messages: Vec<WindDown> = wind_downs
        .iter()
        .map(|(ns, id, deadline)| WindDown {
            kind: "wind_down",
            ns,
            id,
            deadline: *deadline,
        })
        .collect();
    let messages = serde_json::to_string(&messages).expect("messages serialize");
    let store = &core.store;
    let queue = store.keys.control(session_id);
    store
        .run_int(
            &CONTROL_PUSH,
            &[queue.as_bytes(), store.keys.control_seq().as_bytes()],
            &[store.lease().as_bytes(), messages.as_bytes()],
        )
        .await?;
    Ok(())
}
