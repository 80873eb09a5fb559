//! Request heads off the wire: a size-capped wrapper around monoio-http's head parser that also
//! decides how the body is framed.
//!
//! monoio-http's `GenericHeadDecoder` would pick the framing for us, but it accepts a request
//! carrying both `Transfer-Encoding` and `Content-Length` and ignores conflicting
//! `Content-Length` values — the ingredients of request smuggling through a proxy — so framing
//! is decided here, strictly, per RFC 9112 §6.
//!
//! The request's host is decided here too, once: an absolute-form target's authority replaces
//! `Host` (RFC 9112 §3.2.2) and the target is kept in origin form, so that every reader after
//! (routing, placement by hostname, the forward) sees one host.

use std::io;

use bytes::BytesMut;
use http::uri::{PathAndQuery, Scheme};
use http::{HeaderMap, HeaderValue, Method, Uri, Version, header};
use monoio_codec::{Decoded, Decoder};
use monoio_http::h1::codec::decoder::{DecodeError, RequestHeadDecoder};

/// How the bytes after a request head are delimited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    None,
    Length(u64),
    Chunked,
}

#[derive(Debug, thiserror::Error)]
pub enum HeadError {
    #[error("request head larger than {0} bytes")]
    TooLarge(usize),
    #[error("malformed request head: {0}")]
    Malformed(String),
    #[error("transfer-encoding other than chunked")]
    UnsupportedEncoding,
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// Decodes one request head of at most `max` bytes.
pub struct HeadDecoder {
    max: usize,
}

impl HeadDecoder {
    pub fn new(max: usize) -> HeadDecoder {
        HeadDecoder { max }
    }
}

impl Decoder for HeadDecoder {
    type Item = (http::request::Parts, Framing);
    type Error = HeadError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Decoded<Self::Item>, HeadError> {
        // Only the first `max` bytes may hold the end of the head: a pipelined client can put a
        // long head and more behind it into one read, and the limit must not depend on that.
        let window = &src[..src.len().min(self.max)];
        let Some(end) = memchr::memmem::find(window, b"\r\n\r\n") else {
            return if src.len() >= self.max {
                Err(HeadError::TooLarge(self.max))
            } else {
                Ok(Decoded::Insufficient)
            };
        };
        // monoio-http cuts the head at the first CRLFCRLF while httparse also accepts bare LF
        // line ends, so a bare-LF head would swallow the bytes after it (a pipelined request,
        // a body): two parsers disagreeing on where a request ends is how smuggling starts.
        if has_bare_lf(&window[..end + 4]) {
            return Err(HeadError::Malformed("bare LF in request head".into()));
        }
        match RequestHeadDecoder.decode(src) {
            Ok(Decoded::Some(mut head)) => {
                if head.headers.get_all(header::HOST).iter().nth(1).is_some() {
                    return Err(HeadError::Malformed("repeated host".into()));
                }
                target_authority_to_host(&mut head)?;
                let framing = framing(&head.headers, head.version)?;
                Ok(Decoded::Some((head, framing)))
            }
            Ok(_) => Err(HeadError::Malformed("incomplete head".into())),
            Err(DecodeError::Io(e)) => Err(HeadError::Io(e)),
            Err(e) => Err(HeadError::Malformed(e.to_string())),
        }
    }
}

/// RFC 9112 §3.2.2: a request in absolute form (`GET http://a.example/x HTTP/1.1`) is for the
/// target's authority, whatever `Host` says. That authority becomes `Host` and the target its
/// path and query. An `http`/`https` target without userinfo only (RFC 9110 §4.2.4); an
/// authority-form target only for `CONNECT`, which is left for the handler to refuse.
fn target_authority_to_host(head: &mut http::request::Parts) -> Result<(), HeadError> {
    let Some(authority) = head.uri.authority() else {
        return Ok(());
    };
    fn malformed<T>(why: &str) -> Result<T, HeadError> {
        Err(HeadError::Malformed(why.into()))
    }
    match head.uri.scheme() {
        None if head.method == Method::CONNECT => return Ok(()),
        None => return malformed("authority-form target"),
        Some(s) if *s != Scheme::HTTP && *s != Scheme::HTTPS => {
            return malformed("absolute-form target of another scheme");
        }
        Some(_) => {}
    }
    if authority.as_str().contains('@') {
        return malformed("userinfo in the target");
    }
    let host = HeaderValue::from_str(authority.as_str())
        .or_else(|_| malformed("invalid target authority"))?;
    // `http://a.example` and `http://a.example?q` ask for `/` (RFC 9112 §3.2.1).
    let path = match head.uri.path_and_query() {
        Some(pq) if pq.path().starts_with('/') => pq.clone(),
        Some(pq) => {
            PathAndQuery::try_from(format!("/{pq}")).or_else(|_| malformed("invalid target"))?
        }
        None => PathAndQuery::from_static("/"),
    };
    head.headers.insert(header::HOST, host);
    head.uri = Uri::from(path);
    Ok(())
}

fn has_bare_lf(head: &[u8]) -> bool {
    memchr::memchr_iter(b'\n', head).any(|i| i == 0 || head[i - 1] != b'\r')
}

fn framing(headers: &HeaderMap, version: Version) -> Result<Framing, HeadError> {
    let mut encodings = headers.get_all(header::TRANSFER_ENCODING).iter();
    if let Some(te) = encodings.next() {
        if headers.contains_key(header::CONTENT_LENGTH) {
            return Err(HeadError::Malformed(
                "both transfer-encoding and content-length".into(),
            ));
        }
        if version == Version::HTTP_10 {
            return Err(HeadError::Malformed(
                "transfer-encoding in an HTTP/1.0 request".into(),
            ));
        }
        // Only a lone `chunked` is understood; any other coding would leave the body's end
        // unknowable, so it is refused rather than guessed.
        if encodings.next().is_some()
            || !te.as_bytes().trim_ascii().eq_ignore_ascii_case(b"chunked")
        {
            return Err(HeadError::UnsupportedEncoding);
        }
        return Ok(Framing::Chunked);
    }
    // A list (`5, 5`) or a repeated header is legal when every member agrees (RFC 9110 §8.6),
    // but another parser in front of or behind us may read it otherwise; a proxy refuses it.
    let mut lengths = headers.get_all(header::CONTENT_LENGTH).iter();
    let length = match (lengths.next(), lengths.next()) {
        (None, _) => None,
        (Some(_), Some(_)) => {
            return Err(HeadError::Malformed("repeated content-length".into()));
        }
        (Some(value), None) => Some(
            parse_length(value.as_bytes().trim_ascii())
                .ok_or_else(|| HeadError::Malformed("invalid content-length".into()))?,
        ),
    };
    Ok(match length {
        None | Some(0) => Framing::None,
        Some(n) => Framing::Length(n),
    })
}

fn parse_length(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() || digits.len() > 19 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    digits.iter().try_fold(0u64, |n, d| {
        n.checked_mul(10)?.checked_add(u64::from(d - b'0'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(
        raw: &str,
        max: usize,
    ) -> Result<Decoded<(http::request::Parts, Framing)>, HeadError> {
        HeadDecoder::new(max).decode(&mut BytesMut::from(raw))
    }

    fn framing_of(raw: &str) -> Result<Framing, HeadError> {
        match decode(raw, 8192)? {
            Decoded::Some((_, f)) => Ok(f),
            _ => panic!("incomplete"),
        }
    }

    #[test]
    fn partial_head_is_not_an_error() {
        assert!(matches!(
            decode("GET / HTTP/1.1\r\nHost: a\r\n", 8192),
            Ok(Decoded::Insufficient)
        ));
    }

    #[test]
    fn head_over_the_cap_is_refused_even_when_complete() {
        let raw = format!("GET / HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(100));
        assert!(matches!(decode(&raw, 64), Err(HeadError::TooLarge(64))));
        assert!(matches!(decode(&raw, 1024), Ok(Decoded::Some(_))));
        assert!(matches!(
            decode(&"a".repeat(100), 64),
            Err(HeadError::TooLarge(64))
        ));
    }

    #[test]
    fn bare_lf_heads_are_refused_not_resynchronised() {
        // Found by fuzz/fuzz_targets/http_head.rs (fuzz/regressions/http_head/).
        let smuggle = "GET / HTTP/1.1\nHost: a\n\nGET /admin HTTP/1.1\r\nHost: a\r\n\r\n";
        assert!(matches!(
            decode(smuggle, 8192),
            Err(HeadError::Malformed(_))
        ));
        let body = "POST / HTTP/1.1\nContent-Length: 5\n\nhello\r\n\r\n";
        assert!(matches!(decode(body, 8192), Err(HeadError::Malformed(_))));
    }

    fn head_of(raw: &str) -> Result<http::request::Parts, HeadError> {
        match decode(raw, 8192)? {
            Decoded::Some((head, _)) => Ok(head),
            _ => panic!("incomplete"),
        }
    }

    /// L6 of issue 23: `GET http://evil.example/t/c42/x` was placed by its `Host` header.
    #[test]
    fn absolute_form_authority_replaces_host() {
        for (raw, host, target) in [
            (
                "GET http://a.example/t/c42/x?q=1 HTTP/1.1\r\nHost: evil.example\r\n\r\n",
                "a.example",
                "/t/c42/x?q=1",
            ),
            (
                "GET HTTPS://A.example:8443/t/x HTTP/1.1\r\n\r\n",
                "A.example:8443",
                "/t/x",
            ),
            (
                "GET http://a.example HTTP/1.1\r\nHost: b\r\n\r\n",
                "a.example",
                "/",
            ),
            (
                "GET http://a.example?q HTTP/1.1\r\nHost: b\r\n\r\n",
                "a.example",
                "/?q",
            ),
            ("GET /t/x HTTP/1.1\r\nHost: b\r\n\r\n", "b", "/t/x"),
        ] {
            let head = head_of(raw).unwrap();
            let hosts: Vec<_> = head.headers.get_all(header::HOST).iter().collect();
            assert_eq!(hosts, [host], "{raw:?}");
            assert_eq!(head.uri.to_string(), target, "{raw:?}");
            assert!(head.uri.authority().is_none());
        }
        // CONNECT's authority form is the handler's to refuse.
        let connect = head_of("CONNECT a.example:443 HTTP/1.1\r\nHost: a.example\r\n\r\n");
        assert_eq!(connect.unwrap().method, Method::CONNECT);
    }

    #[test]
    fn framing_rules() {
        assert_eq!(framing_of("GET / HTTP/1.1\r\n\r\n").unwrap(), Framing::None);
        assert_eq!(
            framing_of("POST / HTTP/1.1\r\nContent-Length: 12\r\n\r\n").unwrap(),
            Framing::Length(12)
        );
        assert_eq!(
            framing_of("POST / HTTP/1.1\r\nContent-Length: 0\r\n\r\n").unwrap(),
            Framing::None
        );
        assert_eq!(
            framing_of("POST / HTTP/1.1\r\nTransfer-Encoding: Chunked\r\n\r\n").unwrap(),
            Framing::Chunked
        );
        for bad in [
            "POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
            // Agreeing lists and repeats too: C1 of the security review (a list the node read
            // as one length and the forward re-read as none smuggled the body upstream).
            "POST / HTTP/1.1\r\nContent-Length: 49, 49\r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: 5,\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a\r\nhost: a\r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: +5\r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n",
            "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n",
            "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
            "GET / HTTP/1.1\r\nBad Header\r\n\r\n",
            // Targets (issue 23, L6): userinfo, another scheme, an authority form but for
            // CONNECT.
            "GET http://user@a.example/t/x HTTP/1.1\r\nHost: a.example\r\n\r\n",
            "GET ftp://a.example/t/x HTTP/1.1\r\nHost: a.example\r\n\r\n",
            "GET a.example:80 HTTP/1.1\r\nHost: a.example\r\n\r\n",
        ] {
            assert!(
                matches!(framing_of(bad), Err(HeadError::Malformed(_))),
                "{bad:?}"
            );
        }
        assert!(matches!(
            framing_of("POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"),
            Err(HeadError::UnsupportedEncoding)
        ));
    }
}
