//! What the worker's threads share: its identity (secret, advertise URL, registry client), the
//! [`Signal`]s that stop them, and behind one mutex the state the protocol moves — session,
//! lease, challenges, the instances it holds and at which epoch, and the control
//! [`Message`]s received.
//!
//! The mutex is held only for map lookups and small copies, never across an await, so a
//! serving thread never waits on a registry call.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::future::poll_fn;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

use pinboard_http::{DriverKind, Shutdown};
use serde_json::Value;

use crate::config::Config;
use crate::epoch::Epoch;
use crate::registry::Registry;

/// How long a released or evicted instance's epoch is remembered to refuse forwards still
/// carrying it. Pinboard re-resolves a resolution older than 5 s before forwarding, so a
/// stale forward arrives well within this.
const GONE_FOR: Duration = Duration::from_secs(60);
/// Control messages kept for [`Handle::messages`](crate::Handle::messages).
const MESSAGES_KEPT: usize = 1024;

/// A control message from the registry (spec: heartbeat `messages`).
#[derive(Clone, Debug, PartialEq)]
pub struct Message {
    /// Acked on the next heartbeat; kept as sent.
    pub msg_id: Value,
    pub ns: String,
    pub id: String,
    /// Time left to wind the instance down; `None` revokes an earlier wind-down.
    pub deadline: Option<Duration>,
}

pub(crate) struct Shared {
    pub config: Config,
    pub registry: Registry,
    /// Random per process; Pinboard signs attestations with it and presents it on the probe.
    pub secret: String,
    pub advertise_url: String,
    /// The advertise URL's own path: Pinboard puts it before every path it sends.
    pub base: String,
    pub local_addr: SocketAddr,
    /// The event-loop driver of every thread, decided at start.
    pub driver: DriverKind,
    pub started: Instant,
    state: Mutex<State>,
    /// Asks the control thread to stop; `graceful` says whether to release and deregister.
    pub stop: Signal,
    pub graceful: AtomicBool,
    /// Closes the listeners, fired by the control thread once it is done with the registry.
    pub serving_stop: Signal,
}

impl Shared {
    pub fn new(
        config: Config,
        registry: Registry,
        advertise_url: String,
        base: String,
        local_addr: SocketAddr,
        driver: DriverKind,
    ) -> Shared {
        let headroom = config.headroom;
        Shared {
            config,
            registry,
            secret: random_hex(32),
            advertise_url,
            base,
            local_addr,
            driver,
            started: Instant::now(),
            state: Mutex::new(State::new(headroom)),
            stop: Signal::default(),
            graceful: AtomicBool::new(false),
            serving_stop: Signal::default(),
        }
    }

    pub fn state(&self) -> MutexGuard<'_, State> {
        // Nothing panics while holding the lock, but a poisoned lock still holds consistent
        // data: every update below is a single assignment or map operation.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A one-shot flag another thread can await. Each thread awaits it once, in one task that
/// turns it into the thread's own [`Shutdown`], so the waiter list stays as short as the
/// number of threads.
#[derive(Default)]
pub(crate) struct Signal {
    fired: AtomicBool,
    waiters: Mutex<Vec<Waker>>,
}

impl Signal {
    pub fn fire(&self) {
        let mut waiters = self.waiters.lock().unwrap_or_else(|p| p.into_inner());
        self.fired.store(true, Ordering::SeqCst);
        for waker in waiters.drain(..) {
            waker.wake();
        }
    }

    pub fn is_fired(&self) -> bool {
        self.fired.load(Ordering::SeqCst)
    }

    pub async fn wait(&self) {
        poll_fn(|cx| {
            // Checked under the lock `fire` takes, so a fire cannot slip between the check
            // and the registration.
            let mut waiters = self.waiters.lock().unwrap_or_else(|p| p.into_inner());
            if self.is_fired() {
                return Poll::Ready(());
            }
            if !waiters.iter().any(|w| w.will_wake(cx.waker())) {
                waiters.push(cx.waker().clone());
            }
            Poll::Pending
        })
        .await
    }
}

/// A [`Shutdown`] for the calling thread's event loop, fired when the signal `which` picks
/// out of `shared` is.
pub(crate) fn local_shutdown(shared: &Arc<Shared>, which: fn(&Shared) -> &Signal) -> Shutdown {
    let shutdown = Shutdown::default();
    let (shared, local) = (shared.clone(), shutdown.clone());
    monoio::spawn(async move {
        which(&shared).wait().await;
        local.fire();
    });
    shutdown
}

type Key = (String, String);

/// What admitting a forward to an instance decided.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Admission {
    /// Serve it; `activated` when the worker did not hold the instance at this epoch before.
    Serve { activated: bool },
    /// The forward carries an older epoch than the worker holds or released: it was resolved
    /// to a placement that no longer exists.
    Stale,
    /// A new activation the worker must not take: its lease is not known to be live, it is
    /// stopping, or it was superseded.
    Refused,
}

