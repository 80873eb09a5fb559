//! The WebSocket goodbye: when an instance's epoch ends on this worker with WebSockets open,
//! they are closed with 1012 (service restart) and a reason, so that their clients reconnect
//! (and reach the instance where it lives now) rather than see a reset.
//!
//! A library [`open`](Goodbyes::open)s a [`Goodbye`] for each WebSocket of an admitted
//! instance, at its epoch, and closes the socket once [`Goodbye::closing`] resolves. What ends
//! an epoch is decided here, from the registry protocol's [`Event`]s and the admissions:
//!
//! - a wind-down whose deadline is reached (the placement is fenced then): the epoch held when
//!   the message came, and those before it; a later message revokes or replaces it. The
//!   library sleeps until the deadline ([`Deadline`]), the rest is decided here;
//! - a move (a wind-down with `moved`): the same, with the reason `moved`;
//! - an eviction (not reclaimed at a re-registration), a supersession, the credential refused
//!   past the lease: every epoch of the instance, or of every instance;
//! - a newer epoch admitted for the instance: the older ones;
//! - a graceful stop, which releases everything ([`Goodbyes::all_ended`]).
//!
//! The reason names the epoch that ended (`epoch 1733456789012 ended`), or says `moved`: at
//! most 123 bytes, as a close frame's reason must be. Runtime-free: a table under a lock and a
//! future woken by the close, polled by whichever runtime the library runs.

use std::collections::HashMap;
use std::future::poll_fn;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Poll, Waker};
use std::time::Duration;

use super::control::Event;
use super::epoch::Epoch;
use super::held::HeldMap;
use super::state::Message;

/// The close code of the goodbye (RFC 6455 §7.4.1): the service is restarting, reconnect.
pub const SERVICE_RESTART: u16 = 1012;
/// The longest reason a close frame carries (its payload is at most 125 bytes, 2 of them the
/// code).
pub const MAX_REASON: usize = 123;

/// How a WebSocket is closed: its code and reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Close {
    pub code: u16,
    pub reason: String,
}

impl Close {
    /// 1012 `epoch {epoch} ended` (`epoch ended` for an epoch too long to name).
    pub fn epoch_ended(epoch: &Epoch) -> Close {
        let named = format!("epoch {epoch} ended");
        Close {
            code: SERVICE_RESTART,
            reason: if named.len() <= MAX_REASON {
                named
            } else {
                "epoch ended".into()
            },
        }
    }

    /// 1012 `moved`.
    pub fn moved() -> Close {
        Close {
            code: SERVICE_RESTART,
            reason: "moved".into(),
        }
    }
}

type Key = (String, String);

/// The open goodbyes of a worker, by instance.
#[derive(Clone, Default)]
pub struct Goodbyes {
    table: Arc<Table>,
}

#[derive(Default)]
struct Table {
    open: Mutex<HashMap<Key, Vec<Weak<Socket>>>>,
    /// How many are open: with none, an admission does not take the lock.
    count: AtomicUsize,
    /// The wind-down pending per instance, by the number its [`Deadline`] carries: a later
    /// message replaces it, a revocation removes it.
    pending: Mutex<HashMap<Key, u64>>,
    next: AtomicU64,
}

/// One WebSocket's goodbye, shared by the clones of its [`Goodbye`].
struct Socket {
    table: Weak<Table>,
    key: Key,
    epoch: Epoch,
    state: Mutex<Said>,
}

#[derive(Default)]
struct Said {
    close: Option<Close>,
    waiting: Vec<Waker>,
}

/// The goodbye of one WebSocket of an instance at an epoch: resolves once that epoch ended
/// here. Clones share it; it leaves the table once the last is dropped.
#[derive(Clone)]
pub struct Goodbye {
    socket: Arc<Socket>,
}

/// A wind-down's deadline: once `after` has passed, hand it to
/// [`Goodbyes::deadline_reached`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Deadline {
    pub after: Duration,
    key: Key,
    /// The epoch held when the message came: it and those before it end.
    through: Epoch,
    moved: bool,
    ticket: u64,
}

