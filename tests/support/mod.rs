//! Helpers shared by the integration tests. Every test binary compiles this module but uses only
//! part of it, so unused items are expected here.
#![allow(dead_code)]

pub mod attest;
pub mod certs;
pub mod cluster;
pub mod fleet;
pub mod h2frames;
pub mod http;
pub mod node;
pub mod process;
pub mod redis;
pub mod tls;
pub mod tls_front;
pub mod worker;

/// The key names the node under test uses (default prefix): tests read Redis through the same
/// layout the node writes.
pub fn keys(shards: u32) -> pinboard::store::Keys {
    pinboard::store::Keys::new("pinboard:", shards)
}

/// The value of one sample of a `/metrics` text, named as it is written: the metric name and its
/// labels (`pinboard_upstream_errors_total{kind="reset"}`).
pub fn metric(text: &str, sample: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(sample)?.strip_prefix(' '))
        .and_then(|value| value.trim().parse().ok())
}
