//! The resolve script's affinity pick, redone in Rust: the candidate with the highest
//! sha1(affinity key ‖ 0 ‖ sessionId) over 100 candidates. Lua pays this plus a string
//! concatenation and a hex digest per candidate, so this is a lower bound on the script's cost
//! per candidate, used to judge how many candidates a resolve can afford to score.

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use sha1_smol::Sha1;

const CANDIDATES: usize = 100;

fn pick<'a>(affinity: &[u8], candidates: &'a [String]) -> &'a str {
    let mut hasher = Sha1::new();
    let mut best: Option<(&str, [u8; 20])> = None;
    for sid in candidates {
        hasher.reset();
        hasher.update(affinity);
        hasher.update(&[0]);
        hasher.update(sid.as_bytes());
        // Byte order on the digest is the order the script's hex-string comparison gives.
        let score = hasher.digest().bytes();
        if best.is_none_or(|(_, top)| score > top) {
            best = Some((sid, score));
        }
    }
    best.expect("at least one candidate").0
}

fn affinity(c: &mut Criterion) {
    let candidates: Vec<String> = (0..CANDIDATES)
        .map(|i| {
            format!(
                "{:032x}",
                (i as u128 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835)
            )
        })
        .collect();
    let mut group = c.benchmark_group("rendezvous");
    group.throughput(Throughput::Elements(CANDIDATES as u64));
    group.bench_function("affinity_pick_100", |b| {
        b.iter(|| {
            pick(
                black_box(b"user-8f3a2c:conversation-1187"),
                black_box(&candidates),
            )
        })
    });
    group.finish();
}

criterion_group!(benches, affinity);
criterion_main!(benches);
