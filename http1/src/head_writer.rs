//! Heads written onto the wire, every byte checked: the one way a request line or a header
//! field is written towards a worker (the node's forwards, its registration and heartbeat
//! probes, `_wake` and `_pinned/stats` calls, a worker's calls to its registry) and a relayed
//! answer's fields towards a client (as HTTP/1.1 bytes, or an HTTP/2 answer's field map), with
//! how its body is delimited ([`BodyFraming`]), and the status line and `Connection` field
//! ([`Persistence`]) every HTTP/1.1 answer starts and ends its head with.
//!
//! A value comes from anywhere: a registration's `secret`, a client's header, a worker's
//! answer, an epoch. Written raw, one holding CR or LF ends the head early and starts another
//! request (issue 23, M1: a secret with `\r\n\r\nPOST /internal/...` rode along on every
//! probe). So a header name must be a token, a value may hold no control byte but HTAB (RFC
//! 9110 §5.5: no CR, LF or NUL among them), and a request target no space or control byte; what
//! breaks a rule is refused with [`Unwritable`], and nothing of its head is left in the buffer.

use std::fmt::Display;
use std::io::Write;

use bytes::{BufMut, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, header};

use crate::head::Framing;

/// A request line or header field that would not be one line of one head.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unwritable {0}: it holds a byte the HTTP/1.1 grammar does not allow there")]
pub struct Unwritable(pub &'static str);

/// Writes one head, after whatever its buffer already holds (HTTP/1.1), or into the field map of
/// an HTTP/2 `HEADERS` frame. Once a field is refused, the whole head is taken back out and
/// every later call is refused too: a head is written whole or not at all.
pub struct HeadWriter<'a> {
    target: Target<'a>,
    refused: Option<Unwritable>,
}

enum Target<'a> {
    /// HTTP/1.1 bytes in `dst`, from `start`.
    Wire { dst: &'a mut BytesMut, start: usize },
    /// An HTTP/2 answer's fields (its status is the frame's pseudo-header, not a line).
    #[cfg_attr(not(feature = "h2"), allow(dead_code))]
    Fields(&'a mut HeaderMap),
}

/// How a message body is delimited on the wire we write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyFraming {
    None,
    Length(u64),
    Chunked,
    /// Until the connection closes (only towards an HTTP/1.0 client).
    Close,
}

impl From<Framing> for BodyFraming {
    fn from(framing: Framing) -> BodyFraming {
        match framing {
            Framing::None => BodyFraming::None,
            Framing::Length(n) => BodyFraming::Length(n),
            Framing::Chunked => BodyFraming::Chunked,
        }
    }
}

