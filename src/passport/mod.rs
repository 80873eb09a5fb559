//! Passport credentials (contract §2): verifying the JWT a client sends as
//! `Authorization: Bearer`, and reading its account, scopes and `pinboard` route claim.
//!
//! One [`Passport`] is built from configuration at startup and shared read-only by every core.
//! A token is accepted when it is HS256 under the configured secret or EdDSA under one of the
//! configured Ed25519 keys, `exp`/`nbf` hold with 30 s leeway, and `iss`/`aud` match when
//! configured. Its claims are read once, into a [`Credential`] the routes then only query.
//! Development tokens are minted in [`mint`].

mod claims;
mod mint;

use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, TokenData, Validation};
use serde_json::{Map, Value};

pub use claims::{HostPattern, RouteClaim};
pub use mint::{TokenRequest, mint};

/// Clock skew tolerated on `exp` and `nbf` (contract §2).
const LEEWAY_SECS: u64 = 30;

type Claims = Map<String, Value>;

/// A verifying key and the moment it retires: past `not_after` (Unix seconds) it verifies
/// nothing, so an old key can be given an end when its successor is added.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Retiring<T> {
    pub key: T,
    pub not_after: Option<u64>,
}

impl<T> From<T> for Retiring<T> {
    fn from(key: T) -> Retiring<T> {
        Retiring {
            key,
            not_after: None,
        }
    }
}

impl<T> Retiring<T> {
    fn in_force(&self, now: u64) -> bool {
        self.not_after.is_none_or(|end| now <= end)
    }
}

/// The node's Passport verifier: keys and validation rules, prepared once (and again at each
/// reload of the configuration).
#[derive(Debug)]
pub struct Passport {
    hs256: Vec<Retiring<DecodingKey>>,
    hs256_validation: Validation,
    ed25519: Vec<Retiring<DecodingKey>>,
    ed25519_validation: Validation,
    issuer: Option<String>,
    audience: Option<String>,
}

/// Why a request gets 401 `{"error":"unauthorized"}`. The data plane tells the two apart
/// ("authentication required" vs "invalid credential"); the reason is for logs only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Unauthorized {
    /// No Bearer token was presented: no `Authorization` header, another scheme, or an empty
    /// token.
    #[error("no Passport credential")]
    Missing,
    #[error("invalid Passport credential: {0}")]
    Invalid(&'static str),
}

/// The credential's `pinboard` claim is absent or of the wrong shape: 403 `{"error":"forbidden"}`.
/// The reason is for logs only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("forbidden: {reason}")]
pub struct Forbidden {
    pub reason: &'static str,
}

/// A verified Passport credential.
#[derive(Debug, Clone)]
pub struct Credential {
    pub sub: Option<String>,
    /// The union of `scope` and `scopes`, each scope once, in token order.
    pub scopes: Vec<String>,
    route: Result<RouteClaim, Forbidden>,
    /// Every claim but `pinboard`.
    claims: Claims,
}

impl Passport {
    /// `hs256_secrets`: the HS256 secrets; `ed25519_pems`: contents of PEM files of Ed25519
    /// public keys (SPKI `PUBLIC KEY`). At least one key, of either kind, must be given.
    pub fn new(
        hs256_secrets: &[Retiring<&str>],
        ed25519_pems: &[Retiring<Vec<u8>>],
        issuer: Option<&str>,
        audience: Option<&str>,
    ) -> Result<Passport, String> {
        if hs256_secrets.is_empty() && ed25519_pems.is_empty() {
            return Err("no Passport key configured: set passport.hs256_secret, \
                        passport.hs256_secrets or passport.ed25519_public_keys"
                .to_owned());
        }
        let hs256 = hs256_secrets
            .iter()
            .map(|secret| {
                let key = DecodingKey::from_secret(secret.key.as_bytes())
                    .map_err(|_| "an HS256 secret is empty".to_owned())?;
                Ok(Retiring {
                    key,
                    not_after: secret.not_after,
                })
            })
            .collect::<Result<_, String>>()?;
        let ed25519 = ed25519_pems
            .iter()
            .enumerate()
            .map(|(i, pem)| {
                let key = ed25519_key(&pem.key).ok_or_else(|| {
                    format!("passport.ed25519_public_keys[{i}]: not an Ed25519 public key PEM")
                })?;
                Ok(Retiring {
                    key,
                    not_after: pem.not_after,
                })
            })
            .collect::<Result<_, String>>()?;
        Ok(Passport {
            hs256,
            hs256_validation: validation(Algorithm::HS256),
            ed25519,
            ed25519_validation: validation(Algorithm::EdDSA),
            issuer: issuer.map(str::to_owned),
            audience: audience.map(str::to_owned),
        })
    }

