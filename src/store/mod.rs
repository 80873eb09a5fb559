//! The store: the one home of the Redis layout. It names every key ([`Keys`]), owns the
//! records stored under them and their encoding ([`records`]), embeds the Lua scripts
//! ([`scripts`]) and does the reads and multi-bucket writes the routes ask for. Nothing outside
//! it formats a key or parses a stored record; see `src/store/README.md`.
//!
//! Every script declares every key it touches in `KEYS`, so on a resharding Redis Cluster a
//! script whose keys are split between two nodes is refused (ASK, then TRYAGAIN, retried by
//! the client) rather than run against half of them.

mod keys;
mod ledger;
mod records;
mod rows;
pub mod scripts;
mod sweeper;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use futures_util::future::{join, join_all};
use serde::Deserialize;
use serde::de::DeserializeOwned;

use crate::error::{Error, Origin};
use crate::redis::{Blob, Redis, Reply, Script};

pub use keys::{BucketKeys, KeyName, Keys, bucket_of};
pub use ledger::{HistoryAsk, HistoryPage, LedgerEntry, is_stream_id, stream_id_order};
pub use records::{
    BucketCopy, ClientRecord, Drain, EnvBinding, HostBinding, Paused, PlacementRow, SINGLE_ENV,
    Session, Successor, Takeover, WindDown, lua_list, lua_option,
};
pub use rows::{Fence, Pause, PauseOutcome, Release, Stamped};
use scripts::{BUCKET_WORKER, CONTROL_PUSH, PRUNE, SESSION_DROP};
pub use sweeper::{DueWake, RegisteredPair, Sweep, pair_field};

/// One core's view of the store: its Redis connection and the key names.
pub struct Store {
    pub redis: Redis,
    pub keys: Keys,
    /// The lease TTL in ms, formatted once: most scripts take it.
    lease: String,
    /// The ownership ledger's cap (`ledger.max_entries_per_bucket`), formatted once, or `""`
    /// with the ledger off: what every script that appends takes.
    ledger: String,
}

/// How often a multi-bucket write re-reads a bucket whose copies changed under it.
const STALE_RETRIES: usize = 5;

impl Store {
    /// `ledger_cap`: the ownership ledger's most entries per bucket, `None` with it off.
    pub fn new(redis: Redis, keys: Keys, lease_ttl_ms: u64, ledger_cap: Option<u64>) -> Store {
        Store {
            redis,
            keys,
            lease: lease_ttl_ms.to_string(),
            ledger: ledger_cap.map(|cap| cap.to_string()).unwrap_or_default(),
        }
    }

    /// The lease TTL (ms) as scripts take it.
    pub fn lease(&self) -> &str {
        &self.lease
    }

    /// Runs `script` and parses its JSON answer.
    pub async fn run<T: DeserializeOwned>(
        &self,
        script: &Script,
        keys: &[&[u8]],
        args: &[&[u8]],
    ) -> Result<T, Error> {
        let reply = self.redis.evalsha(script, keys, args).await?;
        let text = reply.as_bytes().ok_or_else(|| {
            Error::new(
                Origin::Internal,
                format!("{} answered {reply:?}", script.name),
            )
        })?;
        serde_json::from_slice(text)
            .map_err(|e| Error::because(Origin::Internal, format!("{} answer", script.name), e))
    }

    /// Runs `script` for its integer answer.
    pub async fn run_int(
        &self,
        script: &Script,
        keys: &[&[u8]],
        args: &[&[u8]],
    ) -> Result<i64, Error> {
        match self.redis.evalsha(script, keys, args).await? {
            Reply::Int(n) => Ok(n),
            other => Err(Error::new(
                Origin::Internal,
                format!("{} answered {other:?}", script.name),
            )),
        }
    }

    /// The session's master record, if the registry has one (live or not).
    pub async fn session(&self, session_id: &str) -> Result<Option<Session>, Error> {
        let reply = self
            .redis
            .cmd(&[
                b"HGET",
                self.keys.sessions().as_bytes(),
                session_id.as_bytes(),
            ])
            .await?;
        reply.as_bytes().map(decode_session).transpose()
    }

    /// Every session record the registry has, live or not. One `HVALS`: the hash grows with
    /// the workers (a record lives until pruned, a lease past its expiry), not with
    /// placements.
    pub async fn sessions(&self) -> Result<Vec<Session>, Error> {
        let reply = self
            .redis
            .cmd(&[b"HVALS", self.keys.sessions().as_bytes()])
            .await?;
        reply
            .as_array()
            .unwrap_or_default()
            .iter()
            .filter_map(Reply::as_bytes)
            .map(decode_session)
            .collect()
    }

