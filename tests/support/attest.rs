//! Reading a `Pinboard-Attestation` the way a worker would: checking its header and its
//! signature with the worker's secret, then returning its claims.

use base64::Engine;
use serde_json::{Value, json};

/// The claims of an attestation signed with `secret` (panics on anything else).
pub fn claims_of(token: &str, secret: &str) -> Value {
    use hmac::{Hmac, KeyInit, Mac};
    let mut parts = token.split('.');
    let (h, c, s) = (
        parts.next().unwrap(),
        parts.next().unwrap(),
        parts.next().unwrap(),
    );
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let header: Value = serde_json::from_slice(&b64.decode(h).unwrap()).unwrap();
    assert_eq!(header, json!({"alg": "HS256", "typ": "pinboard+jwt"}));
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(format!("{h}.{c}").as_bytes());
    mac.verify_slice(&b64.decode(s).unwrap())
        .expect("signed with the worker's secret");
    serde_json::from_slice(&b64.decode(c).unwrap()).unwrap()
}
