//! Where the frames of a WebSocket byte stream end (RFC 6455 §5.2), read as the bytes pass
//! through a tunnel, so that the node can put a frame of its own between two of the worker's
//! (its close frame at the end of the shutdown grace) and never inside one. Pure: bytes in,
//! positions out, whatever the reads' sizes.
//!
//! Only the framing is read: a header's 2 to 14 bytes (FIN, opcode, the mask bit and the
//! payload length in 7, 7+16 or 7+64 bits, then the masking key when set), then the payload,
//! skipped by its length. A boundary is the end of a whole frame, also between the fragments of
//! a message: RFC 6455 §5.4 lets a control frame go there. The payloads are not looked at. A
//! 64-bit length with its top bit set is not WebSocket framing (§5.2): from there on the stream
//! has no boundary left.

/// The opcode of a Close frame.
const CLOSE: u8 = 0x8;
/// The longest header: 2 bytes, a 64-bit length, a masking key.
const LONGEST_HEADER: usize = 14;

/// The frame boundaries of one direction of a WebSocket connection, as its bytes go by.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FrameBoundaries {
    state: State,
    /// The sender has sent a Close frame (its header went by): it sends nothing after it.
    closed: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum State {
    /// Reading a header: its first `have` bytes so far.
    Header {
        head: [u8; LONGEST_HEADER],
        have: usize,
    },
    /// Inside a payload, `left` bytes before its end (never 0: a frame that ends is back at
    /// `Header`).
    Payload { left: u64 },
    /// Not WebSocket framing: no boundary from here on.
    Lost,
}

impl Default for State {
    fn default() -> State {
        State::Header {
            head: [0; LONGEST_HEADER],
            have: 0,
        }
    }
}

impl FrameBoundaries {
    /// Whether the bytes so far end exactly where a frame does (or are none): a frame of
    /// another sender may go here.
    pub fn at_boundary(&self) -> bool {
        matches!(self.state, State::Header { have: 0, .. })
    }

    /// Whether a Close frame went by: the sender ends the connection, and nothing (not even
    /// another Close) may follow it.
    pub fn closed(&self) -> bool {
        self.closed
    }

    /// Takes in the start of `bytes`, up to and including the end of the next frame that ends
    /// in them: how many bytes it took. All of them when no frame ends there (then
    /// [`at_boundary`](Self::at_boundary) is false, unless `bytes` is empty); fewer when one
    /// does (then it is true, and the rest begins the next frame).
    pub fn step(&mut self, bytes: &[u8]) -> usize {
        let mut taken = 0;
        loop {
            let rest = &bytes[taken..];
            match &mut self.state {
                State::Lost => return bytes.len(),
                State::Payload { left } => {
                    let skip = (*left).min(rest.len() as u64);
                    *left -= skip;
                    taken += skip as usize;
                    if *left == 0 {
                        self.state = State::default();
                    }
                    return taken;
                }
                State::Header { head, have } => {
                    if rest.is_empty() {
                        return taken;
                    }
                    // The first two bytes, then the rest of the length they say.
                    let len = header_len(&head[..*have]).unwrap_or(2);
                    let copy = (len - *have).min(rest.len());
                    head[*have..*have + copy].copy_from_slice(&rest[..copy]);
                    *have += copy;
                    taken += copy;
                    if header_len(&head[..*have]) != Some(*have) {
                        continue;
                    }
                    let (opcode, payload) = (head[0] & 0x0F, payload_len(&head[..len]));
                    self.closed |= opcode == CLOSE;
                    self.state = match payload {
                        None => State::Lost,
                        Some(0) => State::default(),
                        Some(left) => State::Payload { left },
                    };
                    if self.at_boundary() {
                        return taken;
                    }
                }
            }
        }
    }

    /// Takes in all of `bytes`.
    pub fn feed(&mut self, bytes: &[u8]) {
        let mut taken = 0;
        while taken < bytes.len() {
            taken += self.step(&bytes[taken..]);
        }
    }
}

/// A header's whole length, once its first two bytes are known.
fn header_len(head: &[u8]) -> Option<usize> {
    let [_, second, ..] = head else {
        return None;
    };
    let length = match second & 0x7F {
        126 => 2,
        127 => 8,
        _ => 0,
    };
    let mask = if second & 0x80 != 0 { 4 } else { 0 };
    Some(2 + length + mask)
}

/// The payload length a whole header declares; `None` for a 64-bit one with its top bit set.
fn payload_len(head: &[u8]) -> Option<u64> {
    match head[1] & 0x7F {
        126 => Some(u64::from(u16::from_be_bytes([head[2], head[3]]))),
        127 => {
            let len = u64::from_be_bytes(head[2..10].try_into().expect("eight bytes"));
            (len >> 63 == 0).then_some(len)
        }
        short => Some(u64::from(short)),
    }
}