    /// A client's record: its account and live session.
    pub async fn client(&self, client_id: &str) -> Result<Option<ClientRecord>, Error> {
        let reply = self
            .redis
            .cmd(&[
                b"HGET",
                self.keys.clients().as_bytes(),
                client_id.as_bytes(),
            ])
            .await?;
        Ok(reply.as_bytes().and_then(ClientRecord::decode))
    }

    /// The operator drains in force on the clients of `sessions`, by client id, in one `MGET`
    /// (every drain key lives in the registry slot). Grows with the workers, not placements.
    pub async fn drains(&self, sessions: &[Session]) -> Result<BTreeMap<String, Drain>, Error> {
        let clients: BTreeSet<&str> = sessions.iter().map(|s| s.client_id.as_str()).collect();
        if clients.is_empty() {
            return Ok(BTreeMap::new());
        }
        let keys: Vec<String> = clients.iter().map(|c| self.keys.drain(c)).collect();
        let mut args: Vec<&[u8]> = vec![b"MGET"];
        args.extend(keys.iter().map(|k| k.as_bytes()));
        let reply = self.redis.cmd(&args).await?;
        Ok(clients
            .into_iter()
            .zip(reply.as_array().unwrap_or_default())
            .filter_map(|(client, raw)| {
                let drain = serde_json::from_slice(raw.as_bytes()?).ok()?;
                Some((client.to_owned(), drain))
            })
            .collect())
    }

    /// Hostname-aware: every `{hostname}{ns}` binding.
    pub async fn host_bindings(&self) -> Result<Vec<(String, HostBinding)>, Error> {
        self.hash_of(self.keys.bind_hosts()).await
    }

    /// Hostname-aware: every env's agreed takeover.
    pub async fn env_bindings(&self) -> Result<Vec<(String, EnvBinding)>, Error> {
        self.hash_of(self.keys.bind_envs()).await
    }

    /// A whole binding hash in one `HGETALL`: bindings grow with the (hostname, namespace)
    /// pairs workers register, not with placements.
    async fn hash_of<T: DeserializeOwned>(&self, key: &str) -> Result<Vec<(String, T)>, Error> {
        let reply = self.redis.cmd(&[b"HGETALL", key.as_bytes()]).await?;
        Ok(reply
            .pairs()
            .filter_map(|(k, raw)| Some((k.to_owned(), serde_json::from_slice(raw).ok()?)))
            .collect())
    }

    /// The placement row of `id` in (env, ns), if any.
    pub async fn row(&self, env: &str, ns: &str, id: &str) -> Result<Option<PlacementRow>, Error> {
        let key = self
            .keys
            .placements(bucket_of(id, self.keys.shards()), env, ns);
        let reply = self
            .redis
            .cmd(&[b"HGET", key.as_bytes(), id.as_bytes()])
            .await?;
        Ok(reply.as_bytes().and_then(PlacementRow::decode))
    }