impl Goodbyes {
    /// The goodbye of a WebSocket of `(ns, id)` admitted at `epoch`.
    pub fn open(&self, ns: &str, id: &str, epoch: &Epoch) -> Goodbye {
        let key = (ns.to_owned(), id.to_owned());
        let socket = Arc::new(Socket {
            table: Arc::downgrade(&self.table),
            key: key.clone(),
            epoch: epoch.clone(),
            state: Mutex::default(),
        });
        lock(&self.table.open)
            .entry(key)
            .or_default()
            .push(Arc::downgrade(&socket));
        self.table.count.fetch_add(1, Ordering::Relaxed);
        Goodbye { socket }
    }

    /// How many goodbyes are open.
    pub fn len(&self) -> usize {
        self.table.count.load(Ordering::Relaxed)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// What an event of the registry protocol ends: at once, or (a wind-down with a deadline)
    /// at the [`Deadline`] returned, which the library sleeps until.
    pub fn on_event(&self, event: &Event, held: &HeldMap) -> Option<Deadline> {
        match event {
            Event::WindDown(message) => self.wind_down(message, held),
            Event::Evicted { ns, id } => {
                self.close(ns, id, |_| true, false);
                None
            }
            Event::Superseded { .. } | Event::CredentialRefused { .. } => {
                self.all_ended();
                None
            }
            Event::Registered { .. } | Event::Drain { .. } => None,
        }
    }

    /// A wind-down message: the deadline that ends what is held now, replacing any pending
    /// one of the instance; none for a revocation, or an instance not held.
    fn wind_down(&self, message: &Message, held: &HeldMap) -> Option<Deadline> {
        let key = (message.ns.clone(), message.id.clone());
        let mut pending = lock(&self.table.pending);
        pending.remove(&key);
        let after = message.deadline?;
        let through = held.epoch_of(&message.ns, &message.id)?;
        let ticket = self.table.next.fetch_add(1, Ordering::Relaxed);
        pending.insert(key.clone(), ticket);
        Some(Deadline {
            after,
            key,
            through,
            moved: message.moved,
            ticket,
        })
    }

    /// A wind-down's deadline has passed: its instance's WebSockets up to its epoch are closed,
    /// unless a later message revoked or replaced it.
    pub fn deadline_reached(&self, deadline: Deadline) {
        {
            let mut pending = lock(&self.table.pending);
            if pending.get(&deadline.key) != Some(&deadline.ticket) {
                return;
            }
            pending.remove(&deadline.key);
        }
        let (ns, id) = &deadline.key;
        let through = &deadline.through;
        self.close(ns, id, |epoch| epoch <= through, deadline.moved);
    }

    /// `(ns, id)` was admitted at `epoch`: the WebSockets of older epochs are closed.
    pub fn newer_epoch(&self, ns: &str, id: &str, epoch: &Epoch) {
        if !self.is_empty() {
            self.close(ns, id, |open| open < epoch, false);
        }
    }

    /// Every instance's epoch ended here (a graceful stop released them all).
    pub fn all_ended(&self) {
        let sockets: Vec<_> = lock(&self.table.open)
            .drain()
            .flat_map(|(_, v)| v)
            .collect();
        say(sockets.iter().filter_map(Weak::upgrade), false);
    }

    /// Closes the WebSockets of `(ns, id)` whose epoch `ends`.
    fn close(&self, ns: &str, id: &str, ends: impl Fn(&Epoch) -> bool, moved: bool) {
        // Every socket upgraded under the lock is dropped after it: the last clone's drop
        // takes the lock.
        let (mut ending, mut staying) = (Vec::new(), Vec::new());
        {
            let mut open = lock(&self.table.open);
            let key = (ns.to_owned(), id.to_owned());
            let Some(sockets) = open.get_mut(&key) else {
                return;
            };
            sockets.retain(|socket| {
                let Some(socket) = socket.upgrade() else {
                    return false;
                };
                let ended = ends(&socket.epoch);
                if ended { &mut ending } else { &mut staying }.push(socket);
                !ended
            });
            if sockets.is_empty() {
                open.remove(&key);
            }
        }
        say(ending, moved);
    }
}

/// Tells each of `sockets` its close; they are out of the table already.
fn say(sockets: impl IntoIterator<Item = Arc<Socket>>, moved: bool) {
    for socket in sockets {
        let close = if moved {
            Close::moved()
        } else {
            Close::epoch_ended(&socket.epoch)
        };
        let waiting = {
            let mut said = lock(&socket.state);
            said.close.get_or_insert(close);
            std::mem::take(&mut said.waiting)
        };
        waiting.into_iter().for_each(Waker::wake);
    }
}

impl Goodbye {
    /// Resolves once this WebSocket's epoch ended here, with how to close it.
    pub async fn closing(&mut self) -> Close {
        poll_fn(|cx| {
            let mut said = lock(&self.socket.state);
            match &said.close {
                Some(close) => Poll::Ready(close.clone()),
                None => {
                    if !said.waiting.iter().any(|w| w.will_wake(cx.waker())) {
                        said.waiting.push(cx.waker().clone());
                    }
                    Poll::Pending
                }
            }
        })
        .await
    }

