//! The data plane: a request for `{base_path}/{ns}/{id}{rest}` placed on its owner (see
//! [`crate::placement`]) and forwarded over this core's keep-alive connections, signed with an
//! attestation and fenced by the placement epoch; in-band refusals re-placed once.

mod admission;
mod attestation;
mod forward;
mod headers;
mod pool;

use std::borrow::Cow;
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ahash::AHashMap;
use bytes::BytesMut;
use http::{StatusCode, header};

pub use attestation::{Claims, Extra, Instance, Purpose, Signer};
pub use headers::{BodyFraming, Forwarded, request_head, response_head};

use crate::error::Error;
use crate::http::{Request, Response, WorkerAddr};
use crate::node::Core;
use crate::placement::{self, Outcome, Placement, unavailable};
use crate::registry::valid_id;
use crate::store::SINGLE_ENV;

/// How long a worker that could not be reached stays ejected from new placements (used only
/// when no other candidate remains).
const EJECTION: Duration = Duration::from_secs(10);

/// A worker as this core reaches it: its parsed address, its secret's keyed HMAC state, and
/// the node-wide count of forwards in flight to it.
struct Worker {
    url: String,
    secret: String,
    addr: WorkerAddr,
    signer: Signer,
    inflight: Arc<AtomicU32>,
}

/// Forwards in flight per worker session across all of the node's cores: `forwards.max_inflight`
/// bounds what one node sends one worker, whichever core a client lands on. Each core looks its
/// counter up here once per session (the lock is off the request path); a forward then costs one
/// atomic increment and one decrement.
#[derive(Default)]
pub struct InflightCounters {
    by_session: Mutex<AHashMap<String, Weak<AtomicU32>>>,
}

impl InflightCounters {
    fn of(&self, session: &str) -> Arc<AtomicU32> {
        let mut counters = self.by_session.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(counter) = counters.get(session).and_then(Weak::upgrade) {
            return counter;
        }
        // Counters no core holds any more are dropped now and then, not per lookup.
        if counters.len() >= 1024 && counters.len().is_power_of_two() {
            counters.retain(|_, c| c.strong_count() > 0);
        }
        let counter = Arc::new(AtomicU32::new(0));
        counters.insert(session.to_owned(), Arc::downgrade(&counter));
        counter
    }
}

/// This core's upstream state. Only this core touches it.
pub struct Proxy {
    pool: pool::Pool,
    workers: RefCell<AHashMap<String, Rc<Worker>>>,
    counters: Arc<InflightCounters>,
    ejected: RefCell<AHashMap<String, Instant>>,
    /// In-flight forwards per worker, node-wide (`forwards.max_inflight`).
    cap: u32,
    /// Buffers of finished forwards, reused by the next ones instead of allocated again.
    spare: RefCell<Vec<Buffers>>,
}

/// What one forward writes into: the attestation's claims and token, the request head.
#[derive(Default)]
struct Buffers {
    claims: Vec<u8>,
    token: Vec<u8>,
    head: BytesMut,
}

impl Proxy {
    pub fn new(max_inflight: u32, counters: Arc<InflightCounters>) -> Proxy {
        Proxy {
            pool: pool::Pool::default(),
            workers: RefCell::default(),
            counters,
            ejected: RefCell::default(),
            cap: max_inflight,
            spare: RefCell::default(),
        }
    }

    /// The worker of `placement`; the parsed address and HMAC state are derived once per
    /// (session, URL, secret), not per request.
    fn worker(&self, placement: &Placement) -> Option<Rc<Worker>> {
        if let Some(w) = self.workers.borrow().get(&placement.session_id)
            && w.url == placement.advertise_url
            && w.secret == placement.secret
        {
            return Some(w.clone());
        }
        let worker = Rc::new(Worker {
            url: placement.advertise_url.clone(),
            secret: placement.secret.clone(),
            addr: WorkerAddr::parse(&placement.advertise_url).ok()?,
            signer: Signer::new(placement.secret.as_bytes()),
            inflight: self.counters.of(&placement.session_id),
        });
        let mut workers = self.workers.borrow_mut();
        if workers.len() > 10_000 {
            workers.clear();
        }
        workers.insert(placement.session_id.clone(), worker.clone());
        Some(worker)
    }