impl<'a> HeadWriter<'a> {
    /// Starts a request head: `METHOD {base}{target} HTTP/1.1`. The target (`base` then
    /// `target`, either may be empty) must start with `/` and hold no space or control byte.
    pub fn request(
        dst: &'a mut BytesMut,
        method: &Method,
        base: &str,
        target: &str,
    ) -> Result<HeadWriter<'a>, Unwritable> {
        if !method.as_str().bytes().all(is_tchar) {
            return Err(Unwritable("method"));
        }
        let starts_with_slash = base.bytes().chain(target.bytes()).next() == Some(b'/');
        // No space or control byte: those end the target or the line. Bytes past ASCII are no
        // danger to the framing, and some clients send them unencoded.
        let clean = |s: &str| s.bytes().all(|b| b > b' ' && b != 0x7f);
        if !starts_with_slash || !clean(base) || !clean(target) {
            return Err(Unwritable("request target"));
        }
        let start = dst.len();
        dst.put_slice(method.as_str().as_bytes());
        dst.put_u8(b' ');
        dst.put_slice(base.as_bytes());
        dst.put_slice(target.as_bytes());
        dst.put_slice(b" HTTP/1.1\r\n");
        Ok(HeadWriter {
            target: Target::Wire { dst, start },
            refused: None,
        })
    }

    /// Starts a response head: its status line.
    pub fn response(dst: &'a mut BytesMut, status: StatusCode) -> HeadWriter<'a> {
        let start = dst.len();
        encode_status_line(status, dst);
        HeadWriter {
            target: Target::Wire { dst, start },
            refused: None,
        }
    }

    /// Starts an HTTP/2 answer's fields in `fields` (empty), held to the same rules.
    #[cfg_attr(not(feature = "h2"), allow(dead_code))]
    pub(crate) fn fields(fields: &'a mut HeaderMap) -> HeadWriter<'a> {
        HeadWriter {
            target: Target::Fields(fields),
            refused: None,
        }
    }

    /// Writes `name: value`.
    pub fn header(&mut self, name: &str, value: &[u8]) -> Result<(), Unwritable> {
        if !is_token(name.as_bytes()) {
            return self.refuse(Unwritable("header name"));
        }
        self.checked(name, |dst| dst.put_slice(value))
    }

    /// Writes `name: value` for a name the `http` crate made: a token by construction
    /// (`HeaderName` checks every byte), so only the value is checked. What a forward copies
    /// from a client's head or a worker's answer comes this way.
    pub fn field(&mut self, name: &HeaderName, value: &[u8]) -> Result<(), Unwritable> {
        self.checked(name.as_str(), |dst| dst.put_slice(value))
    }

    /// Writes `name: value` with `value` formatted in place (a number, an address): nothing
    /// allocated, and the formatted bytes are held to the same rule.
    pub fn field_display(
        &mut self,
        name: &HeaderName,
        value: impl Display,
    ) -> Result<(), Unwritable> {
        self.checked(name.as_str(), |dst| {
            let _ = write!(dst.writer(), "{value}");
        })
    }

    /// Says how the body that follows is delimited: `Content-Length` or (HTTP/1.1)
    /// `Transfer-Encoding: chunked`. HTTP/2 frames every body itself: only a length is stated.
    pub fn framing(&mut self, framing: BodyFraming) -> Result<(), Unwritable> {
        match framing {
            BodyFraming::Length(n) => self.field_display(&header::CONTENT_LENGTH, n),
            BodyFraming::Chunked if matches!(self.target, Target::Wire { .. }) => {
                self.field(&header::TRANSFER_ENCODING, b"chunked")
            }
            BodyFraming::Chunked | BodyFraming::None | BodyFraming::Close => Ok(()),
        }
    }

    /// Ends the head (its empty line); a refused head stays unwritten.
    pub fn finish(self) -> Result<(), Unwritable> {
        match (self.refused, self.target) {
            (Some(refused), _) => Err(refused),
            (None, Target::Wire { dst, .. }) => {
                dst.put_slice(b"\r\n");
                Ok(())
            }
            (None, Target::Fields(_)) => Ok(()),
        }
    }

    /// Writes `name` (already checked) and the value `value` writes, checking the value.
    #[inline]
    fn checked(&mut self, name: &str, value: impl FnOnce(&mut BytesMut)) -> Result<(), Unwritable> {
        if let Some(refused) = &self.refused {
            return Err(refused.clone());
        }
        let clean = match &mut self.target {
            Target::Wire { dst, .. } => {
                dst.put_slice(name.as_bytes());
                dst.put_slice(b": ");
                let value_at = dst.len();
                value(dst);
                let clean = !holds_control(&dst[value_at..]);
                dst.put_slice(b"\r\n");
                clean
            }
            Target::Fields(fields) => append_field(fields, name, value),
        };
        if clean {
            Ok(())
        } else {
            self.refuse(Unwritable("header value"))
        }
    }

    /// Takes the head back out; this and every later field is refused.
    fn refuse(&mut self, refused: Unwritable) -> Result<(), Unwritable> {
        match &mut self.target {
            Target::Wire { dst, start } => dst.truncate(*start),
            Target::Fields(fields) => fields.clear(),
        }
        let first = self.refused.get_or_insert(refused);
        Err(first.clone())
    }
}

/// Appends `name` and the value `value` writes to an HTTP/2 answer's fields; false when the
/// value holds a byte no field may. Out of line: the HTTP/1.1 path through
/// [`HeadWriter::checked`], every field of every forward, stays small enough to inline.
#[inline(never)]
fn append_field(fields: &mut HeaderMap, name: &str, value: impl FnOnce(&mut BytesMut)) -> bool {
    let mut bytes = BytesMut::new();
    value(&mut bytes);
    // `HeaderValue` refuses the same bytes (controls but HTAB); the name was checked.
    match (
        HeaderName::from_bytes(name.as_bytes()),
        HeaderValue::from_maybe_shared(bytes.freeze()),
    ) {
        (Ok(name), Ok(value)) if !holds_control(value.as_bytes()) => {
            fields.append(name, value);
            true
        }
        _ => false,
    }
}

/// Writes an HTTP/1.1 answer's head after what `dst` holds: the status line, the fields
/// `fields` writes, then what the connection does after it (`persistence`) and how its body is
/// delimited. On [`Unwritable`] nothing of it stays.
pub fn answer_head(
    dst: &mut BytesMut,
    status: StatusCode,
    framing: BodyFraming,
    persistence: Persistence,
    fields: impl FnOnce(&mut HeadWriter<'_>) -> Result<(), Unwritable>,
) -> Result<(), Unwritable> {
    let mut head = HeadWriter::response(dst, status);
    fields(&mut head)?;
    if let Some(value) = persistence.value() {
        head.field(&header::CONNECTION, value.as_bytes())?;
    }
    head.framing(framing)?;
    head.finish()
}

/// RFC 9110 §5.6.2's `tchar`, by byte: what a method or a field name is made of. A table, as
/// every field of every forward and relayed answer is checked (a byte search of the
/// punctuation per byte was the costliest part of a forward's head).
const TCHAR: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        table[b] = c.is_ascii_alphanumeric()
            || matches!(
                c,
                b'!' | b'#'
                    | b'$'
                    | b'%'
                    | b'&'
                    | b'\''
                    | b'*'
                    | b'+'
                    | b'-'
                    | b'.'
                    | b'^'
                    | b'_'
                    | b'`'
                    | b'|'
                    | b'~'
            );
        b += 1;
    }
    table
};

