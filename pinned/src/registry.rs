//! Calls to the registry's worker routes (`POST {base}/registry/{route}`): one JSON request
//! on a fresh connection through `pinboard-http`'s one-shot client, the answer turned into
//! either its JSON object (read as the protocol's answer type by [`read_answer`]) or a
//! [`CallError`] that says whether to re-register, give up or try again.

use std::time::Duration;

use http::Method;
use pinboard_http::tls::ClientTls;
use pinboard_http::{WorkerAddr, fetch};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::credential::Credential;

/// Largest registry answer read. Answers are small; register's `duplicates` is the largest.
const MAX_ANSWER: usize = 8 * 1024 * 1024;
/// Pause before the second and third try of a call that gives up after three.
const RETRY_PAUSE: Duration = Duration::from_millis(250);

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
    #[error("registry answered {status}: {error}")]
    Refused {
        status: u16,
        /// The answer's `error` string.
        error: String,
        /// The registry lost the session: register again.
        reregister: bool,
        /// A higher-epoch registration displaced this one.
        superseded: bool,
    },
    #[error("registry unreachable: {0}")]
    Unreachable(#[source] pinboard_http::error::Error),
    #[error("registry answered {status} with a body that is not the expected JSON object")]
    BadAnswer { status: u16 },
}

impl CallError {
    /// Whether sending the same call again may succeed.
    fn is_transient(&self) -> bool {
        match self {
            CallError::Unreachable(_) => true,
            CallError::Refused { status, .. } => *status >= 500,
            _ => false,
        }
    }
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
    ) -> Result<Map<String, Value>, CallError> {
        let path = format!("/registry/{route}");
        let authorization = self.credential.authorization();
        let headers = [
            ("authorization", authorization.as_str()),
            ("content-type", "application/json"),
        ];
        // The protocol's bodies are plain data: serializing them cannot fail.
        let body = serde_json::to_vec(body).expect("request serializes");
        let answer = fetch(
            &self.addr,
            &self.tls,
            Method::POST,
            &path,
            &headers,
            &body,
            self.timeout,
            MAX_ANSWER,
        )
        .await
        .map_err(CallError::Unreachable)?;
        let status = answer.status.as_u16();
        let object = match serde_json::from_slice(&answer.body) {
            Ok(Value::Object(object)) => Some(object),
            _ => None,
        };
        match object {
            Some(object) if answer.status.is_success() => Ok(object),
            None if answer.status.is_success() => Err(CallError::BadAnswer { status }),
            object => {
                let object = object.unwrap_or_default();
                let flag = |key: &str| object.get(key).and_then(Value::as_bool) == Some(true);
                Err(CallError::Refused {
                    status,
                    error: match object.get("error") {
                        Some(Value::String(error)) => error.clone(),
                        _ => String::from_utf8_lossy(&answer.body).into_owned(),
                    },
                    reregister: flag("reregister"),
                    superseded: flag("superseded"),
                })
            }
        }
    }

    /// [`post`](Self::post), tried up to three times while the failure is transient (the
    /// registry unreachable or answering 5xx).
    pub async fn post_thrice<B: Serialize + ?Sized>(
        &self,
        route: &str,
        body: &B,
    ) -> Result<Map<String, Value>, CallError> {
        let mut tries = 1;
        loop {
            match self.post(route, body).await {
                Err(e) if e.is_transient() && tries < 3 => {
                    tracing::debug!(route, error = %e, tries, "registry call failed; retrying");
                    tries += 1;
                    monoio::time::sleep(RETRY_PAUSE).await;
                }
                result => return result,
            }
        }
    }
}

/// A 2xx answer's object read as `A`, one of `pinboard_protocol::registry`'s answers; `None`
/// when a field the worker cannot do without is missing or malformed (the others read as
/// absent).
pub(crate) fn read_answer<A: DeserializeOwned>(answer: Map<String, Value>) -> Option<A> {
    serde_json::from_value(Value::Object(answer)).ok()
}
