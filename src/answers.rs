//! Every answer the node writes itself (as opposed to the ones it relays from a worker), in one
//! list, and [`Fail`]: how a handler ends early, with one of these answers or with an
//! [`Error`] that [`for_error`] turns into its answer from its origin and retryability.
//!
//! The strings are the spec's, to the letter; `docs/api.md` lists them per route. A refused
//! registration, schedule or operator act is also one log line ([`log_refusal`]).

use std::time::Duration;

use http::{HeaderValue, StatusCode, header};

use tracing::warn;

use crate::error::{Error, Origin};
use crate::http::{BodyError, Response};
use crate::passport::Credential;
use crate::redis::RedisError;

/// The largest body a registry or operator route reads.
pub const BODY_LIMIT: usize = 1024 * 1024;
/// A registration may list many held instances.
pub const REGISTER_BODY_LIMIT: usize = 8 * 1024 * 1024;

/// Why a handler stops before its normal answer.
pub enum Fail {
    /// A refusal the spec names, ready to send.
    Answer(Response),
    /// A failure; its answer follows from where it came from ([`for_error`]).
    Error(Error),
}

/// What a handler (or a step of one) returns: `?` carries both refusals and errors up.
pub type Handled<T = Response> = Result<T, Fail>;

impl From<Response> for Fail {
    fn from(answer: Response) -> Fail {
        Fail::Answer(answer)
    }
}

impl From<Error> for Fail {
    fn from(e: Error) -> Fail {
        Fail::Error(e)
    }
}

impl From<RedisError> for Fail {
    fn from(e: RedisError) -> Fail {
        Fail::Error(e.into())
    }
}

/// What the log line of a refused act names, as far as its handler got before refusing: what
/// the act was about (a client, `{ns}/{id}`) and a detail the answer keeps from the caller (a
/// registration probe's outcome).
#[derive(Default)]
pub struct Act {
    pub about: Option<String>,
    pub detail: Option<String>,
}

/// Logs the refusal a handler of `act` ended in, if it ended in one (an answer of 400–499): one
/// line at `warn` naming the credential's subject (`sub`), the act's `about`, the status and
/// the answer's `error`.
pub fn log_refusal(act: &str, credential: &Credential, named: &Act, answered: &Handled) {
    let (Ok(answer) | Err(Fail::Answer(answer))) = answered else {
        return;
    };
    if !answer.status.is_client_error() {
        return;
    }
    let error = serde_json::from_slice::<serde_json::Value>(&answer.body)
        .ok()
        .and_then(|body| Some(body.get("error")?.as_str()?.to_owned()));
    warn!(
        sub = credential.sub.as_deref().map(tracing::field::display),
        about = named.about.as_deref().map(tracing::field::display),
        status = answer.status.as_u16(),
        error = error.as_deref().map(tracing::field::display),
        detail = named.detail.as_deref().map(tracing::field::display),
        "{act} refused"
    );
}

/// The answer for a failure, by its origin: a transient Redis failure is the client's to retry
/// (contract §8: 503 + `Retry-After`); a worker that failed is 502. Anything else stays an
/// error, which the server logs and answers 500 `internal error`.
pub fn for_error(e: Error) -> Result<Response, Error> {
    match e.origin() {
        Origin::Redis if e.is_retryable() => Ok(registry_unavailable()),
        Origin::Upstream => Ok(bad_gateway()),
        _ => Err(e),
    }
}

/// `{"error": message}` with `status`.
fn error(status: StatusCode, message: &str) -> Response {
    Response::error(status, message)
}

pub fn bad_request(message: &str) -> Response {
    error(StatusCode::BAD_REQUEST, message)
}

/// 401 `unauthorized`: a registry route without a valid credential.
pub fn unauthorized() -> Response {
    error(StatusCode::UNAUTHORIZED, "unauthorized")
}

/// 401 `authentication required`: a data-plane namespace with rules, and no credential.
pub fn authentication_required() -> Response {
    error(StatusCode::UNAUTHORIZED, "authentication required")
}

/// 401 `invalid credential`: a data-plane credential that does not verify.
pub fn invalid_credential() -> Response {
    error(StatusCode::UNAUTHORIZED, "invalid credential")
}

/// 508 `subrequest depth exceeded`: an instance-to-instance chain too deep.
pub fn depth_exceeded() -> Response {
    error(StatusCode::LOOP_DETECTED, "subrequest depth exceeded")
}

/// 403 with the spec's reason.
pub fn forbidden_because(message: &str) -> Response {
    error(StatusCode::FORBIDDEN, message)
}

/// 403 `forbidden`.
pub fn forbidden() -> Response {
    forbidden_because("forbidden")
}

pub fn not_found() -> Response {
    error(StatusCode::NOT_FOUND, "not found")
}

pub fn unknown_namespace() -> Response {
    error(StatusCode::NOT_FOUND, "unknown namespace")
}

