//! `GET /registry/history?ns=&id=[&env=][&since=ms][&limit=][&cursor=]`: one instance's
//! ownership ledger, newest first, a page at a time. A page is one `history.lua` call in the
//! id's bucket that follows the chain of the id's entries from its newest (or from the
//! `cursor`, the next entry's stream ID): at most `limit` exact lookups, never a scan of the
//! bucket's stream. `since` stops the walk after the first entry at or before it, the one in
//! force then, so "who owned X at T" is one page: `?since=T`, whose last entry (when `next` is
//! null) is the one that held at T.
//!
//! Scoped like the wind-down: the credential's namespace claim, and in hostname-aware mode its
//! env claim; a credential limited to some hostnames sees the history of an id whose row names
//! one of them.

use std::borrow::Cow;

use http::StatusCode;
use serde_json::json;

use crate::answers::{self, Handled};
use crate::http::{Request, Response};
use crate::names::{valid_id, valid_namespace};
use crate::node::Core;
use crate::passport::Credential;
use crate::store::{HistoryAsk, HistoryPage, is_stream_id};

use super::paging::page_limit;
use super::views::decode;
use super::wind_down::{claim_over, env_asked};

/// The query's values, percent-decoded.
#[derive(Default)]
struct Query<'q> {
    ns: Option<Cow<'q, str>>,
    id: Option<Cow<'q, str>>,
    env: Option<Cow<'q, str>>,
    since: Option<Cow<'q, str>>,
    limit: Option<Cow<'q, str>>,
    cursor: Option<Cow<'q, str>>,
}

impl<'q> Query<'q> {
    fn parse(query: &'q str) -> Query<'q> {
        let mut q = Query::default();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let slot = match k {
                "ns" => &mut q.ns,
                "id" => &mut q.id,
                "env" => &mut q.env,
                "since" => &mut q.since,
                "limit" => &mut q.limit,
                "cursor" => &mut q.cursor,
                _ => continue,
            };
            *slot = Some(decode(v));
        }
        q
    }
}

pub async fn history(core: &Core, req: &Request<'_>, credential: &Credential) -> Handled {
    let query = Query::parse(req.head.uri.query().unwrap_or(""));
    let Some(ns) = query.ns.as_deref().filter(|ns| valid_namespace(ns)) else {
        return Ok(answers::bad_request("invalid namespace"));
    };
    let Some(id) = query.id.as_deref().filter(|id| valid_id(id)) else {
        return Ok(answers::bad_request("invalid instance id"));
    };
    let hostname_aware = core.shared.config.hostname_aware;
    let env = match env_asked(hostname_aware, query.env.as_deref()) {
        Ok(env) => env,
        Err(refusal) => return Ok(refusal),
    };
    let since = match query.since.as_deref() {
        None => None,
        Some(text) => match text.parse::<u64>() {
            Ok(ms) if text.bytes().all(|b| b.is_ascii_digit()) => Some(ms),
            _ => return Ok(answers::bad_request("invalid since: expected a time in ms")),
        },
    };
    let limit = match page_limit(query.limit.as_deref()) {
        Ok(limit) => limit,
        Err(why) => return Ok(answers::bad_request(why)),
    };
    let cursor = query.cursor.as_deref();
    if cursor.is_some_and(|c| !is_stream_id(c)) {
        return Ok(answers::bad_request("invalid cursor"));
    }
    let claim = match claim_over(credential, hostname_aware, ns, &env) {
        Ok(claim) => claim,
        Err(refusal) => return Ok(refusal),
    };
    if hostname_aware && !claim.unrestricted_hostnames() {
        let row = core.store.row(&env, ns, id).await?;
        let hostname = row.and_then(|row| row.hostname);
        if !hostname.is_some_and(|h| claim.allows_hostname(&h)) {
            return Ok(answers::forbidden());
        }
    }
    let ask = HistoryAsk {
        env: &env,
        ns,
        id,
        cursor,
        limit,
        since,
    };
    Ok(match core.store.history(&ask).await? {
        HistoryPage::ForeignCursor => answers::bad_request("invalid cursor"),
        HistoryPage::Entries {
            entries,
            next,
            truncated,
        } => Response::json_value(
            StatusCode::OK,
            &json!({ "entries": entries, "next": next, "truncated": truncated }),
        ),
    })
}
