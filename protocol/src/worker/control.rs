//! The worker's side of the registry protocol, generic over the [`Runtime`] that sends and
//! sleeps: register (retrying with jittered exponential backoff until it works), heartbeat
//! every lease/3, register again when the registry lost the session (reclaiming held
//! instances), hand control messages to the application and ack them, stop when the credential
//! is refused past the lease, and on a graceful stop release what it holds and deregister
//! ([`leave`]). Each worker library runs [`lifecycle`] on its own runtime (a monoio control
//! thread, a tokio task).

use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::pin::pin;
use std::time::{Duration, Instant};

use futures_util::future::{Either, select};
use serde::Deserialize;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Number, Value};
use tracing::{error, info, warn};

use super::serve::Core;
use super::state::Message;
use crate::Takeover;
use crate::registry::{
    ControlMessage, DeregisterRequest, HeartbeatAnswer, HeartbeatRequest, MsgId, RegisterAnswer,
    RegisterRequest, ReleaseAnswer, ReleaseRow,
};

const REGISTER_BACKOFF: (Duration, Duration) =
    (Duration::from_millis(500), Duration::from_secs(30));
const HEARTBEAT_BACKOFF: (Duration, Duration) =
    (Duration::from_millis(500), Duration::from_secs(5));
/// Msg ids remembered after delivery, so a message re-delivered before its ack landed is not
/// handed to the application twice.
const SEEN_KEPT: usize = 1024;
/// Instances per release call at shutdown, well under the registry's 1 MiB body cap.
const RELEASE_BATCH: usize = 1000;
/// How long registrations refused 401/403 are retried before the worker stops, until a
/// registration told it the registry's lease (the node's default `lease_ttl_ms`).
const FIRST_LEASE: Duration = Duration::from_secs(15);
/// Pause before the second and third try of a call that gives up after three.
pub const RETRY_PAUSE: Duration = Duration::from_millis(250);

/// What the registry loop needs of a runtime.
pub trait Runtime {
    /// `POST {registry}/registry/{route}` with the JSON `body` and the worker's credential:
    /// the answer's object on a 2xx ([`read_reply`] tells the rest apart).
    fn post(
        &self,
        route: &'static str,
        body: Vec<u8>,
    ) -> impl Future<Output = Result<Map<String, Value>, Failure>>;
    fn sleep(&self, duration: Duration) -> impl Future<Output = ()>;
    /// Ready once the worker is asked to stop.
    fn stopped(&self) -> impl Future<Output = ()>;
    fn is_stopped(&self) -> bool;
    /// Hands an event to the application, in order, without waiting for it to be handled.
    fn emit(&self, event: Event);
}

/// Why a registry call did not get a 2xx JSON object.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum Failure {
    #[error("registry answered {status}: {error}")]
    Refused {
        status: u16,
        /// The answer's `error` string (the body, when it has none).
        error: String,
        /// The registry lost the session: register again.
        reregister: bool,
        /// A higher-epoch registration displaced this one.
        superseded: bool,
    },
    #[error("registry unreachable: {0}")]
    Unreachable(String),
    #[error("registry answered {status} with a body that is not the expected JSON object")]
    BadAnswer { status: u16 },
}

impl Failure {
    /// Whether sending the same call again may succeed.
    pub fn is_transient(&self) -> bool {
        match self {
            Failure::Unreachable(_) => true,
            Failure::Refused { status, .. } => *status >= 500,
            Failure::BadAnswer { .. } => false,
        }
    }
}

/// A registry answer of `status` with `body`: its JSON object on a 2xx, or the failure.
pub fn read_reply(status: u16, body: &[u8]) -> Result<Map<String, Value>, Failure> {
    let success = (200..300).contains(&status);
    let object = match serde_json::from_slice(body) {
        Ok(Value::Object(object)) => Some(object),
        _ => None,
    };
    match object {
        Some(object) if success => Ok(object),
        None if success => Err(Failure::BadAnswer { status }),
        object => {
            let object = object.unwrap_or_default();
            let flag = |key: &str| object.get(key).and_then(Value::as_bool) == Some(true);
            Err(Failure::Refused {
                status,
                error: match object.get("error") {
                    Some(Value::String(error)) => error.clone(),
                    _ => String::from_utf8_lossy(body).into_owned(),
                },
                reregister: flag("reregister"),
                superseded: flag("superseded"),
            })
        }
    }
}

