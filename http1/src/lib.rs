//! `pinboard-http`: what the Pinboard node and its workers (`pinned`) both need to speak
//! HTTP/1.1 on monoio, and nothing of either: no configuration, credentials, Redis or
//! placement. It owns the server side (request and response heads parsed by our own parser on
//! httparse into reused storage, bodies streamed with explicit caps, answers written by hand, the per-connection loop), the
//! one-shot client to a worker ([`fetch`]), TLS on either end ([`tls`], over a [`Transport`]), the one error type both sides report failures
//! with ([`error`]), a core's [`Shutdown`] signal, a listening socket's accepts and stop ([`Listening`]), the
//! event-loop [`DriverKind`], where a tunnelled WebSocket stream's frames end
//! ([`FrameBoundaries`]), so that the node's close frame goes between two of them, and the
//! PROXY protocol header a balancer sends first ([`proxy_protocol`]); with the `h2` feature,
//! HTTP/2 to clients (by ALPN or h2c prior knowledge), each stream the same [`Request`].
//!
//! No framework: a router sees a [`Request`] and returns a [`Response`].

mod chunked;
mod client;
mod conn;
mod driver;
pub mod error;
#[cfg(feature = "h2")]
mod h2;
mod handler;
mod head;
mod head_writer;
mod header_names;
mod json;
mod listening;
pub mod proxy_protocol;
mod request;
pub mod resolve;
mod response;
mod server;
mod shutdown;
pub mod tls;
mod transport;
mod ws_frames;

pub use chunked::{ChunkedDecoder, Malformed, Piece};
pub use client::{Answer, WorkerAddr, fetch};
pub use conn::{read_into, write_all_within};
pub use driver::{DriverKind, io_uring_runtime};
#[cfg(feature = "h2")]
pub use h2::h2_builder;
pub use handler::{Handler, Http2, Limits};
#[cfg(feature = "h2")]
pub use head::h2_request_head;
pub use head::{
    Framing, HeadDecoder, HeadError, ResponseHeadDecoder, content_length, recycle_headers,
};
pub use head_writer::{
    BodyFraming, HeadWriter, Persistence, Unwritable, answer_head, encode_status_line, is_token,
};
pub use json::read_json;
pub use listening::Listening;
pub use pinboard_protocol::path::{remove_dot_segments, splits_when_decoded};
pub use request::{BodyError, Request, Upgraded};
pub use response::Response;
pub use response::date::value as current_date;
pub use server::serve_connection;
pub use shutdown::{Parting, Shutdown};
pub use transport::Transport;
pub use ws_frames::{FrameBoundaries, close_frame};
