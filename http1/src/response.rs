//! Responses the node answers itself (as opposed to relayed worker responses), and their
//! encoding.
//!
//! Heads are written by hand rather than through monoio-http's encoders, which force a
//! `content-length: 0` onto 1xx/204/304 answers and HEAD replies, where RFC 9110 forbids or
//! restricts it.

use std::io::Write;

use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderName, HeaderValue, StatusCode};

use crate::head_writer::{BodyFraming, Persistence, encode_status_line};

pub struct Response {
    pub status: StatusCode,
    pub headers: Vec<(HeaderName, HeaderValue)>,
    pub body: Bytes,
    /// Close the connection after this response (for example when the request body was left
    /// unread on the wire).
    pub close: bool,
    /// The handler already wrote the whole answer to the client (a relayed worker response).
    relayed: bool,
}

impl Response {
    pub fn new(status: StatusCode, content_type: Option<&'static str>, body: Bytes) -> Response {
        let mut headers = Vec::new();
        if let Some(ct) = content_type {
            headers.push((http::header::CONTENT_TYPE, HeaderValue::from_static(ct)));
        }
        Response {
            status,
            headers,
            body,
            close: false,
            relayed: false,
        }
    }

    /// Stands for an answer the handler wrote itself; `status` is what was relayed (for logs).
    pub fn relayed(status: StatusCode, close: bool) -> Response {
        Response {
            close,
            relayed: true,
            ..Response::empty(status)
        }
    }

    pub fn is_relayed(&self) -> bool {
        self.relayed
    }

    pub fn empty(status: StatusCode) -> Response {
        Response::new(status, None, Bytes::new())
    }

    pub fn json(status: StatusCode, body: impl Into<Bytes>) -> Response {
        Response::new(status, Some("application/json"), body.into())
    }

    /// Serializes `value` as the JSON body.
    pub fn json_value<T: serde::Serialize>(status: StatusCode, value: &T) -> Response {
        // Serializing our own plain response types cannot fail.
        let body = serde_json::to_vec(value).expect("response serializes");
        Response::json(status, body)
    }

    /// `{"error": message}` — the shape of every error the spec defines.
    pub fn error(status: StatusCode, message: &str) -> Response {
        Response::json_value(status, &serde_json::json!({ "error": message }))
    }

    pub fn text(status: StatusCode, body: &'static str) -> Response {
        Response::new(
            status,
            Some("text/plain; charset=utf-8"),
            Bytes::from_static(body.as_bytes()),
        )
    }

    pub fn header(mut self, name: HeaderName, value: HeaderValue) -> Response {
        self.headers.push((name, value));
        self
    }

    pub fn closing(mut self) -> Response {
        self.close = true;
        self
    }

    /// Appends the response to `dst`. `head_request`: answering HEAD, so the length is
    /// announced but no body follows. `connection`: the `Connection` header to send, if any.
    pub fn encode(&self, head_request: bool, connection: Persistence, dst: &mut BytesMut) {
        encode_status_line(self.status, dst);
        date::encode(dst);
        for (name, value) in &self.headers {
            dst.put_slice(name.as_str().as_bytes());
            dst.put_slice(b": ");
            dst.put_slice(value.as_bytes());
            dst.put_slice(b"\r\n");
        }
        if let BodyFraming::Length(n) = self.framing() {
            // Formatting into BytesMut cannot fail.
            let _ = write!(dst.writer(), "content-length: {n}\r\n");
        }
        connection.encode(dst);
        dst.put_slice(b"\r\n");
        if let Some(body) = self.body_sent(head_request) {
            dst.put_slice(body);
        }
    }

    /// How the answer delimits its body: its length, unless its status allows none.
    pub(crate) fn framing(&self) -> BodyFraming {
        if allows_length(self.status) {
            BodyFraming::Length(self.body.len() as u64)
        } else {
            BodyFraming::None
        }
    }

    /// The body that follows the head: none for a status without one, nor to `HEAD` (whose
    /// answer announces the length only).
    pub(crate) fn body_sent(&self, head_request: bool) -> Option<&Bytes> {
        (!head_request && allows_length(self.status)).then_some(&self.body)
    }
}

/// The `Date` header of the node's own answers (RFC 9110 §6.6.1), formatted once a second per
/// thread rather than per answer.
pub mod date {
    use std::cell::RefCell;
    use std::time::{SystemTime, UNIX_EPOCH};

    use bytes::{BufMut, BytesMut};
    use http::HeaderValue;

    thread_local! {
        static LAST: RefCell<(u64, HeaderValue)> =
            const { RefCell::new((u64::MAX, HeaderValue::from_static(""))) };
    }

    /// The current second's `Date` value.
    pub fn value() -> HeaderValue {
        let now = SystemTime::now();
        let second = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        LAST.with_borrow_mut(|(at, value)| {
            if *at != second {
                *at = second;
                *value = HeaderValue::from_str(&httpdate::fmt_http_date(now))
                    .expect("an HTTP date is a header value");
            }
            value.clone()
        })
    }

    pub fn encode(dst: &mut BytesMut) {
        dst.put_slice(b"date: ");
        dst.put_slice(value().as_bytes());
        dst.put_slice(b"\r\n");
    }
}

/// Whether a response with this status may carry a body and a `content-length`.
pub fn allows_length(status: StatusCode) -> bool {
    !(status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The encoded answer with its `Date` line taken out (after checking it is one).
    fn encoded(r: &Response, head: bool, connection: Persistence) -> String {
        let mut b = BytesMut::new();
        r.encode(head, connection, &mut b);
        let text = String::from_utf8(b.to_vec()).unwrap();
        let line = text.lines().nth(1).unwrap();
        let date = line
            .strip_prefix("date: ")
            .expect("Date follows the status line");
        assert!(httpdate::parse_http_date(date).is_ok(), "{date}");
        text.replacen(&format!("{line}\r\n"), "", 1)
    }

    #[test]
    fn error_bodies_are_spec_json() {
        let r = Response::error(StatusCode::PAYLOAD_TOO_LARGE, "body too large");
        assert_eq!(
            encoded(&r, false, Persistence::Close),
            "HTTP/1.1 413 Payload Too Large\r\ncontent-type: application/json\r\n\
             content-length: 26\r\nconnection: close\r\n\r\n{\"error\":\"body too large\"}"
        );
    }

    #[test]
    fn no_length_on_204_and_no_body_on_head() {
        assert_eq!(
            encoded(
                &Response::empty(StatusCode::NO_CONTENT),
                false,
                Persistence::Implicit
            ),
            "HTTP/1.1 204 No Content\r\n\r\n"
        );
        let r = Response::json(StatusCode::OK, &b"{\"ok\":true}"[..]);
        assert_eq!(
            encoded(&r, true, Persistence::Implicit),
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n"
        );
    }
}