/// A 2xx answer's object read as `A`, one of [`crate::registry`]'s answers; `None` when a
/// field the worker cannot do without is missing or malformed (the others read as absent).
pub fn read_answer<A: DeserializeOwned>(answer: Map<String, Value>) -> Option<A> {
    serde_json::from_value(Value::Object(answer)).ok()
}

/// `call` tried up to three times while its failure is `transient`, [`RETRY_PAUSE`] apart.
pub async fn thrice<T, E, C, F, S>(
    mut call: C,
    transient: impl Fn(&E) -> bool,
    sleep: impl Fn(Duration) -> S,
) -> Result<T, E>
where
    C: FnMut() -> F,
    F: Future<Output = Result<T, E>>,
    S: Future<Output = ()>,
{
    let mut tries = 1;
    loop {
        match call().await {
            Err(e) if transient(&e) && tries < 3 => {
                tries += 1;
                sleep(RETRY_PAUSE).await;
            }
            result => return result,
        }
    }
}

async fn post<R: Runtime, B: Serialize + ?Sized>(
    runtime: &R,
    route: &'static str,
    body: &B,
) -> Result<Map<String, Value>, Failure> {
    // The protocol's bodies are plain data: serializing them cannot fail.
    runtime
        .post(route, serde_json::to_vec(body).expect("request serializes"))
        .await
}

async fn post_thrice<R: Runtime, B: Serialize + ?Sized>(
    runtime: &R,
    route: &'static str,
    body: &B,
) -> Result<Map<String, Value>, Failure> {
    thrice(
        || post(runtime, route, body),
        Failure::is_transient,
        |pause| runtime.sleep(pause),
    )
    .await
}

/// What a worker registers with besides its [`Core`]: hostname-aware mode's fields (each sent
/// only when set) and what to do when the credential is refused.
#[derive(Clone, Debug)]
pub struct Registration {
    /// Hostname-aware mode (spec "Placement"): the hostname served, its environment (or one
    /// per namespace), the policy when another hostname's worker holds an instance, and this
    /// registration's epoch (a higher one supersedes it).
    pub hostname: Option<String>,
    pub env: Option<String>,
    pub envs: BTreeMap<String, String>,
    pub takeover: Option<Takeover>,
    pub epoch: Option<u64>,
    /// Stop when the registry refuses the credential (401 or 403) and the worker cannot
    /// recover within its lease: the heartbeats still refused once the lease lapsed, or the
    /// registrations refused for a whole lease. The worker then stops heartbeating, drops what
    /// it held, refuses instance requests and tells the application
    /// ([`Event::CredentialRefused`]), which typically exits non-zero so that a supervisor notices.
    /// Default true; false keeps retrying (with the same session) until the credential works
    /// again.
    pub stop_on_refused_credential: bool,
}

impl Default for Registration {
    /// Single mode; stopping when the credential is refused past the lease.
    fn default() -> Registration {
        Registration {
            hostname: None,
            env: None,
            envs: BTreeMap::new(),
            takeover: None,
            epoch: None,
            stop_on_refused_credential: true,
        }
    }
}

/// Why a worker of `client_id` registering `namespaces`, with `envs` per namespace, could
/// never register: checked before it starts rather than retried forever.
pub fn check_identity(
    client_id: &str,
    namespaces: &[String],
    envs: &BTreeMap<String, String>,
) -> Result<(), String> {
    if client_id.is_empty() {
        return Err("client id is empty".into());
    }
    if namespaces.is_empty() {
        return Err("no namespaces to register".into());
    }
    for ns in namespaces.iter().chain(envs.keys()) {
        if !is_namespace(ns) {
            return Err(format!("namespace {ns:?} is not / plus one path segment"));
        }
    }
    if let Some(unknown) = envs.keys().find(|ns| !namespaces.contains(ns)) {
        return Err(format!(
            "envs names {unknown}, which is not a registered namespace"
        ));
    }
    Ok(())
}

