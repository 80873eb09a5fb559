//! `POST /registry/release` (compare-and-delete) and `POST /registry/tag` (compare-and-set of
//! the owner tag): both act on a row only while it still belongs to the quoted session and
//! epoch, so a stale worker can never free or label a row re-placed elsewhere.

use std::collections::BTreeMap;

use http::StatusCode;
use pinboard_protocol::registry::{ReleaseAnswer, ReleaseRow, TagAnswer, TagRequest};

use super::{claim_of, owned_session};
use crate::answers::{self, BODY_LIMIT, Handled};
use crate::http::{Request, Response, read_json};
use crate::names::valid_namespace;
use crate::node::Core;
use crate::passport::Credential;
use crate::store::scripts::{RELEASE, TAG};
use crate::store::{KeyName, Session, bucket_of};

const RELEASE_SHAPE: &str = "[{sessionId, namespace, id, epoch?: digits | ''}] (non-empty)";
const TAG_SHAPE: &str = "{sessionId, namespace, id, epoch: digits, tag: 1-256 chars}";

fn digits(epoch: &str) -> bool {
    !epoch.is_empty() && epoch.bytes().all(|b| b.is_ascii_digit())
}

/// What a release may quote: digits, or `''` (or nothing) for an epoch-less row.
fn release_epoch(epoch: &Option<String>) -> bool {
    epoch.as_deref().is_none_or(|e| e.is_empty() || digits(e))
}

pub async fn release(core: &Core, req: &mut Request<'_>, credential: &Credential) -> Handled {
    let rows: Vec<ReleaseRow> = read_json(req, BODY_LIMIT, RELEASE_SHAPE).await?;
    if rows.is_empty() || !rows.iter().all(|r| release_epoch(&r.epoch)) {
        return Ok(answers::bad_request(&format!("expected {RELEASE_SHAPE}")));
    }
    // Every row is checked before any is released: a refused request changes nothing.
    let mut sessions: BTreeMap<&str, Session> = BTreeMap::new();
    // Per bucket: the placements hashes its rows live in, and (key index, id, session, epoch).
    type Batch<'r> = (Vec<KeyName>, Vec<(String, &'r ReleaseRow)>);
    let mut by_bucket: BTreeMap<u32, Batch> = BTreeMap::new();
    for row in &rows {
        if !sessions.contains_key(row.session_id.as_str()) {
            let session = checked_session(core, credential, row).await?;
            sessions.insert(&row.session_id, session);
        } else {
            check_row(credential, &sessions[row.session_id.as_str()], row)?;
        }
    }
    let store = &core.store;
    for row in &rows {
        let env = sessions[row.session_id.as_str()].env_of(&row.namespace);
        let bucket = bucket_of(&row.id, store.keys.shards());
        let key = store.keys.placements(bucket, env, &row.namespace);
        let (keys, batch) = by_bucket.entry(bucket).or_default();
        let index = match keys.iter().position(|k| *k == key) {
            Some(i) => i,
            None => {
                keys.push(key);
                keys.len() - 1
            }
        };
        // Lua's KEYS are 1-based.
        batch.push(((index + 1).to_string(), row));
    }
    let mut released = 0;
    for (keys, batch) in by_bucket.values() {
        let keys: Vec<&[u8]> = keys.iter().map(|k| k.as_bytes()).collect();
        let mut args: Vec<&[u8]> = Vec::with_capacity(batch.len() * 4);
        for (index, row) in batch {
            args.extend([
                index.as_bytes(),
                row.id.as_bytes(),
                row.session_id.as_bytes(),
                row.epoch.as_deref().unwrap_or("").as_bytes(),
            ]);
        }
        released += store.run_int(&RELEASE, &keys, &args).await?;
    }
    Ok(Response::json_value(
        StatusCode::OK,
        // The script counts the rows it freed: never negative.
        &ReleaseAnswer {
            released: released.try_into().unwrap_or(0),
        },
    ))
}

pub async fn tag(core: &Core, req: &mut Request<'_>, credential: &Credential) -> Handled {
    let body: TagRequest = read_json(req, BODY_LIMIT, TAG_SHAPE).await?;
    let tag_len = body.tag.chars().count();
    if !body.row.epoch.as_deref().is_some_and(digits) || !(1..=256).contains(&tag_len) {
        return Ok(answers::bad_request(&format!("expected {TAG_SHAPE}")));
    }
    let row = &body.row;
    let session = checked_session(core, credential, row).await?;
    let store = &core.store;
    let placements = store.keys.placements(
        bucket_of(&row.id, store.keys.shards()),
        session.env_of(&row.namespace),
        &row.namespace,
    );
    let tagged = store
        .run_int(
            &TAG,
            &[placements.as_bytes()],
            &[
                row.id.as_bytes(),
                row.session_id.as_bytes(),
                row.epoch.as_deref().unwrap_or("").as_bytes(),
                body.tag.as_bytes(),
            ],
        )
        .await?;
    Ok(Response::json_value(
        StatusCode::OK,
        &TagAnswer {
            tagged: tagged == 1,
        },
    ))
}

/// The row's session, refused as the spec says. Release and tag skip the expiry check: a
/// worker whose lease just ran out may still give back what it held.
async fn checked_session(
    core: &Core,
    credential: &Credential,
    row: &ReleaseRow,
) -> Handled<Session> {
    let session = owned_session(core, credential, &row.session_id, false).await?;
    check_row(credential, &session, row)?;
    Ok(session)
}

/// The row-level rules once its session is known: inside the claim, a registered namespace.
fn check_row(credential: &Credential, session: &Session, row: &ReleaseRow) -> Handled<()> {
    if !valid_namespace(&row.namespace) {
        return Err(answers::bad_request("invalid namespace").into());
    }
    if !claim_of(credential)?.allows_namespace(&row.namespace) {
        return Err(answers::forbidden_because(&format!(
            "namespace not allowed: {}",
            row.namespace
        ))
        .into());
    }
    if !session.namespaces.contains(&row.namespace) {
        return Err(
            answers::bad_request(&format!("namespace not registered: {}", row.namespace)).into(),
        );
    }
    Ok(())
}
