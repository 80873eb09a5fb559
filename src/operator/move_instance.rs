//! `POST /registry/move`: an operator moves one instance to a named worker. The row is fenced
//! as a wind-down fences it (now + max(deadline, one lease), `wind_down.lua`) and names the
//! successor's session; the owner hears a `wind_down` with `"moved": true`. Once the owner
//! lets go (it releases as soon as it saved its state, which leaves a placeholder naming the
//! successor; or the fence passes), the next placement of the id goes to the successor when it
//! is still a candidate there, else to the normal choice (`lua/resolve.lua`).
//!
//! `to` names a client; the move goes to its live session when that session serves the
//! (env, namespace) (on the row's hostname, in hostname-aware mode), the credential's claims
//! cover it, and it is neither draining (its own flag or an operator drain) nor degraded.
//! Otherwise the answer's `to` is null and the move still fences: the next placement is the
//! normal choice.

use std::slice;

use http::StatusCode;
use serde::Deserialize;
use tracing::info;

use crate::answers::{self, Act, BODY_LIMIT, Handled};
use crate::clock::now_ms;
use crate::error::Error;
use crate::http::{Request, Response, read_json};
use crate::node::Core;
use crate::passport::{Credential, RouteClaim};
use crate::store::{Fence, Session, bucket_of};

use super::wind_down::{Row, Stamp, covers, judged};

const SHAPE: &str = "{namespace, id, env?, to: clientId, deadline?}";

#[derive(Deserialize)]
struct Body {
    namespace: String,
    id: String,
    env: Option<String>,
    /// The successor's client id.
    to: String,
    /// Seconds until the fence falls (at least one lease); absent or `null`: one lease.
    deadline: Option<f64>,
}

/// `act` names `{ns}/{id}` for the log line of a refusal; a move done is one line at `info`.
pub async fn move_instance(
    core: &Core,
    req: &mut Request<'_>,
    credential: &Credential,
    act: &mut Act,
) -> Handled {
    let body: Body = read_json(req, BODY_LIMIT, SHAPE).await?;
    act.about = Some(format!("{}/{}", body.namespace, body.id));
    if body.deadline.is_some_and(|d| !d.is_finite() || d < 0.0) {
        return Ok(answers::bad_request(&format!("expected {SHAPE}")));
    }
    let (ns, id) = (body.namespace.as_str(), body.id.as_str());
    let (env, claim) = judged(core, credential, ns, Some(id), body.env.as_deref())?;

    let row = core
        .store
        .row(&env, ns, id)
        .await?
        .and_then(|r| Row::of(id, r));
    let hostname = row.as_ref().and_then(|r| r.hostname.as_deref());
    let successor = successor(core, claim, &body.to, ns, &env, hostname).await?;
    let to = successor.as_ref().map(|s| s.session_id.as_str());
    let deadline = body.deadline.unwrap_or(0.0).to_string();
    let fence = Fence {
        deadline: &deadline,
        successor: to.unwrap_or_default(),
        by: credential.sub.as_deref().unwrap_or_default(),
    };
    let mut stamp = Stamp::new(core, &env, ns, fence, true);
    if let Some(row) = &row {
        stamp.learn_owner(&row.session_id).await?;
        if !covers(claim, stamp.owner(&row.session_id), hostname, ns) {
            return Ok(answers::forbidden());
        }
        let bucket = bucket_of(id, core.shared.config.shards);
        stamp.rows(bucket, slice::from_ref(row)).await?;
    }
    let queued = stamp.stamped > 0;
    info!(
        sub = %credential.sub.as_deref().unwrap_or_default(),
        namespace = %ns,
        id = %id,
        env = %env,
        to = %body.to,
        successor = to.map(tracing::field::display),
        deadline = %deadline,
        queued,
        "operator move"
    );
    Ok(Response::json_value(
        StatusCode::OK,
        &serde_json::json!({ "queued": queued, "to": to }),
    ))
}

/// The live session of client `client_id` a move of an id of (env, `ns`) can go to: it serves
/// them (on `hostname`, when the row names one), `claim` covers it, and it is neither draining
/// nor degraded. `None` for an unknown client or one that is not such a session.
async fn successor(
    core: &Core,
    claim: &RouteClaim,
    client_id: &str,
    ns: &str,
    env: &str,
    hostname: Option<&str>,
) -> Result<Option<Session>, Error> {
    let store = &core.store;
    let Some(client) = store.client(client_id).await? else {
        return Ok(None);
    };
    let Some(session) = store.session(&client.session_id).await? else {
        return Ok(None);
    };
    let serves = session.namespaces.iter().any(|n| n == ns)
        && session.env_of(ns) == env
        && hostname.is_none_or(|h| session.hostname.as_deref() == Some(h));
    let usable = session.expiry > now_ms() && !session.draining && session.degraded_since.is_none();
    if !(serves && usable && covers(claim, Some(&session), None, ns)) {
        return Ok(None);
    }
    let cordoned = !store.drains(slice::from_ref(&session)).await?.is_empty();
    Ok((!cordoned).then_some(session))
}