pub(crate) struct State {
    pub session: Option<String>,
    /// When the lease ends unless renewed, reckoned from when the renewing call was sent.
    pub lease_until: Option<Instant>,
    /// `(challenge, value)`: the current one and the one before, since a probe of one call
    /// may arrive while the next is already under way.
    challenges: [Option<(String, String)>; 2],
    held: HashMap<Key, Epoch>,
    gone: HashMap<Key, (Epoch, Instant)>,
    pub headroom: u64,
    /// This worker's own draining flag, sent on heartbeats.
    pub draining: bool,
    /// What the registry last answered: the own flag OR an operator drain.
    pub registry_draining: bool,
    pub drain_deadline: Option<Duration>,
    pub degraded: bool,
    pub superseded: bool,
    /// Set when a graceful stop begins: no new activations from then on.
    pub stopping: bool,
    pub messages: VecDeque<Message>,
}

impl State {
    fn new(headroom: u64) -> State {
        State {
            session: None,
            lease_until: None,
            challenges: [None, None],
            held: HashMap::new(),
            gone: HashMap::new(),
            headroom,
            draining: false,
            registry_draining: false,
            drain_deadline: None,
            degraded: false,
            superseded: false,
            stopping: false,
            messages: VecDeque::new(),
        }
    }

    /// A fresh challenge for the next registry call, which becomes the current one.
    pub fn next_challenge(&mut self) -> (String, String) {
        let fresh = (random_hex(16), random_hex(32));
        self.challenges.rotate_right(1);
        self.challenges[0] = Some(fresh.clone());
        fresh
    }

    pub fn challenge_value(&self, challenge: &str) -> Option<&str> {
        self.challenges
            .iter()
            .flatten()
            .find(|(c, _)| c == challenge)
            .map(|(_, value)| value.as_str())
    }

    pub fn lease_healthy(&self, now: Instant) -> bool {
        self.lease_until.is_some_and(|until| now < until)
    }

    /// Decides whether a forward to `(ns, id)` at `epoch` is served, and records the
    /// instance as held at that epoch when it is.
    pub fn admit(&mut self, ns: &str, id: &str, epoch: &Epoch, now: Instant) -> Admission {
        if self.superseded {
            return Admission::Refused;
        }
        let key = (ns.to_owned(), id.to_owned());
        match self.held.get(&key) {
            Some(held) if epoch < held => return Admission::Stale,
            Some(held) if epoch == held => return Admission::Serve { activated: false },
            _ => {}
        }
        if let Some((gone, at)) = self.gone.get(&key)
            && now.duration_since(*at) < GONE_FOR
            && epoch <= gone
        {
            return Admission::Stale;
        }
        if self.stopping || !self.lease_healthy(now) {
            return Admission::Refused;
        }
        self.gone.remove(&key);
        self.held.insert(key, epoch.clone());
        Admission::Serve { activated: true }
    }

    pub fn epoch_of(&self, ns: &str, id: &str) -> Option<&Epoch> {
        self.held.get(&(ns.to_owned(), id.to_owned()))
    }

    /// Stops holding `(ns, id)`, remembering its epoch for a while to refuse stale forwards.
    /// The epoch it was held at, if it was.
    pub fn forget(&mut self, ns: &str, id: &str, now: Instant) -> Option<Epoch> {
        self.gone
            .retain(|_, (_, at)| now.duration_since(*at) < GONE_FOR);
        let key = (ns.to_owned(), id.to_owned());
        let epoch = self.held.remove(&key)?;
        self.gone.insert(key, (epoch.clone(), now));
        Some(epoch)
    }

    /// Every held instance, sorted: `(ns, id, epoch)`.
    pub fn held(&self) -> Vec<(String, String, Epoch)> {
        let mut held: Vec<_> = self
            .held
            .iter()
            .map(|((ns, id), epoch)| (ns.clone(), id.clone(), epoch.clone()))
            .collect();
        held.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
        held
    }

