//! Parsing the worker protocol's bodies into their typed shapes: simd-json (what
//! `http::read_json` uses; it parses in place, so each iteration first copies the body into a
//! reused buffer, as a request body read is consumed by the parse) against serde_json.
//! The types are the protocol's own (`pinboard_protocol::registry`), as the node parses them.

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use pinboard_protocol::registry::{HeartbeatRequest, RegisterRequest};
use serde::de::DeserializeOwned;

/// A re-registration after a restart: three namespaces, a dozen held instances to reclaim.
const REGISTER: &[u8] = br#"{
  "clientId": "worker-eu-west-1a-07",
  "secret": "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a6978",
  "namespaces": ["/threads", "/docs", "/sessions"],
  "advertiseUrl": "http://10.0.3.17:9000/w",
  "headroom": 0.82,
  "draining": false,
  "challenge": "c7a1e9b3d5f70246",
  "challengeValue": "b7e8f9a0c1d2e3f4a5b6c7d8e9f0a1b2",
  "instances": {
    "/threads": ["abc123", "def456", "ghi789", "jkl012", "mno345", "pqr678", "stu901", "vwx234"],
    "/docs": ["d-1001", "d-1002", "d-1003", "d-1004"]
  },
  "prevSessionId": "9b2f4c1e7a3d5b8f0c6e2a4d8b1f3e5c"
}"#;

const HEARTBEAT: &[u8] = br#"{"sessionId":"9b2f4c1e7a3d5b8f0c6e2a4d8b1f3e5c","headroom":0.79,"draining":false,"challenge":"2d4f6a8c0e1b3d5f","challengeValue":"f4e3d2c1b0a9f8e7d6c5b4a3f2e1d0c9","acks":[41,42,"43"]}"#;

fn pair<T: DeserializeOwned>(c: &mut Criterion, name: &str, body: &[u8]) {
    let mut group = c.benchmark_group(format!("json_parse/{name}"));
    group.throughput(Throughput::Bytes(body.len() as u64));
    let mut copy = Vec::with_capacity(body.len());
    group.bench_function("simd_json", |b| {
        b.iter(|| {
            copy.clear();
            copy.extend_from_slice(black_box(body));
            simd_json::serde::from_slice::<T>(&mut copy).expect("body parses")
        })
    });
    // What `read_json` could do with per-core `Buffers`: simd-json's own input copy and tape
    // are then reused instead of allocated per body.
    let mut buffers = simd_json::Buffers::new(body.len());
    group.bench_function("simd_json_reused_buffers", |b| {
        b.iter(|| {
            copy.clear();
            copy.extend_from_slice(black_box(body));
            simd_json::serde::from_slice_with_buffers::<T>(&mut copy, &mut buffers)
                .expect("body parses")
        })
    });
    group.bench_function("serde_json", |b| {
        b.iter(|| serde_json::from_slice::<T>(black_box(body)).expect("body parses"))
    });
    group.finish();
}

fn parse(c: &mut Criterion) {
    pair::<RegisterRequest>(c, "register", REGISTER);
    pair::<HeartbeatRequest>(c, "heartbeat", HEARTBEAT);
}

criterion_group!(benches, parse);
criterion_main!(benches);
