//! `POST /registry/wind_down`: an operator fences placements — one id, or every id of an
//! (env, namespace) — at a deadline, and the owner hears it as a `wind_down` control message.
//! The fence lives on the row, so it survives the owner's death and reaches a replacement.
//!
//! Without an id the (env, namespace) is walked a page at a time (`HSCAN … COUNT 250` per
//! bucket, [`crate::store::Store::row_pages`]): each page's rows in scope are stamped by
//! `wind_down.lua` calls that get 100 of their ids each, and their owners' messages queued,
//! before the next page is read. No Redis call touches more than a page, whatever the
//! namespace's size.

use std::collections::{BTreeMap, HashSet};

use http::StatusCode;
use serde::Deserialize;
use tracing::info;

use crate::answers::{self, Act, BODY_LIMIT, Handled};
use crate::error::Error;
use crate::http::{Request, Response, read_json};
use crate::names::{valid_id, valid_namespace};
use crate::node::Core;
use crate::passport::{Credential, RouteClaim};
use crate::store::{
    Fence, PlacementRow, SCRIPT_PAGE, SINGLE_ENV, Session, Stamped, WindDown, bucket_of,
};

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
pub(super) struct Row {
    id: String,
    pub session_id: String,
    epoch: String,
    pub hostname: Option<String>,
}

/// `act` names `{ns}` or `{ns}/{id}` for the log line of a refusal; a wind-down done is one
/// line at `info`.
pub async fn wind_down(
    core: &Core,
    req: &mut Request<'_>,
    credential: &Credential,
    act: &mut Act,
) -> Handled {
    let body: Body = read_json(req, BODY_LIMIT, SHAPE).await?;
    act.about = Some(match &body.id {
        Some(id) => format!("{}/{id}", body.namespace),
        None => body.namespace.clone(),
    });
    if body.deadline.is_some_and(|d| !d.is_finite() || d < 0.0) {
        return Ok(answers::bad_request(&format!("expected {SHAPE}")));
    }
    let ns = body.namespace.as_str();
    let (env, claim) = match judged(
        core,
        credential,
        ns,
        body.id.as_deref(),
        body.env.as_deref(),
    ) {
        Ok(judged) => judged,
        Err(refusal) => return Ok(refusal),
    };

    // Read the rows a page at a time, judge each on its owner (or, with the owner gone, on the
    // row's hostname), then stamp those of the page still as read, and tell their owners.
    let deadline = body.deadline.map(|d| d.to_string()).unwrap_or_default();
    let fence = Fence {
        deadline: &deadline,
        successor: "",
        by: credential.sub.as_deref().unwrap_or_default(),
    };
    let mut stamp = Stamp::new(core, &env, ns, fence, false);
    let answer = match body.id.as_deref() {
        Some(id) => match core
            .store
            .row(&env, ns, id)
            .await?
            .and_then(|r| Row::of(id, r))
        {
            None => serde_json::json!({ "queued": false }),
            Some(row) => {
                stamp.learn_owner(&row.session_id).await?;
                if !covers(
                    claim,
                    stamp.owner(&row.session_id),
                    row.hostname.as_deref(),
                    ns,
                ) {
                    return Ok(answers::forbidden_because("forbidden"));
                }
                stamp
                    .rows(bucket_of(id, core.shared.config.shards), &[row])
                    .await?;
                serde_json::json!({ "queued": stamp.queued > 0 })
            }
        },
        None => {
            let mut pages = core.store.row_pages(&env, ns, None);
            // HSCAN may hand out an id twice (in two pages of its bucket): each is stamped
            // and queued once. The ids seen so far, of the bucket being walked.
            let mut seen: (u32, HashSet<String>) = (0, HashSet::new());
            while let Some(page) = pages.next().await? {
                if page.bucket != seen.0 {
                    seen = (page.bucket, HashSet::new());
                }
                let mut in_scope = Vec::new();
                for (id, row) in page.entries {
                    if seen.1.contains(&id) {
                        continue;
                    }
                    let Some(row) = Row::of(&id, row) else {
                        continue;
                    };
                    seen.1.insert(id);
                    stamp.learn_owner(&row.session_id).await?;
                    if covers(
                        claim,
                        stamp.owner(&row.session_id),
                        row.hostname.as_deref(),
                        ns,
                    ) {
                        in_scope.push(row);
                    }
                }
                stamp.rows(page.bucket, &in_scope).await?;
            }
            serde_json::json!({ "queued": stamp.queued })
        }
    };
    info!(
        sub = %credential.sub.as_deref().unwrap_or_default(),
        namespace = %ns,
        id = body.id.as_deref().map(tracing::field::display),
        env = %env,
        deadline = %if deadline.is_empty() { "null" } else { &deadline },
        queued = %answer["queued"],
        "operator wind_down"
    );
    Ok(Response::json_value(StatusCode::OK, &answer))
}