    /// The placement rows of (env, ns), bucket after bucket, a page at a time: one
    /// `HSCAN … COUNT 250` per [`RowPages::next`], never one read of a whole bucket. With
    /// `id_prefix`, only ids that start with it (`MATCH`; Redis still walks the same pages).
    pub fn row_pages<'s>(&'s self, env: &str, ns: &str, id_prefix: Option<&str>) -> RowPages<'s> {
        let pattern = id_prefix.map(|p| format!("{}*", glob_escape(p)));
        RowPages(self.hash_pages(Keys::placements, env, ns, pattern))
    }

    /// One step of a walk over the placement rows of (env, ns) that the caller keeps the place
    /// of: `HSCAN` of `bucket`'s hash from `cursor` (`"0"` starts it) with `COUNT count` (at
    /// most [`PAGE`]), only ids starting with `id_prefix` when given. The next cursor (`"0"`:
    /// the bucket is done) and the rows that decode; a row may come again in a later step of
    /// the same bucket (see [`Store::scan_page`]).
    pub async fn placement_step(
        &self,
        bucket: u32,
        env: &str,
        ns: &str,
        cursor: &str,
        id_prefix: Option<&str>,
        count: usize,
    ) -> Result<(String, Vec<(String, PlacementRow)>), Error> {
        let key = self.keys.placements(bucket, env, ns);
        let pattern = id_prefix.map(|p| format!("{}*", glob_escape(p)));
        let count = count.clamp(1, PAGE).to_string();
        let (next, fields) = self
            .scan_count(&key, cursor, pattern.as_deref(), &count)
            .await?;
        let rows = fields
            .into_iter()
            .filter_map(|(id, raw)| Some((id, PlacementRow::decode(&raw)?)))
            .collect();
        Ok((next, rows))
    }

    /// The overwritten markers of (env, ns), bucket after bucket, a page at a time, as
    /// (id, marker) pairs: the sweeper's walk of them.
    pub fn marker_pages<'s>(&'s self, env: &str, ns: &str) -> HashPages<'s> {
        self.hash_pages(Keys::overwritten, env, ns, None)
    }

    fn hash_pages<'s>(
        &'s self,
        hash: fn(&Keys, u32, &str, &str) -> KeyName,
        env: &str,
        ns: &str,
        pattern: Option<String>,
    ) -> HashPages<'s> {
        HashPages {
            store: self,
            hash,
            env: env.to_owned(),
            ns: ns.to_owned(),
            pattern,
            bucket: 0,
            key: hash(&self.keys, 0, env, ns),
            cursor: None,
            pace: false,
            started: None,
        }
    }

    /// One page of a hash: `HSCAN key cursor [MATCH pattern] COUNT 250` (cursor `"0"` starts;
    /// a next cursor of `"0"` ends the walk). A field may come in more than one page (Redis
    /// guarantees only that a field present for the whole walk comes at least once), so the
    /// caller deduplicates or does idempotent work.
    pub async fn scan_page(
        &self,
        key: &str,
        cursor: &str,
        pattern: Option<&str>,
    ) -> Result<(String, Vec<(String, Blob)>), Error> {
        self.scan_count(key, cursor, pattern, PAGE_STR).await
    }

    /// [`Store::scan_page`] with `COUNT count`.
    async fn scan_count(
        &self,
        key: &str,
        cursor: &str,
        pattern: Option<&str>,
        count: &str,
    ) -> Result<(String, Vec<(String, Blob)>), Error> {
        let mut args: Vec<&[u8]> = vec![b"HSCAN", key.as_bytes(), cursor.as_bytes()];
        if let Some(pattern) = pattern {
            args.extend([&b"MATCH"[..], pattern.as_bytes()]);
        }
        args.extend([&b"COUNT"[..], count.as_bytes()]);
        let reply = self.redis.cmd(&args).await?;
        let malformed = || Error::new(Origin::Internal, format!("HSCAN answered {reply:?}"));
        let [next, fields] = reply.as_array().ok_or_else(malformed)? else {
            return Err(malformed());
        };
        let next = next.as_str().ok_or_else(malformed)?.to_owned();
        let pairs = fields
            .as_array()
            .ok_or_else(malformed)?
            .chunks(2)
            .filter_map(|pair| match pair {
                [Reply::Bulk(field), Reply::Bulk(value)] => {
                    Some((std::str::from_utf8(field).ok()?.to_owned(), value.clone()))
                }
                _ => None,
            })
            .collect();
        Ok((next, pairs))
    }

    /// The copies of `sessions` in every bucket: per bucket, one entry per session (`None`
    /// where the bucket has none).
    pub async fn copies(&self, sessions: &[&str]) -> Result<Vec<Vec<Option<BucketCopy>>>, Error> {
        let reads = (0..self.keys.shards()).map(|b| {
            let mut args: Vec<&[u8]> = vec![b"HMGET", self.keys.bucket(b).workers.as_bytes()];
            args.extend(sessions.iter().map(|s| s.as_bytes()));
            async move { self.redis.cmd(&args).await }
        });
        let mut all = Vec::new();
        for copies in join_all(reads).await {
            all.push(
                copies?
                    .as_array()
                    .unwrap_or_default()
                    .iter()
                    .map(|c| c.as_bytes().and_then(|raw| BucketCopy::decode(raw).ok()))
                    .collect(),
            );
        }
        Ok(all)
    }

    /// How the owner of a row in `bucket` is reached, read from its copy there: `None` when
    /// the bucket has no live copy of the session (dropped, pruned, lost).
    pub async fn worker_of(
        &self,
        bucket: u32,
        session_id: &str,
    ) -> Result<Option<(String, String)>, Error> {
        let reply = self
            .redis
            .cmd(&[
                b"HGET",
                self.keys.bucket(bucket).workers.as_bytes(),
                session_id.as_bytes(),
            ])
            .await?;
        Ok(reply
            .as_bytes()
            .and_then(|raw| BucketCopy::decode(raw).ok())
            .filter(|copy| !copy.dropped)
            .map(|copy| (copy.advertise_url, copy.secret)))
    }

    /// Each bucket's cold-start stamp (ms), by bucket: `None` where it has none yet.
    pub async fn boot_times(&self) -> Result<Vec<Option<i64>>, Error> {
        let reads = (0..self.keys.shards()).map(|b| async move {
            let args: [&[u8]; 2] = [b"GET", self.keys.bucket(b).boot_time.as_bytes()];
            self.redis.cmd(&args).await
        });
        let mut stamps = Vec::new();
        for boot in join_all(reads).await {
            stamps.push(boot?.as_int());
        }
        Ok(stamps)
    }

    /// The fleet license in force (`fleet.lua` writes it), as stored; `None` while none is.
    pub async fn fleet_license(&self) -> Result<Option<String>, Error> {
        self.string_at(self.keys.fleet()).await
    }

    /// The string value of `key` (one `GET`); `None` where it has none.
    async fn string_at(&self, key: &str) -> Result<Option<String>, Error> {
        let reply = self.redis.cmd(&[b"GET", key.as_bytes()]).await?;
        Ok(reply.as_str().map(str::to_owned))
    }

    /// Fails unless every bucket's master answers (one read each, all in flight at once). A
    /// registration asks first, so that a master that is down, or that this node's slot map
    /// still names after a failover, makes it write nothing: not a session live in the other
    /// buckets, with the rows it reclaimed there, that its worker never learns of.
    pub async fn every_bucket_answers(&self) -> Result<(), Error> {
        self.boot_times().await.map(drop)
    }

    /// Queues `wind_downs` (control messages) to `session_id`; the worker gets them with its
    /// next heartbeat. At most [`SCRIPT_PAGE`] messages per script call.
    pub async fn push_wind_downs(
        &self,
        session_id: &str,
        wind_downs: &[WindDown<'_>],
    ) -> Result<(), Error> {
        let queue = self.keys.control(session_id);
        for messages in wind_downs.chunks(SCRIPT_PAGE) {
            let messages = serde_json::to_string(messages).expect("messages serialize");
            self.run_int(
                &CONTROL_PUSH,
                &[queue.as_bytes(), self.keys.control_seq().as_bytes()],
                &[self.lease.as_bytes(), messages.as_bytes()],
            )
            .await?;
        }
        Ok(())
    }

    /// Writes the session's copy into every bucket, all buckets in flight at once. With
    /// `reclaim` (a registration) it also prunes, drops the replaced session's copy and
    /// reclaims held ids; without (a heartbeat) it renews the copies, and writes back a copy
    /// a bucket lost (never one a deregister or a replacement dropped: that left a tombstone).
    pub async fn put_everywhere(
        &self,
        session: &Session,
        operator_draining: bool,
        reclaim: Option<&Reclaim<'_>>,
    ) -> Result<BucketOutcome, Error> {
        let record = session.bucket_copy(operator_draining).encode();
        let lists = session.list_names();
        let membership = serde_json::to_string(&lists).expect("list names serialize");
        let shards = self.keys.shards();
        let mut held: Vec<Vec<(&str, &str, &str)>> = vec![Vec::new(); shards as usize];
        if let Some(r) = reclaim {
            for (ns, ids) in r.instances {
                for id in ids {
                    let bucket = bucket_of(id, shards);
                    held[bucket as usize].push((session.env_of(ns), ns, id));
                }
            }
        }
        let (op, prev) = match reclaim {
            Some(r) => {
                let prev = r.prev_session.unwrap_or("");
                let replaces = r.replaces.unwrap_or("");
                (BucketOp::Put { replaces, prev }, prev)
            }
            None => (BucketOp::Renew, ""),
        };
        let copy = CopyWrite {
            session_id: &session.session_id,
            record: &record,
            membership: &membership,
            lists: &lists,
        };
        let calls = (0..shards).map(|b| self.write_copy(b, op, prev, &copy, &held[b as usize]));
        let mut total = BucketOutcome::default();
        for outcome in join_all(calls).await {
            total.add(outcome?);
        }
        Ok(total)
    }

    /// One bucket's share of [`Store::put_everywhere`], a page per script call: the copy with
    /// the first page of its lists (and, registering, of its held ids), then the other pages
    /// of lists to join, then those of ids to reclaim from `prev`. However many namespaces or
    /// ids a worker sends, no call holds Redis for more than a page's work.
    async fn write_copy(
        &self,
        bucket: u32,
        first: BucketOp<'_>,
        prev: &str,
        copy: &CopyWrite<'_>,
        held: &[(&str, &str, &str)],
    ) -> Result<BucketOutcome, Error> {
        let mut lists = copy.lists.chunks(SCRIPT_PAGE);
        let mut held = held.chunks(SCRIPT_PAGE);
        let call = |op, join, held| BucketCall {
            bucket,
            op,
            session_id: copy.session_id,
            record: copy.record,
            membership: copy.membership,
            join,
            held,
        };
        let first_held = match first {
            BucketOp::Put { .. } => held.next().unwrap_or_default(),
            _ => &[],
        };
        let mut total = self
            .bucket_worker(&call(first, lists.next().unwrap_or_default(), first_held))
            .await?;
        for page in lists {
            total.add(self.bucket_worker(&call(BucketOp::Join, page, &[])).await?);
        }
        for page in held {
            let reclaim = BucketOp::Reclaim { prev };
            total.add(self.bucket_worker(&call(reclaim, &[], page)).await?);
        }
        Ok(total)
    }

    /// The mirror poll's prune (contract §6): the session records dead for more than a lease
    /// and the bindings no live worker uses (`prune.lua`), then, in every bucket, the copies
    /// dead for more than a lease and their namespace-list entries. How many records went.
    pub async fn prune(&self) -> Result<u64, Error> {
        let keys = &self.keys;
        let pruned = self
            .run_int(
                &PRUNE,
                &[
                    keys.sessions().as_bytes(),
                    keys.clients().as_bytes(),
                    keys.bind_hosts().as_bytes(),
                    keys.bind_envs().as_bytes(),
                    keys.bind_quarantine().as_bytes(),
                ],
                &[self.lease.as_bytes()],
            )
            .await?;
        self.in_every_bucket(BucketOp::Prune, "").await?;
        Ok(pruned.try_into().unwrap_or(0))
    }

    /// Drops a session everywhere: its registry record, then its copy in every bucket. With
    /// `live`, a session whose lease ran out counts as unknown (and its record stays). False
    /// when the registry had no such (live) record.
    pub async fn drop_session(&self, session_id: &str, live: bool) -> Result<bool, Error> {
        #[derive(Deserialize)]
        struct Dropped {
            #[serde(default)]
            unknown: bool,
        }
        let live: &[u8] = if live { b"live" } else { b"" };
        let control = self.keys.control(session_id);
        let dropped: Dropped = self
            .run(
                &SESSION_DROP,
                &[
                    self.keys.sessions().as_bytes(),
                    self.keys.clients().as_bytes(),
                    control.as_bytes(),
                ],
                &[session_id.as_bytes(), live],
            )
            .await?;
        // Copies go even when the registry had no (live) record: dropping is idempotent, and
        // a copy written by a request that raced the record's removal must not outlive it.
        self.in_every_bucket(BucketOp::Drop, session_id).await?;
        Ok(!dropped.unknown)
    }

    /// A drop of `session_id`'s copy, or the prune, in every bucket at once.
    async fn in_every_bucket(&self, op: BucketOp<'_>, session_id: &str) -> Result<(), Error> {
        let calls = (0..self.keys.shards()).map(|b| {
            let call = BucketCall {
                bucket: b,
                op,
                session_id,
                record: "",
                membership: "",
                join: &[],
                held: &[],
            };
            async move { self.bucket_worker(&call).await }
        });
        for outcome in join_all(calls).await {
            outcome?;
        }
        Ok(())
    }

    /// The namespace lists of the copies a call may drop, as the bucket records them: every
    /// copy's (`None`: a registration's or the mirror poll's prune) or one session's.
    async fn member_lists(
        &self,
        bucket: &BucketKeys,
        session: Option<&str>,
    ) -> Result<Vec<String>, Error> {
        let (copies, entries) = match session {
            // One `HVALS` each: a bucket holds one copy per worker session (tombstones and
            // expired copies until pruned), not one per placement.
            None => {
                join(
                    self.redis.cmd(&[b"HVALS", bucket.workers.as_bytes()]),
                    self.redis.cmd(&[b"HVALS", bucket.memberships.as_bytes()]),
                )
                .await
            }
            Some(id) => {
                join(
                    self.redis
                        .cmd(&[b"HGET", bucket.workers.as_bytes(), id.as_bytes()]),
                    self.redis
                        .cmd(&[b"HGET", bucket.memberships.as_bytes(), id.as_bytes()]),
                )
                .await
            }
        };
        let (copies, entries) = (copies?, entries?);
        fn values(reply: &Reply) -> impl Iterator<Item = &[u8]> {
            let many = reply.as_array().unwrap_or_default().iter();
            many.filter_map(Reply::as_bytes).chain(reply.as_bytes())
        }
        let mut names: Vec<String> = values(&entries)
            .filter_map(|raw| serde_json::from_slice::<Vec<String>>(raw).ok())
            .flatten()
            .collect();
        names.extend(
            values(&copies)
                .filter_map(|raw| BucketCopy::decode(raw).ok())
                .flat_map(|copy| copy.legacy_list_names()),
        );
        Ok(names)
    }

    /// One bucket's `bucket_worker.lua`. The namespace lists of the copies it may drop are
    /// keys it must declare, so they are read first; when the copies changed in between, the
    /// script writes nothing and answers `stale`, and the bucket is read again.
    async fn bucket_worker(&self, call: &BucketCall<'_>) -> Result<BucketOutcome, Error> {
        let keys = &self.keys;
        let bucket = keys.bucket(call.bucket);
        let (op, prune, replaces, prev) = match call.op {
            BucketOp::Put { replaces, prev } => ("put", "prune", replaces, prev),
            BucketOp::Renew => ("renew", "", "", ""),
            BucketOp::Join => ("join", "", "", ""),
            BucketOp::Reclaim { prev } => ("reclaim", "", "", prev),
            BucketOp::Drop => ("drop", "", "", ""),
            BucketOp::Prune => ("prune", "prune", "", ""),
        };
        // The reclaimed ids' placements hashes, each declared once.
        let mut placements: BTreeMap<(&str, &str), usize> = BTreeMap::new();
        for (env, ns, _) in call.held {
            let next = placements.len();
            placements.entry((env, ns)).or_insert(next);
        }
        let joined = serde_json::to_string(call.join).expect("list names serialize");
        for _ in 0..STALE_RETRIES {
            // The lists this call may touch: those it joins, and those of every copy in the
            // bucket it may drop (all of them when it prunes, else the named sessions').
            let mut names: Vec<String> = call.join.to_vec();
            match call.op {
                BucketOp::Put { .. } | BucketOp::Prune => {
                    names.extend(self.member_lists(bucket, None).await?);
                }
                BucketOp::Drop => {
                    names.extend(self.member_lists(bucket, Some(call.session_id)).await?);
                }
                BucketOp::Renew | BucketOp::Join | BucketOp::Reclaim { .. } => {}
            }
            names.sort();
            names.dedup();
            let lists: Vec<KeyName> = names
                .iter()
                .map(|name| keys.nsw_named(call.bucket, name))
                .collect();
            let placement_keys: Vec<KeyName> = placements
                .keys()
                .map(|(env, ns)| keys.placements(call.bucket, env, ns))
                .collect();
            let mut declared: Vec<&[u8]> = vec![
                bucket.workers.as_bytes(),
                bucket.alive.as_bytes(),
                bucket.memberships.as_bytes(),
            ];
            declared.extend(self.ledger_keys(call.bucket));
            declared.extend(lists.iter().map(|k| k.as_bytes()));
            declared.extend(placement_keys.iter().map(|k| k.as_bytes()));
            // Lua's KEYS are 1-based: the placements hashes follow the 5 fixed keys and the
            // lists.
            let first_placements = 6 + lists.len();
            let held: Vec<(usize, &str, &str, &str)> = call
                .held
                .iter()
                .map(|(env, ns, id)| {
                    let index = first_placements + placements[&(*env, *ns)];
                    (index, *env, *ns, *id)
                })
                .collect();
            let held = serde_json::to_string(&held).expect("held ids serialize");
            let names = serde_json::to_string(&names).expect("list names serialize");
            let args: [&[u8]; 12] = [
                op.as_bytes(),
                call.session_id.as_bytes(),
                call.record.as_bytes(),
                self.lease.as_bytes(),
                prune.as_bytes(),
                replaces.as_bytes(),
                prev.as_bytes(),
                held.as_bytes(),
                names.as_bytes(),
                call.membership.as_bytes(),
                joined.as_bytes(),
                self.ledger.as_bytes(),
            ];
            let outcome: BucketOutcome = self.run(&BUCKET_WORKER, &declared, &args).await?;
            if !outcome.stale {
                return Ok(outcome);
            }
        }
        Err(Error::new(
            Origin::Redis,
            format!(
                "bucket {}: worker copies kept changing under a write",
                call.bucket
            ),
        )
        .retryable(true))
    }
}

