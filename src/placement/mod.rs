//! Placement: asking Redis for the one live owner of `(env, namespace, id)` and turning every
//! other outcome into the spec's refusal.
//!
//! The decision itself is `lua/resolve.lua`, run by EVALSHA in the id's bucket, so two nodes
//! resolving the same new id at once cannot both place it. In hostname-aware mode the
//! binding lookup (`lua/binding.lua`, registry slot) runs first. In strict mode a new
//! placement must reach Redis's replicas before it counts (`strict`).

mod affinity;
mod strict;

pub use affinity::{client_ip, key as affinity_key};
pub use strict::Strict;

use std::time::Duration;

use crate::answers;
use crate::error::{Error, Origin};
use crate::http::Response;
use smallvec::SmallVec;

use crate::redis::{Reply, Text};
use crate::store::scripts::{BINDING, OVERWRITTEN_CLEAR, RESOLVE};
use crate::store::{Release, Store, WindDown, bucket_of};

/// Where a request goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    pub session_id: Text,
    pub epoch: Text,
    /// The worker's advertise URL and secret, named by a new placement only: an existing row's
    /// owner is one the caller usually knows already ([`Store::worker_of`] otherwise).
    pub worker: Option<WorkerAddress>,
    /// Minted by this resolve (as opposed to an existing row).
    pub placed: bool,
    /// The id is on the overwritten list: a 2xx from the new owner clears the marker.
    pub overwritten: bool,
    /// A wind-down fence (ms) this new placement inherited from a dead owner's row: the new
    /// owner must be told.
    pub inherited_wind_down: Option<u64>,
}

/// How a worker is reached: fixed for a session's life.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerAddress {
    pub advertise_url: String,
    pub secret: String,
}

/// What a resolve decided.
#[derive(Debug, PartialEq, Eq)]
#[expect(
    clippy::large_enum_variant,
    reason = "a boxed forward would be an allocation per request; the other variants are refusals"
)]
pub enum Outcome {
    Forward(Placement),
    UnknownNs,
    NoBackends,
    Quarantine(Duration),
    TakeoverPending(Duration),
    TakeoverDenied,
    NoHostnameWorkers,
    BindingQuarantine(Duration),
    EnvConflict,
    /// A new placement refused: the client must wait this long for its next.
    RateLimited(Duration),
    /// A new row refused: the namespace holds `placement.max_rows_per_namespace`.
    NamespaceFull,
    /// An operator paused the id: nothing placed, nothing forwarded.
    Paused,
    /// Strict mode: a new placement the replicas did not acknowledge in time, released; or a
    /// row placed so recently that its placer may still be waiting, not yet on the replicas.
    Unreplicated,
}

impl Outcome {
    pub fn name(&self) -> &'static str {
        match self {
            Outcome::Forward(_) => "forward",
            Outcome::UnknownNs => "unknown-ns",
            Outcome::NoBackends => "no-backends",
            Outcome::Quarantine(_) => "quarantine",
            Outcome::TakeoverPending(_) => "takeover-pending",
            Outcome::TakeoverDenied => "takeover-denied",
            Outcome::NoHostnameWorkers => "no-hostname-workers",
            Outcome::BindingQuarantine(_) => "binding-quarantine",
            Outcome::EnvConflict => "env-conflict",
            Outcome::RateLimited(_) => "rate-limited",
            Outcome::NamespaceFull => "namespace-full",
            Outcome::Paused => "paused",
            Outcome::Unreplicated => "unreplicated",
        }
    }

    /// The answer for any outcome but `Forward`.
    pub fn refusal(&self) -> Response {
        match self {
            Outcome::Forward(_) => unreachable!("a forward is not a refusal"),
            Outcome::UnknownNs => answers::unknown_namespace(),
            Outcome::NoBackends => {
                answers::unavailable("no live backends for namespace", Duration::ZERO)
            }
            Outcome::Quarantine(left) => answers::unavailable("registry cold start, retry", *left),
            Outcome::TakeoverPending(left) => {
                answers::unavailable("takeover in progress, retry", *left)
            }
            Outcome::TakeoverDenied => {
                answers::unavailable("placement held by another hostname", Duration::ZERO)
            }
            Outcome::NoHostnameWorkers => {
                answers::unavailable("no live workers for hostname", Duration::ZERO)
            }
            Outcome::BindingQuarantine(left) => {
                answers::unavailable("hostname binding displaced, retry", *left)
            }
            Outcome::EnvConflict => {
                answers::unavailable("hostname bindings inconsistent, retry", Duration::ZERO)
            }
            Outcome::RateLimited(wait) => answers::placement_rate_exceeded(*wait),
            Outcome::NamespaceFull => {
                answers::unavailable("namespace placement limit reached", Duration::ZERO)
            }
            Outcome::Paused => answers::instance_paused(),
            Outcome::Unreplicated => answers::registry_unavailable(),
        }
    }
}

