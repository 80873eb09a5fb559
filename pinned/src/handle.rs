//! What the application (and tests) use while a worker runs: its [`Handle`] — its session and
//! held instances, releasing and tagging them, adjusting headroom and the draining flag.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use pinboard_protocol::registry::{ReleaseRow, ScheduleAnswer, ScheduleRow, TagAnswer, TagRequest};
use serde_json::Value;

use crate::Epoch;
use crate::durable::DurabilityStore;
use pinboard_protocol::worker::control::Failure;
pub use pinboard_protocol::worker::serve::Status;

use crate::Message;
use crate::registry::{CallError, read_answer};
use crate::state::Shared;

/// An instance this worker holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    pub ns: String,
    pub id: String,
    pub epoch: Epoch,
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
        self.shared.status()
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
        Ok(released.ok_or(CallError::from(Failure::BadAnswer { status: 200 }))? > 0)
    }

    /// Sets the owner tag of the held `(ns, id)` (1–256 characters). Whether the registry
    /// wrote it: false when the placement moved on meanwhile.
    pub async fn tag(&self, ns: &str, id: &str, tag: &str) -> Result<bool, CallError> {
        let (epoch, session) = self.quote(ns, id)?;
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
            .ok_or(CallError::from(Failure::BadAnswer { status: 200 }))
    }
}

impl Handle {
    /// The durability store the worker was configured with
    /// ([`Config::durability`](crate::Config::durability)): where the application saves its
    /// durable instances' state, when it sees fit (cloned, on a thread of its own too).
    pub fn store(&self) -> Option<&Arc<dyn DurabilityStore>> {
        self.shared.config.durability.as_ref()
    }

    /// Asks the node to wake the held `(ns, id)` at `at` (contract §7): the wake is recorded in
    /// the store, then sent as `POST /registry/schedule` quoting the epoch the instance is held
    /// at (tried up to three times while the failure is transient). When it is due, the
    /// node's sweep sends `_wake` to whichever worker then owns the instance (placing it first
    /// if no one does) and [`App::on_wake`](crate::App::on_wake) runs there. A later call
    /// replaces the wake. Whether the node wrote it: false when the placement moved on.
    pub async fn schedule_wake(
        &self,
        ns: &str,
        id: &str,
        at: SystemTime,
    ) -> Result<bool, CallError> {
        let at_ms = at
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        self.send_schedule(ns, id, Some(at_ms)).await
    }

    /// Cancels the wake of the held `(ns, id)`, in the store and at the node (`wakeAt: null`).
    pub async fn cancel_wake(&self, ns: &str, id: &str) -> Result<bool, CallError> {
        self.send_schedule(ns, id, None).await
    }

    async fn send_schedule(
        &self,
        ns: &str,
        id: &str,
        at_ms: Option<u64>,
    ) -> Result<bool, CallError> {
        let store = self.store().ok_or(CallError::NoStore)?;
        let (epoch, session) = self.quote(ns, id)?;
        match at_ms {
            Some(at_ms) => store.schedule(ns, id, at_ms),
            None => store.cancel(ns, id),
        }
        .map_err(CallError::Store)?;
        let body = schedule_body(session, ns, id, &epoch, at_ms);
        let answer = self.shared.registry.post_thrice("schedule", &body).await?;
        read_answer::<ScheduleAnswer>(answer)
            .map(|a| a.scheduled > 0)
            .ok_or(CallError::from(Failure::BadAnswer { status: 200 }))
    }
}

impl Handle {
    /// What a call about the held `(ns, id)` quotes: the epoch it is held at, the session.
    fn quote(&self, ns: &str, id: &str) -> Result<(Epoch, String), CallError> {
        let epoch = self
            .shared
            .held
            .epoch_of(ns, id)
            .ok_or_else(|| not_held(ns, id))?;
        let session = self.session_id().ok_or(CallError::NoSession)?;
        Ok((epoch, session))
    }
}

/// The body of `POST /registry/schedule` for one instance.
pub(crate) fn schedule_body(
    session_id: String,
    ns: &str,
    id: &str,
    epoch: &Epoch,
    wake_at: Option<u64>,
) -> [ScheduleRow; 1] {
    [ScheduleRow {
        session_id,
        namespace: ns.to_owned(),
        id: id.to_owned(),
        epoch: epoch.as_str().to_owned(),
        wake_at,
    }]
}