/// 405 naming the one method the route takes.
pub fn method_not_allowed(allow: &'static str) -> Response {
    error(StatusCode::METHOD_NOT_ALLOWED, "method not allowed")
        .header(header::ALLOW, HeaderValue::from_static(allow))
}

pub fn conflict(message: &str) -> Response {
    error(StatusCode::CONFLICT, message)
}

/// `409 {"error":"unknown session","reregister":true}` (contract §5).
pub fn unknown_session() -> Response {
    Response::json_value(
        StatusCode::CONFLICT,
        &serde_json::json!({"error": "unknown session", "reregister": true}),
    )
}

/// 503 `{"error": message}` with `Retry-After: max(1, ceil(remaining / 1000))`.
pub fn unavailable(message: &str, remaining: Duration) -> Response {
    retry_later(StatusCode::SERVICE_UNAVAILABLE, message, remaining)
}

/// 429 `placement rate exceeded, retry` with `Retry-After` as [`unavailable`] counts it: the
/// client made new placements faster than `limits.new_placements_per_ip_per_s`.
pub fn placement_rate_exceeded(wait: Duration) -> Response {
    retry_later(
        StatusCode::TOO_MANY_REQUESTS,
        "placement rate exceeded, retry",
        wait,
    )
}

/// `status` `{"error": message}` with `Retry-After: max(1, ceil(remaining / 1000))`: whole
/// seconds, rounded up so that a client retrying then finds the refusal over.
fn retry_later(status: StatusCode, message: &str, remaining: Duration) -> Response {
    let secs = remaining.as_millis().div_ceil(1000).max(1);
    error(status, message).header(
        header::RETRY_AFTER,
        HeaderValue::from_str(&secs.to_string()).expect("digits"),
    )
}

/// 503 `instance paused` + `Retry-After: 1`: an operator paused the id
/// (`POST /registry/pause`); every node answers it so until a resume.
pub fn instance_paused() -> Response {
    unavailable("instance paused", Duration::ZERO)
}

/// 503 `registry unavailable, retry` + `Retry-After: 1`: Redis could not be asked.
pub fn registry_unavailable() -> Response {
    unavailable("registry unavailable, retry", Duration::ZERO)
}

/// 503 `not the serving fleet` + `Retry-After: 1`.
pub fn not_serving() -> Response {
    unavailable("not the serving fleet", Duration::ZERO)
}

/// 500 `metrics collection failed`.
pub fn metrics_failed() -> Response {
    error(
        StatusCode::INTERNAL_SERVER_ERROR,
        "metrics collection failed",
    )
}

/// 502 `bad gateway` (text): the worker could not be reached or failed mid-answer.
pub fn bad_gateway() -> Response {
    Response::text(StatusCode::BAD_GATEWAY, "bad gateway")
}

/// 504 `upstream timeout` (text), closing: the worker did not answer in time.
pub fn upstream_timeout() -> Response {
    Response::text(StatusCode::GATEWAY_TIMEOUT, "upstream timeout").closing()
}

/// An empty 502, closing: the client went away mid-request, no one reads it.
pub fn client_gone() -> Response {
    Response::empty(StatusCode::BAD_GATEWAY).closing()
}

/// The answer to a request whose body failed while it was forwarded: the client gone (an empty
/// 502), or too slow (408 `request timeout`) or malformed (400 `bad request`), as a registry
/// route answers them; closing.
pub fn body_failed(e: BodyError) -> Response {
    match e {
        BodyError::Aborted => client_gone(),
        e => e.answer(),
    }
}

/// 400 `invalid instance id` (text), as the data plane answers a path it cannot route.
pub fn invalid_instance_id() -> Response {
    Response::text(StatusCode::BAD_REQUEST, "invalid instance id")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_is_answered_by_its_origin() {
        let transient = Error::new(Origin::Redis, "x").retryable(true);
        let answer = for_error(transient).unwrap();
        assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            &answer.body[..],
            br#"{"error":"registry unavailable, retry"}"#
        );
        assert_eq!(
            for_error(Error::new(Origin::Upstream, "x")).unwrap().status,
            StatusCode::BAD_GATEWAY
        );
        assert!(for_error(Error::new(Origin::Redis, "NOSCRIPT")).is_err());
        assert!(for_error(Error::new(Origin::Internal, "x")).is_err());
    }

    #[test]
    fn retry_after_rounds_up_to_whole_seconds() {
        let r = unavailable("x", Duration::from_millis(2001));
        assert_eq!(r.headers.last().unwrap().1, "3");
        assert_eq!(not_serving().headers.last().unwrap().1, "1");
        let r = placement_rate_exceeded(Duration::from_millis(1));
        assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(
            &r.body[..],
            br#"{"error":"placement rate exceeded, retry"}"#
        );
        assert_eq!(r.headers.last().unwrap().1, "1");
    }
}
