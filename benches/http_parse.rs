//! Parsing cost of what every request pays: a typical proxied request head through
//! `HeadDecoder` (httparse plus our framing rules, into a reused header map), a worker's answer
//! head through `ResponseHeadDecoder`, and a chunked body through `ChunkedDecoder`.

use bytes::BytesMut;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use monoio_codec::{Decoded, Decoder};
use pinboard::http::{ChunkedDecoder, HeadDecoder, Piece, ResponseHeadDecoder, recycle_headers};

const HEAD: &[u8] = b"GET /threads/abc123/messages?limit=20 HTTP/1.1\r\n\
Host: edge.example.com\r\n\
User-Agent: Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36\r\n\
Accept: application/json\r\n\
Accept-Encoding: gzip, deflate, br\r\n\
Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhY2N0In0.c2lnbmF0dXJl\r\n\
X-Forwarded-For: 203.0.113.7\r\n\
Cookie: session=0123456789abcdef\r\n\
Connection: keep-alive\r\n\r\n";

const RESPONSE: &[u8] = b"HTTP/1.1 200 OK\r\n\
Content-Type: application/json; charset=utf-8\r\n\
Content-Length: 2048\r\n\
Date: Sat, 29 Nov 2026 12:00:00 GMT\r\n\
Server: pinned-example\r\n\
Cache-Control: no-store\r\n\
X-Request-Id: 7c1e0a52-8d3b-4f6e-9a21-0b4c5d6e7f80\r\n\
Pinned-Load: 3\r\n\
Keep-Alive: timeout=75\r\n\r\n";

fn head(c: &mut Criterion) {
    let mut group = c.benchmark_group("http");
    group.throughput(Throughput::Bytes(HEAD.len() as u64));
    group.bench_function("request_head", |b| {
        let mut decoder = HeadDecoder::new(16 * 1024);
        let mut buf = BytesMut::with_capacity(HEAD.len());
        b.iter(|| {
            buf.clear();
            buf.extend_from_slice(HEAD);
            match decoder.decode(&mut buf) {
                // As the server does once a request is answered.
                Ok(Decoded::Some((head, framing))) => {
                    recycle_headers(head.headers);
                    framing
                }
                _ => unreachable!("benchmark head parses"),
            }
        })
    });
    group.throughput(Throughput::Bytes(RESPONSE.len() as u64));
    group.bench_function("response_head", |b| {
        let mut decoder = ResponseHeadDecoder::new(64 * 1024);
        let mut buf = BytesMut::with_capacity(RESPONSE.len());
        b.iter(|| {
            buf.clear();
            buf.extend_from_slice(RESPONSE);
            match decoder.decode(&mut buf) {
                Ok(Decoded::Some(head)) => {
                    let status = head.status;
                    recycle_headers(head.headers);
                    status
                }
                _ => unreachable!("benchmark head parses"),
            }
        })
    });

    let mut body = Vec::new();
    for _ in 0..64 {
        body.extend_from_slice(b"400\r\n");
        body.extend_from_slice(&[b'x'; 0x400]);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(b"0\r\n\r\n");
    group.throughput(Throughput::Bytes(body.len() as u64));
    group.bench_function("chunked_body_64k", |b| {
        let mut buf = BytesMut::with_capacity(body.len());
        b.iter(|| {
            buf.clear();
            buf.extend_from_slice(&body);
            let mut decoder = ChunkedDecoder::default();
            let mut total = 0;
            while let Some(piece) = decoder.decode(&mut buf).unwrap() {
                match piece {
                    Piece::Data(d) => total += d.len(),
                    Piece::End => break,
                }
            }
            total
        })
    });
    group.finish();
}

criterion_group!(benches, head);
criterion_main!(benches);