    /// The close, once said.
    pub fn said(&self) -> Option<Close> {
        lock(&self.socket.state).close.clone()
    }

    /// The epoch this WebSocket was admitted at.
    pub fn epoch(&self) -> &Epoch {
        &self.socket.epoch
    }
}

impl std::fmt::Debug for Goodbye {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Goodbye")
            .field("ns", &self.socket.key.0)
            .field("id", &self.socket.key.1)
            .field("epoch", &self.socket.epoch)
            .field("said", &self.said())
            .finish()
    }
}

impl Drop for Socket {
    fn drop(&mut self) {
        let Some(table) = self.table.upgrade() else {
            return;
        };
        table.count.fetch_sub(1, Ordering::Relaxed);
        let mut open = lock(&table.open);
        if let Some(sockets) = open.get_mut(&self.key) {
            sockets.retain(|socket| socket.strong_count() > 0);
            if sockets.is_empty() {
                open.remove(&self.key);
            }
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every update is a single map or field operation: a poisoned lock still holds consistent
    // data.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::pin::pin;
    use std::task::{Context, Poll, Waker};
    use std::time::Instant;

    use super::*;
    use crate::worker::held::Gate;

    fn e(s: &str) -> Epoch {
        Epoch::parse(s.as_bytes()).unwrap()
    }

    /// The close `goodbye` resolves to now, if it does.
    fn now(goodbye: &mut Goodbye) -> Option<Close> {
        let mut closing = pin!(goodbye.closing());
        match closing
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()))
        {
            Poll::Ready(close) => Some(close),
            Poll::Pending => None,
        }
    }

    fn held(instances: &[(&str, &str)]) -> HeldMap {
        let map = HeldMap::new(0);
        for (id, epoch) in instances {
            map.admit("/t", id, &e(epoch), Instant::now(), || Gate::OPEN);
        }
        map
    }

    fn wind_down(id: &str, deadline: Option<u64>, moved: bool) -> Event {
        Event::WindDown(Message {
            msg_id: 1.into(),
            ns: "/t".into(),
            id: id.into(),
            deadline: deadline.map(Duration::from_secs),
            moved,
        })
    }

    #[test]
    fn a_wind_down_ends_the_held_epoch_at_its_deadline() {
        let goodbyes = Goodbyes::default();
        let map = held(&[("a", "7")]);
        let (mut old, mut current) = (
            goodbyes.open("/t", "a", &e("6")),
            goodbyes.open("/t", "a", &e("7")),
        );
        let mut other = goodbyes.open("/t", "b", &e("7"));
        let deadline = goodbyes
            .on_event(&wind_down("a", Some(30), false), &map)
            .unwrap();
        assert_eq!(deadline.after, Duration::from_secs(30));
        assert_eq!(now(&mut current), None, "not before the deadline");
        // A socket opened meanwhile at the held epoch ends with the others.
        let mut late = goodbyes.open("/t", "a", &e("7"));
        goodbyes.deadline_reached(deadline);
        for goodbye in [&mut current, &mut late] {
            assert_eq!(
                now(goodbye),
                Some(Close {
                    code: 1012,
                    reason: "epoch 7 ended".into()
                })
            );
        }
        assert_eq!(now(&mut old).unwrap().reason, "epoch 6 ended");
        assert_eq!(now(&mut other), None, "another instance's");
        assert_eq!(goodbyes.len(), 4, "open until dropped");
        drop((old, current, late, other));
        assert!(goodbyes.is_empty());
        assert!(lock(&goodbyes.table.open).is_empty());
    }

