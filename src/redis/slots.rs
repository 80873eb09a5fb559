//! Where a pipelined command's reply waits for its caller: a slab of slots per connection, one
//! per command in flight, handed out again once both sides are done with them, so steady traffic
//! allocates nothing per command (a channel per command allocated one each).
//!
//! Replies arrive in the order the commands were queued, and are matched to slots by that order
//! alone. A slot is freed only when neither side will touch it again: the caller took its reply,
//! or the caller gave up and its reply (or the connection's end) has since come in. So a slot
//! reused by a later command can never be handed a reply meant for an earlier one, nor an
//! earlier caller see a later one's.

use std::collections::VecDeque;
use std::mem;
use std::task::{Context, Poll, Waker};

use super::{RedisError, Reply};

#[derive(Default)]
pub(crate) struct ReplySlots {
    slots: Vec<Slot>,
    free: Vec<usize>,
    /// The slots of the commands sent and not yet answered, in wire order.
    waiting: VecDeque<usize>,
}

#[derive(Default)]
enum Slot {
    #[default]
    Free,
    /// Queued; the caller is waiting (with its waker once it has polled).
    Waiting(Option<Waker>),
    /// Answered; the caller has not taken the reply yet.
    Ready(Result<Reply, RedisError>),
    /// The caller gave up (timed out, or dropped its future) before the reply came: it is
    /// dropped when it comes, and the slot freed.
    Abandoned,
}

/// No command was waiting for a reply.
#[derive(Debug)]
pub(crate) struct Unexpected;

impl ReplySlots {
    /// A slot for a command just queued: it gets the first reply after those of every command
    /// queued before it.
    pub(crate) fn queue(&mut self) -> usize {
        let id = match self.free.pop() {
            Some(id) => id,
            None => {
                self.slots.push(Slot::Free);
                self.slots.len() - 1
            }
        };
        self.slots[id] = Slot::Waiting(None);
        self.waiting.push_back(id);
        id
    }

    /// Hands the next reply in wire order to its caller; returns the waker to wake once the
    /// caller's state is no longer borrowed.
    pub(crate) fn answer(
        &mut self,
        reply: Result<Reply, RedisError>,
    ) -> Result<Option<Waker>, Unexpected> {
        let id = self.waiting.pop_front().ok_or(Unexpected)?;
        let slot = &mut self.slots[id];
        match mem::take(slot) {
            Slot::Waiting(waker) => {
                *slot = Slot::Ready(reply);
                Ok(waker)
            }
            // A caller that gave up: its reply is dropped here.
            Slot::Abandoned => {
                self.free.push(id);
                Ok(None)
            }
            // Only `queue` puts a slot in `waiting`, and only `answer` takes it out.
            Slot::Free | Slot::Ready(_) => unreachable!("reply slot {id} answered twice"),
        }
    }

    /// The caller's side: its reply once answered, after which the slot is no longer its own.
    pub(crate) fn poll(
        &mut self,
        id: usize,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Reply, RedisError>> {
        match &mut self.slots[id] {
            Slot::Waiting(waker) => {
                match waker {
                    Some(w) if w.will_wake(cx.waker()) => {}
                    _ => *waker = Some(cx.waker().clone()),
                }
                Poll::Pending
            }
            Slot::Ready(_) => {
                let Slot::Ready(reply) = mem::take(&mut self.slots[id]) else {
                    unreachable!()
                };
                self.free.push(id);
                Poll::Ready(reply)
            }
            Slot::Free | Slot::Abandoned => unreachable!("reply slot {id} polled after its end"),
        }
    }

    /// The caller's side, giving up before taking its reply.
    pub(crate) fn abandon(&mut self, id: usize) {
        let slot = &mut self.slots[id];
        match slot {
            Slot::Waiting(_) => *slot = Slot::Abandoned,
            Slot::Ready(_) => {
                *slot = Slot::Free;
                self.free.push(id);
            }
            Slot::Free | Slot::Abandoned => unreachable!("reply slot {id} abandoned twice"),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;

    use super::*;

    #[derive(Default)]
    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn int(n: i64) -> Result<Reply, RedisError> {
        Ok(Reply::Int(n))
    }

    fn poll(slots: &mut ReplySlots, id: usize) -> Poll<Result<Reply, RedisError>> {
        slots.poll(id, &mut Context::from_waker(Waker::noop()))
    }

    #[test]
    fn replies_go_to_their_commands_in_order_and_wake_them() {
        let mut slots = ReplySlots::default();
        let (a, b) = (slots.queue(), slots.queue());
        let woken = Arc::new(Count::default());
        let waker = Waker::from(woken.clone());
        assert!(slots.poll(b, &mut Context::from_waker(&waker)).is_pending());
        assert!(slots.answer(int(1)).unwrap().is_none(), "a never polled");
        slots.answer(int(2)).unwrap().unwrap().wake();
        assert_eq!(woken.0.load(Ordering::Relaxed), 1);
        assert_eq!(poll(&mut slots, b), Poll::Ready(int(2)));
        assert_eq!(poll(&mut slots, a), Poll::Ready(int(1)));
        assert!(slots.answer(int(3)).is_err(), "a reply without a command");
    }

    #[test]
    fn steady_traffic_reuses_one_slot() {
        let mut slots = ReplySlots::default();
        for n in 0..100 {
            let id = slots.queue();
            assert_eq!(id, 0);
            slots.answer(int(n)).unwrap();
            assert_eq!(poll(&mut slots, id), Poll::Ready(int(n)));
        }
        assert_eq!(slots.slots.len(), 1);
    }

    #[test]
    fn a_caller_that_gave_up_never_gets_nor_leaks_a_reply() {
        let mut slots = ReplySlots::default();
        // Gave up before the reply: its slot stays taken until its reply has come and gone.
        let timed_out = slots.queue();
        slots.abandon(timed_out);
        let next = slots.queue();
        assert_ne!(next, timed_out);
        slots.answer(int(1)).unwrap();
        // Now free again, and reused: the next command's reply is the next one on the wire.
        let after = slots.queue();
        assert_eq!(after, timed_out);
        assert!(poll(&mut slots, after).is_pending());
        slots.answer(int(2)).unwrap();
        slots.answer(int(3)).unwrap();
        assert_eq!(poll(&mut slots, next), Poll::Ready(int(2)));
        assert_eq!(poll(&mut slots, after), Poll::Ready(int(3)));

        // Gave up after its reply came, before taking it: the reply is dropped, the slot freed.
        let late = slots.queue();
        slots.answer(int(4)).unwrap();
        slots.abandon(late);
        let reused = slots.queue();
        assert_eq!(reused, late);
        assert!(poll(&mut slots, reused).is_pending());
        assert!(!slots.free.contains(&reused));
    }

    #[test]
    fn a_lost_connection_answers_every_waiting_command() {
        let mut slots = ReplySlots::default();
        let ids = [slots.queue(), slots.queue(), slots.queue()];
        slots.abandon(ids[1]);
        while slots.answer(Err(RedisError::Disconnected)).is_ok() {}
        assert_eq!(
            poll(&mut slots, ids[0]),
            Poll::Ready(Err(RedisError::Disconnected))
        );
        assert_eq!(
            poll(&mut slots, ids[2]),
            Poll::Ready(Err(RedisError::Disconnected))
        );
        assert_eq!(slots.free.len(), 3);
    }
}
