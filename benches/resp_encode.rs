//! Encoding the command every proxied request sends: the resolve EVALSHA (its keys and arguments
//! from `support/resolve_command.rs`, as the node builds them), with the client's hand-written encoder into a reused buffer,
//! against redis-protocol's encoder fed a `BytesFrame` array built per command (what the
//! owned-frame API needs), and fed a `BorrowedFrame` array built on the stack.

use std::hint::black_box;

use bytes::{Bytes, BytesMut};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use pinboard::redis::encode_command;
use pinboard::store::scripts::RESOLVE;
use redis_protocol::resp2::encode::{extend_encode, extend_encode_borrowed};
use redis_protocol::resp2::types::{BorrowedFrame, BytesFrame};

#[path = "support/resolve_command.rs"]
mod resolve_command;

use resolve_command::ARGS;

fn owned<'a>(args: impl Iterator<Item = &'a [u8]>) -> BytesFrame {
    BytesFrame::Array(
        args.map(|arg| BytesFrame::BulkString(Bytes::copy_from_slice(arg)))
            .collect(),
    )
}

/// EVALSHA, the sha and numkeys, then the fixture's keys and arguments.
const ARGC: usize = 3 + resolve_command::KEYS + ARGS.len();

fn borrowed<'a>(mut args: impl Iterator<Item = &'a [u8]>) -> [BorrowedFrame<'a>; ARGC] {
    std::array::from_fn(|_| BorrowedFrame::BulkString(args.next().expect("ARGC arguments")))
}

fn encode(c: &mut Criterion) {
    let sha = RESOLVE.sha().as_bytes();
    let numkeys = resolve_command::KEYS.to_string();
    let head: [&[u8]; 3] = [b"EVALSHA", sha, numkeys.as_bytes()];
    let keys = resolve_command::keys();
    let keys = keys.each_ref().map(|k| k.as_bytes());
    let parts: [&[&[u8]]; 3] = [&head, &keys, &ARGS];
    let all = || head.iter().chain(keys.iter()).chain(ARGS.iter()).copied();

    let mut hand = BytesMut::new();
    encode_command(&mut hand, &parts);
    let mut dst = BytesMut::with_capacity(hand.len());

    let mut group = c.benchmark_group("resp_encode");
    group.throughput(Throughput::Bytes(hand.len() as u64));
    group.bench_function("hand_encoder", |b| {
        b.iter(|| {
            dst.clear();
            encode_command(&mut dst, black_box(&parts));
            dst.len()
        })
    });

    dst.clear();
    extend_encode(&mut dst, &owned(all()), false).unwrap();
    assert_eq!(dst, hand, "both encoders must write the same command");
    group.bench_function("redis_protocol_bytes_frame", |b| {
        b.iter(|| {
            dst.clear();
            let frame = owned(black_box(all()));
            extend_encode(&mut dst, &frame, false).unwrap()
        })
    });

    dst.clear();
    extend_encode_borrowed(&mut dst, &BorrowedFrame::Array(&borrowed(all())), false).unwrap();
    assert_eq!(dst, hand, "both encoders must write the same command");
    group.bench_function("redis_protocol_borrowed_frame", |b| {
        b.iter(|| {
            dst.clear();
            let frames = borrowed(black_box(all()));
            extend_encode_borrowed(&mut dst, &BorrowedFrame::Array(&frames), false).unwrap()
        })
    });
    group.finish();
}

criterion_group!(benches, encode);
criterion_main!(benches);
