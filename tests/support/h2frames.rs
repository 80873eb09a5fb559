//! A raw HTTP/2 client for tests, frame by frame over a blocking socket (plain, or TLS through
//! any `Read + Write`): it sends exactly the frames a test builds, header blocks included
//! (HPACK by hand, literal and unencoded: what no conforming client would send is sendable),
//! and reads the server's frames back one at a time. The server's header blocks, which the
//! `h2` crate compresses with Huffman codes and its dynamic table, are read with `loona-hpack`.
//!
//! | type | owns |
//! |---|---|
//! | [`Frame`] | one frame as read: its type, flags, stream and payload |
//! | [`Block`] | a header block being built, field by field |
//! | [`Conn`] | one connection: the preface and settings exchange, frames out and in |
//! | [`Answer`] | what one stream got back: status, fields, body, or its reset |
//! | [`Flood`] | what became of a connection written to as fast as it takes, read meanwhile |

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use super::http::{Io, is_timeout};

/// What a client sends first (RFC 9113 §3.4).
pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

// Frame types (RFC 9113 §6).
pub const DATA: u8 = 0x0;
pub const HEADERS: u8 = 0x1;
pub const RST_STREAM: u8 = 0x3;
pub const SETTINGS: u8 = 0x4;
pub const PING: u8 = 0x6;
pub const GOAWAY: u8 = 0x7;
pub const WINDOW_UPDATE: u8 = 0x8;
pub const CONTINUATION: u8 = 0x9;

// Flags.
pub const END_STREAM: u8 = 0x1;
pub const ACK: u8 = 0x1;
pub const END_HEADERS: u8 = 0x4;
pub const PADDED: u8 = 0x8;
pub const PRIORITY: u8 = 0x20;

// Settings (RFC 9113 §6.5.2).
pub const HEADER_TABLE_SIZE: u16 = 0x1;
pub const MAX_CONCURRENT_STREAMS: u16 = 0x3;
pub const INITIAL_WINDOW_SIZE: u16 = 0x4;
pub const MAX_HEADER_LIST_SIZE: u16 = 0x6;

// Error codes (RFC 9113 §7).
pub const NO_ERROR: u32 = 0x0;
pub const PROTOCOL_ERROR: u32 = 0x1;
pub const REFUSED_STREAM: u32 = 0x7;
pub const CANCEL: u32 = 0x8;
pub const ENHANCE_YOUR_CALM: u32 = 0xb;

