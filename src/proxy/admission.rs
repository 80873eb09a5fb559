//! Who may send a data-plane request, decided before placement:
//!
//! - an instance calling another (caller attestation: `Pinboard-From`, `Pinboard-Session`,
//!   `Pinboard-Session-Secret`, `Pinboard-Subrequest-Depth`), verified against the calling
//!   session and its placement row, and kept inside the caller's registration;
//! - otherwise, when `namespaces` rules are configured, a Passport credential carrying the
//!   namespace's scopes (the data-plane passport);
//! - otherwise anyone.
//!
//! What it admits travels on in the attestation: `caller` and `depth`, or `acct`.

use http::HeaderName;
use pinboard_protocol::header::{FROM, SESSION, SESSION_SECRET, SUBREQUEST_DEPTH};
use serde_json::{Map, Value, json};

use crate::answers::{self, Fail, Handled};
use crate::http::Response;
use crate::names::{valid_id, valid_namespace};
use crate::node::{Core, Live};
use crate::passport::Unauthorized;
use crate::store::{PlacementRow, Session};

/// Deepest chain of instance-to-instance calls allowed.
const MAX_DEPTH: u32 = 50;

#[derive(Default)]
pub struct Admitted {
    /// A verified caller's own session, preferred for a new placement.
    pub caller_session: Option<Session>,
    /// Extra attestation claims, as JSON members (`"caller":…,"depth":…` or `"acct":…`).
    pub claims: Option<Vec<u8>>,
    /// The `sub` of the data-plane credential: whom new placements count against, rather
    /// than the client's address.
    pub account: Option<String>,
    /// The data-plane passport verified the client's `Authorization`: the worker gets the
    /// identity in `acct`, not the credential (unless `forwards.keep_authorization`).
    pub passport_consumed: bool,
}

fn header<'r>(req: &'r crate::http::Request<'_>, name: &HeaderName) -> Option<&'r str> {
    req.head.headers.get(name).and_then(|v| v.to_str().ok())
}

/// Admits the request for `ns` (reached as `hostname`, in `env`), or answers the refusal.
pub async fn admit(
    core: &Core,
    live: &Live,
    req: &crate::http::Request<'_>,
    ns: &str,
    hostname: &str,
    env: &str,
) -> Handled<Admitted> {
    if [&FROM, &SESSION, &SESSION_SECRET, &SUBREQUEST_DEPTH]
        .iter()
        .any(|h| req.head.headers.contains_key(*h))
    {
        return caller(core, req, ns, hostname, env).await;
    }
    passport(live, req, ns).map_err(Fail::Answer)
}

async fn caller(
    core: &Core,
    req: &crate::http::Request<'_>,
    ns: &str,
    hostname: &str,
    env: &str,
) -> Handled<Admitted> {
    let (Some(session_id), Some(secret)) = (header(req, &SESSION), header(req, &SESSION_SECRET))
    else {
        return Err(
            answers::forbidden_because("caller attestation requires session credentials").into(),
        );
    };
    let Some(session) = core.store.session(session_id).await? else {
        return Err(answers::forbidden_because("unknown session").into());
    };
    // Compared in constant time: the secret is what proves the caller is that worker.
    if !constant_time_eq(session.secret.as_bytes(), secret.as_bytes()) {
        return Err(answers::forbidden_because("invalid session secret").into());
    }
    let from = header(req, &FROM).unwrap_or("");
    let Some((caller_ns, caller_id)) = split_caller(from) else {
        return Err(answers::forbidden_because("malformed caller claim").into());
    };
    let depth = match header(req, &SUBREQUEST_DEPTH) {
        None => 0,
        Some(d) if !d.is_empty() && d.len() <= 9 && d.bytes().all(|b| b.is_ascii_digit()) => {
            d.parse::<u32>().expect("at most 9 digits")
        }
        Some(_) => return Err(answers::forbidden_because("malformed subrequest depth").into()),
    };
    if depth > MAX_DEPTH {
        return Err(answers::depth_exceeded().into());
    }
    // The caller must really hold the instance it speaks for.
    let row = core
        .store
        .row(session.env_of(caller_ns), caller_ns, caller_id)
        .await?;
    if row.as_ref().and_then(PlacementRow::owner) != Some(session.session_id.as_str()) {
        return Err(answers::forbidden_because("caller placement mismatch").into());
    }
    // And may only reach inside its own registration.
    let inside = session.namespaces.iter().any(|n| n == ns)
        && session.hostname.as_deref().unwrap_or("") == hostname
        && (session.hostname.is_none() || session.env_of(ns) == env);
    if !inside {
        return Err(answers::forbidden_because("target outside caller scope").into());
    }
    let claims = format!(
        "\"caller\":{},\"depth\":{depth}",
        Value::String(format!("{caller_ns}/{caller_id}"))
    );
    Ok(Admitted {
        caller_session: Some(session),
        claims: Some(claims.into_bytes()),
        account: None,
        passport_consumed: false,
    })
}

/// `/ns/id` → (`/ns`, `id`).
fn split_caller(from: &str) -> Option<(&str, &str)> {
    let rest = from.strip_prefix('/')?;
    let (seg, id) = rest.split_once('/')?;
    let ns = &from[..seg.len() + 1];
    (valid_namespace(ns) && valid_id(id)).then_some((ns, id))
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The data-plane passport: only when `namespaces` rules are configured.
fn passport(live: &Live, req: &crate::http::Request<'_>, ns: &str) -> Result<Admitted, Response> {
    let rules = &live.config().namespaces;
    if rules.is_empty() {
        return Ok(Admitted::default());
    }
    let credential = (live.settings.passport)
        .verify_headers(&req.head.headers)
        .map_err(|e| match e {
            Unauthorized::Missing => answers::authentication_required(),
            Unauthorized::Invalid(_) => answers::invalid_credential(),
        })?;
    let Some(rule) = rules.get(ns) else {
        return Err(answers::forbidden_because("namespace not allowed"));
    };
    // A credential that also carries a route claim is held to its namespaces.
    if let Ok(claim) = credential.route_claim()
        && !claim.allows_namespace(ns)
    {
        return Err(answers::forbidden_because("namespace not allowed"));
    }
    if !rule.scopes.iter().all(|s| credential.has_scope(s)) {
        return Err(answers::forbidden_because("insufficient scope"));
    }
    let mut acct = Map::new();
    acct.insert(
        "sub".into(),
        credential.sub.clone().map_or(Value::Null, Value::String),
    );
    let scopes: Vec<&String> = credential
        .scopes
        .iter()
        .filter(|s| !s.starts_with("pinboard:"))
        .collect();
    if !scopes.is_empty() {
        acct.insert("scopes".into(), json!(scopes));
    }
    acct.insert(
        "claims".into(),
        Value::Object(credential.claims_without_route().clone()),
    );
    let claims = format!("\"acct\":{}", Value::Object(acct));
    Ok(Admitted {
        caller_session: None,
        claims: Some(claims.into_bytes()),
        account: credential.sub.clone(),
        passport_consumed: true,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caller_claims() {
        assert_eq!(split_caller("/threads/abc"), Some(("/threads", "abc")));
        for bad in [
            "threads/abc",
            "/threads",
            "/threads/",
            "/a/b/c",
            "/a b/c",
            "",
        ] {
            assert_eq!(split_caller(bad), None, "{bad:?}");
        }
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd") && !constant_time_eq(b"abc", b"ab"));
    }
}
