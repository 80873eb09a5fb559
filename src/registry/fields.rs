//! The registry's field rules: what a namespace, hostname or env may look like, and whether a
//! registration stays inside its credential's `pinboard` claim. Each refusal carries the spec's
//! exact error string.

use http::StatusCode;

use crate::http::{Response, WorkerAddr};
use crate::passport::RouteClaim;
use crate::store::Session;

/// `/` plus one path segment of URL-safe characters (the id alphabet), at most 128 of them;
/// not a dot segment (a path normalizer would remove it) and not `/_pinned`, the worker's own
/// routes (`/_pinned/stats` must never be an instance).
pub fn valid_namespace(ns: &str) -> bool {
    ns.strip_prefix('/')
        .is_some_and(|seg| seg.len() <= 128 && valid_segment(seg) && seg != "_pinned")
}

/// An id or a namespace's segment: non-empty, `[A-Za-z0-9._~-]`, and not `.` or `..`.
fn valid_segment(seg: &str) -> bool {
    !seg.is_empty() && seg.bytes().all(id_byte) && seg != "." && seg != ".."
}

/// The data plane's id alphabet: `[A-Za-z0-9._~-]`.
pub fn id_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'~' | b'-')
}

pub fn valid_id(id: &str) -> bool {
    id.len() <= 256 && valid_segment(id)
}

/// A hostname or env name, lowercased; refused when empty or holding `*`, whitespace, `/` or
/// `:` (they would blur the `{hostname}{ns}` binding keys and the host patterns).
pub fn normalize_name(kind: &str, value: &str) -> Result<String, Response> {
    let bad = value.is_empty()
        || value
            .chars()
            .any(|c| c == '*' || c == '/' || c == ':' || c.is_whitespace() || c.is_control());
    if bad {
        return Err(bad_request(&format!("invalid {kind}: {value}")));
    }
    Ok(value.to_lowercase())
}

pub fn bad_request(message: &str) -> Response {
    Response::error(StatusCode::BAD_REQUEST, message)
}

pub fn forbidden(message: &str) -> Response {
    Response::error(StatusCode::FORBIDDEN, message)
}

pub fn forbidden_generic() -> Response {
    forbidden("forbidden")
}

/// What a registration asks for, in the terms the claim is checked against.
pub struct Scope<'a> {
    pub namespaces: &'a [String],
    pub advertise: &'a WorkerAddr,
    pub hostname: Option<&'a str>,
    /// Every env the registration names (`env` and the values of `envs`).
    pub envs: Vec<&'a str>,
}

impl<'a> Scope<'a> {
    pub fn of(session: &'a Session, advertise: &'a WorkerAddr) -> Scope<'a> {
        Scope {
            namespaces: &session.namespaces,
            advertise,
            hostname: session.hostname.as_deref(),
            envs: session
                .env
                .iter()
                .chain(session.envs.values())
                .map(String::as_str)
                .collect(),
        }
    }
}

/// The first part of `scope` the claim does not cover, as the spec's 403.
pub fn check_claim(claim: &RouteClaim, scope: &Scope<'_>) -> Result<(), Response> {
    if let Some(ns) = scope
        .namespaces
        .iter()
        .find(|ns| !claim.allows_namespace(ns))
    {
        return Err(forbidden(&format!("namespace not allowed: {ns}")));
    }
    let host = &scope.advertise.host;
    if !claim.allows_backend_host(host) {
        return Err(forbidden(&format!("backend host not allowed: {host}")));
    }
    let port = scope.advertise.port;
    if !claim.allows_port(port) {
        return Err(forbidden(&format!("advertiseUrl port not allowed: {port}")));
    }
    if let Some(hostname) = scope.hostname
        && !claim.allows_hostname(hostname)
    {
        return Err(forbidden(&format!("hostname not allowed: {hostname}")));
    }
    if let Some(env) = scope.envs.iter().find(|env| !claim.allows_env(env)) {
        return Err(forbidden(&format!("env not allowed: {env}")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaces_ids_and_names() {
        assert!(valid_namespace("/threads"));
        assert!(valid_namespace("/a.b_c~d-1"));
        for bad in ["", "/", "threads", "/a/b", "/a b", "//", "/ä"] {
            assert!(!valid_namespace(bad), "{bad:?}");
        }
        assert!(valid_id("abc-1.2_~"));
        assert!(!valid_id(""));
        assert!(!valid_id(&"a".repeat(257)));
        assert!(valid_id(&"a".repeat(256)));
        assert_eq!(
            normalize_name("hostname", "Edge-1.Example").unwrap_or_else(|_| panic!()),
            "edge-1.example"
        );
        for bad in ["", "a*b", "a b", "a/b", "a:b"] {
            assert!(normalize_name("env", bad).is_err(), "{bad:?}");
        }
    }
}
