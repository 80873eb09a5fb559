//! The operator's read views of the fleet: `GET /registry/workers` (the live worker records),
//! `GET /registry/overview` (workers, bindings and live placements, filterable) and
//! `GET /registry/stats` (each live worker's own `/_pinned/stats`, attested). All show only
//! what the credential's claims cover.
//!
//! The overview reads placements a page at a time (`HSCAN … COUNT 250`, `listing.rs`) and
//! writes its body by hand, yielding to the core's other requests every page of entries: a
//! listing of a million placements holds Redis for a page at a time, and the core's other
//! requests wait for a page's work, not the listing's (but for the copy of the finished body
//! onto the connection).

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::collections::btree_map::Entry;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::StreamExt;
use http::{Method, StatusCode};
use serde_json::{Map, Value, json};
use tracing::warn;

use pinboard_protocol::header;

use crate::answers::{self, Handled};
use crate::attestation::{Claims, Purpose, Signer};
use crate::clock::now_ms;
use crate::error::Error;
use crate::http::tls::ClientTls;
use crate::http::{Request, Response, WorkerAddr, fetch};
use crate::node::Core;
use crate::passport::{Credential, RouteClaim};
use crate::store::{Drain, Session, Takeover};

use super::listing::{Body, Keep, Listing, Owners};
use super::paging::{Ask, Groups, Page};

const STATS_TIMEOUT: Duration = Duration::from_secs(3);
const STATS_CONCURRENCY: usize = 8;
/// The largest `/_pinned/stats` answer read (`docs/api.md`): what a worker holding a million
/// instances answers. `pinned` lists every held id (`"id",`: the id's length plus 3 bytes) and
/// some 300 bytes besides, so 64 MiB holds a million ids of up to 64 characters (a UUID is 36).
/// A larger answer is `unreachable`, and the log says why.
const STATS_MAX_BODY: usize = 64 * 1024 * 1024;

/// Every live session the registry has.
async fn live_sessions(core: &Core) -> Result<Vec<Session>, Error> {
    let now = now_ms();
    let mut sessions = core.store.sessions().await?;
    sessions.retain(|s| s.expiry > now);
    Ok(sessions)
}

/// The sessions the claim covers, their namespaces (and envs) cut down to the covered ones,
/// sorted by hostname, then session.
fn visible(sessions: &[Session], claim: &RouteClaim) -> Vec<Session> {
    let mut shown: Vec<Session> = sessions
        .iter()
        .filter(|s| {
            s.hostname
                .as_deref()
                .is_none_or(|h| claim.allows_hostname(h))
        })
        .filter_map(|s| {
            let mut session = s.clone();
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
            (!session.namespaces.is_empty()).then_some(session)
        })
        .collect();
    shown.sort_by(|a, b| (&a.hostname, &a.session_id).cmp(&(&b.hostname, &b.session_id)));
    shown
}

async fn visible_sessions(core: &Core, claim: &RouteClaim) -> Result<Vec<Session>, Error> {
    Ok(visible(&live_sessions(core).await?, claim))
}

fn claim(credential: &Credential) -> Option<&RouteClaim> {
    credential.route_claim().ok()
}

/// The headroom each session has now: its last heartbeat's value minus the placements made
/// since. Each new placement takes one unit from the session's copy in the placement's
/// bucket, and every heartbeat resets all copies, so the placements since the heartbeat are
/// the sum over buckets of what each copy lost. (A resolve sees only its own bucket's copy:
/// the choice between workers in one bucket is exact, across buckets it lags by at most what
/// the other buckets placed since the heartbeat.)
async fn current_headroom(core: &Core, sessions: &mut [Session]) -> Result<(), Error> {
    if sessions.is_empty() {
        return Ok(());
    }
    let ids: Vec<&str> = sessions.iter().map(|s| s.session_id.as_str()).collect();
    let mut taken = vec![0.0; sessions.len()];
    for copies in core.store.copies(&ids).await? {
        for ((session, taken), copy) in sessions.iter().zip(&mut taken).zip(copies) {
            if let Some(copy) = copy.filter(|c| !c.dropped) {
                *taken += (session.headroom - copy.headroom).max(0.0);
            }
        }
    }
    for (session, taken) in sessions.iter_mut().zip(taken) {
        session.headroom -= taken;
    }
    Ok(())
}

