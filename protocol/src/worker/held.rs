//! The instances a worker holds and at which epoch, and those it released or lost in the last
//! minute, in a map split into [`SHARDS`] shards, each under its own lock and picked by a hash
//! of `(ns, id)`.
//!
//! A worker can hold a million instances. One map under one lock would, each time it doubled,
//! rehash every key while every serving thread waited on that lock. Split, a shard grows
//! alone: it rehashes 1/64 of the keys while only that shard's lock is held, and two threads
//! rarely want the same shard. A capacity hint (a worker's `expected_instances`) sizes the
//! shards up front, so they do not grow at all until that many are held.
//!
//! What may be activated (the lease, stopping, superseded) is the shared state's, read through
//! the `gate` that [`HeldMap::admit`] calls *while it holds the key's shard*: see `state.rs`
//! for why that ordering keeps a stop or a supersession from missing a concurrent activation.
//! No method holds two shards at once; a whole-map read ([`HeldMap::held`]) visits the shards
//! one after another.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ahash::RandomState;

use super::epoch::Epoch;

/// Shards of the map: a power of two, many times the number of serving threads.
pub const SHARDS: usize = 64;
/// How long a released or evicted instance's epoch is remembered to refuse forwards still
/// carrying it. Pinboard re-resolves a resolution older than 5 s before forwarding, so a
/// stale forward arrives well within this.
pub const GONE_FOR: Duration = Duration::from_secs(60);

type Key = (String, String);

/// What admitting a forward to an instance decided.
#[derive(Debug, PartialEq, Eq)]
pub enum Admission {
    /// Serve it; `activated` when the worker did not hold the instance at this epoch before.
    Serve { activated: bool },
    /// The forward carries an older epoch than the worker holds or released: it was resolved
    /// to a placement that no longer exists.
    Stale,
    /// A new activation the worker must not take: its lease is not known to be live, it is
    /// stopping, or it was superseded.
    Refused,
}

/// What the worker's state allows at the moment of an admission.
#[derive(Clone, Copy, Debug)]
pub struct Gate {
    /// Nothing is served, held or not.
    pub superseded: bool,
    /// The lease is live. Past it the registry may have placed any held instance on another
    /// worker (it knows this one dead once its copy's expiry passes, and this worker's lease
    /// ends before that: it is counted from when the heartbeat was sent), so nothing is served,
    /// held or not: a worker paused past its lease must not serve the forwards that waited in
    /// its sockets while the instance moved on.
    pub lease: bool,
    /// New activations may be taken: the lease is live and the worker is not stopping.
    pub activations: bool,
}

#[cfg(test)]
impl Gate {
    /// Everything allowed, for tests.
    pub(crate) const OPEN: Gate = Gate {
        superseded: false,
        lease: true,
        activations: true,
    };
}

pub struct HeldMap {
    /// Picks a key's shard. Seeded apart from the shards' own maps, so that the keys of one
    /// shard do not share the low hash bits those maps place them by.
    router: RandomState,
    shards: Box<[Slot]>,
}

/// A shard on a cache line of its own (two: some CPUs fetch lines in pairs), so that two
/// threads locking neighbouring shards do not contend on the line.
#[repr(align(128))]
struct Slot(Mutex<Shard>);

struct Shard {
    held: HashMap<Key, Epoch, RandomState>,
    gone: HashMap<Key, (Epoch, Instant), RandomState>,
}

impl Shard {
    /// Forgets the released epochs old enough to refuse nothing any more.
    fn prune(&mut self, now: Instant) {
        self.gone
            .retain(|_, (_, at)| now.duration_since(*at) < GONE_FOR);
    }
}

