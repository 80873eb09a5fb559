//! Cost of the `Pinboard-Attestation` token every forward carries: `Signer::sign_into`, which
//! clones a precomputed keyed HMAC state and writes into reused buffers, against the
//! straightforward signer that keys HMAC from the secret and allocates its output per token, and
//! `Recent::sign_into`, which a forward calls: this second's token of the instance, copied.

use std::hint::black_box;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use criterion::{Criterion, criterion_group, criterion_main};
use hmac::{Hmac, KeyInit, Mac};
use pinboard::attestation::{Claims, Instance, Purpose, Recent, Signer};
use sha2::Sha256;

const SECRET: &[u8] = b"0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a6978";
const SESSION: &str = "9b2f4c1e7a3d5b8f0c6e2a4d8b1f3e5c";
const IAT: u64 = 1_764_400_000;
const INST: &str = "/threads/abc";
const EPOCH: &str = "1764400000123";

/// The same token, built the way a first version would: HMAC keyed from the secret (two
/// compression rounds for the padded key) and a fresh String per token.
fn naive_token(secret: &[u8], aud: &str, iat: u64) -> String {
    let header = URL_SAFE_NO_PAD.encode(br#"{"alg":"HS256","typ":"pinboard+jwt"}"#);
    let claims = format!(
        r#"{{"aud":"{aud}","iat":{iat},"exp":{},"purpose":"forward","inst":"{INST}","epoch":"{EPOCH}"}}"#,
        iat + 30
    );
    let signing_input = format!("{header}.{}", URL_SAFE_NO_PAD.encode(claims));
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("any key length");
    mac.update(signing_input.as_bytes());
    let signature = URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes());
    format!("{signing_input}.{signature}")
}

fn sign(c: &mut Criterion) {
    let signer = Signer::new(SECRET);
    let (mut scratch, mut out) = (Vec::new(), Vec::new());
    let claims = |aud, iat| Claims {
        aud,
        iat,
        purpose: Purpose::Forward,
        instance: Some(Instance {
            ns: "/threads",
            id: "abc",
            epoch: EPOCH,
        }),
        extra: None,
    };
    signer.sign_into(&claims(SESSION, IAT), &mut scratch, &mut out);
    assert_eq!(
        out,
        naive_token(SECRET, SESSION, IAT).as_bytes(),
        "both signers must produce the same token for the comparison to mean anything"
    );

    let mut group = c.benchmark_group("attestation");
    group.bench_function("precomputed_sign_into", |b| {
        b.iter(|| {
            out.clear();
            signer.sign_into(
                &claims(black_box(SESSION), black_box(IAT)),
                &mut scratch,
                &mut out,
            );
            out.len()
        })
    });
    let mut recent = Recent::default();
    group.bench_function("recent_same_second", |b| {
        b.iter(|| {
            out.clear();
            recent.sign_into(
                &signer,
                &claims(black_box(SESSION), black_box(IAT)),
                &mut scratch,
                &mut out,
            );
            out.len()
        })
    });
    group.bench_function("naive_per_token", |b| {
        b.iter(|| naive_token(black_box(SECRET), black_box(SESSION), black_box(IAT)))
    });
    group.finish();
}

criterion_group!(benches, sign);
criterion_main!(benches);
