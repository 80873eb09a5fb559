//! The durability sweep (contract §7), each pass after the GC: every due entry of every wake
//! schedule, a page at a time. An id without a placed row is paged in as a placeholder
//! (`wake_due.lua`) and resolved like a request from its row's hostname, which places it on a
//! live worker; its owner then gets `POST {advertiseUrl}{ns}/{id}/_wake`, attested for the
//! instance and epoch. A 200 takes the entry off the schedule (unless the instance scheduled
//! itself again meanwhile); a 202, an error or no answer leaves it for the next pass; an owner
//! that could not be reached loses the placement this sweep just made for it.

use std::time::Duration;

use futures_util::StreamExt;
use http::{Method, StatusCode};
use tracing::{debug, warn};

use pinboard_protocol::header;

use crate::attestation::{Claims, Instance, Purpose, Signer};
use crate::clock::{now_ms, now_secs};
use crate::error::Error;
use crate::http::tls::ClientTls;
use crate::http::{WorkerAddr, fetch};
use crate::node::Core;
use crate::placement::{self, Outcome, Placement};
use crate::store::{DueWake, SCRIPT_PAGE, bucket_of};

/// `_wake` calls in flight at once.
const CONCURRENCY: usize = 8;
/// The most of a `_wake` answer read.
const MAX_ANSWER: usize = 64 * 1024;

/// What the wakes of a pass came to.
#[derive(Default)]
pub(super) struct Wakes {
    /// Answered 200: resident, off the schedule.
    pub woken: u64,
    /// Answered 202, another status, or nothing: tried again next pass.
    pub pending: u64,
}

enum Woke {
    /// Answered 200; `left` when the entry stayed (scheduled again meanwhile).
    Resident {
        left: bool,
    },
    Pending,
}

/// The due entries of (env, ns), bucket by bucket, until `holds()` says the lease is lost.
pub(super) async fn run(
    core: &Core,
    holds: &dyn Fn() -> bool,
    env: &str,
    ns: &str,
    wakes: &mut Wakes,
) -> Result<(), Error> {
    let store = &core.store;
    for bucket in 0..store.keys.shards() {
        let now = now_ms();
        // Entries that stay (a 202, no answer, a reschedule) are skipped past, so a pass wakes
        // each due id once, however the instance reschedules itself.
        let mut skip = 0;
        while holds() {
            let due = store.due_wakes(bucket, env, ns, now, skip).await?;
            let ids: Vec<&str> = due.iter().map(|d| d.id.as_str()).collect();
            let hostnames = if ids.is_empty() {
                Vec::new()
            } else {
                store.page_in_wakes(bucket, env, ns, &ids).await?
            };
            let calls = due
                .iter()
                .zip(&hostnames)
                .map(|(wake, hostname)| wake_one(core, env, ns, wake, hostname));
            let results: Vec<Result<Woke, Error>> = futures_util::stream::iter(calls)
                .buffer_unordered(CONCURRENCY)
                .collect()
                .await;
            for result in results {
                match result? {
                    Woke::Resident { left } => {
                        wakes.woken += 1;
                        skip += usize::from(left);
                    }
                    Woke::Pending => {
                        wakes.pending += 1;
                        skip += 1;
                    }
                }
            }
            if due.len() < SCRIPT_PAGE {
                break;
            }
        }
    }
    Ok(())
}

