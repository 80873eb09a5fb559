//! Heads off the wire, parsed by us: request heads from clients ([`HeadDecoder`], which also
//! decides how the body is framed and which host the request is for) and response heads from
//! workers ([`ResponseHeadDecoder`]). `httparse` reads the lines; what it yields lands in `http`
//! types whose storage is reused: header maps come from this core's spares (taken back with
//! [`recycle_headers`]; `clear()` keeps their capacity), values and the target are slices of the
//! head's own bytes (no copy), and names come from this core's cache ([`crate::header_names`]).
//! A steady head allocates nothing.
//!
//! The rules, every one decided here once and never re-derived downstream:
//!
//! - A head ends at its first CRLFCRLF, which must lie in the first `max` bytes buffered:
//!   past them with no end found, the head is too large (431 for a request), whatever a
//!   pipelining client sent behind it in the same read.
//! - Every line ends in CRLF: a bare LF anywhere in the head is refused. httparse accepts bare
//!   LF line ends, and a head it ends elsewhere than the CRLFCRLF would swallow the bytes
//!   behind it (a pipelined request, a body): two parsers disagreeing on where a request ends is
//!   how smuggling starts. httparse must then end the head exactly at the CRLFCRLF.
//! - httparse's strict grammar, its defaults: one space between the request line's parts, a
//!   method and field names that are tokens (no space before the colon), field values of
//!   visible bytes, spaces, HTABs and obs-text (no NUL, no other control byte), no obs-fold
//!   continuation lines, `HTTP/1.0` or `HTTP/1.1` only (an HTTP/0.9 line is refused), a
//!   three-digit status (100 to 999) in a response. At most 96 fields (as monoio-http's
//!   decoder allowed before this one): more is malformed (400), never a panic.
//! - `Host` at most once. An absolute-form target's authority becomes `Host` and the target its
//!   origin form (RFC 9112 §3.2.2); only `http`/`https` targets without userinfo; an
//!   authority-form target only for `CONNECT` (the handler refuses it).
//! - Framing per RFC 9112 §6, strictly: `Transfer-Encoding` with `Content-Length`, or in an
//!   HTTP/1.0 request, is malformed; a coding other than one lone `chunked` is refused (501);
//!   `Content-Length` must be one header of one decimal number (a list or a repeat, even an
//!   agreeing one, is malformed, as another parser may read it otherwise).
//!
//! Malformed heads are [`HeadError::Malformed`] (400 for a request).

use std::io;
use std::mem::MaybeUninit;

use bytes::{Bytes, BytesMut};
use http::uri::{PathAndQuery, Scheme};
use http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, Version, header};
use monoio_codec::{Decoded, Decoder};

use crate::header_names::with_names;

/// Fields a head may have.
const MAX_HEADERS: usize = 96;

/// How the bytes after a request head are delimited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    None,
    Length(u64),
    Chunked,
}

#[derive(Debug, thiserror::Error)]
pub enum HeadError {
    #[error("head larger than {0} bytes")]
    TooLarge(usize),
    #[error("malformed head: {0}")]
    Malformed(String),
    #[error("transfer-encoding other than chunked")]
    UnsupportedEncoding,
    #[error(transparent)]
    Io(#[from] io::Error),
}

fn malformed<T>(why: impl std::fmt::Display) -> Result<T, HeadError> {
    Err(HeadError::Malformed(why.to_string()))
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
        let Some(end) = head_end(src, self.max)? else {
            return Ok(Decoded::Insufficient);
        };
        let mut head = parse_request(src.split_to(end).freeze())?;
        if head.headers.get_all(header::HOST).iter().nth(1).is_some() {
            return malformed("repeated host");
        }
        target_authority_to_host(&mut head)?;
        let framing = framing(&head.headers, head.version)?;
        Ok(Decoded::Some((head, framing)))
    }
}

