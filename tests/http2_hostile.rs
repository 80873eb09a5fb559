//! Hostile HTTP/2 clients against the real node (h2c by prior knowledge, and once over TLS by
//! ALPN), frame by frame with [`support::h2frames`]: each attack is stopped the way
//! `http1/src/h2.rs` says (`GOAWAY` with its code, `RST_STREAM`, 431, or a close) within a
//! bound, the node's memory stays bounded where the attack aims at it, and right after, a
//! well-behaved HTTP/2 request and an HTTP/1.1 one still reach the worker.

mod support;

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use support::attest::claims_of;
use support::fleet::Fixture;
use support::h2frames::*;
use support::http::{get, tight_client};
use support::node::eventually;
use support::worker::{Serve, TestWorker};

/// What an attack may add to the node's resident memory.
const RSS_SLACK: u64 = 32 << 20;

/// A node taking h2c (past its cold start, one echoing worker on `/threads`), attacked: its
/// address, and its memory before.
struct Target {
    f: Fixture,
    worker: TestWorker,
    addr: SocketAddr,
    rss_before: u64,
}

impl Target {
    fn new(env: &[(&str, &str)]) -> Target {
        let env = [env, &[("PINBOARD_HTTP__H2C", "true")]].concat();
        let (f, worker, _) = Fixture::with_worker(&env, "hostile");
        Target {
            addr: f.node.addr,
            rss_before: f.node.rss_bytes(),
            f,
            worker,
        }
    }

    /// The paths the worker has been sent.
    fn forwarded(&self) -> BTreeSet<String> {
        self.worker.requests().into_iter().map(|r| r.path).collect()
    }

    /// The node's memory now, which has not grown past the slack.
    fn rss_bounded(&self) -> u64 {
        let (before, now) = (self.rss_before, self.f.node.rss_bytes());
        assert!(now < before + RSS_SLACK, "RSS {before} -> {now}");
        now
    }

    /// After the attack: none of `refused` reached the worker, the node's memory stayed
    /// bounded, and a fresh, well-behaved HTTP/2 connection and an HTTP/1.1 request each reach
    /// the worker (at `path` and a sibling of it).
    fn held(&self, refused: &[&str], path: &str) {
        let seen = self.forwarded();
        for cut in refused {
            assert!(!seen.contains(*cut), "{cut} reached the worker");
        }
        let now = self.rss_bounded();
        eprintln!(
            "node RSS {} MiB before, {} MiB after",
            self.rss_before >> 20,
            now >> 20
        );
        let (addr, log) = (self.addr, || self.f.node.log());
        let answer = Conn::open(addr, &[]).exchange(&get_block(addr, path));
        assert_eq!(answer.status, 200, "{answer:?}\n{}", log());
        assert_eq!(answer.json()["path"], path);
        let reply = get(addr, &format!("{path}/h1"), None);
        assert_eq!(reply.status, 200, "{}\n{}", reply.text(), log());
    }
}

/// A `GET path` for the node at `addr`.
fn get_block(addr: SocketAddr, path: &str) -> Block {
    Block::request("GET", path, &addr.to_string())
}

/// A request of `block` on `conn` and its answer, which has `status`.
fn exchanged(conn: &mut Conn, block: &Block, status: u16) -> Answer {
    let answer = conn.exchange(block);
    assert_eq!(answer.status, status, "{answer:?}");
    answer
}

/// The server's first SETTINGS said `id` = `value`.
fn announced(conn: &Conn, id: u16, value: u32) {
    let settings = &conn.server_settings;
    assert!(settings.contains(&(id, value)), "{settings:?}");
}

/// The server sent `GOAWAY` with `code` among `frames`, and closed the connection.
fn went_away(frames: &[Frame], end: End, code: u32) {
    let goaway = frames.iter().find_map(Frame::goaway);
    assert_eq!(goaway.map(|(_, code)| code), Some(code), "{frames:?}");
    assert_eq!(end, End::Closed, "{frames:?}");
}