fn not_held(ns: &str, id: &str) -> CallError {
    CallError::NotHeld {
        ns: ns.to_owned(),
        id: id.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::TcpListener;
    use std::thread;
    use std::time::Duration;

    use serde_json::json;

    use super::*;
    use crate::config::Config;
    use crate::durable::FileStore;
    use crate::registry::Registry;
    use pinboard_protocol::worker::held::Admission;

    /// The request the worker sent (head, body), answered with `answer` (status line on).
    fn answer_once(registry: &TcpListener, answer: &'static str) -> (String, Value) {
        let (mut conn, _) = registry.accept().unwrap();
        let mut reader = BufReader::new(conn.try_clone().unwrap());
        let mut head = String::new();
        while !head.ends_with("\r\n\r\n") {
            reader.read_line(&mut head).unwrap();
        }
        let length = head
            .lines()
            .find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("content-length:")?
                    .trim()
                    .parse()
                    .ok()
            })
            .unwrap();
        let mut body = vec![0; length];
        reader.read_exact(&mut body).unwrap();
        let (status, json) = answer.split_once('\n').unwrap();
        let reply = format!(
            "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{json}",
            json.len()
        );
        conn.write_all(reply.as_bytes()).unwrap();
        (head, serde_json::from_slice(&body).unwrap())
    }

    fn block_on<F: std::future::Future>(future: F) -> F::Output {
        monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
            .enable_timer()
            .build()
            .unwrap()
            .block_on(future)
    }

    #[test]
    fn schedule_quotes_the_held_epoch_and_reads_the_answer() {
        let registry = TcpListener::bind("127.0.0.1:0").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(FileStore::open(dir.path()).unwrap());
        let url = format!("http://{}/edge", registry.local_addr().unwrap());
        let mut config = Config::new(&url, "tok", "c-1", &["/threads"]);
        config.durability = Some(store.clone());
        let client = Registry::new(
            config.validate().unwrap(),
            pinboard_http::tls::ClientTls::new(None, pinboard_http::tls::Alpn::Http1).unwrap(),
            pinboard_protocol::worker::credential::Credential::new("tok", None).unwrap(),
            Duration::from_secs(5),
        );
        let addr = registry.local_addr().unwrap();
        let shared = Arc::new(Shared::new(
            config,
            client,
            String::new(),
            String::new(),
            addr,
            pinboard_http::DriverKind::Epoll,
        ));
        let handle = Handle::new(shared.clone());
        let at = UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);

        // Neither unheld instances nor a worker without a session get as far as the node.
        let not_held = block_on(handle.schedule_wake("/threads", "a", at));
        assert!(
            matches!(not_held, Err(CallError::NotHeld { .. })),
            "{not_held:?}"
        );
        let epoch = Epoch::parse(b"42").unwrap();
        let admitted = shared.admit("/threads", "a", &epoch, Instant::now());
        assert!(matches!(admitted, Admission::Refused), "no lease yet");
        {
            let mut state = shared.state();
            state.session = Some("sess-1".into());
            state.lease_until = Some(Instant::now() + Duration::from_secs(60));
        }
        assert!(matches!(
            shared.admit("/threads", "a", &epoch, Instant::now()),
            Admission::Serve { activated: true }
        ));

        let answers = [
            "200 OK\n{\"scheduled\":1}",
            "200 OK\n{\"scheduled\":0}",
            "409 Conflict\n{\"error\":\"unknown session\",\"reregister\":true}",
            "200 OK\n{\"scheduledd\":1}",
        ];
        let node = thread::spawn(move || answers.map(|a| answer_once(&registry, a)));
        let results = block_on(async {
            [
                handle.schedule_wake("/threads", "a", at).await,
                handle.cancel_wake("/threads", "a").await,
                handle.schedule_wake("/threads", "a", at).await,
                handle.schedule_wake("/threads", "a", at).await,
            ]
        });
        let sent = node.join().unwrap();
        for (head, _) in &sent {
            assert!(
                head.starts_with("POST /edge/registry/schedule HTTP/1.1\r\n"),
                "{head}"
            );
            assert!(
                head.to_ascii_lowercase()
                    .contains("authorization: bearer tok\r\n"),
                "{head}"
            );
        }
        let row = |wake_at: Value| json!([{ "sessionId": "sess-1", "namespace": "/threads", "id": "a", "epoch": "42", "wakeAt": wake_at }]);
        assert_eq!(sent[0].1, row(json!(1_700_000_000_123u64)));
        assert_eq!(sent[1].1, row(Value::Null));
        let [scheduled, cancelled, lost, garbled] = results;
        assert!(matches!(scheduled, Ok(true)), "{scheduled:?}");
        assert!(matches!(cancelled, Ok(false)), "{cancelled:?}");
        assert!(
            matches!(lost, Err(CallError::Registry(Failure::Refused { status: 409, reregister: true, ref error, .. })) if error == "unknown session"),
            "{lost:?}"
        );
        assert!(
            matches!(
                garbled,
                Err(CallError::Registry(Failure::BadAnswer { status: 200 }))
            ),
            "{garbled:?}"
        );
        // The store remembers the last wake asked for.
        assert_eq!(
            store.scheduled("/threads", "a").unwrap(),
            Some(1_700_000_000_123)
        );

        // Without a store there is nothing to schedule with.
        let mut bare = Config::new(&url, "tok", "c-1", &["/threads"]);
        bare.durability = None;
        let client = Registry::new(
            bare.validate().unwrap(),
            pinboard_http::tls::ClientTls::new(None, pinboard_http::tls::Alpn::Http1).unwrap(),
            pinboard_protocol::worker::credential::Credential::new("tok", None).unwrap(),
            Duration::from_secs(5),
        );
        let handle = Handle::new(Arc::new(Shared::new(
            bare,
            client,
            String::new(),
            String::new(),
            addr,
            pinboard_http::DriverKind::Epoll,
        )));
        let refused = block_on(handle.schedule_wake("/threads", "a", at));
        assert!(matches!(refused, Err(CallError::NoStore)), "{refused:?}");
    }
}