/// The env an operator act on (env, namespace) names: the one asked for in hostname-aware mode
/// (lowercased), else the single mode's; or the 400 when the ask does not fit the mode.
/// What an operator act on one (env, `ns`) or one id of it is judged on, in order: the names
/// valid (400), the env as the mode wants it (400), the credential's claim covering both (403).
/// The env and the claim, or the refusal to answer.
pub(super) fn judged<'c>(
    core: &Core,
    credential: &'c Credential,
    ns: &str,
    id: Option<&str>,
    env: Option<&str>,
) -> Result<(String, &'c RouteClaim), Response> {
    if !valid_namespace(ns) {
        return Err(answers::bad_request("invalid namespace"));
    }
    if id.is_some_and(|id| !valid_id(id)) {
        return Err(answers::bad_request("invalid instance id"));
    }
    let hostname_aware = core.shared.config.hostname_aware;
    let env = env_asked(hostname_aware, env)?;
    let claim = claim_over(credential, hostname_aware, ns, &env)?;
    Ok((env, claim))
}

pub(super) fn env_asked(hostname_aware: bool, env: Option<&str>) -> Result<String, Response> {
    match (hostname_aware, env) {
        (true, None) => Err(answers::bad_request(
            "env is required in hostname-aware mode",
        )),
        (false, Some(_)) => Err(answers::bad_request("env requires hostname-aware mode")),
        (true, Some(env)) => Ok(env.to_lowercase()),
        (false, None) => Ok(SINGLE_ENV.to_owned()),
    }
}

/// The credential's claim when it covers `ns` (and, in hostname-aware mode, `env`), or the 403
/// naming what it does not cover.
pub(super) fn claim_over<'c>(
    credential: &'c Credential,
    hostname_aware: bool,
    ns: &str,
    env: &str,
) -> Result<&'c RouteClaim, Response> {
    let Ok(claim) = credential.route_claim() else {
        return Err(answers::forbidden_because("forbidden"));
    };
    if !claim.allows_namespace(ns) {
        return Err(answers::forbidden_because(&format!(
            "namespace not allowed: {ns}"
        )));
    }
    if hostname_aware && !claim.allows_env(env) {
        return Err(answers::forbidden_because(&format!(
            "env not allowed: {env}"
        )));
    }
    Ok(claim)
}

/// A wind-down (or a move) under way: the owners met so far, the rows stamped and the
/// messages queued.
pub(super) struct Stamp<'a> {
    core: &'a Core,
    env: &'a str,
    ns: &'a str,
    fence: Fence<'a>,
    /// A move's: its messages say `"moved": true`.
    moved: bool,
    /// Each owner's record, read once (`None`: gone).
    owners: BTreeMap<String, Option<Session>>,
    pub stamped: usize,
    pub queued: usize,
}

impl<'a> Stamp<'a> {
    /// `moved`: a move's fence (whether or not it names a successor).
    pub fn new(
        core: &'a Core,
        env: &'a str,
        ns: &'a str,
        fence: Fence<'a>,
        moved: bool,
    ) -> Stamp<'a> {
        Stamp {
            core,
            env,
            ns,
            fence,
            moved,
            owners: BTreeMap::new(),
            stamped: 0,
            queued: 0,
        }
    }

    pub async fn learn_owner(&mut self, session_id: &str) -> Result<(), Error> {
        if !self.owners.contains_key(session_id) {
            let owner = self.core.store.session(session_id).await?;
            self.owners.insert(session_id.to_owned(), owner);
        }
        Ok(())
    }

    pub fn owner(&self, session_id: &str) -> Option<&Session> {
        self.owners.get(session_id).and_then(Option::as_ref)
    }

    /// Stamps `rows` (all in `bucket`) that are still as read, [`SCRIPT_PAGE`] ids per script
    /// call, and queues a message to each stamped row's owner (`"moved": true` for a move's).
    pub async fn rows(&mut self, bucket: u32, rows: &[Row]) -> Result<(), Error> {
        let store = &self.core.store;
        for batch in rows.chunks(SCRIPT_PAGE) {
            let read: Vec<(&str, &str, &str)> = batch
                .iter()
                .map(|row| (row.id.as_str(), row.session_id.as_str(), row.epoch.as_str()))
                .collect();
            let stamped = store
                .wind_down(bucket, self.env, self.ns, &self.fence, &read)
                .await?;
            self.stamped += stamped.len();
            let mut messages: BTreeMap<&str, Vec<WindDown>> = BTreeMap::new();
            for Stamped(id, session, expiry) in &stamped {
                // A fence whose owner is gone waits for the replacement owner.
                if self.owner(session).is_some() {
                    messages
                        .entry(session)
                        .or_default()
                        .push(WindDown::new(self.ns, id, *expiry).moved(self.moved));
                }
            }
            for (session, list) in &messages {
                store.push_wind_downs(session, list).await?;
                self.queued += list.len();
            }
        }
        Ok(())
    }
}

/// Whether the claim covers a row: by its owner's hostname and env for `ns`, or by the row's
/// `hostname` when the owner's record is gone.
pub(super) fn covers(
    claim: &RouteClaim,
    owner: Option<&Session>,
    hostname: Option<&str>,
    ns: &str,
) -> bool {
    match owner {
        Some(owner) => {
            owner
                .hostname
                .as_deref()
                .is_none_or(|h| claim.allows_hostname(h))
                && (owner.hostname.is_none() || claim.allows_env(owner.env_of(ns)))
        }
        None => hostname.is_none_or(|h| claim.allows_hostname(h)),
    }
}

impl Row {
    pub fn of(id: &str, row: PlacementRow) -> Option<Row> {
        Some(Row {
            id: id.to_owned(),
            epoch: row.epoch().to_owned(),
            session_id: row.session_id?,
            hostname: row.hostname,
        })
    }
}
