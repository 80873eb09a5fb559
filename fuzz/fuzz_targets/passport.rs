//! `Passport::verify`: the `Authorization` header of every credentialed request.
//!
//! Input, one of two forms:
//! - anything else than the form below: the raw header value (`Bearer <jwt>`, other schemes,
//!   garbage), which explores the bearer and JWT parsing in front of the signature check;
//! - `sign:<header>\n<claims>`: the JWT header and claims as raw bytes, which the target encodes
//!   and signs with the configured HS256 secret, so the fuzzer reaches the claim checks and the
//!   `pinboard` route claim behind the signature.
//!
//! Every input is verified by an open passport (secret only) and a strict one (secret, issuer
//! and audience). Beyond "no panic", it checks that:
//! - a token signed with the configured secret never fails its signature check;
//! - whatever the strict passport accepts, the open one accepts with the same claims;
//! - an accepted credential's `sub` is its `sub` claim, each scope is listed once and granted,
//!   and the `pinboard` claim is not among its plain claims;
//! - a route claim grants each namespace, host, hostname, env and port it lists itself.
#![no_main]

use std::sync::LazyLock;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::{Algorithm, EncodingKey};
use libfuzzer_sys::fuzz_target;
use pinboard::passport::{Credential, Passport, Unauthorized};
use serde_json::Value;

const SECRET: &str = "fuzz-secret";

struct Keys {
    open: Passport,
    strict: Passport,
    signing: EncodingKey,
}

static KEYS: LazyLock<Keys> = LazyLock::new(|| Keys {
    open: Passport::new(&[SECRET.into()], &[], None, None).expect("a valid passport"),
    strict: Passport::new(
        &[SECRET.into()],
        &[],
        Some("https://issuer.example"),
        Some("pinboard"),
    )
    .expect("a valid passport"),
    signing: EncodingKey::from_secret(SECRET.as_bytes()).expect("a non-empty secret"),
});

fuzz_target!(|data: &[u8]| {
    let keys = &*KEYS;
    let (authorization, signed_claims) = match data.strip_prefix(b"sign:") {
        Some(parts) => {
            let Some(newline) = parts.iter().position(|&b| b == b'\n') else {
                return;
            };
            let (header, claims) = (&parts[..newline], &parts[newline + 1..]);
            let message = format!(
                "{}.{}",
                URL_SAFE_NO_PAD.encode(header),
                URL_SAFE_NO_PAD.encode(claims)
            );
            let signature =
                jsonwebtoken::crypto::sign(message.as_bytes(), &keys.signing, Algorithm::HS256)
                    .expect("HMAC signs any message");
            let authorization = format!("Bearer {message}.{signature}").into_bytes();
            (authorization, Some(claims))
        }
        None => (data.to_vec(), None),
    };

    let open = keys.open.verify(Some(&authorization));
    let strict = keys.strict.verify(Some(&authorization));
    if signed_claims.is_some() {
        for outcome in [&open, &strict] {
            assert!(
                !matches!(outcome, Err(Unauthorized::Invalid("bad signature"))),
                "a token signed with the configured secret failed its signature check"
            );
        }
    }
    if let Ok(strict) = &strict {
        let open = open
            .as_ref()
            .expect("the open passport refused what the strict one took");
        assert_eq!(strict.claims_without_route(), open.claims_without_route());
    }
    if let Ok(credential) = &open {
        check_credential(credential, signed_claims);
    }
});

fn check_credential(credential: &Credential, signed_claims: Option<&[u8]>) {
    let claims = credential.claims_without_route();
    assert!(
        !claims.contains_key("pinboard"),
        "the route claim leaked into the plain claims"
    );
    assert_eq!(
        credential.sub.as_deref(),
        claims.get("sub").and_then(Value::as_str)
    );
    // Items of an array-form claim are taken verbatim, so a scope may be empty or hold spaces;
    // such a scope can never equal a configured one (those are checked free of whitespace).
    for (i, scope) in credential.scopes.iter().enumerate() {
        assert!(
            !credential.scopes[..i].contains(scope),
            "scope {scope:?} twice"
        );
        assert!(credential.has_scope(scope));
    }

    // The route claim as written, to hold the parsed one to its own words.
    let (Some(claims), Ok(route)) = (signed_claims, credential.route_claim()) else {
        return;
    };
    let claims: Value = serde_json::from_slice(claims).expect("accepted claims are JSON");
    let written = &claims["pinboard"];
    let strings = |field| {
        written
            .get(field)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
    };
    for ns in strings("namespaces") {
        assert!(route.allows_namespace(ns), "namespace {ns:?} not granted");
        if ns == "*" {
            assert!(route.all_namespaces());
        }
    }
    for host in strings("allowedBackendHosts") {
        assert!(
            route.allows_backend_host(host),
            "backend host {host:?} not granted"
        );
    }
    for hostname in strings("hostnames") {
        assert!(
            route.allows_hostname(hostname),
            "hostname {hostname:?} not granted"
        );
    }
    for env in strings("envs") {
        assert!(route.allows_env(env), "env {env:?} not granted");
    }
    let ports = written.get("allowedPorts").and_then(Value::as_array);
    for port in ports.into_iter().flatten().filter_map(Value::as_u64) {
        let port = u16::try_from(port).expect("an accepted port fits in 16 bits");
        assert!(route.allows_port(port), "port {port} not granted");
    }
    assert_eq!(
        route.unrestricted_hostnames(),
        written.get("hostnames").is_none()
    );
    assert_eq!(route.unrestricted_envs(), written.get("envs").is_none());
}
