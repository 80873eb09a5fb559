//! `pinboard ctl`: the operator's command-line client. A subcommand ([`args`]) becomes one call
//! to the node's operator routes ([`call`]: `/registry/workers`, `overview`, `drain`,
//! `undrain`, `wind_down`, `move`, `pause`, `resume`, `health`, and `/readyz`), and the answer
//! is printed as a table
//! ([`render`]) or, with `--json`, as the node's own JSON. It reads nothing but those
//! answers: no configuration file, no Redis.
//!
//! Exit codes: 0 done; 1 the node could not be reached or refused (`<status> <its error>`);
//! 2 bad usage or no usable credential, before anything is sent.

mod args;
mod call;
mod render;

use std::io::Write;

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use serde_json::{Value, json};

pub use args::CtlArgs;

use args::{CtlCommand, Target};
use call::Node;

/// Why `pinboard ctl` did not do what it was asked.
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    /// Bad usage or no usable credential: nothing was sent.
    #[error("{0}")]
    Usage(String),
    /// The node could not be asked, refused, or answered what cannot be read.
    #[error("{0}")]
    Failed(String),
}

/// What a subcommand asks the node: a route under its `base_path`, and a body for a `POST`.
enum Ask {
    Get(String),
    Post(&'static str, Value),
}

/// A query value as the overview reads it: percent-encoded but for the characters a namespace
/// or id is usually made of.
const QUERY_VALUE: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~')
    .remove(b'/');

impl Ask {
    /// The call `command` makes, or the usage error in its own arguments.
    fn of(command: &CtlCommand) -> Result<Ask, Failure> {
        Ok(match command {
            CtlCommand::Workers => Ask::Get("/registry/workers".into()),
            CtlCommand::Instances { ns, prefix, tag } => {
                let filters: Vec<String> = [("ns", ns), ("prefix", prefix), ("tag", tag)]
                    .into_iter()
                    .filter_map(|(name, value)| {
                        let value = value.as_deref()?;
                        Some(format!(
                            "{name}={}",
                            utf8_percent_encode(value, QUERY_VALUE)
                        ))
                    })
                    .collect();
                if filters.is_empty() {
                    Ask::Get("/registry/overview".into())
                } else {
                    Ask::Get(format!("/registry/overview?{}", filters.join("&")))
                }
            }
            CtlCommand::Drain {
                client_id,
                deadline,
            } => Ask::Post(
                "/registry/drain",
                json!({ "clientId": client_id, "deadline": deadline }),
            ),
            CtlCommand::Undrain { client_id } => {
                Ask::Post("/registry/undrain", json!({ "clientId": client_id }))
            }
            CtlCommand::WindDown {
                target, env, yes, ..
            } => {
                let Target { namespace, id } = Target::parse(target)?;
                if id.is_none() && !yes {
                    return Err(Failure::Usage(format!(
                        "wind-down {namespace} acts on every placement of {namespace}: \
                         add --yes to go ahead"
                    )));
                }
                let mut body =
                    json!({ "namespace": namespace, "deadline": wind_down_deadline(command) });
                if let Some(id) = id {
                    body["id"] = id.into();
                }
                Ask::Post("/registry/wind_down", with_env(body, env))
            }
            CtlCommand::Move {
                target,
                to,
                deadline,
                env,
            } => {
                let (namespace, id) = Target::instance("move", target)?;
                let body =
                    json!({ "namespace": namespace, "id": id, "to": to, "deadline": deadline });
                Ask::Post("/registry/move", with_env(body, env))
            }
            CtlCommand::Pause {
                target,
                reason,
                env,
            } => {
                let (namespace, id) = Target::instance("pause", target)?;
                let mut body = json!({ "namespace": namespace, "id": id });
                if let Some(reason) = reason {
                    body["reason"] = reason.as_str().into();
                }
                Ask::Post("/registry/pause", with_env(body, env))
            }
            CtlCommand::Resume { target, env } => {
                let (namespace, id) = Target::instance("resume", target)?;
                let body = json!({ "namespace": namespace, "id": id });
                Ask::Post("/registry/resume", with_env(body, env))
            }
            CtlCommand::Health => Ask::Get("/registry/health".into()),
        })
    }
}

/// `body` with `env` when one is given (hostname-aware mode).
fn with_env(mut body: Value, env: &Option<String>) -> Value {
    if let Some(env) = env {
        body["env"] = env.as_str().into();
    }
    body
}

/// The `deadline` a `wind-down` sends: `--deadline`, 0 (one lease) without it, `null` to
/// revoke (`--cancel`).
fn wind_down_deadline(command: &CtlCommand) -> Option<u64> {
    match command {
        CtlCommand::WindDown {
            cancel: false,
            deadline,
            ..
        } => Some(deadline.unwrap_or(0)),
        _ => None,
    }
}

/// Runs one `pinboard ctl` subcommand: its arguments checked, then the URL and credential,
/// then the call, its answer printed on stdout.
pub fn run(args: CtlArgs) -> Result<(), Failure> {
    let CtlArgs {
        json,
        connection,
        command,
    } = args;
    let ask = Ask::of(&command)?;
    let node = Node::new(&connection)?;
    // One call: the plain epoll event loop of this thread is all it needs.
    let mut runtime = monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
        .enable_timer()
        .build()
        .map_err(|e| Failure::Failed(format!("no event loop: {e}")))?;
    let out = runtime.block_on(async {
        let body = match &ask {
            Ask::Get(path) => node.get(path).await?,
            Ask::Post(path, body) => node.post(path, body).await?,
        };
        if json {
            let mut document = body.to_vec();
            if document.last() != Some(&b'\n') {
                document.push(b'\n');
            }
            return Ok(document);
        }
        let now = crate::clock::now_ms();
        let text = match &command {
            CtlCommand::Workers => render::workers(&body, now)?,
            CtlCommand::Instances { .. } => render::instances(&body, now)?,
            CtlCommand::Drain {
                client_id,
                deadline,
            } => render::drained(client_id, *deadline),
            CtlCommand::Undrain { client_id } => render::undrained(&body, client_id)?,
            CtlCommand::WindDown { target, .. } => {
                render::wound_down(&body, target, wind_down_deadline(&command))?
            }
            CtlCommand::Move {
                target,
                to,
                deadline,
                ..
            } => render::moved(&body, target, to, *deadline)?,
            CtlCommand::Pause { target, .. } => render::paused(target),
            CtlCommand::Resume { target, .. } => render::resumed(target),
            CtlCommand::Health => render::health(&body, node.readyz().await?)?,
        };
        Ok::<_, Failure>(text.into_bytes())
    })?;
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(&out).and_then(|()| stdout.flush()) {
        // `pinboard ctl instances | head`: the reader has what it wanted.
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(Failure::Failed(format!("writing the answer: {e}")))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        ctl: CtlArgs,
    }

    fn ask(line: &[&str]) -> Result<(String, Value), String> {
        let cli = Cli::try_parse_from(std::iter::once("ctl").chain(line.iter().copied()))
            .map_err(|e| e.kind().to_string())?;
        match Ask::of(&cli.ctl.command).map_err(|e| e.to_string())? {
            Ask::Get(path) => Ok((format!("GET {path}"), Value::Null)),
            Ask::Post(path, body) => Ok((format!("POST {path}"), body)),
        }
    }

    #[test]
    fn each_subcommand_is_one_call() {
        assert_eq!(
            ask(&[
                "instances",
                "--ns",
                "/threads",
                "--prefix",
                "H~ a&b",
                "--tag",
                "ws:W"
            ]),
            Ok((
                "GET /registry/overview?ns=/threads&prefix=H~%20a%26b&tag=ws%3AW".into(),
                Value::Null
            ))
        );
        assert_eq!(
            ask(&["drain", "w2"]),
            Ok((
                "POST /registry/drain".into(),
                json!({"clientId": "w2", "deadline": null})
            ))
        );
        assert_eq!(
            ask(&["drain", "w2", "--deadline", "60"]).unwrap().1,
            json!({"clientId": "w2", "deadline": 60})
        );
        assert_eq!(
            ask(&[
                "wind-down",
                "/threads/abc",
                "--deadline",
                "30",
                "--env",
                "prod"
            ]),
            Ok((
                "POST /registry/wind_down".into(),
                json!({"namespace": "/threads", "id": "abc", "deadline": 30, "env": "prod"})
            ))
        );
        assert_eq!(
            ask(&["wind-down", "/threads/abc"]).unwrap().1,
            json!({"namespace": "/threads", "id": "abc", "deadline": 0})
        );
        assert_eq!(
            ask(&["wind-down", "/threads", "--cancel", "--yes"])
                .unwrap()
                .1,
            json!({"namespace": "/threads", "deadline": null})
        );
        assert_eq!(
            ask(&["wind-down", "/threads"]),
            Err(
                "wind-down /threads acts on every placement of /threads: add --yes to go ahead"
                    .into()
            )
        );
        assert!(ask(&["wind-down", "/t/a", "--cancel", "--deadline", "3"]).is_err());
        assert_eq!(
            ask(&["move", "/threads/abc", "--to", "w2", "--env", "prod"]),
            Ok((
                "POST /registry/move".into(),
                json!({"namespace": "/threads", "id": "abc", "to": "w2", "deadline": null, "env": "prod"})
            ))
        );
        assert_eq!(
            ask(&["move", "/threads/abc", "--to", "w2", "--deadline", "90"])
                .unwrap()
                .1,
            json!({"namespace": "/threads", "id": "abc", "to": "w2", "deadline": 90})
        );
        assert_eq!(
            ask(&["pause", "/threads/abc", "--reason", "incident 7"]),
            Ok((
                "POST /registry/pause".into(),
                json!({"namespace": "/threads", "id": "abc", "reason": "incident 7"})
            ))
        );
        assert_eq!(
            ask(&["resume", "/threads/abc"]),
            Ok((
                "POST /registry/resume".into(),
                json!({"namespace": "/threads", "id": "abc"})
            ))
        );
        assert_eq!(
            ask(&["pause", "/threads"]),
            Err("pause \"/threads\": expected /NS/ID".into())
        );
        assert!(ask(&["move", "/threads/abc"]).is_err(), "--to is required");
        assert!(ask(&["drain", "w2", "--deadline", "-1"]).is_err());
    }
}
