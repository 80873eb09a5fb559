//! The worker's side of the registry protocol, one task on the control thread: register
//! (retrying with jittered exponential backoff until it works), heartbeat every lease/3,
//! register again when the registry lost the session (reclaiming held instances), hand control
//! messages to the application and ack them, and on a graceful stop release what it holds and
//! deregister before the listeners close.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use local_sync::mpsc::unbounded::{Rx, Tx, channel};
use pinboard_http::Shutdown;
use pinboard_protocol::registry::{
    ControlMessage, DeregisterRequest, HeartbeatAnswer, HeartbeatRequest, MsgId, RegisterAnswer,
    RegisterRequest, ReleaseAnswer, ReleaseRow,
};
use serde::Deserialize;
use serde_json::{Map, Number, Value};
use tracing::{error, info, warn};

use crate::app::{App, Event};
use crate::handle::Handle;
use crate::registry::{CallError, read_answer};
use crate::state::{Message, Shared, local_shutdown};

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
/// How long events already queued may still run once the worker stopped.
const EVENTS_DRAIN: Duration = Duration::from_secs(5);

pub(crate) async fn run<A: App>(shared: Arc<Shared>, app: Arc<A>) {
    let stop = local_shutdown(&shared, |shared| &shared.stop);
    let (events, inbox) = channel();
    let delivery = monoio::spawn(deliver(app, Handle::new(shared.clone()), inbox));
    let mut control = Control {
        shared: shared.clone(),
        events,
        stop,
        acks: Vec::new(),
        seen: VecDeque::new(),
        lease: FIRST_LEASE,
    };
    control.lifecycle().await;
    if shared.graceful.load(Ordering::SeqCst) {
        control.leave().await;
    }
    shared.serving_stop.fire();
    // Closing the channel lets the delivery task finish the events already queued.
    drop(control);
    let _ = monoio::time::timeout(EVENTS_DRAIN, delivery).await;
}

/// Hands events to the application one at a time, in order, off the heartbeat path.
async fn deliver<A: App>(app: Arc<A>, worker: Handle, mut inbox: Rx<Event>) {
    while let Some(event) = inbox.recv().await {
        app.on_event(&worker, event).await;
    }
}

/// How a run of heartbeats ended.
enum Ended {
    Stopped,
    /// The registry lost this session: register again, naming it.
    Reregister(String),
    Superseded,
    /// The credential was refused past what the lease allows (`stop_when_unauthorized`).
    Unauthorized {
        status: u16,
        error: String,
    },
}

struct Control {
    shared: Arc<Shared>,
    events: Tx<Event>,
    stop: Shutdown,
    /// Msg ids to ack on the next heartbeat.
    acks: Vec<MsgId>,
    seen: VecDeque<MsgId>,
    /// The lease the registry last granted ([`FIRST_LEASE`] before any).
    lease: Duration,
}