/// How many fields one page of a hash walk asks for (`HSCAN … COUNT`): no single Redis call
/// touches more than about a page of a structure that grows with placements, whatever the
/// fleet's size (contract §6). Over buckets of 62,500 rows (a million placements, 16 shards)
/// Redis spends 1.5–2 µs a field on this 2-core machine while it serves the data plane: a
/// page of 1000 took 1.6–2 ms (p99 4.5 ms), one of 250 takes about half a millisecond.
pub const PAGE: usize = 250;
const PAGE_STR: &str = "250";

/// The most rows (or messages) one script call gets. A script's work per row (a read, a JSON
/// decode and encode, a write) costs Redis some 5–10 µs, several times what HSCAN spends on a
/// field, and grows faster than linearly past a few hundred: on the project's (busy) 2-core
/// machine 100 rows took a `wind_down.lua` call 0.5–1 ms, 1000 rows 10–15 ms.
pub const SCRIPT_PAGE: usize = 100;
const SCRIPT_PAGE_STR: &str = "100";

/// A walk over one hash of (env, ns) in every bucket, bucket by bucket: the placements
/// ([`Store::row_pages`]) or the overwritten markers ([`Store::marker_pages`]).
pub struct HashPages<'s> {
    store: &'s Store,
    /// Which hash of a bucket.
    hash: fn(&Keys, u32, &str, &str) -> KeyName,
    env: String,
    ns: String,
    pattern: Option<String>,
    bucket: u32,
    /// The bucket's hash.
    key: KeyName,
    /// Where the bucket's walk stands: `None` before its first page.
    cursor: Option<String>,
    /// Paced ([`HashPages::paced`]): when the page before was asked for.
    pace: bool,
    started: Option<Instant>,
}

