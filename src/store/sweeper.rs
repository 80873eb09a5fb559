//! What the sweeper and the mirror poll ask of the store (contract §6, §7): the sweeper lease
//! and its holder, a bucket's row count and liveness entries, the GC of a page of rows or
//! markers, the registered (env, namespace) pairs and forgetting an empty one, and the wake
//! schedule's due entries, their placeholders and their removal once woken.

use std::collections::HashMap;

use futures_util::future::join_all;

use super::scripts::{FORGET_NAMESPACE, SWEEP_ROWS, SWEEPER, WAKE_DONE, WAKE_DUE};
use super::{SCRIPT_PAGE, SCRIPT_PAGE_STR, Store};
use crate::error::{Error, Origin};

impl Store {
    /// Claims (or renews) the sweeper lease for `node_id`: whether this node holds it now.
    pub async fn claim_sweeper(&self, node_id: &str) -> Result<bool, Error> {
        self.sweeper_lease(b"claim", node_id).await
    }

    /// Gives the sweeper lease up, if `node_id` holds it (a graceful stop).
    pub async fn release_sweeper(&self, node_id: &str) -> Result<bool, Error> {
        self.sweeper_lease(b"release", node_id).await
    }

    async fn sweeper_lease(&self, op: &[u8], node_id: &str) -> Result<bool, Error> {
        let held = self
            .run_int(
                &SWEEPER,
                &[self.keys.sweeper().as_bytes()],
                &[op, node_id.as_bytes(), self.lease.as_bytes()],
            )
            .await?;
        Ok(held == 1)
    }

    /// The node holding the sweeper lease, if any.
    pub async fn sweeper_holder(&self) -> Result<Option<String>, Error> {
        self.string_at(self.keys.sweeper()).await
    }

    /// How many placement rows (env, ns) has in `bucket`: one `HLEN`, constant time.
    pub async fn placement_rows(&self, bucket: u32, env: &str, ns: &str) -> Result<u64, Error> {
        let key = self.keys.placements(bucket, env, ns);
        let reply = self.redis.cmd(&[b"HLEN", key.as_bytes()]).await?;
        Ok(reply.as_int().unwrap_or(0).try_into().unwrap_or(0))
    }

    /// The liveness entries of `bucket`: each session's copy's expiry (ms). One `HGETALL`:
    /// the hash holds one entry per worker session, not one per placement.
    pub async fn liveness(&self, bucket: u32) -> Result<HashMap<String, u64>, Error> {
        let key = &self.keys.bucket(bucket).alive;
        let reply = self.redis.cmd(&[b"HGETALL", key.as_bytes()]).await?;
        // '{expiry} {hostname}', as bucket_worker.lua writes it.
        Ok(reply
            .pairs()
            .filter_map(|(session, entry)| {
                let expiry = entry.split(|b| *b == b' ').next()?;
                let expiry = std::str::from_utf8(expiry).ok()?.parse().ok()?;
                Some((session.to_owned(), expiry))
            })
            .collect())
    }

    /// The sweeper's GC of (env, ns) in `bucket` for `ids` (at most [`SCRIPT_PAGE`]): the
    /// dead-owner rows among them, or the overwritten markers without a row. How many went.
    pub async fn sweep(
        &self,
        bucket: u32,
        env: &str,
        ns: &str,
        what: Sweep,
        ids: &[&str],
    ) -> Result<u64, Error> {
        debug_assert!(ids.len() <= SCRIPT_PAGE);
        let (placements, overwritten, wake) = (
            self.keys.placements(bucket, env, ns),
            self.keys.overwritten(bucket, env, ns),
            self.keys.wake(bucket, env, ns),
        );
        let copies = self.keys.bucket(bucket);
        let [ledger, last] = self.ledger_keys(bucket);
        let mut args: Vec<&[u8]> = Vec::with_capacity(ids.len() + 5);
        args.push(match what {
            Sweep::DeadOwnerRows => b"rows",
            Sweep::MarkersWithoutRow => b"markers",
        });
        args.extend([
            self.lease.as_bytes(),
            self.ledger.as_bytes(),
            env.as_bytes(),
            ns.as_bytes(),
        ]);
        args.extend(ids.iter().map(|id| id.as_bytes()));
        let deleted = self
            .run_int(
                &SWEEP_ROWS,
                &[
                    placements.as_bytes(),
                    overwritten.as_bytes(),
                    wake.as_bytes(),
                    copies.alive.as_bytes(),
                    copies.workers.as_bytes(),
                    ledger,
                    last,
                ],
                &args,
            )
            .await?;
        Ok(deleted.try_into().unwrap_or(0))
    }

    /// Every (env, namespace) pair a registration named and the sweeper has not forgotten,
    /// with how many registrations named it. One `HGETALL`: the hash grows with the
    /// namespaces, not with the workers or placements.
    pub async fn registered_pairs(&self) -> Result<Vec<RegisteredPair>, Error> {
        let reply = self
            .redis
            .cmd(&[b"HGETALL", self.keys.namespaces().as_bytes()])
            .await?;
        Ok(reply
            .pairs()
            .filter_map(|(field, count)| {
                let (env, ns): (String, String) = serde_json::from_str(field).ok()?;
                Some(RegisteredPair {
                    env,
                    ns,
                    count: String::from_utf8(count.to_vec()).ok()?,
                })
            })
            .collect())
    }

