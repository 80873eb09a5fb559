//! `pinned`: the Rust worker library for Pinboard (spec "Worker protocol", contract §4).
//!
//! A [`Worker`] does everything a Pinboard worker owes the registry, so the application only
//! answers requests for its instances:
//!
//! - serves `GET /_pinned/challenge` and `GET /_pinned/stats`, and the instances
//!   `/{ns}/{id}...`, each attested and fenced by placement epoch before the [`App`] sees it
//!   (`surface`);
//! - registers, heartbeats every lease/3 with a fresh challenge each time, registers again
//!   when the registry lost its session (reclaiming what it holds), delivers wind-down messages
//!   and acks them (`control`);
//! - releases and tags placements on request ([`Handle`]), and on a graceful
//!   [`Worker::shutdown`] releases everything it holds and deregisters;
//! - with a [`DurabilityStore`] ([`Config::durability`], [`FileStore`]), serves the durability
//!   sweep's `POST /{ns}/{id}/_wake` through [`App::on_wake`] and schedules wakes
//!   ([`Handle::schedule_wake`]) with the node (contract §7).
//!
//! HTTP/1.1 (the server loop, the one-shot client the registry calls go through) and TLS (an
//! HTTPS listener with [`Config::tls_cert_file`], an `https` registry verified with
//! [`Config::registry_ca_file`]) come from `pinboard-http`, the crate the node speaks HTTP with too, on monoio event loops; the header
//! names, attestation purposes and takeover policies from `pinboard-protocol`. Neither is the
//! node: `pinned` does not depend on it. [`Request`], [`Response`], [`Error`] (with its
//! [`Origin`]) and [`DriverKind`] are re-exported for applications.
//!
//! What does not depend on the runtime — attestation checks, epochs, the held map, the
//! protocol state, the per-request checks, the registry loop and the credential — is
//! `pinboard_protocol::worker`'s, shared with `pinned-tower` (the same worker as a tower layer
//! on tokio). Modules here depend one way, each only on those listed before it (unit tests
//! aside: surface's start serving threads through `runtime`):
//! - `registry`: the registry client on `pinboard-http`; `durable` (the [`DurabilityStore`],
//!   [`FileStore`], the wakes under way); `config`, importing `durable`'s trait;
//! - `state`: what the threads share (the core, the stop `Signal`s);
//! - `handle`: the application's [`Handle`] on that state;
//! - `app`: the [`App`] trait and what it is given ([`Instance`], [`Event`]);
//! - `control` (the registry loop on the control thread) and `surface` (what the worker
//!   serves);
//! - `runtime`: the threads running those two; `worker`: [`Worker`], starting and stopping it all.
//!
//! ```no_run
//! use pinned::{App, Config, Error, Handle, Instance, Request, Response, Worker};
//!
//! struct Hello;
//!
//! impl App for Hello {
//!     async fn handle(&self, _: &Handle, instance: &Instance, _: &mut Request<'_>)
//!         -> Result<Response, Error>
//!     {
//!         let body = format!("hello from {}/{}\n", instance.ns, instance.id);
//!         Ok(Response::new(http::StatusCode::OK, Some("text/plain"), body.into()))
//!     }
//! }
//!
//! let config = Config::new("http://127.0.0.1:8080", "TOKEN", "hello-1", &["/hello"]);
//! let worker = Worker::start(config, Hello).unwrap();
//! // ... until it is time to stop:
//! worker.shutdown();
//! ```

mod app;
mod config;
mod control;
mod durable;
#[cfg(any(feature = "sqlite", feature = "redis"))]
pub mod fencing;
mod handle;
mod registry;
mod runtime;
mod state;
mod surface;
mod worker;

pub use app::{App, Event, Instance};
pub use config::{Config, Registration, Takeover};
pub use durable::{DurabilityStore, FileStore};
pub use handle::{Handle, Held, Status};
pub use pinboard_http::error::{Error, Origin};
pub use pinboard_http::{DriverKind, Request, Response};
pub use pinboard_protocol::worker::attest::Attestation;
pub use pinboard_protocol::worker::control::Failure;
pub use pinboard_protocol::worker::epoch::Epoch;
pub use pinboard_protocol::worker::fencing::{Fence, FencedError, StaleEpoch};
pub use pinboard_protocol::worker::state::Message;
pub use registry::CallError;
pub use worker::{StartError, Worker};

/// The node's blocking raw-socket test client, shared with its integration tests.
#[cfg(test)]
#[allow(dead_code)]
#[path = "../../tests/support/http.rs"]
mod test_http;
