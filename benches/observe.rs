//! What watching a request costs the node, per request: the request metrics (a status-class
//! counter and a per-core histogram), the check a pooled worker connection passes before reuse
//! (one `recv(MSG_PEEK | MSG_DONTWAIT)`), and an access-log line (formatted into the core's
//! buffer, written out in 32 KiB batches; here to /dev/null).

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use http::StatusCode;
use pinboard::access_log::{AccessLog, AccessLogSetup, Record};
use pinboard::config::AccessLogFormat;
use pinboard::correlation::Correlation;
use pinboard::http::Response;
use pinboard::metrics::histogram::Histogram;
use pinboard::metrics::{CoreCounters, RequestKind};

fn metrics(c: &mut Criterion) {
    let mut group = c.benchmark_group("observe");
    let histogram = Histogram::default();
    group.bench_function("histogram_observe", |b| {
        b.iter(|| histogram.observe(black_box(Duration::from_micros(230))))
    });
    let counters = CoreCounters::default();
    group.bench_function("request_metrics", |b| {
        b.iter(|| {
            counters.answered(
                RequestKind::Data,
                black_box(200),
                black_box(Duration::from_micros(230)),
            );
            counters.upstream_took(black_box(Duration::from_micros(150)));
        })
    });
    group.finish();
}

fn pooled_connection_check(c: &mut Criterion) {
    let mut runtime = monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
        .enable_timer()
        .build()
        .unwrap();
    runtime.block_on(async {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let stream = monoio::net::TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let _peer = listener.accept().unwrap();
        let transport = pinboard::http::Transport::Plain(stream);
        c.bench_function("observe/pooled_connection_check", |b| {
            b.iter(|| black_box(transport.is_stale()))
        });
    });
}

fn access_log(c: &mut Criterion) {
    let mut group = c.benchmark_group("observe");
    let correlation = Correlation::of(&http::HeaderMap::new(), rand::random);
    let record = Record {
        started: Some(std::time::Instant::now()),
        correlation: Some(correlation),
        ns: "/threads".into(),
        id: "abc123".into(),
        outcome: Some("forward"),
        session: "9b2f4c1e7a3d5b8f0c6e2a4d8b1f3e5c".into(),
        epoch: "1764400000123".into(),
        resolve: Duration::from_micros(80),
        upstream: Some(Duration::from_micros(150)),
        ..Record::default()
    };
    let answer = Response::relayed(StatusCode::OK, false);
    let client = "203.0.113.7".parse().unwrap();
    for format in [AccessLogFormat::Json, AccessLogFormat::Text] {
        let setup = AccessLogSetup::new(format, Some("/dev/null".as_ref())).unwrap();
        let log = AccessLog::new(Arc::new(setup), "edge-1".into());
        group.bench_function(format!("access_log_line_{format}"), |b| {
            b.iter(|| log.write(&record, client, None, &answer, black_box(312)))
        });
    }
    group.finish();
}

criterion_group!(benches, metrics, pooled_connection_check, access_log);
criterion_main!(benches);
