//! The application's side of a worker: the [`App`] it plugs in. The [`Instance`] each request
//! is for and the [`Event`]s the registry protocol tells it about are the runtime-free core's
//! (`pinboard_protocol::worker`), shared with `pinned-tower`.

use std::future::Future;

use pinboard_http::error::Error;
use pinboard_http::{Request, Response};

pub use pinboard_protocol::worker::control::Event;
pub use pinboard_protocol::worker::serve::Instance;

use crate::handle::Handle;

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
