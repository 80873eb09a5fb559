//! Counters the node keeps about itself: resolution outcomes per core, summed per node for
//! `/registry/health` and `/metrics`.
//!
//! Each core owns one [`CoreCounters`] and is its only writer, so a relaxed increment never
//! contends; readers sum across cores.

use std::sync::atomic::{AtomicU64, Ordering};

/// Resolution outcomes, in the order the spec lists them (plus `takeover-denied`).
pub const OUTCOMES: [&str; 11] = [
    "forward",
    "unknown-ns",
    "no-backends",
    "quarantine",
    "not-serving",
    "no-hostname-workers",
    "binding-quarantine",
    "takeover-pending",
    "env-conflict",
    "nack",
    "takeover-denied",
];

#[derive(Default)]
pub struct CoreCounters {
    outcomes: [AtomicU64; OUTCOMES.len()],
    /// Client connections open on this core (a gauge).
    connections: AtomicU64,
}

impl CoreCounters {
    pub fn connection_opened(&self) {
        self.connections.fetch_add(1, Ordering::Relaxed);
    }

    pub fn connection_closed(&self) {
        self.connections.fetch_sub(1, Ordering::Relaxed);
    }

    pub fn connections(&self) -> u64 {
        self.connections.load(Ordering::Relaxed)
    }

    /// Counts one outcome; `name` must be one of [`OUTCOMES`].
    pub fn count(&self, name: &str) {
        if let Some(i) = OUTCOMES.iter().position(|o| *o == name) {
            self.outcomes[i].fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Every core's counters, summed.
pub fn outcomes(cores: &[CoreCounters]) -> impl Iterator<Item = (&'static str, u64)> + '_ {
    OUTCOMES.iter().enumerate().map(move |(i, name)| {
        let total = cores
            .iter()
            .map(|c| c.outcomes[i].load(Ordering::Relaxed))
            .sum();
        (*name, total)
    })
}
