//! [`FencedRedis`]: values in Redis fenced by placement epoch, a compare-and-set script on the
//! `redis` client.

use pinboard_protocol::worker::fencing::{Fence, FencedError, REDIS_COMPARE_AND_SET, StaleEpoch};
use redis::{ConnectionLike, RedisError, RedisResult, Script};

/// Values in Redis, each key a hash of `value` and `epoch` (the writer's, as digits), replaced
/// only by a writer at that epoch or a higher one.
///
/// A write runs [`REDIS_COMPARE_AND_SET`] by `EVALSHA` (loaded with `EVAL` the first time a
/// server lacks it), the key declared in `KEYS` (so it runs on a cluster too): the check and
/// the write are one script, atomic in Redis, and epochs compare as digit strings (length, then
/// bytes), exactly at any size.
///
/// ```no_run
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use pinned::fencing::FencedRedis;
/// use pinned::{Fence, FencedError};
///
/// let mut conn = redis::Client::open("redis://127.0.0.1:6379")?.get_connection()?;
/// let notes = FencedRedis::new();
/// let fence = Fence::parse("1700000000123").unwrap(); // Fence::from(instance) in a request
/// match notes.write(&mut conn, "notes:/threads/a", &fence, b"hello") {
///     Ok(()) => {}
///     Err(FencedError::Stale(stale)) => eprintln!("{stale}"),
///     Err(FencedError::Store(e)) => return Err(e.into()),
/// }
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct FencedRedis {
    script: Script,
}

impl Default for FencedRedis {
    fn default() -> FencedRedis {
        FencedRedis::new()
    }
}

impl FencedRedis {
    pub fn new() -> FencedRedis {
        FencedRedis {
            script: Script::new(REDIS_COMPARE_AND_SET),
        }
    }

    /// Writes `key`'s value as the owner at `fence`, unless the key holds a higher epoch
    /// ([`FencedError::Stale`], naming it; nothing changes).
    pub fn write(
        &self,
        conn: &mut dyn ConnectionLike,
        key: &str,
        fence: &Fence,
        value: &[u8],
    ) -> Result<(), FencedError<RedisError>> {
        let (written, epoch): (u8, String) = self
            .script
            .key(key)
            .arg(fence.as_str())
            .arg(value)
            .invoke(conn)
            .map_err(FencedError::Store)?;
        if written == 1 {
            return Ok(());
        }
        let stored = stored_epoch(&epoch).map_err(FencedError::Store)?;
        let offered = fence.clone();
        Err(StaleEpoch { stored, offered }.into())
    }

    /// `key`'s value and the epoch that wrote it, `None` for a key never written.
    pub fn read(
        &self,
        conn: &mut dyn ConnectionLike,
        key: &str,
    ) -> RedisResult<Option<(Vec<u8>, Fence)>> {
        let (value, epoch): (Option<Vec<u8>>, Option<String>) = redis::cmd("HMGET")
            .arg(key)
            .arg("value")
            .arg("epoch")
            .query(conn)?;
        match (value, epoch) {
            (Some(value), Some(epoch)) => Ok(Some((value, stored_epoch(&epoch)?))),
            _ => Ok(None),
        }
    }
}

/// An epoch the script stored: digits, or the key was written by something else.
fn stored_epoch(epoch: &str) -> RedisResult<Fence> {
    Fence::parse(epoch).ok_or_else(|| {
        let detail = format!("the stored epoch {epoch:?} is not digits");
        RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "not a fenced value",
            detail,
        ))
    })
}