/// The server sends `GOAWAY` with `code` on `conn`, then closes it.
fn goes_away(conn: &mut Conn, code: u32) {
    let (frames, end) = conn.until_closed();
    went_away(&frames, end, code);
}

/// [`went_away`] for a flood, told first.
fn flood_went_away(what: &str, flood: &Flood, code: u32) {
    let goaways: Vec<_> = flood.frames.iter().filter_map(Frame::goaway).collect();
    eprintln!(
        "{what}: {} KiB written, {} frames back, GOAWAY {goaways:?}, {:?} after {:?}",
        flood.written >> 10,
        flood.frames.len(),
        flood.end,
        flood.took
    );
    went_away(&flood.frames, flood.end, code);
}

#[test]
fn streams_past_the_limit_are_refused_while_the_first_are_served() {
    let t = Target::new(&[("PINBOARD_HTTP__H2_MAX_STREAMS", "4")]);
    let addr = t.addr;
    let mut conn = Conn::open(addr, &[]);
    announced(&conn, MAX_CONCURRENT_STREAMS, 4);
    // Four uploads left open (no END_STREAM): four streams in flight.
    let open: Vec<u32> = (0..4)
        .map(|i| {
            let stream = conn.next_stream();
            let post = Block::request("POST", &format!("/threads/ms-{i}/up"), &addr.to_string());
            conn.headers(stream, &post, false);
            stream
        })
        .collect();
    let fifth = conn.request(&get_block(addr, "/threads/ms-5/refused"));
    let (answers, goaway) = conn.answers(&[fifth]);
    // RFC 9113 §5.1.2: a stream past the limit is a stream error, REFUSED_STREAM (safe to
    // retry: nothing of it was processed).
    assert_eq!(answers[0].reset, Some(REFUSED_STREAM), "{answers:?}");
    assert_eq!(answers[0].status, 0);
    assert_eq!(goaway, None);
    for (i, stream) in open.iter().enumerate() {
        conn.data(*stream, format!("body-{i}").as_bytes(), true);
    }
    let (answers, _) = conn.answers(&open);
    for (i, answer) in answers.iter().enumerate() {
        assert_eq!(answer.status, 200, "{answer:?}\n{}", t.f.node.log());
        let echo = answer.json();
        assert_eq!(echo["path"], format!("/threads/ms-{i}/up"));
        assert_eq!(echo["body"], format!("body-{i}"));
    }
    // The four done, a new stream is served on the same connection.
    exchanged(&mut conn, &get_block(addr, "/threads/ms-6/after"), 200);
    t.held(&["/threads/ms-5/refused"], "/threads/ms-7/x");
}

#[test]
fn rapid_reset_gets_enhance_your_calm_and_a_close() {
    let t = Target::new(&[]);
    let block = get_block(t.addr, "/threads/rr/x");
    // 20,000 streams, each opened and cancelled at once (CVE-2023-44487), 100 to a write.
    let flood = Conn::open(t.addr, &[]).flood(|i| {
        (i < 200).then(|| {
            (0..100u32)
                .flat_map(|k| {
                    let stream = 1 + 2 * (i as u32 * 100 + k);
                    [
                        frame(HEADERS, END_HEADERS | END_STREAM, stream, block.bytes()),
                        rst_stream(stream, CANCEL),
                    ]
                    .concat()
                })
                .collect()
        })
    });
    flood_went_away("rapid reset", &flood, ENHANCE_YOUR_CALM);
    assert!(flood.took < Duration::from_secs(10), "{:?}", flood.took);
    // Most of the streams never reached the worker.
    let reached = t.worker.requests().len();
    eprintln!("the worker saw {reached}");
    assert!(reached < 1000, "{reached}");
    t.held(&[], "/threads/rr-after/x");
}

