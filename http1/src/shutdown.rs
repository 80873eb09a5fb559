//! A core's shutdown signals: the stop, fired once when the process is asked to stop, awaited
//! by the accept loop and by idle connections; then the end of the grace, fired when the grace
//! period is over with connections still open, awaited by the tunnels that say goodbye before
//! they close (a WebSocket's close frame), which the core waits for, a bounded time, while they
//! are [`Parting`].
//!
//! Each core owns its own (`Rc`, no atomics): the process-wide stop flag is turned into this
//! local signal by one watcher task per core, so nothing on the request path touches shared
//! state.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

use slab::Slab;

#[derive(Clone, Default)]
pub struct Shutdown {
    inner: Rc<Inner>,
}

#[derive(Default)]
struct Inner {
    stop: Signal,
    grace_over: Signal,
    /// Connections that say goodbye once the grace is over ([`Shutdown::parting`]).
    parting: Cell<usize>,
}

/// One of the two signals.
#[derive(Default)]
struct Signal {
    fired: Cell<bool>,
    // A slab rather than a list: a waiting connection that closes for another reason removes
    // its entry on drop, so the set stays as large as the number of live waiters.
    waiters: RefCell<Slab<Waker>>,
}

impl Signal {
    fn fire(&self) {
        self.fired.set(true);
        for waker in self.waiters.borrow_mut().drain() {
            waker.wake();
        }
    }
}

impl Shutdown {
    pub fn fire(&self) {
        self.inner.stop.fire();
    }

    pub fn is_fired(&self) -> bool {
        self.inner.stop.fired.get()
    }

    /// Resolves once `fire` has been called.
    pub fn fired(&self) -> Fired {
        self.wait(|inner| &inner.stop)
    }

    /// The grace period is over: connections still open are closed now, after their goodbye.
    pub fn end_grace(&self) {
        self.inner.grace_over.fire();
    }

    /// Resolves once [`end_grace`](Self::end_grace) has been called.
    pub fn grace_over(&self) -> Fired {
        self.wait(|inner| &inner.grace_over)
    }

    /// Counts a connection that will say goodbye once the grace is over, until the guard is
    /// dropped: the core waits for it (a bounded time) before it stops.
    pub fn parting(&self) -> Parting {
        self.inner.parting.set(self.inner.parting.get() + 1);
        Parting {
            inner: self.inner.clone(),
        }
    }

    /// How many connections are [`Parting`].
    pub fn partings(&self) -> usize {
        self.inner.parting.get()
    }

    fn wait(&self, signal: fn(&Inner) -> &Signal) -> Fired {
        Fired {
            inner: self.inner.clone(),
            signal,
            key: None,
        }
    }
}

/// A connection that says goodbye once the grace is over, counted while it lives.
pub struct Parting {
    inner: Rc<Inner>,
}

impl Drop for Parting {
    fn drop(&mut self) {
        self.inner.parting.set(self.inner.parting.get() - 1);
    }
}

pub struct Fired {
    inner: Rc<Inner>,
    signal: fn(&Inner) -> &Signal,
    key: Option<usize>,
}

impl Future for Fired {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let signal = (self.signal)(&self.inner);
        if signal.fired.get() {
            return Poll::Ready(());
        }
        let mut waiters = signal.waiters.borrow_mut();
        match self.key {
            Some(key) if waiters.contains(key) => waiters[key].clone_from(cx.waker()),
            _ => {
                let key = waiters.insert(cx.waker().clone());
                drop(waiters);
                self.key = Some(key);
            }
        }
        Poll::Pending
    }
}

impl Drop for Fired {
    fn drop(&mut self) {
        if let Some(key) = self.key {
            let mut waiters = (self.signal)(&self.inner).waiters.borrow_mut();
            if waiters.contains(key) {
                waiters.remove(key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dropped_waiters_leave_no_trace() {
        let mut rt = monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
            .build()
            .unwrap();
        rt.block_on(async {
            let shutdown = Shutdown::default();
            for _ in 0..100 {
                let mut f = Box::pin(shutdown.fired());
                let poll = std::future::poll_fn(|cx| Poll::Ready(f.as_mut().poll(cx))).await;
                assert!(poll.is_pending());
            }
            assert_eq!(shutdown.inner.stop.waiters.borrow().len(), 0);
            let waiter = monoio::spawn({
                let s = shutdown.clone();
                async move { s.fired().await }
            });
            shutdown.fire();
            waiter.await;
            assert!(shutdown.is_fired());
        });
    }

    #[test]
    fn the_grace_ends_apart_from_the_stop_and_partings_are_counted() {
        let mut rt = monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
            .enable_timer()
            .build()
            .unwrap();
        rt.block_on(async {
            let shutdown = Shutdown::default();
            let parting = shutdown.parting();
            let second = shutdown.parting();
            assert_eq!(shutdown.partings(), 2);
            let tunnel = monoio::spawn({
                let s = shutdown.clone();
                async move {
                    s.grace_over().await;
                    drop(parting);
                }
            });
            shutdown.fire();
            monoio::time::sleep(std::time::Duration::from_millis(1)).await;
            assert_eq!(shutdown.partings(), 2, "the stop is not the grace's end");
            shutdown.end_grace();
            tunnel.await;
            assert_eq!(shutdown.partings(), 1);
            drop(second);
            assert_eq!(shutdown.partings(), 0);
            assert_eq!(shutdown.inner.grace_over.waiters.borrow().len(), 0);
        });
    }
}
