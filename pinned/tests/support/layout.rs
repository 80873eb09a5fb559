//! The node's Redis layout as worker tests need it (shared by `pinned`'s and `pinned-tower`'s
//! integration tests): its key names, and the end of the registry's cold start.

use super::redis::RedisServer;

/// The node's buckets by default (`shards`): the tests' nodes keep it.
pub const SHARDS: u32 = 16;

/// The names of the node's Redis keys, as it names them by default.
pub fn keys() -> pinboard::store::Keys {
    pinboard::store::Keys::new("pinboard:", SHARDS)
}

/// Ends the registry's cold start in every bucket before any request starts it: a bucket's
/// window runs one lease from its `boot_time`, set here to the Unix epoch.
pub fn end_cold_start(redis: &RedisServer) {
    for bucket in 0..SHARDS {
        redis.cli(&["SET", &keys().bucket(bucket).boot_time, "0"]);
    }
}