#[test]
fn streams_reset_once_accepted_are_capped_at_twice_the_limit() {
    let t = Target::new(&[("PINBOARD_HTTP__H2_MAX_STREAMS", "4")]);
    t.worker.set_serve(Serve::Hang);
    let mut conn = Conn::open(t.addr, &[]);
    // Each stream accepted (the worker holds it), then reset: it no longer counts against
    // the limit of 4, but its answer is still being made.
    for i in 0..8 {
        let path = format!("/threads/cap-{i}/x");
        let stream = conn.request(&get_block(t.addr, &path));
        let reached = eventually(Duration::from_secs(10), || t.forwarded().contains(&path));
        assert!(
            reached,
            "{path} never reached the worker:\n{}",
            t.f.node.log()
        );
        conn.send(&rst_stream(stream, CANCEL)).unwrap();
    }
    // Eight such answers in the making: the ninth stream is one too many.
    conn.request(&get_block(t.addr, "/threads/cap-8/x"));
    goes_away(&mut conn, ENHANCE_YOUR_CALM);
    t.worker.set_serve(Serve::Echo);
    t.held(&["/threads/cap-8/x"], "/threads/cap-after/x");
}

/// The first frame of a header block never ended: a request's fields, no `END_HEADERS`.
fn unended_headers(addr: SocketAddr, path: &str) -> Vec<u8> {
    frame(HEADERS, 0, 1, get_block(addr, path).bytes())
}

/// `block` on stream 1: its first frame `HEADERS` (`END_STREAM` when `end`), then `n`
/// `CONTINUATION`s of `piece` each, the last with `END_HEADERS`.
fn in_pieces(block: &Block, piece: &Block, n: usize, end: bool) -> Vec<u8> {
    let mut bytes = frame(HEADERS, if end { END_STREAM } else { 0 }, 1, block.bytes());
    for i in 1..=n {
        let flags = if i == n { END_HEADERS } else { 0 };
        bytes.extend(frame(CONTINUATION, flags, 1, piece.bytes()));
    }
    bytes
}

#[test]
fn a_continuation_flood_is_cut_off_whatever_its_frames() {
    let t = Target::new(&[]);
    let addr = t.addr;

    // Endless tiny CONTINUATIONs, each a whole field (CVE-2024-27316).
    let tiny = Block::default().field("x-c", "v");
    let flood = Conn::open(addr, &[]).flood(|i| match i {
        0 => Some(unended_headers(addr, "/threads/cf-tiny/x")),
        1..100_000 => Some(frame(CONTINUATION, 0, 1, tiny.bytes())),
        _ => None,
    });
    flood_went_away("tiny", &flood, ENHANCE_YOUR_CALM);

    // Endless full-size CONTINUATIONs: one field's value, declared 64 MiB long, arriving
    // 16 KiB at a time.
    let opening = get_block(addr, "/threads/cf-large/x").unfinished("x-big", 64 << 20);
    let filler = vec![b'a'; 16384];
    let flood = Conn::open(addr, &[]).flood(|i| match i {
        0 => Some(frame(HEADERS, 0, 1, opening.bytes())),
        1..4096 => Some(frame(CONTINUATION, 0, 1, &filler)),
        _ => None,
    });
    flood_went_away("large", &flood, ENHANCE_YOUR_CALM);
    assert!(
        flood.written < 32 << 20,
        "the node took {} B",
        flood.written
    );

    // END_HEADERS does come, but after a thousand CONTINUATIONs: cut off before it.
    let mut conn = Conn::open(addr, &[]);
    let late = get_block(addr, "/threads/cf-late/x");
    let _ = conn.send(&in_pieces(&late, &tiny, 1000, true));
    goes_away(&mut conn, ENHANCE_YOUR_CALM);

    // A block in a few pieces is no flood: served.
    let mut conn = Conn::open(addr, &[]);
    let few = get_block(addr, "/threads/cf-ok/x");
    conn.send(&in_pieces(&few, &tiny, 3, true)).unwrap();
    let (answers, _) = conn.answers(&[1]);
    assert_eq!(answers[0].status, 200, "{answers:?}");
    let seen = t.worker.requests().pop().unwrap();
    assert_eq!(seen.path, "/threads/cf-ok/x");
    let fields = seen.headers.iter().filter(|(n, _)| n == "x-c").count();
    assert_eq!(fields, 3, "{seen:?}");

    let cut = [
        "/threads/cf-tiny/x",
        "/threads/cf-large/x",
        "/threads/cf-late/x",
    ];
    t.held(&cut, "/threads/cf-after/x");
}

