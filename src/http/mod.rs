//! HTTP/1.1, server side: request heads parsed by monoio-http's codec pieces, bodies streamed
//! with explicit caps, answers written by hand. No framework: the node's router sees a
//! [`Request`] and returns a [`Response`].

mod chunked;
mod client;
mod head;
mod json;
mod path;
mod request;
mod resolve;
mod response;
mod server;

pub use chunked::{ChunkedDecoder, Malformed, Piece};
pub use client::{Answer, WorkerAddr, fetch};
pub use head::{Framing, HeadDecoder, HeadError};
pub use json::read_json;
pub use path::remove_dot_segments;
pub use request::{BodyError, Request, Upgraded, read_into, write_all_within};
pub use response::{Persistence, Response, encode_status_line};
pub use server::{Handler, Limits, serve_connection};