/// What a resolve is asked about.
pub struct Request<'a> {
    pub env: &'a str,
    pub ns: &'a str,
    pub id: &'a str,
    /// The request's hostname in hostname-aware mode, `""` in single mode.
    pub hostname: &'a str,
    pub exclude: Option<&'a str>,
    pub prefer: Option<&'a str>,
    pub affinity: Option<&'a str>,
    pub takeover: &'a str,
    /// Remaining quarantine of a displaced (hostname, ns) binding, in ms.
    pub binding_quarantine: u64,
    /// How long the client must wait before a new placement (zero: it may place now).
    pub placement_wait: Duration,
}

/// The env, takeover rule and quarantine of a (hostname, namespace) in hostname-aware mode,
/// or the refusal when the bindings name none.
pub struct Binding {
    pub env: String,
    pub takeover: String,
    pub quarantine: u64,
}

pub async fn binding(
    store: &Store,
    hostname: &str,
    ns: &str,
) -> Result<Result<Binding, Outcome>, Error> {
    let name = format!("{hostname}{ns}");
    let keys = &store.keys;
    let reply = store
        .redis
        .evalsha(
            &BINDING,
            &[
                keys.bind_hosts().as_bytes(),
                keys.bind_envs().as_bytes(),
                keys.bind_quarantine().as_bytes(),
            ],
            &[name.as_bytes()],
        )
        .await?;
    let items = reply.as_array().unwrap_or_default();
    let text = |i: usize| items.get(i).and_then(Reply::as_str);
    let refusal = match text(0) {
        Some("ok") => {
            let quarantine = text(3).and_then(|q| q.parse().ok());
            if let (Some(env), Some(takeover), Some(quarantine)) = (text(1), text(2), quarantine) {
                return Ok(Ok(Binding {
                    env: env.to_owned(),
                    takeover: takeover.to_owned(),
                    quarantine,
                }));
            }
            None
        }
        Some("no-hostname-workers") => Some(Outcome::NoHostnameWorkers),
        Some("env-conflict") => Some(Outcome::EnvConflict),
        _ => None,
    };
    let refusal = refusal
        .ok_or_else(|| Error::new(Origin::Internal, format!("binding answered {reply:?}")))?;
    Ok(Err(refusal))
}

/// Per-core constants of every resolve, formatted once.
pub struct Constants {
    lease: String,
    balance: String,
    /// Rows of a namespace one bucket's placements hash may hold, `""` for no limit: the
    /// bucket's share of `placement.max_rows_per_namespace` (ids spread evenly over the
    /// buckets, and a count kept elsewhere would be a key outside the bucket's slot).
    max_rows: String,
    /// Strict mode, when it is on.
    strict: Option<Strict>,
}

impl Constants {
    pub fn new(config: &crate::config::Config) -> Constants {
        Constants {
            lease: config.lease_ttl_ms.to_string(),
            balance: config.balance_factor.to_string(),
            max_rows: (config.placement.max_rows_per_namespace).map_or_else(String::new, |n| {
                n.div_ceil(u64::from(config.shards)).to_string()
            }),
            strict: Strict::of(config),
        }
    }
}