    /// Whether (env, ns) holds nothing in any bucket: no placement row, overwritten marker
    /// or wake entry. One `EXISTS` of the bucket's three keys (one slot) per bucket, all sent
    /// at once.
    pub async fn pair_is_empty(&self, env: &str, ns: &str) -> Result<bool, Error> {
        let calls = (0..self.keys.shards()).map(|b| async move {
            let (placements, overwritten, wake) = (
                self.keys.placements(b, env, ns),
                self.keys.overwritten(b, env, ns),
                self.keys.wake(b, env, ns),
            );
            self.redis
                .cmd(&[
                    b"EXISTS",
                    placements.as_bytes(),
                    overwritten.as_bytes(),
                    wake.as_bytes(),
                ])
                .await
        });
        for reply in join_all(calls).await {
            if reply?.as_int() != Some(0) {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Forgets `pair`, unless a registration named it since it was read: whether it went.
    pub async fn forget_pair(&self, pair: &RegisteredPair) -> Result<bool, Error> {
        let field = pair_field(&pair.env, &pair.ns);
        let gone = self
            .run_int(
                &FORGET_NAMESPACE,
                &[self.keys.namespaces().as_bytes()],
                &[field.as_bytes(), pair.count.as_bytes()],
            )
            .await?;
        Ok(gone == 1)
    }

    /// Up to [`SCRIPT_PAGE`] entries of the wake schedule of (env, ns) in `bucket` due at
    /// `now` (ms), earliest first, skipping the first `skip`: one `ZRANGEBYSCORE … LIMIT`.
    pub async fn due_wakes(
        &self,
        bucket: u32,
        env: &str,
        ns: &str,
        now: u64,
        skip: usize,
    ) -> Result<Vec<DueWake>, Error> {
        let key = self.keys.wake(bucket, env, ns);
        let (now, skip) = (now.to_string(), skip.to_string());
        let reply = self
            .redis
            .cmd(&[
                b"ZRANGEBYSCORE",
                key.as_bytes(),
                b"-inf",
                now.as_bytes(),
                b"WITHSCORES",
                b"LIMIT",
                skip.as_bytes(),
                SCRIPT_PAGE_STR.as_bytes(),
            ])
            .await?;
        Ok(reply
            .pairs()
            .filter_map(|(id, at)| {
                // Scores come back as Redis formats doubles; schedules write whole ms.
                let at: f64 = std::str::from_utf8(at).ok()?.parse().ok()?;
                Some(DueWake {
                    id: id.to_owned(),
                    at: at as u64,
                })
            })
            .collect())
    }

    /// Pages in a placeholder row for each of `ids` (at most [`SCRIPT_PAGE`]) that has no
    /// placed row (`wake_due.lua`); per id, the hostname to resolve it from.
    pub async fn page_in_wakes(
        &self,
        bucket: u32,
        env: &str,
        ns: &str,
        ids: &[&str],
    ) -> Result<Vec<String>, Error> {
        debug_assert!(ids.len() <= SCRIPT_PAGE);
        let (placements, overwritten) = (
            self.keys.placements(bucket, env, ns),
            self.keys.overwritten(bucket, env, ns),
        );
        let copies = self.keys.bucket(bucket);
        let [ledger, last] = self.ledger_keys(bucket);
        let mut args: Vec<&[u8]> = vec![self.ledger.as_bytes(), env.as_bytes(), ns.as_bytes()];
        args.extend(ids.iter().map(|id| id.as_bytes()));
        let reply = self
            .redis
            .evalsha(
                &WAKE_DUE,
                &[
                    placements.as_bytes(),
                    overwritten.as_bytes(),
                    copies.alive.as_bytes(),
                    copies.workers.as_bytes(),
                    ledger,
                    last,
                ],
                &args,
            )
            .await?;
        let hostnames: Option<Vec<String>> = reply
            .as_array()
            .map(|items| items.iter().map(|h| Some(h.as_str()?.to_owned())).collect())
            .and_then(|all: Option<Vec<String>>| all.filter(|h| h.len() == ids.len()));
        hostnames
            .ok_or_else(|| Error::new(Origin::Internal, format!("wake_due answered {reply:?}")))
    }

    /// After a 200 from its `_wake`: the entry of `id` leaves the schedule, unless it was
    /// scheduled again for later than `woken`, the wake-at it was woken for.
    pub async fn woken(
        &self,
        bucket: u32,
        env: &str,
        ns: &str,
        id: &str,
        woken: u64,
    ) -> Result<bool, Error> {
        let key = self.keys.wake(bucket, env, ns);
        let woken = woken.to_string();
        let gone = self
            .run_int(
                &WAKE_DONE,
                &[key.as_bytes()],
                &[id.as_bytes(), woken.as_bytes()],
            )
            .await?;
        Ok(gone == 1)
    }
}

/// The field of (env, ns) in the registered pairs ([`super::Keys::namespaces`]): the JSON
/// array `["env","ns"]`, which no env or namespace can make ambiguous.
pub fn pair_field(env: &str, ns: &str) -> String {
    serde_json::to_string(&(env, ns)).expect("two strings serialize")
}

/// An (env, namespace) pair of the registered pairs, with its count as read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegisteredPair {
    pub env: String,
    pub ns: String,
    /// How many registrations had named it, as Redis wrote it.
    pub count: String,
}

/// An entry of a wake schedule that is due.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DueWake {
    pub id: String,
    /// Its wake-at, ms.
    pub at: u64,
}

/// What a sweep of a page deletes ([`Store::sweep`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sweep {
    /// Placement rows whose owner is gone or dead for more than a lease, unless scheduled or
    /// fenced.
    DeadOwnerRows,
    /// Overwritten markers whose id has no row.
    MarkersWithoutRow,
}
