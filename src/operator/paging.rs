//! `GET /registry/overview` a page at a time (`limit`, `cursor`) or for one id (`id`), for a
//! registry of a million placements: one call reads about `limit` rows from Redis, whatever
//! the registry's size, and answers the `cursor` of the next page (`next`).
//!
//! A walk goes over the (env, namespace) pairs the credential sees, in order, each bucket
//! after bucket, each bucket by `HSCAN`. The cursor names where it stands — the pair, the
//! bucket and the bucket's `HSCAN` cursor — encoded (base64url) so that clients treat it as
//! opaque. A call spends a budget of `limit` rows: a step of a bucket costs what it visited
//! (the `COUNT` it asked for, or the rows it got when more) and a bucket's last step what it
//! got (at least one), so a filter that keeps few rows (`prefix`, `tag`) does not make a call
//! walk further than an unfiltered one. A page may thus hold fewer entries than `limit`, even
//! none, while `next` is not null; every row present for the whole walk comes in exactly one
//! page (Redis's `HSCAN` guarantee; a row can come twice only while its hash is resized).

use std::collections::{BTreeMap, BTreeSet, HashSet};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde_json::{Value, json};

use http::StatusCode;

use crate::answers::Handled;
use crate::error::Error;
use crate::http::Response;
use crate::names::{valid_id, valid_namespace};
use crate::store::{PlacementRow, Session, Store};

use super::listing::{Keep, Owners};

/// The most rows one page may ask for.
pub const MAX_LIMIT: usize = 1000;
/// A page's size when only `cursor` is given.
pub const DEFAULT_LIMIT: usize = 100;

/// Where a walk stands: at `hscan` of `bucket`, in the placements of (env, ns).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cursor {
    pub env: String,
    pub ns: String,
    pub bucket: u32,
    pub hscan: String,
}

impl Cursor {
    /// The cursor as the answer's `next` spells it.
    pub fn encode(&self) -> String {
        let text = format!("{}:{}:{}:{}", self.bucket, self.hscan, self.ns, self.env);
        URL_SAFE_NO_PAD.encode(text)
    }

    /// A cursor [`Cursor::encode`] made for a registry of `shards` buckets; `None` for
    /// anything else.
    pub fn decode(text: &str, shards: u32) -> Option<Cursor> {
        let bytes = URL_SAFE_NO_PAD.decode(text).ok()?;
        let text = String::from_utf8(bytes).ok()?;
        let mut parts = text.splitn(4, ':');
        let bucket: u32 = parts.next()?.parse().ok()?;
        let hscan = parts.next()?;
        let ns = parts.next()?;
        let env = parts.next()?;
        let digits = !hscan.is_empty() && hscan.bytes().all(|b| b.is_ascii_digit());
        (bucket < shards && digits && hscan.parse::<u64>().is_ok() && valid_namespace(ns))
            .then(|| Cursor {
                env: env.to_owned(),
                ns: ns.to_owned(),
                bucket,
                hscan: hscan.to_owned(),
            })
            .filter(|c| !c.env.is_empty())
    }

    fn start(env: &str, ns: &str) -> Cursor {
        Cursor {
            env: env.to_owned(),
            ns: ns.to_owned(),
            bucket: 0,
            hscan: "0".to_owned(),
        }
    }
}

/// A page's `limit` (percent-decoded): [`DEFAULT_LIMIT`] when absent, or the 400's message.
pub fn page_limit(limit: Option<&str>) -> Result<usize, &'static str> {
    match limit {
        None => Ok(DEFAULT_LIMIT),
        Some(text) => text
            .parse()
            .ok()
            .filter(|n| (1..=MAX_LIMIT).contains(n))
            .ok_or("invalid limit: expected a whole number from 1 to 1000"),
    }
}

/// What a paged or exact overview asks for.
#[derive(Debug, PartialEq, Eq)]
pub enum Ask {
    /// A page of at most about `limit` rows read, from `cursor` (the start without one).
    Page {
        limit: usize,
        cursor: Option<Cursor>,
    },
    /// The row of this id, in the filter's namespace.
    Id(String),
}

impl Ask {
    /// The ask of a query's `limit`, `cursor` and `id` values (percent-decoded) with its `ns`
    /// filter, `None` when none is given (the whole listing), or the 400's message.
    pub fn parse(
        limit: Option<&str>,
        cursor: Option<&str>,
        id: Option<&str>,
        ns: Option<&str>,
        shards: u32,
    ) -> Result<Option<Ask>, &'static str> {
        if let Some(id) = id {
            if limit.is_some() || cursor.is_some() {
                return Err("id excludes limit and cursor");
            }
            if ns.is_none() {
                return Err("id requires ns");
            }
            if !valid_id(id) {
                return Err("invalid instance id");
            }
            return Ok(Some(Ask::Id(id.to_owned())));
        }
        if limit.is_none() && cursor.is_none() {
            return Ok(None);
        }
        let limit = page_limit(limit)?;
        let cursor = match cursor {
            None => None,
            Some(text) => {
                let cursor = Cursor::decode(text, shards).ok_or("invalid cursor")?;
                if ns.is_some_and(|ns| ns != cursor.ns) {
                    return Err("invalid cursor");
                }
                Some(cursor)
            }
        };
        Ok(Some(Ask::Page { limit, cursor }))
    }
}

