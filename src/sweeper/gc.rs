//! One GC pass of the sweeper (contract §6), over every (env, namespace) the registry names,
//! bucket by bucket, a page at a time and paced: placement rows whose owner is gone or dead
//! (unless the id is scheduled or its wind-down fence holds), then overwritten markers whose
//! id has no row. A page is judged here first (the bucket's liveness entries, read once per
//! bucket) so that only candidates reach `sweep_rows.lua`, which judges each again, atomically,
//! on the row as it is then.

use std::collections::hash_map::Entry;
use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::Ordering;

use tracing::{info, warn};

use crate::clock::now_ms;
use crate::error::Error;
use crate::node::Core;
use crate::store::{SCRIPT_PAGE, Sweep};

/// What a pass deleted.
#[derive(Default)]
struct Swept {
    rows: u64,
    markers: u64,
}

/// Runs one pass; stops between two pages once `holds()` says the lease is lost. A pass that
/// fails (Redis away) is logged and counted like one that ran: the next starts on time.
pub(super) async fn pass(core: &Core, holds: &dyn Fn() -> bool) {
    let mut swept = Swept::default();
    let result = run(core, holds, &mut swept).await;
    let counters = &core.shared.sweeps;
    counters.passes.fetch_add(1, Ordering::Relaxed);
    counters.rows.fetch_add(swept.rows, Ordering::Relaxed);
    counters.markers.fetch_add(swept.markers, Ordering::Relaxed);
    if let Err(e) = result {
        warn!(error = %e, rows = swept.rows, markers = swept.markers, "sweep failed part way");
    } else if swept.rows + swept.markers > 0 {
        info!(rows = swept.rows, markers = swept.markers, "sweep");
    }
}

async fn run(core: &Core, holds: &dyn Fn() -> bool, swept: &mut Swept) -> Result<(), Error> {
    let store = &core.store;
    // Every (env, ns) a session record names, live or dead: a namespace's rows are swept as
    // long as the registry remembers one of its workers (a lease past its death).
    let pairs: BTreeSet<(String, String)> = store
        .sessions()
        .await?
        .iter()
        .flat_map(|s| {
            s.namespaces
                .iter()
                .map(|ns| (s.env_of(ns).to_owned(), ns.clone()))
        })
        .collect();
    // Each bucket's liveness entries (one per worker session), read when first needed.
    let mut alive: HashMap<u32, HashMap<String, u64>> = HashMap::new();
    for (env, ns) in &pairs {
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
            // The node's clock only picks candidates; the script decides on Redis's.
            let candidates: Vec<&str> = page
                .entries
                .iter()
                .filter(|(_, row)| {
                    let owner_live = row
                        .owner()
                        .and_then(|owner| live.get(owner))
                        .is_some_and(|expiry| *expiry > now);
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
    }
    Ok(())
}