#[test]
fn a_header_list_past_the_limit_is_431_and_the_connection_serves_on() {
    let t = Target::new(&[("PINBOARD_HTTP__MAX_HEADER_BYTES", "4096")]);
    let mut conn = Conn::open(t.addr, &[]);
    announced(&conn, MAX_HEADER_LIST_SIZE, 4096);
    let big = get_block(t.addr, "/threads/big/x").field("x-big", &"a".repeat(8000));
    exchanged(&mut conn, &big, 431);
    exchanged(&mut conn, &get_block(t.addr, "/threads/big/y"), 200);
    t.held(&["/threads/big/x"], "/threads/big-after/x");
}

#[test]
fn an_hpack_bomb_is_refused_and_the_table_stays_in_step() {
    let t = Target::new(&[]);
    let addr = t.addr;
    let value = "b".repeat(4000);
    // A block inserting one entry of 4 KB into the dynamic table, then referring to it
    // `refs` more times.
    let bomb = |path: &str, refs: usize| {
        let inserted = get_block(addr, path).inserted("x-bomb", &value);
        (0..refs).fold(inserted, |block, _| block.indexed(62))
    };

    // Mild: 20 KB decoded, past the 16 KiB list: 431 for that stream, and the entry stays in
    // the table for the next.
    let mut conn = Conn::open(addr, &[]);
    exchanged(&mut conn, &bomb("/threads/bomb/mild", 4), 431);
    let next = get_block(addr, "/threads/bomb/next").indexed(62);
    let served = exchanged(&mut conn, &next, 200);
    assert_eq!(served.json()["headers"]["x-bomb"], value.as_str());

    // Full: 10,000 references in one block (40 MB decoded), on ten connections: each goes
    // away at once.
    let full = bomb("/threads/bomb/full", 10_000);
    for _ in 0..10 {
        let mut conn = Conn::open(addr, &[]);
        conn.headers(1, &full, true);
        goes_away(&mut conn, ENHANCE_YOUR_CALM);
    }

    // A dynamic table size update past SETTINGS_HEADER_TABLE_SIZE (4096, the default): a
    // connection error. The h2 crate answers every HPACK decoding failure with
    // PROTOCOL_ERROR, not RFC 7541's COMPRESSION_ERROR.
    let mut conn = Conn::open(addr, &[]);
    let resize = Block::default()
        .table_size(1 << 20)
        .then(&get_block(addr, "/threads/bomb/resize"));
    conn.headers(1, &resize, true);
    goes_away(&mut conn, PROTOCOL_ERROR);

    let cut = [
        "/threads/bomb/mild",
        "/threads/bomb/full",
        "/threads/bomb/resize",
    ];
    t.held(&cut, "/threads/bomb-after/x");
}

/// A client that floods `piece`s and never reads: the node stops reading once its answers
/// (PING acknowledgements, SETTINGS acknowledgements) cannot be written, and the write timeout
/// (1 s) closes the connection; the node's memory meanwhile bounded.
fn flood_unread(t: &Target, what: &str, piece: &[u8]) {
    let mut peak = 0;
    let start = Instant::now();
    let conn = Conn::over_tcp(tight_client(t.addr), &[]);
    let batch = piece.repeat(1000);
    let (written, stalled, failed) = conn.stall(Duration::from_secs(30), |i| {
        if i % 64 == 0 {
            peak = peak.max(t.rss_bounded());
        }
        batch.clone()
    });
    eprintln!(
        "{what}: {} KiB written, stalled after {:?}, closed after {:?}; RSS peak {} MiB",
        written >> 10,
        stalled.map(|at| at - start),
        failed.map(|at| at - start),
        peak >> 20
    );
    let stalled = stalled.expect("the node stopped reading");
    let failed = failed.unwrap_or_else(|| panic!("{what}: still open\n{}", t.f.node.log()));
    // The node's writes stalled before ours did.
    assert!(failed - stalled < Duration::from_secs(10), "{what}");
}

