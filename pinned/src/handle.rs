//! What the application (and tests) use while a worker runs: its [`Handle`] — its session and
//! held instances, releasing and tagging them, adjusting headroom and the draining flag.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pinboard_protocol::registry::{ReleaseRow, TagAnswer, TagRequest};
use serde_json::Value;

use crate::epoch::Epoch;
use crate::registry::{CallError, read_answer};
use crate::state::{Message, Shared};

/// An instance this worker holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    pub ns: String,
    pub id: String,
    pub epoch: Epoch,
}

/// The worker's standing with the registry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    pub session_id: Option<String>,
    /// The lease is known to be live: renewed less than a lease TTL ago.
    pub lease_healthy: bool,
    /// This worker's own draining flag.
    pub draining: bool,
    /// The registry's view: the own flag or an operator's drain.
    pub registry_draining: bool,
    pub drain_deadline: Option<Duration>,
    pub degraded: bool,
    pub superseded: bool,
    pub headroom: u64,
}

/// Access to a running worker; cheap to clone and usable from any thread. The async calls
/// need a monoio event loop with timers (any of the worker's own threads has one).
#[derive(Clone)]
pub struct Handle {
    pub(crate) shared: Arc<Shared>,
}

impl Handle {
    pub(crate) fn new(shared: Arc<Shared>) -> Handle {
        Handle { shared }
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.shared.local_addr
    }

    pub fn advertise_url(&self) -> &str {
        &self.shared.advertise_url
    }

    /// The secret registered with Pinboard: it signs attestations for this worker with it.
    pub fn secret(&self) -> &str {
        &self.shared.secret
    }

    pub fn session_id(&self) -> Option<String> {
        self.shared.state().session.clone()
    }

    pub fn status(&self) -> Status {
        let state = self.shared.state();
        Status {
            session_id: state.session.clone(),
            lease_healthy: state.lease_healthy(Instant::now()),
            draining: state.draining,
            registry_draining: state.registry_draining,
            drain_deadline: state.drain_deadline,
            degraded: state.degraded,
            superseded: state.superseded,
            headroom: state.headroom,
        }
    }

    /// Held instances, sorted by namespace and id.
    pub fn held(&self) -> Vec<Held> {
        self.shared
            .held
            .held()
            .into_iter()
            .map(|(ns, id, epoch)| Held { ns, id, epoch })
            .collect()
    }

    /// Wind-down messages received, oldest first (the last 1024).
    pub fn messages(&self) -> Vec<Message> {
        self.shared.state().messages.iter().cloned().collect()
    }

    /// The headroom sent on the next heartbeat.
    pub fn set_headroom(&self, headroom: u64) {
        self.shared.state().headroom = headroom;
    }

    /// This worker's own draining flag, sent on the next heartbeat: while set, the registry
    /// places no new instances here.
    pub fn set_draining(&self, draining: bool) {
        self.shared.state().draining = draining;
    }

    /// Gives up `(ns, id)`: the worker stops holding it at once, then asks the registry to
    /// free its placement, quoting the epoch it was held at (given up after three tries).
    /// Whether the registry freed a row.
    pub async fn release(&self, ns: &str, id: &str) -> Result<bool, CallError> {
        let epoch = self
            .shared
            .held
            .forget(ns, id, Instant::now())
            .ok_or_else(|| not_held(ns, id))?;
        let session = self.session_id().ok_or(CallError::NoSession)?;
        let body = [ReleaseRow {
            session_id: session,
            namespace: ns.to_owned(),
            id: id.to_owned(),
            epoch: Some(epoch.as_str().to_owned()),
        }];
        let answer = self.shared.registry.post_thrice("release", &body).await?;
        let released = answer.get("released").and_then(Value::as_u64);
        Ok(released.ok_or(CallError::BadAnswer { status: 200 })? > 0)
    }

    /// Sets the owner tag of the held `(ns, id)` (1–256 characters). Whether the registry
    /// wrote it: false when the placement moved on meanwhile.
    pub async fn tag(&self, ns: &str, id: &str, tag: &str) -> Result<bool, CallError> {
        let epoch = self
            .shared
            .held
            .epoch_of(ns, id)
            .ok_or_else(|| not_held(ns, id))?;
        let session = self.session_id().ok_or(CallError::NoSession)?;
        let body = TagRequest {
            row: ReleaseRow {
                session_id: session,
                namespace: ns.to_owned(),
                id: id.to_owned(),
                epoch: Some(epoch.as_str().to_owned()),
            },
            tag: tag.to_owned(),
        };
        let answer = self.shared.registry.post_thrice("tag", &body).await?;
        read_answer::<TagAnswer>(answer)
            .map(|a| a.tagged)
            .ok_or(CallError::BadAnswer { status: 200 })
    }
}

fn not_held(ns: &str, id: &str) -> CallError {
    CallError::NotHeld {
        ns: ns.to_owned(),
        id: id.to_owned(),
    }
}