/// `/` plus one path segment.
fn is_namespace(ns: &str) -> bool {
    ns.strip_prefix('/')
        .is_some_and(|segment| !segment.is_empty() && !segment.contains('/'))
}

/// Something the registry protocol brought about, for the application.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// The worker holds a session now: first registration, or re-registration after the
    /// registry lost the previous one.
    Registered {
        session_id: String,
        reregistered: bool,
    },
    /// An operator asked to wind an instance down (or revoked that, with no deadline). The
    /// application releases it when done.
    WindDown(Message),
    /// Re-registration could not reclaim this instance: another worker may own it now. The
    /// worker no longer holds it; the application drops its state.
    Evicted { ns: String, id: String },
    /// The registry's drain state changed (this worker's own flag or an operator's drain).
    /// With a deadline, held instances are force-released when it passes.
    Drain {
        draining: bool,
        deadline: Option<Duration>,
    },
    /// A registration at a higher epoch displaced this one (hostname-aware mode). The worker
    /// stopped heartbeating and refuses every instance request; the application decides what
    /// comes next, typically shutting down.
    Superseded { error: String },
    /// The registry refused the worker's credential (`status` 401 or 403) and it could not
    /// recover within its lease (`stop_on_refused_credential`): the token expired or was revoked,
    /// and no fresh one came (through a token file) in time. The worker stopped heartbeating,
    /// dropped what it held (the registry counts it dead) and refuses every instance request;
    /// the application should stop, and exit non-zero so that a supervisor sees it.
    CredentialRefused { status: u16, error: String },
}

/// Runs the registry protocol until the stop: registers, heartbeats, registers again, and
/// after a supersession or a refused credential waits for the stop. Then [`leave`], for a
/// graceful stop.
pub async fn lifecycle<R: Runtime>(core: &Core, registration: &Registration, runtime: &R) {
    control(core, registration, runtime).lifecycle().await;
}

/// The graceful part of a stop: no new activations, every held instance released, the
/// session deregistered — each call given up after three tries.
pub async fn leave<R: Runtime>(core: &Core, registration: &Registration, runtime: &R) {
    control(core, registration, runtime).leave().await;
}

fn control<'c, R>(
    core: &'c Core,
    registration: &'c Registration,
    runtime: &'c R,
) -> Control<'c, R> {
    Control {
        core,
        registration,
        runtime,
        acks: Vec::new(),
        seen: VecDeque::new(),
        lease: FIRST_LEASE,
    }
}

/// How a run of heartbeats ended.
enum Ended {
    Stopped,
    /// The registry lost this session: register again, naming it.
    Reregister(String),
    Superseded,
    /// The credential was refused past what the lease allows (`stop_on_refused_credential`).
    CredentialRefused {
        status: u16,
        error: String,
    },
}

struct Control<'c, R> {
    core: &'c Core,
    registration: &'c Registration,
    runtime: &'c R,
    /// Msg ids to ack on the next heartbeat.
    acks: Vec<MsgId>,
    seen: VecDeque<MsgId>,
    /// The lease the registry last granted ([`FIRST_LEASE`] before any).
    lease: Duration,
}