#[test]
fn ping_and_settings_floods_unread_are_held_back_then_closed_by_the_write_timeout() {
    let t = Target::new(&[("PINBOARD_HTTP__WRITE_TIMEOUT_MS", "1000")]);
    flood_unread(&t, "PING flood", &ping(0x0102_0304_0506_0708));
    t.held(&[], "/threads/ping-after/x");
    flood_unread(
        &t,
        "SETTINGS flood",
        &settings(&[(HEADER_TABLE_SIZE, 4096)]),
    );
    t.held(&[], "/threads/settings-after/x");
}

#[test]
fn a_stream_given_no_window_is_reset_after_the_write_timeout() {
    let t = Target::new(&[("PINBOARD_HTTP__WRITE_TIMEOUT_MS", "1000")]);
    let mut conn = Conn::open(t.addr, &[(INITIAL_WINDOW_SIZE, 0)]);
    let start = Instant::now();
    let stream = conn.request(&get_block(t.addr, "/threads/zw/x"));
    let (answers, goaway) = conn.answers(&[stream]);
    let took = start.elapsed();
    eprintln!("{answers:?} {goaway:?} after {took:?}");
    // The head goes (HEADERS are not flow-controlled), the body cannot: reset.
    assert_eq!(answers[0].status, 200, "{answers:?}");
    assert!(answers[0].body.is_empty());
    assert_eq!(answers[0].reset, Some(CANCEL), "{answers:?}");
    assert!(took >= Duration::from_millis(900), "{took:?}");
    assert!(took < Duration::from_secs(10), "{took:?}");
    assert!(t.forwarded().contains("/threads/zw/x"));
    // The instance's worker connection was let go: the same instance answers at once.
    t.held(&[], "/threads/zw");
}

#[test]
fn an_endless_answer_to_a_client_that_opens_windows_but_reads_nothing_is_held_back() {
    let t = Target::new(&[("PINBOARD_HTTP__WRITE_TIMEOUT_MS", "1000")]);
    t.worker.set_serve(Serve::Endless);
    // Windows as large as HTTP/2 allows, so only the socket holds the answer back.
    let most = 0x7fff_ffff;
    let mut conn = Conn::over_tcp(tight_client(t.addr), &[(INITIAL_WINDOW_SIZE, most)]);
    conn.send(&frame_update(0, most - 65_535)).unwrap();
    let stream = conn.request(&get_block(t.addr, "/threads/endless/x"));
    assert!(eventually(Duration::from_secs(5), || t.worker.streamed().1 == 1));
    let mut peak = 0;
    let released = eventually(Duration::from_secs(15), || {
        peak = peak.max(t.rss_bounded());
        t.worker.streamed().1 == 0
    });
    let (streamed, _) = t.worker.streamed();
    eprintln!(
        "the worker wrote {} MiB; node RSS at most {} MiB",
        streamed >> 20,
        peak >> 20
    );
    assert!(released, "the worker is still writing:\n{}", t.f.node.log());
    // Loopback moves gigabytes a second: a node that buffered would be far past this.
    assert!(streamed < 64 << 20, "the worker wrote {streamed} bytes");
    // Reading at last: the stream was reset (or the connection closed), never ended as if
    // whole.
    let (answers, _) = conn.answers(&[stream]);
    let answer = &answers[0];
    eprintln!("{} B, reset {:?}", answer.body.len(), answer.reset);
    assert!(!answer.ended, "{} B", answer.body.len());
    assert!(answer.reset.is_none_or(|code| code == CANCEL), "{answer:?}");
    t.worker.set_serve(Serve::Echo);
    t.held(&[], "/threads/endless-after/x");
}