/// An HTTP/2 request's head (the `h2` crate checked its frames, pseudo-headers and HPACK) made
/// what the data plane takes from HTTP/1.1, by the same rules: `:authority` becomes `Host`
/// (a `Host` that names another, or two, is malformed: the hostname is an identity the node
/// routes by), the target its path and query (origin form or `*`, RFC 9113 §8.3.1), crumbled
/// `Cookie` fields one field again (RFC 9113 §8.2.3: the worker speaks HTTP/1.1), and the
/// body's framing decided once: a valid `Content-Length`, else none when the `HEADERS` ended
/// the stream, else chunked towards the worker.
#[cfg(feature = "h2")]
pub fn h2_request_head(
    mut head: http::request::Parts,
    end_stream: bool,
) -> Result<(http::request::Parts, Framing), HeadError> {
    let mut hosts = head.headers.get_all(header::HOST).iter();
    let host = hosts.next();
    if hosts.next().is_some() {
        return malformed("repeated host");
    }
    if let (Some(host), Some(authority)) = (host, head.uri.authority())
        && !host
            .as_bytes()
            .eq_ignore_ascii_case(authority.as_str().as_bytes())
    {
        return malformed("host differs from :authority");
    }
    if head.headers.contains_key(header::TRANSFER_ENCODING) {
        return malformed("transfer-encoding in an HTTP/2 request");
    }
    // RFC 9113 §8.3.1: `:path` is origin form or `*` (a `CONNECT` has none); the `h2` crate
    // takes any path, `?q` too, which no route reads as one.
    let target = head.uri.path_and_query().map(|pq| pq.as_str());
    if head.method != Method::CONNECT && !target.is_some_and(|t| t.starts_with('/') || t == "*") {
        return malformed(":path not in origin form");
    }
    target_authority_to_host(&mut head)?;
    let mut cookies = head.headers.get_all(header::COOKIE).iter();
    if let (Some(first), Some(_)) = (cookies.next(), cookies.next()) {
        let mut joined = first.as_bytes().to_vec();
        for crumb in head.headers.get_all(header::COOKIE).iter().skip(1) {
            joined.extend_from_slice(b"; ");
            joined.extend_from_slice(crumb.as_bytes());
        }
        let joined = HeaderValue::from_bytes(&joined).or_else(malformed)?;
        head.headers.insert(header::COOKIE, joined);
    }
    let framing = match content_length(&head.headers)? {
        None if end_stream => Framing::None,
        None => Framing::Chunked,
        Some(0) => Framing::None,
        Some(n) => Framing::Length(n),
    };
    Ok((head, framing))
}

/// Decodes one response head of at most `max` bytes (a worker's answer).
pub struct ResponseHeadDecoder {
    max: usize,
}

impl ResponseHeadDecoder {
    pub fn new(max: usize) -> ResponseHeadDecoder {
        ResponseHeadDecoder { max }
    }
}

impl Decoder for ResponseHeadDecoder {
    type Item = http::response::Parts;
    type Error = HeadError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Decoded<Self::Item>, HeadError> {
        let Some(end) = head_end(src, self.max)? else {
            return Ok(Decoded::Insufficient);
        };
        parse_response(src.split_to(end).freeze()).map(Decoded::Some)
    }
}

/// Where the head at the start of `src` ends (past its empty line), when it has arrived; the
/// first two rules of the module's.
fn head_end(src: &[u8], max: usize) -> Result<Option<usize>, HeadError> {
    // Only the first `max` bytes may hold the end of the head: a pipelined client can put a
    // long head and more behind it into one read, and the limit must not depend on that.
    let window = &src[..src.len().min(max)];
    let Some(end) = memchr::memmem::find(window, b"\r\n\r\n") else {
        return if src.len() >= max {
            Err(HeadError::TooLarge(max))
        } else {
            Ok(None)
        };
    };
    let end = end + 4;
    if has_bare_lf(&window[..end]) {
        return malformed("bare LF in the head");
    }
    Ok(Some(end))
}

fn has_bare_lf(head: &[u8]) -> bool {
    memchr::memchr_iter(b'\n', head).any(|i| i == 0 || head[i - 1] != b'\r')
}

/// httparse's fields, before they are known to be initialized.
type Fields<'h> = [MaybeUninit<httparse::Header<'h>>; MAX_HEADERS];

