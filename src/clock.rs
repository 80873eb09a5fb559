//! The node's wall clock, for checks the scripts repeat against Redis's own.

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch (0 before it).
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Seconds since the Unix epoch, as attestations stamp `iat`.
pub fn now_secs() -> u64 {
    now_ms() / 1000
}