/// One frame on the wire: its 9-byte header, then `payload`.
pub fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    assert!(payload.len() < 1 << 24, "a frame's length has 24 bits");
    let mut out = Vec::with_capacity(9 + payload.len());
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes()[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// A `SETTINGS` frame carrying `settings`.
pub fn settings(settings: &[(u16, u32)]) -> Vec<u8> {
    let payload: Vec<u8> = settings
        .iter()
        .flat_map(|(id, value)| [&id.to_be_bytes()[..], &value.to_be_bytes()[..]].concat())
        .collect();
    frame(SETTINGS, 0, 0, &payload)
}

/// A `PING` frame carrying `data`.
pub fn ping(data: u64) -> Vec<u8> {
    frame(PING, 0, 0, &data.to_be_bytes())
}

/// An `RST_STREAM` frame for `stream` with error `code`.
pub fn rst_stream(stream: u32, code: u32) -> Vec<u8> {
    frame(RST_STREAM, 0, stream, &code.to_be_bytes())
}

/// A frame as read.
#[derive(Clone, Debug)]
pub struct Frame {
    pub kind: u8,
    pub flags: u8,
    pub stream: u32,
    pub payload: Vec<u8>,
}

impl Frame {
    fn word(&self, at: usize) -> Option<u32> {
        let bytes = self.payload.get(at..at + 4)?;
        Some(u32::from_be_bytes(bytes.try_into().unwrap()))
    }

    /// A `GOAWAY`'s last stream and error code.
    pub fn goaway(&self) -> Option<(u32, u32)> {
        (self.kind == GOAWAY).then(|| (self.word(0).unwrap() & 0x7fff_ffff, self.word(4).unwrap()))
    }

    /// An `RST_STREAM`'s error code.
    pub fn reset_code(&self) -> Option<u32> {
        (self.kind == RST_STREAM).then(|| self.word(0).unwrap())
    }

    /// A `SETTINGS` frame's pairs (none for an acknowledgement).
    pub fn settings(&self) -> Vec<(u16, u32)> {
        assert_eq!(self.kind, SETTINGS);
        self.payload
            .chunks(6)
            .map(|c| {
                let value = u32::from_be_bytes(c[2..6].try_into().unwrap());
                (u16::from_be_bytes([c[0], c[1]]), value)
            })
            .collect()
    }

    /// A `HEADERS` frame's header block fragment, padding and priority taken off.
    fn fragment(&self) -> &[u8] {
        let mut body = &self.payload[..];
        let mut pad = 0;
        if self.kind == HEADERS && self.flags & PADDED != 0 {
            pad = body[0] as usize;
            body = &body[1..];
        }
        if self.kind == HEADERS && self.flags & PRIORITY != 0 {
            body = &body[5..];
        }
        &body[..body.len() - pad]
    }

    /// A `DATA` frame's data, padding taken off.
    fn data(&self) -> &[u8] {
        if self.flags & PADDED == 0 {
            return &self.payload;
        }
        let pad = self.payload[0] as usize;
        &self.payload[1..self.payload.len() - pad]
    }
}

/// Takes the first whole frame off `buf`, when one has arrived.
fn split_frame(buf: &mut Vec<u8>) -> Option<Frame> {
    if buf.len() < 9 {
        return None;
    }
    let len = u32::from_be_bytes([0, buf[0], buf[1], buf[2]]) as usize;
    if buf.len() < 9 + len {
        return None;
    }
    let head: Vec<u8> = buf.drain(..9 + len).collect();
    Some(Frame {
        kind: head[3],
        flags: head[4],
        stream: u32::from_be_bytes(head[5..9].try_into().unwrap()) & 0x7fff_ffff,
        payload: head[9..].to_vec(),
    })
}

/// An HPACK header block (RFC 7541), built representation by representation; strings go
/// unencoded (no Huffman), lengths and indices with HPACK's prefix integers.
#[derive(Clone, Default)]
pub struct Block(Vec<u8>);

impl Block {
    /// A request's pseudo-fields, each a literal without indexing: `:method`, `:scheme`
    /// `http`, `:path`, `:authority`.
    pub fn request(method: &str, path: &str, authority: &str) -> Block {
        Block::request_over("http", method, path, authority)
    }

    /// [`Block::request`] with another `:scheme`.
    pub fn request_over(scheme: &str, method: &str, path: &str, authority: &str) -> Block {
        Block::default()
            .field(":method", method)
            .field(":scheme", scheme)
            .field(":path", path)
            .field(":authority", authority)
    }

    /// A literal field without indexing, its name new (not from a table).
    pub fn field(self, name: &str, value: &str) -> Block {
        self.literal(0x00, name.as_bytes(), value.as_bytes())
    }

    /// A literal field with incremental indexing: the decoder adds it to its dynamic table,
    /// where it is index 62 until the next insertion.
    pub fn inserted(self, name: &str, value: &str) -> Block {
        self.literal(0x40, name.as_bytes(), value.as_bytes())
    }

    /// A field by its index in the static (1–61) or dynamic (62…) table.
    pub fn indexed(mut self, index: u64) -> Block {
        integer(&mut self.0, 0x80, 7, index);
        self
    }

    /// A dynamic table size update to `size`.
    pub fn table_size(mut self, size: u64) -> Block {
        integer(&mut self.0, 0x20, 5, size);
        self
    }

    /// A literal field without indexing whose value is said to be `declared` bytes long, none
    /// of them given: the block goes on with the value's bytes (in `CONTINUATION`s, say).
    pub fn unfinished(mut self, name: &str, declared: u64) -> Block {
        self.0.push(0x00);
        string(&mut self.0, name.as_bytes());
        integer(&mut self.0, 0x00, 7, declared);
        self
    }

    /// This block, then `other`'s representations.
    pub fn then(mut self, other: &Block) -> Block {
        self.0.extend_from_slice(&other.0);
        self
    }

    fn literal(mut self, kind: u8, name: &[u8], value: &[u8]) -> Block {
        self.0.push(kind);
        string(&mut self.0, name);
        string(&mut self.0, value);
        self
    }

    pub fn bytes(&self) -> &[u8] {
        &self.0
    }
}

/// `value` as an HPACK integer with an `n`-bit prefix, the first byte's other bits `high`.
fn integer(out: &mut Vec<u8>, high: u8, n: u32, mut value: u64) {
    let max = (1u64 << n) - 1;
    if value < max {
        out.push(high | value as u8);
        return;
    }
    out.push(high | max as u8);
    value -= max;
    while value >= 128 {
        out.push((value % 128) as u8 | 0x80);
        value /= 128;
    }
    out.push(value as u8);
}

/// A string literal, unencoded: its length (7-bit prefix, H clear), then its bytes.
fn string(out: &mut Vec<u8>, bytes: &[u8]) {
    integer(out, 0x00, 7, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// What one stream got back.
#[derive(Debug, Default)]
pub struct Answer {
    /// The `:status` of its (last) head; 0 when none came.
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// The error code of the `RST_STREAM` that ended it.
    pub reset: Option<u32>,
    /// `END_STREAM` came.
    pub ended: bool,
}

impl Answer {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("{e}: {self:?} {}", String::from_utf8_lossy(&self.body)))
    }

    fn done(&self) -> bool {
        self.ended || self.reset.is_some()
    }
}

/// How reading a connection ended.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum End {
    /// The server closed it (end of stream, or a reset).
    Closed,
    /// Nothing came for the read timeout.
    Silent,
}

