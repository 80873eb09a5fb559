//! The registry's field rules: what a namespace, hostname or env may look like, and whether a
//! registration stays inside its credential's `pinboard` claim. Each refusal carries the spec's
//! exact error string.

use crate::answers;
use crate::http::{Response, WorkerAddr};
use crate::passport::RouteClaim;
use crate::store::Session;

/// A hostname or env name, lowercased; refused when empty or holding `*`, whitespace, `/` or
/// `:` (they would blur the `{hostname}{ns}` binding keys and the host patterns).
pub fn normalize_name(kind: &str, value: &str) -> Result<String, Response> {
    let bad = value.is_empty()
        || value
            .chars()
            .any(|c| c == '*' || c == '/' || c == ':' || c.is_whitespace() || c.is_control());
    if bad {
        return Err(answers::bad_request(&format!("invalid {kind}: {value}")));
    }
    Ok(value.to_lowercase())
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
        return Err(answers::forbidden_because(&format!(
            "namespace not allowed: {ns}"
        )));
    }
    let host = &scope.advertise.host;
    if !claim.allows_backend_host(host) {
        return Err(answers::forbidden_because(&format!(
            "backend host not allowed: {host}"
        )));
    }
    let port = scope.advertise.port;
    if !claim.allows_port(port) {
        return Err(answers::forbidden_because(&format!(
            "advertiseUrl port not allowed: {port}"
        )));
    }
    if let Some(hostname) = scope.hostname
        && !claim.allows_hostname(hostname)
    {
        return Err(answers::forbidden_because(&format!(
            "hostname not allowed: {hostname}"
        )));
    }
    if let Some(env) = scope.envs.iter().find(|env| !claim.allows_env(env)) {
        return Err(answers::forbidden_because(&format!(
            "env not allowed: {env}"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostnames_and_envs() {
        assert_eq!(
            normalize_name("hostname", "Edge-1.Example").unwrap_or_else(|_| panic!()),
            "edge-1.example"
        );
        for bad in ["", "a*b", "a b", "a/b", "a:b"] {
            assert!(normalize_name("env", bad).is_err(), "{bad:?}");
        }
    }
}