/// The longest a paced walk waits before a page.
const MAX_PACE: Duration = Duration::from_millis(20);

/// One page of a hash, all of one bucket.
pub struct Page<T> {
    pub bucket: u32,
    /// An entry may come again in a later page of the same bucket (never in another
    /// bucket's).
    pub entries: Vec<T>,
}

impl HashPages<'_> {
    /// A walk that takes at most about half of the time it runs for: before each page it
    /// waits as long as the page before took (its HSCAN and what the caller did with it, up
    /// to 20 ms). For a walk in the background of the data plane (the overview, the
    /// sweeper): one asking for page after page would take a core's worth of the node and of
    /// Redis.
    pub fn paced(mut self) -> Self {
        self.pace = true;
        self
    }

    /// The next page with at least one field, or `None` once every bucket has been walked.
    pub async fn next(&mut self) -> Result<Option<Page<(String, Blob)>>, Error> {
        let shards = self.store.keys.shards();
        while self.bucket < shards {
            if self.pace {
                if let Some(started) = self.started {
                    monoio::time::sleep(started.elapsed().min(MAX_PACE)).await;
                }
                self.started = Some(Instant::now());
            }
            let cursor = self.cursor.as_deref().unwrap_or("0");
            let (next, entries) = self
                .store
                .scan_page(&self.key, cursor, self.pattern.as_deref())
                .await?;
            let bucket = self.bucket;
            if next == "0" {
                self.bucket += 1;
                self.cursor = None;
                if self.bucket < shards {
                    self.key = (self.hash)(&self.store.keys, self.bucket, &self.env, &self.ns);
                }
            } else {
                self.cursor = Some(next);
            }
            if !entries.is_empty() {
                return Ok(Some(Page { bucket, entries }));
            }
        }
        Ok(None)
    }
}

