//! A core's shutdown signal: fired once when the process is asked to stop, awaited by the
//! accept loop and by idle connections.
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
    fired: Cell<bool>,
    // A slab rather than a list: a waiting connection that closes for another reason removes
    // its entry on drop, so the set stays as large as the number of live waiters.
    waiters: RefCell<Slab<Waker>>,
}

impl Shutdown {
    pub fn fire(&self) {
        self.inner.fired.set(true);
        for waker in self.inner.waiters.borrow_mut().drain() {
            waker.wake();
        }
    }

    pub fn is_fired(&self) -> bool {
        self.inner.fired.get()
    }

    /// Resolves once `fire` has been called.
    pub fn fired(&self) -> Fired {
        Fired {
            inner: self.inner.clone(),
            key: None,
        }
    }
}

pub struct Fired {
    inner: Rc<Inner>,
    key: Option<usize>,
}

impl Future for Fired {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.inner.fired.get() {
            return Poll::Ready(());
        }
        let mut waiters = self.inner.waiters.borrow_mut();
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
            let mut waiters = self.inner.waiters.borrow_mut();
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
            assert_eq!(shutdown.inner.waiters.borrow().len(), 0);
            let waiter = monoio::spawn({
                let s = shutdown.clone();
                async move { s.fired().await }
            });
            shutdown.fire();
            waiter.await;
            assert!(shutdown.is_fired());
        });
    }
}
