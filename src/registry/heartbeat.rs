//! `POST /registry/heartbeat`: re-probe the advertise URL, renew the lease, carry headroom,
//! draining and degraded into every bucket, deliver control messages until acked. A heartbeat
//! refused 401 or 403 is logged once per credential or session ([`HeartbeatRefusal`]).

use std::time::Duration;

use http::StatusCode;
use pinboard_protocol::registry::{
    ControlMessage, HeartbeatAnswer, HeartbeatRequest, Lease, MsgId,
};
use serde::Deserialize;
use tracing::{info, warn};

use super::fields::{Scope, check_claim};
use super::probe::{Probe, probe};
use super::{claim_of, drain_secs_left, owned_session, secs_left};
use crate::answers::{self, BODY_LIMIT, Fail, Handled, unknown_session};
use crate::http::{Request, Response, WorkerAddr, read_json};
use crate::node::Core;
use crate::passport::Credential;
use crate::store::scripts::HEARTBEAT;
use crate::store::{Drain, Session, lua_list, lua_option};

const SHAPE: &str =
    "{sessionId, headroom: number, draining: boolean, challenge, challengeValue, acks?: msgId[]}";

#[derive(Deserialize)]
struct Outcome {
    #[serde(default)]
    unknown: bool,
    superseded: Option<String>,
    session: Option<Session>,
    #[serde(default)]
    now: u64,
    #[serde(default, deserialize_with = "lua_option")]
    drain: Option<Drain>,
    #[serde(default, deserialize_with = "lua_list")]
    messages: Vec<Stored>,
}

/// A control message as queued: `deadline` absolute (ms), absent when it revokes.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Stored {
    msg_id: String,
    #[serde(rename = "type")]
    kind: String,
    ns: String,
    id: String,
    #[serde(default, deserialize_with = "lua_option")]
    deadline: Option<u64>,
    /// Queued by a move: carried to the worker as it is.
    #[serde(default)]
    moved: bool,
}

/// A heartbeat refused 401 or 403, for the log: one `warn` line per worker that keeps sending
/// it, not one a heartbeat. Said once per key and reason: the key is the credential's bytes
/// when the route refused the credential itself (its body is not read before the credential
/// passes, so the session is unknown), the session when the credential passed but may not keep
/// that session.
pub struct HeartbeatRefusal<'a> {
    pub status: StatusCode,
    pub why: &'a str,
    pub sub: Option<&'a str>,
    pub session: Option<&'a str>,
}

impl HeartbeatRefusal<'_> {
    pub fn say_once(&self, core: &Core, key: &[u8]) {
        if core.shared.heartbeat_refusals.first(key, self.why) {
            warn!(
                status = self.status.as_u16(),
                reason = %self.why,
                sub = self.sub.map(tracing::field::display),
                session = self.session.map(tracing::field::display),
                "heartbeat refused"
            );
        }
    }
}