/// A walk over the placement rows of one (env, ns), bucket by bucket ([`Store::row_pages`]).
pub struct RowPages<'s>(HashPages<'s>);

impl RowPages<'_> {
    /// See [`HashPages::paced`].
    pub fn paced(self) -> Self {
        RowPages(self.0.paced())
    }

    /// The next page with at least one row, as (id, row); rows that do not decode are left
    /// out. `None` once every bucket has been walked.
    pub async fn next(&mut self) -> Result<Option<Page<(String, PlacementRow)>>, Error> {
        while let Some(page) = self.0.next().await? {
            let entries: Vec<(String, PlacementRow)> = page
                .entries
                .into_iter()
                .filter_map(|(id, raw)| Some((id, PlacementRow::decode(&raw)?)))
                .collect();
            if !entries.is_empty() {
                return Ok(Some(Page {
                    bucket: page.bucket,
                    entries,
                }));
            }
        }
        Ok(None)
    }
}

/// `text` as a glob pattern matching itself only (`HSCAN … MATCH`).
fn glob_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

fn decode_session(raw: &[u8]) -> Result<Session, Error> {
    Session::decode(raw).map_err(|e| Error::because(Origin::Internal, "stored session", e))
}

#[derive(Clone, Copy)]
enum BucketOp<'a> {
    Put {
        replaces: &'a str,
        prev: &'a str,
    },
    Renew,
    /// A further page of the copy's lists to join.
    Join,
    /// A further page of held ids to reclaim from `prev`.
    Reclaim {
        prev: &'a str,
    },
    Drop,
    /// The mirror poll's: only the prune of copies dead for more than a lease.
    Prune,
}

