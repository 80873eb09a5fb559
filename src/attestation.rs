//! `Pinboard-Attestation`: the compact HS256 JWS every forward carries, proving to the worker
//! that the request came through Pinboard for its session.
//!
//! Signing is on the hot path, so the HMAC key schedule (the inner and outer padded-key
//! states) is computed once per worker secret and cloned per token, and a token is written
//! into a caller-owned buffer: signing allocates nothing. A forward's token is a function of
//! (session, instance, epoch, second) alone, so [`Recent`] keeps the ones signed this second
//! and hands the same bytes to the next forward of that instance instead of signing again.

use std::io::Write;

use ahash::AHashMap;

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

/// Most forward tokens one core keeps; past it, the ones of earlier seconds are dropped, and
/// while every kept one is of this second a token is signed without being kept. About 0.5 KiB
/// each (key and token), so at most a few MiB per core.
const RECENT_MAX: usize = 4096;

/// The forward tokens this core signed lately, keyed by (session, instance, epoch) and stamped
/// with their second: one HMAC per instance and second instead of one per forward, as an expert
/// nginx + Lua peer does. A token of this second is the very bytes signing again would give
/// (the claims hold nothing else), so reusing one changes nothing a worker can see. A token
/// with claims beyond the instance (`caller`, `acct`: per request) is always signed afresh.
/// A session's secret never changes (a new secret is a new session), so its key stays valid.
#[derive(Default)]
pub struct Recent {
    tokens: AHashMap<Box<str>, Stamped>,
    /// The key being looked up, written into this reused buffer: a hit allocates nothing.
    key: String,
    /// The second whose older tokens were last dropped (see [`RECENT_MAX`]).
    pruned_at: u64,
}

struct Stamped {
    iat: u64,
    token: Vec<u8>,
}

impl Recent {
    /// Appends the token for `claims` to `out`: this second's token for the same session,
    /// instance and epoch when one was signed, else a new one from `signer`, kept for the next.
    pub fn sign_into(
        &mut self,
        signer: &Signer,
        claims: &Claims<'_>,
        scratch: &mut Vec<u8>,
        out: &mut Vec<u8>,
    ) {
        let (Some(Instance { ns, id, epoch }), None) = (&claims.instance, &claims.extra) else {
            return signer.sign_into(claims, scratch, out);
        };
        self.key.clear();
        // Session ids, namespaces, ids and epochs hold no space: the key is unambiguous.
        // Pushed piece by piece: `write!`'s formatting machinery was most of a hit's cost.
        for piece in [
            claims.aud,
            " ",
            claims.purpose.as_str(),
            " ",
            ns,
            "/",
            id,
            " ",
            epoch,
        ] {
            self.key.push_str(piece);
        }
        if let Some(kept) = self.tokens.get_mut(self.key.as_str()) {
            if kept.iat != claims.iat {
                kept.token.clear();
                signer.sign_into(claims, scratch, &mut kept.token);
                kept.iat = claims.iat;
            }
            out.extend_from_slice(&kept.token);
            return;
        }
        if self.tokens.len() >= RECENT_MAX && self.pruned_at != claims.iat {
            self.pruned_at = claims.iat;
            self.tokens.retain(|_, kept| kept.iat == claims.iat);
        }
        let start = out.len();
        signer.sign_into(claims, scratch, out);
        if self.tokens.len() < RECENT_MAX {
            let kept = Stamped {
                iat: claims.iat,
                token: out[start..].to_vec(),
            };
            self.tokens.insert(self.key.as_str().into(), kept);
        }
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

    fn forward<'a>(aud: &'a str, iat: u64, id: &'a str, epoch: &'a str) -> Claims<'a> {
        Claims {
            aud,
            iat,
            purpose: Purpose::Forward,
            instance: Some(Instance {
                ns: "/threads",
                id,
                epoch,
            }),
            extra: None,
        }
    }

    fn signed(signer: &Signer, claims: &Claims<'_>) -> Vec<u8> {
        let mut out = Vec::new();
        signer.sign_into(claims, &mut Vec::new(), &mut out);
        out
    }

    #[test]
    fn a_reused_token_is_the_token_signing_would_give() {
        let (a, b) = (Signer::new(b"secret-a"), Signer::new(b"secret-b"));
        let mut recent = Recent::default();
        let mut scratch = Vec::new();
        let cases = [
            (&a, forward("s1", 100, "abc", "7")),
            (&a, forward("s1", 100, "abc", "7")),
            (&a, forward("s1", 100, "abc", "8")),
            (&a, forward("s1", 100, "abd", "7")),
            (&b, forward("s2", 100, "abc", "7")),
            (&a, forward("s1", 101, "abc", "7")),
            (&a, forward("s1", 101, "abc", "7")),
            (&a, forward("s1", 100, "abc", "7")),
        ];
        for (signer, claims) in &cases {
            let mut out = b"kept:".to_vec();
            recent.sign_into(signer, claims, &mut scratch, &mut out);
            assert_eq!(&out[..5], b"kept:");
            assert_eq!(out[5..], signed(signer, claims));
        }
        assert_eq!(recent.tokens.len(), 4, "one per (session, instance, epoch)");
    }

    #[test]
    fn tokens_with_claims_of_their_own_are_never_kept() {
        let signer = Signer::new(b"k");
        let mut recent = Recent::default();
        let mut claims = forward("s", 100, "abc", "7");
        claims.extra = Some(Extra(br#""caller":"/t/x","depth":1"#));
        let mut out = Vec::new();
        recent.sign_into(&signer, &claims, &mut Vec::new(), &mut out);
        assert_eq!(out, signed(&signer, &claims));
        let stats = Claims {
            aud: "s",
            iat: 100,
            purpose: Purpose::Stats,
            instance: None,
            extra: None,
        };
        out.clear();
        recent.sign_into(&signer, &stats, &mut Vec::new(), &mut out);
        assert_eq!(out, signed(&signer, &stats));
        assert!(recent.tokens.is_empty());
    }

    #[test]
    fn recent_tokens_stay_bounded_and_correct_past_the_bound() {
        let signer = Signer::new(b"k");
        let mut recent = Recent::default();
        let ids: Vec<String> = (0..RECENT_MAX + 10).map(|i| format!("id{i}")).collect();
        for iat in [100, 101] {
            for id in &ids {
                let claims = forward("s", iat, id, "1");
                let mut out = Vec::new();
                recent.sign_into(&signer, &claims, &mut Vec::new(), &mut out);
                assert_eq!(out, signed(&signer, &claims));
                assert!(recent.tokens.len() <= RECENT_MAX);
            }
        }
        // The second pass found the first second's tokens and re-signed them in place; the
        // ids past the bound were signed without being kept.
        assert_eq!(recent.tokens.len(), RECENT_MAX);
        assert!(recent.tokens.values().all(|kept| kept.iat == 101));
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
