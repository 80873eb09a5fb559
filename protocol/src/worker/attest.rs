//! `Pinboard-Attestation` verification: the compact JWS Pinboard signs onto every forwarded
//! request, `_wake` and `_pinned/stats` call (spec "Attestation and headers").
//!
//! Written out by hand rather than through a JWT library because the rules are narrow and
//! exact: header `{"alg":"HS256","typ":"pinboard+jwt"}`, HMAC-SHA256 under the worker's own
//! secret, `aud` equal to its current session, and `iat`/`exp` both required, integers from 0
//! to 2^63 - 1, and judged with 30 s of clock skew. A general-purpose validator would need each of these switched on and
//! would still not check `typ` or a future `iat`.
//!
//! A token is also bound to what it is for (contract §11): its `purpose` (`forward`, `wake`,
//! `stats`, `challenge`) and, for forwards and wakes, the instance (`inst` = `{ns}/{id}`) and
//! placement `epoch`. [`verify`] returns that [`Binding`]; the routes hold it against the request
//! (see `surface.rs`), so a token seen once cannot be replayed on another route, instance or
//! epoch.

use crate::Purpose;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, KeyInit, Mac};
use serde_json::{Map, Value};
use sha2::Sha256;

/// Clock skew tolerated on `iat`, `exp` and `nbf`.
pub const SKEW_SECS: f64 = 30.0;

/// What a valid attestation tells the worker beyond "Pinboard sent this".
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Attestation {
    /// `{ns}/{id}` of the attested instance that made this call, when one did.
    pub caller: Option<String>,
    /// The subrequest depth Pinboard counted for this call.
    pub depth: Option<u64>,
    /// `{ sub, scopes?, claims }` of the client's data-plane credential, when it had one.
    pub acct: Option<Value>,
}

/// What a valid token is for: checked against the route it arrived on.
#[derive(Clone, Debug, PartialEq)]
pub struct Binding {
    pub purpose: Purpose,
    /// `{ns}/{id}`, on forward and wake tokens.
    pub inst: Option<String>,
    /// The placement epoch's digits, on forward and wake tokens.
    pub epoch: Option<String>,
}

/// Why a token was refused. Every reason answers the same 403; the reason is for logs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Invalid {
    #[error("not a compact JWS")]
    Malformed,
    #[error("header is not {{\"alg\":\"HS256\",\"typ\":\"pinboard+jwt\"}}")]
    Header,
    #[error("bad signature")]
    Signature,
    #[error("claims are not of the expected shape")]
    Claims,
    #[error("audience is not this worker's session")]
    Audience,
    #[error("expired")]
    Expired,
    #[error("issued in the future")]
    NotYetValid,
    #[error("issued for another purpose than this route's")]
    Purpose,
    #[error("bound to another instance")]
    Instance,
    #[error("bound to another placement epoch, or Pinboard-Epoch repeated")]
    Epoch,
}

/// Verifies `token` as signed with `secret` for session `audience`, at `now` (seconds since
/// the Unix epoch). What it is bound to is the caller's to check.
pub fn verify(
    token: &str,
    secret: &[u8],
    audience: &str,
    now: f64,
) -> Result<(Binding, Attestation), Invalid> {
    let mut parts = token.split('.');
    let (Some(header_part), Some(payload), Some(signature), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(Invalid::Malformed);
    };
    let header = decode_object(header_part).ok_or(Invalid::Malformed)?;
    let is = |key: &str, want: &str| header.get(key).and_then(Value::as_str) == Some(want);
    // A `crit` header names extensions the signer requires us to understand (RFC 7515
    // §4.1.11); we understand none.
    if !is("alg", "HS256") || !is("typ", "pinboard+jwt") || header.contains_key("crit") {
        return Err(Invalid::Header);
    }
    let signature = URL_SAFE_NO_PAD
        .decode(signature)
        .map_err(|_| Invalid::Malformed)?;
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).map_err(|_| Invalid::Signature)?;
    mac.update(&token.as_bytes()[..header_part.len() + 1 + payload.len()]);
    // Constant-time comparison; the claims are only read once the signature holds.
    mac.verify_slice(&signature)
        .map_err(|_| Invalid::Signature)?;

    let claims = decode_object(payload).ok_or(Invalid::Claims)?;
    let audience_ok = match claims.get("aud") {
        Some(Value::String(aud)) => aud == audience,
        Some(Value::Array(auds)) => auds.iter().any(|a| a.as_str() == Some(audience)),
        _ => false,
    };
    if !audience_ok {
        return Err(Invalid::Audience);
    }
    // A NumericDate is an integer from 0 to 2^63 - 1, as Pinboard mints them (the Python
    // library takes the same): `1.5`, `1e400`, `true`, a string or a negative is malformed.
    let time = |key: &str| {
        claims.get(key).map(|v| {
            v.as_i64()
                .filter(|t| *t >= 0)
                .map(|t| t as f64)
                .ok_or(Invalid::Claims)
        })
    };
    let iat = time("iat").ok_or(Invalid::Claims)??;
    let exp = time("exp").ok_or(Invalid::Claims)??;
    if exp + SKEW_SECS < now {
        return Err(Invalid::Expired);
    }
    if iat > now + SKEW_SECS
        || time("nbf")
            .transpose()?
            .is_some_and(|nbf| nbf > now + SKEW_SECS)
    {
        return Err(Invalid::NotYetValid);
    }
    let text = |key: &str| match claims.get(key) {
        None => Ok(None),
        Some(Value::String(v)) => Ok(Some(v.clone())),
        Some(_) => Err(Invalid::Claims),
    };
    let purpose = text("purpose")?
        .as_deref()
        .and_then(Purpose::from_claim)
        .ok_or(Invalid::Claims)?;
    let binding = Binding {
        purpose,
        inst: text("inst")?,
        epoch: text("epoch")?,
    };
    let caller = match claims.get("caller") {
        None => None,
        Some(Value::String(caller)) => Some(caller.clone()),
        Some(_) => return Err(Invalid::Claims),
    };
    let depth = match claims.get("depth") {
        None => None,
        Some(depth) => Some(depth.as_u64().ok_or(Invalid::Claims)?),
    };
    let acct = match claims.get("acct") {
        None => None,
        Some(acct @ Value::Object(_)) => Some(acct.clone()),
        Some(_) => return Err(Invalid::Claims),
    };
    Ok((
        binding,
        Attestation {
            caller,
            depth,
            acct,
        },
    ))
}

