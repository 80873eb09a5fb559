//! Strict mode (`redis.wait_replicas` above 0): a new placement is forwarded only once that
//! many Redis replicas hold it, and after a failover of Redis the buckets it touched
//! cold-start again.
//!
//! - After a resolve that placed (the script's reply says so; a script cannot `WAIT` inside),
//!   `WAIT wait_replicas wait_timeout_ms` ([`crate::redis::Redis::wait_for_replicas`]).
//!   Fewer acknowledgements in time, or the connection failing, release the placement (the
//!   ledger records `released`) and the request answers 503 `registry unavailable, retry`
//!   (outcome `unreplicated`).
//! - A steady request (an existing row) waits only for a row young enough that its placer may
//!   still be waiting ([`Strict::may_be_unreplicated`]): the row is in the master before the
//!   replicas have it, and another request (on another core or node) that read it and
//!   forwarded at once would serve a placement the replicas may never get (chaos's near
//!   misses, reliability.md). Its `WAIT` comes after its own read of the row, so it covers the
//!   row's write; short of replicas it answers the same 503 and leaves the release to the
//!   placer. Rows older than that window are not waited for: by then their placer's `WAIT`
//!   has returned, and an unreplicated row was released.
//! - A failover (a master's address answering with another server, see
//!   `crate::redis::failover`; in a cluster also a replica promoted in the slot map) re-stamps
//!   the cold-start time of every bucket on that master with Redis's clock when it was seen
//!   (or, where that clock was not read, leaves the bucket's next resolve to stamp it): the cold-start rule (`lua/resolve.lua`) then refuses
//!   new placements there for one lease, so an id whose row the failover lost is not placed
//!   again while its old owner's lease may still run. The stamps are queued on the same
//!   connection ahead of this core's next placement script, and live in Redis: every node
//!   sees them, `/registry/health` shows them, and a node that has not yet noticed the
//!   failover is held back by the first that did.

use std::time::Duration;

use tracing::{debug, warn};

use crate::error::Error;
use crate::store::Store;

/// How much the node's clock may lag Redis's when a row's epoch (Redis's clock in ms when it
/// was placed, or a little past it) is read as its age: within it, a row placed less than
/// `wait_timeout_ms` ago never looks older.
const CLOCK_SKEW: Duration = Duration::from_secs(2);

/// Strict mode's settings, from `redis.*`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Strict {
    replicas: u32,
    timeout: Duration,
    /// The worker lease: how long a failover's quarantine lasts.
    lease: Duration,
}

impl Strict {
    /// `None` while strict mode is off (`redis.wait_replicas = 0`).
    pub fn of(config: &crate::config::Config) -> Option<Strict> {
        let redis = &config.redis;
        (redis.wait_replicas > 0).then(|| Strict {
            replicas: redis.wait_replicas,
            timeout: Duration::from_millis(redis.wait_timeout_ms),
            lease: Duration::from_millis(config.lease_ttl_ms),
        })
    }

    /// Whether a steady row at `epoch` may have been placed so recently that its placer is
    /// still waiting for the replicas: its epoch is Redis's clock at the placement (or past it:
    /// one epoch more than the bucket's last), so an epoch within `wait_timeout_ms` plus
    /// [`CLOCK_SKEW`] of this node's clock is young. An epoch that is no timestamp (the digits
    /// of a larger number) is young too: waiting is the safe side.
    pub(super) fn may_be_unreplicated(&self, epoch: &str, now_ms: u64) -> bool {
        let window = (self.timeout + CLOCK_SKEW).as_millis() as u64;
        epoch
            .parse::<u64>()
            .map_or(true, |placed| placed.saturating_add(window) > now_ms)
    }

    /// Whether the replicas hold the placement just written on the connection `key` (a key of
    /// the placement's bucket) is routed by.
    pub(super) async fn replicated(&self, store: &Store, key: &str) -> bool {
        let waited = (store.redis)
            .wait_for_replicas(key.as_bytes(), self.replicas, self.timeout)
            .await;
        match waited {
            Ok(acknowledged) if acknowledged >= i64::from(self.replicas) => true,
            Ok(acknowledged) => {
                debug!(
                    acknowledged,
                    wanted = self.replicas,
                    "placement not replicated in time"
                );
                false
            }
            Err(error) => {
                debug!(%error, "WAIT after a placement failed");
                false
            }
        }
    }

    /// Before a placement script: the failovers this core's connections saw since the last
    /// call cold-start the buckets they touched (see the module's doc). Fails, keeping them
    /// for the next call, when the stamps could not be written: no placement goes ahead then.
    pub(super) async fn quarantine_failed_over(&self, store: &Store) -> Result<(), Error> {
        let failed = store.redis.take_failed_over();
        // Seen more than a lease ago (this core placed nothing since): nothing left to hold.
        if failed.is_empty()
            || failed
                .seen()
                .is_some_and(|seen| seen.elapsed() >= self.lease)
        {
            return Ok(());
        }
        let keys = &store.keys;
        let stamps: Vec<&str> = (0..keys.shards())
            .map(|bucket| keys.bucket(bucket).boot_time.as_str())
            .filter(|key| failed.covers(key.as_bytes()))
            .collect();
        // Redis's clock when the failover was seen; unread, the bucket's next resolve stamps
        // its own (`SET … NX`), a little later.
        let at = failed.server_ms().map(|ms| ms.to_string());
        let commands: Vec<Vec<&[u8]>> = stamps
            .iter()
            .map(|key| match &at {
                Some(at) => vec![b"SET".as_slice(), key.as_bytes(), at.as_bytes()],
                None => vec![b"DEL".as_slice(), key.as_bytes()],
            })
            .collect();
        // Every write is queued (each on its bucket's connection) before the first reply is
        // awaited, so none of this core's placement scripts can overtake them.
        let written =
            futures_util::future::join_all(commands.iter().map(|args| store.redis.cmd(args))).await;
        if let Some(error) = written.into_iter().find_map(Result::err) {
            store.redis.restore_failed_over(failed);
            return Err(error.into());
        }
        warn!(
            buckets = stamps.len(),
            "redis failed over: no new placement in its buckets for one lease"
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_is_young_while_its_placer_may_still_be_waiting() {
        let strict = Strict {
            replicas: 1,
            timeout: Duration::from_millis(100),
            lease: Duration::from_secs(15),
        };
        let now = 1_796_551_540_507;
        let young = |epoch: u64| strict.may_be_unreplicated(&epoch.to_string(), now);
        assert!(young(now), "placed now");
        assert!(young(now - 2_099), "within the timeout and the skew");
        assert!(!young(now - 2_100), "past both");
        assert!(!young(1), "an old row");
        assert!(young(now + 5_000), "Redis's clock ahead of this node's");
        assert!(strict.may_be_unreplicated("340282366920938463463374607431768211455", now));
    }
}