/// What a flood did: the bytes it got written, the frames read meanwhile, and how reading
/// ended, when.
#[derive(Debug)]
pub struct Flood {
    pub written: usize,
    pub frames: Vec<Frame>,
    pub end: End,
    /// From the flood's start to the end of reading.
    pub took: Duration,
}

/// A client connection: the preface and `SETTINGS` sent, the server's `SETTINGS` read and
/// acknowledged.
pub struct Conn {
    tcp: TcpStream,
    io: Box<dyn Io>,
    buf: Vec<u8>,
    hpack: loona_hpack::Decoder<'static>,
    /// The settings the server announced first.
    pub server_settings: Vec<(u16, u32)>,
    next_stream: u32,
    /// Over TLS: the socket's bytes are not the frames.
    tls: bool,
}

impl Conn {
    /// An h2c connection (prior knowledge) to `addr` announcing `settings`.
    pub fn open(addr: SocketAddr, settings: &[(u16, u32)]) -> Conn {
        Conn::over_tcp(
            TcpStream::connect(addr).expect("connect to the node"),
            settings,
        )
    }

    /// An h2c connection over a socket the caller made (with small buffers, say).
    pub fn over_tcp(tcp: TcpStream, settings: &[(u16, u32)]) -> Conn {
        let io = Box::new(tcp.try_clone().unwrap());
        Conn::start(tcp, io, false, settings)
    }

    /// A connection whose bytes go through `io`, a TLS session over `tcp` that chose `h2`.
    pub fn over_tls(tcp: TcpStream, io: Box<dyn Io>, settings: &[(u16, u32)]) -> Conn {
        Conn::start(tcp, io, true, settings)
    }

    fn start(tcp: TcpStream, io: Box<dyn Io>, tls: bool, ours: &[(u16, u32)]) -> Conn {
        tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        tcp.set_nodelay(true).unwrap();
        let mut conn = Conn {
            tcp,
            io,
            buf: Vec::new(),
            hpack: loona_hpack::Decoder::new(),
            server_settings: Vec::new(),
            next_stream: 1,
            tls,
        };
        conn.send(&[PREFACE, &settings(ours)].concat())
            .expect("send the preface");
        loop {
            let frame = conn
                .read_frame()
                .expect("the server's SETTINGS")
                .expect("the server's SETTINGS, not a close");
            if frame.kind == SETTINGS && frame.flags & ACK == 0 {
                conn.server_settings = frame.settings();
                conn.send(&frame_ack()).expect("acknowledge SETTINGS");
                return conn;
            }
        }
    }