fn is_tchar(b: u8) -> bool {
    TCHAR[b as usize]
}

/// A non-empty run of `tchar`: a method, a field name, an `Upgrade` protocol's name or version.
pub fn is_token(name: &[u8]) -> bool {
    !name.is_empty() && name.iter().fold(true, |all, &b| all & is_tchar(b))
}

/// RFC 9110 §5.5: a field value holds visible bytes, spaces and HTABs; any other control byte
/// (CR, LF and NUL among them) is refused. Eight bytes at a time: a word with no byte below
/// 0x20 and no DEL (nearly every word of nearly every value) is clean without a look at its
/// bytes; only a word that may hold one (an HTAB, say) is read byte by byte.
pub(crate) fn holds_control(value: &[u8]) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let (words, rest) = value.as_chunks::<8>();
    for word in words {
        let w = u64::from_le_bytes(*word);
        // Some byte is below 0x20, or some byte is 0x7f (a zero byte of w ^ 0x7f7f…).
        let below_space = w.wrapping_sub(ONES * 0x20) & !w & HIGH;
        let del = w ^ (ONES * 0x7f);
        let del = del.wrapping_sub(ONES) & !del & HIGH;
        if below_space | del != 0 && word.iter().any(|&b| is_control(b)) {
            return true;
        }
    }
    rest.iter().any(|&b| is_control(b))
}

fn is_control(b: u8) -> bool {
    (b < 0x20 && b != b'\t') || b == 0x7f
}

/// What the `Connection` header of a response says about the connection after it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Persistence {
    /// HTTP/1.1's default: the connection stays open, nothing to say.
    Implicit,
    /// An HTTP/1.0 client that asked for keep-alive must hear it confirmed.
    KeepAlive,
    Close,
}

impl Persistence {
    pub fn encode(self, dst: &mut BytesMut) {
        if let Some(value) = self.value() {
            dst.put_slice(b"connection: ");
            dst.put_slice(value.as_bytes());
            dst.put_slice(b"\r\n");
        }
    }

    /// The `Connection` value that says it, if one must be sent.
    pub fn value(self) -> Option<&'static str> {
        match self {
            Persistence::Implicit => None,
            Persistence::KeepAlive => Some("keep-alive"),
            Persistence::Close => Some("close"),
        }
    }
}

