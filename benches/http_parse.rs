//! Parsing cost of what every request pays: a typical proxied request head through
//! `HeadDecoder` (monoio-http's parser plus our framing rules), and a chunked body through
//! `ChunkedDecoder`.

use bytes::BytesMut;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use monoio_codec::{Decoded, Decoder};
use pinboard::http::{ChunkedDecoder, HeadDecoder, Piece};

const HEAD: &[u8] = b"GET /threads/abc123/messages?limit=20 HTTP/1.1\r\n\
Host: edge.example.com\r\n\
User-Agent: Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36\r\n\
Accept: application/json\r\n\
Accept-Encoding: gzip, deflate, br\r\n\
Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhY2N0In0.c2lnbmF0dXJl\r\n\
X-Forwarded-For: 203.0.113.7\r\n\
Cookie: session=0123456789abcdef\r\n\
Connection: keep-alive\r\n\r\n";

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
                Ok(Decoded::Some(head)) => head,
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