/// Resolves one due id from `hostname` and wakes its owner.
async fn wake_one(
    core: &Core,
    env: &str,
    ns: &str,
    wake: &DueWake,
    hostname: &str,
) -> Result<Woke, Error> {
    let config = &core.shared.config;
    let store = &core.store;
    // Hostname-aware: the row's hostname must still be bound to this env; while it has no
    // workers (or is bound elsewhere) the wake waits.
    let takeover = if config.hostname_aware {
        if hostname.is_empty() {
            return Ok(Woke::Pending);
        }
        match placement::binding(store, hostname, ns).await? {
            Ok(binding) if binding.env == env => binding.takeover,
            _ => return Ok(Woke::Pending),
        }
    } else {
        String::new()
    };
    let ask = placement::Request {
        env,
        ns,
        id: &wake.id,
        hostname,
        exclude: None,
        prefer: None,
        affinity: None,
        takeover: &takeover,
        // The placeholder row bypasses a displaced binding's quarantine (and, being a row,
        // the namespace's row cap); the sweeper is no client to rate.
        binding_quarantine: 0,
        placement_wait: Duration::ZERO,
    };
    let ejected = core.upstreams.ejected_json();
    let placement =
        match placement::resolve(store, &core.live().settings.resolve, &ejected, &ask).await? {
            Outcome::Forward(placement) => placement,
            Outcome::Unreplicated => {
                core.counters().strict_wait_failed();
                debug!(ns, id = %wake.id, "wake waits: its placement was not replicated");
                return Ok(Woke::Pending);
            }
            refusal => {
                debug!(ns, id = %wake.id, outcome = refusal.name(), "wake waits");
                return Ok(Woke::Pending);
            }
        };
    placement::tell_inherited_wind_down(store, ns, &wake.id, &placement).await?;
    let bucket = bucket_of(&wake.id, store.keys.shards());
    let worker = match &placement.worker {
        Some(w) => Some((w.advertise_url.clone(), w.secret.clone())),
        None => store.worker_of(bucket, &placement.session_id).await?,
    };
    let Some((url, secret)) = worker else {
        return Ok(Woke::Pending);
    };
    let timeout = Duration::from_millis(core.live().config().verify_timeout_ms);
    let tls = &core.shared.tls.workers;
    match call_wake(&url, tls, &secret, ns, &wake.id, &placement, timeout).await {
        Ok(StatusCode::OK) => {
            let gone = store.woken(bucket, env, ns, &wake.id, wake.at).await?;
            Ok(Woke::Resident { left: !gone })
        }
        Ok(status) => {
            debug!(ns, id = %wake.id, %status, "wake answered; tried again next pass");
            Ok(Woke::Pending)
        }
        Err(e) => {
            warn!(ns, id = %wake.id, session = %placement.session_id, error = %e, "wake failed");
            // Never reached: a placement made for this wake goes, so the next pass (or a
            // client) places the id afresh.
            if e.is_retryable() && placement.placed {
                placement::release(store, &ask, &placement).await?;
            }
            Ok(Woke::Pending)
        }
    }
}

/// `POST {advertiseUrl}{ns}/{id}/_wake`, attested for the instance at its epoch.
async fn call_wake(
    url: &str,
    tls: &ClientTls,
    secret: &str,
    ns: &str,
    id: &str,
    placement: &Placement,
    timeout: Duration,
) -> Result<StatusCode, Error> {
    let addr = WorkerAddr::parse(url).map_err(|why| {
        Error::new(
            crate::error::Origin::Internal,
            format!("stored advertiseUrl: {why}"),
        )
    })?;
    let claims = Claims {
        aud: &placement.session_id,
        iat: now_secs(),
        purpose: Purpose::Wake,
        instance: Some(Instance {
            ns,
            id,
            epoch: &placement.epoch,
        }),
        extra: None,
    };
    let mut token = Vec::new();
    Signer::new(secret.as_bytes()).sign_into(&claims, &mut Vec::new(), &mut token);
    let token = String::from_utf8(token).expect("a token is ASCII");
    // `fetch` puts the advertise URL's own path in front.
    let path = format!("{ns}/{id}/_wake");
    let (attestation, epoch) = (header::ATTESTATION, header::EPOCH);
    let headers = [
        (attestation.as_str(), token.as_str()),
        (epoch.as_str(), &*placement.epoch),
    ];
    let answer = fetch(
        &addr,
        tls,
        Method::POST,
        &path,
        &headers,
        b"",
        timeout,
        MAX_ANSWER,
    )
    .await?;
    Ok(answer.status)
}