/// A session's copy as [`Store::put_everywhere`] writes it in each bucket.
struct CopyWrite<'a> {
    session_id: &'a str,
    /// The copy (JSON).
    record: &'a str,
    /// Its membership entry: JSON of `lists`.
    membership: &'a str,
    /// Every namespace list it joins.
    lists: &'a [String],
}

struct BucketCall<'a> {
    bucket: u32,
    op: BucketOp<'a>,
    session_id: &'a str,
    /// The copy (JSON) a put or renew writes; empty otherwise.
    record: &'a str,
    /// The copy's membership entry a put or renew writes; empty otherwise.
    membership: &'a str,
    /// The lists this call joins (a page).
    join: &'a [String],
    /// (env, ns, id) held in this bucket, to reclaim (a page).
    held: &'a [(&'a str, &'a str, &'a str)],
}

/// What `put_everywhere` found across the buckets.
#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BucketOutcome {
    #[serde(default, deserialize_with = "lua_list")]
    pub duplicates: Vec<(String, String)>,
    /// (ns, id, wind-down expiry ms, whether a move's) of reclaimed rows under a wind-down.
    #[serde(default, deserialize_with = "lua_list")]
    pub wind_downs: Vec<(String, String, u64, bool)>,
    /// How many buckets had lost the copy and got it back (per bucket: 0 or 1).
    #[serde(default, deserialize_with = "healed")]
    pub healed: usize,
    #[serde(default)]
    stale: bool,
}

