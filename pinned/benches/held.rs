//! The held map (the worker core's, `pinboard_protocol::worker::held`) at a million instances:
//! admitting them fresh into a map grown as it goes or sized up front
//! (`Config::expected_instances`), from one thread or split over two, and admitting again those
//! it already holds (every steady forward's lookup).

use std::hint::black_box;
use std::thread;
use std::time::Instant;

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use pinned::Epoch;

use pinboard_protocol::worker::held::{Admission, Gate, HeldMap};

const N: usize = 1_000_000;
const OPEN: Gate = Gate {
    superseded: false,
    lease: true,
    activations: true,
};

fn admit_all(map: &HeldMap, ids: &[String], epoch: &Epoch, now: Instant) {
    for id in ids {
        black_box(map.admit("/threads", id, epoch, now, || OPEN));
    }
}

fn held(c: &mut Criterion) {
    let ids: Vec<String> = (0..N).map(|i| format!("inst-{i:07}")).collect();
    let epoch = Epoch::parse(b"1700000000123").unwrap();
    let now = Instant::now();
    let mut group = c.benchmark_group("held");
    group.sample_size(10);
    group.throughput(Throughput::Elements(N as u64));
    for (name, expected) in [("fresh_1m_grown", 0), ("fresh_1m_presized", N)] {
        group.bench_function(name, |b| {
            b.iter_batched(
                || HeldMap::new(expected),
                |map| {
                    admit_all(&map, &ids, &epoch, now);
                    // Dropped outside the measurement.
                    map
                },
                BatchSize::PerIteration,
            )
        });
    }
    group.bench_function("fresh_1m_grown_two_threads", |b| {
        b.iter_batched(
            || HeldMap::new(0),
            |map| {
                let (first, second) = ids.split_at(N / 2);
                thread::scope(|s| {
                    for half in [first, second] {
                        let (map, epoch) = (&map, &epoch);
                        s.spawn(move || admit_all(map, half, epoch, now));
                    }
                });
                map
            },
            BatchSize::PerIteration,
        )
    });
    let full = HeldMap::new(0);
    admit_all(&full, &ids, &epoch, now);
    assert_eq!(
        full.admit("/threads", &ids[0], &epoch, now, || OPEN),
        Admission::Serve { activated: false }
    );
    group.bench_function("held_1m_again", |b| {
        b.iter(|| admit_all(&full, &ids, &epoch, now))
    });
    group.finish();
}

criterion_group!(benches, held);
criterion_main!(benches);