    /// The credential a request's `Authorization` header carries.
    pub fn verify_headers(&self, headers: &http::HeaderMap) -> Result<Credential, Unauthorized> {
        self.verify(
            headers
                .get(http::header::AUTHORIZATION)
                .map(|v| v.as_bytes()),
        )
    }

    /// `authorization`: the raw `Authorization` header value, if any.
    pub fn verify(&self, authorization: Option<&[u8]>) -> Result<Credential, Unauthorized> {
        let token = authorization
            .and_then(bearer_token)
            .ok_or(Unauthorized::Missing)?;
        let header = jsonwebtoken::decode_header(token)
            .map_err(|_| Unauthorized::Invalid("malformed or unsupported header"))?;
        let claims = match header.alg {
            Algorithm::HS256 => decode_any(
                token,
                &self.hs256,
                &self.hs256_validation,
                "HS256 is not configured",
            )?,
            Algorithm::EdDSA => decode_any(
                token,
                &self.ed25519,
                &self.ed25519_validation,
                "EdDSA is not configured",
            )?,
            _ => return Err(Unauthorized::Invalid("algorithm not accepted")),
        };
        self.credential(claims)
    }

    fn credential(&self, mut claims: Claims) -> Result<Credential, Unauthorized> {
        if let Some(issuer) = &self.issuer
            && claims.get("iss").and_then(Value::as_str) != Some(issuer)
        {
            return Err(Unauthorized::Invalid("wrong issuer"));
        }
        if let Some(audience) = &self.audience
            && !names_audience(claims.get("aud"), audience)
        {
            return Err(Unauthorized::Invalid("wrong audience"));
        }
        // A registered claim of the wrong type makes the token malformed, as it does for `exp`.
        let sub = match claims.get("sub") {
            None => None,
            Some(Value::String(sub)) => Some(sub.clone()),
            Some(_) => return Err(Unauthorized::Invalid("sub is not a string")),
        };
        let route = match claims.remove("pinboard") {
            None => Err(Forbidden {
                reason: "no pinboard claim",
            }),
            Some(value) => RouteClaim::from_json(&value).map_err(|reason| Forbidden { reason }),
        };
        Ok(Credential {
            sub,
            scopes: scopes(&claims),
            route,
            claims,
        })
    }
}

impl Credential {
    pub fn has_scope(&self, scope: &str) -> bool {
        self.scopes.iter().any(|s| s == scope)
    }

    /// The typed `pinboard` claim, parsed at verification.
    pub fn route_claim(&self) -> Result<&RouteClaim, Forbidden> {
        self.route.as_ref().map_err(|forbidden| *forbidden)
    }

    /// The whole claim set minus `pinboard`, custom claims kept (`acct.claims` in attestations).
    pub fn claims_without_route(&self) -> &Map<String, Value> {
        &self.claims
    }
}

const BAD_SIGNATURE: &str = "bad signature";
/// Every key of the token's algorithm is past its `not_after`.
const RETIRED: &str = "every key of its algorithm has retired";

fn validation(alg: Algorithm) -> Validation {
    let mut validation = Validation::new(alg);
    validation.leeway = LEEWAY_SECS;
    // Neither `exp` nor `nbf` is required, but both are checked when present.
    validation.set_required_spec_claims::<&str>(&[]);
    validation.validate_nbf = true;
    // `iss` and `aud` are checked in `Passport::credential`, exactly as the contract words them.
    validation.validate_aud = false;
    validation
}