impl<R: Runtime> Control<'_, R> {
    async fn lifecycle(&mut self) {
        let mut previous = None;
        loop {
            let ended = match self.register(previous.as_deref()).await {
                Ok(lease) => self.heartbeats(lease).await,
                Err(ended) => ended,
            };
            match ended {
                Ended::Stopped => return,
                Ended::Reregister(session) => previous = Some(session),
                Ended::Superseded => {
                    // Nothing left to do with the registry; the application decides.
                    self.runtime.stopped().await;
                    return;
                }
                Ended::CredentialRefused { status, error } => {
                    self.credential_refused(status, error);
                    self.runtime.stopped().await;
                    return;
                }
            }
        }
    }

    /// Stops serving for good: the registry refused the credential past the lease, so it
    /// counts this worker dead and may place what it held elsewhere.
    fn credential_refused(&mut self, status: u16, error: String) {
        error!(
            status,
            %error,
            lease_ms = self.lease.as_millis() as u64,
            "the registry refused this worker's credential for longer than its lease; \
             stopping (renew the token, or its token_file)"
        );
        {
            let mut state = self.core.state();
            state.credential_refused = true;
            state.lease_until = None;
        }
        // The gate closed first, as for a supersession.
        self.core.held.forget_all(Instant::now());
        self.emit(Event::CredentialRefused { status, error });
    }

    /// Registers until it works: the lease TTL; or how it ended first (stopped, or refused
    /// 401/403 for a whole lease). `previous`: the session the registry lost, whose instances
    /// this registration reclaims.
    async fn register(&mut self, previous: Option<&str>) -> Result<Duration, Ended> {
        let mut backoff = Backoff::new(REGISTER_BACKOFF);
        // When the current run of refused credentials began.
        let mut refused_since = None;
        loop {
            if self.runtime.is_stopped() {
                return Err(Ended::Stopped);
            }
            let body = self.register_body(previous);
            let sent = Instant::now();
            // A registration cut short may still have landed; its session then lapses.
            let result = self
                .unless_stopped(post(self.runtime, "register", &body))
                .await
                .ok_or(Ended::Stopped)?;
            match result.and_then(|answer| self.registered(answer, sent, previous.is_some())) {
                Ok(lease) => {
                    self.lease = lease;
                    return Ok(lease);
                }
                Err(e) => {
                    if let Some((status, error)) = refused_credential(&e) {
                        let since = *refused_since.get_or_insert(sent);
                        if self.registration.stop_on_refused_credential
                            && sent.duration_since(since) >= self.lease
                        {
                            return Err(Ended::CredentialRefused { status, error });
                        }
                    } else {
                        refused_since = None;
                    }
                    warn!(error = %e, "registration failed; retrying");
                }
            }
            if !self.pause(backoff.next()).await {
                return Err(Ended::Stopped);
            }
        }
    }

    fn register_body(&self, previous: Option<&str>) -> RegisterRequest {
        let config = self.registration;
        // Read before the state lock, never under it (`state.rs`'s lock order). While
        // registering again the lease is unset, so no activation can land meanwhile.
        let instances = previous
            .map(|_| self.core.held.instances())
            .filter(|instances| !instances.is_empty());
        let mut state = self.core.state();
        let (challenge, value) = state.next_challenge();
        RegisterRequest {
            client_id: self.core.client_id.clone(),
            secret: self.core.secret.clone(),
            namespaces: self.core.namespaces.clone(),
            advertise_url: self.core.advertise_url.clone(),
            headroom: state.headroom.into(),
            draining: state.draining,
            challenge,
            challenge_value: value.into(),
            hostname: config.hostname.clone(),
            env: config.env.clone(),
            envs: (!config.envs.is_empty()).then(|| config.envs.clone()),
            takeover: config.takeover,
            epoch: config.epoch,
            instances,
            prev_session_id: previous.map(str::to_owned),
        }
    }

    /// Takes in a register answer: the session, the lease, and the instances it could not
    /// reclaim.
    fn registered(
        &mut self,
        answer: Map<String, Value>,
        sent: Instant,
        reregistered: bool,
    ) -> Result<Duration, Failure> {
        let bad = || Failure::BadAnswer { status: 200 };
        let answer: RegisterAnswer = read_answer(answer).ok_or_else(bad)?;
        let lease = lease_of(answer.lease.expires_in_ms).ok_or_else(bad)?;
        let session = answer.session_id.as_str();
        let mut evicted = Vec::new();
        // Forgotten before the lease is recorded: until then no new activation is taken, so
        // none of these can be activated again here only to be reported evicted.
        let now = Instant::now();
        for duplicate in &answer.duplicates {
            let held = &self.core.held;
            if held.forget(&duplicate.ns, &duplicate.id, now).is_some() {
                evicted.push((duplicate.ns.clone(), duplicate.id.clone()));
            }
        }
        {
            let mut state = self.core.state();
            state.session = Some(session.to_owned());
            state.lease_until = Some(sent + lease);
        }
        info!(
            session,
            advertise_url = %self.core.advertise_url,
            lease_ms = lease.as_millis() as u64,
            evicted = evicted.len(),
            "registered"
        );
        self.emit(Event::Registered {
            session_id: session.to_owned(),
            reregistered,
        });
        for (ns, id) in evicted {
            warn!(%ns, %id, "instance not reclaimed at re-registration; evicted");
            self.emit(Event::Evicted { ns, id });
        }
        self.drain_state(answer.lease.draining, answer.lease.drain_deadline.as_ref());
        Ok(lease)
    }

    async fn heartbeats(&mut self, mut lease: Duration) -> Ended {
        let mut wait = lease / 3;
        let mut backoff = Backoff::new(HEARTBEAT_BACKOFF);
        loop {
            if !self.pause(wait).await {
                return Ended::Stopped;
            }
            let (session, body) = {
                let mut state = self.core.state();
                let (challenge, value) = state.next_challenge();
                let session = state.session.clone().unwrap_or_default();
                let body = HeartbeatRequest {
                    session_id: session.clone(),
                    headroom: state.headroom.into(),
                    draining: state.draining,
                    challenge,
                    challenge_value: value.into(),
                    acks: self.acks.clone(),
                };
                (session, body)
            };
            let sent = Instant::now();
            let Some(result) = self
                .unless_stopped(post(self.runtime, "heartbeat", &body))
                .await
            else {
                return Ended::Stopped;
            };
            match result {
                // Every field but `expiresInMs` reads as absent when it is not understood.
                Ok(answer) => match read_answer::<HeartbeatAnswer<Value>>(answer)
                    .and_then(|answer| Some((lease_of(answer.lease.expires_in_ms)?, answer)))
                {
                    Some((renewed, answer)) => {
                        self.acks.retain(|id| !body.acks.contains(id));
                        lease = renewed;
                        self.lease = lease;
                        wait = lease / 3;
                        backoff = Backoff::new(HEARTBEAT_BACKOFF);
                        self.renewed(&answer, sent, lease);
                        continue;
                    }
                    None => warn!("heartbeat answer without expiresInMs; retrying"),
                },
                Err(Failure::Refused {
                    reregister: true,
                    error,
                    ..
                }) => {
                    warn!(%session, %error, "registry lost the session; registering again");
                    self.core.state().lease_until = None;
                    return Ended::Reregister(session);
                }
                Err(Failure::Refused {
                    superseded: true,
                    error,
                    ..
                }) => {
                    warn!(%session, %error, "registration superseded; no longer serving instances");
                    {
                        let mut state = self.core.state();
                        state.superseded = true;
                        state.lease_until = None;
                    }
                    // The gate closed first: an activation racing with this is either
                    // forgotten here or refused.
                    self.core.held.forget_all(Instant::now());
                    self.emit(Event::Superseded { error });
                    return Ended::Superseded;
                }
                // A 401/403 too, with the same session, while the lease lasts: a token file
                // replaced meanwhile is read again on the next try.
                Err(e) => {
                    if let Some((status, error)) = refused_credential(&e)
                        && self.registration.stop_on_refused_credential
                        && !self.core.state().lease_healthy(Instant::now())
                    {
                        return Ended::CredentialRefused { status, error };
                    }
                    warn!(%session, error = %e, "heartbeat failed; retrying");
                }
            }
            wait = backoff.next().min(lease / 3);
        }
    }

    /// Takes in a successful heartbeat answer.
    fn renewed(&mut self, answer: &HeartbeatAnswer<Value>, sent: Instant, lease: Duration) {
        let mut fresh = Vec::new();
        {
            let mut state = self.core.state();
            state.lease_until = Some(sent + lease);
            state.degraded = answer.degraded == Some(true);
            for message in &answer.messages {
                // Acked by its msgId whatever else it says, so that a message this worker
                // cannot read is not delivered again forever.
                let Some(msg_id) = message
                    .get("msgId")
                    .and_then(|id| MsgId::deserialize(id).ok())
                else {
                    continue;
                };
                // Re-delivered until acked: ack again whatever comes back.
                if !self.acks.contains(&msg_id) {
                    self.acks.push(msg_id.clone());
                }
                if self.seen.contains(&msg_id) {
                    continue;
                }
                if self.seen.len() == SEEN_KEPT {
                    self.seen.pop_front();
                }
                self.seen.push_back(msg_id);
                match parse_wind_down(message) {
                    Some(parsed) => {
                        state.record_message(parsed.clone());
                        fresh.push(parsed);
                    }
                    None => warn!(%message, "unknown control message; acked and ignored"),
                }
            }
        }
        for message in fresh {
            info!(ns = %message.ns, id = %message.id, deadline = ?message.deadline, "wind-down");
            self.emit(Event::WindDown(message));
        }
        self.drain_state(answer.lease.draining, answer.lease.drain_deadline.as_ref());
    }

    /// Records the registry's drain state from a register or heartbeat answer; an event when
    /// it changed.
    fn drain_state(&mut self, draining: bool, deadline: Option<&Number>) {
        let deadline = deadline.and_then(Number::as_f64).map(seconds);
        let changed = {
            let mut state = self.core.state();
            let changed = (state.registry_draining, state.drain_deadline) != (draining, deadline);
            state.registry_draining = draining;
            state.drain_deadline = deadline;
            changed
        };
        if changed {
            self.emit(Event::Drain { draining, deadline });
        }
    }

    /// The graceful part of a stop: no new activations, every held instance released, the
    /// session deregistered — each call given up after three tries.
    async fn leave(&mut self) {
        let session = {
            let mut state = self.core.state();
            state.stopping = true;
            state.draining = true;
            // Only this thread changes either, so they still hold once the map is swept.
            (!state.superseded && !state.credential_refused)
                .then(|| state.session.clone())
                .flatten()
        };
        // The gate closed first: an activation racing with this is either forgotten here, and
        // released below, or refused.
        let held = self.core.held.forget_all(Instant::now());
        let Some(session) = session else {
            return;
        };
        let mut released = 0;
        for batch in held.chunks(RELEASE_BATCH) {
            let rows: Vec<ReleaseRow> = batch
                .iter()
                .map(|(ns, id, epoch)| ReleaseRow {
                    session_id: session.clone(),
                    namespace: ns.clone(),
                    id: id.clone(),
                    epoch: Some(epoch.as_str().to_owned()),
                })
                .collect();
            match post_thrice(self.runtime, "release", &rows).await {
                Ok(answer) => {
                    released += read_answer::<ReleaseAnswer>(answer).map_or(0, |a| a.released)
                }
                Err(e) => warn!(%session, error = %e, "release at shutdown failed; giving up"),
            }
        }
        match post_thrice(
            self.runtime,
            "deregister",
            &DeregisterRequest {
                session_id: session.clone(),
            },
        )
        .await
        {
            Ok(_) => info!(%session, held = held.len(), released, "deregistered"),
            Err(e) => warn!(%session, error = %e, "deregister failed; giving up"),
        }
    }

    fn emit(&self, event: Event) {
        self.runtime.emit(event);
    }

    /// Awaits `call`; `None` when the stop came first.
    async fn unless_stopped<T>(&self, call: impl Future<Output = T>) -> Option<T> {
        let (call, stop) = (pin!(call), pin!(self.runtime.stopped()));
        match select(call, stop).await {
            Either::Left((result, _)) => Some(result),
            Either::Right(_) => None,
        }
    }

    /// Sleeps for `duration`; false when the stop came first.
    async fn pause(&self, duration: Duration) -> bool {
        self.unless_stopped(self.runtime.sleep(duration))
            .await
            .is_some()
    }
}

