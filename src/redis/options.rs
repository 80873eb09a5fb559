//! `RedisOptions`: how every connection of a core's Redis client is opened and bounded (its
//! timeouts, the trust a `rediss` server is verified with). Below the client, its connections
//! and their login, which all read it.

use std::fmt;
use std::time::Duration;

use pinboard_http::tls::ClientTls;

#[derive(Clone)]
pub struct RedisOptions {
    /// Bound on TCP connect, the TLS handshake and the login, per attempt.
    pub connect_timeout: Duration,
    /// Bound on one request, from sending to its reply.
    pub request_timeout: Duration,
    /// What a `rediss` target's servers are verified with (the node builds one at start, from
    /// the system roots plus `redis_ca_file`, and hands every core a clone: one configuration,
    /// one session cache). Unused for a plain target; without it, a `rediss` target's every
    /// connection fails with [`super::LoginError::NoTlsConfiguration`].
    pub tls: Option<ClientTls>,
}

impl Default for RedisOptions {
    fn default() -> Self {
        RedisOptions {
            connect_timeout: Duration::from_secs(1),
            request_timeout: Duration::from_secs(2),
            tls: None,
        }
    }
}

impl fmt::Debug for RedisOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisOptions")
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("tls", &self.tls.is_some())
            .finish()
    }
}
