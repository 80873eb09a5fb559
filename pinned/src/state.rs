//! What the worker's threads share: the runtime-free [`Core`] (secret, advertise URL, the
//! protocol state and the held instances, with its lock order: `pinboard_protocol::worker`),
//! and beside it what only this monoio worker has: its configuration, registry client, bound
//! address and driver, the `_wake`s under way, and the [`Signal`]s that stop its threads.

use std::future::poll_fn;
use std::net::SocketAddr;
use std::ops::Deref;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Poll, Waker};

use pinboard_http::{DriverKind, Shutdown};
use pinboard_protocol::worker::serve::Core;

use crate::config::Config;
use crate::durable::Wakes;
use crate::registry::Registry;

pub(crate) struct Shared {
    pub core: Core,
    pub config: Config,
    pub registry: Registry,
    pub local_addr: SocketAddr,
    /// The event-loop driver of every thread, decided at start.
    pub driver: DriverKind,
    /// The `_wake`s under way (durability); a lock of its own, never held with another.
    pub wakes: Wakes,
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
        let core = Core::new(
            config.client_id.clone(),
            config.namespaces.clone(),
            advertise_url,
            base,
            config.headroom,
            config.expected_instances,
        );
        Shared {
            core,
            config,
            registry,
            local_addr,
            driver,
            wakes: Wakes::default(),
            stop: Signal::default(),
            graceful: AtomicBool::new(false),
            serving_stop: Signal::default(),
        }
    }
}

/// The core's secret, state and held map, read as the shared state's own.
impl Deref for Shared {
    type Target = Core;

    fn deref(&self) -> &Core {
        &self.core
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
