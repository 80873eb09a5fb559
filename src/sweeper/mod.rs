//! The sweeper (contract §6): one node of the fleet at a time holds the sweeper lease
//! (one lease long, renewed every third of one, released on a graceful
//! stop) and, every `sweep_interval_ms`, runs a pass over every bucket a page at a time: the
//! GC ([`gc`]), then the durability sweep ([`wake`]), then the pruning of the ownership
//! ledger's index ([`gc::prune_ledger`]). A node that is not the serving fleet neither claims nor sweeps: it may disagree
//! with the fleet on what a bucket is.
//!
//! Run by one core per node, beside the fleet claim; the pass runs as its own task so that a
//! long pass never delays the lease's renewal, and stops between two pages once the lease is
//! lost.

mod gc;
mod wake;

use std::cell::Cell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;

use tracing::{debug, info, warn};

use crate::error::Error;
use crate::http::Shutdown;
use crate::node::Core;

/// Whether this node holds the lease, and until when it is sure to (the lease was set with a
/// TTL of one lease from before the claim was sent).
#[derive(Default)]
struct Holding {
    until: Cell<Option<Instant>>,
}

impl Holding {
    fn holds(&self) -> bool {
        self.until.get().is_some_and(|until| Instant::now() < until)
    }
}

/// Claims the sweeper lease and sweeps while holding it, until the core shuts down; then
/// gives the lease up, so another node takes the sweep over at its next claim rather than a
/// lease later. Awaited by the core before it exits.
pub async fn keep_sweeping(core: Rc<Core>, shutdown: Shutdown) {
    let config = &core.shared.config;
    let every = Duration::from_millis((config.lease_ttl_ms / 3).max(100));
    let lease = Duration::from_millis(config.lease_ttl_ms);
    let interval = Duration::from_millis(config.sweep_interval_ms);
    let holding = Rc::new(Holding::default());
    let running = Rc::new(Cell::new(false));
    let mut next_pass = Instant::now();
    let mut said_holding = false;
    while !shutdown.is_fired() {
        let sent = Instant::now();
        if core.shared.is_serving() {
            match core.store.claim_sweeper(&config.node_id).await {
                Ok(held) => holding.until.set(held.then_some(sent + lease)),
                // Unanswered, the lease lives on in Redis as long as it was set for: nobody
                // else can take it before then, and nothing is swept while Redis is away.
                Err(e) => warn!(error = %e, "sweeper lease claim failed"),
            }
        } else {
            holding.until.set(None);
        }
        let holds = holding.holds();
        if holds != said_holding {
            if holds {
                info!("sweeping: holding the sweeper lease");
            } else if core.shared.is_serving() {
                info!("not sweeping: another node holds the sweeper lease");
            } else {
                info!("not sweeping: this node is not serving");
            }
            said_holding = holds;
        }
        if holds && !running.get() && Instant::now() >= next_pass {
            next_pass = Instant::now() + interval;
            running.set(true);
            let (core, holding, running) = (core.clone(), holding.clone(), running.clone());
            monoio::spawn(async move {
                pass(&core, &|| holding.holds()).await;
                running.set(false);
            });
        }
        let wait = next_pass
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(10))
            .min(every);
        monoio::select! {
            _ = monoio::time::sleep(wait) => {}
            _ = shutdown.fired() => {}
        }
    }
    // A pass still running stops at its next page.
    if holding.until.take().is_some() {
        match core.store.release_sweeper(&config.node_id).await {
            Ok(_) => info!("sweeper lease released"),
            Err(e) => warn!(error = %e, "sweeper lease not released; it expires in a lease"),
        }
    }
}

/// One pass, over every (env, ns) a session record names, live or dead, and every pair a
/// registration ever named: a namespace's rows and wakes are swept after its last worker's
/// record is pruned too. Stops between two pages once `holds()` says the lease is lost; a
/// pass that fails part way (Redis away) is logged and counted like one that ran: the next
/// starts on time.
async fn pass(core: &Core, holds: &dyn Fn() -> bool) {
    let mut swept = gc::Swept::default();
    let mut wakes = wake::Wakes::default();
    let started = Instant::now();
    let result = walk(core, holds, &mut swept, &mut wakes).await;
    let ms = started.elapsed().as_millis() as u64;
    let counters = &core.shared.sweeps;
    counters.passes.fetch_add(1, Ordering::Relaxed);
    counters.rows.fetch_add(swept.rows, Ordering::Relaxed);
    counters.markers.fetch_add(swept.markers, Ordering::Relaxed);
    counters.woken.fetch_add(wakes.woken, Ordering::Relaxed);
    counters
        .wakes_pending
        .fetch_add(wakes.pending, Ordering::Relaxed);
    let (rows, markers, woken, pending) = (swept.rows, swept.markers, wakes.woken, wakes.pending);
    let (namespaces, ledger) = (swept.namespaces, swept.ledger);
    if let Err(e) = result {
        warn!(error = %e, rows, markers, namespaces, woken, pending, ledger, ms, "sweep failed part way");
    } else if rows + markers + namespaces + woken + pending + ledger > 0 {
        info!(
            rows,
            markers, namespaces, woken, pending, ledger, ms, "sweep"
        );
    } else {
        debug!(ms, "sweep: nothing to do");
    }
}

async fn walk(
    core: &Core,
    holds: &dyn Fn() -> bool,
    swept: &mut gc::Swept,
    wakes: &mut wake::Wakes,
) -> Result<(), Error> {
    let store = &core.store;
    // Read before the sessions: a registration after this read moves its pairs' counts (and
    // forgetting them fails), one before it is in the sessions read.
    let registered = store.registered_pairs().await?;
    let named: BTreeSet<(String, String)> = store
        .sessions()
        .await?
        .iter()
        .flat_map(|s| {
            s.namespaces
                .iter()
                .map(|ns| (s.env_of(ns).to_owned(), ns.clone()))
        })
        .collect();
    let mut pairs = named.clone();
    pairs.extend(registered.iter().map(|p| (p.env.clone(), p.ns.clone())));
    for (env, ns) in &pairs {
        gc::run(core, holds, env, ns, swept).await?;
    }
    for (env, ns) in &pairs {
        wake::run(core, holds, env, ns, wakes).await?;
    }
    gc::prune_ledger(core, holds, swept).await?;
    // A pair no record names any more, left with nothing: no worker can place in it (one
    // would register, and name it), so it is forgotten rather than walked forever.
    for pair in &registered {
        if !holds() || named.contains(&(pair.env.clone(), pair.ns.clone())) {
            continue;
        }
        if store.pair_is_empty(&pair.env, &pair.ns).await? && store.forget_pair(pair).await? {
            info!(env = %pair.env, ns = %pair.ns, "sweep: forgot a namespace no worker serves");
            swept.namespaces += 1;
        }
    }
    Ok(())
}