impl Control {
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
                    self.stop.fired().await;
                    return;
                }
                Ended::Unauthorized { status, error } => {
                    self.unauthorized(status, error);
                    self.stop.fired().await;
                    return;
                }
            }
        }
    }

    /// Stops serving for good: the registry refused the credential past the lease, so it
    /// counts this worker dead and may place what it held elsewhere.
    fn unauthorized(&mut self, status: u16, error: String) {
        error!(
            status,
            %error,
            lease_ms = self.lease.as_millis() as u64,
            "the registry refused this worker's credential for longer than its lease; \
             stopping (renew the token, or its token_file)"
        );
        {
            let mut state = self.shared.state();
            state.unauthorized = true;
            state.lease_until = None;
        }
        // The gate closed first, as for a supersession.
        self.shared.held.forget_all(Instant::now());
        self.emit(Event::Unauthorized { status, error });
    }

    /// Registers until it works: the lease TTL; or how it ended first (stopped, or refused
    /// 401/403 for a whole lease). `previous`: the session the registry lost, whose instances
    /// this registration reclaims.
    async fn register(&mut self, previous: Option<&str>) -> Result<Duration, Ended> {
        let mut backoff = Backoff::new(REGISTER_BACKOFF);
        // When the current run of refused credentials began.
        let mut refused_since = None;
        loop {
            if self.stop.is_fired() {
                return Err(Ended::Stopped);
            }
            let body = self.register_body(previous);
            let sent = Instant::now();
            let registry = &self.shared.registry;
            // A registration cut short may still have landed; its session then lapses.
            let result = self
                .unless_stopped(registry.post("register", &body))
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
                        if self.shared.config.stop_when_unauthorized
                            && sent.duration_since(since) >= self.lease
                        {
                            return Err(Ended::Unauthorized { status, error });
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
        let config = &self.shared.config;
        // Read before the state lock, never under it (`state.rs`'s lock order). While
        // registering again the lease is unset, so no activation can land meanwhile.
        let instances = previous
            .map(|_| self.shared.held.instances())
            .filter(|instances| !instances.is_empty());
        let mut state = self.shared.state();
        let (challenge, value) = state.next_challenge();
        RegisterRequest {
            client_id: config.client_id.clone(),
            secret: self.shared.secret.clone(),
            namespaces: config.namespaces.clone(),
            advertise_url: self.shared.advertise_url.clone(),
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
    ) -> Result<Duration, CallError> {
        let bad = || CallError::BadAnswer { status: 200 };
        let answer: RegisterAnswer = read_answer(answer).ok_or_else(bad)?;
        let lease = lease_of(answer.lease.expires_in_ms).ok_or_else(bad)?;
        let session = answer.session_id.as_str();
        let mut evicted = Vec::new();
        // Forgotten before the lease is recorded: until then no new activation is taken, so
        // none of these can be activated again here only to be reported evicted.
        let now = Instant::now();
        for duplicate in &answer.duplicates {
            let held = &self.shared.held;
            if held.forget(&duplicate.ns, &duplicate.id, now).is_some() {
                evicted.push((duplicate.ns.clone(), duplicate.id.clone()));
            }
        }
        {
            let mut state = self.shared.state();
            state.session = Some(session.to_owned());
            state.lease_until = Some(sent + lease);
        }
        info!(
            session,
            advertise_url = %self.shared.advertise_url,
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
                let mut state = self.shared.state();
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
            let registry = &self.shared.registry;
            let Some(result) = self.unless_stopped(registry.post("heartbeat", &body)).await else {
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
                Err(CallError::Refused {
                    reregister: true,
                    error,
                    ..
                }) => {
                    warn!(%session, %error, "registry lost the session; registering again");
                    self.shared.state().lease_until = None;
                    return Ended::Reregister(session);
                }
                Err(CallError::Refused {
                    superseded: true,
                    error,
                    ..
                }) => {
                    warn!(%session, %error, "registration superseded; no longer serving instances");
                    {
                        let mut state = self.shared.state();
                        state.superseded = true;
                        state.lease_until = None;
                    }
                    // The gate closed first: an activation racing with this is either
                    // forgotten here or refused.
                    self.shared.held.forget_all(Instant::now());
                    self.emit(Event::Superseded { error });
                    return Ended::Superseded;
                }
                // A 401/403 too, with the same session, while the lease lasts: a token file
                // replaced meanwhile is read again on the next try.
                Err(e) => {
                    if let Some((status, error)) = refused_credential(&e)
                        && self.shared.config.stop_when_unauthorized
                        && !self.shared.state().lease_healthy(Instant::now())
                    {
                        return Ended::Unauthorized { status, error };
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
            let mut state = self.shared.state();
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
            let mut state = self.shared.state();
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
            let mut state = self.shared.state();
            state.stopping = true;
            state.draining = true;
            // Only this thread changes either, so they still hold once the map is swept.
            (!state.superseded && !state.unauthorized)
                .then(|| state.session.clone())
                .flatten()
        };
        // The gate closed first: an activation racing with this is either forgotten here, and
        // released below, or refused.
        let held = self.shared.held.forget_all(Instant::now());
        let Some(session) = session else {
            return;
        };
        let registry = &self.shared.registry;
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
            match registry.post_thrice("release", &rows).await {
                Ok(answer) => {
                    released += read_answer::<ReleaseAnswer>(answer).map_or(0, |a| a.released)
                }
                Err(e) => warn!(%session, error = %e, "release at shutdown failed; giving up"),
            }
        }
        match registry
            .post_thrice(
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
        // The delivery task lives as long as this loop; a send cannot fail before it ends.
        let _ = self.events.send(event);
    }

    /// Awaits `call`; `None` when the stop came first.
    async fn unless_stopped<T>(&self, call: impl Future<Output = T>) -> Option<T> {
        monoio::select! {
            result = call => Some(result),
            _ = self.stop.fired() => None,
        }
    }

    /// Sleeps for `duration`; false when the stop came first.
    async fn pause(&self, duration: Duration) -> bool {
        monoio::select! {
            _ = monoio::time::sleep(duration) => true,
            _ = self.stop.fired() => false,
        }
    }
}

/// The status and error of a refused credential (401 or 403).
fn refused_credential(error: &CallError) -> Option<(u16, String)> {
    match error {
        CallError::Refused {
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
            })
        );
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
