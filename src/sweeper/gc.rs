//! The sweeper's GC (contract §6) of one (env, namespace), bucket by bucket, a page at a time
//! and paced: placement rows whose owner is gone or dead for more than a lease (unless the id
//! is scheduled or its wind-down fence holds), then overwritten markers whose id has no row. A page is judged here first (the bucket's liveness entries, read once per
//! bucket) so that only candidates reach `sweep_rows.lua`, which judges each again, atomically,
//! on the row as it is then.
//!
//! Once a pass, the same way over every bucket: the ownership ledger's `ledger:last` fields
//! whose entry the stream's cap trimmed (older than the stream's first entry), judged again by
//! `ledger_prune.lua`, so that the hash keeps pace with the stream.

use std::collections::HashMap;
use std::collections::hash_map::Entry;

use crate::clock::now_ms;
use crate::error::Error;
use crate::node::Core;
use crate::store::{SCRIPT_PAGE, Sweep, stream_id_order};

/// What a pass deleted.
#[derive(Default)]
pub(super) struct Swept {
    pub rows: u64,
    pub markers: u64,
    /// (env, namespace) pairs forgotten, empty and no longer served.
    pub namespaces: u64,
    /// `ledger:last` fields whose entry the stream's cap had trimmed.
    pub ledger: u64,
}

/// The GC of (env, ns), bucket by bucket, until `holds()` says the lease is lost.
pub(super) async fn run(
    core: &Core,
    holds: &dyn Fn() -> bool,
    env: &str,
    ns: &str,
    swept: &mut Swept,
) -> Result<(), Error> {
    let store = &core.store;
    // Each bucket's liveness entries (one per worker session), read when first needed.
    let mut alive: HashMap<u32, HashMap<String, u64>> = HashMap::new();
    let mut rows = store.row_pages(env, ns, None).paced();
    while holds() {
        let Some(page) = rows.next().await? else {
            break;
        };
        let live = match alive.entry(page.bucket) {
            Entry::Occupied(known) => known.into_mut(),
            Entry::Vacant(new) => new.insert(store.liveness(page.bucket).await?),
        };
        let now = now_ms();
        let lease = core.shared.config.lease_ttl_ms;
        // The node's clock only picks candidates; the script decides on Redis's.
        let candidates: Vec<&str> = page
            .entries
            .iter()
            .filter(|(_, row)| {
                let owner_live = row
                    .owner()
                    .and_then(|owner| live.get(owner))
                    .is_some_and(|expiry| expiry + lease >= now);
                let fence_holds = row.expiry.is_some_and(|expiry| expiry > now);
                !owner_live && !fence_holds
            })
            .map(|(id, _)| id.as_str())
            .collect();
        for ids in candidates.chunks(SCRIPT_PAGE) {
            swept.rows += store
                .sweep(page.bucket, env, ns, Sweep::DeadOwnerRows, ids)
                .await?;
        }
    }
    let mut markers = store.marker_pages(env, ns).paced();
    while holds() {
        let Some(page) = markers.next().await? else {
            break;
        };
        let ids: Vec<&str> = page.entries.iter().map(|(id, _)| id.as_str()).collect();
        for ids in ids.chunks(SCRIPT_PAGE) {
            swept.markers += store
                .sweep(page.bucket, env, ns, Sweep::MarkersWithoutRow, ids)
                .await?;
        }
    }
    Ok(())
}

/// The `ledger:last` fields of every bucket whose entry is older than its stream's first (or
/// whose stream is gone), until `holds()` says the lease is lost.
pub(super) async fn prune_ledger(
    core: &Core,
    holds: &dyn Fn() -> bool,
    swept: &mut Swept,
) -> Result<(), Error> {
    let store = &core.store;
    // Each bucket's first entry, read when first needed: `None` for a bucket without a stream.
    let mut first: HashMap<u32, Option<(u64, u64)>> = HashMap::new();
    let mut pages = store.ledger_last_pages().paced();
    while holds() {
        let Some(page) = pages.next().await? else {
            break;
        };
        let oldest = match first.entry(page.bucket) {
            Entry::Occupied(known) => *known.get(),
            Entry::Vacant(new) => {
                let at = store.ledger_first(page.bucket).await?;
                *new.insert(at.as_deref().and_then(stream_id_order))
            }
        };
        let trimmed: Vec<&str> = page
            .entries
            .iter()
            .filter(|(_, newest)| {
                let newest = std::str::from_utf8(newest).ok().and_then(stream_id_order);
                oldest.is_none_or(|oldest| newest.is_some_and(|newest| newest < oldest))
            })
            .map(|(field, _)| field.as_str())
            .collect();
        for fields in trimmed.chunks(SCRIPT_PAGE) {
            swept.ledger += store.prune_ledger_last(page.bucket, fields).await?;
        }
    }
    Ok(())
}
