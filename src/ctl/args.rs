//! `pinboard ctl`'s command line: the node to ask (`--url`, `--ca-file`, `--timeout`), the
//! credential to ask with (`--token-file` or `PINBOARD_TOKEN`), `--json`, and the subcommands
//! with their own arguments, checked before anything is sent.

use std::path::PathBuf;

use super::Failure;

/// The credential from the environment (empty is unset): out of `ps` and shell history.
const TOKEN_ENV: &str = "PINBOARD_TOKEN";

/// Ask a running node: its workers, placements and health; drain, undrain, wind down, move,
/// pause and resume.
#[derive(clap::Args)]
pub struct CtlArgs {
    /// Print the node's JSON answer as it came (one document, for scripts) instead of a table.
    #[arg(long, global = true)]
    pub(super) json: bool,
    #[command(flatten)]
    pub(super) connection: Connection,
    #[command(subcommand)]
    pub(super) command: CtlCommand,
}

/// How the node is reached, and with which credential.
#[derive(clap::Args)]
#[command(next_help_heading = "Connection")]
pub struct Connection {
    /// The node's URL (else PINBOARD_URL), http or https; a path in it is the node's
    /// base_path (http://edge:8080/api).
    #[arg(
        long,
        env = "PINBOARD_URL",
        default_value = "http://127.0.0.1:8080",
        global = true
    )]
    pub url: String,
    /// A file holding the operator credential (a Passport token with pinboard:operator), a
    /// trailing newline trimmed. Else the PINBOARD_TOKEN environment variable: exactly one of
    /// the two.
    #[arg(long, value_name = "FILE", global = true)]
    pub token_file: Option<PathBuf>,
    /// A CA certificate file (PEM) trusted besides the system roots: an https node whose
    /// certificate a private CA signed.
    #[arg(long, value_name = "FILE", global = true)]
    pub ca_file: Option<PathBuf>,
    /// Seconds to wait for the whole answer (a large overview takes longer: about 15 s a
    /// million placements).
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = 10,
        value_parser = clap::value_parser!(u64).range(1..=86_400),
        global = true
    )]
    pub timeout: u64,
}

#[derive(clap::Subcommand)]
pub enum CtlCommand {
    /// List the live workers: client id, hostname, session, namespaces, headroom, drain,
    /// degraded since and the lease left.
    Workers,
    /// List the live placements (and paused ids): namespace, id, owner, env, wind-down
    /// deadline, pause and tag.
    Instances {
        /// Only this namespace (/threads).
        #[arg(long, value_name = "NS")]
        ns: Option<String>,
        /// Only ids that start with this.
        #[arg(long)]
        prefix: Option<String>,
        /// Only placements with exactly this tag.
        #[arg(long)]
        tag: Option<String>,
    },
    /// Drain a worker by its client id: without --deadline a cordon (it takes no new
    /// placements, its own keep routing); with one, its placements are also forced off.
    Drain {
        /// The worker's client id.
        client_id: String,
        /// Seconds until its lease can no longer be renewed (at least one lease).
        #[arg(long, value_name = "SECONDS")]
        deadline: Option<u64>,
    },
    /// Revoke a worker's drain (from its next heartbeat).
    Undrain {
        /// The worker's client id.
        client_id: String,
    },
    /// Wind down one placement (/NS/ID), or every placement of a namespace (/NS, with --yes):
    /// fence it and tell its owner.
    WindDown {
        /// The placement, /NS/ID, or a whole namespace, /NS.
        #[arg(value_name = "/NS[/ID]")]
        target: String,
        /// Seconds until the fence falls (at least one lease; without it, one lease).
        #[arg(long, value_name = "SECONDS", conflicts_with = "cancel")]
        deadline: Option<u64>,
        /// Revoke an earlier wind-down instead: clear the fence and tell the owner.
        #[arg(long)]
        cancel: bool,
        /// The env the placements live in (hostname-aware mode, where it is required).
        #[arg(long)]
        env: Option<String>,
        /// Go ahead with a whole namespace: every placement in it is wound down.
        #[arg(long)]
        yes: bool,
    },
    /// Move one placement (/NS/ID) to another worker: fence it like a wind-down, name the
    /// successor, and tell the owner; once the owner lets go, the next placement goes to the
    /// successor when it can take it (else to the normal choice).
    Move {
        /// The placement, /NS/ID.
        #[arg(value_name = "/NS/ID")]
        target: String,
        /// The successor worker's client id.
        #[arg(long, value_name = "CLIENT")]
        to: String,
        /// Seconds the owner has to let go (at least one lease; without it, one lease).
        #[arg(long, value_name = "SECONDS")]
        deadline: Option<u64>,
        /// The env the placement lives in (hostname-aware mode, where it is required).
        #[arg(long)]
        env: Option<String>,
    },
    /// Pause one instance (/NS/ID): every node answers it 503 until it is resumed; its
    /// placement, if any, stays as it is.
    Pause {
        /// The instance, /NS/ID (placed or not).
        #[arg(value_name = "/NS/ID")]
        target: String,
        /// Why, for whoever lists it.
        #[arg(long)]
        reason: Option<String>,
        /// The env the instance lives in (hostname-aware mode, where it is required).
        #[arg(long)]
        env: Option<String>,
    },
    /// Resume a paused instance (/NS/ID): it is served (or placed) again.
    Resume {
        /// The instance, /NS/ID.
        #[arg(value_name = "/NS/ID")]
        target: String,
        /// The env the instance lives in (hostname-aware mode, where it is required).
        #[arg(long)]
        env: Option<String>,
    },
    /// The node's own view of itself: ready, connections, quarantine, uptime, memory and
    /// resolutions by outcome.
    Health,
}

