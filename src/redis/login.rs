//! Logging a fresh connection in, the one sequence every connection the client opens goes
//! through before any other command: the single server's on every core, every cluster master's
//! (also those found later through CLUSTER SLOTS or a redirect, and on every reconnect), the
//! cluster's slot-map discovery, and the startup check.
//!
//! The stream is TCP, and for a `rediss` target TLS over it: the handshake verifies the
//! server's certificate against the trust handed in through `RedisOptions::tls` (built once at
//! start: the system roots plus `redis_ca_file`), with the endpoint's host as the server name
//! (a DNS name as SNI, an IP literal against the certificate's IP addresses), whether the host
//! was configured or found in the cluster. No client certificate is presented.
//!
//! The sequence is `AUTH [user] password` (when the target has credentials), `SELECT db` (when
//! db is not 0), then `PING`, which makes sure the server actually serves requests (a full
//! server answers `-ERR max clients` and hangs up; one that wants a password answers `NOAUTH`)
//! before the connection is used. A step refused is a failed connection, never a silent success.

use std::io;
use std::time::Duration;

use pinboard_http::Transport;
use pinboard_http::tls::{ClientTls, tls_failure};

use super::connection::{Connection, Decimal};
use super::options::RedisOptions;
use super::{AUTH_REFUSALS, Credentials, Endpoint, RedisError, RedisTarget};

/// How to open every (re)connect, and what to send on it before it is used.
pub(crate) struct Login {
    wire: Wire,
    credentials: Option<Credentials>,
    db: u32,
}

/// The stream under the login.
enum Wire {
    Plain,
    Tls(ClientTls),
    /// A `rediss` target given no `RedisOptions::tls`: every open fails, saying so.
    TlsWithoutTrust,
}

/// Why a connection could not be opened and logged in.
#[derive(Debug, thiserror::Error)]
pub enum LoginError {
    /// Connecting failed, or the connection did while logging in.
    #[error("{0}")]
    Io(#[from] io::Error),
    /// The TLS handshake failed (the certificate did not verify, the server does not speak
    /// TLS, the connection dropped during it), or TLS did while logging in (the server's alert
    /// after the handshake, e.g. a client certificate required).
    #[error("TLS with the server failed: {0}")]
    Tls(io::Error),
    #[error("rediss:// but no TLS client configuration to verify the server with")]
    NoTlsConfiguration,
    /// The server answered a step with an error reply (never quoting the password: Redis does
    /// not echo it).
    #[error("{command} answered {reply}")]
    Refused {
        command: &'static str,
        reply: String,
    },
}

impl LoginError {
    /// Whether this is the configuration, which waiting will not fix: the server refused the
    /// credentials or the database ([`LoginError::is_refusal`]), or TLS with it cannot work as
    /// configured (a certificate that does not verify against the trusted roots, a server that
    /// does not speak TLS or that wants a client certificate, a host that is no server name).
    /// Anything else (unreachable, loading, full, dropped mid-handshake) may pass by itself.
    pub fn is_configuration_error(&self) -> bool {
        match self {
            LoginError::Tls(error) => {
                tls_failure(error).is_some() || error.kind() == io::ErrorKind::InvalidInput
            }
            LoginError::NoTlsConfiguration => true,
            _ => self.is_refusal(),
        }
    }

    /// Whether the server refused the configured credentials or database: what waiting will not
    /// fix. Anything else (unreachable, loading, full) may pass by itself.
    pub fn is_refusal(&self) -> bool {
        let LoginError::Refused { command, reply } = self else {
            return false;
        };
        AUTH_REFUSALS.iter().any(|code| reply.starts_with(code))
            // AUTH to a server without a password ("ERR AUTH <password> called without any
            // password configured…"; "ERR invalid password" before Redis 6), SELECT of a
            // database it does not have ("ERR DB index is out of range").
            || (matches!(*command, "AUTH" | "SELECT")
                && ["ERR AUTH ", "ERR invalid password", "ERR DB index"]
                    .iter()
                    .any(|code| reply.starts_with(code)))
    }
}

impl Login {
    /// Plain TCP, `credentials` and `db`.
    #[cfg(test)]
    pub(crate) fn new(credentials: Option<Credentials>, db: u32) -> Login {
        Login {
            wire: Wire::Plain,
            credentials,
            db,
        }
    }

    /// The login `target` asks of every connection (cluster nodes have database 0 only), over
    /// TLS verified with `opts.tls` for a `rediss` target.
    pub(crate) fn of(target: &RedisTarget, opts: &RedisOptions) -> Login {
        let db = match target {
            RedisTarget::Single { db, .. } => *db,
            RedisTarget::Cluster { .. } => 0,
        };
        let wire = match (target.tls(), &opts.tls) {
            (false, _) => Wire::Plain,
            (true, Some(tls)) => Wire::Tls(tls.clone()),
            (true, None) => Wire::TlsWithoutTrust,
        };
        Login {
            wire,
            credentials: target.credentials().cloned(),
            db,
        }
    }

    /// Connects to `endpoint` (TLS when the target is `rediss`) and logs in.
    pub(crate) async fn open(&self, endpoint: &Endpoint) -> Result<Connection, LoginError> {
        let tls = !matches!(self.wire, Wire::Plain);
        self.connect_and_log_in(endpoint)
            .await
            .map_err(|e| match e {
                // TLS failing under a login step is TLS's failure, not the server's answer.
                LoginError::Io(error) if tls && tls_failure(&error).is_some() => {
                    LoginError::Tls(error)
                }
                other => other,
            })
    }