/// A server's Close frame (unmasked, RFC 6455 §5.5.1) with `code` and no reason.
pub fn close_frame(code: u16) -> [u8; 4] {
    let [hi, lo] = code.to_be_bytes();
    [0x80 | CLOSE, 2, hi, lo]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An unmasked frame of `opcode` with `payload`, FIN set unless `more`.
    fn frame(opcode: u8, payload: &[u8], more: bool) -> Vec<u8> {
        let fin = if more { 0 } else { 0x80 };
        let mut out = vec![fin | opcode];
        match payload.len() {
            n if n < 126 => out.push(n as u8),
            n if n <= 0xFFFF => {
                out.push(126);
                out.extend_from_slice(&(n as u16).to_be_bytes());
            }
            n => {
                out.push(127);
                out.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
        out.extend_from_slice(payload);
        out
    }

    /// Every boundary of `stream` read in pieces of `size` bytes, as offsets into it.
    fn boundaries(stream: &[u8], size: usize) -> Vec<usize> {
        let mut frames = FrameBoundaries::default();
        let mut found = Vec::new();
        let mut offset = 0;
        for piece in stream.chunks(size) {
            let mut taken = 0;
            while taken < piece.len() {
                taken += frames.step(&piece[taken..]);
                if frames.at_boundary() {
                    found.push(offset + taken);
                }
            }
            offset += piece.len();
        }
        found
    }

    #[test]
    fn every_frame_ends_where_its_length_says_in_any_pieces() {
        let big = vec![7u8; 70_000];
        let frames = [
            frame(0x1, b"hello", false),
            frame(0x2, &[1; 300], true),
            frame(0x9, b"", false),
            frame(0x0, &big, false),
            frame(0x1, &[2; 125], false),
            frame(0x1, &[3; 126], false),
        ];
        let mut stream = Vec::new();
        let mut ends = Vec::new();
        for f in &frames {
            stream.extend_from_slice(f);
            ends.push(stream.len());
        }
        for size in [1, 2, 3, 7, 13, 14, 4096, stream.len()] {
            assert_eq!(boundaries(&stream, size), ends, "pieces of {size}");
        }
    }

    #[test]
    fn a_masked_header_is_six_to_fourteen_bytes() {
        // A client's frame: the mask bit, a 16-bit length, the key, then the payload.
        let mut masked = vec![0x82, 0x80 | 126, 0x01, 0x00];
        masked.extend_from_slice(&[9, 9, 9, 9]);
        masked.extend_from_slice(&[0; 256]);
        let mut tiny = vec![0x81, 0x80 | 1, 1, 2, 3, 4, b'x'];
        let mut stream = masked.clone();
        stream.append(&mut tiny);
        assert_eq!(boundaries(&stream, 1), [masked.len(), stream.len()]);
    }

    #[test]
    fn mid_frame_is_no_boundary_and_step_stops_at_one() {
        let mut frames = FrameBoundaries::default();
        assert!(frames.at_boundary(), "nothing yet is a boundary");
        let f = frame(0x1, b"abcdef", false);
        frames.feed(&f[..1]);
        assert!(!frames.at_boundary(), "inside a header");
        frames.feed(&f[1..4]);
        assert!(!frames.at_boundary(), "inside a payload");
        let mut next = f[4..].to_vec();
        next.extend_from_slice(&frame(0x1, b"z", false));
        assert_eq!(frames.step(&next), f.len() - 4, "up to the frame's end");
        assert!(frames.at_boundary());
        assert!(!frames.closed());
    }

    #[test]
    fn a_close_frame_is_seen() {
        let mut frames = FrameBoundaries::default();
        frames.feed(&frame(0x1, b"bye", false));
        assert!(!frames.closed());
        frames.feed(&close_frame(1000)[..2]);
        assert!(frames.closed(), "its header says so");
        assert!(!frames.at_boundary());
        frames.feed(&close_frame(1000)[2..]);
        assert!(frames.at_boundary());
    }

    #[test]
    fn a_length_with_its_top_bit_set_is_no_framing() {
        let mut frames = FrameBoundaries::default();
        let mut bad = vec![0x82, 127];
        bad.extend_from_slice(&u64::MAX.to_be_bytes());
        frames.feed(&bad);
        assert!(!frames.at_boundary());
        assert_eq!(frames.step(&frame(0x1, b"ok", false)), 4, "all taken");
        assert!(!frames.at_boundary(), "never a boundary again");
        // The largest length allowed is a length.
        let mut frames = FrameBoundaries::default();
        let mut huge = vec![0x82, 127];
        huge.extend_from_slice(&(u64::MAX >> 1).to_be_bytes());
        frames.feed(&huge);
        assert_eq!(
            frames.state,
            State::Payload {
                left: u64::MAX >> 1
            }
        );
    }

    #[test]
    fn the_close_frame_says_its_code() {
        assert_eq!(close_frame(1001), [0x88, 0x02, 0x03, 0xE9]);
    }
}