/// What `wind-down` acts on (and, with an id, `move`, `pause`, `resume`).
#[derive(Debug, PartialEq, Eq)]
pub struct Target<'a> {
    pub namespace: &'a str,
    /// `None`: every placement of the namespace.
    pub id: Option<&'a str>,
}

impl Target<'_> {
    /// `/NS` or `/NS/ID` (the id is everything after the namespace's segment: the node judges
    /// it), or a usage error.
    pub fn parse(target: &str) -> Result<Target<'_>, Failure> {
        Self::of("wind-down", target, "/NS or /NS/ID")
    }

    /// `/NS/ID` for `verb` (`move`, `pause`, `resume`): the namespace and the id, or a usage
    /// error.
    pub fn instance<'t>(verb: &str, target: &'t str) -> Result<(&'t str, &'t str), Failure> {
        match Self::of(verb, target, "/NS/ID")? {
            Target {
                namespace,
                id: Some(id),
            } => Ok((namespace, id)),
            _ => Err(Failure::Usage(format!(
                "{verb} {target:?}: expected /NS/ID"
            ))),
        }
    }

    fn of<'t>(verb: &str, target: &'t str, shape: &str) -> Result<Target<'t>, Failure> {
        let bad = || Failure::Usage(format!("{verb} {target:?}: expected {shape}"));
        let rest = target.strip_prefix('/').ok_or_else(bad)?;
        let (namespace, id) = match rest.find('/') {
            Some(at) => (&target[..=at], Some(&rest[at + 1..])),
            None => (target, None),
        };
        if namespace.len() < 2 || id.is_some_and(str::is_empty) {
            return Err(bad());
        }
        Ok(Target { namespace, id })
    }
}

impl Connection {
    /// The credential from the one place it was given: `--token-file` (its contents, a
    /// trailing newline trimmed) or `PINBOARD_TOKEN`. Neither, both, an unreadable or empty
    /// file, or a value that cannot be a bearer token is a usage error that never shows it.
    pub fn credential(&self) -> Result<String, Failure> {
        let from_env = std::env::var_os(TOKEN_ENV).filter(|v| !v.is_empty());
        let (token, source) = match (&self.token_file, from_env) {
            (Some(_), Some(_)) => {
                return Err(Failure::Usage(format!(
                    "the credential was given 2 ways (--token-file, {TOKEN_ENV}): give exactly one"
                )));
            }
            (None, None) => {
                return Err(Failure::Usage(format!(
                    "no credential: give --token-file FILE or set {TOKEN_ENV}"
                )));
            }
            (Some(path), None) => {
                let source = format!("--token-file {}", path.display());
                let text = std::fs::read_to_string(path)
                    .map_err(|e| Failure::Usage(format!("{source}: {e}")))?;
                (text.trim_end_matches(['\n', '\r']).to_owned(), source)
            }
            (None, Some(value)) => {
                let value = value
                    .into_string()
                    .map_err(|_| Failure::Usage(format!("{TOKEN_ENV} is not UTF-8")))?;
                (value, TOKEN_ENV.to_owned())
            }
        };
        if token.is_empty() {
            return Err(Failure::Usage(format!("{source}: the credential is empty")));
        }
        if !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(Failure::Usage(format!(
                "{source}: the credential holds a space or a control character (a token is one word)"
            )));
        }
        Ok(token)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wind_down_targets() {
        let parsed = |t| Target::parse(t).map_err(|e| e.to_string());
        assert_eq!(
            parsed("/threads/abc"),
            Ok(Target {
                namespace: "/threads",
                id: Some("abc")
            })
        );
        assert_eq!(
            parsed("/threads"),
            Ok(Target {
                namespace: "/threads",
                id: None
            })
        );
        // The node judges the id: a slash in it is its 400, not a second namespace.
        assert_eq!(parsed("/t/a/b").unwrap().id, Some("a/b"));
        for bad in ["threads/abc", "/", "//abc", "/threads/", ""] {
            assert_eq!(
                parsed(bad),
                Err(format!("wind-down {bad:?}: expected /NS or /NS/ID")),
                "{bad}"
            );
        }
    }

    #[test]
    fn instance_targets() {
        let instance = |t| Target::instance("pause", t).map_err(|e| e.to_string());
        assert_eq!(instance("/threads/abc"), Ok(("/threads", "abc")));
        for bad in ["/threads", "threads/abc", "/threads/", ""] {
            assert_eq!(
                instance(bad),
                Err(format!("pause {bad:?}: expected /NS/ID")),
                "{bad}"
            );
        }
    }
}
