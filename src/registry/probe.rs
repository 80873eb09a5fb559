//! The ownership probe: `GET {advertiseUrl}/_pinned/challenge?challenge=…` with the worker's
//! secret, which only the worker that sent the challenge can answer with its value. An `https`
//! worker is probed over TLS, its certificate verified with the node's trust for workers (the
//! system roots plus `forwards.ca_file`): one that does not verify fails the probe.

use std::time::Duration;

use http::Method;
use serde_json::Value;

use pinboard_protocol::header;

use crate::http::tls::ClientTls;
use crate::http::{WorkerAddr, fetch};

/// Probe answers are tiny; anything bigger is not a worker talking.
const MAX_ANSWER: usize = 16 * 1024;

#[derive(Debug, PartialEq)]
pub enum Probe {
    /// 2xx with `{"value": <the expected value>}`.
    Pass,
    /// 2xx with a different value: another worker answers at this URL.
    Mismatch,
    /// Unreachable, timed out, non-2xx, or no usable body: the detail is for the node's log.
    Failed(String),
}

pub async fn probe(
    worker: &WorkerAddr,
    tls: &ClientTls,
    secret: &str,
    challenge: &str,
    expected: &Value,
    timeout: Duration,
) -> Probe {
    let path = format!("/_pinned/challenge?challenge={}", percent_encode(challenge));
    let name = header::PROXY_SECRET;
    let headers = [(name.as_str(), secret)];
    let answer = match fetch(
        worker,
        tls,
        Method::GET,
        &path,
        &headers,
        b"",
        timeout,
        MAX_ANSWER,
    )
    .await
    {
        Ok(answer) => answer,
        Err(e) => return Probe::Failed(e.to_string()),
    };
    if !answer.status.is_success() {
        return Probe::Failed(format!("answered {}", answer.status));
    }
    let value = serde_json::from_slice::<Value>(&answer.body)
        .ok()
        .and_then(|mut v| v.get_mut("value").map(Value::take));
    match value {
        Some(v) if &v == expected => Probe::Pass,
        Some(_) => Probe::Mismatch,
        None => Probe::Failed("answer has no JSON value".into()),
    }
}

/// Query-component encoding: everything outside RFC 3986's unreserved set becomes `%XX`.
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn challenge_is_query_safe() {
        assert_eq!(super::percent_encode("a b&c=d/é"), "a%20b%26c%3Dd%2F%C3%A9");
        assert_eq!(super::percent_encode("Az09-._~"), "Az09-._~");
    }
}