/// Reads `conn` until the server closes it (20 s at most), from `start`, sending a `PING`
/// every 300 ms when `pinging`: the frames read, how reading ended, and when.
fn until_closed_from(
    conn: &mut Conn,
    start: Instant,
    pinging: bool,
) -> (Vec<Frame>, End, Duration) {
    conn.set_read_timeout(Duration::from_millis(100));
    let (mut frames, mut pinged) = (Vec::new(), start);
    let end = loop {
        if start.elapsed() > Duration::from_secs(20) {
            break End::Silent;
        }
        if pinging && pinged.elapsed() >= Duration::from_millis(300) {
            let _ = conn.send(&ping(frames.len() as u64));
            pinged = Instant::now();
        }
        match conn.read_frame() {
            Ok(Some(frame)) => frames.push(frame),
            Ok(None) => break End::Closed,
            Err(_) => {}
        }
    };
    (frames, end, start.elapsed())
}

/// Gone away as an idle connection does, after the idle timeout (1.5 s) and well before ten:
/// `GOAWAY` `NO_ERROR`, then the close.
fn closed_as_idle(frames: &[Frame], end: End, took: Duration) {
    eprintln!("{frames:?} {end:?} after {took:?}");
    went_away(frames, end, NO_ERROR);
    assert!(took >= Duration::from_millis(1000), "{took:?}");
    assert!(took < Duration::from_secs(10), "{took:?}");
}

#[test]
fn a_preface_or_header_block_left_unfinished_is_closed_by_the_timeouts() {
    let t = Target::new(&[
        ("PINBOARD_HTTP__IDLE_TIMEOUT_MS", "1500"),
        ("PINBOARD_HTTP__HEADER_TIMEOUT_MS", "1500"),
    ]);
    // Half the preface, then silence: neither HTTP/2 nor HTTP/1.1 yet, closed by the header
    // timeout without a word.
    let mut raw = TcpStream::connect(t.addr).unwrap();
    raw.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let start = Instant::now();
    raw.write_all(&PREFACE[..10]).unwrap();
    let mut answer = Vec::new();
    let read = raw.read_to_end(&mut answer);
    let took = start.elapsed();
    assert!(read.is_ok(), "{read:?} after {took:?}");
    assert!(answer.is_empty(), "{answer:?}");
    assert!(took >= Duration::from_millis(1000), "{took:?}");
    assert!(took < Duration::from_secs(10), "{took:?}");

    let mut conn = Conn::open(t.addr, &[]);
    let start = Instant::now();
    // Nothing may come between a block's frames (not even a PING): silence.
    conn.send(&unended_headers(t.addr, "/threads/slow/x"))
        .unwrap();
    let (frames, end, took) = until_closed_from(&mut conn, start, false);
    closed_as_idle(&frames, end, took);

    // PINGs alone, every 300 ms: answered, but no stream is open, so the connection is idle
    // all the same.
    let mut conn = Conn::open(t.addr, &[]);
    let (frames, end, took) = until_closed_from(&mut conn, Instant::now(), true);
    let pongs = frames
        .iter()
        .filter(|f| f.kind == PING && f.flags & ACK != 0);
    assert!(pongs.count() >= 3, "{frames:?}");
    closed_as_idle(&frames, end, took);
    t.held(&["/threads/slow/x"], "/threads/slow-after/x");
}

/// How the node must refuse a head.
#[derive(Debug, PartialEq)]
enum Refusal {
    /// 400 `{"error":"bad request"}` on the stream.
    BadRequest,
    /// `RST_STREAM` with this code.
    Reset(u32),
    /// `GOAWAY` with this code, and a close.
    GoAway(u32),
}

