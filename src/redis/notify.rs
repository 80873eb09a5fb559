//! A single-waiter, single-thread wake-up flag.
//!
//! Request paths signal a background task (the connection writer, the cluster map refresher)
//! without awaiting anything themselves. Signals coalesce: however many arrive before the task
//! runs, it wakes once, which is what turns a burst of requests into one write syscall.

use std::cell::Cell;
use std::future::poll_fn;
use std::task::{Poll, Waker};

#[derive(Default)]
pub(crate) struct Notify {
    pending: Cell<bool>,
    waker: Cell<Option<Waker>>,
}

impl Notify {
    pub(crate) fn notify(&self) {
        self.pending.set(true);
        if let Some(waker) = self.waker.take() {
            waker.wake();
        }
    }

    /// Resolves once `notify` has been called since the last time this resolved.
    pub(crate) async fn notified(&self) {
        poll_fn(|cx| {
            if self.pending.replace(false) {
                return Poll::Ready(());
            }
            let waker = match self.waker.take() {
                Some(w) if w.will_wake(cx.waker()) => w,
                _ => cx.waker().clone(),
            };
            self.waker.set(Some(waker));
            Poll::Pending
        })
        .await
    }
}