impl HeldMap {
    /// A map whose shards hold `expected` instances between them before any grows; 0 starts
    /// them empty.
    pub fn new(expected: usize) -> HeldMap {
        // An eighth over the even share: hashing spreads keys over the shards only about
        // evenly, and one shard growing early would stall its share anyway.
        let per_shard = match expected.div_ceil(SHARDS) {
            0 => 0,
            even => even + even / 8,
        };
        let shards = (0..SHARDS)
            .map(|_| {
                Slot(Mutex::new(Shard {
                    held: HashMap::with_capacity_and_hasher(per_shard, RandomState::new()),
                    gone: HashMap::with_hasher(RandomState::new()),
                }))
            })
            .collect();
        HeldMap {
            router: RandomState::new(),
            shards,
        }
    }

    /// The shard `(ns, id)` lives in: the router hash's top bits.
    fn index(&self, ns: &str, id: &str) -> usize {
        // `(&str, &str)` hashes as the `(String, String)` key does; no key is built for it.
        let hash = self.router.hash_one((ns, id));
        (hash >> (u64::BITS - SHARDS.trailing_zeros())) as usize
    }

    fn shard(&self, ns: &str, id: &str) -> MutexGuard<'_, Shard> {
        lock(&self.shards[self.index(ns, id)])
    }

    /// Decides whether a forward to `(ns, id)` at `epoch` is served, and records the
    /// instance as held at that epoch when it is. `gate` is called with the key's shard
    /// locked, and only then.
    pub fn admit(
        &self,
        ns: &str,
        id: &str,
        epoch: &Epoch,
        now: Instant,
        gate: impl FnOnce() -> Gate,
    ) -> Admission {
        let mut shard = self.shard(ns, id);
        let gate = gate();
        if gate.superseded {
            return Admission::Refused;
        }
        let key = (ns.to_owned(), id.to_owned());
        match shard.held.get(&key) {
            Some(held) if epoch < held => return Admission::Stale,
            Some(held) if epoch == held && gate.lease => {
                return Admission::Serve { activated: false };
            }
            Some(held) if epoch == held => return Admission::Refused,
            _ => {}
        }
        if let Some((gone, at)) = shard.gone.get(&key)
            && now.duration_since(*at) < GONE_FOR
            && epoch <= gone
        {
            return Admission::Stale;
        }
        if !gate.activations {
            return Admission::Refused;
        }
        shard.gone.remove(&key);
        shard.held.insert(key, epoch.clone());
        Admission::Serve { activated: true }
    }

    pub fn epoch_of(&self, ns: &str, id: &str) -> Option<Epoch> {
        let key = (ns.to_owned(), id.to_owned());
        self.shard(ns, id).held.get(&key).cloned()
    }

    /// Stops holding `(ns, id)`, remembering its epoch for a while to refuse stale forwards.
    /// The epoch it was held at, if it was.
    pub fn forget(&self, ns: &str, id: &str, now: Instant) -> Option<Epoch> {
        let mut shard = self.shard(ns, id);
        shard.prune(now);
        let key = (ns.to_owned(), id.to_owned());
        let epoch = shard.held.remove(&key)?;
        shard.gone.insert(key, (epoch.clone(), now));
        Some(epoch)
    }

    /// Forgets every held instance, as [`forget`](HeldMap::forget) does one: what was held,
    /// sorted `(ns, id, epoch)`. An activation racing with it is either in the answer or
    /// admitted after it, under the gate its caller closed before calling this.
    pub fn forget_all(&self, now: Instant) -> Vec<(String, String, Epoch)> {
        let mut forgotten = Vec::new();
        for slot in &self.shards {
            let mut shard = lock(slot);
            shard.prune(now);
            let Shard { held, gone } = &mut *shard;
            gone.reserve(held.len());
            for ((ns, id), epoch) in held.drain() {
                forgotten.push((ns.clone(), id.clone(), epoch.clone()));
                gone.insert((ns, id), (epoch, now));
            }
        }
        sort(&mut forgotten);
        forgotten
    }

    /// Every held instance, sorted: `(ns, id, epoch)`. Read shard by shard: an instance
    /// admitted or forgotten meanwhile may or may not be in it.
    pub fn held(&self) -> Vec<(String, String, Epoch)> {
        let mut held = Vec::new();
        for slot in &self.shards {
            let shard = lock(slot);
            held.reserve(shard.held.len());
            held.extend(
                shard
                    .held
                    .iter()
                    .map(|((ns, id), epoch)| (ns.clone(), id.clone(), epoch.clone())),
            );
        }
        sort(&mut held);
        held
    }

    /// Held ids by namespace, the shape of `instances` in register and stats.
    pub fn instances(&self) -> BTreeMap<String, Vec<String>> {
        let mut by_ns: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (ns, id, _) in self.held() {
            by_ns.entry(ns).or_default().push(id);
        }
        by_ns
    }
}