pub async fn heartbeat(core: &Core, req: &mut Request<'_>, credential: &Credential) -> Handled {
    let body: HeartbeatRequest = read_json(req, BODY_LIMIT, SHAPE).await?;
    // Every JSON number reads as an f64.
    let headroom = body.headroom.as_f64().unwrap_or(f64::NAN);
    if !headroom.is_finite() || headroom < 0.0 {
        return Ok(answers::bad_request(&format!("expected {SHAPE}")));
    }
    let refused = |why: &str| {
        let refusal = HeartbeatRefusal {
            status: StatusCode::FORBIDDEN,
            why,
            sub: credential.sub.as_deref(),
            session: Some(&body.session_id),
        };
        refusal.say_once(core, body.session_id.as_bytes());
        answers::forbidden()
    };
    let session = match owned_session(core, credential, &body.session_id, true).await {
        Err(Fail::Answer(answer)) if answer.status == StatusCode::FORBIDDEN => {
            return Ok(refused("another account (sub) registered the session"));
        }
        owned => owned?,
    };
    // A credential whose claims no longer cover the record may not keep it alive.
    let claim = claim_of(credential)?;
    let advertise = match WorkerAddr::parse(&session.advertise_url) {
        Ok(advertise) if check_claim(claim, &Scope::of(&session, &advertise)).is_ok() => advertise,
        _ => {
            return Ok(refused(
                "the credential's claims no longer cover the registration",
            ));
        }
    };

    let timeout = Duration::from_millis(core.live().config().verify_timeout_ms);
    let probed = probe(
        &advertise,
        &core.shared.tls.workers,
        &session.secret,
        &body.challenge,
        &body.challenge_value,
        timeout,
    )
    .await;
    let outcome = match probed {
        Probe::Pass => "pass",
        Probe::Failed(detail) => {
            warn!(session = %session.session_id, url = %session.advertise_url, %detail, "heartbeat probe failed; worker degraded");
            "degraded"
        }
        Probe::Mismatch => {
            warn!(session = %session.session_id, url = %session.advertise_url, "another worker answers at the advertise URL; registration voided");
            core.store.drop_session(&session.session_id, false).await?;
            return Ok(Response::json_value(
                StatusCode::CONFLICT,
                &serde_json::json!({
                    "error": "registration voided: challenge value mismatch on the advertise URL",
                    "reregister": true
                }),
            ));
        }
    };

    let acks: Vec<String> = body
        .acks
        .into_iter()
        .map(|id| match id {
            MsgId::Number(n) => n.to_string(),
            MsgId::Text(s) => s,
        })
        .collect();
    let acks = serde_json::to_string(&acks).expect("acks serialize");
    let headroom = headroom.to_string();
    let draining: &[u8] = if body.draining { b"1" } else { b"0" };
    let store = &core.store;
    let (queue, drain) = (
        store.keys.control(&session.session_id),
        store.keys.drain(&session.client_id),
    );
    let result: Outcome = store
        .run(
            &HEARTBEAT,
            &[
                store.keys.sessions().as_bytes(),
                store.keys.bind_hosts().as_bytes(),
                queue.as_bytes(),
                drain.as_bytes(),
            ],
            &[
                session.session_id.as_bytes(),
                headroom.as_bytes(),
                draining,
                outcome.as_bytes(),
                acks.as_bytes(),
                store.lease().as_bytes(),
            ],
        )
        .await?;
    if let Some(superseded) = result.superseded {
        info!(session = %body.session_id, %superseded, "worker superseded");
        core.store.drop_session(&body.session_id, false).await?;
        return Ok(Response::json_value(
            StatusCode::CONFLICT,
            &serde_json::json!({"error": superseded, "superseded": true}),
        ));
    }
    let Some(session) = result.session.filter(|_| !result.unknown) else {
        return Ok(unknown_session());
    };
    let renewed = store
        .put_everywhere(&session, result.drain.is_some(), None)
        .await?;
    if renewed.healed > 0 {
        info!(session = %session.session_id, buckets = renewed.healed, "worker copy restored in buckets that had lost it");
    }

    let now = result.now;
    let mut messages: Vec<ControlMessage> = result
        .messages
        .into_iter()
        .filter_map(|m| {
            Some(ControlMessage {
                msg_id: MsgId::Number(m.msg_id.parse().ok()?),
                kind: m.kind,
                ns: m.ns,
                id: m.id,
                deadline: m.deadline.map(|d| secs_left(d, now).into()),
                moved: m.moved,
            })
        })
        .collect();
    messages.sort_by(|a, b| a.msg_id.cmp(&b.msg_id));
    Ok(Response::json_value(
        StatusCode::OK,
        &HeartbeatAnswer {
            lease: Lease {
                expires_in_ms: core.shared.config.lease_ttl_ms,
                draining: session.draining || result.drain.is_some(),
                drain_deadline: result
                    .drain
                    .as_ref()
                    .and_then(|d| drain_secs_left(d, now))
                    .map(Into::into),
            },
            degraded: session.degraded_since.map(|_| true),
            messages,
        },
    ))
}