/// A worker as the read views list it: the record without secret and account; in
/// hostname-aware mode `envs` names every namespace's env (`envs[ns]`, else `env`, which
/// defaults to the hostname), and `takeover` is the effective one (`wind_down` unless given).
/// `draining` is the worker's own flag or an operator drain of its client (`drains`), and a
/// timed drain shows as `drain: {deadline}` (epoch ms, like `expiry`). Apart, for the console:
/// `workerDraining` (the worker's own flag), `operatorDrain` (`null`, or `{deadline}` with
/// `deadline: null` for a cordon) and `inflight` (forwards in flight from this node to it).
fn worker_entry(s: &Session, drains: &BTreeMap<String, Drain>, inflight: u64) -> Value {
    let drain = drains.get(&s.client_id);
    let envs: BTreeMap<&str, &str> = match s.hostname {
        Some(_) => s
            .namespaces
            .iter()
            .map(|ns| (ns.as_str(), s.env_of(ns)))
            .collect(),
        None => BTreeMap::new(),
    };
    let mut entry = json!({
        "sessionId": s.session_id,
        "clientId": s.client_id,
        "advertiseUrl": s.advertise_url,
        "namespaces": s.namespaces,
        "hostname": s.hostname,
        "envs": envs,
        "takeover": s.takeover.unwrap_or(Takeover::WindDown).as_str(),
        "headroom": s.headroom,
        "draining": s.draining || drain.is_some(),
        "workerDraining": s.draining,
        "operatorDrain": drain.map(|d| json!({ "deadline": d.deadline })),
        "inflight": inflight,
        "expiry": s.expiry,
    });
    if let Some(since) = s.degraded_since {
        entry["degradedSince"] = since.into();
    }
    if let Some(deadline) = drain.and_then(|d| d.deadline) {
        entry["drain"] = json!({ "deadline": deadline });
    }
    entry
}

/// The read views' `workers` list.
async fn worker_entries(core: &Core, shown: &[Session]) -> Result<Vec<Value>, Error> {
    let drains = core.store.drains(shown).await?;
    let gauges = &core.shared.workers;
    Ok(shown
        .iter()
        .map(|s| worker_entry(s, &drains, gauges.inflight(&s.session_id)))
        .collect())
}

pub async fn workers(core: &Core, credential: &Credential) -> Handled {
    let Some(claim) = claim(credential) else {
        return Ok(answers::forbidden());
    };
    let mut shown = visible_sessions(core, claim).await?;
    current_headroom(core, &mut shown).await?;
    let workers = worker_entries(core, &shown).await?;
    Ok(Response::json_value(
        StatusCode::OK,
        &json!({ "workers": workers }),
    ))
}

/// `GET /registry/overview` filters: `ns`, `prefix`, `tag` (ANDed), percent-decoded; and
/// `limit`, `cursor` or `id`: a page, or one id, instead of the whole listing (`paging.rs`).
pub struct OverviewFilter<'q> {
    pub ns: Option<Cow<'q, str>>,
    pub prefix: Option<Cow<'q, str>>,
    pub tag: Option<Cow<'q, str>>,
    pub ask: Option<Ask>,
}

/// A query value with `%XX` escapes (and `+` for space) decoded; an invalid escape stays as
/// written.
pub(super) fn decode(value: &str) -> Cow<'_, str> {
    if !value.contains(['%', '+']) {
        return Cow::Borrowed(value);
    }
    let bytes = value.as_bytes();
    let hex = |b: u8| (b as char).to_digit(16);
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                (Some(high), Some(low)) => {
                    out.push((high * 16 + low) as u8);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    Cow::Owned(String::from_utf8_lossy(&out).into_owned())
}

impl<'q> OverviewFilter<'q> {
    /// The filters of a query string for a registry of `shards` buckets, or the spec's 400
    /// (and ours, for a malformed `limit`, `cursor` or `id`).
    pub fn parse(query: Option<&'q str>, shards: u32) -> Result<OverviewFilter<'q>, Response> {
        let mut filter = OverviewFilter {
            ns: None,
            prefix: None,
            tag: None,
            ask: None,
        };
        let (mut limit, mut cursor, mut id) = (None, None, None);
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            match k {
                "ns" => filter.ns = Some(decode(v)),
                "prefix" => filter.prefix = Some(decode(v)),
                "tag" => filter.tag = Some(decode(v)),
                "limit" => limit = Some(decode(v)),
                "cursor" => cursor = Some(decode(v)),
                "id" => id = Some(decode(v)),
                _ => {}
            }
        }
        if filter
            .ns
            .as_deref()
            .is_some_and(|ns| !crate::names::valid_namespace(ns))
        {
            return Err(answers::bad_request("invalid namespace"));
        }
        if filter.tag.as_deref().is_some_and(|t| t.trim().is_empty()) {
            return Err(answers::bad_request("empty tag"));
        }
        filter.ask = Ask::parse(
            limit.as_deref(),
            cursor.as_deref(),
            id.as_deref(),
            filter.ns.as_deref(),
            shards,
        )
        .map_err(answers::bad_request)?;
        Ok(filter)
    }
}