impl BucketOutcome {
    fn add(&mut self, other: BucketOutcome) {
        self.duplicates.extend(other.duplicates);
        self.wind_downs.extend(other.wind_downs);
        self.healed += other.healed;
    }
}

fn healed<'de, D: serde::Deserializer<'de>>(de: D) -> Result<usize, D::Error> {
    Ok(usize::from(bool::deserialize(de)?))
}

/// What a registration asks of every bucket besides writing the worker's copy.
pub struct Reclaim<'a> {
    pub replaces: Option<&'a str>,
    pub prev_session: Option<&'a str>,
    /// Ids held per namespace.
    pub instances: &'a BTreeMap<String, Vec<String>>,
}

#[cfg(test)]
mod tests {
    #[test]
    fn page_sizes_are_spelled_as_they_are() {
        assert_eq!(super::PAGE.to_string(), super::PAGE_STR);
        assert_eq!(super::SCRIPT_PAGE.to_string(), super::SCRIPT_PAGE_STR);
    }

    #[test]
    fn an_id_prefix_matches_itself_only() {
        assert_eq!(super::glob_escape("H~a.b-1_"), "H~a.b-1_");
        assert_eq!(super::glob_escape(r"a*b?[c]\d"), r"a\*b\?\[c\]\\d");
    }

    /// The layout has one home: no Rust file outside `src/store/` spells a key of it, nor one
    /// of the crates split out of `src/` (`http1/`, `protocol/`).
    #[test]
    fn no_key_is_named_outside_the_store() {
        // A key is a prefix (`…}`) with a name after it, a hash tag, or the literal suffix the
        // store concatenates after a namespace (quoted, so `Waker::wake` is no hit).
        let fragments = [
            "{r}",
            "}sessions",
            "}clients",
            "}control:",
            "}drain:",
            "}bind:",
            "}fleet",
            "}members",
            "}sweeper",
            "}workers",
            "}alive",
            "}nsw:",
            "}boot_time",
            "}epoch",
            "\":placements\"",
            "\":overwritten\"",
            "\":wake\"",
            "}ledger",
        ];
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut stack = vec![
            root.join("src"),
            root.join("http1/src"),
            root.join("protocol/src"),
        ];
        let mut checked = 0;
        while let Some(path) = stack.pop() {
            if path.ends_with("store") {
                continue;
            }
            if path.is_dir() {
                stack.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                for fragment in fragments {
                    assert!(
                        !text.contains(fragment),
                        "{} names {fragment}",
                        path.display()
                    );
                }
                checked += 1;
            }
        }
        assert!(checked > 50, "{checked} files");
    }
}
