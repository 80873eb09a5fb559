//! The Redis key layout: which bucket an instance id falls in, and the name of every key the
//! node reads or writes. This is the only place a key name is spelled; the scripts get theirs
//! in `KEYS`, the tests ask the same [`Keys`].
//!
//! Two kinds of slot, each a Redis Cluster hash tag so that one script touches one slot:
//! the registry's `{prefix}{r}:` and one per placement bucket, `{prefix}{b}:`.

use sha2::{Digest, Sha256};

use crate::text::InlineStr;

/// The placement bucket of an instance id: the first 8 hex digits of sha256(id), i.e. the first
/// four digest bytes read big-endian, modulo `shards` (≥ 1).
pub fn bucket_of(id: &str, shards: u32) -> u32 {
    let digest = Sha256::digest(id.as_bytes());
    u32::from_be_bytes([digest[0], digest[1], digest[2], digest[3]]) % shards
}

/// Key names under the configured prefix. Built once per core: the fixed keys are formatted
/// up front so requests only borrow them.
#[derive(Clone, Debug)]
pub struct Keys {
    registry: String,
    buckets: Vec<String>,
    fixed: Vec<BucketKeys>,
    sessions: String,
    clients: String,
    control_seq: String,
    bind_hosts: String,
    bind_envs: String,
    bind_quarantine: String,
    fleet: String,
    members: String,
    sweeper: String,
    namespaces: String,
}

/// The keys every bucket has exactly one of.
#[derive(Clone, Debug)]
pub struct BucketKeys {
    /// Hash: sessionId → the worker's copy ([`super::BucketCopy`]).
    pub workers: String,
    /// Hash: sessionId → `{expiry ms} {hostname}`, what a steady resolve reads of an owner
    /// (its liveness, and its hostname in hostname-aware mode) without decoding its copy.
    pub alive: String,
    /// Hash: sessionId → JSON list of the `{hostname}{ns}` namespace lists its copy is a
    /// member of (read by `bucket_worker.lua` only: the copy a resolve decodes holds none).
    pub memberships: String,
    /// The bucket's cold-start stamp (ms), set by its first resolve.
    pub boot_time: String,
    /// The bucket's placement epoch counter.
    pub epoch: String,
    /// Stream: the ownership ledger, one entry per change of an id's owner or fence in the
    /// bucket (`lua/prelude.lua`'s `ledger_append`), capped near
    /// `ledger.max_entries_per_bucket` entries.
    pub ledger: String,
    /// Hash: `{env}\0{ns}\0{id}` (NUL between the three, which none of them holds) → the
    /// stream ID of that id's newest ledger entry, where the chain of its entries starts.
    pub ledger_last: String,
}

impl Keys {
    pub fn new(prefix: impl Into<String>, shards: u32) -> Keys {
        let prefix = prefix.into();
        let registry = format!("{prefix}{{r}}:");
        let buckets: Vec<String> = (0..shards).map(|b| format!("{prefix}{{{b}}}:")).collect();
        let at = |name: &str| format!("{registry}{name}");
        Keys {
            fixed: buckets
                .iter()
                .map(|b| BucketKeys {
                    workers: format!("{b}workers"),
                    alive: format!("{b}alive"),
                    memberships: format!("{b}memberships"),
                    boot_time: format!("{b}boot_time"),
                    epoch: format!("{b}epoch"),
                    ledger: format!("{b}ledger"),
                    ledger_last: format!("{b}ledger:last"),
                })
                .collect(),
            sessions: at("sessions"),
            clients: at("clients"),
            control_seq: at("control:seq"),
            bind_hosts: at("bind:hosts"),
            bind_envs: at("bind:envs"),
            bind_quarantine: at("bind:quarantine"),
            fleet: at("fleet"),
            members: at("members"),
            sweeper: at("sweeper"),
            namespaces: at("namespaces"),
            buckets,
            registry,
        }
    }

    pub fn shards(&self) -> u32 {
        self.buckets.len() as u32
    }

    // The registry slot.

    /// Hash: sessionId → the session's master record ([`super::Session`]).
    pub fn sessions(&self) -> &str {
        &self.sessions
    }

    /// Hash: clientId → [`super::ClientRecord`] (its account and live session).
    pub fn clients(&self) -> &str {
        &self.clients
    }

    /// Hash: message id → control message queued for a session; expires two leases after its
    /// last write or peek.
    pub fn control(&self, session_id: &str) -> String {
        format!("{}control:{session_id}", self.registry)
    }

    /// The counter control message ids are drawn from.
    pub fn control_seq(&self) -> &str {
        &self.control_seq
    }

    /// An operator drain of a client ([`super::Drain`]).
    pub fn drain(&self, client_id: &str) -> String {
        format!("{}drain:{client_id}", self.registry)
    }

    /// Hash: `{hostname}{ns}` → [`super::HostBinding`].
    pub fn bind_hosts(&self) -> &str {
        &self.bind_hosts
    }

    /// Hash: env → [`super::EnvBinding`].
    pub fn bind_envs(&self) -> &str {
        &self.bind_envs
    }

    /// Hash: `{hostname}{ns}` → ms until which a displaced binding takes no new placements.
    pub fn bind_quarantine(&self) -> &str {
        &self.bind_quarantine
    }

