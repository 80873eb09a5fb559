//! The fleet: whether this node may serve. Nodes sharing a Redis must agree on what a
//! placement means (`shards`, `hostname_aware`), so each claims the fleet license — that
//! configuration, with the node's `fleet_epoch` — and keeps a membership entry, once per third
//! of a lease (`lua/fleet.lua`). The outcome is the node's [`Standing`]:
//!
//! - holding the license, its live peers agreeing: serving;
//! - another fleet holds the license, or a live peer disagrees at an equal or higher epoch:
//!   not the serving fleet, 503 `not the serving fleet`;
//! - Redis could not be asked (unreachable, timed out, failing) until the license this node
//!   last held lapsed, or since start: Redis away, 503 `registry unavailable, retry`, counted
//!   `unavailable` (contract §8).
//!
//! Only a serving node resolves or forwards (One Owner): the other two refuse before any
//! placement is read, and differ only in what they tell the client and the log. `/readyz` is
//! 503 in both; `/registry/health` answers in all three.

use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

use tracing::{debug, info, warn};

use crate::answers::{self, Fail};
use crate::config::Config;
use crate::error::{Error, Origin};
use crate::http::Shutdown;
use crate::redis::RedisError;
use crate::store::Store;
use crate::store::scripts::FLEET;

/// Whether this node may serve, and if not, why.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Standing {
    /// It holds the fleet license and its live peers agree.
    Serving,
    /// Another fleet holds the license or a live peer disagrees; also before the first claim.
    NotServing,
    /// Redis could not be asked for the license until it lapsed (or ever).
    RedisAway,
}

impl Standing {
    /// The check of a request that needs the serving fleet: nothing while serving; else
    /// 503 `not the serving fleet`, or, with Redis away, the Redis failure every route answers
    /// with 503 `registry unavailable, retry` (and counts `unavailable`).
    pub fn check(self) -> Result<(), Fail> {
        match self {
            Standing::Serving => Ok(()),
            Standing::NotServing => Err(answers::not_serving().into()),
            Standing::RedisAway => Err(Error::new(
                Origin::Redis,
                "Redis unreachable: the fleet license lapsed",
            )
            .retryable(true)
            .into()),
        }
    }
}

/// The node's [`Standing`], shared by its cores: written by the fleet claim, read per request.
pub struct StandingFlag(AtomicU8);

impl Default for StandingFlag {
    fn default() -> StandingFlag {
        StandingFlag(AtomicU8::new(Standing::NotServing as u8))
    }
}

impl StandingFlag {
    pub fn get(&self) -> Standing {
        match self.0.load(Ordering::Relaxed) {
            0 => Standing::Serving,
            2 => Standing::RedisAway,
            _ => Standing::NotServing,
        }
    }

    pub fn is_serving(&self) -> bool {
        self.get() == Standing::Serving
    }

    fn set(&self, standing: Standing) {
        self.0.store(standing as u8, Ordering::Relaxed);
    }
}

/// Version of the license's shape.
const SCHEMA: u32 = 1;

/// How soon a failed claim is tried again.
const RETRY: Duration = Duration::from_millis(100);

/// The license this node claims, in one canonical byte form (nodes compare it byte for byte).
pub fn license(config: &Config) -> String {
    format!(
        r#"{{"schema":{SCHEMA},"shards":{},"hostnameAware":{},"epoch":{}}}"#,
        config.shards, config.hostname_aware, config.fleet_epoch
    )
}

