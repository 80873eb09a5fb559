//! The registry protocol on the worker's control thread: the core's loop
//! (`pinboard_protocol::worker::control`) run on monoio, calling the registry through
//! `pinboard-http`'s client, with the events handed to the application by a task of their own
//! so that a slow handler never holds up a heartbeat; on a graceful stop it releases and
//! deregisters before the listeners close.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use local_sync::mpsc::unbounded::{Rx, Tx, channel};
use pinboard_http::Shutdown;
use pinboard_protocol::worker::control::{Event, Failure, Runtime, leave, lifecycle};
use serde_json::{Map, Value};

use crate::app::App;
use crate::handle::Handle;
use crate::state::{Shared, local_shutdown};

/// How long events already queued may still run once the worker stopped.
const EVENTS_DRAIN: Duration = Duration::from_secs(5);

pub(crate) async fn run<A: App>(shared: Arc<Shared>, app: Arc<A>) {
    let stop = local_shutdown(&shared, |shared| &shared.stop);
    let (events, inbox) = channel();
    let delivery = monoio::spawn(deliver(app, Handle::new(shared.clone()), inbox));
    let registration = shared.config.registration.clone();
    let runtime = Monoio {
        shared: shared.clone(),
        events,
        stop,
    };
    lifecycle(&shared.core, &registration, &runtime).await;
    if shared.graceful.load(Ordering::SeqCst) {
        leave(&shared.core, &registration, &runtime).await;
    }
    shared.serving_stop.fire();
    // Closing the channel lets the delivery task finish the events already queued.
    drop(runtime);
    let _ = monoio::time::timeout(EVENTS_DRAIN, delivery).await;
}

/// Hands events to the application one at a time, in order, off the heartbeat path.
async fn deliver<A: App>(app: Arc<A>, worker: Handle, mut inbox: Rx<Event>) {
    while let Some(event) = inbox.recv().await {
        app.on_event(&worker, event).await;
    }
}

/// The control thread's event loop, as the core's loop sees it.
struct Monoio {
    shared: Arc<Shared>,
    events: Tx<Event>,
    stop: Shutdown,
}

impl Runtime for Monoio {
    async fn post(
        &self,
        route: &'static str,
        body: Vec<u8>,
    ) -> Result<Map<String, Value>, Failure> {
        self.shared.registry.send(route, &body).await
    }

    async fn sleep(&self, duration: Duration) {
        monoio::time::sleep(duration).await
    }

    async fn stopped(&self) {
        self.stop.fired().await
    }

    fn is_stopped(&self) -> bool {
        self.stop.is_fired()
    }

    fn emit(&self, event: Event) {
        // The delivery task lives as long as this loop; a send cannot fail before it ends.
        let _ = self.events.send(event);
    }
}
