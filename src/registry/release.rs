//! `POST /registry/release` (compare-and-delete), `POST /registry/tag` (compare-and-set of the
//! owner tag) and `POST /registry/schedule` (compare-and-set of the id's wake, contract §7):
//! each acts on a row only while it still belongs to the quoted session and epoch, so a stale
//! worker can never free, label or schedule a row re-placed elsewhere.

use std::collections::BTreeMap;

use http::StatusCode;
use pinboard_protocol::registry::{
    ReleaseAnswer, ReleaseRow, ScheduleAnswer, ScheduleRow, TagAnswer, TagRequest,
};

use super::{claim_of, owned_session};
use crate::answers::{self, BODY_LIMIT, Handled};
use crate::http::{Request, Response, read_json};
use crate::names::valid_namespace;
use crate::node::Core;
use crate::passport::Credential;
use crate::store::scripts::{SCHEDULE, TAG};
use crate::store::{KeyName, Release, SCRIPT_PAGE, Session, Store, bucket_of};

const RELEASE_SHAPE: &str = "[{sessionId, namespace, id, epoch?: digits | ''}] (non-empty)";
const TAG_SHAPE: &str = "{sessionId, namespace, id, epoch: digits, tag: 1-256 chars}";
const SCHEDULE_SHAPE: &str =
    "[{sessionId, namespace, id, epoch: digits, wakeAt: ms | null}] (non-empty)";

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
    let quoted = rows.iter().map(|r| (&r.session_id, &r.namespace));
    let sessions = checked_sessions(core, credential, quoted).await?;
    let store = &core.store;
    // One script call per bucket (and per SCRIPT_PAGE rows).
    let mut by_bucket: BTreeMap<u32, Vec<Release<'_>>> = BTreeMap::new();
    for row in &rows {
        by_bucket
            .entry(bucket_of(&row.id, store.keys.shards()))
            .or_default()
            .push(Release {
                env: sessions[row.session_id.as_str()].env_of(&row.namespace),
                ns: &row.namespace,
                id: &row.id,
                session_id: &row.session_id,
                epoch: row.epoch.as_deref().unwrap_or(""),
            });
    }
    let mut released = 0;
    for (bucket, rows) in &by_bucket {
        released += store.release(*bucket, rows).await?;
    }
    Ok(Response::json_value(
        StatusCode::OK,
        &ReleaseAnswer { released },
    ))
}

/// `POST /registry/schedule`: writes (or with `wakeAt: null` removes) each id's entry on its
/// (env, ns)'s wake schedule while its row is still the quoted session's at the quoted epoch.
pub async fn schedule(core: &Core, req: &mut Request<'_>, credential: &Credential) -> Handled {
    let rows: Vec<ScheduleRow> = read_json(req, BODY_LIMIT, SCHEDULE_SHAPE).await?;
    if rows.is_empty() || !rows.iter().all(|r| digits(&r.epoch)) {
        return Ok(answers::bad_request(&format!("expected {SCHEDULE_SHAPE}")));
    }
    let quoted = rows.iter().map(|r| (&r.session_id, &r.namespace));
    let sessions = checked_sessions(core, credential, quoted).await?;
    let store = &core.store;
    let wake_at: Vec<String> = rows
        .iter()
        .map(|r| r.wake_at.map(|ms| ms.to_string()).unwrap_or_default())
        .collect();
    let mut batches = Batches::default();
    for (row, wake_at) in rows.iter().zip(&wake_at) {
        let env = sessions[row.session_id.as_str()].env_of(&row.namespace);
        let bucket = bucket_of(&row.id, store.keys.shards());
        let keys = [
            store.keys.placements(bucket, env, &row.namespace),
            store.keys.wake(bucket, env, &row.namespace),
        ];
        batches.add(bucket, keys, (row, wake_at));
    }
    let scheduled = batches
        .run(store, &SCHEDULE, |index, (row, wake_at)| {
            [
                index,
                row.id.as_bytes(),
                row.session_id.as_bytes(),
                row.epoch.as_bytes(),
                wake_at.as_bytes(),
            ]
        })
        .await?;
    Ok(Response::json_value(
        StatusCode::OK,
        &ScheduleAnswer { scheduled },
    ))
}

