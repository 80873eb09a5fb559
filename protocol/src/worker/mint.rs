//! Attestations as Pinboard mints them, through an independent JWT implementation
//! (`jsonwebtoken`), for the worker libraries' tests: the `mint` feature (and this crate's own
//! tests). A worker never mints.

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{Value, json};

/// A worker secret for tests that do not run a worker.
pub const SECRET: &str = "0123456789abcdef0123456789abcdef";

/// A token of header `alg` and `typ`, signed with `secret`, carrying `claims`.
pub fn mint_with(alg: Algorithm, typ: &str, secret: &str, claims: &Value) -> String {
    let mut header = Header::new(alg);
    header.typ = Some(typ.to_owned());
    let key = EncodingKey::from_secret(secret.as_bytes()).expect("an HMAC key");
    jsonwebtoken::encode(&header, claims, &key).expect("a token")
}

/// A token for a `/_pinned/*` route, issued at `iat`, valid for 30 s.
pub fn mint(secret: &str, aud: &str, iat: u64, purpose: &str) -> String {
    let claims = json!({ "aud": aud, "iat": iat, "exp": iat + 30, "purpose": purpose });
    mint_with(Algorithm::HS256, "pinboard+jwt", secret, &claims)
}

/// A token of `purpose` (`forward`, `wake`) bound to `inst` (`{ns}/{id}`) at `epoch`, issued
/// now.
pub fn mint_bound(secret: &str, aud: &str, purpose: &str, inst: &str, epoch: &str) -> String {
    let iat = now();
    let claims = json!({
        "aud": aud, "iat": iat, "exp": iat + 30,
        "purpose": purpose, "inst": inst, "epoch": epoch,
    });
    mint_with(Algorithm::HS256, "pinboard+jwt", secret, &claims)
}

/// A forward's token, bound to `inst` at `epoch`.
pub fn mint_forward(secret: &str, aud: &str, inst: &str, epoch: &str) -> String {
    mint_bound(secret, aud, "forward", inst, epoch)
}

/// Seconds since the Unix epoch.
pub fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs()
}

/// Re-exported so that a test can name an algorithm without depending on `jsonwebtoken`.
pub use jsonwebtoken::Algorithm as Alg;
