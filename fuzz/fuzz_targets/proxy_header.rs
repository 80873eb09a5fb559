//! `proxy_protocol::parse`: the PROXY protocol v1/v2 header a balancer sends before anything
//! else on a connection.
//!
//! Beyond "no panic", it checks what the reader relies on never to consume a byte past the
//! header:
//! - a complete header's length is within the input, and parsing exactly that prefix gives the
//!   same header (nothing after it was looked at);
//! - `Incomplete(n)` asks for more than it has, and for no more than the whole header when one
//!   is complete further on: every shorter prefix of a complete header is `Incomplete` with
//!   `n` at most the header's length;
//! - a decision on a prefix (malformed, or not a header) stays the same with more bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pinboard::http::proxy_protocol::{Parsed, parse};

fuzz_target!(|data: &[u8]| {
    let whole = parse(data);
    if let Ok(Parsed::Complete(header)) = whole {
        assert!(header.len <= data.len());
        assert_eq!(parse(&data[..header.len]), whole);
        for cut in 0..header.len {
            match parse(&data[..cut]) {
                Ok(Parsed::Incomplete(n)) => assert!(n > cut && n <= header.len, "{cut}: {n}"),
                other => panic!("prefix {cut} of a complete header: {other:?}"),
            }
        }
    }
    if let Ok(Parsed::Incomplete(n)) = whole {
        assert!(n > data.len());
    }
    if let Err(error) = whole {
        // More bytes never rescue a refused prefix.
        let mut longer = data.to_vec();
        longer.extend_from_slice(b"\r\n\r\n");
        match parse(&longer) {
            Err(_) => {}
            Ok(other) => panic!("{error:?} then {other:?}"),
        }
    }
});
