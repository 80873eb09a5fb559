//! `POST /registry/pause` and `POST /registry/resume`: an operator stops the data plane from
//! serving one instance, on every node, without touching its placement, and lets it serve
//! again. The pause lives in the id's row (`lua/pause.lua`), which every resolve reads anyway:
//! a paused id is answered 503 `instance paused` + `Retry-After: 1` with no further Redis call.
//! An id without a row gets an ownerless placeholder holding the pause, so that no node places
//! it meanwhile. Both are idempotent: a pause of a paused id (or a resume of one not paused)
//! answers `{"ok": true}` and changes nothing, the first pause's reason included.
//!
//! Scope is judged as for a wind-down: on the row's owner record (its hostname and env), or on
//! the row's hostname when the owner is gone; the write happens only while the row's owner is
//! still the one judged (read again otherwise).

use http::StatusCode;
use serde::Deserialize;
use tracing::info;

use crate::answers::{self, Act, BODY_LIMIT, Handled};
use crate::error::{Error, Origin};
use crate::http::{Request, Response, read_json};
use crate::node::Core;
use crate::passport::Credential;
use crate::store::{Pause, PauseOutcome};

use super::wind_down::{covers, judged};

const PAUSE_SHAPE: &str = "{namespace, id, env?, reason?}";
const RESUME_SHAPE: &str = "{namespace, id, env?}";

/// How often the row is read and judged again when its owner changed under the write.
const STALE_RETRIES: usize = 3;

/// The longest reason kept (bytes): a note for the overview, not a document.
const MAX_REASON: usize = 1024;

#[derive(Deserialize)]
struct Body {
    namespace: String,
    id: String,
    env: Option<String>,
    /// Pause only (a resume's is ignored).
    reason: Option<String>,
}

/// `POST /registry/pause`; `act` names `{ns}/{id}` for the log line of a refusal.
pub async fn pause(
    core: &Core,
    req: &mut Request<'_>,
    credential: &Credential,
    act: &mut Act,
) -> Handled {
    let body: Body = read_json(req, BODY_LIMIT, PAUSE_SHAPE).await?;
    if body.reason.as_ref().is_some_and(|r| r.len() > MAX_REASON) {
        return Ok(answers::bad_request(&format!("expected {PAUSE_SHAPE}")));
    }
    let reason = body.reason.clone().unwrap_or_default();
    set(
        core,
        credential,
        act,
        body,
        Pause::Pause { reason: &reason },
    )
    .await
}

/// `POST /registry/resume`; `act` names `{ns}/{id}` for the log line of a refusal.
pub async fn resume(
    core: &Core,
    req: &mut Request<'_>,
    credential: &Credential,
    act: &mut Act,
) -> Handled {
    let body: Body = read_json(req, BODY_LIMIT, RESUME_SHAPE).await?;
    set(core, credential, act, body, Pause::Resume).await
}

async fn set(
    core: &Core,
    credential: &Credential,
    act: &mut Act,
    body: Body,
    ask: Pause<'_>,
) -> Handled {
    act.about = Some(format!("{}/{}", body.namespace, body.id));
    let (ns, id) = (body.namespace.as_str(), body.id.as_str());
    let (env, claim) = judged(core, credential, ns, Some(id), body.env.as_deref())?;
    let by = credential.sub.as_deref().unwrap_or_default();
    let store = &core.store;
    for _ in 0..STALE_RETRIES {
        let row = store.row(&env, ns, id).await?;
        if let Some(row) = &row {
            let owner = match row.owner() {
                Some(session) => store.session(session).await?,
                None => None,
            };
            if !covers(claim, owner.as_ref(), row.hostname.as_deref(), ns) {
                return Ok(answers::forbidden());
            }
        }
        let outcome = store.pause(&env, ns, id, row.as_ref(), ask, by).await?;
        if outcome == PauseOutcome::Stale {
            continue;
        }
        info!(
            sub = %by,
            namespace = %ns,
            id = %id,
            env = %env,
            changed = outcome == PauseOutcome::Changed,
            "operator {}",
            match ask {
                Pause::Pause { .. } => "pause",
                Pause::Resume => "resume",
            }
        );
        return Ok(Response::json(StatusCode::OK, &br#"{"ok":true}"#[..]));
    }
    Err(Error::new(
        Origin::Redis,
        format!("{ns}/{id}: its row kept changing owner under a pause"),
    )
    .retryable(true)
    .into())
}