    /// Sessions this core could not reach lately, as the JSON list `resolve.lua` takes.
    pub fn ejected_json(&self) -> Cow<'static, str> {
        let mut ejected = self.ejected.borrow_mut();
        ejected.retain(|_, since| since.elapsed() < EJECTION);
        if ejected.is_empty() {
            return Cow::Borrowed("[]");
        }
        Cow::Owned(
            serde_json::to_string(&ejected.keys().collect::<Vec<_>>()).expect("strings serialize"),
        )
    }

    fn eject(&self, session: &str) {
        self.ejected
            .borrow_mut()
            .insert(session.to_owned(), Instant::now());
    }
}

/// Counts a forward in flight to one worker; refused past the cap.
struct Inflight<'a>(&'a AtomicU32);

impl<'a> Inflight<'a> {
    fn enter(worker: &'a Worker, cap: u32) -> Option<Inflight<'a>> {
        if worker.inflight.fetch_add(1, Ordering::AcqRel) >= cap {
            worker.inflight.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(Inflight(&worker.inflight))
    }
}

impl Drop for Inflight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// `{ns}/{id}{rest}` below the base path.
struct Route<'a> {
    ns: &'a str,
    id: &'a str,
}

impl<'a> Route<'a> {
    /// `None` when the id is empty, too long, or outside `[A-Za-z0-9._~-]`.
    fn parse(path: &'a str) -> Option<Route<'a>> {
        let after_ns = path[1..].find('/').map(|i| i + 1)?;
        let ns = &path[..after_ns];
        let rest = &path[after_ns + 1..];
        let id = &rest[..rest.find('/').unwrap_or(rest.len())];
        valid_id(id).then_some(Route { ns, id })
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

fn bad_gateway() -> Response {
    Response::text(StatusCode::BAD_GATEWAY, "bad gateway")
}

/// Serves `path` (below the base path) and `path_and_query` (the same with the query, as the
/// worker gets it).
pub async fn handle(
    core: &Core,
    req: &mut Request<'_>,
    path: &str,
    path_and_query: &str,
) -> Result<Response, Error> {
    if !core.shared.is_serving() {
        core.counters().count("not-serving");
        return Ok(crate::registry::not_serving());
    }
    let Some(route) = Route::parse(path) else {
        return Ok(Response::text(
            StatusCode::BAD_REQUEST,
            "invalid instance id",
        ));
    };
    let config = &core.shared.config;
    // The protocol an upgrade asks for, kept towards the worker.
    let protocol = forward::upgrade_protocol(&req.head);
    let upgrade = protocol.is_some();
    // Only a request without a body can be sent again after an in-band refusal.
    let replayable = !req.has_body();
    let timeout = Duration::from_millis(config.forwards.timeout_ms);
    let mut exclude: Option<String> = None;

    // Hostname-aware: the Host header names the hostname, whose binding names the env.
    let hostname = if config.hostname_aware {
        match host_of(req) {
            Some(host) => host,
            None => {
                return Ok(Response::error(
                    StatusCode::BAD_REQUEST,
                    "missing Host header",
                ));
            }
        }
    } else {
        String::new()
    };
    let binding = if config.hostname_aware {
        match placement::binding(core, &hostname, route.ns).await? {
            Ok(binding) => Some(binding),
            Err(refusal) => return Ok(refusal.refusal()),
        }
    } else {
        None
    };
    let env = binding.as_ref().map_or(SINGLE_ENV, |b| b.env.as_str());
    let admitted = match admission::admit(core, req, route.ns, &hostname, env).await? {
        Ok(admitted) => admitted,
        Err(refusal) => return Ok(refusal),
    };
    let prefer = admitted
        .caller_session
        .as_ref()
        .map(|s| s.session_id.as_str());
    let affinity = placement::affinity_key(&config.affinity, &config.trusted_proxies, req)
        .map(|k| k.into_owned());

    // Once, once more after an in-band refusal (excluding the refusing worker), and up to
    // twice more when a resolution went stale before its forward was sent.
    let (mut refused, mut stale) = (0, 0);
    loop {
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
        };
        let resolved_at = Instant::now();
        let placement = match placement::resolve(core, &ask).await? {
            Outcome::Forward(p) => p,
            Outcome::NoBackends if refused > 0 => {
                return Ok(unavailable(
                    "worker refused activation, retry",
                    Duration::ZERO,
                ));
            }
            Outcome::UnknownNs if upgrade => {
                return Ok(Response::error(StatusCode::NOT_FOUND, "not found"));
            }
            refusal => return Ok(refusal.refusal()),
        };
        if let Some(fence) = placement.inherited_wind_down {
            let message = [(route.ns.to_owned(), route.id.to_owned(), Some(fence))];
            crate::registry::control_push(core, &placement.session_id, &message).await?;
        }
        let Some(worker) = core.proxy.worker(&placement) else {
            return Ok(bad_gateway());
        };
        let Some(_inflight) = Inflight::enter(&worker, core.proxy.cap) else {
            return Ok(unavailable(
                "worker inflight cap exceeded, retry",
                Duration::ZERO,
            ));
        };

        let mut buffers = core.proxy.spare.borrow_mut().pop().unwrap_or_default();
        let iat = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
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
        worker
            .signer
            .sign_into(&claims, &mut buffers.claims, &mut buffers.token);
        let exchange = forward::Exchange {
            addr: &worker.addr,
            path_and_query,
            forwarded: Forwarded {
                peer: req.peer.ip(),
                epoch: &placement.epoch,
                attestation: &buffers.token,
                upgrade: protocol.as_ref().map(|p| p.as_bytes()),
            },
            timeout,
            // After two re-resolves the forward goes anyway: the worker's epoch guard catches
            // one that is still stale.
            resolved_at: (stale < 2).then_some(resolved_at),
        };
        let pooled = core.proxy.pool.take(&worker.url);
        let (outcome, back) = forward::exchange(req, &exchange, pooled, &mut buffers.head).await;
        core.proxy.spare.borrow_mut().push(buffers);
        if let Some(conn) = back {
            core.proxy.pool.put(&worker.url, conn);
        }
        match outcome {
            forward::Outcome::Relayed { status, close } => {
                // Only HTTP forwards clear the marker, not an upgrade a worker declined.
                if status.is_success() && placement.overwritten && !upgrade {
                    placement::clear_overwritten(core, &ask, &placement.epoch).await?;
                }
                return Ok(Response::relayed(status, close));
            }
            // The tunnel is over: that client connection carries nothing more.
            forward::Outcome::Upgraded => {
                return Ok(Response::relayed(StatusCode::SWITCHING_PROTOCOLS, true));
            }
            forward::Outcome::Refused => {
                placement::release(core, &ask, &placement).await?;
                core.counters().count("nack");
                if refused == 0 && replayable {
                    refused += 1;
                    exclude = Some(placement.session_id.clone());
                    continue;
                }
                return Ok(unavailable(
                    "worker refused activation, retry",
                    Duration::ZERO,
                ));
            }
            forward::Outcome::Unreachable => {
                // A placement this request made, on a worker it never reached, is given back so
                // the client's retry places the id afresh.
                if placement.placed {
                    placement::release(core, &ask, &placement).await?;
                }
                core.proxy.eject(&placement.session_id);
                return Ok(bad_gateway());
            }
            forward::Outcome::Failed => return Ok(bad_gateway().closing()),
            forward::Outcome::TimedOut => {
                return Ok(
                    Response::text(StatusCode::GATEWAY_TIMEOUT, "upstream timeout").closing(),
                );
            }
            forward::Outcome::ClientGone => {
                return Ok(Response::empty(StatusCode::BAD_GATEWAY).closing());
            }
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
        for bad in [
            "/threads",
            "/threads/",
            "/threads//x",
            "/threads/a%20b",
            "/t/a b",
        ] {
            assert!(Route::parse(bad).is_none(), "{bad}");
        }
        assert!(Route::parse(&format!("/t/{}", "a".repeat(257))).is_none());
        assert!(Route::parse(&format!("/t/{}", "a".repeat(256))).is_some());
    }
}
