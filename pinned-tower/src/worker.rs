//! The worker on tokio: [`Worker::start`] validates the configuration and spawns the registry
//! loop (the core's, `pinboard_protocol::worker::control`) as a task calling the registry
//! through hyper's client; [`Worker::layer`] is what the service wraps itself in;
//! [`Worker::shutdown`] releases, deregisters and ends the task. The events also end the open
//! WebSockets' epochs (`pinboard_protocol::worker::goodbye`), a wind-down's at its deadline,
//! slept on a task of its own.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Uri};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use pinboard_protocol::worker::control::{
    Event, Failure, Registration, Runtime, leave, lifecycle, read_reply,
};
use pinboard_protocol::worker::credential::Credential;
use pinboard_protocol::worker::serve::{Core, Status};
use serde_json::{Map, Value};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::config::Config;
use crate::layer::PinnedLayer;

/// Largest registry answer read. Answers are small; register's `duplicates` is the largest.
const MAX_ANSWER: usize = 8 * 1024 * 1024;

/// The events of the registry protocol, in order, as [`Worker::start`] hands them out.
pub type Events = mpsc::UnboundedReceiver<Event>;

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("invalid worker configuration: {0}")]
    Config(String),
}

/// A running worker. [`shutdown`](Worker::shutdown) stops it gracefully; dropping it stops
/// the registry task at once, without releasing or deregistering (the lease then lapses).
pub struct Worker {
    core: Arc<Core>,
    stop: watch::Sender<Stop>,
    task: Option<JoinHandle<()>>,
}

/// What the registry task is asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stop {
    Run,
    Graceful,
    Now,
}

impl Worker {
    /// Spawns the registry task on the current tokio runtime, which registers in the
    /// background (retrying until Pinboard's probe of the advertise URL gets through): start
    /// it beside the server the layer wraps. Panics outside a tokio runtime.
    pub fn start(config: Config) -> Result<(Worker, Events), StartError> {
        let (registry, base) = config.validate().map_err(StartError::Config)?;
        let credential = Credential::new(&config.token, config.token_file.as_deref())
            .map_err(StartError::Config)?;
        let core = Arc::new(Core::new(
            config.client_id.clone(),
            config.namespaces.clone(),
            config.advertise_url.trim_end_matches('/').to_owned(),
            base,
            config.headroom,
            config.expected_instances,
        ));
        let (events, inbox) = mpsc::unbounded_channel();
        let (stop, stopping) = watch::channel(Stop::Run);
        let runtime = Tokio {
            core: core.clone(),
            client: Client::builder(TokioExecutor::new()).build_http(),
            registry,
            credential,
            timeout: config.call_timeout,
            stop: stopping,
            events,
        };
        let registration = config.registration.clone();
        let task = tokio::spawn(run(core.clone(), registration, runtime));
        let worker = Worker {
            core,
            stop,
            task: Some(task),
        };
        Ok((worker, inbox))
    }

    /// The layer that makes a service this worker's: cheap to clone.
    pub fn layer(&self) -> PinnedLayer {
        PinnedLayer::new(self.core.clone())
    }

    pub fn session_id(&self) -> Option<String> {
        self.core.state().session.clone()
    }

    /// The secret Pinboard signs this worker's attestations with.
    pub fn secret(&self) -> &str {
        &self.core.secret
    }

    /// The worker's standing with the registry.
    pub fn status(&self) -> Status {
        self.core.status()
    }

    /// Stops gracefully: refuses new activations, releases every held instance, deregisters
    /// (each call given up after three tries), and returns once the registry task ended.
    /// Instances already held are served meanwhile; stop the server after this.
    pub async fn shutdown(mut self) {
        let _ = self.stop.send(Stop::Graceful);
        if let Some(task) = self.task.take() {
            // A panicking task has already reported itself through the panic hook.
            let _ = task.await;
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if self.task.is_some() {
            let _ = self.stop.send(Stop::Now);
        }
    }
}

async fn run(core: Arc<Core>, registration: Registration, runtime: Tokio) {
    lifecycle(&core, &registration, &runtime).await;
    if *runtime.stop.borrow() == Stop::Graceful {
        leave(&core, &registration, &runtime).await;
        // Everything held was released: every WebSocket's epoch ended here.
        core.goodbyes.all_ended();
    }
}

/// The tokio side of the core's registry loop.
struct Tokio {
    /// Whose WebSockets the events end.
    core: Arc<Core>,
    client: Client<HttpConnector, Full<Bytes>>,
    /// The registry's base URL.
    registry: Uri,
    credential: Credential,
    timeout: Duration,
    stop: watch::Receiver<Stop>,
    events: mpsc::UnboundedSender<Event>,
}

impl Tokio {
    async fn call(&self, route: &str, body: Vec<u8>) -> Result<(u16, Bytes), String> {
        let uri = format!(
            "{}/registry/{route}",
            self.registry.to_string().trim_end_matches('/')
        );
        let request = Request::builder()
            .method(Method::POST)
            .uri(uri)
            .header(http::header::AUTHORIZATION, self.credential.authorization())
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| e.to_string())?;
        let answer = self
            .client
            .request(request)
            .await
            .map_err(|e| e.to_string())?;
        let status = answer.status().as_u16();
        let body = Limited::new(answer.into_body(), MAX_ANSWER)
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok((status, body))
    }
}

impl Runtime for Tokio {
    async fn post(
        &self,
        route: &'static str,
        body: Vec<u8>,
    ) -> Result<Map<String, Value>, Failure> {
        let (status, body) = tokio::time::timeout(self.timeout, self.call(route, body))
            .await
            .map_err(|_| Failure::Unreachable(format!("no answer within {:?}", self.timeout)))?
            .map_err(Failure::Unreachable)?;
        read_reply(status, &body)
    }

    async fn sleep(&self, duration: Duration) {
        tokio::time::sleep(duration).await
    }

    async fn stopped(&self) {
        let mut stop = self.stop.clone();
        // The sender lives as long as the worker; dropped, it stopped it.
        let _ = stop.wait_for(|stop| *stop != Stop::Run).await;
    }

    fn is_stopped(&self) -> bool {
        *self.stop.borrow() != Stop::Run
    }

    fn emit(&self, event: Event) {
        // What the event ends, the open WebSockets are told first: at once, or once a
        // wind-down's deadline passed.
        let goodbyes = &self.core.goodbyes;
        if let Some(deadline) = goodbyes.on_event(&event, &self.core.held) {
            let goodbyes = goodbyes.clone();
            tokio::spawn(async move {
                tokio::time::sleep(deadline.after).await;
                goodbyes.deadline_reached(deadline);
            });
        }
        // Nobody listening is the application's choice.
        let _ = self.events.send(event);
    }
}
