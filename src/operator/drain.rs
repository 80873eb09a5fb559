//! `POST /registry/drain` and `POST /registry/undrain`: an operator cordons a worker (no new
//! placements) or drains it by a deadline (its lease cannot be renewed past it, so its
//! placements move), and revokes either. Both take effect at the worker's next heartbeat.

use http::StatusCode;
use serde::Deserialize;
use tracing::info;

use crate::answers::{self, Act, BODY_LIMIT, Handled};
use crate::error::Error;
use crate::http::{Request, Response, read_json};
use crate::node::Core;
use crate::passport::Credential;
use crate::store::Session;
use crate::store::scripts::DRAIN;

const DRAIN_SHAPE: &str = "{clientId, deadline: seconds | null}";

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct DrainBody {
    client_id: String,
    /// Seconds; `null` (or absent) cordons.
    deadline: Option<f64>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct UndrainBody {
    client_id: String,
}

/// `act` names the client for the log line of a refusal; a drain done is one line at `info`.
pub async fn drain(
    core: &Core,
    req: &mut Request<'_>,
    credential: &Credential,
    act: &mut Act,
) -> Handled {
    let body: DrainBody = read_json(req, BODY_LIMIT, DRAIN_SHAPE).await?;
    act.about = Some(body.client_id.clone());
    if body.deadline.is_some_and(|d| !d.is_finite() || d < 0.0) {
        return Ok(answers::bad_request(&format!("expected {DRAIN_SHAPE}")));
    }
    if !in_scope(core, credential, &body.client_id).await? {
        return Ok(answers::forbidden());
    }
    let deadline = body.deadline.map(|d| d.to_string()).unwrap_or_default();
    run(core, &body.client_id, "set", &deadline).await?;
    info!(
        sub = %credential.sub.as_deref().unwrap_or_default(),
        clientId = %body.client_id,
        deadline = %if deadline.is_empty() { "null" } else { &deadline },
        "operator drain"
    );
    Ok(Response::json(StatusCode::OK, &br#"{"drained":true}"#[..]))
}

/// As [`drain`]: a refusal names the client; an undrain done is one line at `info`.
pub async fn undrain(
    core: &Core,
    req: &mut Request<'_>,
    credential: &Credential,
    act: &mut Act,
) -> Handled {
    let body: UndrainBody = read_json(req, BODY_LIMIT, "{clientId}").await?;
    act.about = Some(body.client_id.clone());
    if !in_scope(core, credential, &body.client_id).await? {
        return Ok(answers::forbidden());
    }
    let revoked = run(core, &body.client_id, "clear", "").await? == 1;
    info!(
        sub = %credential.sub.as_deref().unwrap_or_default(),
        clientId = %body.client_id,
        revoked,
        "operator undrain"
    );
    Ok(Response::json_value(
        StatusCode::OK,
        &serde_json::json!({ "revoked": revoked }),
    ))
}

async fn run(core: &Core, client: &str, op: &str, deadline: &str) -> Result<i64, Error> {
    let store = &core.store;
    let key = store.keys.drain(client);
    store
        .run_int(
            &DRAIN,
            &[key.as_bytes()],
            &[op.as_bytes(), deadline.as_bytes(), store.lease().as_bytes()],
        )
        .await
}

/// Whether the client has a session the credential's claims cover: its namespaces, its
/// hostname and its envs. An unknown client is out of scope.
async fn in_scope(core: &Core, credential: &Credential, client: &str) -> Result<bool, Error> {
    let Some(record) = core.store.client(client).await? else {
        return Ok(false);
    };
    let Some(session) = core.store.session(&record.session_id).await? else {
        return Ok(false);
    };
    Ok(covers(credential, &session))
}

fn covers(credential: &Credential, session: &Session) -> bool {
    let Ok(claim) = credential.route_claim() else {
        return false;
    };
    session
        .namespaces
        .iter()
        .all(|ns| claim.allows_namespace(ns))
        && session
            .hostname
            .as_deref()
            .is_none_or(|h| claim.allows_hostname(h))
        && session
            .env
            .iter()
            .chain(session.envs.values())
            .all(|e| claim.allows_env(e))
}
