//! `RedisTarget::parse`: the `redis_url` setting.
//!
//! Input: the URL text. Beyond "no panic", it checks that every accepted URL names at least one
//! endpoint, each with a host and a non-zero port (over TLS, a host a certificate can be
//! verified against), that the TLS flag is the scheme's, and that its masked form (what
//! `check-config` prints, and `Config::render_masked` promises loads back) parses to the same
//! target with the password read as `***` (the user, escaped as needed, read back as itself).
#![no_main]

use libfuzzer_sys::fuzz_target;
use pinboard::http::tls::is_server_name;
use pinboard::redis::{Credentials, Endpoint, RedisTarget};

fuzz_target!(|data: &[u8]| {
    let Ok(url) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(target) = RedisTarget::parse(url) else {
        return;
    };

    let endpoints: &[Endpoint] = match &target {
        RedisTarget::Single { endpoint, .. } => std::slice::from_ref(endpoint),
        RedisTarget::Cluster { seeds, .. } => seeds,
    };
    assert!(!endpoints.is_empty(), "{url:?} named no endpoint");
    for endpoint in endpoints {
        assert!(!endpoint.host.is_empty(), "{url:?} gave an empty host");
        assert_ne!(endpoint.port, 0, "{url:?} gave port 0");
        assert!(
            !target.tls() || is_server_name(&endpoint.host),
            "{url:?} gave a TLS host no certificate can be verified against"
        );
    }
    assert_eq!(target.tls(), url.starts_with("rediss"), "{url:?}");

    let masked = target.masked();
    let mask = |credentials: Option<Credentials>| {
        credentials.map(|c| Credentials {
            password: "***".to_owned(),
            ..c
        })
    };
    let expected = match target {
        RedisTarget::Single {
            endpoint,
            credentials,
            db,
            tls,
        } => RedisTarget::Single {
            endpoint,
            credentials: mask(credentials),
            db,
            tls,
        },
        RedisTarget::Cluster {
            seeds,
            credentials,
            tls,
        } => RedisTarget::Cluster {
            seeds,
            credentials: mask(credentials),
            tls,
        },
    };
    assert_eq!(
        RedisTarget::parse(&masked),
        Ok(expected),
        "{url:?} was masked as {masked:?}"
    );
});
