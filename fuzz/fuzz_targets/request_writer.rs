//! `HeadWriter`: the one writer of every request head the node sends a worker (forwards,
//! registration and heartbeat probes, `_wake`, `_pinned/stats`), fed any method, target and
//! header fields (issue 23, M1: a registration secret with CRLF in it became a second request).
//!
//! Input: parts separated by 0xFF: the method, the base, the target, then name and value
//! pairs. Checks, by an independent parse (httparse) of what was written:
//! - the writer accepts exactly the inputs the HTTP/1.1 grammar allows (a token method and
//!   names, a target starting with `/` without spaces or control bytes, values without
//!   control bytes but HTAB), decided here on its own;
//! - what it accepts is one complete request head that ends where the written bytes end, with
//!   the method, the target and every field as given, in order (values up to their optional
//!   whitespace);
//! - what it refuses leaves nothing behind: the buffer holds what it held before.
#![no_main]

use bytes::BytesMut;
use http::Method;
use libfuzzer_sys::fuzz_target;
use pinboard::http::HeadWriter;

const BEFORE: &[u8] = b"earlier bytes";

fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

fuzz_target!(|data: &[u8]| {
    let mut parts = data.split(|b| *b == 0xff);
    let (Some(method), Some(base), Some(target)) = (parts.next(), parts.next(), parts.next())
    else {
        return;
    };
    let Ok(method) = Method::from_bytes(method) else {
        return;
    };
    let base = String::from_utf8_lossy(base);
    let target = String::from_utf8_lossy(target);
    let rest: Vec<&[u8]> = parts.collect();
    let fields: Vec<(String, &[u8])> = rest
        .chunks_exact(2)
        .map(|pair| (String::from_utf8_lossy(pair[0]).into_owned(), pair[1]))
        .collect();

    let target_ok = format!("{base}{target}").starts_with('/')
        && base
            .bytes()
            .chain(target.bytes())
            .all(|b| b > b' ' && b != 0x7f);
    let field_ok = |(name, value): &(String, &[u8])| {
        !name.is_empty()
            && name.bytes().all(is_tchar)
            && value
                .iter()
                .all(|&b| b == b'\t' || (b >= 0x20 && b != 0x7f))
    };
    let expected = target_ok && fields.iter().all(field_ok);

    let mut out = BytesMut::from(BEFORE);
    let written = HeadWriter::request(&mut out, &method, &base, &target).and_then(|mut head| {
        for (name, value) in &fields {
            // Every call after a refusal is refused too; the head's outcome says it.
            let _ = head.header(name, value);
        }
        head.finish()
    });
    assert_eq!(written.is_ok(), expected, "{written:?} for {data:?}");
    if written.is_err() {
        assert_eq!(&out[..], BEFORE, "a refused head left bytes behind");
        return;
    }

    let head = &out[BEFORE.len()..];
    let mut parsed = vec![httparse::EMPTY_HEADER; fields.len()];
    let mut request = httparse::Request::new(&mut parsed);
    assert_eq!(
        request.parse(head).ok(),
        Some(httparse::Status::Complete(head.len())),
        "not one complete head: {:?}",
        String::from_utf8_lossy(head)
    );
    assert_eq!(request.method, Some(method.as_str()));
    assert_eq!(request.path, Some(format!("{base}{target}").as_str()));
    assert_eq!(request.headers.len(), fields.len());
    for (h, (name, value)) in request.headers.iter().zip(&fields) {
        assert_eq!(h.name, name);
        let ows = |b: &u8| *b == b' ' || *b == b'\t';
        let start = value.iter().position(|b| !ows(b)).unwrap_or(value.len());
        let end = value.iter().rposition(|b| !ows(b)).map_or(start, |i| i + 1);
        assert_eq!(h.value, &value[start..end.max(start)]);
    }
});