fn lock(slot: &Slot) -> MutexGuard<'_, Shard> {
    // Nothing panics while holding a shard, but a poisoned one still holds consistent data:
    // every update is a single map operation.
    slot.0
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn sort(instances: &mut [(String, String, Epoch)]) {
    instances.sort_unstable_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::sync::Barrier;
    use std::thread;

    use super::*;

    const OPEN: Gate = Gate::OPEN;

    fn e(s: &str) -> Epoch {
        Epoch::parse(s.as_bytes()).unwrap()
    }

    #[test]
    fn admission_follows_epochs() {
        let now = Instant::now();
        let map = HeldMap::new(0);
        let admit = |epoch: &str, at: Instant| map.admit("/t", "a", &e(epoch), at, || OPEN);
        let activated = Admission::Serve { activated: true };
        let again = Admission::Serve { activated: false };
        assert_eq!(admit("5", now), activated);
        assert_eq!(admit("05", now), again);
        assert_eq!(admit("4", now), Admission::Stale);
        // Re-placed here at a higher epoch: a new activation.
        assert_eq!(admit("9", now), activated);
        assert_eq!(map.epoch_of("/t", "a"), Some(e("9")));

        assert_eq!(map.forget("/t", "a", now), Some(e("9")));
        assert_eq!(map.forget("/t", "a", now), None);
        assert_eq!(map.epoch_of("/t", "a"), None);
        assert_eq!(admit("9", now), Admission::Stale);
        assert_eq!(
            admit("9", now + GONE_FOR),
            activated,
            "the memory of a released epoch fades"
        );
        assert_eq!(map.forget("/t", "a", now), Some(e("9")));
        assert_eq!(admit("10", now), activated);
    }

    #[test]
    fn instances_group_by_namespace() {
        let now = Instant::now();
        let map = HeldMap::new(0);
        for (ns, id) in [("/docs", "z"), ("/threads", "b"), ("/threads", "a")] {
            map.admit(ns, id, &e("1"), now, || OPEN);
        }
        let instances = map.instances();
        assert_eq!(instances["/threads"], ["a", "b"]);
        assert_eq!(instances["/docs"], ["z"]);
    }

    #[test]
    fn the_gate_is_read_only_with_the_shard_locked() {
        let map = HeldMap::new(0);
        let now = Instant::now();
        let mut calls = 0;
        let admission = map.admit("/t", "a", &e("1"), now, || {
            calls += 1;
            assert!(map.shards[map.index("/t", "a")].0.try_lock().is_err());
            OPEN
        });
        assert_eq!(admission, Admission::Serve { activated: true });
        assert_eq!(calls, 1);
    }

    #[test]
    fn forgetting_everything_remembers_every_epoch() {
        let now = Instant::now();
        let map = HeldMap::new(1000);
        for i in 0..1000 {
            let (ns, id) = (format!("/n{}", i % 3), format!("i{i}"));
            map.admit(&ns, &id, &e("7"), now, || OPEN);
        }
        let held = map.held();
        assert_eq!(held.len(), 1000);
        assert!(
            held.windows(2)
                .all(|w| (&w[0].0, &w[0].1) < (&w[1].0, &w[1].1))
        );
        assert_eq!(map.instances()["/n1"].len(), 333);
        assert_eq!(map.forget_all(now), held);
        assert!(map.held().is_empty());
        for (ns, id, epoch) in &held {
            assert_eq!(
                map.admit(ns, id, epoch, now, || OPEN),
                Admission::Stale,
                "{ns}/{id}"
            );
        }
    }

    /// Two threads admit the same instances at the same epochs: each (instance, epoch) is
    /// activated exactly once, by one of them, and the other is told it is held.
    #[test]
    fn two_threads_activate_each_placement_once() {
        const N: usize = 20_000;
        let map = HeldMap::new(0);
        let now = Instant::now();
        let start = Barrier::new(2);
        let ids: Vec<String> = (0..N).map(|i| format!("i{i}")).collect();
        let run = |reverse: bool| {
            start.wait();
            let mut activated = Vec::new();
            for round in ["1", "2"] {
                let epoch = e(round);
                for k in 0..N {
                    let i = if reverse { N - 1 - k } else { k };
                    match map.admit("/t", &ids[i], &epoch, now, || OPEN) {
                        Admission::Serve { activated: true } => activated.push((i, round)),
                        Admission::Serve { activated: false } => {}
                        // The other thread may be a round ahead on this instance.
                        Admission::Stale => assert_eq!(round, "1"),
                        Admission::Refused => panic!("refused with an open gate"),
                    }
                }
            }
            activated
        };
        let (a, b) = thread::scope(|s| {
            let a = s.spawn(|| run(false));
            let b = s.spawn(|| run(true));
            (a.join().unwrap(), b.join().unwrap())
        });
        // Whichever thread reaches epoch 2 on an instance has admitted it at epoch 1 first.
        let all: HashSet<_> = a.iter().chain(&b).copied().collect();
        assert_eq!(all.len(), a.len() + b.len(), "a placement activated twice");
        assert_eq!(all.len(), 2 * N, "a placement never activated");
        let held = map.held();
        assert_eq!(held.len(), N);
        assert!(held.iter().all(|(_, _, epoch)| *epoch == e("2")));
    }

    /// One thread activates fresh instances while the other closes the gate and forgets
    /// everything, as a graceful stop does: every activation is either in what was forgotten
    /// or refused, and nothing is left held.
    #[test]
    fn closing_the_gate_then_forgetting_misses_no_activation() {
        for _ in 0..20 {
            let map = HeldMap::new(0);
            let now = Instant::now();
            let stopping = Mutex::new(false);
            let gate = || Gate {
                superseded: false,
                lease: true,
                activations: !*stopping.lock().unwrap(),
            };
            let (activated, forgotten) = thread::scope(|s| {
                let activating = s.spawn(|| {
                    let mut activated = Vec::new();
                    for i in 0.. {
                        let id = format!("i{i}");
                        match map.admit("/t", &id, &e("1"), now, gate) {
                            Admission::Serve { activated: true } => activated.push(id),
                            Admission::Refused => break,
                            other => panic!("{other:?} for a fresh instance"),
                        }
                    }
                    activated
                });
                let stopper = s.spawn(|| {
                    // Let some activations land first.
                    while map.shards.iter().all(|slot| lock(slot).held.is_empty()) {
                        thread::yield_now();
                    }
                    *stopping.lock().unwrap() = true;
                    map.forget_all(now)
                });
                (activating.join().unwrap(), stopper.join().unwrap())
            });
            let mut forgotten: Vec<String> = forgotten.into_iter().map(|(_, id, _)| id).collect();
            let mut activated = activated;
            forgotten.sort_unstable();
            activated.sort_unstable();
            assert_eq!(forgotten, activated);
            assert!(map.held().is_empty());
        }
    }

    #[test]
    fn a_capacity_hint_sizes_every_shard() {
        let map = HeldMap::new(64_000);
        for slot in &map.shards {
            assert!(lock(slot).held.capacity() >= 1000 + 1000 / 8);
        }
        let unsized_map = HeldMap::new(0);
        assert_eq!(lock(&unsized_map.shards[0]).held.capacity(), 0);
    }
}
