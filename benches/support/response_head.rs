//! The relayed answer's head as an HTTP/1.1 client gets it, the way `Request::start_answer`
//! writes it: one definition for the header bench (`benches/headers.rs`) and the allocation
//! test (`tests/alloc.rs`), which are separate crates.

use bytes::BytesMut;
use http::{HeaderMap, StatusCode};
use pinboard::http::{BodyFraming, Persistence, Unwritable, answer_head};
use pinboard::proxy::response_fields;

pub fn response_head(
    status: StatusCode,
    headers: &HeaderMap,
    framing: BodyFraming,
    persistence: Persistence,
    request_id: &str,
    dst: &mut BytesMut,
) -> Result<(), Unwritable> {
    answer_head(dst, status, framing, persistence, |fields| {
        response_fields(status, headers, request_id, fields)
    })
}
