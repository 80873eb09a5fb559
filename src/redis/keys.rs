//! The Redis key layout: which bucket an instance id falls in, and the names of the keys of a
//! bucket. Every key of a bucket carries the bucket number as a Redis Cluster hash tag
//! (`{3}`), so that one script can touch all of them on one node.

use sha2::{Digest, Sha256};

/// The placement bucket of an instance id: the first 8 hex digits of sha256(id), i.e. the first
/// four digest bytes read big-endian, modulo `shards` (≥ 1).
pub fn bucket_of(id: &str, shards: u32) -> u32 {
    let digest = Sha256::digest(id.as_bytes());
    u32::from_be_bytes([digest[0], digest[1], digest[2], digest[3]]) % shards
}

/// Key names under the configured prefix. Built once per core: the per-bucket prefixes are
/// formatted up front so requests only borrow them.
#[derive(Clone, Debug)]
pub struct Keys {
    prefix: String,
    registry: String,
    buckets: Vec<String>,
    fixed: Vec<BucketKeys>,
}

impl Keys {
    pub fn new(prefix: impl Into<String>, shards: u32) -> Keys {
        let prefix = prefix.into();
        let buckets: Vec<String> = (0..shards).map(|b| format!("{prefix}{{{b}}}:")).collect();
        Keys {
            registry: format!("{prefix}{{r}}:"),
            fixed: buckets
                .iter()
                .map(|b| BucketKeys {
                    workers: format!("{b}workers"),
                    boot_time: format!("{b}boot_time"),
                    epoch: format!("{b}epoch"),
                })
                .collect(),
            buckets,
            prefix,
        }
    }

    /// The prefix of every key of the registry slot (sessions, clients, control queues,
    /// bindings, drains): scripts that touch only these run on one node.
    pub fn registry(&self) -> &str {
        &self.registry
    }

    /// The prefix of every key of one bucket (worker copies, namespace lists, placements).
    pub fn bucket(&self, bucket: u32) -> &str {
        &self.buckets[bucket as usize]
    }

    pub fn shards(&self) -> u32 {
        self.buckets.len() as u32
    }

    /// The placements hash of (bucket, env, namespace): field = instance id.
    pub fn placements(&self, bucket: u32, env: &str, ns: &str) -> String {
        format!("{}{{{bucket}}}:{env}:{ns}:placements", self.prefix)
    }

    /// The overwritten hash of (bucket, env, namespace): id → epoch of the row a re-placement
    /// displaced.
    pub fn overwritten(&self, bucket: u32, env: &str, ns: &str) -> String {
        format!("{}{{{bucket}}}:{env}:{ns}:overwritten", self.prefix)
    }

    /// The namespace list of `{hostname}{ns}` in a bucket (`hostname` is `""` in single mode).
    pub fn nsw(&self, bucket: u32, hostname: &str, ns: &str) -> String {
        format!("{}{{{bucket}}}:nsw:{hostname}{ns}", self.prefix)
    }

    /// A bucket's fixed keys, formatted once: its worker copies, its cold-start stamp and its
    /// epoch counter.
    pub fn bucket_keys(&self, bucket: u32) -> &BucketKeys {
        &self.fixed[bucket as usize]
    }
}

/// The keys every bucket has exactly one of.
#[derive(Clone, Debug)]
pub struct BucketKeys {
    pub workers: String,
    pub boot_time: String,
    pub epoch: String,
}

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
    fn placements_key_tags_the_bucket() {
        let keys = Keys::new("pinboard:", 16);
        assert_eq!(keys.bucket(3), "pinboard:{3}:");
        assert_eq!(keys.registry(), "pinboard:{r}:");
        assert_eq!(
            keys.placements(3, "default", "/threads"),
            "pinboard:{3}:default:/threads:placements"
        );
        // The hash tag is the bucket alone, whatever the prefix: one bucket, one slot.
        assert_eq!(
            redis_protocol::redis_keyslot(keys.placements(3, "default", "/a").as_bytes()),
            redis_protocol::redis_keyslot(b"{3}")
        );
    }
}
