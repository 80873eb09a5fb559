//! `pinned-tower`: a Pinboard worker as a tower layer, so that an axum or hyper service on
//! tokio becomes a worker by adding a layer (as the Python library's ASGI middleware does for
//! ASGI apps).
//!
//! - [`Worker::start`] spawns the registry task on tokio: it registers, heartbeats every
//!   lease/3 with a fresh challenge each time, registers again when the registry lost the
//!   session (reclaiming what it holds), reads a rotated [`Config::token_file`], stops when the
//!   credential is refused past the lease, and hands the [`Event`]s to the application.
//! - [`Worker::layer`] answers `GET /_pinned/challenge` and `GET /_pinned/stats`, attests and
//!   fences every instance request `/{ns}/{id}...` by placement epoch before the service sees
//!   it (with the [`Instance`] in its extensions), and passes every other path through.
//! - [`Worker::shutdown`] releases what it holds and deregisters.
//! - A WebSocket upgrade of an admitted instance also carries a [`Goodbye`]: it resolves to the
//!   close (1012 and a reason) once the instance's epoch ends here (wound down at its deadline,
//!   moved, evicted, superseded, released at shutdown). [`ws::serve`] (feature `axum`) runs an
//!   axum WebSocket until then and closes it so.
//!
//! The rules are `pinned`'s, from the runtime-free core they share
//! (`pinboard_protocol::worker`): the same checks in the same order with the same answers.
//!
//! ```no_run
//! use axum::{Extension, Router, routing::get};
//! use pinned_tower::{Config, Instance, Worker};
//!
//! # async fn run() -> std::io::Result<()> {
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//! let config = Config::new("http://127.0.0.1:8080", "TOKEN", "hello-1", &["/hello"],
//!     "http://127.0.0.1:3000");
//! let (worker, _events) = Worker::start(config).expect("a valid configuration");
//! let app = Router::new()
//!     .route("/hello/{id}", get(|Extension(i): Extension<Instance>| async move {
//!         format!("hello from {}/{} at {}\n", i.ns, i.id, i.epoch)
//!     }))
//!     .layer(worker.layer());
//! axum::serve(listener, app).await
//! # }
//! ```

mod config;
mod layer;
mod worker;
#[cfg(feature = "axum")]
pub mod ws;

pub use config::Config;
pub use layer::{Pinned, PinnedBody, PinnedLayer};
pub use pinboard_protocol::Takeover;
pub use pinboard_protocol::worker::attest::Attestation;
pub use pinboard_protocol::worker::control::{Event, Registration};
pub use pinboard_protocol::worker::epoch::Epoch;
pub use pinboard_protocol::worker::fencing::{Fence, FencedError, StaleEpoch};
pub use pinboard_protocol::worker::goodbye::{Close, Goodbye};
pub use pinboard_protocol::worker::serve::Instance;
pub use pinboard_protocol::worker::serve::Status;
pub use pinboard_protocol::worker::state::Message;
pub use worker::{Events, StartError, Worker};
