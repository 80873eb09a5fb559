//! Redis access for one core: the pipelined client (`Redis`), running Lua scripts and Redis
//! Cluster routing. What is stored where is the store's (`crate::store`).
//!
//! Every core owns one `Redis` handle (one pipelined connection per server, or per master in
//! cluster mode). Every connection it opens is opened and logged in the same way first
//! (`login`): over TLS for a `rediss` target (verified with the `ClientTls` handed in through
//! [`RedisOptions::tls`], one for the whole node, built at start from the system roots and
//! `redis_ca_file`), then `AUTH`, `SELECT`, `PING` with the credentials of `redis_url`
//! (`target`). The stream under the RESP framing (`connection`) is a `pinboard_http::Transport`,
//! plain or TLS. This file owns the types every caller sees: the error taxonomy and the decoded
//! reply.

mod client;
mod cluster;
mod connection;
mod failover;
mod login;
mod node;
mod notify;
mod options;
mod script;
mod slots;
mod target;
mod wait_lane;

use std::fmt;
use std::ops::Deref;

use smallvec::SmallVec;

use crate::error::{Error, Origin};

pub use client::Redis;
pub use failover::FailedOver;
// Public so the benches and the allocation test measure the encoder the client sends with.
pub use connection::{decode_reply, encode_command};
pub use login::{LoginError, check_login};
pub use options::RedisOptions;
pub use script::Script;
pub use target::{Credentials, Endpoint, RedisTarget};

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RedisError {
    /// No connection right now, or the connection died while the request was in flight (it may
    /// or may not have been executed).
    #[error("redis is not connected")]
    Disconnected,
    #[error("redis request timed out")]
    Timeout,
    #[error("redis protocol error: {0}")]
    Protocol(String),
    /// An error reply (`-ERR …`, `-NOSCRIPT …`, …) from the server, without the leading `-`.
    #[error("redis replied with an error: {0}")]
    Reply(String),
}

/// The error codes of a server refusing who we are: a wrong password, a password required, a
/// user without the permission. On a connection's login they fail it; on a command (the ACL or
/// the password changed under a live connection) they are Redis being unavailable to this
/// node, not a bug in it.
pub(crate) const AUTH_REFUSALS: [&str; 3] = ["WRONGPASS ", "NOAUTH ", "NOPERM "];

impl RedisError {
    /// Whether the same request may succeed if sent again shortly: connection trouble, a
    /// server-side condition Redis itself documents as transient, or a refusal of our
    /// credentials (an operator fixes those while the node keeps running: until then Redis is
    /// unavailable, 503, not a server error).
    pub fn retryable(&self) -> bool {
        match self {
            RedisError::Disconnected | RedisError::Timeout => true,
            RedisError::Protocol(_) => false,
            // A redirect left over after the cluster client's last attempt is a slot still in
            // motion: as transient as the TRYAGAIN it alternates with.
            RedisError::Reply(msg) => [
                "LOADING",
                "TRYAGAIN",
                "CLUSTERDOWN",
                "MASTERDOWN",
                "MOVED ",
                "ASK ",
            ]
            .iter()
            .chain(&AUTH_REFUSALS)
            .any(|code| msg.starts_with(code)),
        }
    }
}

/// A failed Redis request as the node reports it: `Origin::Redis`, retryable when Redis says
/// the condition is transient.
impl From<RedisError> for Error {
    fn from(e: RedisError) -> Error {
        let retryable = e.retryable();
        Error::because(Origin::Redis, "redis request", e).retryable(retryable)
    }
}

/// A decoded RESP2 reply. Error replies never appear here: they become `RedisError::Reply`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    Nil,
    Int(i64),
    Bulk(Blob),
    Simple(Blob),
    Array(Vec<Reply>),
}

/// A reply's string, copied out of the connection's read buffer: inline up to
/// [`Blob::INLINE`] bytes, so that a steady resolve's answer (`'sessionId epoch flag'`, 48
/// bytes) costs no allocation; longer ones (a copy, a page of rows) spill to the heap.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Blob(SmallVec<[u8; Blob::INLINE]>);

impl Blob {
    pub const INLINE: usize = 56;

    /// Whether the bytes live on the heap.
    pub fn spilled(&self) -> bool {
        self.0.spilled()
    }
}

impl Deref for Blob {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl From<&[u8]> for Blob {
    fn from(bytes: &[u8]) -> Blob {
        Blob(SmallVec::from_slice(bytes))
    }
}

impl From<&str> for Blob {
    fn from(text: &str) -> Blob {
        Blob::from(text.as_bytes())
    }
}

impl fmt::Debug for Blob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "b\"{}\"", self.escape_ascii())
    }
}

impl Reply {
    /// The integer, also when Redis sent it as a string (`GET` of a counter).
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Reply::Int(n) => Some(*n),
            Reply::Bulk(b) | Reply::Simple(b) => std::str::from_utf8(b).ok()?.parse().ok(),
            _ => None,
        }
    }

    pub fn as_bytes(&self) -> Option<&[u8]> {
        match self {
            Reply::Bulk(b) | Reply::Simple(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        std::str::from_utf8(self.as_bytes()?).ok()
    }

    /// The string, copied out of the reply onto the stack when short.
    pub fn text(&self) -> Option<Text> {
        self.as_str().map(Text::from)
    }

    pub fn as_array(&self) -> Option<&[Reply]> {
        match self {
            Reply::Array(items) => Some(items),
            _ => None,
        }
    }

    pub fn is_nil(&self) -> bool {
        matches!(self, Reply::Nil)
    }

    /// The (field, value) pairs of an `HGETALL` answer; anything else yields none.
    pub fn pairs(&self) -> impl Iterator<Item = (&str, &[u8])> {
        self.as_array()
            .unwrap_or_default()
            .chunks(2)
            .filter_map(|pair| match pair {
                [field, value] => Some((field.as_str()?, value.as_bytes()?)),
                _ => None,
            })
    }
}

/// A short string out of a reply, UTF-8 checked and kept inline: what the data plane keeps
/// of a resolve (the owner's session, the epoch) costs no allocation, and holds no reference to
/// the connection's read buffer, which can then be reused in place for the next replies.
pub type Text = crate::text::InlineStr<64>;

#[cfg(test)]
mod tests {
    use super::RedisError;

    #[test]
    fn a_slot_in_motion_or_a_refused_login_is_transient() {
        for msg in [
            "MOVED 5649 127.0.0.1:7001",
            "ASK 5649 127.0.0.1:7001",
            "TRYAGAIN Multiple keys request during rehashing of slot",
            "CLUSTERDOWN The cluster is down",
            "LOADING Redis is loading the dataset in memory",
            "NOAUTH Authentication required.",
            "WRONGPASS invalid username-password pair or user is disabled.",
            "NOPERM User app has no permissions to run the 'evalsha' command",
        ] {
            assert!(RedisError::Reply(msg.into()).retryable(), "{msg}");
        }
        for msg in [
            "NOSCRIPT No matching script",
            "ERR unknown command",
            "MOVEDX",
            "NOAUTHX",
        ] {
            assert!(!RedisError::Reply(msg.into()).retryable(), "{msg}");
        }
        assert!(RedisError::Timeout.retryable() && RedisError::Disconnected.retryable());
    }
}