/// What became of a request of `block` on a fresh connection.
fn refusal(addr: SocketAddr, block: &Block) -> Refusal {
    let mut conn = Conn::open(addr, &[]);
    let stream = conn.request(block);
    let (mut answers, goaway) = conn.answers(&[stream]);
    let answer = answers.pop().unwrap();
    if let Some(code) = answer.reset {
        return Refusal::Reset(code);
    }
    if let Some((_, code)) = goaway {
        assert_eq!(conn.until_closed().1, End::Closed);
        return Refusal::GoAway(code);
    }
    assert_eq!(answer.status, 400, "{answer:?}");
    assert_eq!(answer.json(), serde_json::json!({"error": "bad request"}));
    Refusal::BadRequest
}

#[test]
fn hostile_heads_are_refused_never_forwarded() {
    use Refusal::{BadRequest, GoAway, Reset};
    let t = Target::new(&[]);
    let addr = t.addr;
    let authority = addr.to_string();
    // A clean GET with one field added: (what, name, value, refusal).
    let fields = [
        (
            "host other than :authority",
            "host",
            "elsewhere.example",
            BadRequest,
        ),
        (
            "te other than trailers",
            "te",
            "gzip",
            Reset(PROTOCOL_ERROR),
        ),
        (
            "a list for content-length",
            "content-length",
            "1, 2",
            Reset(PROTOCOL_ERROR),
        ),
        (
            "transfer-encoding",
            "transfer-encoding",
            "chunked",
            Reset(PROTOCOL_ERROR),
        ),
        (
            "connection",
            "connection",
            "keep-alive",
            Reset(PROTOCOL_ERROR),
        ),
        // Refused by the HPACK decoder itself: connection errors.
        ("an uppercase name", "X-Upper", "1", GoAway(PROTOCOL_ERROR)),
        (
            "a smuggled request",
            "x-s",
            "a\r\nGET /threads/hh-s/y HTTP/1.1",
            GoAway(PROTOCOL_ERROR),
        ),
    ];
    for (i, (what, name, value, expected)) in fields.into_iter().enumerate() {
        let block = get_block(addr, &format!("/threads/hh-f{i}/x")).field(name, value);
        assert_eq!(refusal(addr, &block), expected, "{what}");
    }
    let twice = get_block(addr, "/threads/hh-twice/x")
        .field("host", &authority)
        .field("host", &authority);
    assert_eq!(refusal(addr, &twice), BadRequest, "two host fields");
    // Pseudo-fields of their own: (what, :scheme, :path, :authority, refusal).
    let evil = format!("evil@{authority}");
    let pseudo = [
        (
            "userinfo in :authority",
            "http",
            "/threads/hh-p0/x",
            &evil,
            BadRequest,
        ),
        (
            "another :scheme",
            "ftp",
            "/threads/hh-p1/x",
            &authority,
            BadRequest,
        ),
        (
            "a space in :path",
            "http",
            "/threads/hh-p2/x y",
            &authority,
            Reset(PROTOCOL_ERROR),
        ),
        (
            "a CR in :path",
            "http",
            "/threads/hh-p3/x\r",
            &authority,
            Reset(PROTOCOL_ERROR),
        ),
    ];
    for (what, scheme, path, authority, expected) in pseudo {
        let block = Block::request_over(scheme, "GET", path, authority);
        assert_eq!(refusal(addr, &block), expected, "{what}");
    }

    // A body other than its Content-Length says, shorter and longer: the stream's error; the
    // worker never gets a whole request.
    for (i, (length, sent)) in [("10", "abc"), ("3", "abcdef")].into_iter().enumerate() {
        let mut conn = Conn::open(addr, &[]);
        let path = format!("/threads/hh-cl{i}/x");
        let post = Block::request("POST", &path, &authority).field("content-length", length);
        let stream = conn.next_stream();
        conn.headers(stream, &post, false);
        conn.data(stream, sent.as_bytes(), true);
        let (answers, _) = conn.answers(&[stream]);
        assert_eq!(answers[0].reset, Some(PROTOCOL_ERROR), "{answers:?}");
        assert_eq!(answers[0].status, 0, "{answers:?}");
    }

    // Pinboard's own headers from a client are dropped: the worker sees the node's.
    let mut conn = Conn::open(addr, &[]);
    let forged = get_block(addr, "/threads/hh-own/x")
        .field("pinboard-epoch", "999999")
        .field("pinboard-attestation", "forged.forged.forged");
    exchanged(&mut conn, &forged, 200);
    let requests = t.worker.requests();
    let seen = requests
        .iter()
        .find(|r| r.path == "/threads/hh-own/x")
        .unwrap();
    let of = |name: &str| -> Vec<&str> {
        let named = seen.headers.iter().filter(|(n, _)| n == name);
        named.map(|(_, v)| v.as_str()).collect()
    };
    let (epochs, attestations) = (of("pinboard-epoch"), of("pinboard-attestation"));
    assert_eq!((epochs.len(), attestations.len()), (1, 1), "{seen:?}");
    let claims = claims_of(attestations[0], &t.worker.secret());
    assert_eq!(claims["inst"], "/threads/hh-own");
    assert_eq!(claims["epoch"], epochs[0]);
    assert_ne!(epochs[0], "999999");

    let reached: Vec<_> = t
        .forwarded()
        .into_iter()
        .filter(|p| p.starts_with("/threads/hh-"))
        .collect();
    assert_eq!(
        reached,
        ["/threads/hh-own/x"],
        "only the clean request reached the worker"
    );
    t.held(&[], "/threads/hh-after/x");
}

