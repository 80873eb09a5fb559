//! Header rewriting at both edges of a forward, into a reused `BytesMut` as the proxy does: a
//! typical client request (hop-by-hop headers to strip, forged `Pinboard-*` headers to drop)
//! towards the worker, and a typical worker response towards the client.

use std::hint::black_box;

use bytes::BytesMut;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use pinboard::correlation::Correlation;
use pinboard::http::BodyFraming;
use pinboard::http::Persistence;
use pinboard::proxy::{Forwarded, request_head};

#[path = "support/response_head.rs"]
mod response_head;

use response_head::response_head;

const REQUEST: &[(&str, &str)] = &[
    ("host", "edge.example.com"),
    (
        "user-agent",
        "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36",
    ),
    ("accept", "application/json"),
    ("accept-encoding", "gzip, deflate, br"),
    (
        "authorization",
        "Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhY2N0In0.c2lnbmF0dXJl",
    ),
    ("cookie", "session=0123456789abcdef"),
    ("content-type", "application/json"),
    ("content-length", "512"),
    ("x-forwarded-for", "198.51.100.4"),
    ("connection", "keep-alive"),
    ("keep-alive", "timeout=5"),
    ("pinboard-attestation", "forged.by.client"),
];

const RESPONSE: &[(&str, &str)] = &[
    ("content-type", "application/json; charset=utf-8"),
    ("content-length", "2048"),
    ("date", "Sat, 29 Nov 2026 12:00:00 GMT"),
    ("server", "pinned-example"),
    ("cache-control", "no-store"),
    ("etag", "\"5f3a9c\""),
    ("vary", "accept-encoding"),
    ("set-cookie", "seen=1; Path=/; HttpOnly"),
    ("x-request-id", "7c1e0a52-8d3b-4f6e-9a21-0b4c5d6e7f80"),
    ("connection", "keep-alive"),
    ("keep-alive", "timeout=75"),
    ("pinboard-session", "9b2f4c1e7a3d5b8f0c6e2a4d8b1f3e5c"),
];

fn map(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for (name, value) in pairs {
        headers.append(
            HeaderName::from_static(name),
            HeaderValue::from_static(value),
        );
    }
    headers
}

fn rewrite(c: &mut Criterion) {
    let request = map(REQUEST);
    let response = map(RESPONSE);
    let attestation = b"eyJhbGciOiJIUzI1NiIsInR5cCI6InBpbmJvYXJkK2p3dCJ9.\
eyJhdWQiOiI5YjJmNGMxZTdhM2Q1YjhmMGM2ZTJhNGQ4YjFmM2U1YyIsImlhdCI6MTc2NDQwMDAwMCwiZXhwIjoxNzY0NDAwMDMwfQ.\
c2lnbmF0dXJlc2lnbmF0dXJlc2lnbmF0dXJlc2lnbmF0dXJl";
    let correlation = Correlation::of(&request, rand::random);
    let forwarded = Forwarded {
        peer: "203.0.113.7".parse().unwrap(),
        from_trusted_proxy: false,
        scheme: "http",
        epoch: "1764400000123",
        attestation,
        upgrade: None,
        correlation: &correlation,
        drop_authorization: false,
    };
    let mut dst = BytesMut::with_capacity(2048);

    let mut group = c.benchmark_group("headers");
    request_head(
        &Method::POST,
        "/w",
        "/threads/abc123/messages?limit=20",
        &request,
        &forwarded,
        BodyFraming::Length(512),
        &mut dst,
    )
    .unwrap();
    group.throughput(Throughput::Bytes(dst.len() as u64));
    group.bench_function("request_head", |b| {
        b.iter(|| {
            dst.clear();
            request_head(
                &Method::POST,
                "/w",
                black_box("/threads/abc123/messages?limit=20"),
                black_box(&request),
                &forwarded,
                BodyFraming::Length(512),
                &mut dst,
            )
            .unwrap();
            dst.len()
        })
    });

    dst.clear();
    response_head(
        StatusCode::OK,
        &response,
        BodyFraming::Length(2048),
        Persistence::Implicit,
        correlation.request_id(),
        &mut dst,
    )
    .unwrap();
    group.throughput(Throughput::Bytes(dst.len() as u64));
    group.bench_function("response_head", |b| {
        b.iter(|| {
            dst.clear();
            response_head(
                black_box(StatusCode::OK),
                black_box(&response),
                BodyFraming::Length(2048),
                Persistence::Implicit,
                correlation.request_id(),
                &mut dst,
            )
            .unwrap();
            dst.len()
        })
    });
    // What every request pays for its ids: none sent, so both are made.
    let bare = HeaderMap::new();
    group.bench_function("correlation_new", |b| {
        b.iter(|| {
            Correlation::of(black_box(&bare), rand::random)
                .trace_id()
                .len()
        })
    });
    group.finish();
}

criterion_group!(benches, rewrite);
criterion_main!(benches);