/// A request's rows by bucket, for one script call per bucket (per [`SCRIPT_PAGE`] rows):
/// each bucket's keys declared once, each row with the (1-based) index of its first key.
struct Batches<R> {
    by_bucket: BTreeMap<u32, Batch<R>>,
}

/// One bucket's keys, and its rows with the index of their first key.
type Batch<R> = (Vec<KeyName>, Vec<(String, R)>);

impl<R> Default for Batches<R> {
    fn default() -> Self {
        Batches {
            by_bucket: BTreeMap::new(),
        }
    }
}

impl<R> Batches<R> {
    /// `row` in `bucket`, with its keys (consecutive in KEYS, declared once per bucket).
    fn add<const N: usize>(&mut self, bucket: u32, keys: [KeyName; N], row: R) {
        let (declared, rows) = self.by_bucket.entry(bucket).or_default();
        let index = match declared.iter().position(|k| *k == keys[0]) {
            Some(i) => i,
            None => {
                declared.extend(keys);
                declared.len() - N
            }
        };
        // Lua's KEYS are 1-based.
        rows.push(((index + 1).to_string(), row));
    }

    /// Runs `script` over every batch, each row's ARGV group from `args`: the sum of what
    /// the calls answer (never negative).
    async fn run<'a, const N: usize>(
        &'a self,
        store: &Store,
        script: &crate::redis::Script,
        args: impl Fn(&'a [u8], &'a R) -> [&'a [u8]; N],
    ) -> Handled<u64> {
        let mut total = 0;
        for (declared, rows) in self.by_bucket.values() {
            let keys: Vec<&[u8]> = declared.iter().map(|k| k.as_bytes()).collect();
            for page in rows.chunks(SCRIPT_PAGE) {
                let argv: Vec<&[u8]> = page
                    .iter()
                    .flat_map(|(index, row)| args(index.as_bytes(), row))
                    .collect();
                total += store.run_int(script, &keys, &argv).await?;
            }
        }
        Ok(total.try_into().unwrap_or(0))
    }
}

/// Every row's session, checked before anything is written (a refused request changes
/// nothing): each session read once, each row inside the claim and the session's namespaces.
/// The expiry is not checked: a worker whose lease just ran out may still give back (or
/// label, or schedule) what it held.
async fn checked_sessions<'r>(
    core: &Core,
    credential: &Credential,
    rows: impl Iterator<Item = (&'r String, &'r String)>,
) -> Handled<BTreeMap<&'r str, Session>> {
    let mut sessions: BTreeMap<&str, Session> = BTreeMap::new();
    for (session_id, namespace) in rows {
        if !sessions.contains_key(session_id.as_str()) {
            let session = owned_session(core, credential, session_id, false).await?;
            sessions.insert(session_id, session);
        }
        check_row(credential, &sessions[session_id.as_str()], namespace)?;
    }
    Ok(sessions)
}

pub async fn tag(core: &Core, req: &mut Request<'_>, credential: &Credential) -> Handled {
    let body: TagRequest = read_json(req, BODY_LIMIT, TAG_SHAPE).await?;
    let tag_len = body.tag.chars().count();
    if !body.row.epoch.as_deref().is_some_and(digits) || !(1..=256).contains(&tag_len) {
        return Ok(answers::bad_request(&format!("expected {TAG_SHAPE}")));
    }
    let row = &body.row;
    let sessions = checked_sessions(
        core,
        credential,
        [(&row.session_id, &row.namespace)].into_iter(),
    )
    .await?;
    let session = &sessions[row.session_id.as_str()];
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

/// The row-level rules once its session is known: inside the claim, a registered namespace.
fn check_row(credential: &Credential, session: &Session, namespace: &str) -> Handled<()> {
    if !valid_namespace(namespace) {
        return Err(answers::bad_request("invalid namespace").into());
    }
    if !claim_of(credential)?.allows_namespace(namespace) {
        return Err(
            answers::forbidden_because(&format!("namespace not allowed: {namespace}")).into(),
        );
    }
    if !session.namespaces.iter().any(|ns| ns == namespace) {
        return Err(answers::bad_request(&format!("namespace not registered: {namespace}")).into());
    }
    Ok(())
}