    pub fn set_read_timeout(&self, limit: Duration) {
        self.tcp.set_read_timeout(Some(limit)).unwrap();
    }

    pub fn send(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.io.write_all(bytes)?;
        self.io.flush()
    }

    /// The next client stream's id (odd, increasing), taken.
    pub fn next_stream(&mut self) -> u32 {
        let id = self.next_stream;
        self.next_stream += 2;
        id
    }

    /// `HEADERS` on `stream` carrying the whole of `block` (`END_HEADERS`), and `END_STREAM`
    /// when `end`.
    pub fn headers(&mut self, stream: u32, block: &Block, end: bool) {
        let flags = END_HEADERS | if end { END_STREAM } else { 0 };
        self.send(&frame(HEADERS, flags, stream, block.bytes()))
            .expect("send HEADERS");
    }

    /// A request of `block` on a new stream, without a body: its stream.
    pub fn request(&mut self, block: &Block) -> u32 {
        let stream = self.next_stream();
        self.headers(stream, block, true);
        stream
    }

    pub fn data(&mut self, stream: u32, data: &[u8], end: bool) {
        let flags = if end { END_STREAM } else { 0 };
        self.send(&frame(DATA, flags, stream, data))
            .expect("send DATA");
    }

    /// The next frame; `None` when the server closed the connection (end of stream or reset).
    /// An error when nothing came for the read timeout.
    pub fn read_frame(&mut self) -> std::io::Result<Option<Frame>> {
        let mut chunk = [0u8; 16384];
        loop {
            if let Some(frame) = split_frame(&mut self.buf) {
                return Ok(Some(frame));
            }
            match self.io.read(&mut chunk) {
                Ok(0) => return Ok(None),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if is_timeout(&e) => return Err(e),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return Ok(None),
            }
        }
    }

    /// Frames until the server closes the connection, or `End::Silent` when nothing came for
    /// the read timeout.
    pub fn until_closed(&mut self) -> (Vec<Frame>, End) {
        let mut frames = Vec::new();
        loop {
            match self.read_frame() {
                Ok(Some(frame)) => frames.push(frame),
                Ok(None) => return (frames, End::Closed),
                Err(_) => return (frames, End::Silent),
            }
        }
    }

    /// Reads until each of `streams` has ended or been reset (or the connection closed): what
    /// each got, in their order. The server's `SETTINGS` are acknowledged and the data taken
    /// given back as window; a `GOAWAY` read is returned with them.
    pub fn answers(&mut self, streams: &[u32]) -> (Vec<Answer>, Option<(u32, u32)>) {
        let mut answers: Vec<Answer> = streams.iter().map(|_| Answer::default()).collect();
        let mut goaway = None;
        let mut block: Option<(u32, Vec<u8>, bool)> = None;
        while !answers.iter().all(Answer::done) {
            let Some(frame) = self.read_frame().unwrap_or_else(|e| {
                panic!("waiting for streams {streams:?}: {e}; so far {answers:?}")
            }) else {
                break;
            };
            let at = streams.iter().position(|s| *s == frame.stream);
            match frame.kind {
                SETTINGS if frame.flags & ACK == 0 => {
                    self.send(&frame_ack()).expect("acknowledge SETTINGS");
                }
                GOAWAY => goaway = frame.goaway(),
                HEADERS | CONTINUATION => {
                    let (stream, mut fragment, end) = match block.take() {
                        Some(partial) => partial,
                        None => (frame.stream, Vec::new(), frame.flags & END_STREAM != 0),
                    };
                    fragment.extend_from_slice(frame.fragment());
                    if frame.flags & END_HEADERS == 0 {
                        block = Some((stream, fragment, end));
                        continue;
                    }
                    let fields = self.hpack.decode(&fragment).expect("the server's HPACK");
                    let Some(answer) = streams
                        .iter()
                        .position(|s| *s == stream)
                        .map(|i| &mut answers[i])
                    else {
                        continue;
                    };
                    for (name, value) in fields {
                        let (name, value) = (
                            String::from_utf8(name).unwrap(),
                            String::from_utf8(value).unwrap(),
                        );
                        if name == ":status" {
                            answer.status = value.parse().unwrap();
                        } else {
                            answer.headers.push((name, value));
                        }
                    }
                    answer.ended |= end;
                }
                DATA => {
                    let taken = frame.payload.len() as u32;
                    if taken > 0 {
                        let mut update = frame_update(0, taken);
                        if frame.flags & END_STREAM == 0 {
                            update.extend(frame_update(frame.stream, taken));
                        }
                        let _ = self.send(&update);
                    }
                    if let Some(i) = at {
                        answers[i].body.extend_from_slice(frame.data());
                        answers[i].ended |= frame.flags & END_STREAM != 0;
                    }
                }
                RST_STREAM => {
                    if let Some(i) = at {
                        answers[i].reset = frame.reset_code();
                    }
                }
                _ => {}
            }
        }
        (answers, goaway)
    }

