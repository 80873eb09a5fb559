//! The application's side of a worker: the [`App`] it plugs in, the [`Instance`] each request
//! is for, and the [`Event`]s the registry protocol tells it about.

use std::future::Future;
use std::time::Duration;

use pinboard_http::error::Error;
use pinboard_http::{Request, Response};

use crate::attest::Attestation;
use crate::epoch::Epoch;
use crate::handle::Handle;
use crate::state::Message;

/// The application a worker serves its instances with.
///
/// One value serves every thread, hence `Send + Sync`; the futures it returns run on the
/// thread that called, so they need not be `Send`.
pub trait App: Send + Sync + 'static {
    /// Answers a request for `instance`, already attested and admitted at its epoch. The
    /// request's path is the whole path (`/{ns}/{id}{rest}`); `instance.rest` is its tail.
    fn handle(
        &self,
        worker: &Handle,
        instance: &Instance,
        req: &mut Request<'_>,
    ) -> impl Future<Output = Result<Response, Error>>;

    /// The node's durability sweep woke `instance` (`POST /{ns}/{id}/_wake`, contract §7): a
    /// wake it asked for with [`Handle::schedule_wake`] is due. Called only on a worker given
    /// a [`Config::durability`](crate::Config::durability) store, after the same attestation
    /// and epoch checks as any request (`instance.rest` is `/_wake`). `state` is what the store
    /// holds for the instance (`None`: nothing saved): hydrate from it when
    /// `instance.activated` (the instance was just placed here, perhaps brought back by this
    /// very wake), do what the wake was for, save with [`Handle::store`], and schedule the
    /// next wake if there is to be one.
    ///
    /// The `_wake` answers `200 {"ok":true}` once this returns `Ok` and `500` on `Err`; past
    /// [`Config::wake_wait`](crate::Config::wake_wait) it answers `202 {"activating":true}` and
    /// the hook runs on, its outcome going to the sweep's next `_wake` (one hook at a time per
    /// instance: a `_wake` while one runs is another 202). The default does nothing, so the
    /// instance is resident as soon as it is admitted.
    fn on_wake(
        &self,
        worker: &Handle,
        instance: &Instance,
        state: Option<Vec<u8>>,
    ) -> impl Future<Output = Result<(), Error>> {
        let _ = (worker, instance, state);
        async { Ok(()) }
    }

    /// Something the registry protocol brought about. Events are delivered one at a time, in
    /// order, on the worker's control thread, without holding up its heartbeats.
    fn on_event(&self, worker: &Handle, event: Event) -> impl Future<Output = ()> {
        let _ = (worker, event);
        async {}
    }
}

/// The instance a request is for.
#[derive(Clone, Debug)]
pub struct Instance {
    /// `/` plus the namespace segment.
    pub ns: String,
    pub id: String,
    /// The path after `/{ns}/{id}`, possibly empty.
    pub rest: String,
    /// The placement epoch the request was forwarded under.
    pub epoch: Epoch,
    /// True on the first request at this epoch: the instance was just placed here (or placed
    /// here again after another worker may have held it), so in-memory state is not current.
    pub activated: bool,
    pub attestation: Attestation,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// The worker holds a session now: first registration, or re-registration after the
    /// registry lost the previous one.
    Registered {
        session_id: String,
        reregistered: bool,
    },
    /// An operator asked to wind an instance down (or revoked that, with no deadline). The
    /// application releases it when done.
    WindDown(Message),
    /// Re-registration could not reclaim this instance: another worker may own it now. The
    /// worker no longer holds it; the application drops its state.
    Evicted { ns: String, id: String },
    /// The registry's drain state changed (this worker's own flag or an operator's drain).
    /// With a deadline, held instances are force-released when it passes.
    Drain {
        draining: bool,
        deadline: Option<Duration>,
    },
    /// A registration at a higher epoch displaced this one (hostname-aware mode). The worker
    /// stopped heartbeating and refuses every instance request; the application decides what
    /// comes next, typically shutting down.
    Superseded { error: String },
    /// The registry refused the worker's credential (`status` 401 or 403) and it could not
    /// recover within its lease ([`Config::stop_when_unauthorized`](crate::Config::stop_when_unauthorized)):
    /// the token expired or was revoked, and no fresh one came (through
    /// [`Config::token_file`](crate::Config::token_file)) in time. The worker stopped
    /// heartbeating, dropped what it held (the registry counts it dead) and refuses every
    /// instance request; the application should stop, and exit non-zero so that a supervisor
    /// sees it.
    Unauthorized { status: u16, error: String },
}