    #[test]
    fn a_move_says_moved_and_later_messages_revoke_or_replace() {
        let goodbyes = Goodbyes::default();
        let map = held(&[("a", "7")]);
        let mut socket = goodbyes.open("/t", "a", &e("7"));
        let first = goodbyes
            .on_event(&wind_down("a", Some(30), false), &map)
            .unwrap();
        assert_eq!(goodbyes.on_event(&wind_down("a", None, false), &map), None);
        goodbyes.deadline_reached(first);
        assert_eq!(now(&mut socket), None, "revoked");
        let second = goodbyes
            .on_event(&wind_down("a", Some(30), false), &map)
            .unwrap();
        let third = goodbyes
            .on_event(&wind_down("a", Some(5), true), &map)
            .unwrap();
        goodbyes.deadline_reached(second);
        assert_eq!(now(&mut socket), None, "replaced");
        assert_eq!(third.after, Duration::from_secs(5));
        goodbyes.deadline_reached(third.clone());
        assert_eq!(now(&mut socket), Some(Close::moved()));
        assert_eq!(Close::moved().code, SERVICE_RESTART);
        // Reached once only.
        let mut again = goodbyes.open("/t", "a", &e("7"));
        goodbyes.deadline_reached(third);
        assert_eq!(now(&mut again), None);
        // An instance not held has nothing to end.
        assert_eq!(
            goodbyes.on_event(&wind_down("zz", Some(1), false), &map),
            None
        );
    }

    #[test]
    fn evictions_and_newer_epochs_end_at_once() {
        let goodbyes = Goodbyes::default();
        let map = held(&[]);
        let mut a = goodbyes.open("/t", "a", &e("3"));
        let mut b = goodbyes.open("/t", "b", &e("3"));
        let mut b_newer = goodbyes.open("/t", "b", &e("4"));
        let evicted = Event::Evicted {
            ns: "/t".into(),
            id: "a".into(),
        };
        assert_eq!(goodbyes.on_event(&evicted, &map), None);
        assert_eq!(now(&mut a).unwrap().reason, "epoch 3 ended");
        goodbyes.newer_epoch("/t", "b", &e("4"));
        assert_eq!(now(&mut b).unwrap().reason, "epoch 3 ended");
        assert_eq!(now(&mut b_newer), None, "the new epoch's own");
        let superseded = Event::Superseded { error: "x".into() };
        goodbyes.on_event(&superseded, &map);
        assert_eq!(now(&mut b_newer).unwrap().reason, "epoch 4 ended");
    }

    #[test]
    fn a_graceful_stop_ends_everything_and_a_waiter_is_woken() {
        let goodbyes = Goodbyes::default();
        let mut socket = goodbyes.open("/t", "a", &e("9"));
        let woken = Arc::new(std::sync::atomic::AtomicBool::new(false));
        struct Flag(Arc<std::sync::atomic::AtomicBool>);
        impl std::task::Wake for Flag {
            fn wake(self: Arc<Self>) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let waker = Waker::from(Arc::new(Flag(woken.clone())));
        let mut closing = Box::pin(socket.closing());
        assert!(
            closing
                .as_mut()
                .poll(&mut Context::from_waker(&waker))
                .is_pending()
        );
        goodbyes.all_ended();
        assert!(woken.load(Ordering::SeqCst));
        assert_eq!(
            closing.as_mut().poll(&mut Context::from_waker(&waker)),
            Poll::Ready(Close::epoch_ended(&e("9")))
        );
    }

    #[test]
    fn a_reason_fits_a_close_frame() {
        let long = e(&"9".repeat(200));
        assert_eq!(Close::epoch_ended(&long).reason, "epoch ended");
        let longest = e(&"9".repeat(MAX_REASON - "epoch  ended".len()));
        assert_eq!(Close::epoch_ended(&longest).reason.len(), MAX_REASON);
    }
}