/// httparse must have read the whole head: no more (it cannot, it has no more) and no less.
fn whole(parsed: httparse::Result<usize>, head: &Bytes) -> Result<(), HeadError> {
    match parsed {
        Ok(httparse::Status::Complete(n)) if n == head.len() => Ok(()),
        Ok(httparse::Status::Complete(_)) => malformed("the head ends before its empty line"),
        Ok(httparse::Status::Partial) => malformed("incomplete head"),
        Err(e) => malformed(e),
    }
}

fn version(minor: Option<u8>) -> Version {
    match minor {
        Some(1) => Version::HTTP_11,
        _ => Version::HTTP_10,
    }
}

fn parse_request(head: Bytes) -> Result<http::request::Parts, HeadError> {
    let mut fields: Fields<'_> = [const { MaybeUninit::uninit() }; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut []);
    let parsed = httparse::ParserConfig::default().parse_request_with_uninit_headers(
        &mut request,
        &head,
        &mut fields,
    );
    whole(parsed, &head)?;
    let (Some(method), Some(target)) = (request.method, request.path) else {
        return malformed("incomplete request line");
    };
    let (mut parts, ()) = http::Request::new(()).into_parts();
    parts.method = Method::from_bytes(method.as_bytes()).or_else(malformed)?;
    parts.uri = match target {
        "/" => Uri::default(),
        _ => Uri::from_maybe_shared(head.slice_ref(target.as_bytes())).or_else(malformed)?,
    };
    parts.version = version(request.version);
    parts.headers = headers_of(request.headers, &head)?;
    Ok(parts)
}

fn parse_response(head: Bytes) -> Result<http::response::Parts, HeadError> {
    let mut fields: Fields<'_> = [const { MaybeUninit::uninit() }; MAX_HEADERS];
    let mut response = httparse::Response::new(&mut []);
    let parsed = httparse::ParserConfig::default().parse_response_with_uninit_headers(
        &mut response,
        &head,
        &mut fields,
    );
    whole(parsed, &head)?;
    let Some(code) = response.code else {
        return malformed("incomplete status line");
    };
    let (mut parts, ()) = http::Response::new(()).into_parts();
    parts.status = StatusCode::from_u16(code).or_else(malformed)?;
    parts.version = version(response.version);
    parts.headers = headers_of(response.headers, &head)?;
    Ok(parts)
}