#[test]
fn streams_of_one_connection_never_cross_identities() {
    let t = Target::new(&[]);
    let mut conn = Conn::open(t.addr, &[]);
    let paths: Vec<String> = (0..12)
        .map(|i| format!("/threads/id-{}/{i}", ["a", "b", "c"][i % 3]))
        .collect();
    let streams: Vec<u32> = paths
        .iter()
        .map(|path| conn.request(&get_block(t.addr, path)))
        .collect();
    let (answers, _) = conn.answers(&streams);
    for (answer, path) in answers.iter().zip(&paths) {
        assert_eq!(answer.status, 200, "{answer:?}");
        assert_eq!(answer.json()["path"], path.as_str());
    }
    let requests = t.worker.requests();
    for path in &paths {
        let seen = requests.iter().find(|r| &r.path == path).unwrap();
        let attestation = seen.header("pinboard-attestation").unwrap();
        let claims = claims_of(attestation, &t.worker.secret());
        let instance = &path[..path.rfind('/').unwrap()];
        assert_eq!(claims["inst"], instance, "{path}");
        let epoch = seen.header("pinboard-epoch").unwrap();
        assert_eq!(claims["epoch"], epoch, "{path}");
    }
}

#[test]
fn over_tls_by_alpn_a_continuation_flood_goes_away_and_h2_serves_on() {
    let (pki, _pair, f) = support::tls::https_node(&[]);
    let addr = f.node.addr;
    let mut config = (*support::tls::client_config(&pki)).clone();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let config = Arc::new(config);
    let authority = format!("localhost:{}", addr.port());
    let healthz = Block::request_over("https", "GET", "/healthz", &authority);
    let h2_over_tls = || {
        let (tcp, tls) = support::tls::session(addr, &config).expect("TLS handshake");
        assert_eq!(tls.conn.alpn_protocol(), Some(&b"h2"[..]));
        Conn::over_tls(tcp, Box::new(tls), &[])
    };

    // Far more CONTINUATIONs than a block needs, in one burst (the whole flood fits the
    // socket's buffers: nothing to read beside the writer).
    let mut conn = h2_over_tls();
    let tiny = Block::default().field("x-c", "v");
    let _ = conn.send(&in_pieces(&healthz, &tiny, 200, true));
    goes_away(&mut conn, ENHANCE_YOUR_CALM);

    exchanged(&mut h2_over_tls(), &healthz, 200);
    let h1 = support::tls::client_config(&pki);
    assert_eq!(support::tls::get(addr, &h1, "/healthz", None).status, 200);
}