fn decode_object(part: &str) -> Option<Map<String, Value>> {
    let bytes = URL_SAFE_NO_PAD.decode(part).ok()?;
    match serde_json::from_slice(&bytes).ok()? {
        Value::Object(map) => Some(map),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use jsonwebtoken::Algorithm;
    use serde_json::json;

    use super::*;
    use crate::worker::mint::{SECRET, mint, mint_with};

    const NOW: u64 = 1_700_000_000;

    fn check(token: &str) -> Result<Attestation, Invalid> {
        verify(token, SECRET.as_bytes(), "sess-1", NOW as f64).map(|(_, attestation)| attestation)
    }

    #[test]
    fn a_good_token_yields_its_claims() {
        assert_eq!(
            check(&mint(SECRET, "sess-1", NOW, "stats")),
            Ok(Attestation::default())
        );
        let claims = json!({
            "aud": "sess-1", "iat": NOW, "exp": NOW + 30, "purpose": "forward",
            "inst": "/threads/b", "epoch": "17",
            "caller": "/threads/a", "depth": 2,
            "acct": { "sub": "alice", "claims": { "plan": "pro" } },
        });
        let token = mint_with(Algorithm::HS256, "pinboard+jwt", SECRET, &claims);
        assert_eq!(
            verify(&token, SECRET.as_bytes(), "sess-1", NOW as f64),
            Ok((
                Binding {
                    purpose: Purpose::Forward,
                    inst: Some("/threads/b".into()),
                    epoch: Some("17".into()),
                },
                Attestation {
                    caller: Some("/threads/a".into()),
                    depth: Some(2),
                    acct: Some(json!({ "sub": "alice", "claims": { "plan": "pro" } })),
                }
            ))
        );
    }

    #[test]
    fn purpose_is_required_and_known() {
        for claims in [
            json!({ "aud": "sess-1", "iat": NOW, "exp": NOW + 30 }),
            json!({ "aud": "sess-1", "iat": NOW, "exp": NOW + 30, "purpose": "admin" }),
            json!({ "aud": "sess-1", "iat": NOW, "exp": NOW + 30, "purpose": 1 }),
            json!({ "aud": "sess-1", "iat": NOW, "exp": NOW + 30, "purpose": "forward", "inst": 5 }),
        ] {
            let token = mint_with(Algorithm::HS256, "pinboard+jwt", SECRET, &claims);
            assert_eq!(check(&token), Err(Invalid::Claims), "{claims}");
        }
    }

    #[test]
    fn wrong_secret_or_audience_is_refused() {
        let other = "another-secret-another-secret-00";
        assert_eq!(
            check(&mint(other, "sess-1", NOW, "stats")),
            Err(Invalid::Signature)
        );
        assert_eq!(
            check(&mint(SECRET, "sess-0", NOW, "stats")),
            Err(Invalid::Audience)
        );
        let no_aud = json!({ "iat": NOW, "exp": NOW + 30, "purpose": "stats" });
        let token = mint_with(Algorithm::HS256, "pinboard+jwt", SECRET, &no_aud);
        assert_eq!(check(&token), Err(Invalid::Audience));
    }

    #[test]
    fn thirty_seconds_of_skew_on_both_ends() {
        // exp = iat + 30: issued 59 s ago expired 29 s ago, within the skew.
        assert!(check(&mint(SECRET, "sess-1", NOW - 59, "stats")).is_ok());
        assert_eq!(
            check(&mint(SECRET, "sess-1", NOW - 61, "stats")),
            Err(Invalid::Expired)
        );
        assert!(check(&mint(SECRET, "sess-1", NOW + 29, "stats")).is_ok());
        assert_eq!(
            check(&mint(SECRET, "sess-1", NOW + 31, "stats")),
            Err(Invalid::NotYetValid)
        );
        let not_before = json!({ "aud": "sess-1", "iat": NOW, "exp": NOW + 90, "nbf": NOW + 60, "purpose": "stats" });
        let token = mint_with(Algorithm::HS256, "pinboard+jwt", SECRET, &not_before);
        assert_eq!(check(&token), Err(Invalid::NotYetValid));
    }

    #[test]
    fn iat_and_exp_are_required() {
        for claims in [
            json!({ "aud": "sess-1", "exp": NOW + 30 }),
            json!({ "aud": "sess-1", "iat": NOW }),
            json!({ "aud": "sess-1", "iat": "now", "exp": NOW + 30 }),
        ] {
            let token = mint_with(Algorithm::HS256, "pinboard+jwt", SECRET, &claims);
            assert_eq!(check(&token), Err(Invalid::Claims), "{claims}");
        }
    }

    #[test]
    fn a_time_is_an_integer_from_zero_to_i64_max() {
        let signed = |payload: String| {
            let encode = |text: &str| URL_SAFE_NO_PAD.encode(text);
            let signing = format!(
                "{}.{}",
                encode(r#"{"alg":"HS256","typ":"pinboard+jwt"}"#),
                encode(&payload)
            );
            let mut mac = Hmac::<Sha256>::new_from_slice(SECRET.as_bytes()).unwrap();
            mac.update(signing.as_bytes());
            format!(
                "{signing}.{}",
                URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes())
            )
        };
        let with = |iat: &str, exp: &str, nbf: &str| {
            signed(format!(
                r#"{{"aud":"sess-1","iat":{iat},"exp":{exp},"nbf":{nbf},"purpose":"stats"}}"#
            ))
        };
        let (iat, exp) = (NOW.to_string(), (NOW + 30).to_string());
        assert!(check(&with(&iat, &exp, "0")).is_ok(), "the control case");
        let largest = i64::MAX.to_string();
        assert!(check(&with(&iat, &largest, &iat)).is_ok());
        let shared: Vec<String> = serde_json::from_str(include_str!(
            "../../../pinned/tests/data/not-a-numeric-date.json"
        ))
        .unwrap();
        for bad in &shared {
            for token in [
                with(bad, &exp, &iat),
                with(&iat, bad, &iat),
                with(&iat, &exp, bad),
            ] {
                assert_eq!(check(&token), Err(Invalid::Claims), "{bad}");
            }
        }
    }

    #[test]
    fn header_must_be_hs256_pinboard_jwt() {
        let claims = json!({ "aud": "sess-1", "iat": NOW, "exp": NOW + 30 });
        let hs512 = mint_with(Algorithm::HS512, "pinboard+jwt", SECRET, &claims);
        let jwt = mint_with(Algorithm::HS256, "JWT", SECRET, &claims);
        assert_eq!(check(&hs512), Err(Invalid::Header));
        assert_eq!(check(&jwt), Err(Invalid::Header));
        // alg "none" with the signature stripped, and a `crit` extension we cannot honour.
        let encode = |v: &Value| URL_SAFE_NO_PAD.encode(v.to_string());
        let payload = encode(&claims);
        let none = format!(
            "{}.{payload}.",
            encode(&json!({ "alg": "none", "typ": "pinboard+jwt" }))
        );
        assert_eq!(check(&none), Err(Invalid::Header));
        let crit_header =
            encode(&json!({ "alg": "HS256", "typ": "pinboard+jwt", "crit": ["x"], "x": 1 }));
        let mut mac = Hmac::<Sha256>::new_from_slice(SECRET.as_bytes()).unwrap();
        mac.update(format!("{crit_header}.{payload}").as_bytes());
        let sig = URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes());
        assert_eq!(
            check(&format!("{crit_header}.{payload}.{sig}")),
            Err(Invalid::Header)
        );
    }

    #[test]
    fn garbage_is_malformed() {
        let good = mint(SECRET, "sess-1", NOW, "stats");
        let shared: Vec<String> =
            serde_json::from_str(include_str!("../../../pinned/tests/data/not-a-token.json"))
                .unwrap();
        let derived = [format!("{good}.extra"), format!("{good}==")];
        for bad in shared.iter().chain(&derived) {
            assert_eq!(check(bad), Err(Invalid::Malformed), "{bad:?}");
        }
        // A flipped signature byte is a bad signature, not a parse error.
        let mut tampered = good.into_bytes();
        let last = tampered.len() - 2;
        tampered[last] = if tampered[last] == b'A' { b'B' } else { b'A' };
        assert_eq!(
            check(std::str::from_utf8(&tampered).unwrap()),
            Err(Invalid::Signature)
        );
    }
}
