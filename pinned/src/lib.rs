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
//!   [`Worker::shutdown`] releases everything it holds and deregisters.
//!
//! HTTP, the registry client and the event loops come from the node crate (`pinboard::http`,
//! monoio); [`Request`], [`Response`] and [`Error`] are re-exported for applications.
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
mod attest;
mod config;
mod control;
mod epoch;
mod registry;
mod runtime;
mod state;
mod surface;
mod worker;

pub use app::{App, Event, Instance, Message};
pub use attest::Attestation;
pub use config::{Config, Takeover};
pub use epoch::Epoch;
pub use pinboard::config::DriverKind;
pub use pinboard::error::Error;
pub use pinboard::http::{Request, Response};
pub use registry::CallError;
pub use worker::{Handle, Held, StartError, Status, Worker};

/// The node's blocking raw-socket test client, shared with its integration tests.
#[cfg(test)]
#[allow(dead_code)]
#[path = "../../tests/support/http.rs"]
mod test_http;