    /// The fleet license (one lease TTL, renewed by its holders).
    pub fn fleet(&self) -> &str {
        &self.fleet
    }

    /// Hash: node id → its license and expiry.
    pub fn members(&self) -> &str {
        &self.members
    }

    /// The sweeper's lease (contract §6): one node holds it.
    pub fn sweeper(&self) -> &str {
        &self.sweeper
    }

    /// Hash: an (env, namespace) pair ([`super::pair_field`]) → how many registrations have
    /// named it. Every pair a worker registered, so that the sweeper still walks its rows once
    /// no session record names it (its last worker pruned); forgotten by the sweeper once it
    /// holds nothing.
    pub fn namespaces(&self) -> &str {
        &self.namespaces
    }

    // One bucket's slot.

    /// A bucket's fixed keys, formatted once.
    pub fn bucket(&self, bucket: u32) -> &BucketKeys {
        &self.fixed[bucket as usize]
    }

    /// Set: the sessions serving `{hostname}{ns}` in a bucket (`hostname` is `""` in single
    /// mode).
    pub fn nsw(&self, bucket: u32, hostname: &str, ns: &str) -> KeyName {
        KeyName::concat(&[&self.buckets[bucket as usize], "nsw:", hostname, ns])
    }

    /// The same list by its name, `{hostname}{ns}` ([`super::Session::list_names`]).
    pub fn nsw_named(&self, bucket: u32, name: &str) -> KeyName {
        KeyName::concat(&[&self.buckets[bucket as usize], "nsw:", name])
    }

    /// Hash: id → [`super::PlacementRow`] of (bucket, env, namespace).
    pub fn placements(&self, bucket: u32, env: &str, ns: &str) -> KeyName {
        KeyName::concat(&[&self.buckets[bucket as usize], env, ":", ns, ":placements"])
    }

    /// Hash: id → epoch of the row a re-placement displaced, until the new owner serves.
    pub fn overwritten(&self, bucket: u32, env: &str, ns: &str) -> KeyName {
        KeyName::concat(&[&self.buckets[bucket as usize], env, ":", ns, ":overwritten"])
    }

    /// Sorted set: id → due time (ms) of its scheduled wake (contract §7).
    pub fn wake(&self, bucket: u32, env: &str, ns: &str) -> KeyName {
        KeyName::concat(&[&self.buckets[bucket as usize], env, ":", ns, ":wake"])
    }
}

/// A key name that names an env, namespace or hostname, built per call on the stack when it
/// fits (as it does for any sane name): the data plane names three of them per resolve, and a
/// `String` each was three heap allocations per request.
pub type KeyName = InlineStr<128>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_is_sha256_prefix_mod_shards() {
        // echo -n thread-42 | sha256sum → 07e73d10…; echo -n abc | sha256sum → ba7816bf…
        assert_eq!(bucket_of("thread-42", u32::MAX), 0x07e7_3d10);
        assert_eq!(bucket_of("thread-42", 16), 0x07e7_3d10 % 16);
        assert_eq!(bucket_of("thread-42", 7), 1);
        assert_eq!(bucket_of("abc", 16), 15);
        assert_eq!(bucket_of("abc", 1), 0);
        assert_eq!(bucket_of("", 16384), 0xe3b0_c442 % 16384);
    }

    #[test]
    fn every_key_of_a_slot_carries_its_tag() {
        let keys = Keys::new("pinboard:", 16);
        assert_eq!(
            keys.placements(3, "default", "/threads"),
            "pinboard:{3}:default:/threads:placements"
        );
        assert_eq!(keys.nsw(3, "", "/threads"), "pinboard:{3}:nsw:/threads");
        assert_eq!(keys.bucket(3).workers, "pinboard:{3}:workers");
        assert_eq!(keys.sessions(), "pinboard:{r}:sessions");
        assert_eq!(keys.control("s1"), "pinboard:{r}:control:s1");
        assert_eq!(keys.drain("c1"), "pinboard:{r}:drain:c1");
        let slot = |k: &str| redis_protocol::redis_keyslot(k.as_bytes());
        // The hash tag is the bucket alone, whatever the prefix: one bucket, one slot.
        for key in [
            keys.placements(3, "default", "/a").to_string(),
            keys.overwritten(3, "e", "/a").to_string(),
            keys.nsw(3, "h.example", "/a").to_string(),
            keys.wake(3, "e", "/a").to_string(),
            keys.bucket(3).epoch.clone(),
            keys.bucket(3).alive.clone(),
            keys.bucket(3).memberships.clone(),
            keys.bucket(3).boot_time.clone(),
            keys.bucket(3).ledger.clone(),
            keys.bucket(3).ledger_last.clone(),
        ] {
            assert_eq!(slot(&key), slot("{3}"), "{key}");
        }
        for key in [
            keys.sessions(),
            keys.clients(),
            keys.control("x").as_str(),
            keys.control_seq(),
            keys.drain("c").as_str(),
            keys.bind_hosts(),
            keys.bind_envs(),
            keys.bind_quarantine(),
            keys.fleet(),
            keys.members(),
            keys.sweeper(),
            keys.namespaces(),
        ] {
            assert_eq!(slot(key), slot("{r}"), "{key}");
        }
    }
}