/// The claims of `token` under the first of `keys` in force whose signature it carries;
/// `unconfigured`: the refusal when there is no key of the kind at all.
fn decode_any(
    token: &[u8],
    keys: &[Retiring<DecodingKey>],
    validation: &Validation,
    unconfigured: &'static str,
) -> Result<Claims, Unauthorized> {
    if keys.is_empty() {
        return Err(Unauthorized::Invalid(unconfigured));
    }
    let now = jsonwebtoken::get_current_timestamp();
    let mut outcome = Err(Unauthorized::Invalid(RETIRED));
    for key in keys.iter().filter(|key| key.in_force(now)) {
        outcome = decode(token, &key.key, validation);
        // Only a signature that fails under this key says another key may fit; any other
        // failure is the token's own.
        if !matches!(outcome, Err(Unauthorized::Invalid(BAD_SIGNATURE))) {
            break;
        }
    }
    outcome
}

fn decode(
    token: &[u8],
    key: &DecodingKey,
    validation: &Validation,
) -> Result<Claims, Unauthorized> {
    jsonwebtoken::decode(token, key, validation)
        .map(|data: TokenData<Claims>| data.claims)
        .map_err(|err| {
            Unauthorized::Invalid(match err.kind() {
                ErrorKind::InvalidSignature => BAD_SIGNATURE,
                ErrorKind::ExpiredSignature => "expired",
                ErrorKind::ImmatureSignature => "not yet valid",
                ErrorKind::InvalidClaimFormat(_) => "exp or nbf is not a number",
                _ => "malformed token",
            })
        })
}

/// The key in an Ed25519 SPKI PEM, checked to be a curve point now so that a bad key file stops
/// startup instead of failing every token later.
fn ed25519_key(pem: &[u8]) -> Option<DecodingKey> {
    let key = DecodingKey::from_ed_pem(pem).ok()?;
    // The verifier slices the first 32 bytes unchecked, so the length must be exact.
    if key.try_get_as_bytes().ok()?.len() != 32 {
        return None;
    }
    // A trial verification builds the verifier, which decompresses the point; the empty
    // signature just fails.
    jsonwebtoken::crypto::verify("", b"", &key, Algorithm::EdDSA).ok()?;
    Some(key)
}

/// The token of a `Bearer` (any case) credential, when there is a non-empty one.
fn bearer_token(header: &[u8]) -> Option<&[u8]> {
    let header = header.trim_ascii();
    let split = header.iter().position(|b| b.is_ascii_whitespace())?;
    let (scheme, token) = header.split_at(split);
    let token = token.trim_ascii_start();
    (scheme.eq_ignore_ascii_case(b"bearer") && !token.is_empty()).then_some(token)
}

fn names_audience(aud: Option<&Value>, audience: &str) -> bool {
    match aud {
        Some(Value::String(aud)) => aud == audience,
        Some(Value::Array(auds)) => auds.iter().any(|aud| aud.as_str() == Some(audience)),
        _ => false,
    }
}

/// `scope` and `scopes` may each be a space-separated string or an array of strings (contract
/// §2); a token carrying both grants their union. A claim of any other type, or an array holding
/// a non-string, grants nothing rather than failing verification: the token is still genuine,
/// and the route's scope check then answers 403, which tells the holder more than a 401 would.
fn scopes(claims: &Claims) -> Vec<String> {
    let mut scopes: Vec<String> = Vec::new();
    let mut grant = |scope: &str| {
        if !scopes.iter().any(|s| s == scope) {
            scopes.push(scope.to_owned());
        }
    };
    for name in ["scope", "scopes"] {
        match claims.get(name) {
            Some(Value::String(list)) => list.split_whitespace().for_each(&mut grant),
            Some(Value::Array(items)) if items.iter().all(Value::is_string) => {
                items.iter().filter_map(Value::as_str).for_each(&mut grant)
            }
            _ => {}
        }
    }
    scopes
}

