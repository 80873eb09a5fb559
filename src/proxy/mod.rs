//! The data plane: a request for `{base_path}/{ns}/{id}{rest}` placed on its owner (see
//! [`crate::placement`]) and forwarded over this core's keep-alive connections, signed with an
//! attestation and fenced by the placement epoch; in-band refusals re-placed once.

mod admission;
mod forward;
mod headers;

use std::time::{Duration, Instant};

use http::{StatusCode, Version, header};

pub use forward::GOODBYE_WITHIN;
pub use headers::{Forwarded, request_head, response_fields};

use crate::access_log::Record;
use crate::answers::{self, Handled};
use crate::attestation::{Claims, Extra, Instance, Purpose};
use crate::clock;
use crate::correlation::Correlation;
use crate::fleet::Standing;
use crate::http::{Request, Response, splits_when_decoded};
use crate::names::valid_id;
use crate::node::Core;
use crate::placement::{self, Outcome};
use crate::redis::Text;
use crate::store::{SINGLE_ENV, bucket_of};
use crate::upstream::{Inflight, Known};

/// `{ns}/{id}{rest}` below the base path.
struct Route<'a> {
    ns: &'a str,
    id: &'a str,
}

impl<'a> Route<'a> {
    /// `None` when the id is empty, too long, or outside `[A-Za-z0-9._~-]`, or when what
    /// follows it would split into other segments once decoded (`%2F`, `%5C`: a worker's server
    /// that decodes would route `..%2F..%2Fadmin` as `../../admin`).
    fn parse(path: &'a str) -> Option<Route<'a>> {
        let after_ns = path[1..].find('/').map(|i| i + 1)?;
        let ns = &path[..after_ns];
        let tail = &path[after_ns + 1..];
        let (id, rest) = tail.split_at(tail.find('/').unwrap_or(tail.len()));
        (valid_id(id) && !splits_when_decoded(rest)).then_some(Route { ns, id })
    }
}

/// The request's hostname: the Host header without its port, lowercased.
fn host_of(req: &Request<'_>) -> Option<String> {
    let host = req.header(header::HOST)?.to_str().ok()?;
    let host = match host.strip_prefix('[') {
        // An IPv6 literal: `[::1]:8080`.
        Some(v6) => v6.split(']').next()?,
        None => host.rsplit_once(':').map_or(host, |(h, _)| h),
    };
    (!host.is_empty()).then(|| host.to_ascii_lowercase())
}

/// Serves `path` (below the base path) and `path_and_query` (the same with the query, as the
/// worker gets it). What it decides (the instance, each resolution, the forward) is noted in
/// `record`.
pub async fn handle(
    core: &Core,
    req: &mut Request<'_>,
    path: &str,
    path_and_query: &str,
    correlation: &Correlation,
    record: &mut Record,
) -> Handled {
    // RFC 9112 §3.2: an HTTP/1.1 request names its host (a second `Host` is refused with the
    // head; an absolute-form target's authority became `Host` there), and so does an HTTP/2
    // one (its `:authority` became `Host`).
    if req.version() != Version::HTTP_10 && req.header(header::HOST).is_none() {
        return Ok(answers::bad_request("missing Host header"));
    }
    let standing = core.shared.standing();
    if standing == Standing::NotServing {
        record.outcome(core.counters(), "not-serving");
    }
    standing.check()?;
    let Some(route) = Route::parse(path) else {
        return Ok(answers::invalid_instance_id());
    };
    record.ns = route.ns.into();
    record.id = route.id.into();
    // The settings of this request, whatever a reload does meanwhile.
    let live = core.live();
    let config = live.config();
    // The protocol an upgrade asks for, kept towards the worker.
    let protocol = forward::upgrade_protocol(&req.head, &config.forwards.upgrade_protocols);
    let upgrade = protocol.is_some();
    // Only a request without a body can be sent again after an in-band refusal.
    let replayable = !req.has_body();
    let timeout = Duration::from_millis(config.forwards.timeout_ms);
    let mut exclude: Option<Text> = None;

    // Hostname-aware: the Host header names the hostname, whose binding names the env.
    let hostname = if config.hostname_aware {
        match host_of(req) {
            Some(host) => host,
            None => {
                return Ok(answers::bad_request("missing Host header"));
            }
        }
    } else {
        String::new()
    };
    let binding = if config.hostname_aware {
        match placement::binding(&core.store, &hostname, route.ns).await? {
            Ok(binding) => Some(binding),
            Err(refusal) => {
                record.outcome(core.counters(), refusal.name());
                return Ok(refusal.refusal());
            }
        }
    } else {
        None
    };
    let env = binding.as_ref().map_or(SINGLE_ENV, |b| b.env.as_str());
    let admitted = admission::admit(core, &live, req, route.ns, &hostname, env).await?;
    let prefer = admitted
        .caller_session
        .as_ref()
        .map(|s| s.session_id.as_str());
    // The client as `trusted_proxies` says: what `affinity = "ip"` keys on, and whom a new
    // placement counts against (`limits.new_placements_per_ip_per_s`).
    let client = placement::client_ip(req.peer.ip(), &config.trusted_proxies, req);
    let affinity = placement::affinity_key(&config.affinity, client, req);
    let rate = (live.placement_rate.as_deref())
        .map(|rate| (rate, rate.client(client, admitted.account.as_deref())));

    // Once, once more after an in-band refusal (excluding the refusing worker), and up to
    // twice more when a resolution went stale before its forward was sent.
    let (mut refused, mut stale) = (0, 0);
    loop {
        let resolved_at = Instant::now();
        let ask = placement::Request {
            env,
            ns: route.ns,
            id: route.id,
            hostname: &hostname,
            exclude: exclude.as_deref(),
            prefer,
            affinity: affinity.as_deref(),
            takeover: binding.as_ref().map_or("", |b| b.takeover.as_str()),
            binding_quarantine: binding.as_ref().map_or(0, |b| b.quarantine),
            placement_wait: rate.map_or(Duration::ZERO, |(rate, client)| {
                rate.wait(&client, resolved_at)
            }),
        };
        let ejected = core.upstreams.ejected_json();
        let outcome =
            placement::resolve(&core.store, &live.settings.resolve, &ejected, &ask).await?;
        record.resolve += resolved_at.elapsed();
        record.outcome(core.counters(), outcome.name());
        let placement = match outcome {
            Outcome::Forward(p) => {
                if p.placed {
                    core.counters().placed();
                    if let Some((rate, client)) = rate {
                        rate.spend(client, resolved_at);
                    }
                }
                p
            }
            Outcome::NoBackends if refused > 0 => {
                return Ok(answers::unavailable(
                    "worker refused activation, retry",
                    Duration::ZERO,
                ));
            }
            Outcome::UnknownNs if upgrade => {
                return Ok(answers::not_found());
            }
            Outcome::Unreplicated => {
                core.counters().strict_wait_failed();
                return Ok(Outcome::Unreplicated.refusal());
            }
            refusal => return Ok(refusal.refusal()),
        };
        placement::tell_inherited_wind_down(&core.store, route.ns, route.id, &placement).await?;
        let known = match core.upstreams.worker(&placement) {
            // Once per session and core: the owner's URL and secret, from its copy.
            Known::Unknown => {
                let bucket = bucket_of(route.id, core.store.keys.shards());
                match core.store.worker_of(bucket, &placement.session_id).await? {
                    Some((url, secret)) => {
                        core.upstreams.learn(&placement.session_id, &url, &secret)
                    }
                    None => Known::Unreachable,
                }
            }
            known => known,
        };
        let Known::Worker(worker) = known else {
            return Ok(answers::bad_gateway());
        };
        let Some(_inflight) = Inflight::enter(&worker, core.upstreams.cap) else {
            return Ok(answers::unavailable(
                "worker inflight cap exceeded, retry",
                Duration::ZERO,
            ));
        };

        let mut buffers = core.upstreams.spare.borrow_mut().pop().unwrap_or_default();
        let iat = clock::now_secs();
        buffers.token.clear();
        let claims = Claims {
            aud: &placement.session_id,
            iat,
            purpose: Purpose::Forward,
            instance: Some(Instance {
                ns: route.ns,
                id: route.id,
                epoch: &placement.epoch,
            }),
            extra: admitted.claims.as_deref().map(Extra),
        };
        core.upstreams.attestations.borrow_mut().sign_into(
            &worker.signer,
            &claims,
            &mut buffers.claims,
            &mut buffers.token,
        );
        let exchange = forward::Exchange {
            addr: &worker.addr,
            tls: &core.shared.tls.workers,
            path_and_query,
            forwarded: Forwarded {
                peer: req.peer.ip(),
                from_trusted_proxy: crate::config::in_cidrs(&config.trusted_proxies, req.peer.ip()),
                scheme: req.scheme(),
                epoch: &placement.epoch,
                attestation: &buffers.token,
                upgrade: protocol.as_ref().map(|p| p.as_bytes()),
                correlation,
                drop_authorization: admitted.passport_consumed
                    && !config.forwards.keep_authorization,
            },
            timeout,
            // After two re-resolves the forward goes anyway: the worker's epoch guard catches
            // one that is still stale.
            resolved_at: (stale < 2).then_some(resolved_at),
            counters: core.counters(),
        };
        record.session = placement.session_id.clone();
        record.epoch = placement.epoch.clone();
        let forwarded_at = Instant::now();
        let pooled = core.upstreams.pool.take(&worker.url, core.counters());
        let (outcome, back) = forward::exchange(req, &exchange, pooled, &mut buffers.head).await;
        let took = forwarded_at.elapsed();
        record.upstream = Some(record.upstream.unwrap_or_default() + took);
        core.counters().upstream_took(took);
        core.upstreams.spare.borrow_mut().push(buffers);
        if let Some(conn) = back {
            core.upstreams.pool.put(&worker.url, conn);
        }
        match outcome {
            forward::Outcome::Relayed { status, close } => {
                // Only HTTP forwards clear the marker, not an upgrade a worker declined.
                if status.is_success() && placement.overwritten && !upgrade {
                    placement::clear_overwritten(&core.store, &ask, &placement.epoch).await?;
                }
                return Ok(Response::relayed(status, close));
            }
            // The tunnel is over: that client connection carries nothing more.
            forward::Outcome::Upgraded => {
                return Ok(Response::relayed(StatusCode::SWITCHING_PROTOCOLS, true));
            }
            forward::Outcome::Refused => {
                placement::release(&core.store, &ask, &placement).await?;
                record.outcome(core.counters(), "nack");
                if refused == 0 && replayable {
                    refused += 1;
                    exclude = Some(placement.session_id.clone());
                    continue;
                }
                return Ok(answers::unavailable(
                    "worker refused activation, retry",
                    Duration::ZERO,
                ));
            }
            forward::Outcome::Unreachable => {
                // A placement this request made, on a worker it never reached, is given back so
                // the client's retry places the id afresh.
                if placement.placed {
                    placement::release(&core.store, &ask, &placement).await?;
                }
                core.upstreams.eject(&placement.session_id);
                return Ok(answers::bad_gateway());
            }
            forward::Outcome::Failed => return Ok(answers::bad_gateway().closing()),
            forward::Outcome::TimedOut => {
                return Ok(answers::upstream_timeout());
            }
            forward::Outcome::BodyFailed(e) => return Ok(answers::body_failed(e)),
            forward::Outcome::Stale => stale += 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Route;

    #[test]
    fn routes_and_ids() {
        let r = Route::parse("/threads/abc/x/y").unwrap();
        assert_eq!((r.ns, r.id), ("/threads", "abc"));
        let r = Route::parse("/threads/abc").unwrap();
        assert_eq!((r.ns, r.id), ("/threads", "abc"));
        let r = Route::parse("/threads/abc/a%20b/%41").unwrap();
        assert_eq!((r.ns, r.id), ("/threads", "abc"));
        for bad in [
            "/threads",
            "/threads/",
            "/threads//x",
            "/threads/a%20b",
            "/t/a b",
            "/py/abc/..%2F..%2Fadmin%2Fsecret",
            "/py/abc/x%2fy",
            "/py/abc/x%5Cy",
            "/py/abc/x\\y",
        ] {
            assert!(Route::parse(bad).is_none(), "{bad}");
        }
        assert!(Route::parse(&format!("/t/{}", "a".repeat(257))).is_none());
        assert!(Route::parse(&format!("/t/{}", "a".repeat(256))).is_some());
    }
}