/// Which rows an answer keeps: the listing's rule ([`Keep::owner`]) over the live sessions.
pub struct Kept<'a>(&'a Keep<'a>, &'a Owners<'a>);

impl Kept<'_> {
    /// The row as listed when it is kept: without its owner when that is gone (a paused row).
    fn listed(&self, id: &str, mut row: PlacementRow) -> Option<PlacementRow> {
        if self.0.owner(id, &row, self.1)?.is_none() {
            row.session_id = None;
        }
        Some(row)
    }
}

/// The rows one call found, by (env, ns): (id, row), each id once.
pub type Found = BTreeMap<(String, String), Vec<(String, PlacementRow)>>;

/// One page of the walk over `pairs` ((env, ns), sorted) from `cursor`: the rows `keep`
/// keeps, and where the next page starts (`None` at the end).
pub async fn page(
    store: &Store,
    pairs: &[(String, String)],
    limit: usize,
    cursor: Option<&Cursor>,
    keep: &Kept<'_>,
) -> Result<(Found, Option<Cursor>), Error> {
    let shards = store.keys.shards();
    let mut found = Found::new();
    let mut budget = limit;
    // The first pair at or after the cursor's; at its place when it is the cursor's.
    let from = cursor.map_or(0, |c| {
        pairs.partition_point(|(env, ns)| (env.as_str(), ns.as_str()) < (&c.env, &c.ns))
    });
    for (env, ns) in &pairs[from..] {
        let mut at = match cursor {
            Some(c) if (&c.env, &c.ns) == (env, ns) => c.clone(),
            _ => Cursor::start(env, ns),
        };
        let mut seen: HashSet<String> = HashSet::new();
        let rows = found.entry((env.clone(), ns.clone())).or_default();
        while at.bucket < shards {
            if budget == 0 {
                return Ok((found, Some(at)));
            }
            let count = budget.min(crate::store::PAGE);
            let (next, step) = store
                .placement_step(at.bucket, env, ns, &at.hscan, keep.0.prefix, count)
                .await?;
            let got = step.len();
            for (id, row) in step {
                if let Some(row) = keep.listed(&id, row)
                    && seen.insert(id.clone())
                {
                    rows.push((id, row));
                }
            }
            let spent = if next == "0" {
                at.bucket += 1;
                at.hscan = "0".to_owned();
                got.max(1)
            } else {
                at.hscan = next;
                got.max(count)
            };
            budget = budget.saturating_sub(spent);
        }
    }
    Ok((found, None))
}

/// The row of `id` in each of `pairs`, where `keep` keeps it: one `HGET` each, no scan.
pub async fn exact(
    store: &Store,
    pairs: &[(String, String)],
    id: &str,
    keep: &Kept<'_>,
) -> Result<Found, Error> {
    let mut found = Found::new();
    for (env, ns) in pairs {
        let rows = found.entry((env.clone(), ns.clone())).or_default();
        if let Some(row) = store.row(env, ns, id).await?
            && let Some(row) = keep.listed(id, row)
        {
            rows.push((id.to_owned(), row));
        }
    }
    Ok(found)
}

/// The overview's groups: (hostname, env, namespace) → the sessions serving it.
pub type Groups = BTreeMap<(Option<String>, String, String), Vec<String>>;

/// A paged or exact overview, once the groups the credential sees are known.
pub struct Page<'a> {
    pub ask: &'a Ask,
    pub prefix: Option<&'a str>,
    pub tag: Option<&'a str>,
    /// Every live session (a row's owner must be one).
    pub live: &'a [Session],
    pub groups: &'a Groups,
    pub now: u64,
}

