//! The `Transfer-Encoding: chunked` body parser.
//!
//! Written here rather than taken from monoio-http, whose decoder waits for each whole chunk in
//! memory (one declared 1 GiB chunk would be buffered before any size cap could act) and refuses
//! chunk extensions and trailers that RFC 9112 allows. This one hands out data as it arrives.
//!
//! Lines (chunk sizes with their extensions, trailer fields) end at CRLF only, and hold no other
//! control byte but HTAB: a parser in front of the node that ends a line at a bare LF (or takes a
//! bare CR or NUL) would read a different body, or a smuggled request, from the same bytes.

use bytes::{Buf, Bytes, BytesMut};

use crate::head_writer::holds_control;

/// Longest chunk-size line (size, extensions) or trailer section we accept.
const MAX_LINE: usize = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Size,
    Data(u64),
    DataEnd,
    Trailers { seen: usize },
    Done,
}

/// One step of progress through a chunked body.
#[derive(Debug, PartialEq, Eq)]
pub enum Piece {
    Data(Bytes),
    End,
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("malformed chunked body")]
pub struct Malformed;

#[derive(Debug)]
pub struct ChunkedDecoder {
    state: State,
}

impl Default for ChunkedDecoder {
    fn default() -> Self {
        ChunkedDecoder { state: State::Size }
    }
}

impl ChunkedDecoder {
    /// Consumes what it can from `buf`. `Ok(None)` means more bytes are needed — a normal
    /// outcome, not an error.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Piece>, Malformed> {
        loop {
            match self.state {
                State::Size => {
                    let Some(line) = take_line(buf)? else {
                        return Ok(None);
                    };
                    let size = parse_size(&line)?;
                    self.state = if size == 0 {
                        State::Trailers { seen: 0 }
                    } else {
                        State::Data(size)
                    };
                }
                State::Data(remaining) => {
                    if buf.is_empty() {
                        return Ok(None);
                    }
                    let n = remaining.min(buf.len() as u64);
                    let data = buf.split_to(n as usize).freeze();
                    self.state = if n == remaining {
                        State::DataEnd
                    } else {
                        State::Data(remaining - n)
                    };
                    return Ok(Some(Piece::Data(data)));
                }
                State::DataEnd => {
                    if buf.len() < 2 {
                        return Ok(None);
                    }
                    if &buf[..2] != b"\r\n" {
                        return Err(Malformed);
                    }
                    buf.advance(2);
                    self.state = State::Size;
                }
                State::Trailers { seen } => {
                    let Some(line) = take_line(buf)? else {
                        return Ok(None);
                    };
                    if line.is_empty() {
                        self.state = State::Done;
                        return Ok(Some(Piece::End));
                    }
                    // Trailers are read and dropped: nothing in Pinboard acts on them.
                    let seen = seen + line.len() + 2;
                    if seen > MAX_LINE {
                        return Err(Malformed);
                    }
                    self.state = State::Trailers { seen };
                }
                State::Done => return Ok(Some(Piece::End)),
            }
        }
    }
}

/// Removes one CRLF-terminated line from `buf`, without its CRLF. A control byte other than HTAB
/// before the CRLF (a bare LF or CR, a NUL) is malformed, seen as soon as it arrives.
fn take_line(buf: &mut BytesMut) -> Result<Option<BytesMut>, Malformed> {
    let window = &buf[..buf.len().min(MAX_LINE)];
    let end = memchr::memmem::find(window, b"\r\n");
    let line = match (end, window.split_last()) {
        (Some(end), _) => &window[..end],
        // A CR last may be the start of the CRLF still to come.
        (None, Some((b'\r', before))) => before,
        (None, _) => window,
    };
    if holds_control(line) {
        return Err(Malformed);
    }
    match end {
        Some(end) => {
            let line = buf.split_to(end);
            buf.advance(2);
            Ok(Some(line))
        }
        None if buf.len() >= MAX_LINE => Err(Malformed),
        None => Ok(None),
    }
}

