//! A latency histogram that one core writes and a scrape on any core reads: fixed bucket bounds
//! (seconds, Prometheus' base unit), a count per bucket and the sum in nanoseconds.
//!
//! One writer per histogram (its core), so an observation is two relaxed loads and stores, no
//! read-modify-write instruction and no contention: a scrape merges every core's copy
//! ([`Merged`]). Written here rather than taken from prometheus-client, whose histogram is one
//! shared `Arc<RwLock<…>>` every core would write through.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds of the buckets, in seconds: 100 µs to 30 s (the forward timeout's default).
/// The last, implicit bucket is `+Inf`.
pub const BOUNDS: [f64; 16] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 30.0,
];

/// [`BOUNDS`] in nanoseconds, what an observation is compared with.
const BOUNDS_NS: [u64; BOUNDS.len()] = {
    let mut ns = [0; BOUNDS.len()];
    let mut i = 0;
    while i < ns.len() {
        ns[i] = (BOUNDS[i] * 1e9 + 0.5) as u64;
        i += 1;
    }
    ns
};

#[derive(Default)]
pub struct Histogram {
    /// Observations per bucket (not cumulative); the last is `+Inf`.
    buckets: [AtomicU64; BOUNDS.len() + 1],
    sum_ns: AtomicU64,
}

impl Histogram {
    /// Records one observation. Only the owning core calls this.
    pub fn observe(&self, elapsed: Duration) {
        let ns = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        let i = BOUNDS_NS.partition_point(|bound| *bound < ns);
        bump(&self.buckets[i], 1);
        bump(&self.sum_ns, ns);
    }
}

/// Adds to a counter that only this thread writes: a load and a store, no locked instruction.
fn bump(counter: &AtomicU64, n: u64) {
    counter.store(
        counter.load(Ordering::Relaxed).wrapping_add(n),
        Ordering::Relaxed,
    );
}

/// Several cores' histograms of one series, added up at scrape.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Merged {
    /// (upper bound, observations in this bucket), `+Inf` last, as prometheus-client's
    /// encoder takes them (it makes them cumulative).
    pub buckets: Vec<(f64, u64)>,
    pub count: u64,
    /// Seconds.
    pub sum: f64,
}

impl Merged {
    pub fn of<'a>(histograms: impl IntoIterator<Item = &'a Histogram>) -> Merged {
        let mut counts = [0u64; BOUNDS.len() + 1];
        let mut sum_ns = 0u64;
        for h in histograms {
            for (total, bucket) in counts.iter_mut().zip(&h.buckets) {
                *total += bucket.load(Ordering::Relaxed);
            }
            sum_ns = sum_ns.wrapping_add(h.sum_ns.load(Ordering::Relaxed));
        }
        Merged {
            buckets: BOUNDS
                .iter()
                .copied()
                .chain([f64::INFINITY])
                .zip(counts)
                .collect(),
            count: counts.iter().sum(),
            sum: sum_ns as f64 / 1e9,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_land_in_the_first_bucket_that_holds_them_and_cores_add_up() {
        let (a, b) = (Histogram::default(), Histogram::default());
        a.observe(Duration::from_micros(100));
        a.observe(Duration::from_micros(101));
        b.observe(Duration::from_millis(3));
        b.observe(Duration::from_secs(60));
        let merged = Merged::of([&a, &b]);
        assert_eq!(merged.count, 4);
        assert!((merged.sum - 60.003201).abs() < 1e-9, "{}", merged.sum);
        let at = |bound: f64| {
            merged
                .buckets
                .iter()
                .find(|(b, _)| *b == bound)
                .map(|(_, n)| *n)
        };
        assert_eq!(at(0.0001), Some(1), "a bound is inclusive");
        assert_eq!(at(0.00025), Some(1));
        assert_eq!(at(0.005), Some(1));
        assert_eq!(at(f64::INFINITY), Some(1));
        assert_eq!(merged.buckets.len(), BOUNDS.len() + 1);
    }
}