/// Claims the license and membership over `store` until `shutdown`, keeping `standing_flag` (the
/// node's serving flag) current. Run by one core per node.
pub async fn keep_claiming(
    store: &Store,
    config: &Config,
    standing_flag: &StandingFlag,
    shutdown: Shutdown,
) {
    let license = license(config);
    let epoch = config.fleet_epoch.to_string();
    let every = Duration::from_millis((config.lease_ttl_ms / 3).max(100));
    let lease = Duration::from_millis(config.lease_ttl_ms);
    let mut failures = Failures::default();
    // Until when the license this node last claimed lives in Redis (it is set with a TTL of
    // one lease, from before the claim was sent).
    let mut held_until: Option<Instant> = None;
    // The standing last logged (none yet), and why the last answered claim did not hold.
    let mut said: Option<Standing> = None;
    let mut refused = "";
    while !shutdown.is_fired() {
        let sent = Instant::now();
        let reply = store
            .redis
            .evalsha(
                &FLEET,
                &[
                    store.keys.fleet().as_bytes(),
                    store.keys.members().as_bytes(),
                ],
                &[
                    license.as_bytes(),
                    epoch.as_bytes(),
                    config.node_id.as_bytes(),
                    store.lease().as_bytes(),
                ],
            )
            .await;
        let standing = match &reply {
            Ok(r) => {
                let flags: Vec<Option<&str>> = r
                    .as_array()
                    .unwrap_or_default()
                    .iter()
                    .map(|f| f.as_str())
                    .collect();
                let holds = flags == [Some("1"), Some("1")];
                held_until = holds.then_some(sent + lease);
                refused = match flags.as_slice() {
                    [Some("1"), Some("1")] => "",
                    [Some("0"), _] => "another fleet holds the license",
                    _ => "a live peer's license differs at an equal or higher epoch",
                };
                if holds {
                    Standing::Serving
                } else {
                    Standing::NotServing
                }
            }
            // A claim that could not be made does not end the license: no other fleet can
            // take it before it expires, so the node keeps serving what Redis still answers
            // (a Redis Cluster master down fails only its own slots) until then.
            Err(e) => {
                failures.failed(e);
                if held_until.is_some_and(|until| Instant::now() < until) {
                    Standing::Serving
                } else {
                    Standing::RedisAway
                }
            }
        };
        if reply.is_ok() {
            failures.succeeded();
        }
        standing_flag.set(standing);
        // Said once a change; a node still connecting at start is not worth a warning.
        if said != Some(standing) && !(standing == Standing::RedisAway && failures.booting()) {
            match (standing, &reply) {
                (Standing::Serving, _) => {
                    info!(license = %license, "serving: holding the fleet license");
                }
                (Standing::RedisAway, Err(e)) => warn!(
                    error = %e,
                    "not serving: {}, and the fleet license has lapsed; answering 503 registry unavailable, retry",
                    redis_trouble(e)
                ),
                _ => warn!(license = %license, "not serving: {refused}"),
            }
            said = Some(standing);
        }
        // A failed claim (at start, before the connection is up, or while Redis is away) is
        // retried soon rather than a third of a lease later.
        let wait = if reply.is_ok() {
            every
        } else {
            RETRY.min(every)
        };
        monoio::select! {
            _ = monoio::time::sleep(wait) => {}
            _ = shutdown.fired() => {}
        }
    }
}

/// What Redis did to a claim, as the log says it.
fn redis_trouble(error: &RedisError) -> &'static str {
    match error {
        RedisError::Timeout => "Redis timed out",
        RedisError::Disconnected => "Redis unreachable",
        RedisError::Protocol(_) | RedisError::Reply(_) => "Redis failing",
    }
}

/// Failed claims, said once and then counted: the claim is retried ten times a second while
/// Redis is away, and the log should not be. Before the first success a claim fails only
/// because the connection is still being made (the boot race): that is not worth a warning.
#[derive(Default)]
struct Failures {
    /// Whether a claim ever succeeded.
    claimed_once: bool,
    /// Failures since the last success.
    since_success: u64,
    /// Failures since the last warning about them; `None` while none has been said.
    since_said: Option<u64>,
}

impl Failures {
    /// Failures tolerated silently at start while the connection is made (5 s).
    const BOOT: u64 = 50;
    /// Repeats of one failure counted before it is said again (a minute).
    const SAY_EVERY: u64 = 600;

    /// Whether the claims so far failed only as a node still connecting at start does.
    fn booting(&self) -> bool {
        !self.claimed_once && self.since_success <= Self::BOOT
    }

    fn failed(&mut self, error: &RedisError) {
        self.since_success += 1;
        if self.booting() {
            debug!(%error, "fleet license claim failed while connecting");
            return;
        }
        let say = match &mut self.since_said {
            None => true,
            Some(n) => {
                *n += 1;
                *n >= Self::SAY_EVERY
            }
        };
        if say {
            warn!(
                %error,
                failures = self.since_success,
                "fleet license claim failed: {}; retrying every 100 ms",
                redis_trouble(error)
            );
            self.since_said = Some(0);
        }
    }

    fn succeeded(&mut self) {
        if self.since_said.is_some() {
            info!(
                failures = self.since_success,
                "fleet license claim succeeded again"
            );
        }
        self.claimed_once = true;
        self.since_success = 0;
        self.since_said = None;
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn license_is_canonical_json() {
        let config = crate::config::Config {
            shards: 8,
            hostname_aware: true,
            fleet_epoch: 3,
            ..Default::default()
        };
        let text = super::license(&config);
        assert_eq!(
            text,
            r#"{"schema":1,"shards":8,"hostnameAware":true,"epoch":3}"#
        );
        let parsed: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(parsed["epoch"], 3);
    }
}