/// The status and error of a refused credential (401 or 403).
fn refused_credential(error: &Failure) -> Option<(u16, String)> {
    match error {
        Failure::Refused {
            status: status @ (401 | 403),
            error,
            ..
        } => Some((*status, error.clone())),
        _ => None,
    }
}

/// The lease a register or heartbeat answer's `expiresInMs` grants.
fn lease_of(expires_in_ms: u64) -> Option<Duration> {
    (expires_in_ms > 0).then(|| Duration::from_millis(expires_in_ms))
}

/// A heartbeat answer's message, if it is a wind-down this worker can read.
fn parse_wind_down(message: &Value) -> Option<Message> {
    let message = ControlMessage::deserialize(message).ok()?;
    if message.kind != "wind_down" {
        return None;
    }
    let deadline = match message.deadline {
        None => None,
        Some(seconds_left) => Some(seconds(seconds_left.as_f64()?)),
    };
    Some(Message {
        msg_id: message.msg_id.into(),
        ns: message.ns,
        id: message.id,
        deadline,
        moved: message.moved,
    })
}

/// A number of seconds from the registry; a negative one (a deadline already past) is zero.
fn seconds(value: f64) -> Duration {
    Duration::try_from_secs_f64(value.max(0.0)).unwrap_or(Duration::MAX)
}

