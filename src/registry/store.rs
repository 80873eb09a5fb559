//! Running the registry's Lua scripts: JSON answers parsed into typed values, and the fan-out
//! of a worker's copy to every placement bucket.

use std::collections::BTreeMap;

use futures_util::future::join_all;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};

use super::session::Session;
use crate::error::{Error, Origin};
use crate::node::Core;
use crate::redis::{BUCKET_WORKER, Reply, SESSION_DROP, Script};

/// Runs `script` with one key and parses its JSON answer.
pub async fn run<T: DeserializeOwned>(
    core: &Core,
    script: &Script,
    key: &str,
    args: &[&[u8]],
) -> Result<T, Error> {
    let reply = core.redis.evalsha(script, &[key.as_bytes()], args).await?;
    let text = reply.as_bytes().ok_or_else(|| {
        Error::new(
            Origin::Internal,
            format!("{} answered {reply:?}", script.name),
        )
    })?;
    serde_json::from_slice(text)
        .map_err(|e| Error::because(Origin::Internal, format!("{} answer", script.name), e))
}

/// Runs `script` with one key for its integer answer.
pub async fn run_int(
    core: &Core,
    script: &Script,
    key: &str,
    args: &[&[u8]],
) -> Result<i64, Error> {
    match core.redis.evalsha(script, &[key.as_bytes()], args).await? {
        Reply::Int(n) => Ok(n),
        other => Err(Error::new(
            Origin::Internal,
            format!("{} answered {other:?}", script.name),
        )),
    }
}

/// The session's master record, if the registry has one (live or not).
pub async fn load_session(core: &Core, session_id: &str) -> Result<Option<Session>, Error> {
    let key = format!("{}sessions", core.keys.registry());
    let reply = core
        .redis
        .cmd(&[b"HGET", key.as_bytes(), session_id.as_bytes()])
        .await?;
    match reply.as_bytes() {
        None => Ok(None),
        Some(raw) => serde_json::from_slice(raw)
            .map(Some)
            .map_err(|e| Error::because(Origin::Internal, "stored session", e)),
    }
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BucketOutcome {
    #[serde(deserialize_with = "lua_list")]
    pub duplicates: Vec<(String, String)>,
    /// (ns, id, wind-down expiry ms) of reclaimed rows under a wind-down.
    #[serde(deserialize_with = "lua_list")]
    pub wind_downs: Vec<(String, String, u64)>,
}

/// What a registration asks of every bucket besides writing the worker's copy.
pub struct Reclaim<'a> {
    pub replaces: Option<&'a str>,
    pub prev_session: Option<&'a str>,
    /// Ids held per namespace.
    pub instances: &'a BTreeMap<String, Vec<String>>,
}

/// Writes the session's copy into every bucket, all buckets in flight at once. With `reclaim`
/// (a registration) it also prunes, drops the replaced session's copy and reclaims held ids;
/// without (a heartbeat) it only renews copies that still exist.
pub async fn put_everywhere(
    core: &Core,
    session: &Session,
    operator_draining: bool,
    reclaim: Option<&Reclaim<'_>>,
) -> Result<BucketOutcome, Error> {
    let record = session.bucket_record(operator_draining);
    let lease = core.shared.config.lease_ttl_ms.to_string();
    let shards = core.keys.shards();
    let mut held: Vec<Vec<(&str, &str, &str)>> = vec![Vec::new(); shards as usize];
    if let Some(r) = reclaim {
        for (ns, ids) in r.instances {
            for id in ids {
                let bucket = crate::redis::bucket_of(id, shards);
                held[bucket as usize].push((session.env_of(ns), ns, id));
            }
        }
    }
    let held: Vec<String> = held
        .iter()
        .map(|h| serde_json::to_string(h).expect("held ids serialize"))
        .collect();
    // A registration writes the copy; a heartbeat only renews one that is still there.
    let (op, prune, replaces, prev) = match reclaim {
        Some(r) => (
            "put",
            "prune",
            r.replaces.unwrap_or(""),
            r.prev_session.unwrap_or(""),
        ),
        None => ("renew", "", "", ""),
    };
    let calls = (0..shards).map(|b| {
        let args: [&[u8]; 8] = [
            op.as_bytes(),
            session.session_id.as_bytes(),
            record.as_bytes(),
            lease.as_bytes(),
            prune.as_bytes(),
            replaces.as_bytes(),
            prev.as_bytes(),
            held[b as usize].as_bytes(),
        ];
        async move { run::<BucketOutcome>(core, &BUCKET_WORKER, core.keys.bucket(b), &args).await }
    });
    let mut total = BucketOutcome::default();
    for outcome in join_all(calls).await {
        let outcome = outcome?;
        total.duplicates.extend(outcome.duplicates);
        total.wind_downs.extend(outcome.wind_downs);
    }
    Ok(total)
}

/// Drops a session everywhere: its registry record, then its copy in every bucket. With
/// `live`, a session whose lease ran out counts as unknown (and its record stays). False when
/// the registry had no such (live) record.
pub async fn drop_session(core: &Core, session_id: &str, live: bool) -> Result<bool, Error> {
    #[derive(Deserialize)]
    struct Dropped {
        #[serde(default)]
        unknown: bool,
    }
    let live: &[u8] = if live { b"live" } else { b"" };
    let dropped: Dropped = run(
        core,
        &SESSION_DROP,
        core.keys.registry(),
        &[session_id.as_bytes(), live],
    )
    .await?;
    // Copies go even when the registry had no (live) record: dropping is idempotent, and a
    // copy written by a request that raced the record's removal must not outlive it.
    drop_everywhere(core, session_id).await?;
    Ok(!dropped.unknown)
}

/// Removes the session's copy from every bucket.
async fn drop_everywhere(core: &Core, session_id: &str) -> Result<(), Error> {
    let lease = core.shared.config.lease_ttl_ms.to_string();
    let calls = (0..core.keys.shards()).map(|b| {
        let args: [&[u8]; 8] = [
            b"drop",
            session_id.as_bytes(),
            b"",
            lease.as_bytes(),
            b"",
            b"",
            b"",
            b"[]",
        ];
        async move { run::<BucketOutcome>(core, &BUCKET_WORKER, core.keys.bucket(b), &args).await }
    });
    for outcome in join_all(calls).await {
        outcome?;
    }
    Ok(())
}

/// Lua's cjson cannot tell an empty array from an empty object and writes `{}` for both, so a
/// list read back from a script may arrive as `{}`.
pub fn lua_list<'de, D, T>(de: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum ListOrEmpty<T> {
        List(Vec<T>),
        Empty(BTreeMap<String, serde::de::IgnoredAny>),
    }
    match ListOrEmpty::deserialize(de)? {
        ListOrEmpty::List(items) => Ok(items),
        ListOrEmpty::Empty(map) if map.is_empty() => Ok(Vec::new()),
        ListOrEmpty::Empty(_) => Err(serde::de::Error::custom("expected a list")),
    }
}

/// Scripts answer `false` for "none" (Lua has no null inside tables).
pub fn lua_option<'de, D, T>(de: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum FalseOr<T> {
        False(bool),
        Some(T),
    }
    match Option::<FalseOr<T>>::deserialize(de)? {
        None | Some(FalseOr::False(false)) => Ok(None),
        Some(FalseOr::Some(v)) => Ok(Some(v)),
        Some(FalseOr::False(true)) => Err(serde::de::Error::custom("expected false or a value")),
    }
}