    async fn connect_and_log_in(&self, endpoint: &Endpoint) -> Result<Connection, LoginError> {
        // A host name is looked up off the core: a slow DNS server must not stall its requests.
        let ip = endpoint.host.parse().ok();
        let tcp = pinboard_http::resolve::connect(&endpoint.host, ip, endpoint.port).await?;
        // Replies to pipelined requests are latency-bound; never let Nagle hold a write back.
        tcp.set_nodelay(true)?;
        let stream = match &self.wire {
            Wire::Plain => Transport::Plain(tcp),
            Wire::Tls(tls) => tls
                .connect(tcp, &endpoint.host)
                .await
                .map_err(LoginError::Tls)?,
            Wire::TlsWithoutTrust => return Err(LoginError::NoTlsConfiguration),
        };
        let mut conn = Connection::new(stream);
        if let Some(Credentials { user, password }) = &self.credentials {
            let args: Vec<&[u8]> = user
                .iter()
                .map(|user| user.as_bytes())
                .chain([password.as_bytes()])
                .collect();
            step(&mut conn, "AUTH", &args).await?;
        }
        if self.db != 0 {
            let db = Decimal::new(self.db as usize);
            step(&mut conn, "SELECT", &[db.as_bytes()]).await?;
        }
        step(&mut conn, "PING", &[]).await?;
        Ok(conn)
    }

    /// `open` bounded by `timeout` (a timeout is an `Io` error).
    pub(crate) async fn open_within(
        &self,
        endpoint: &Endpoint,
        timeout: Duration,
    ) -> Result<Connection, LoginError> {
        monoio::time::timeout(timeout, self.open(endpoint))
            .await
            .unwrap_or_else(|_| Err(io::Error::from(io::ErrorKind::TimedOut).into()))
    }
}

/// One login command, `command args…`; an error reply refuses the connection.
async fn step(
    conn: &mut Connection,
    command: &'static str,
    args: &[&[u8]],
) -> Result<(), LoginError> {
    let request: Vec<&[u8]> = [command.as_bytes()]
        .into_iter()
        .chain(args.iter().copied())
        .collect();
    match conn.request(&request).await? {
        Ok(_) => Ok(()),
        Err(RedisError::Reply(reply)) => Err(LoginError::Refused { command, reply }),
        Err(other) => Err(LoginError::Refused {
            command,
            reply: other.to_string(),
        }),
    }
}

/// The startup check: connects (over TLS for a `rediss` target, verified with `opts.tls`) and
/// logs in once to the server (for a cluster, to the first seed that answers) on a short-lived
/// event loop of the calling thread, before any core starts, each attempt bounded by
/// `opts.connect_timeout`. Only what waiting will not fix is an error (see
/// [`LoginError::is_configuration_error`]: refused credentials or database, TLS that cannot
/// work): a Redis that cannot be reached yet is waited for, as ever, with `/readyz` at 503.
pub fn check_login(target: &RedisTarget, opts: &RedisOptions) -> Result<(), LoginError> {
    let seeds = match target {
        RedisTarget::Single { endpoint, .. } => std::slice::from_ref(endpoint),
        RedisTarget::Cluster { seeds, .. } => seeds.as_slice(),
    };
    let login = Login::of(target, opts);
    let timeout = opts.connect_timeout;
    let mut runtime = match monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
        .enable_timer()
        .build()
    {
        Ok(runtime) => runtime,
        // Nothing learnt: the cores find out soon enough, each on its own event loop.
        Err(error) => {
            tracing::warn!(%error, "redis login not checked at start: no event loop for it");
            return Ok(());
        }
    };
    runtime.block_on(async {
        for seed in seeds {
            match login.open_within(seed, timeout).await {
                Ok(_) => return Ok(()),
                Err(e) if e.is_configuration_error() => return Err(e),
                Err(e) => tracing::warn!(endpoint = %seed, error = %e, "redis not reachable at start; waiting for it"),
            }
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::LoginError;

    fn refused(command: &'static str, reply: &str) -> LoginError {
        LoginError::Refused {
            command,
            reply: reply.into(),
        }
    }

    #[test]
    fn refusals_of_the_configuration_are_told_from_passing_trouble() {
        for (command, reply) in [
            (
                "AUTH",
                "WRONGPASS invalid username-password pair or user is disabled.",
            ),
            ("PING", "NOAUTH Authentication required."),
            (
                "PING",
                "NOPERM User app has no permissions to run the 'ping' command",
            ),
            (
                "AUTH",
                "ERR AUTH <password> called without any password configured for the default user.",
            ),
            ("SELECT", "ERR DB index is out of range"),
        ] {
            assert!(refused(command, reply).is_refusal(), "{command}: {reply}");
        }
        for (command, reply) in [
            ("AUTH", "ERR max number of clients reached"),
            ("PING", "LOADING Redis is loading the dataset in memory"),
            ("PING", "ERR DB index is out of range"),
        ] {
            assert!(!refused(command, reply).is_refusal(), "{command}: {reply}");
        }
        let io = LoginError::Io(std::io::ErrorKind::ConnectionRefused.into());
        assert!(!io.is_refusal());
    }
}
