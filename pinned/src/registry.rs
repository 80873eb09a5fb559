//! Calls to the registry's worker routes (`POST {base}/registry/{route}`): one JSON request
//! on a fresh connection through `pinboard-http`'s one-shot client, the answer turned into
//! either its JSON object (read as the protocol's answer type by [`read_answer`]) or a
//! [`Failure`] that says whether to re-register, give up or try again (the core's
//! `read_reply`).

use std::time::Duration;

use http::Method;
use pinboard_http::tls::ClientTls;
use pinboard_http::{WorkerAddr, fetch};
use pinboard_protocol::worker::control::{Failure, read_reply, thrice};
use pinboard_protocol::worker::credential::Credential;
use serde::Serialize;
use serde_json::{Map, Value};

pub(crate) use pinboard_protocol::worker::control::read_answer;

/// Largest registry answer read. Answers are small; register's `duplicates` is the largest.
const MAX_ANSWER: usize = 8 * 1024 * 1024;

/// Why a call of the application's [`Handle`](crate::Handle) did not go through.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("the worker holds no session")]
    NoSession,
    #[error("the worker has no durability store")]
    NoStore,
    #[error("durability store: {0}")]
    Store(#[source] std::io::Error),
    #[error("{ns}/{id} is not held by this worker")]
    NotHeld { ns: String, id: String },
    /// The registry refused the call, answered something else than expected, or could not be
    /// reached.
    #[error(transparent)]
    Registry(#[from] Failure),
}

pub(crate) struct Registry {
    addr: WorkerAddr,
    /// What an `https` registry's certificate is verified with.
    tls: ClientTls,
    credential: Credential,
    timeout: Duration,
}

impl Registry {
    pub fn new(
        addr: WorkerAddr,
        tls: ClientTls,
        credential: Credential,
        timeout: Duration,
    ) -> Registry {
        Registry {
            addr,
            tls,
            credential,
            timeout,
        }
    }

    /// `POST /registry/{route}` with `body`; the answer's object on a 2xx.
    pub async fn post<B: Serialize + ?Sized>(
        &self,
        route: &str,
        body: &B,
    ) -> Result<Map<String, Value>, Failure> {
        // The protocol's bodies are plain data: serializing them cannot fail.
        let body = serde_json::to_vec(body).expect("request serializes");
        self.send(route, &body).await
    }

    /// `POST /registry/{route}` with the JSON `body`, through the one-shot client.
    pub async fn send(&self, route: &str, body: &[u8]) -> Result<Map<String, Value>, Failure> {
        let path = format!("/registry/{route}");
        let authorization = self.credential.authorization();
        let headers = [
            ("authorization", authorization.as_str()),
            ("content-type", "application/json"),
        ];
        let answer = fetch(
            &self.addr,
            &self.tls,
            Method::POST,
            &path,
            &headers,
            body,
            self.timeout,
            MAX_ANSWER,
        )
        .await
        .map_err(|e| Failure::Unreachable(e.to_string()))?;
        read_reply(answer.status.as_u16(), &answer.body)
    }

    /// [`post`](Self::post), tried up to three times while the failure is transient (the
    /// registry unreachable or answering 5xx).
    pub async fn post_thrice<B: Serialize + ?Sized>(
        &self,
        route: &str,
        body: &B,
    ) -> Result<Map<String, Value>, Failure> {
        thrice(
            || self.post(route, body),
            Failure::is_transient,
            monoio::time::sleep,
        )
        .await
    }
}