pub async fn overview(core: &Core, req: &mut Request<'_>, credential: &Credential) -> Handled {
    let query = req.head.uri.query().map(str::to_owned);
    let filter = match OverviewFilter::parse(query.as_deref(), core.store.keys.shards()) {
        Ok(filter) => filter,
        Err(refusal) => return Ok(refusal),
    };
    let Some(claim) = claim(credential) else {
        return Ok(answers::forbidden());
    };
    let live = live_sessions(core).await?;
    let mut shown = visible(&live, claim);
    current_headroom(core, &mut shown).await?;

    // (hostname, env, namespace) → the sessions serving it.
    let mut groups = Groups::new();
    for s in &shown {
        for ns in s
            .namespaces
            .iter()
            .filter(|ns| filter.ns.as_deref().is_none_or(|f| f == ns.as_str()))
        {
            groups
                .entry((s.hostname.clone(), s.env_of(ns).to_owned(), ns.clone()))
                .or_default()
                .push(s.session_id.clone());
        }
    }
    let hostnames: Map<String, Value> = core
        .store
        .host_bindings()
        .await?
        .into_iter()
        .filter(|(key, b)| {
            let ns = key.find('/').map_or("", |i| &key[i..]);
            claim.allows_hostname(&key[..key.len() - ns.len()])
                && claim.allows_namespace(ns)
                && claim.allows_env(&b.env)
        })
        .map(|(key, b)| (key, b.env.into()))
        .collect();
    let envs: Map<String, Value> = core
        .store
        .env_bindings()
        .await?
        .into_iter()
        .filter(|(env, _)| claim.allows_env(env))
        .map(|(env, b)| (env, b.takeover.into()))
        .collect();
    let bindings = json!({ "hostnames": hostnames, "envs": envs });
    let workers = worker_entries(core, &shown).await?;
    let now = now_ms();
    if let Some(ask) = &filter.ask {
        let page = Page {
            ask,
            prefix: filter.prefix.as_deref(),
            tag: filter.tag.as_deref(),
            live: &live,
            groups: &groups,
            now,
        };
        return page.answer(&core.store, bindings, workers).await;
    }
    // Each (env, ns) is read once, a page at a time, whatever the hostnames sharing it.
    let owners = Owners::new(live.iter().map(|s| s.session_id.as_str()));
    let keep = Keep {
        now,
        prefix: filter.prefix.as_deref(),
        tag: filter.tag.as_deref(),
    };
    let mut rows_of: BTreeMap<(String, String), Listing> = BTreeMap::new();
    for (_, env, ns) in groups.keys() {
        if let Entry::Vacant(slot) = rows_of.entry((env.clone(), ns.clone())) {
            slot.insert(Listing::read(&core.store, env, ns, &owners, &keep).await?);
        }
    }

    // Everything is read: the body is written by hand, in the order (sorted keys) serde_json
    // writes an object: {"bindings", "namespaces": [{"entries", "env", "hostname",
    // "namespace", "sessionIds"}], "workers"}, and streamed as it is written (listing.rs).
    let size = 4096 + rows_of.values().map(Listing::size_hint).sum::<usize>();
    let mut out = Body::for_request(req, size);
    let body = &mut out.bytes;
    body.extend_from_slice(b"{\"bindings\":");
    body.extend(json_of(&bindings));
    body.extend_from_slice(b",\"namespaces\":[");
    for (n, ((hostname, env, ns), session_ids)) in groups.iter().enumerate() {
        if n > 0 {
            out.bytes.push(b',');
        }
        out.bytes.extend_from_slice(b"{\"entries\":[");
        rows_of[&(env.clone(), ns.clone())]
            .write(hostname.as_deref(), &owners, &mut out)
            .await;
        if out.gone() {
            break;
        }
        let body = &mut out.bytes;
        body.extend_from_slice(b"],\"env\":");
        body.extend(json_of(env));
        body.extend_from_slice(b",\"hostname\":");
        body.extend(json_of(hostname));
        body.extend_from_slice(b",\"namespace\":");
        body.extend(json_of(ns));
        body.extend_from_slice(b",\"sessionIds\":");
        body.extend(json_of(session_ids));
        body.push(b'}');
    }
    out.bytes.extend_from_slice(b"],\"workers\":");
    out.bytes.extend(json_of(&workers));
    out.bytes.push(b'}');
    Ok(out.finish().await)
}