    /// One request on a new stream and what it got.
    pub fn exchange(&mut self, block: &Block) -> Answer {
        let stream = self.request(block);
        let (mut answers, _) = self.answers(&[stream]);
        answers.pop().unwrap()
    }

    /// Writes what `next` gives (the flood's `i`th piece, until `None`) as fast as the
    /// connection takes it while another thread reads the server's frames; writing stops at
    /// the first error (the server closed), reading at the server's close or after the read
    /// timeout of silence. Plain connections only.
    pub fn flood(self, mut next: impl FnMut(usize) -> Option<Vec<u8>>) -> Flood {
        assert!(
            !self.tls,
            "a flood reads the socket beside the writer: h2c only"
        );
        let start = Instant::now();
        let mut reader = self.tcp.try_clone().unwrap();
        let mut buf = self.buf;
        let reading = std::thread::spawn(move || {
            let mut frames = Vec::new();
            let mut chunk = [0u8; 65536];
            let end = loop {
                while let Some(frame) = split_frame(&mut buf) {
                    frames.push(frame);
                }
                match reader.read(&mut chunk) {
                    Ok(0) => break End::Closed,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    Err(e) if is_timeout(&e) => break End::Silent,
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(_) => break End::Closed,
                }
            };
            (frames, end, start.elapsed())
        });
        let mut writer = self.tcp;
        writer
            .set_write_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut written = 0;
        let mut i = 0;
        while let Some(piece) = next(i) {
            if writer.write_all(&piece).is_err() {
                break;
            }
            written += piece.len();
            i += 1;
        }
        let (frames, end, took) = reading.join().unwrap();
        Flood {
            written,
            frames,
            end,
            took,
        }
    }

    /// Writes what `next` gives without ever reading, each write bounded by a short timeout
    /// and tried again where it stopped, until the connection fails (the server closed it) or
    /// `limit` passes: (bytes written, when writes first stalled, when the connection failed).
    /// Plain connections only.
    pub fn stall(
        self,
        limit: Duration,
        mut next: impl FnMut(usize) -> Vec<u8>,
    ) -> (usize, Option<Instant>, Option<Instant>) {
        assert!(!self.tls, "a stall writes the socket itself: h2c only");
        let mut socket = self.tcp;
        socket
            .set_write_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let deadline = Instant::now() + limit;
        let (mut written, mut stalled) = (0, None);
        let mut i = 0;
        while Instant::now() < deadline {
            let piece = next(i);
            i += 1;
            let mut at = 0;
            while at < piece.len() {
                match socket.write(&piece[at..]) {
                    Ok(n) => {
                        at += n;
                        written += n;
                    }
                    Err(e) if is_timeout(&e) || e.kind() == ErrorKind::Interrupted => {
                        stalled.get_or_insert_with(Instant::now);
                        if Instant::now() >= deadline {
                            return (written, stalled, None);
                        }
                    }
                    Err(_) => return (written, stalled, Some(Instant::now())),
                }
            }
        }
        (written, stalled, None)
    }
}

fn frame_ack() -> Vec<u8> {
    frame(SETTINGS, ACK, 0, &[])
}

/// A `WINDOW_UPDATE` giving `stream` (0: the connection) `n` more bytes.
pub fn frame_update(stream: u32, n: u32) -> Vec<u8> {
    frame(WINDOW_UPDATE, 0, stream, &n.to_be_bytes())
}