#[cfg(test)]
pub(crate) mod tests {
    use base64::Engine;
    use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
    use jsonwebtoken::jwk::{AlgorithmParameters, Jwk};
    use jsonwebtoken::{EncodingKey, Header, get_current_timestamp};
    use serde_json::json;

    use super::*;

    pub(crate) const SECRET: &str = "test-secret";

    /// RFC 8410 DER prefixes: PKCS#8 private key, SPKI public key (each followed by 32 bytes).
    const PKCS8_PREFIX: [u8; 16] = [
        0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04,
        0x20,
    ];
    const SPKI_PREFIX: [u8; 12] = [
        0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
    ];

    fn pem(label: &str, der: &[u8]) -> Vec<u8> {
        format!(
            "-----BEGIN {label}-----\n{}\n-----END {label}-----\n",
            STANDARD.encode(der)
        )
        .into_bytes()
    }

    fn spki_pem(public: &[u8]) -> Vec<u8> {
        pem("PUBLIC KEY", &[&SPKI_PREFIX[..], public].concat())
    }

    /// An Ed25519 signing key from a fixed seed, and the PEM of its public key.
    fn ed_key(seed: u8) -> (EncodingKey, Vec<u8>) {
        let pkcs8 = [&PKCS8_PREFIX[..], &[seed; 32]].concat();
        let signing = EncodingKey::from_ed_der(&pkcs8);
        let jwk = Jwk::from_encoding_key(&signing, Algorithm::EdDSA).unwrap();
        let AlgorithmParameters::OctetKeyPair(params) = jwk.algorithm else {
            panic!("an Ed25519 JWK is an octet key pair");
        };
        let public = URL_SAFE_NO_PAD.decode(params.x).unwrap();
        (signing, spki_pem(&public))
    }

    fn hs256(claims: &Value) -> String {
        hs256_with(SECRET, claims)
    }

    fn hs256_with(secret: &str, claims: &Value) -> String {
        let key = EncodingKey::from_secret(secret.as_bytes()).unwrap();
        jsonwebtoken::encode(&Header::new(Algorithm::HS256), claims, &key).unwrap()
    }

    fn eddsa(key: &EncodingKey, claims: &Value) -> String {
        jsonwebtoken::encode(&Header::new(Algorithm::EdDSA), claims, key).unwrap()
    }

    /// A token with a hand-written header and signature, for algorithms we refuse to sign with.
    fn raw(header: &Value, claims: &Value, signature: &str) -> String {
        let part = |v: &Value| URL_SAFE_NO_PAD.encode(serde_json::to_vec(v).unwrap());
        format!("{}.{}.{signature}", part(header), part(claims))
    }

    fn bearer(token: &str) -> Vec<u8> {
        format!("Bearer {token}").into_bytes()
    }

    pub(crate) fn hs_passport() -> Passport {
        Passport::new(&[SECRET.into()], &[], None, None).unwrap()
    }

    pub(crate) fn check(passport: &Passport, token: &str) -> Result<Credential, Unauthorized> {
        passport.verify(Some(&bearer(token)))
    }