impl Page<'_> {
    /// The answer: the overview's shape, each group's `entries` those of this page (with
    /// their `epoch`), sorted by id, and `next`.
    pub async fn answer(&self, store: &Store, bindings: Value, workers: Vec<Value>) -> Handled {
        let owners = Owners::new(self.live.iter().map(|s| s.session_id.as_str()));
        let keep = Keep {
            now: self.now,
            prefix: self.prefix,
            tag: self.tag,
        };
        let keep = Kept(&keep, &owners);
        let pairs: Vec<(String, String)> = (self.groups.keys())
            .map(|(_, env, ns)| (env.clone(), ns.clone()))
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let (found, next) = match self.ask {
            Ask::Page { limit, cursor } => {
                page(store, &pairs, *limit, cursor.as_ref(), &keep).await?
            }
            Ask::Id(id) => (exact(store, &pairs, id, &keep).await?, None),
        };
        let namespaces: Vec<Value> = (self.groups.iter())
            .map(|((hostname, env, ns), session_ids)| {
                let mut rows: Vec<&(String, PlacementRow)> = (found
                    .get(&(env.clone(), ns.clone())))
                .into_iter()
                .flatten()
                .filter(|(_, row)| {
                    // A paused row with no live owner and no hostname under every hostname.
                    let everywhere = row.session_id.is_none() && row.hostname.is_none();
                    hostname.is_none() || everywhere || row.hostname == *hostname
                })
                .collect();
                rows.sort_by(|a, b| a.0.cmp(&b.0));
                let entries: Vec<Value> = rows.iter().map(|(id, row)| entry(id, row)).collect();
                json!({
                    "entries": entries,
                    "env": env,
                    "hostname": hostname,
                    "namespace": ns,
                    "sessionIds": session_ids,
                })
            })
            .collect();
        let body = json!({
            "bindings": bindings,
            "namespaces": namespaces,
            "next": next.map(|c| c.encode()),
            "workers": workers,
        });
        Ok(Response::json_value(StatusCode::OK, &body))
    }
}

/// An entry as a paged or exact overview lists it: `{epoch?, expiry?, id, paused?, sessionId,
/// tag?}` (`sessionId` null for a paused row without a live owner).
pub fn entry(id: &str, row: &PlacementRow) -> Value {
    let mut entry = json!({ "id": id, "sessionId": row.owner() });
    if let Some(paused) = &row.paused {
        entry["paused"] = json!(paused);
    }
    if let Some(epoch) = &row.epoch {
        entry["epoch"] = epoch.as_str().into();
    }
    if let Some(expiry) = row.expiry {
        entry["expiry"] = expiry.into();
    }
    if let Some(tag) = &row.tag {
        entry["tag"] = tag.as_str().into();
    }
    entry
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_reads_back_as_written() {
        let cursor = Cursor {
            env: "prod|eu".into(),
            ns: "/threads".into(),
            bucket: 7,
            hscan: "123456".into(),
        };
        assert_eq!(Cursor::decode(&cursor.encode(), 16), Some(cursor.clone()));
        assert_eq!(Cursor::decode(&cursor.encode(), 7), None, "bucket 7 of 7");
        for bad in [
            "",
            "!!",
            "bm90IGEgY3Vyc29y",
            &URL_SAFE_NO_PAD.encode("1:x:/a:e"),
        ] {
            assert_eq!(Cursor::decode(bad, 16), None, "{bad}");
        }
        for bad in [
            "1:2:threads:e",
            "1:2:/a:",
            "x:2:/a:e",
            "1::/a:e",
            "1:-2:/a:e",
        ] {
            assert_eq!(
                Cursor::decode(&URL_SAFE_NO_PAD.encode(bad), 16),
                None,
                "{bad}"
            );
        }
    }

    #[test]
    fn asks_and_their_refusals() {
        let parse = |limit, cursor, id, ns| Ask::parse(limit, cursor, id, ns, 16);
        assert_eq!(parse(None, None, None, None), Ok(None));
        assert_eq!(
            parse(Some("10"), None, None, None),
            Ok(Some(Ask::Page {
                limit: 10,
                cursor: None
            }))
        );
        let cursor = Cursor::start("default", "/a").encode();
        assert_eq!(
            parse(None, Some(&cursor), None, Some("/a")),
            Ok(Some(Ask::Page {
                limit: DEFAULT_LIMIT,
                cursor: Some(Cursor::start("default", "/a"))
            }))
        );
        assert_eq!(
            parse(None, Some(&cursor), None, Some("/b")),
            Err("invalid cursor")
        );
        for limit in ["0", "1001", "-1", "x", "", "1.5"] {
            assert!(parse(Some(limit), None, None, None).is_err(), "{limit}");
        }
        assert_eq!(
            parse(None, None, Some("abc"), Some("/a")),
            Ok(Some(Ask::Id("abc".into())))
        );
        assert_eq!(parse(None, None, Some("abc"), None), Err("id requires ns"));
        assert_eq!(
            parse(None, None, Some("a b"), Some("/a")),
            Err("invalid instance id")
        );
        assert_eq!(
            parse(Some("5"), None, Some("abc"), Some("/a")),
            Err("id excludes limit and cursor")
        );
    }
}
