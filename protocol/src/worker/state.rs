//! The state the registry protocol moves, as both worker libraries keep it: the session, the
//! lease, the last two challenges, the flags sent and received, the control [`Message`]s; and
//! from it, the [`Gate`] an admission is decided under. A worker keeps it in its
//! [`Core`](super::serve::Core) beside the [`HeldMap`](super::held::HeldMap).
//!
//! Lock order: a shard, then the state. An admission takes the state lock briefly while it
//! holds its key's shard (to read the lease and flags, the [`Gate`]); no thread holding the
//! state lock takes a shard, and none holds two shards. Either lock is held only for map
//! operations and small copies, never across an await, and the state lock is never held while
//! a shard grows, so a serving thread waits neither on a registry call nor on a rehash.
//!
//! What the single mutex over both used to guarantee, and how it still holds:
//! - A graceful stop or a supersession first closes the gate under the state lock (`stopping`;
//!   `superseded`, `lease_until = None`), then forgets every shard. An admission reads the
//!   gate and records the instance under one hold of its shard, so it either came before that
//!   shard was swept (and is forgotten with it: released at shutdown) or after the gate
//!   closed (and is refused).
//! - A registration forgets the instances it failed to reclaim before it records the new
//!   lease. Until then no new activation is taken (the lease is unset while registering), so
//!   none can be activated and then reported evicted.
//! - What reads both (stats, the instances reclaimed at registration, release and tag: the
//!   epoch, then the session) reads one and then the other. Each answer was already a snapshot
//!   overtaken once the lock was released; the held map alone is now read shard by shard.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::held::Gate;

/// Control messages kept for the application to list.
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
    /// A move: the instance goes on on another worker (its WebSockets are closed with the
    /// reason `moved`).
    pub moved: bool,
}

/// What the registry protocol moves, one per worker, behind the worker's lock.
pub struct State {
    pub session: Option<String>,
    /// When the lease ends unless renewed, reckoned from when the renewing call was sent.
    pub lease_until: Option<Instant>,
    /// `(challenge, value)`: the current one and the one before, since a probe of one call
    /// may arrive while the next is already under way.
    challenges: [Option<(String, String)>; 2],
    pub headroom: u64,
    /// This worker's own draining flag, sent on heartbeats.
    pub draining: bool,
    /// What the registry last answered: the own flag OR an operator drain.
    pub registry_draining: bool,
    pub drain_deadline: Option<Duration>,
    pub degraded: bool,
    pub superseded: bool,
    /// The registry refused the credential past the lease: the worker stopped.
    pub credential_refused: bool,
    /// Set when a graceful stop begins: no new activations from then on.
    pub stopping: bool,
    pub messages: VecDeque<Message>,
}

impl State {
    pub fn new(headroom: u64) -> State {
        State {
            session: None,
            lease_until: None,
            challenges: [None, None],
            headroom,
            draining: false,
            registry_draining: false,
            drain_deadline: None,
            degraded: false,
            superseded: false,
            credential_refused: false,
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

    /// What admissions may do now: nothing once superseded or past the lease, new
    /// activations only while not stopping.
    pub fn gate(&self, now: Instant) -> Gate {
        let lease = self.lease_healthy(now);
        Gate {
            superseded: self.superseded,
            lease,
            activations: !self.stopping && lease,
        }
    }

    pub fn record_message(&mut self, message: Message) {
        if self.messages.len() == MESSAGES_KEPT {
            self.messages.pop_front();
        }
        self.messages.push_back(message);
    }
}

/// `bytes` random bytes from the thread-local CSPRNG, hex-encoded.
pub fn random_hex(bytes: usize) -> String {
    let mut raw = vec![0u8; bytes];
    rand::fill(&mut raw[..]);
    raw.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::worker::epoch::Epoch;
    use crate::worker::held::{Admission, HeldMap};

    fn e(s: &str) -> Epoch {
        Epoch::parse(s.as_bytes()).unwrap()
    }

    /// An admission to `map` under `state`'s gate, as a worker makes it.
    fn admit(map: &HeldMap, state: &State, id: &str, epoch: &str, now: Instant) -> Admission {
        map.admit("/t", id, &e(epoch), now, || state.gate(now))
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
    fn serving_needs_a_live_lease() {
        let now = Instant::now();
        let map = HeldMap::new(0);
        let mut state = State::new(0);
        assert_eq!(admit(&map, &state, "a", "1", now), Admission::Refused);
        state.lease_until = Some(now + Duration::from_secs(1));
        assert_eq!(
            admit(&map, &state, "a", "1", now),
            Admission::Serve { activated: true }
        );
        // Past the lease nothing is served: another worker may hold "a" by now. A stale epoch
        // is still answered as stale.
        let later = now + Duration::from_secs(2);
        assert_eq!(admit(&map, &state, "a", "1", later), Admission::Refused);
        assert_eq!(admit(&map, &state, "a", "0", later), Admission::Stale);
        assert_eq!(admit(&map, &state, "b", "1", later), Admission::Refused);
        // A renewed lease serves "a" again (still held, at the same epoch).
        state.lease_until = Some(later + Duration::from_secs(1));
        assert_eq!(
            admit(&map, &state, "a", "1", later),
            Admission::Serve { activated: false }
        );
        // Stopping: held instances are served until released, new ones refused.
        state.stopping = true;
        assert_eq!(
            admit(&map, &state, "a", "1", later),
            Admission::Serve { activated: false }
        );
        assert_eq!(admit(&map, &state, "b", "1", later), Admission::Refused);
        state.superseded = true;
        assert_eq!(admit(&map, &state, "a", "1", later), Admission::Refused);
    }
}