fn parse_size(line: &[u8]) -> Result<u64, Malformed> {
    // Extensions (`;name=value`) are allowed and ignored.
    let digits = match memchr::memchr(b';', line) {
        Some(i) => &line[..i],
        None => line,
    }
    .trim_ascii_end();
    if digits.is_empty() || digits.len() > 15 {
        return Err(Malformed);
    }
    digits.iter().try_fold(0u64, |n, d| {
        let v = (*d as char).to_digit(16).ok_or(Malformed)?;
        Ok(n * 16 + u64::from(v))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `input` one byte at a time, as the slowest client would.
    fn decode_bytewise(input: &[u8]) -> Result<(Vec<u8>, bool), Malformed> {
        decode_in_pieces(input, 1)
    }

    /// Feeds `input` in reads of `size` bytes.
    fn decode_in_pieces(input: &[u8], size: usize) -> Result<(Vec<u8>, bool), Malformed> {
        let mut dec = ChunkedDecoder::default();
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        for read in input.chunks(size) {
            buf.extend_from_slice(read);
            while let Some(piece) = dec.decode(&mut buf)? {
                match piece {
                    Piece::Data(d) => out.extend_from_slice(&d),
                    Piece::End => return Ok((out, true)),
                }
            }
        }
        Ok((out, false))
    }

    #[test]
    fn decodes_with_extensions_and_trailers() {
        let body = b"5;ext=1\r\nhello\r\nA\r\n, world!!!\r\n0\r\nX-T: 1\r\n\r\n";
        assert_eq!(
            decode_bytewise(body).unwrap(),
            (b"hello, world!!!".to_vec(), true)
        );
    }

    #[test]
    fn hands_out_partial_chunks() {
        let mut dec = ChunkedDecoder::default();
        let mut buf = BytesMut::from(&b"10\r\nabc"[..]);
        assert_eq!(
            dec.decode(&mut buf).unwrap(),
            Some(Piece::Data(Bytes::from_static(b"abc")))
        );
        assert_eq!(dec.decode(&mut buf).unwrap(), None);
    }

    /// With L5 of issue 23: a line ends at CRLF only, and holds no control byte but HTAB. A
    /// parser that ends it at a bare LF instead reads another body (or a request) from these
    /// bytes.
    #[test]
    fn rejects_malformed() {
        for bad in [
            &b"zz\r\n"[..],
            b"\r\n",
            b"5\r\nhelloXX",
            b"fffffffffffffffff\r\n",
            // A bare LF inside a chunk extension.
            b"5;a\nb\r\nhello\r\n0\r\n\r\n",
            // A bare LF in a trailer, hiding a request behind it.
            b"0\r\nX: a\nGET /t/x HTTP/1.1\r\n\r\n",
            b"0\nX: a\r\n\r\n",
            // A bare CR, and a CR followed by something other than LF.
            b"5\r;a\r\nhello\r\n0\r\n\r\n",
            b"0\r\nX: a\rb\r\n\r\n",
            // NUL, DEL and ESC, in a size line, an extension and a trailer.
            b"5\0\r\nhello\r\n0\r\n\r\n",
            b"5;a=\0\r\nhello\r\n0\r\n\r\n",
            b"0\r\nX: \x7f\r\n\r\n",
            b"0\r\nX: \x1b[2J\r\n\r\n",
        ] {
            // Refused as it trickles in, and whole.
            for size in [1, bad.len()] {
                let decoded = decode_in_pieces(bad, size);
                assert_eq!(decoded, Err(Malformed), "{} by {size}", bad.escape_ascii());
            }
        }
        let endless = vec![b'1'; MAX_LINE + 1];
        assert_eq!(decode_bytewise(&endless), Err(Malformed));
    }

    #[test]
    fn tabs_are_whitespace_in_lines() {
        // HTAB is whitespace, allowed in an extension and a trailer value.
        let tabs = b"5\t;a=b\r\nhello\r\n0\r\nX:\ta\r\n\r\n";
        assert_eq!(decode_bytewise(tabs).unwrap(), (b"hello".to_vec(), true));
    }
}
