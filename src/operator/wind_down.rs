//! `POST /registry/wind_down`: an operator fences placements — one id, or every id of an
//! (env, namespace) — at a deadline, and the owner hears it as a `wind_down` control message.
//! The fence lives on the row, so it survives the owner's death and reaches a replacement.

use std::collections::BTreeMap;

use http::StatusCode;
use serde::Deserialize;
use serde_json::Value;

use crate::answers::{self, BODY_LIMIT, Handled};
use crate::error::Error;
use crate::http::{Request, Response, read_json};
use crate::names::{valid_id, valid_namespace};
use crate::node::Core;
use crate::passport::{Credential, RouteClaim};
use crate::store::scripts::WIND_DOWN;
use crate::store::{PlacementRow, SINGLE_ENV, Session, bucket_of};

const SHAPE: &str = "{namespace, id?, deadline: seconds | null, env?}";

#[derive(Deserialize)]
struct Body {
    namespace: String,
    id: Option<String>,
    /// Seconds; `null` (or absent) clears the fence.
    deadline: Option<f64>,
    env: Option<String>,
}

/// A placement row as read before stamping.
struct Row {
    id: String,
    session_id: String,
    epoch: String,
    hostname: Option<String>,
}

pub async fn wind_down(core: &Core, req: &mut Request<'_>, credential: &Credential) -> Handled {
    let body: Body = read_json(req, BODY_LIMIT, SHAPE).await?;
    if body.deadline.is_some_and(|d| !d.is_finite() || d < 0.0) {
        return Ok(answers::bad_request(&format!("expected {SHAPE}")));
    }
    let ns = body.namespace.as_str();
    if !valid_namespace(ns) {
        return Ok(answers::bad_request("invalid namespace"));
    }
    if body.id.as_deref().is_some_and(|id| !valid_id(id)) {
        return Ok(answers::bad_request("invalid instance id"));
    }
    let env = match (core.shared.config.hostname_aware, &body.env) {
        (true, None) => {
            return Ok(answers::bad_request(
                "env is required in hostname-aware mode",
            ));
        }
        (false, Some(_)) => return Ok(answers::bad_request("env requires hostname-aware mode")),
        (true, Some(env)) => env.to_lowercase(),
        (false, None) => SINGLE_ENV.to_owned(),
    };
    let Ok(claim) = credential.route_claim() else {
        return Ok(answers::forbidden_because("forbidden"));
    };
    if !claim.allows_namespace(ns) {
        return Ok(answers::forbidden_because(&format!(
            "namespace not allowed: {ns}"
        )));
    }
    if core.shared.config.hostname_aware && !claim.allows_env(&env) {
        return Ok(answers::forbidden_because(&format!(
            "env not allowed: {env}"
        )));
    }

    // Read the rows, judge each on its owner (or, with the owner gone, on the row's hostname),
    // then stamp only those still as read.
    let rows = read_rows(core, &env, ns, body.id.as_deref()).await?;
    if body.id.is_some() && rows.is_empty() {
        return Ok(Response::json(StatusCode::OK, &br#"{"queued":false}"#[..]));
    }
    let mut owners: BTreeMap<String, Option<Session>> = BTreeMap::new();
    let mut in_scope = Vec::new();
    for row in rows {
        if !owners.contains_key(&row.session_id) {
            let owner = core.store.session(&row.session_id).await?;
            owners.insert(row.session_id.clone(), owner);
        }
        let owner = owners[&row.session_id].as_ref();
        if covers(claim, owner, &row, ns) {
            in_scope.push(row);
        } else if body.id.is_some() {
            return Ok(answers::forbidden_because("forbidden"));
        }
    }
    let deadline = body.deadline.map(|d| d.to_string()).unwrap_or_default();
    let store = &core.store;
    let mut by_bucket: BTreeMap<u32, Vec<&Row>> = BTreeMap::new();
    for row in &in_scope {
        by_bucket
            .entry(bucket_of(&row.id, core.shared.config.shards))
            .or_default()
            .push(row);
    }
    let mut messages: BTreeMap<String, Vec<(String, String, Option<u64>)>> = BTreeMap::new();
    for (bucket, rows) in by_bucket {
        let placements = store.keys.placements(bucket, &env, ns);
        let mut args: Vec<&[u8]> = vec![deadline.as_bytes(), store.lease().as_bytes()];
        for row in &rows {
            args.extend([
                row.id.as_bytes(),
                row.session_id.as_bytes(),
                row.epoch.as_bytes(),
            ]);
        }
        let stamped: Vec<(String, String, Value)> = store
            .run(&WIND_DOWN, &[placements.as_bytes()], &args)
            .await?;
        for (id, session, expiry) in stamped {
            // A fence whose owner is gone waits for the replacement owner.
            if owners.get(&session).is_some_and(Option::is_some) {
                messages
                    .entry(session)
                    .or_default()
                    .push((ns.to_owned(), id, expiry.as_u64()));
            }
        }
    }
    let mut queued = 0;
    for (session, list) in &messages {
        core.store.push_wind_downs(session, list).await?;
        queued += list.len();
    }
    let answer = match body.id {
        Some(_) => serde_json::json!({ "queued": queued > 0 }),
        None => serde_json::json!({ "queued": queued }),
    };
    Ok(Response::json_value(StatusCode::OK, &answer))
}

/// Whether the claim covers a row: by its owner's hostname and env for `ns`, or by the row's
/// hostname when the owner's record is gone.
fn covers(claim: &RouteClaim, owner: Option<&Session>, row: &Row, ns: &str) -> bool {
    match owner {
        Some(owner) => {
            owner
                .hostname
                .as_deref()
                .is_none_or(|h| claim.allows_hostname(h))
                && (owner.hostname.is_none() || claim.allows_env(owner.env_of(ns)))
        }
        None => row
            .hostname
            .as_deref()
            .is_none_or(|h| claim.allows_hostname(h)),
    }
}

impl Row {
    fn of(id: &str, row: PlacementRow) -> Option<Row> {
        Some(Row {
            id: id.to_owned(),
            epoch: row.epoch().to_owned(),
            session_id: row.session_id?,
            hostname: row.hostname,
        })
    }
}

/// The row of `id`, or every row of (env, ns) without one.
async fn read_rows(core: &Core, env: &str, ns: &str, id: Option<&str>) -> Result<Vec<Row>, Error> {
    let Some(id) = id else {
        let rows = core.store.rows(env, ns).await?;
        return Ok(rows
            .into_iter()
            .filter_map(|(id, row)| Row::of(&id, row))
            .collect());
    };
    let row = core.store.row(env, ns, id).await?;
    Ok(row.and_then(|row| Row::of(id, row)).into_iter().collect())
}