/// The one live owner of the request's instance, or why there is none. `ejected` is the JSON
/// list of sessions this core could not reach lately.
pub async fn resolve(
    store: &Store,
    constants: &Constants,
    ejected: &str,
    req: &Request<'_>,
) -> Result<Outcome, Error> {
    let bucket = bucket_of(req.id, store.keys.shards());
    // What only the slower paths of the script read, in one newline-separated argument (see
    // lua/resolve.lua): a steady request sends Redis 3 arguments, not 15. Built on the stack.
    let mut slow: SmallVec<[u8; 256]> = SmallVec::new();
    let (mut r1, mut r2, mut quarantine, mut wait) = (
        itoa::Buffer::new(),
        itoa::Buffer::new(),
        itoa::Buffer::new(),
        itoa::Buffer::new(),
    );
    // Rounded up: a wait of a fraction of a millisecond is a wait.
    let wait_ms = req.placement_wait.as_micros().div_ceil(1000);
    for (i, field) in [
        constants.lease.as_str(),
        constants.balance.as_str(),
        req.exclude.unwrap_or(""),
        req.prefer.unwrap_or(""),
        req.affinity.unwrap_or(""),
        ejected,
        r1.format(rand::random::<u32>()),
        r2.format(rand::random::<u32>()),
        req.takeover,
        quarantine.format(req.binding_quarantine),
        wait.format(wait_ms),
        constants.max_rows.as_str(),
        store.ledger_cap(),
        req.env,
        req.ns,
    ]
    .into_iter()
    .enumerate()
    {
        if i > 0 {
            slow.push(b'\n');
        }
        slow.extend_from_slice(field.as_bytes());
    }
    // Every key the script touches, declared: on a resharding Redis Cluster a script whose
    // keys are split between two nodes is refused (ASK, then TRYAGAIN) instead of running
    // against half of them, which could place a placed id again.
    let keys = &store.keys;
    let fixed = keys.bucket(bucket);
    let placements = keys.placements(bucket, req.env, req.ns);
    let overwritten = keys.overwritten(bucket, req.env, req.ns);
    let nsw = keys.nsw(bucket, req.hostname, req.ns);
    if let Some(strict) = &constants.strict {
        strict.quarantine_failed_over(store).await?;
    }
    let reply = store
        .redis
        .evalsha(
            &RESOLVE,
            &[
                placements.as_bytes(),
                fixed.workers.as_bytes(),
                overwritten.as_bytes(),
                nsw.as_bytes(),
                fixed.boot_time.as_bytes(),
                fixed.epoch.as_bytes(),
                fixed.alive.as_bytes(),
                fixed.ledger.as_bytes(),
                fixed.ledger_last.as_bytes(),
            ],
            &[req.id.as_bytes(), req.hostname.as_bytes(), &slow],
        )
        .await?;
    let mut outcome = parse(&reply)
        .ok_or_else(|| Error::new(Origin::Internal, format!("resolve answered {reply:?}")))?;
    // Hostname-aware: no candidate for this hostname is "no live workers for hostname".
    if outcome == Outcome::NoBackends && !req.hostname.is_empty() {
        outcome = Outcome::NoHostnameWorkers;
    }
    if let (Outcome::Forward(placement), Some(strict)) = (&outcome, &constants.strict) {
        if placement.placed {
            if !strict.replicated(store, &placements).await {
                release(store, req, placement).await?;
                outcome = Outcome::Unreplicated;
            }
        } else if strict.may_be_unreplicated(&placement.epoch, crate::clock::now_ms())
            && !strict.replicated(store, &placements).await
        {
            // Another request's placement, not yet known to be on the replicas: its placer
            // releases it if it is not.
            outcome = Outcome::Unreplicated;
        }
    }
    Ok(outcome)
}

fn parse(reply: &Reply) -> Option<Outcome> {
    // An existing row's live owner: one string, 'sessionId epoch overwritten', split from the
    // right (the epoch is digits or empty, the flag one digit).
    if let Some(steady) = reply.as_str() {
        let mut fields = steady.rsplitn(3, ' ');
        let (overwritten, epoch, session_id) = (fields.next()?, fields.next()?, fields.next()?);
        return Some(Outcome::Forward(Placement {
            session_id: Text::from(session_id),
            epoch: Text::from(epoch),
            worker: None,
            placed: false,
            overwritten: overwritten == "1",
            inherited_wind_down: None,
        }));
    }
    let items = reply.as_array()?;
    let text = |i: usize| items.get(i).and_then(Reply::as_str);
    let millis = |i: usize| Some(Duration::from_millis(text(i)?.parse().ok()?));
    Some(match text(0)? {
        "placed" => Outcome::Forward(Placement {
            session_id: items.get(1)?.text()?,
            epoch: items.get(2)?.text()?,
            placed: true,
            overwritten: text(3)? == "1",
            inherited_wind_down: text(4)?.parse().ok(),
            worker: Some(WorkerAddress {
                advertise_url: text(5)?.to_owned(),
                secret: text(6)?.to_owned(),
            }),
        }),
        "unknown-ns" => Outcome::UnknownNs,
        "no-backends" => Outcome::NoBackends,
        "quarantine" => Outcome::Quarantine(millis(1)?),
        "takeover-pending" => Outcome::TakeoverPending(millis(1)?),
        "takeover-denied" => Outcome::TakeoverDenied,
        "binding-quarantine" => Outcome::BindingQuarantine(millis(1)?),
        "rate-limited" => Outcome::RateLimited(millis(1)?),
        "namespace-full" => Outcome::NamespaceFull,
        "paused" => Outcome::Paused,
        _ => return None,
    })
}

/// After a 2xx from the owner at `epoch`: the overwritten marker, if at or below it, goes.
pub async fn clear_overwritten(store: &Store, req: &Request<'_>, epoch: &str) -> Result<(), Error> {
    let key = store
        .keys
        .overwritten(bucket_of(req.id, store.keys.shards()), req.env, req.ns);
    store
        .redis
        .evalsha(
            &OVERWRITTEN_CLEAR,
            &[key.as_bytes()],
            &[req.id.as_bytes(), epoch.as_bytes()],
        )
        .await?;
    Ok(())
}

