//! Counters the node keeps about itself: resolution outcomes and open connections per core,
//! summed per node for `/registry/health` and rendered as Prometheus text for `GET /metrics`.
//!
//! Each core owns one [`CoreCounters`] and is its only writer, so a relaxed increment never
//! contends; readers sum across cores.

use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

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
    /// Connections closed at accept because the node had `max_connections` open.
    refused: AtomicU64,
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

    pub fn connection_refused(&self) {
        self.refused.fetch_add(1, Ordering::Relaxed);
    }

    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
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

/// What `/metrics` reports, read once per scrape.
#[derive(Debug)]
pub struct Snapshot {
    pub outcomes: Vec<(&'static str, u64)>,
    pub connections: u64,
    pub connections_refused: u64,
    pub uptime_secs: f64,
    pub serving: bool,
}

impl Collector for Snapshot {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut resolutions = encoder.encode_descriptor(
            "pinboard_resolutions",
            "Placement resolutions on this node, by outcome",
            None,
            MetricType::Counter,
        )?;
        for (outcome, n) in &self.outcomes {
            let labels = [("outcome", *outcome)];
            ConstCounter::new(*n).encode(resolutions.encode_family(&labels)?)?;
        }
        let refused = ConstCounter::new(self.connections_refused);
        refused.encode(encoder.encode_descriptor(
            "pinboard_connections_refused",
            "Client connections closed at accept because max_connections were open",
            None,
            refused.metric_type(),
        )?)?;
        let gauges = [
            (
                "pinboard_connections",
                "Client connections open on this node",
                self.connections as f64,
            ),
            (
                "pinboard_uptime_seconds",
                "Seconds since this node started",
                self.uptime_secs,
            ),
            (
                "pinboard_serving",
                "1 while this node is the serving fleet",
                f64::from(u8::from(self.serving)),
            ),
        ];
        for (name, help, value) in gauges {
            let gauge = ConstGauge::new(value);
            gauge.encode(encoder.encode_descriptor(name, help, None, gauge.metric_type())?)?;
        }
        Ok(())
    }
}

/// The snapshot as Prometheus text (OpenMetrics exposition).
pub fn render(snapshot: Snapshot) -> Result<String, std::fmt::Error> {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(snapshot));
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry)?;
    Ok(text)
}