/// Writes `HTTP/1.1 {status} {reason}` and its CRLF.
pub fn encode_status_line(status: StatusCode, dst: &mut BytesMut) {
    dst.put_slice(b"HTTP/1.1 ");
    dst.put_slice(status.as_str().as_bytes());
    dst.put_u8(b' ');
    dst.put_slice(status.canonical_reason().unwrap_or("Unknown").as_bytes());
    dst.put_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The head written after `kept`, with each field's outcome and then the head's.
    fn head(target: &str, fields: &[(&str, &[u8])]) -> (BytesMut, Vec<Result<(), Unwritable>>) {
        let mut out = BytesMut::from(&b"kept"[..]);
        let mut results = Vec::new();
        let mut w = HeadWriter::request(&mut out, &Method::GET, "/base", target).unwrap();
        for (name, value) in fields {
            results.push(w.header(name, value));
        }
        results.push(w.finish());
        (out, results)
    }

    #[test]
    fn writes_a_head_after_what_the_buffer_holds() {
        let (out, results) = head("/t/x?q=1", &[("host", b"w:1"), ("x-tab", b"a\tb")]);
        assert!(results.iter().all(Result::is_ok));
        assert_eq!(
            &out[..],
            b"keptGET /base/t/x?q=1 HTTP/1.1\r\nhost: w:1\r\nx-tab: a\tb\r\n\r\n"
        );
        // Bytes past ASCII, which some clients send unencoded, cannot split the request line.
        let (out, _) = head("/t/\u{456}", &[]);
        assert_eq!(
            &out[..],
            "keptGET /base/t/\u{456} HTTP/1.1\r\n\r\n".as_bytes()
        );
        let mut out = BytesMut::new();
        let mut w = HeadWriter::response(&mut out, StatusCode::OK);
        w.field_display(&http::header::CONTENT_LENGTH, 42).unwrap();
        w.finish().unwrap();
        assert_eq!(&out[..], b"HTTP/1.1 200 OK\r\ncontent-length: 42\r\n\r\n");
    }

    /// M1 of issue 23: a registration secret with CRLF in it was a second request on the wire.
    #[test]
    fn refuses_values_that_would_end_the_line() {
        let smuggled = b"AAAA\r\nX-Injected: yes\r\n\r\nPOST /internal/admin HTTP/1.1\r\n";
        for bad in [
            &smuggled[..],
            b"a\nb",
            b"a\rb",
            b"a\0b",
            b"\x1b[2J",
            b"\x7f",
            b"trailing\r",
        ] {
            let fields = [
                ("ok", &b"1"[..]),
                ("pinboard-proxy-secret", bad),
                ("ok", b"2"),
            ];
            let (out, results) = head("/p", &fields);
            let refused = Err(Unwritable("header value"));
            assert_eq!(
                results,
                [Ok(()), refused.clone(), refused.clone(), refused],
                "{bad:?}"
            );
            // Nothing of the head is left: not the refused field, nor those around it.
            assert_eq!(&out[..], b"kept");
        }
        for name in ["", "a b", "a:b", "a\r\nb", "x\0"] {
            assert_eq!(
                head("/p", &[(name, b"v")]).1[0],
                Err(Unwritable("header name")),
                "{name:?}"
            );
        }
        let mut out = BytesMut::new();
        let mut w = HeadWriter::response(&mut out, StatusCode::OK);
        let refused = w.field_display(&HeaderName::from_static("x-bad"), "a\r\nb");
        assert_eq!(refused, Err(Unwritable("header value")));
        assert!(w.finish().is_err());
        assert!(out.is_empty());
    }

    #[test]
    fn refuses_targets_that_are_not_one_token() {
        for (base, target) in [
            ("", "/a b"),
            ("", "/a\r\nHost: x"),
            ("/b\n", "/a"),
            ("", "a"),
            ("", ""),
            ("", "/\0"),
        ] {
            let mut out = BytesMut::new();
            assert!(
                HeadWriter::request(&mut out, &Method::GET, base, target).is_err(),
                "{base:?} {target:?}"
            );
            assert!(out.is_empty());
        }
    }
}
