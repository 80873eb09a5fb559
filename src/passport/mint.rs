//! `pinboard token` (contract §2): minting HS256 Passport credentials for development.

use jsonwebtoken::{Algorithm, EncodingKey, Header, get_current_timestamp};
use serde_json::{Map, Value, json};

/// What a minted credential carries.
#[derive(Debug, Clone, Default)]
pub struct TokenRequest {
    pub sub: String,
    /// Sent as one space-separated `scope` claim; none sends no claim.
    pub scopes: Vec<String>,
    /// The `pinboard` claim's namespaces. None sends no `pinboard` claim at all: a credential
    /// only for the data plane, whose rules look at scopes alone.
    pub namespaces: Vec<String>,
    /// `allowedBackendHosts`, always sent with the `pinboard` claim (empty grants no host).
    pub backend_hosts: Vec<String>,
    /// `allowedPorts`; none leaves the claim out, which permits every port.
    pub ports: Vec<u16>,
    /// `hostnames`; none leaves the claim out (unrestricted).
    pub hostnames: Vec<String>,
    /// `envs`; none leaves the claim out (unrestricted).
    pub envs: Vec<String>,
    /// `exp` is `iat` plus this.
    pub ttl_secs: u64,
    pub issuer: Option<String>,
    pub audience: Option<String>,
}

/// Signs `req` with `secret` (HS256), `iat` now. Errors only on an empty secret, which no
/// Passport accepts either.
pub fn mint(secret: &str, req: &TokenRequest) -> Result<String, String> {
    let key = EncodingKey::from_secret(secret.as_bytes())
        .map_err(|_| "the token secret is empty".to_owned())?;
    let iat = get_current_timestamp();
    let mut claims = Map::new();
    claims.insert("sub".into(), json!(req.sub));
    claims.insert("iat".into(), json!(iat));
    claims.insert("exp".into(), json!(iat.saturating_add(req.ttl_secs)));
    if !req.scopes.is_empty() {
        claims.insert("scope".into(), json!(req.scopes.join(" ")));
    }
    if let Some(issuer) = &req.issuer {
        claims.insert("iss".into(), json!(issuer));
    }
    if let Some(audience) = &req.audience {
        claims.insert("aud".into(), json!(audience));
    }
    if !req.namespaces.is_empty() {
        let mut route = Map::new();
        route.insert("namespaces".into(), json!(req.namespaces));
        route.insert("allowedBackendHosts".into(), json!(req.backend_hosts));
        if !req.ports.is_empty() {
            route.insert("allowedPorts".into(), json!(req.ports));
        }
        if !req.hostnames.is_empty() {
            route.insert("hostnames".into(), json!(req.hostnames));
        }
        if !req.envs.is_empty() {
            route.insert("envs".into(), json!(req.envs));
        }
        claims.insert("pinboard".into(), Value::Object(route));
    }
    jsonwebtoken::encode(&Header::new(Algorithm::HS256), &claims, &key)
        .map_err(|err| format!("cannot sign the token: {err}"))
}

#[cfg(test)]
mod tests {
    use super::super::Passport;
    use super::super::tests::{SECRET, check, hs_passport};
    use super::*;

    fn strings(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn round_trip_with_every_field() {
        let req = TokenRequest {
            sub: "acct-9".into(),
            scopes: strings(&["pinboard:worker", "pinboard:operator"]),
            namespaces: strings(&["/threads", "/docs"]),
            backend_hosts: strings(&["127.0.0.1", "*.svc.internal"]),
            ports: vec![8080, 9090],
            hostnames: strings(&["*.example.com"]),
            envs: strings(&["prod"]),
            ttl_secs: 3600,
            issuer: Some("dev".into()),
            audience: Some("pinboard".into()),
        };
        let passport = Passport::new(&[SECRET.into()], &[], Some("dev"), Some("pinboard")).unwrap();
        let cred = check(&passport, &mint(SECRET, &req).unwrap()).unwrap();
        assert_eq!(cred.sub.as_deref(), Some("acct-9"));
        assert_eq!(cred.scopes, req.scopes);
        let claims = cred.claims_without_route();
        let (iat, exp) = (
            claims["iat"].as_u64().unwrap(),
            claims["exp"].as_u64().unwrap(),
        );
        assert_eq!(exp - iat, 3600);
        assert!(iat.abs_diff(get_current_timestamp()) <= 5);

        let route = cred.route_claim().unwrap();
        assert!(route.allows_namespace("/threads") && route.allows_namespace("/docs"));
        assert!(!route.allows_namespace("/other") && !route.all_namespaces());
        assert!(route.allows_backend_host("127.0.0.1"));
        assert!(route.allows_backend_host("w1.svc.internal"));
        assert!(!route.allows_backend_host("10.0.0.1"));
        assert!(route.allows_port(9090) && !route.allows_port(80));
        assert!(route.allows_hostname("a.example.com") && !route.allows_hostname("example.com"));
        assert!(!route.unrestricted_hostnames());
        assert!(route.allows_env("prod") && !route.allows_env("dev"));
        assert!(!route.unrestricted_envs());
    }

    #[test]
    fn empty_optional_vectors_leave_their_claims_out() {
        let req = TokenRequest {
            sub: "acct".into(),
            scopes: strings(&["pinboard:worker"]),
            namespaces: strings(&["*"]),
            backend_hosts: strings(&["127.0.0.1"]),
            ttl_secs: 60,
            ..TokenRequest::default()
        };
        let cred = check(&hs_passport(), &mint(SECRET, &req).unwrap()).unwrap();
        let claims = cred.claims_without_route();
        assert!(!claims.contains_key("iss") && !claims.contains_key("aud"));
        let route = cred.route_claim().unwrap();
        assert!(route.all_namespaces());
        assert!(route.allows_port(1) && route.allows_port(65535));
        assert!(route.unrestricted_hostnames() && route.unrestricted_envs());
    }

    #[test]
    fn no_namespaces_mints_a_data_plane_credential() {
        let req = TokenRequest {
            sub: "reader".into(),
            scopes: strings(&["read"]),
            backend_hosts: strings(&["ignored"]),
            ttl_secs: 60,
            ..TokenRequest::default()
        };
        let cred = check(&hs_passport(), &mint(SECRET, &req).unwrap()).unwrap();
        assert!(cred.has_scope("read"));
        assert_eq!(cred.route_claim().unwrap_err().reason, "no pinboard claim");
    }

    #[test]
    fn no_scopes_sends_no_scope_claim() {
        let req = TokenRequest {
            sub: "a".into(),
            ttl_secs: 60,
            ..TokenRequest::default()
        };
        let cred = check(&hs_passport(), &mint(SECRET, &req).unwrap()).unwrap();
        assert!(cred.scopes.is_empty());
        assert!(!cred.claims_without_route().contains_key("scope"));
    }

    #[test]
    fn minted_token_is_rejected_under_another_secret_or_issuer() {
        let req = TokenRequest {
            sub: "a".into(),
            ttl_secs: 60,
            ..TokenRequest::default()
        };
        let token = mint("another-secret", &req).unwrap();
        assert!(check(&hs_passport(), &token).is_err());
        let token = mint(SECRET, &req).unwrap();
        let strict = Passport::new(&[SECRET.into()], &[], Some("prod-idp"), None).unwrap();
        assert!(check(&strict, &token).is_err());
    }

    #[test]
    fn empty_secret_is_refused() {
        assert_eq!(
            mint("", &TokenRequest::default()).unwrap_err(),
            "the token secret is empty"
        );
    }
}