/// A new placement that inherited a dead owner's wind-down fence: its new owner is told, as
/// the spec says the fence re-notifies a replacement owner.
pub async fn tell_inherited_wind_down(
    store: &Store,
    ns: &str,
    id: &str,
    placement: &Placement,
) -> Result<(), Error> {
    if let Some(fence) = placement.inherited_wind_down {
        let message = [WindDown::new(ns, id, Some(fence))];
        store
            .push_wind_downs(&placement.session_id, &message)
            .await?;
    }
    Ok(())
}

/// Frees a placement this node just made whose forward never reached the worker, so the
/// client's retry places the id afresh (compare-and-delete on session and epoch).
pub async fn release(store: &Store, req: &Request<'_>, placement: &Placement) -> Result<(), Error> {
    let row = Release {
        env: req.env,
        ns: req.ns,
        id: req.id,
        session_id: &placement.session_id,
        epoch: &placement.epoch,
    };
    store
        .release(bucket_of(req.id, store.keys.shards()), &[row])
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_follow_the_table() {
        let r = Outcome::Quarantine(Duration::from_millis(2001)).refusal();
        assert_eq!(r.status, http::StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(&r.body[..], br#"{"error":"registry cold start, retry"}"#);
        assert_eq!(r.headers.last().unwrap().1, "3");
        let r = Outcome::NoBackends.refusal();
        assert_eq!(r.headers.last().unwrap().1, "1");
        let r = Outcome::TakeoverPending(Duration::from_millis(10)).refusal();
        assert_eq!(r.headers.last().unwrap().1, "1");
        assert_eq!(
            &Outcome::UnknownNs.refusal().body[..],
            br#"{"error":"unknown namespace"}"#
        );
        let r = Outcome::NamespaceFull.refusal();
        assert_eq!(r.status, http::StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            &r.body[..],
            br#"{"error":"namespace placement limit reached"}"#
        );
        assert_eq!(r.headers.last().unwrap().1, "1");
        let r = parse(&Reply::Array(["rate-limited", "1500"].map(bulk).to_vec()))
            .unwrap()
            .refusal();
        assert_eq!(r.status, http::StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(r.headers.last().unwrap().1, "2");
        let full = Reply::Array(["namespace-full"].map(bulk).to_vec());
        assert_eq!(parse(&full), Some(Outcome::NamespaceFull));
        let paused = parse(&Reply::Array(vec![bulk("paused")])).unwrap();
        assert_eq!(paused.name(), "paused");
        let r = paused.refusal();
        assert_eq!(r.status, http::StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(&r.body[..], br#"{"error":"instance paused"}"#);
        assert_eq!(r.headers.last().unwrap().1, "1");
    }

    fn bulk(text: &str) -> Reply {
        Reply::Bulk(text.into())
    }

    #[test]
    fn a_steady_answer_is_one_string_split_from_the_right() {
        let Some(Outcome::Forward(p)) = parse(&bulk("9b2f4c1e 1764400000123 1")) else {
            panic!("not a forward");
        };
        assert_eq!((&*p.session_id, &*p.epoch), ("9b2f4c1e", "1764400000123"));
        assert!(p.overwritten && !p.placed && p.worker.is_none());
        assert!(p.inherited_wind_down.is_none());
        // An epoch-less row (contract: release quotes '' for it).
        let Some(Outcome::Forward(p)) = parse(&bulk("s1  0")) else {
            panic!("not a forward");
        };
        assert_eq!(
            (&*p.session_id, &*p.epoch, p.overwritten),
            ("s1", "", false)
        );
        for bad in ["", "s1", "s1 1"] {
            assert_eq!(parse(&bulk(bad)), None, "{bad:?}");
        }
    }

    #[test]
    fn a_new_placement_names_its_worker() {
        let reply = Reply::Array(
            [
                "placed",
                "s2",
                "17",
                "0",
                "1764400009000",
                "http://10.0.0.2:8080",
                "k",
            ]
            .map(bulk)
            .to_vec(),
        );
        let Some(Outcome::Forward(p)) = parse(&reply) else {
            panic!("not a forward");
        };
        assert!(p.placed && !p.overwritten);
        assert_eq!(p.inherited_wind_down, Some(1_764_400_009_000));
        let worker = p.worker.unwrap();
        assert_eq!(
            (&*worker.advertise_url, &*worker.secret),
            ("http://10.0.0.2:8080", "k")
        );
        // A placement without its worker is malformed, not a forward to nowhere.
        let short = Reply::Array(["placed", "s2", "17", "0", ""].map(bulk).to_vec());
        assert_eq!(parse(&short), None);
    }
}