    fn invalid(passport: &Passport, token: &str) -> &'static str {
        match check(passport, token) {
            Err(Unauthorized::Invalid(reason)) => reason,
            other => panic!("expected an invalid credential, got {other:?}"),
        }
    }

    fn now() -> i64 {
        get_current_timestamp() as i64
    }

    #[test]
    fn passport_is_shareable_across_cores() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Passport>();
        assert_send_sync::<Credential>();
    }

    #[test]
    fn good_hs256() {
        let token = hs256(&json!({
            "sub": "acct-1",
            "scope": "pinboard:worker",
            "pinboard": {"namespaces": ["/threads"]},
            "custom": {"team": 7},
        }));
        let cred = check(&hs_passport(), &token).unwrap();
        assert_eq!(cred.sub.as_deref(), Some("acct-1"));
        assert!(cred.has_scope("pinboard:worker"));
        assert!(!cred.has_scope("pinboard:operator"));
        assert!(cred.route_claim().unwrap().allows_namespace("/threads"));
        let rest = cred.claims_without_route();
        assert_eq!(rest.get("custom"), Some(&json!({"team": 7})));
        assert_eq!(rest.get("sub"), Some(&json!("acct-1")));
        assert!(!rest.contains_key("pinboard"));
    }

    #[test]
    fn sub_is_optional_but_must_be_a_string() {
        let cred = check(&hs_passport(), &hs256(&json!({}))).unwrap();
        assert_eq!(cred.sub, None);
        assert!(cred.scopes.is_empty());
        let token = hs256(&json!({"sub": 42}));
        assert_eq!(invalid(&hs_passport(), &token), "sub is not a string");
    }

    #[test]
    fn good_eddsa_with_any_configured_key() {
        let (k1, pem1) = ed_key(1);
        let (k2, pem2) = ed_key(2);
        let passport = Passport::new(&[], &[pem1.into(), pem2.into()], None, None).unwrap();
        for key in [&k1, &k2] {
            let cred = check(&passport, &eddsa(key, &json!({"sub": "ed"}))).unwrap();
            assert_eq!(cred.sub.as_deref(), Some("ed"));
        }
    }

    #[test]
    fn both_kinds_of_key_together() {
        let (key, pem) = ed_key(1);
        let passport = Passport::new(&[SECRET.into()], &[pem.into()], None, None).unwrap();
        assert!(check(&passport, &hs256(&json!({}))).is_ok());
        assert!(check(&passport, &eddsa(&key, &json!({}))).is_ok());
    }

    #[test]
    fn wrong_secret_or_key() {
        let token = hs256_with("another-secret", &json!({}));
        assert_eq!(invalid(&hs_passport(), &token), BAD_SIGNATURE);
        let (_, pem) = ed_key(1);
        let (stranger, _) = ed_key(3);
        let passport = Passport::new(&[], &[pem.into()], None, None).unwrap();
        assert_eq!(
            invalid(&passport, &eddsa(&stranger, &json!({}))),
            BAD_SIGNATURE
        );
    }

    #[test]
    fn tampered_payload() {
        let token = hs256(&json!({"sub": "a"}));
        let mut parts: Vec<&str> = token.split('.').collect();
        let forged = URL_SAFE_NO_PAD.encode(br#"{"sub":"b"}"#);
        parts[1] = &forged;
        assert_eq!(invalid(&hs_passport(), &parts.join(".")), BAD_SIGNATURE);
    }

    #[test]
    fn algorithm_without_configured_key() {
        let (key, pem) = ed_key(1);
        let ed_only = Passport::new(&[], &[pem.into()], None, None).unwrap();
        assert_eq!(
            invalid(&ed_only, &hs256(&json!({}))),
            "HS256 is not configured"
        );
        assert_eq!(
            invalid(&hs_passport(), &eddsa(&key, &json!({}))),
            "EdDSA is not configured"
        );
    }

    #[test]
    fn alg_none_and_unsupported_algorithms() {
        let passport = hs_passport();
        let none = raw(&json!({"alg": "none", "typ": "JWT"}), &json!({}), "");
        assert!(matches!(
            check(&passport, &none),
            Err(Unauthorized::Invalid(_))
        ));
        // Signed correctly with the configured secret, but under HS384.
        let key = EncodingKey::from_secret(SECRET.as_bytes()).unwrap();
        let hs384 = jsonwebtoken::encode(&Header::new(Algorithm::HS384), &json!({}), &key).unwrap();
        assert_eq!(invalid(&passport, &hs384), "algorithm not accepted");
        let rs256 = raw(&json!({"alg": "RS256"}), &json!({}), "AAAA");
        assert_eq!(invalid(&passport, &rs256), "algorithm not accepted");
    }

    #[test]
    fn malformed_tokens() {
        let passport = hs_passport();
        let good = hs256(&json!({}));
        let (header, rest) = good.split_once('.').unwrap();
        let (payload, signature) = rest.split_once('.').unwrap();
        let not_object = raw(&json!({"alg": "HS256"}), &json!([1, 2]), "");
        for bad in [
            "abc",
            "a.b",
            "a.b.c.d",
            "!!!.e30.sig",
            &format!("{header}.{payload}"),
            &format!("{header}.{payload}.{signature}.x"),
            &format!("{header}.***.{signature}"),
            &format!("{header}.{payload}.***"),
            &format!("e30.{payload}.{signature}"),
            &format!(
                "{}.{payload}.{signature}",
                URL_SAFE_NO_PAD.encode("not json")
            ),
            &not_object,
        ] {
            assert!(
                matches!(check(&passport, bad), Err(Unauthorized::Invalid(_))),
                "{bad}"
            );
        }
        // A signed payload that is not a JSON object.
        let key = EncodingKey::from_secret(SECRET.as_bytes()).unwrap();
        let array =
            jsonwebtoken::encode(&Header::new(Algorithm::HS256), &json!([1]), &key).unwrap();
        assert!(matches!(
            check(&passport, &array),
            Err(Unauthorized::Invalid(_))
        ));
    }

    #[test]
    fn authorization_header_forms() {
        let passport = hs_passport();
        let token = hs256(&json!({}));
        for ok in [
            format!("Bearer {token}"),
            format!("bearer {token}"),
            format!("BEARER   {token}  "),
            format!("  Bearer\t{token}"),
        ] {
            assert!(passport.verify(Some(ok.as_bytes())).is_ok(), "{ok}");
        }
        assert_eq!(passport.verify(None).unwrap_err(), Unauthorized::Missing);
        for missing in [
            String::new(),
            "Bearer".to_owned(),
            "Bearer   ".to_owned(),
            token.clone(),
            format!("Basic {token}"),
            format!("Bearer{token}"),
            format!("Token {token}"),
        ] {
            assert_eq!(
                passport.verify(Some(missing.as_bytes())).unwrap_err(),
                Unauthorized::Missing,
                "{missing}"
            );
        }
        for garbled in [
            b"Bearer \xff\xfe".to_vec(),
            b"Bearer not-a-token".to_vec(),
            format!("Bearer {token} extra").into_bytes(),
        ] {
            assert!(matches!(
                passport.verify(Some(&garbled)),
                Err(Unauthorized::Invalid(_))
            ));
        }
    }

    #[test]
    fn exp_honoured_with_leeway() {
        let passport = hs_passport();
        let within = hs256(&json!({"exp": now() - 10}));
        assert!(check(&passport, &within).is_ok());
        let beyond = hs256(&json!({"exp": now() - 60}));
        assert_eq!(invalid(&passport, &beyond), "expired");
        let future = hs256(&json!({"exp": now() + 3600}));
        assert!(check(&passport, &future).is_ok());
        let garbled = hs256(&json!({"exp": "soon"}));
        assert_eq!(invalid(&passport, &garbled), "exp or nbf is not a number");
    }

    #[test]
    fn nbf_honoured_with_leeway() {
        let passport = hs_passport();
        let within = hs256(&json!({"nbf": now() + 10}));
        assert!(check(&passport, &within).is_ok());
        let beyond = hs256(&json!({"nbf": now() + 60}));
        assert_eq!(invalid(&passport, &beyond), "not yet valid");
        let past = hs256(&json!({"nbf": now() - 3600}));
        assert!(check(&passport, &past).is_ok());
        let garbled = hs256(&json!({"nbf": "now"}));
        assert_eq!(invalid(&passport, &garbled), "exp or nbf is not a number");
        // jsonwebtoken's parser gives up on the whole payload here; still refused.
        invalid(&passport, &hs256(&json!({"nbf": [1]})));
    }

    #[test]
    fn expiry_is_checked_for_eddsa_too() {
        let (key, pem) = ed_key(1);
        let passport = Passport::new(&[], &[pem.into()], None, None).unwrap();
        let expired = eddsa(&key, &json!({"exp": now() - 60}));
        assert_eq!(invalid(&passport, &expired), "expired");
    }

    #[test]
    fn issuer_when_configured() {
        let passport = Passport::new(&[SECRET.into()], &[], Some("idp"), None).unwrap();
        assert!(check(&passport, &hs256(&json!({"iss": "idp"}))).is_ok());
        for bad in [
            json!({}),
            json!({"iss": "other"}),
            json!({"iss": "IDP"}),
            json!({"iss": ["idp"]}),
            json!({"iss": 1}),
        ] {
            assert_eq!(invalid(&passport, &hs256(&bad)), "wrong issuer", "{bad}");
        }
        // Unconfigured: any issuer passes.
        assert!(check(&hs_passport(), &hs256(&json!({"iss": "anyone"}))).is_ok());
    }

    #[test]
    fn audience_when_configured() {
        let passport = Passport::new(&[SECRET.into()], &[], None, Some("pinboard")).unwrap();
        for good in [
            json!({"aud": "pinboard"}),
            json!({"aud": ["other", "pinboard"]}),
        ] {
            assert!(check(&passport, &hs256(&good)).is_ok(), "{good}");
        }
        for bad in [
            json!({}),
            json!({"aud": "other"}),
            json!({"aud": ["other"]}),
            json!({"aud": []}),
            json!({"aud": {"pinboard": true}}),
        ] {
            assert_eq!(invalid(&passport, &hs256(&bad)), "wrong audience", "{bad}");
        }
        // Unconfigured: any audience passes.
        let unconfigured = hs256(&json!({"aud": ["x", "y"]}));
        assert!(check(&hs_passport(), &unconfigured).is_ok());
    }

    #[test]
    fn scope_string_scopes_array_and_both() {
        let passport = hs_passport();
        let scopes = |claims: Value| check(&passport, &hs256(&claims)).unwrap().scopes;
        assert_eq!(
            scopes(json!({"scope": "a  b\tc"})),
            ["a", "b", "c"].map(String::from)
        );
        assert_eq!(
            scopes(json!({"scopes": ["a", "b"]})),
            ["a", "b"].map(String::from)
        );
        assert_eq!(
            scopes(json!({"scope": "a b", "scopes": ["b", "c"]})),
            ["a", "b", "c"].map(String::from)
        );
        assert_eq!(scopes(json!({"scope": ["x"]})), ["x"].map(String::from));
        assert_eq!(
            scopes(json!({"scopes": "x y"})),
            ["x", "y"].map(String::from)
        );
    }

    #[test]
    fn wrongly_typed_scope_claims_grant_nothing() {
        let passport = hs_passport();
        for claims in [
            json!({"scope": 1}),
            json!({"scope": null}),
            json!({"scopes": {"a": true}}),
            json!({"scopes": ["a", 1]}),
        ] {
            let cred = check(&passport, &hs256(&claims)).unwrap();
            assert!(cred.scopes.is_empty(), "{claims}");
            assert!(!cred.has_scope("a"));
        }
        // A good claim still counts beside a wrongly typed one.
        let cred = check(&passport, &hs256(&json!({"scope": "a", "scopes": 7}))).unwrap();
        assert_eq!(cred.scopes, ["a"]);
    }

    #[test]
    fn route_claim_absent_or_malformed_is_forbidden_not_unauthorized() {
        let passport = hs_passport();
        let cred = check(&passport, &hs256(&json!({"sub": "a"}))).unwrap();
        assert_eq!(cred.route_claim().unwrap_err().reason, "no pinboard claim");
        for bad in [
            json!(null),
            json!("*"),
            json!({"namespaces": []}),
            json!({"namespaces": ["threads"]}),
            json!({"namespaces": ["/a/b"]}),
            json!({"namespaces": ["*"], "allowedPorts": [0]}),
            json!({"namespaces": ["*"], "allowedPorts": [70000]}),
            json!({"namespaces": ["*"], "allowedBackendHosts": "h"}),
            json!({"namespaces": ["*"], "hostnames": [1]}),
            json!({"namespaces": ["*"], "envs": "prod"}),
        ] {
            let cred = check(&passport, &hs256(&json!({"pinboard": bad}))).unwrap();
            assert!(cred.route_claim().is_err(), "{bad}");
            assert!(!cred.claims_without_route().contains_key("pinboard"));
        }
    }

    #[test]
    fn configuration_errors() {
        let err = Passport::new(&[], &[], None, None).unwrap_err();
        assert!(err.contains("no Passport key configured"), "{err}");
        let err = Passport::new(&["".into()], &[], None, None).unwrap_err();
        assert_eq!(err, "an HS256 secret is empty");

        let (_, good) = ed_key(1);
        let private = pem("PRIVATE KEY", &[&PKCS8_PREFIX[..], &[1; 32]].concat());
        let short = pem(
            "PUBLIC KEY",
            &[
                &[
                    0x30, 0x29, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x20, 0x00,
                ][..],
                &[9; 31],
            ]
            .concat(),
        );
        // A y coordinate with no matching x: 32 bytes, but not a point on the curve.
        let off_curve = spki_pem(&OFF_CURVE);
        for bad in [b"not a pem".to_vec(), Vec::new(), private, short, off_curve] {
            let err =
                Passport::new(&[], &[good.clone().into(), bad.into()], None, None).unwrap_err();
            assert_eq!(
                err,
                "passport.ed25519_public_keys[1]: not an Ed25519 public key PEM"
            );
        }
    }

    #[test]
    fn any_secret_of_several_verifies_until_it_retires() {
        const NEW: &str = "the-next-secret-at-least-32-bytes-long";
        let retiring = |not_after| Retiring {
            key: SECRET,
            not_after: Some(not_after),
        };
        let both =
            Passport::new(&[retiring(now() as u64 + 60), NEW.into()], &[], None, None).unwrap();
        assert!(check(&both, &hs256(&json!({}))).is_ok());
        assert!(check(&both, &hs256_with(NEW, &json!({}))).is_ok());
        assert_eq!(
            invalid(&both, &hs256_with("a-stranger", &json!({}))),
            BAD_SIGNATURE
        );
        // Past its `not_after`, the old secret verifies nothing; the new one still does.
        let retired =
            Passport::new(&[retiring(now() as u64 - 1), NEW.into()], &[], None, None).unwrap();
        assert_eq!(invalid(&retired, &hs256(&json!({}))), BAD_SIGNATURE);
        assert!(check(&retired, &hs256_with(NEW, &json!({}))).is_ok());
        let only_retired = Passport::new(&[retiring(now() as u64 - 1)], &[], None, None).unwrap();
        assert_eq!(invalid(&only_retired, &hs256(&json!({}))), RETIRED);
        // The token's own failure under the key that signed it is said, not hidden by the
        // keys tried before it.
        let expired = hs256(&json!({"exp": now() - 3600}));
        let new_first = Passport::new(&[NEW.into(), SECRET.into()], &[], None, None).unwrap();
        assert_eq!(invalid(&new_first, &expired), "expired");
    }

    #[test]
    fn an_ed25519_key_retires_at_its_not_after() {
        let (old, old_pem) = ed_key(1);
        let (new, new_pem) = ed_key(2);
        let retired = Retiring {
            key: old_pem,
            not_after: Some(now() as u64 - 1),
        };
        let passport = Passport::new(&[], &[retired, new_pem.into()], None, None).unwrap();
        assert_eq!(invalid(&passport, &eddsa(&old, &json!({}))), BAD_SIGNATURE);
        assert!(check(&passport, &eddsa(&new, &json!({}))).is_ok());
    }

    /// y = 2 (little-endian): (y² - 1) / (d·y² + 1) has no square root mod 2²⁵⁵ - 19.
    const OFF_CURVE: [u8; 32] = {
        let mut y = [0; 32];
        y[0] = 2;
        y
    };
}
