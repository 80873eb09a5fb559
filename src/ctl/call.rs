//! The calls `pinboard ctl` makes to a node: one request on a fresh connection through the
//! workspace's one-shot client ([`fetch`]), under the URL's path (the node's `base_path`) with
//! the operator credential, or `GET /readyz` at the root without one. A 2xx answer's body is
//! handed back as it came; anything else becomes the one line an operator reads.

use std::time::Duration;

use bytes::Bytes;
use http::{Method, StatusCode};
use serde_json::Value;

use crate::http::tls::{Alpn, ClientTls};
use crate::http::{WorkerAddr, fetch};

use super::Failure;
use super::args::Connection;

/// The largest answer read: a `/registry/overview` is about 65 bytes a placement, so some four
/// million placements (`--ns` and `--prefix` narrow a larger one).
pub const MAX_ANSWER: usize = 256 * 1024 * 1024;

/// A node to ask, and how.
pub struct Node {
    addr: WorkerAddr,
    /// The URL as given, for messages.
    url: String,
    tls: ClientTls,
    /// `Bearer <token>`: never printed.
    authorization: String,
    timeout: Duration,
}

impl Node {
    /// The node `--url` names, asked with the credential given; a URL that is no http(s) URL,
    /// a CA file that does not load or a missing credential is a usage error.
    pub fn new(connection: &Connection) -> Result<Node, Failure> {
        let url = connection.url.as_str();
        let addr = WorkerAddr::parse(url).map_err(|rule| {
            // The client's rules are named for an advertise URL; here they are --url's.
            let rule = rule.strip_prefix("advertiseUrl ").unwrap_or(rule);
            Failure::Usage(format!("--url {url}: {rule}"))
        })?;
        let tls = ClientTls::new(connection.ca_file.as_deref(), Alpn::Http1)
            .map_err(|e| Failure::Usage(format!("--ca-file: {}", e.reason)))?;
        let token = connection.credential()?;
        Ok(Node {
            addr,
            url: url.trim_end_matches('/').to_owned(),
            tls,
            authorization: format!("Bearer {token}"),
            timeout: Duration::from_secs(connection.timeout),
        })
    }

    /// `GET {base_path}{path}` with the credential: the 2xx body.
    pub async fn get(&self, path: &str) -> Result<Bytes, Failure> {
        self.call(Method::GET, path, None).await
    }

    /// `POST {base_path}{path}` with the credential and a JSON body: the 2xx body.
    pub async fn post(&self, path: &str, body: &Value) -> Result<Bytes, Failure> {
        self.call(Method::POST, path, Some(body)).await
    }

    /// `GET /readyz` at the root (whatever `base_path` is), without a credential: whether the
    /// node should get traffic (200) or not (503), as the status it answered.
    pub async fn readyz(&self) -> Result<StatusCode, Failure> {
        let root = WorkerAddr {
            base: String::new(),
            ..self.addr.clone()
        };
        let answer = fetch(
            &root,
            &self.tls,
            Method::GET,
            "/readyz",
            &[],
            b"",
            self.timeout,
            MAX_ANSWER,
        )
        .await
        .map_err(|e| self.unreachable(&e))?;
        Ok(answer.status)
    }

    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Bytes, Failure> {
        let mut headers = vec![
            ("authorization", self.authorization.as_str()),
            ("accept", "application/json"),
        ];
        let body = match body {
            Some(json) => {
                headers.push(("content-type", "application/json"));
                json.to_string().into_bytes()
            }
            None => Vec::new(),
        };
        let answer = fetch(
            &self.addr,
            &self.tls,
            method,
            path,
            &headers,
            &body,
            self.timeout,
            MAX_ANSWER,
        )
        .await
        .map_err(|e| self.unreachable(&e))?;
        if answer.status.is_success() {
            Ok(answer.body)
        } else {
            Err(Failure::Failed(refusal(answer.status, &answer.body)))
        }
    }

    /// The line for a call that got no answer: the URL and the client's reason.
    fn unreachable(&self, error: &crate::error::Error) -> Failure {
        // The client names the far end a worker: here it is the node.
        let text = error.to_string();
        let reason = text.strip_prefix("worker: ").unwrap_or(&text);
        let reason = match reason {
            "timed out" => format!("no answer within {}s (--timeout)", self.timeout.as_secs()),
            "response body too large" => format!(
                "the answer is larger than {} MiB (narrow it with --ns or --prefix)",
                MAX_ANSWER >> 20
            ),
            other => other.to_owned(),
        };
        Failure::Failed(format!("{}: {reason}", self.url))
    }
}

/// The line for a non-2xx answer: its status and the node's error string (`403 namespace not
/// allowed: /x`); a 401 also says the credential was refused. A body that is not the node's
/// JSON error (a proxy in front of it) is shown as text, its first line, cut at 200 characters.
pub fn refusal(status: StatusCode, body: &[u8]) -> String {
    let error = serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| v.get("error")?.as_str().map(str::to_owned))
        .or_else(|| {
            let text = String::from_utf8_lossy(body);
            let line = text.lines().next().unwrap_or("").trim();
            (!line.is_empty()).then(|| line.chars().take(200).collect())
        })
        .unwrap_or_else(|| status.canonical_reason().unwrap_or("").to_lowercase());
    let code = status.as_u16();
    if status == StatusCode::UNAUTHORIZED {
        format!("{code} {error} (the node refused the credential)")
    } else {
        format!("{code} {error}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_name_the_status_and_the_nodes_error() {
        let line = |status: u16, body: &str| {
            refusal(StatusCode::from_u16(status).unwrap(), body.as_bytes())
        };
        assert_eq!(
            line(403, r#"{"error":"namespace not allowed: /x"}"#),
            "403 namespace not allowed: /x"
        );
        assert_eq!(
            line(401, r#"{"error":"unauthorized"}"#),
            "401 unauthorized (the node refused the credential)"
        );
        assert_eq!(
            line(502, "<html>bad gateway</html>\nmore"),
            "502 <html>bad gateway</html>"
        );
        assert_eq!(line(503, ""), "503 service unavailable");
        assert_eq!(line(400, r#"{"other":1}"#), r#"400 {"other":1}"#);
    }
}
