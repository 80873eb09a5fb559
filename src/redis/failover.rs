//! Failover detection: which server a master connection found at its address each time it
//! connected (the server's `run_id` and replication `role`), and the hash slots whose master
//! changed under this core since the placement path last looked ([`FailedOver`]).
//!
//! A different `run_id` at the same address is a restarted server or a promoted replica put
//! in its place; a changed `role` is a replica promoted (or a master demoted) in place. Either
//! way writes the old master acknowledged may be gone: what the placement path does about it
//! is `crate::placement::strict`'s.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::io;
use std::time::Instant;

use redis_protocol::redis_keyslot;

use super::connection::Connection;
use super::{RedisError, Reply};

/// Who answered at an address: the server's `run_id` (new at every start) and `role`
/// (`master`, `slave`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Identity {
    run_id: String,
    role: String,
}

impl Identity {
    /// `INFO server` and `INFO replication` on a freshly opened connection. `Ok(Err(_))`: the
    /// server would not say (an ACL without `INFO`), so no failover can be seen there.
    pub(crate) async fn ask(conn: &mut Connection) -> io::Result<Result<Identity, RedisError>> {
        let server = match conn.request(&[b"INFO", b"server"]).await? {
            Ok(reply) => reply,
            Err(e) => return Ok(Err(e)),
        };
        let replication = match conn.request(&[b"INFO", b"replication"]).await? {
            Ok(reply) => reply,
            Err(e) => return Ok(Err(e)),
        };
        let field =
            |reply: &Reply, name: &str| info_field(reply.as_str()?, name).map(str::to_owned);
        Ok(
            match (field(&server, "run_id"), field(&replication, "role")) {
                (Some(run_id), Some(role)) => Ok(Identity { run_id, role }),
                _ => Err(RedisError::Protocol(
                    "INFO has no run_id or role field".into(),
                )),
            },
        )
    }
}

/// The value of `name:value` in an INFO text.
fn info_field<'a>(info: &'a str, name: &str) -> Option<&'a str> {
    info.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
        .map(str::trim)
}

/// Redis's clock (`TIME`) in ms, asked on the connection that saw the failover: when the
/// quarantine it starts begins.
pub(crate) async fn server_time_ms(conn: &mut Connection) -> io::Result<Option<i64>> {
    let Ok(reply) = conn.request(&[b"TIME"]).await? else {
        return Ok(None);
    };
    let parts = reply.as_array().unwrap_or_default();
    let (Some(secs), Some(micros)) = (
        parts.first().and_then(Reply::as_int),
        parts.get(1).and_then(Reply::as_int),
    ) else {
        return Ok(None);
    };
    Ok(Some(secs * 1000 + micros / 1000))
}

/// Failovers seen and not yet handed to the placement path.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FailedOver {
    /// Every slot (a single server failed over).
    everywhere: bool,
    slots: BTreeSet<u16>,
    /// When the latest was seen: Redis's clock (ms) where it could be read, and this node's.
    at: Option<(Option<i64>, Instant)>,
}

impl FailedOver {
    pub fn is_empty(&self) -> bool {
        !self.everywhere && self.slots.is_empty()
    }

    /// Whether `key`'s slot failed over.
    pub fn covers(&self, key: &[u8]) -> bool {
        self.everywhere || self.slots.contains(&redis_keyslot(key))
    }

    /// Redis's clock (ms) when the latest failover was seen, if it could be read.
    pub fn server_ms(&self) -> Option<i64> {
        self.at.and_then(|(ms, _)| ms)
    }

    /// When this node saw the latest failover.
    pub fn seen(&self) -> Option<Instant> {
        self.at.map(|(_, seen)| seen)
    }

    fn merge(&mut self, other: FailedOver) {
        self.everywhere |= other.everywhere;
        self.slots.extend(other.slots);
        self.at = match (self.at, other.at) {
            (Some(a), Some(b)) => Some(if b.1 > a.1 { b } else { a }),
            (a, b) => a.or(b),
        };
    }
}

/// The failovers of one `Redis` handle, marked by its connections, taken by the placement path.
#[derive(Default)]
pub(crate) struct Failovers(RefCell<FailedOver>);

impl Failovers {
    /// A master failed over, seen at `server_ms` by its clock: every slot when `slots` is
    /// `None` (a single server), else those.
    pub(crate) fn mark(&self, slots: Option<BTreeSet<u16>>, server_ms: Option<i64>) {
        let seen = FailedOver {
            everywhere: slots.is_none(),
            slots: slots.unwrap_or_default(),
            at: Some((server_ms, Instant::now())),
        };
        self.0.borrow_mut().merge(seen);
    }

    pub(crate) fn take(&self) -> FailedOver {
        self.0.take()
    }

    /// Gives back what [`Failovers::take`] took, when acting on it failed.
    pub(crate) fn restore(&self, failed: FailedOver) {
        self.0.borrow_mut().merge(failed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_info_fields() {
        let info = "# Server\r\nredis_version:7.0.15\r\nrun_id:abc123\r\ntcp_port:6379\r\n";
        assert_eq!(info_field(info, "run_id"), Some("abc123"));
        assert_eq!(info_field(info, "run"), None);
        assert_eq!(
            info_field("# Replication\r\nrole:slave\r\n", "role"),
            Some("slave")
        );
    }

    #[test]
    fn failovers_merge_and_cover_their_slots() {
        let failovers = Failovers::default();
        assert!(failovers.take().is_empty());
        let key = b"{pinboard:3}:boot_time";
        failovers.mark(Some(BTreeSet::from([redis_keyslot(key)])), Some(5));
        let taken = failovers.take();
        assert!(taken.covers(key) && !taken.covers(b"{pinboard:4}:boot_time"));
        assert_eq!(taken.server_ms(), Some(5));
        assert!(failovers.take().is_empty(), "taken once");
        failovers.restore(taken);
        failovers.mark(None, Some(9));
        let all = failovers.take();
        assert!(all.covers(b"anything") && all.server_ms() == Some(9));
    }
}