fn json_of<T: serde::Serialize + ?Sized>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).expect("a listing serializes")
}

pub async fn stats(core: &Core, credential: &Credential) -> Handled {
    let Some(claim) = claim(credential) else {
        return Ok(answers::forbidden());
    };
    let sessions = visible_sessions(core, claim).await?;
    // A sliding window: at most 8 calls in flight, and each one that ends lets the next start
    // (one slow worker holds one slot, not a whole batch). Unordered, so that finished calls
    // behind a slow one free their slots; the listing's order is restored after.
    let tls = &core.shared.tls.workers;
    let calls = sessions
        .iter()
        .enumerate()
        .map(|(i, s)| async move { (i, worker_stats(s, tls).await) });
    let mut answered: Vec<(usize, Value)> = futures_util::stream::iter(calls)
        .buffer_unordered(STATS_CONCURRENCY)
        .collect()
        .await;
    answered.sort_by_key(|(i, _)| *i);
    let workers: Vec<Value> = answered.into_iter().map(|(_, w)| w).collect();
    Ok(Response::json_value(
        StatusCode::OK,
        &json!({ "workers": workers }),
    ))
}

/// One worker's `/_pinned/stats`, attested for its session, cut down to its visible
/// namespaces; `error: "unreachable"` when it does not answer with a JSON object of at most
/// [`STATS_MAX_BODY`] in time (an `https` worker whose certificate does not verify with `tls`
/// included), logged with the reason.
async fn worker_stats(session: &Session, tls: &ClientTls) -> Value {
    let mut entry = json!({
        "sessionId": session.session_id,
        "clientId": session.client_id,
        "hostname": session.hostname,
    });
    match fetch_stats(session, tls).await {
        Ok(mut stats) => {
            let visible = |ns: &str| session.namespaces.iter().any(|n| n == ns);
            if let Some(Value::Array(list)) = stats.get_mut("namespaces") {
                list.retain(|ns| ns.as_str().is_some_and(visible));
            }
            // The worker's count covers every namespace it serves: restated over the visible
            // ones, or dropped when the ids are not listed.
            let count: Option<usize> = match stats.get_mut("instances") {
                Some(Value::Object(instances)) => {
                    instances.retain(|ns, _| visible(ns));
                    instances
                        .values()
                        .map(|ids| ids.as_array().map(Vec::len))
                        .sum()
                }
                _ => None,
            };
            match count {
                Some(count) => stats.insert("instanceCount".into(), count.into()),
                None => stats.remove("instanceCount"),
            };
            entry["stats"] = Value::Object(stats);
        }
        Err(reason) => {
            warn!(session = %session.session_id, url = %session.advertise_url, %reason, "worker stats unreachable");
            entry["error"] = "unreachable".into();
        }
    }
    entry
}

async fn fetch_stats(session: &Session, tls: &ClientTls) -> Result<Map<String, Value>, String> {
    let addr = WorkerAddr::parse(&session.advertise_url)?;
    let iat = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_err(|e| e.to_string())?
        .as_secs();
    let mut token = Vec::new();
    let claims = Claims {
        aud: &session.session_id,
        iat,
        purpose: Purpose::Stats,
        instance: None,
        extra: None,
    };
    Signer::new(session.secret.as_bytes()).sign_into(&claims, &mut Vec::new(), &mut token);
    let token = String::from_utf8(token).map_err(|e| e.to_string())?;
    let name = header::ATTESTATION;
    let headers = [(name.as_str(), token.as_str())];
    let answer = fetch(
        &addr,
        tls,
        Method::GET,
        "/_pinned/stats",
        &headers,
        b"",
        STATS_TIMEOUT,
        STATS_MAX_BODY,
    )
    .await
    .map_err(|e| e.to_string())?;
    if !answer.status.is_success() {
        return Err(format!("answered {}", answer.status));
    }
    match serde_json::from_slice(&answer.body) {
        Ok(Value::Object(stats)) => Ok(stats),
        Ok(_) => Err("answered JSON that is not an object".into()),
        Err(e) => Err(format!("answered invalid JSON: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::decode;

    #[test]
    fn query_values_are_percent_decoded() {
        assert_eq!(decode("/threads"), "/threads");
        assert_eq!(decode("%2Fthreads"), "/threads");
        assert_eq!(decode("ws%3AW+x"), "ws:W x");
        assert_eq!(decode("100%"), "100%");
        assert_eq!(decode("%zz"), "%zz");
        assert_eq!(decode("a%2"), "a%2");
    }
}
