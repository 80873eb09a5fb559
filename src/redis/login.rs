//! Logging a fresh connection in, the one sequence every connection the client opens goes
//! through before any other command: the single server's on every core, every cluster master's
//! (also those found later through CLUSTER SLOTS or a redirect, and on every reconnect), the
//! cluster's slot-map discovery, and the startup check.
//!
//! The sequence is `AUTH [user] password` (when the target has credentials), `SELECT db` (when
//! db is not 0), then `PING`, which makes sure the server actually serves requests (a full
//! server answers `-ERR max clients` and hangs up; one that wants a password answers `NOAUTH`)
//! before the connection is used. A step refused is a failed connection, never a silent success.

use std::io;
use std::time::Duration;

use super::connection::{Connection, Decimal};
use super::{AUTH_REFUSALS, Credentials, Endpoint, RedisError, RedisTarget};

/// What to send on every (re)connect before the connection is used.
pub(crate) struct Login {
    credentials: Option<Credentials>,
    db: u32,
}

/// Why a connection could not be opened and logged in.
#[derive(Debug, thiserror::Error)]
pub enum LoginError {
    /// Connecting failed, or the connection did while logging in.
    #[error("{0}")]
    Io(#[from] io::Error),
    /// The server answered a step with an error reply (never quoting the password: Redis does
    /// not echo it).
    #[error("{command} answered {reply}")]
    Refused {
        command: &'static str,
        reply: String,
    },
}

impl LoginError {
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
    pub(crate) fn new(credentials: Option<Credentials>, db: u32) -> Login {
        Login { credentials, db }
    }

    /// The login `target` asks of every connection (cluster nodes have database 0 only).
    pub(crate) fn of(target: &RedisTarget) -> Login {
        let db = match target {
            RedisTarget::Single { db, .. } => *db,
            RedisTarget::Cluster { .. } => 0,
        };
        Login::new(target.credentials().cloned(), db)
    }

    /// Connects to `endpoint` and logs in.
    pub(crate) async fn open(&self, endpoint: &Endpoint) -> Result<Connection, LoginError> {
        let mut conn = Connection::open(endpoint).await?;
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

/// The startup check: logs in once to the server (for a cluster, to the first seed that
/// answers) on a short-lived event loop of the calling thread, before any core starts. Only a
/// refusal of the credentials or the database is an error (see [`LoginError::is_refusal`]):
/// a Redis that cannot be reached yet is waited for, as ever, with `/readyz` at 503.
pub fn check_login(target: &RedisTarget, timeout: Duration) -> Result<(), LoginError> {
    let seeds = match target {
        RedisTarget::Single { endpoint, .. } => std::slice::from_ref(endpoint),
        RedisTarget::Cluster { seeds, .. } => seeds.as_slice(),
    };
    let login = Login::of(target);
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
                Err(e) if e.is_refusal() => return Err(e),
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
