//! The operator's read views of the fleet: `GET /registry/workers` (the live worker records)
//! and `GET /registry/stats` (each live worker's own `/_pinned/stats`, attested). Both show
//! only what the credential's claims cover.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::future::join_all;
use http::{Method, StatusCode};
use serde_json::{Map, Value, json};

use crate::error::{Error, Origin};
use crate::http::{Response, WorkerAddr, fetch};
use crate::node::Core;
use crate::passport::{Credential, RouteClaim};
use crate::proxy::Signer;
use crate::registry::Session;

const STATS_TIMEOUT: Duration = Duration::from_secs(3);
const STATS_CONCURRENCY: usize = 8;
const STATS_MAX_BODY: usize = 1024 * 1024;

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Live sessions the claim covers, their namespaces (and envs) cut down to the covered ones,
/// sorted by hostname, then session.
async fn visible_sessions(core: &Core, claim: &RouteClaim) -> Result<Vec<Session>, Error> {
    let key = format!("{}sessions", core.keys.registry());
    let reply = core.redis.cmd(&[b"HVALS", key.as_bytes()]).await?;
    let now = now_ms();
    let mut sessions: Vec<Session> = Vec::new();
    for raw in reply.as_array().unwrap_or_default() {
        let Some(raw) = raw.as_bytes() else { continue };
        let mut session: Session = serde_json::from_slice(raw)
            .map_err(|e| Error::because(Origin::Internal, "stored session", e))?;
        if session.expiry <= now
            || session
                .hostname
                .as_deref()
                .is_some_and(|h| !claim.allows_hostname(h))
        {
            continue;
        }
        let kept: Vec<String> = session
            .namespaces
            .iter()
            .filter(|ns| {
                // Envs exist in hostname-aware mode only.
                claim.allows_namespace(ns)
                    && (session.hostname.is_none() || claim.allows_env(session.env_of(ns)))
            })
            .cloned()
            .collect();
        session.envs.retain(|ns, _| kept.contains(ns));
        session.namespaces = kept;
        if !session.namespaces.is_empty() {
            sessions.push(session);
        }
    }
    sessions.sort_by(|a, b| (&a.hostname, &a.session_id).cmp(&(&b.hostname, &b.session_id)));
    Ok(sessions)
}

fn claim(credential: &Credential) -> Option<&RouteClaim> {
    credential.route_claim().ok()
}

pub async fn workers(core: &Core, credential: &Credential) -> Result<Response, Error> {
    let Some(claim) = claim(credential) else {
        return Ok(Response::error(StatusCode::FORBIDDEN, "forbidden"));
    };
    let workers: Vec<Value> = visible_sessions(core, claim)
        .await?
        .into_iter()
        .map(|s| {
            let mut entry = json!({
                "sessionId": s.session_id,
                "clientId": s.client_id,
                "advertiseUrl": s.advertise_url,
                "namespaces": s.namespaces,
                "hostname": s.hostname,
                "envs": s.envs,
                "takeover": s.takeover.map(|t| t.as_str()),
                "headroom": s.headroom,
                "draining": s.draining,
                "expiry": s.expiry,
            });
            if let Some(since) = s.degraded_since {
                entry["degradedSince"] = since.into();
            }
            entry
        })
        .collect();
    Ok(Response::json_value(
        StatusCode::OK,
        &json!({ "workers": workers }),
    ))
}

pub async fn stats(core: &Core, credential: &Credential) -> Result<Response, Error> {
    let Some(claim) = claim(credential) else {
        return Ok(Response::error(StatusCode::FORBIDDEN, "forbidden"));
    };
    let sessions = visible_sessions(core, claim).await?;
    let mut workers = Vec::with_capacity(sessions.len());
    for batch in sessions.chunks(STATS_CONCURRENCY) {
        workers.extend(join_all(batch.iter().map(worker_stats)).await);
    }
    Ok(Response::json_value(
        StatusCode::OK,
        &json!({ "workers": workers }),
    ))
}

/// One worker's `/_pinned/stats`, attested for its session, cut down to its visible
/// namespaces; `error: "unreachable"` when it does not answer with a JSON object in time.
async fn worker_stats(session: &Session) -> Value {
    let mut entry = json!({
        "sessionId": session.session_id,
        "clientId": session.client_id,
        "hostname": session.hostname,
    });
    match fetch_stats(session).await {
        Some(mut stats) => {
            let visible = |ns: &str| session.namespaces.iter().any(|n| n == ns);
            if let Some(Value::Array(list)) = stats.get_mut("namespaces") {
                list.retain(|ns| ns.as_str().is_some_and(visible));
            }
            if let Some(Value::Object(instances)) = stats.get_mut("instances") {
                instances.retain(|ns, _| visible(ns));
            }
            entry["stats"] = Value::Object(stats);
        }
        None => entry["error"] = "unreachable".into(),
    }
    entry
}

async fn fetch_stats(session: &Session) -> Option<Map<String, Value>> {
    let addr = WorkerAddr::parse(&session.advertise_url).ok()?;
    let iat = SystemTime::now().duration_since(UNIX_EPOCH).ok()?.as_secs();
    let mut token = Vec::new();
    Signer::new(session.secret.as_bytes()).sign_into(
        &session.session_id,
        iat,
        None,
        &mut Vec::new(),
        &mut token,
    );
    let token = String::from_utf8(token).ok()?;
    let headers = [("pinboard-attestation", token.as_str())];
    let answer = fetch(
        &addr,
        Method::GET,
        "/_pinned/stats",
        &headers,
        b"",
        STATS_TIMEOUT,
        STATS_MAX_BODY,
    )
    .await
    .ok()?;
    if !answer.status.is_success() {
        return None;
    }
    match serde_json::from_slice(&answer.body).ok()? {
        Value::Object(stats) => Some(stats),
        _ => None,
    }
}