/// The parsed fields in a spare map of this core's, their values slices of `head`.
fn headers_of(fields: &[httparse::Header<'_>], head: &Bytes) -> Result<HeaderMap, HeadError> {
    let mut headers = SPARE_MAPS.with_borrow_mut(Vec::pop).unwrap_or_default();
    headers.reserve(fields.len());
    with_names(|names| {
        for field in fields {
            let name = names.get(field.name.as_bytes()).or_else(malformed)?;
            // httparse allowed only what a `HeaderValue` may hold; checked again, for a few
            // nanoseconds, rather than trusted in an `unsafe` block.
            let value =
                HeaderValue::from_maybe_shared(head.slice_ref(field.value)).or_else(malformed)?;
            headers.append(name, value);
        }
        Ok(headers)
    })
}

/// Spare header maps kept per core: enough for the heads in flight on a busy core.
const SPARE_MAPS_KEPT: usize = 256;
/// A map grown past this many fields (a hostile head's 96) is freed rather than kept.
const SPARE_MAP_CAPACITY: usize = 48;

thread_local! {
    static SPARE_MAPS: std::cell::RefCell<Vec<HeaderMap>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// Gives a head's header map back once the head is done with, emptied, for the next head
/// parsed on this core. Its values are slices of the head's bytes, which share the allocation
/// of the connection's read buffer: until they are dropped, the buffer cannot be reused in
/// place and its next read allocates. So a head is given back before its connection reads
/// again (a map never given back is only freed).
pub fn recycle_headers(mut headers: HeaderMap) {
    if headers.capacity() > SPARE_MAP_CAPACITY {
        return;
    }
    headers.clear();
    SPARE_MAPS.with_borrow_mut(|spare| {
        if spare.len() < SPARE_MAPS_KEPT {
            spare.push(headers);
        }
    });
}

/// RFC 9112 §3.2.2: a request in absolute form (`GET http://a.example/x HTTP/1.1`) is for the
/// target's authority, whatever `Host` says. That authority becomes `Host` and the target its
/// path and query. An `http`/`https` target without userinfo only (RFC 9110 §4.2.4); an
/// authority-form target only for `CONNECT`, which is left for the handler to refuse.
fn target_authority_to_host(head: &mut http::request::Parts) -> Result<(), HeadError> {
    let Some(authority) = head.uri.authority() else {
        return Ok(());
    };
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
    // `http://a.example` and `http://a.example?q` ask for `/` (RFC 9112 §3.2.1). Decided on
    // the target's bytes: `path()` and the display both show an empty path as `/`, which kept
    // `?q` a target without one (issue 29's h2_frames fuzz target).
    let path = match head.uri.path_and_query() {
        Some(pq) if pq.as_str().starts_with('/') => pq.clone(),
        Some(pq) => PathAndQuery::try_from(format!("/{}", pq.as_str()))
            .or_else(|_| malformed("invalid target"))?,
        None => PathAndQuery::from_static("/"),
    };
    head.headers.insert(header::HOST, host);
    head.uri = Uri::from(path);
    Ok(())
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
    Ok(match content_length(headers)? {
        None | Some(0) => Framing::None,
        Some(n) => Framing::Length(n),
    })
}

/// The one `Content-Length` of a head, strictly: digits only (no sign, no blank inside), at
/// most 19 of them. A list (`5, 5`) or a repeated header is legal when every member agrees (RFC
/// 9110 §8.6), but another parser in front of or behind us may read it otherwise; a proxy
/// refuses it. Requests here, and a worker's answers (`src/proxy/forward.rs`), by this one rule.
pub fn content_length(headers: &HeaderMap) -> Result<Option<u64>, HeadError> {
    let mut lengths = headers.get_all(header::CONTENT_LENGTH).iter();
    match (lengths.next(), lengths.next()) {
        (None, _) => Ok(None),
        (Some(_), Some(_)) => Err(HeadError::Malformed("repeated content-length".into())),
        (Some(value), None) => parse_length(value.as_bytes().trim_ascii())
            .map(Some)
            .ok_or_else(|| HeadError::Malformed("invalid content-length".into())),
    }
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

    /// The targets an HTTP/2 head may have: origin form or `*` (the h2_frames fuzz target
    /// found `?q`, which the `h2` crate lets through, taken as is). The URI is built as the
    /// `h2` crate builds it from `:scheme`, `:authority` and `:path`.
    #[cfg(feature = "h2")]
    #[test]
    fn h2_targets_are_origin_form() {
        for (method, authority, path, target) in [
            (Method::GET, None, "/t/x?q", Some("/t/x?q")),
            (Method::GET, Some("a.example"), "/t/x", Some("/t/x")),
            (Method::OPTIONS, None, "*", Some("*")),
            (Method::GET, None, "?q", None),
            (Method::GET, Some("a.example"), "?q", None),
        ] {
            let mut uri = http::uri::Parts::default();
            if let Some(authority) = authority {
                uri.scheme = Some(Scheme::HTTPS);
                uri.authority = Some(authority.parse().unwrap());
            }
            uri.path_and_query = Some(path.parse().unwrap());
            let request = http::Request::builder().method(method).uri(uri);
            let (head, ()) = request.body(()).unwrap().into_parts();
            let made = h2_request_head(head, true).ok();
            let made = made
                .as_ref()
                .and_then(|(head, _)| head.uri.path_and_query());
            assert_eq!(made.map(|pq| pq.as_str()), target, "{authority:?} {path}");
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
            // What the forward writes: the target's bytes, not its display.
            let written = head.uri.path_and_query().map(|pq| pq.as_str());
            assert_eq!(written, Some(target), "{raw:?}");
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

    fn malformed_of(raw: &[u8]) -> bool {
        matches!(
            HeadDecoder::new(64 * 1024).decode(&mut BytesMut::from(raw)),
            Err(HeadError::Malformed(_))
        )
    }

    /// Hostile heads the parser meets first: each refused as malformed (400), none a panic.
    #[test]
    fn hostile_heads_are_malformed() {
        let many = |n: usize| {
            let mut raw = b"GET / HTTP/1.1\r\n".to_vec();
            for i in 0..n {
                raw.extend_from_slice(format!("x-h{i}: {i}\r\n").as_bytes());
            }
            raw.extend_from_slice(b"\r\n");
            raw
        };
        assert!(!malformed_of(&many(MAX_HEADERS)));
        assert_eq!(head_of_bytes(&many(MAX_HEADERS)).headers.len(), MAX_HEADERS);
        assert!(malformed_of(&many(MAX_HEADERS + 1)));
        assert!(malformed_of(&many(1000)));
        for bad in [
            &b"GET / HTTP/1.1\r\nX: a\0b\r\n\r\n"[..],
            b"GET / HTTP/1.1\r\nX: a\x01b\r\n\r\n",
            b"GET / HTTP/1.1\r\nX: a\x7fb\r\n\r\n",
            b"GET / HTTP/1.1\r\nX: a\rb\r\n\r\n",
            b"GET / HTTP/1.1\r\nX\0: a\r\n\r\n",
            // Whitespace before the colon (RFC 9112 §5.1), obs-fold (§5.2).
            b"GET / HTTP/1.1\r\nHost : a\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost\t: a\r\n\r\n",
            b"GET / HTTP/1.1\r\nX: a\r\n b\r\n\r\n",
            b"GET / HTTP/1.1\r\n X: a\r\n\r\n",
            // Request lines: extra spaces, HTTP/0.9, versions we do not speak, no method.
            b"GET  / HTTP/1.1\r\n\r\n",
            b"GET / HTTP/1.1 \r\n\r\n",
            b"GET /  HTTP/1.1\r\n\r\n",
            b"GET /\r\n\r\n",
            b"GET / HTTP/0.9\r\n\r\n",
            b"GET / HTTP/2.0\r\n\r\n",
            b"GET / HTTP/1.10\r\n\r\n",
            b" / HTTP/1.1\r\n\r\n",
            b"G\xc3\x89T / HTTP/1.1\r\n\r\n",
            b"\r\n\r\n",
            // A lone CR ends no line.
            b"GET / HTTP/1.1\rHost: a\r\n\r\n",
        ] {
            assert!(malformed_of(bad), "{:?}", String::from_utf8_lossy(bad));
        }
    }

    fn head_of_bytes(raw: &[u8]) -> http::request::Parts {
        match HeadDecoder::new(64 * 1024).decode(&mut BytesMut::from(raw)) {
            Ok(Decoded::Some((head, _))) => head,
            other => panic!("{:?}: {:?}", String::from_utf8_lossy(raw), other.err()),
        }
    }

    #[test]
    fn values_are_kept_byte_for_byte() {
        // obs-text (RFC 9110 §5.5) and HTABs are a value's; the blanks around it are not.
        // A name is a token: obs-text is no name's.
        assert!(malformed_of(b"GET / HTTP/1.1\r\nX-Caf\xc3\xa9: no\r\n\r\n"));
        let head = head_of_bytes(
            b"GET /a?b=c HTTP/1.0\r\nX-Name: \t caf\xc3\xa9\xff\ta b \t\r\nEmpty:\r\n\r\n",
        );
        assert_eq!(head.method, Method::GET);
        assert_eq!(head.uri, "/a?b=c");
        assert_eq!(head.version, Version::HTTP_10);
        assert_eq!(head.headers["x-name"].as_bytes(), b"caf\xc3\xa9\xff\ta b");
        assert_eq!(head.headers["empty"].as_bytes(), b"");
        // Names of any case are one name; repeats stay in order.
        let head = head_of_bytes(b"PURGE / HTTP/1.1\r\nX-A: 1\r\nx-a: 2\r\nX-a: 3\r\n\r\n");
        assert_eq!(head.method.as_str(), "PURGE");
        let all: Vec<_> = head.headers.get_all("x-a").iter().collect();
        assert_eq!(all, ["1", "2", "3"]);
    }

    #[test]
    fn a_head_exactly_at_the_cap_is_accepted() {
        let head = |len: usize| {
            let fixed = "GET / HTTP/1.1\r\nX: \r\n\r\n".len();
            format!("GET / HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(len - fixed))
        };
        let at = head(100);
        assert_eq!(at.len(), 100);
        assert!(matches!(decode(&at, 100), Ok(Decoded::Some(_))));
        // With a pipelined request behind it in the same read, too.
        let pipelined = format!("{at}GET / HTTP/1.1\r\n\r\n");
        let mut buf = BytesMut::from(pipelined.as_str());
        assert!(matches!(
            HeadDecoder::new(100).decode(&mut buf),
            Ok(Decoded::Some(_))
        ));
        assert_eq!(&buf[..], b"GET / HTTP/1.1\r\n\r\n");
        assert!(matches!(
            decode(&head(101), 100),
            Err(HeadError::TooLarge(100))
        ));
        assert!(matches!(decode(&at[..99], 100), Ok(Decoded::Insufficient)));
    }

    fn response_of(raw: &[u8], max: usize) -> Result<Decoded<http::response::Parts>, HeadError> {
        ResponseHeadDecoder::new(max).decode(&mut BytesMut::from(raw))
    }

    #[test]
    fn response_heads() {
        let raw = b"HTTP/1.1 503 Whatever\r\nPinned-Refusal: lease-unhealthy\r\n\
                    Content-Length: 0\r\nX-Worker-Own: 1\r\n\r\nnext";
        let mut buf = BytesMut::from(&raw[..]);
        let Ok(Decoded::Some(head)) = ResponseHeadDecoder::new(1024).decode(&mut buf) else {
            panic!("not parsed");
        };
        assert_eq!(&buf[..], b"next");
        assert_eq!(head.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(head.version, Version::HTTP_11);
        assert_eq!(head.headers["pinned-refusal"], "lease-unhealthy");
        assert_eq!(head.headers["x-worker-own"], "1");
        assert_eq!(head.headers.len(), 3);
        let head = match response_of(b"HTTP/1.0 200\r\n\r\n", 1024) {
            Ok(Decoded::Some(head)) => head,
            _ => panic!("not parsed"),
        };
        assert_eq!(
            (head.status, head.version),
            (StatusCode::OK, Version::HTTP_10)
        );
        assert!(matches!(
            response_of(b"HTTP/1.1 200 OK\r\n", 1024),
            Ok(Decoded::Insufficient)
        ));
        assert!(matches!(
            response_of(&[b'a'; 64], 64),
            Err(HeadError::TooLarge(64))
        ));
        for bad in [
            &b"HTTP/1.1 200 OK\nX: 1\n\n\r\n\r\n"[..],
            b"HTTP/1.1 099 Low\r\n\r\n",
            b"HTTP/1.1 20 OK\r\n\r\n",
            b"HTTP/2 200 OK\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nX: 1\r\n folded\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nX : 1\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nX: \0\r\n\r\n",
        ] {
            assert!(
                matches!(response_of(bad, 1024), Err(HeadError::Malformed(_))),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    /// A map given back is the next head's, its capacity kept and nothing of the old head left.
    #[test]
    fn recycled_maps_are_reused_empty() {
        let first = head_of_bytes(b"GET / HTTP/1.1\r\nA: 1\r\nB: 2\r\nC: 3\r\n\r\n");
        let capacity = first.headers.capacity();
        recycle_headers(first.headers);
        let next = head_of_bytes(b"GET / HTTP/1.1\r\nD: 4\r\n\r\n");
        assert_eq!(next.headers.capacity(), capacity);
        assert_eq!(next.headers.len(), 1);
        assert_eq!(next.headers["d"], "4");
    }
}
