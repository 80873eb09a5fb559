//! `Pinboard-Attestation`: the compact HS256 JWS every forward carries, proving to the worker
//! that the request came through Pinboard for its session.
//!
//! Signing is on the hot path, so the HMAC key schedule (the inner and outer padded-key
//! states) is computed once per worker secret and cloned per token, and a token is written
//! into a caller-owned buffer: signing allocates nothing.

use std::io::Write;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

/// What a token is for: the worker protocol's, shared with `pinned`.
pub use pinboard_protocol::Purpose;

/// base64url(`{"alg":"HS256","typ":"pinboard+jwt"}`) and the dot after it.
const HEADER: &[u8] = b"eyJhbGciOiJIUzI1NiIsInR5cCI6InBpbmJvYXJkK2p3dCJ9.";

/// Lifetime of a token: the worker accepts it for this long (plus its clock skew).
pub const TOKEN_TTL_SECS: u64 = 30;

/// Claims beyond aud/iat/exp, already serialized as JSON members (`"caller":"/ns/id","depth":2`),
/// for the forwards that carry them.
pub struct Extra<'a>(pub &'a [u8]);

/// The placement a forward or wake token is bound to: `inst` = `{ns}/{id}`, `epoch` = the
/// `Pinboard-Epoch` it rides with.
pub struct Instance<'a> {
    pub ns: &'a str,
    pub id: &'a str,
    pub epoch: &'a str,
}

/// Everything one token says.
pub struct Claims<'a> {
    /// The worker's session.
    pub aud: &'a str,
    /// Unix seconds.
    pub iat: u64,
    pub purpose: Purpose,
    pub instance: Option<Instance<'a>>,
    pub extra: Option<Extra<'a>>,
}

#[derive(Clone)]
pub struct Signer {
    keyed: Hmac<Sha256>,
}

impl Signer {
    pub fn new(secret: &[u8]) -> Signer {
        Signer {
            keyed: Hmac::<Sha256>::new_from_slice(secret).expect("HMAC accepts any key length"),
        }
    }

    /// Appends a token carrying `claims` to `out`. `scratch` holds the claims while they are
    /// encoded; both buffers are the caller's, reused across requests.
    pub fn sign_into(&self, claims: &Claims<'_>, scratch: &mut Vec<u8>, out: &mut Vec<u8>) {
        scratch.clear();
        // `aud` is a session id (hex), namespaces and ids are of the id alphabet, epochs are
        // digits and numbers need no escaping. Writing to a Vec cannot fail.
        let _ = write!(
            scratch,
            "{{\"aud\":\"{}\",\"iat\":{},\"exp\":{},\"purpose\":\"{}\"",
            claims.aud,
            claims.iat,
            claims.iat + TOKEN_TTL_SECS,
            claims.purpose.as_str(),
        );
        if let Some(Instance { ns, id, epoch }) = claims.instance {
            let _ = write!(scratch, ",\"inst\":\"{ns}/{id}\",\"epoch\":\"{epoch}\"");
        }
        if let Some(Extra(members)) = claims.extra {
            scratch.push(b',');
            scratch.extend_from_slice(members);
        }
        scratch.push(b'}');

        let start = out.len();
        out.extend_from_slice(HEADER);
        append_base64(scratch, out);
        let mut mac = self.keyed.clone();
        mac.update(&out[start..]);
        let signature = mac.finalize().into_bytes();
        out.push(b'.');
        append_base64(&signature, out);
    }
}

fn append_base64(input: &[u8], out: &mut Vec<u8>) {
    let at = out.len();
    out.resize(
        at + base64::encoded_len(input.len(), false).expect("small input"),
        0,
    );
    let written = URL_SAFE_NO_PAD
        .encode_slice(input, &mut out[at..])
        .expect("sized above");
    out.truncate(at + written);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_constant_is_the_spec_header() {
        let header = URL_SAFE_NO_PAD.encode(br#"{"alg":"HS256","typ":"pinboard+jwt"}"#);
        assert_eq!(format!("{header}."), std::str::from_utf8(HEADER).unwrap());
    }

    #[test]
    fn token_verifies_with_the_secret_and_carries_the_claims() {
        let signer = Signer::new(b"worker-secret");
        let mut out = b"prefix:".to_vec();
        let claims = Claims {
            aud: "abc123",
            iat: 1_700_000_000,
            purpose: Purpose::Forward,
            instance: Some(Instance {
                ns: "/threads",
                id: "abc",
                epoch: "1700000000001",
            }),
            extra: Some(Extra(br#""caller":"/t/x","depth":2"#)),
        };
        signer.sign_into(&claims, &mut Vec::new(), &mut out);
        let token = std::str::from_utf8(&out[7..]).unwrap();
        let mut parts = token.split('.');
        let (h, c, s) = (
            parts.next().unwrap(),
            parts.next().unwrap(),
            parts.next().unwrap(),
        );
        let claims: serde_json::Value =
            serde_json::from_slice(&URL_SAFE_NO_PAD.decode(c).unwrap()).unwrap();
        assert_eq!(
            claims,
            serde_json::json!({
                "aud": "abc123", "iat": 1_700_000_000u64, "exp": 1_700_000_030u64,
                "purpose": "forward", "inst": "/threads/abc", "epoch": "1700000000001",
                "caller": "/t/x", "depth": 2,
            })
        );
        let mut mac = Hmac::<Sha256>::new_from_slice(b"worker-secret").unwrap();
        mac.update(format!("{h}.{c}").as_bytes());
        mac.verify_slice(&URL_SAFE_NO_PAD.decode(s).unwrap())
            .unwrap();
    }

    #[test]
    fn long_extra_claims_still_sign() {
        let extra = format!(r#""acct":{{"sub":"{}"}}"#, "a".repeat(2000));
        let mut out = Vec::new();
        let claims = Claims {
            aud: "s",
            iat: 1,
            purpose: Purpose::Stats,
            instance: None,
            extra: Some(Extra(extra.as_bytes())),
        };
        Signer::new(b"k").sign_into(&claims, &mut Vec::new(), &mut out);
        let claims = out.split(|b| *b == b'.').nth(1).unwrap();
        let claims: serde_json::Value =
            serde_json::from_slice(&URL_SAFE_NO_PAD.decode(claims).unwrap()).unwrap();
        assert_eq!(claims["acct"]["sub"].as_str().unwrap().len(), 2000);
    }
}