/// Exponential backoff with jitter: each pause is drawn from the upper half of a window that
/// doubles up to a ceiling, so many workers restarted together do not retry in lockstep.
struct Backoff {
    window: Duration,
    ceiling: Duration,
}

impl Backoff {
    fn new((first, ceiling): (Duration, Duration)) -> Backoff {
        Backoff {
            window: first,
            ceiling,
        }
    }

    fn next(&mut self) -> Duration {
        let window = self.window;
        self.window = (window * 2).min(self.ceiling);
        let half = window / 2;
        half + half.mul_f64(rand::random::<f64>())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn backoff_doubles_to_its_ceiling_with_jitter() {
        let mut backoff = Backoff::new((Duration::from_millis(400), Duration::from_secs(3)));
        for window in [400, 800, 1600, 3000, 3000] {
            let pause = backoff.next();
            let window = Duration::from_millis(window);
            assert!(
                pause >= window / 2 && pause <= window,
                "{pause:?} outside {window:?}"
            );
        }
    }

    #[test]
    fn wind_down_messages() {
        let message =
            json!({ "msgId": "m-1", "type": "wind_down", "ns": "/t", "id": "a", "deadline": 30 });
        assert_eq!(
            parse_wind_down(&message),
            Some(Message {
                msg_id: json!("m-1"),
                ns: "/t".into(),
                id: "a".into(),
                deadline: Some(Duration::from_secs(30)),
                moved: false,
            })
        );
        let moved = json!({ "msgId": 3, "type": "wind_down", "ns": "/t", "id": "a",
            "deadline": 5, "moved": true });
        assert!(parse_wind_down(&moved).unwrap().moved);
        // Anything but `true` is no move, and still the wind-down it says.
        let unsure = json!({ "msgId": 4, "type": "wind_down", "ns": "/t", "id": "a",
            "deadline": 5, "moved": "yes" });
        assert!(!parse_wind_down(&unsure).unwrap().moved);
        let revoked =
            json!({ "msgId": 7, "type": "wind_down", "ns": "/t", "id": "a", "deadline": null });
        assert_eq!(parse_wind_down(&revoked).unwrap().deadline, None);
        let past =
            json!({ "msgId": 8, "type": "wind_down", "ns": "/t", "id": "a", "deadline": -2.5 });
        assert_eq!(
            parse_wind_down(&past).unwrap().deadline,
            Some(Duration::ZERO)
        );
        let other = json!({ "msgId": 9, "type": "rebalance", "ns": "/t", "id": "a" });
        assert_eq!(parse_wind_down(&other), None);
    }
}