    /// Held ids by namespace, the shape of `instances` in register and stats.
    pub fn instances(&self) -> BTreeMap<String, Vec<String>> {
        let mut by_ns: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (ns, id, _) in self.held() {
            by_ns.entry(ns).or_default().push(id);
        }
        by_ns
    }

    pub fn record_message(&mut self, message: Message) {
        if self.messages.len() == MESSAGES_KEPT {
            self.messages.pop_front();
        }
        self.messages.push_back(message);
    }
}

/// `bytes` random bytes from the thread-local CSPRNG, hex-encoded.
pub(crate) fn random_hex(bytes: usize) -> String {
    let mut raw = vec![0u8; bytes];
    rand::fill(&mut raw[..]);
    raw.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(s: &str) -> Epoch {
        Epoch::parse(s.as_bytes()).unwrap()
    }

    fn live() -> State {
        let mut state = State::new(10);
        state.lease_until = Some(Instant::now() + Duration::from_secs(60));
        state
    }

    #[test]
    fn secrets_and_challenges_are_fresh_hex() {
        let secret = random_hex(32);
        assert_eq!(secret.len(), 64);
        assert!(secret.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(secret, random_hex(32));
        let mut state = State::new(0);
        let (c1, v1) = state.next_challenge();
        let (c2, v2) = state.next_challenge();
        assert_eq!(state.challenge_value(&c1), Some(v1.as_str()));
        assert_eq!(state.challenge_value(&c2), Some(v2.as_str()));
        state.next_challenge();
        assert_eq!(state.challenge_value(&c1), None);
        assert_eq!(
            state.challenge_value(&v2),
            None,
            "a value is not a challenge"
        );
    }

    #[test]
    fn admission_follows_epochs() {
        let now = Instant::now();
        let mut state = live();
        let activated = Admission::Serve { activated: true };
        let again = Admission::Serve { activated: false };
        assert_eq!(state.admit("/t", "a", &e("5"), now), activated);
        assert_eq!(state.admit("/t", "a", &e("05"), now), again);
        assert_eq!(state.admit("/t", "a", &e("4"), now), Admission::Stale);
        // Re-placed here at a higher epoch: a new activation.
        assert_eq!(state.admit("/t", "a", &e("9"), now), activated);
        assert_eq!(state.epoch_of("/t", "a"), Some(&e("9")));

        assert_eq!(state.forget("/t", "a", now), Some(e("9")));
        assert_eq!(state.forget("/t", "a", now), None);
        assert_eq!(state.admit("/t", "a", &e("9"), now), Admission::Stale);
        assert_eq!(
            state.admit("/t", "a", &e("9"), now + GONE_FOR),
            activated,
            "the memory of a released epoch fades"
        );
        assert_eq!(state.forget("/t", "a", now), Some(e("9")));
        assert_eq!(state.admit("/t", "a", &e("10"), now), activated);
    }

    #[test]
    fn new_activations_need_a_live_lease() {
        let now = Instant::now();
        let mut state = State::new(0);
        assert_eq!(state.admit("/t", "a", &e("1"), now), Admission::Refused);
        state.lease_until = Some(now + Duration::from_secs(1));
        assert_eq!(
            state.admit("/t", "a", &e("1"), now),
            Admission::Serve { activated: true }
        );
        // Held instances keep being served on an expired lease; new ones are refused.
        let later = now + Duration::from_secs(2);
        assert_eq!(
            state.admit("/t", "a", &e("1"), later),
            Admission::Serve { activated: false }
        );
        assert_eq!(state.admit("/t", "b", &e("1"), later), Admission::Refused);
        state.lease_until = Some(later + Duration::from_secs(1));
        state.stopping = true;
        assert_eq!(state.admit("/t", "b", &e("1"), later), Admission::Refused);
        state.superseded = true;
        assert_eq!(state.admit("/t", "a", &e("1"), later), Admission::Refused);
    }

    #[test]
    fn instances_group_by_namespace() {
        let now = Instant::now();
        let mut state = live();
        for (ns, id) in [("/docs", "z"), ("/threads", "b"), ("/threads", "a")] {
            state.admit(ns, id, &e("1"), now);
        }
        let instances = state.instances();
        assert_eq!(instances["/threads"], ["a", "b"]);
        assert_eq!(instances["/docs"], ["z"]);
    }
}
