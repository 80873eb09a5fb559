//! One forward: the request to the worker (head rewritten, body streamed), the worker's answer
//! relayed to the client (head rewritten, body streamed), the connection pooled when it can be.
//! An upgrade the worker accepts (`101`) turns the exchange into a byte tunnel between the two
//! connections until both sides are done; a WebSocket tunnel still open when the shutdown grace
//! ends says goodbye to its client (a close frame 1001, between two of the worker's frames).

use std::cell::Cell;
use std::future::Future;
use std::pin::{Pin, pin};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use http::{HeaderValue, Method, StatusCode, Version, header};
use monoio::io::{AsyncReadRent, AsyncWriteRent, Splitable};
use monoio_codec::{Decoded, Decoder};
use pinboard_protocol::header::{LEASE_UNHEALTHY, REFUSAL};

use super::headers::{self, Forwarded};
use crate::http::tls::ClientTls;
use crate::http::{
    BodyError, BodyFraming, ChunkedDecoder, FrameBoundaries, Persistence, Piece, Request,
    ResponseHeadDecoder, Shutdown, Upgraded, WorkerAddr, close_frame, content_length, read_into,
    recycle_headers, write_all_within,
};
use crate::metrics::{CoreCounters, UpstreamError};
use crate::upstream::{Upstream, connect};

const MAX_RESPONSE_HEAD: usize = 64 * 1024;

/// How long a worker that stopped taking a request body has to show the answer it sent before
/// it did (a 413 once past its own cap, say, then a close): such an answer is already on its
/// way, so this is only the time for the read to come back.
const EARLY_ANSWER: Duration = Duration::from_secs(1);

/// How long a WebSocket tunnel whose worker is in the middle of a frame when the shutdown grace
/// ends waits for that frame's end, to put its close frame there; past it, it closes without.
const FRAME_END_WAIT: Duration = Duration::from_millis(500);
/// How long, after its close frame, a WebSocket tunnel reads what its client still sends (the
/// client's own close frame), so that closing does not reset the connection under it.
const CLOSE_LINGER: Duration = Duration::from_millis(500);
/// The longest a WebSocket tunnel takes to say goodbye once the grace ended (the core waits
/// this long, at most, for the tunnels still parting), besides its writes.
pub const GOODBYE_WITHIN: Duration = FRAME_END_WAIT.saturating_add(CLOSE_LINGER);
/// The close code of the node's goodbye (RFC 6455 §7.4.1): the endpoint is going away.
const GOING_AWAY: u16 = 1001;

/// How a forward ended.
pub enum Outcome {
    /// The worker's answer went to the client.
    Relayed { status: StatusCode, close: bool },
    /// The worker switched protocols: its `101` went to the client, bytes were tunnelled both
    /// ways until the end, and the client connection must close now.
    Upgraded,
    /// The worker refused a new activation (`503` + `Pinned-Refusal: lease-unhealthy`);
    /// nothing was relayed.
    Refused,
    /// No connection could be made: the request never reached the worker.
    Unreachable,
    /// The worker failed or closed before a complete answer head.
    Failed,
    /// No answer head within the forward timeout.
    TimedOut,
    /// The client's body failed while the request was sent: it was cut off (the client went
    /// away), stalled past the read timeout, or broke its chunked framing.
    BodyFailed(BodyError),
    /// The resolution grew older than [`STALE`] before anything was sent.
    Stale,
}

/// The protocols of a request's upgrade the node tunnels: of its `Upgrade` list, those
/// `allowed` names (`forwards.upgrade_protocols`), when `Connection` lists `upgrade` too. RFC
/// 9110 §7.8: an `Upgrade` without that is no request to switch, and one on an HTTP/1.0
/// request is ignored. `None` when none is left: the request goes on as a plain one, its
/// `Upgrade` dropped with the other hop-by-hop headers, so that no worker can switch it to a
/// protocol the operator did not allow (`h2c` past the node's framing). Owned, as the request
/// is borrowed mutably to forward it.
pub fn upgrade_protocol(head: &http::request::Parts, allowed: &[String]) -> Option<HeaderValue> {
    if head.version != Version::HTTP_11 {
        return None;
    }
    let asked = head.headers.get_all(header::CONNECTION).iter().any(|v| {
        v.as_bytes()
            .split(|b| *b == b',')
            .any(|token| token.trim_ascii().eq_ignore_ascii_case(b"upgrade"))
    });
    if !asked {
        return None;
    }
    let kept: Vec<&[u8]> = head
        .headers
        .get_all(header::UPGRADE)
        .iter()
        .flat_map(|v| protocols(v.as_bytes()))
        .filter(|p| allowed.iter().any(|a| admits(a.as_bytes(), p)))
        .collect();
    if kept.is_empty() {
        return None;
    }
    HeaderValue::from_bytes(&kept.join(&b", "[..])).ok()
}

/// The members of an `Upgrade` list, `name` or `name/version`, without blanks.
fn protocols(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value
        .split(|b| *b == b',')
        .map(<[u8]>::trim_ascii)
        .filter(|p| !p.is_empty())
}

/// A protocol's name, without its `/version`.
fn protocol_name(protocol: &[u8]) -> &[u8] {
    protocol.split(|b| *b == b'/').next().unwrap_or(protocol)
}

/// Whether `allowed` (a name, or `name/version`) admits `protocol`: a name admits each of its
/// versions. Case does not matter.
fn admits(allowed: &[u8], protocol: &[u8]) -> bool {
    protocol.eq_ignore_ascii_case(allowed) || protocol_name(protocol).eq_ignore_ascii_case(allowed)
}

/// Whether a worker's `101` switches only to protocols the forward asked for (`asked`, the
/// `Upgrade` it was sent): anything else would tunnel a protocol nobody allowed.
fn switches_to_asked(asked: &[u8], answer: &http::response::Parts) -> bool {
    let Some(chosen) = answer.headers.get(header::UPGRADE) else {
        return false;
    };
    let mut chosen = protocols(chosen.as_bytes()).peekable();
    chosen.peek().is_some()
        && chosen.all(|c| protocols(asked).any(|a| admits(a, c) || admits(c, a)))
}

pub struct Exchange<'a> {
    pub addr: &'a WorkerAddr,
    /// What an `https` worker's certificate is verified with (the node's trust for workers).
    pub tls: &'a ClientTls,
    pub path_and_query: &'a str,
    pub forwarded: Forwarded<'a>,
    pub timeout: Duration,
    /// When the placement was resolved: a resolution older than [`STALE`] by the time the
    /// request would be sent is not used. `None`: send regardless (re-resolved enough).
    pub resolved_at: Option<Instant>,
    /// This core's counters: upstream errors and stale retries.
    pub counters: &'a CoreCounters,
}

/// How old a resolution may be when its forward is sent.
pub const STALE: Duration = Duration::from_secs(5);

/// Sends the request on `conn` (or a fresh connection) and relays the answer. Returns the
/// connection when it may carry another request. `head` is the caller's reusable buffer for
/// the rewritten request head.
pub async fn exchange(
    req: &mut Request<'_>,
    exchange: &Exchange<'_>,
    conn: Option<Upstream>,
    head: &mut BytesMut,
) -> (Outcome, Option<Upstream>) {
    // The framing the head decoder decided, restated: never the client's headers re-read.
    let framing = BodyFraming::from(req.framing());
    head.clear();
    let written = headers::request_head(
        req.method(),
        &exchange.addr.base,
        exchange.path_and_query,
        &req.head.headers,
        &exchange.forwarded,
        framing,
        head,
    );
    if let Err(e) = written {
        // Every input is checked before it gets here (the client's head by the decoder, the
        // worker's URL at registration): a value no head may carry is not sent, nor half sent.
        tracing::warn!(worker = %exchange.addr.authority(), error = %e, "forward: request head not written");
        return (Outcome::Failed, None);
    }

    // RFC 9110 §9.2.2: only an idempotent request may be sent again without knowing whether
    // the worker acted on it, and only one without a body (a streamed body is gone). So a
    // pooled connection that turns out closed before any byte of answer gets one more try on a
    // fresh connection for such a request; any other request is retried only when none of it
    // was written. The pool already drops the connections it can tell are closed.
    let replayable = framing == BodyFraming::None && req.method().is_idempotent();
    let mut conn = conn;
    for attempt in 0..2 {
        let mut upstream = match conn.take() {
            Some(c) => c,
            None => match connect(exchange.addr, exchange.tls, exchange.timeout).await {
                Ok(c) => c,
                Err(e) => {
                    // A TLS worker whose certificate does not verify lands here too.
                    tracing::debug!(
                        worker = %exchange.addr.authority(),
                        error = %e,
                        "forward: worker unreachable"
                    );
                    exchange.counters.upstream_error(UpstreamError::Connect);
                    return (Outcome::Unreachable, None);
                }
            },
        };
        // A slow connect can outlive the placement it was for; the worker's epoch guard
        // would catch it, but re-resolving first costs less than a refused forward.
        if exchange.resolved_at.is_some_and(|at| at.elapsed() > STALE) {
            return (Outcome::Stale, Some(upstream));
        }
        let reused = upstream.reused;
        let retry = |unsent: bool| reused && attempt == 0 && (replayable || unsent);
        // The buffer goes to the kernel and comes back, so the caller can reuse it.
        // A worker that takes no byte for the forward timeout is as good as unreachable.
        match send_head(&mut upstream, std::mem::take(head), exchange.timeout).await {
            Ok(head_back) => *head = head_back,
            Err((head_back, unsent)) => {
                *head = head_back;
                if retry(unsent) {
                    exchange.counters.upstream_error(UpstreamError::StaleRetry);
                    continue;
                }
                return failed(exchange, UpstreamError::Reset);
            }
        }
        if framing != BodyFraming::None {
            match send_body(req, &mut upstream, framing, exchange.timeout).await {
                Ok(()) => {}
                Err(SendError::Client(e)) => return (Outcome::BodyFailed(e), None),
                Err(SendError::Upstream) => return early_answer(req, upstream, exchange).await,
            }
        }
        match read_head(&mut upstream, exchange.timeout).await {
            Ok(response) if response.status == StatusCode::SWITCHING_PROTOCOLS => {
                // A switch nobody asked for (or to a protocol not asked for) cannot be
                // relayed: the client would read the worker's new protocol as an HTTP answer,
                // or speak one the operator did not allow through the node.
                let asked = exchange.forwarded.upgrade;
                if !asked.is_some_and(|asked| switches_to_asked(asked, &response)) {
                    return failed(exchange, UpstreamError::Invalid);
                }
                // An upgraded connection carries the tunnel to its end: never pooled.
                return (switch(req, upstream, response, exchange).await, None);
            }
            // Anything else, upgrade asked or not, is an ordinary answer relayed as such.
            Ok(response) => return relay(req, upstream, response, exchange).await,
            Err(HeadFailure::TimedOut) => {
                exchange.counters.upstream_error(UpstreamError::Timeout);
                return (Outcome::TimedOut, None);
            }
            Err(HeadFailure::Closed) if retry(false) => {
                exchange.counters.upstream_error(UpstreamError::StaleRetry);
                continue;
            }
            Err(HeadFailure::Malformed) => return failed(exchange, UpstreamError::Invalid),
            Err(HeadFailure::Closed) => return failed(exchange, UpstreamError::Reset),
        }
    }
    (Outcome::Failed, None)
}

/// A forward that failed at the worker, counted by how.
fn failed(exchange: &Exchange<'_>, how: UpstreamError) -> (Outcome, Option<Upstream>) {
    exchange.counters.upstream_error(how);
    (Outcome::Failed, None)
}

/// Writes the request head. On failure, gives the buffer back with whether none of it was
/// written: the first write failed outright, so the worker cannot have seen the request.
async fn send_head(
    upstream: &mut Upstream,
    head: BytesMut,
    stuck: Duration,
) -> Result<BytesMut, (BytesMut, bool)> {
    let len = head.len();
    let (first, head) = match monoio::time::timeout(stuck, upstream.stream.write(head)).await {
        Ok(written) => written,
        // A timed-out write was cancelled, but how much of it the kernel took is unknown; the
        // buffer went with the cancelled operation.
        Err(_) => return Err((BytesMut::new(), false)),
    };
    match first {
        Ok(n) if n == len => Ok(head),
        Ok(0) | Err(_) => Err((head, true)),
        Ok(n) => {
            let mut rest = head;
            let tail = rest.split_off(n);
            match write_all_within(&mut upstream.stream, tail, stuck).await {
                Some(tail) => {
                    rest.unsplit(tail);
                    Ok(rest)
                }
                None => Err((rest, false)),
            }
        }
    }
}

enum SendError {
    Client(BodyError),
    Upstream,
}

/// The worker stopped taking the request body (it closed, or took no byte for the forward
/// timeout). A worker may answer before it has read a whole body (a 413 once past its cap)
/// and close: that answer is the client's, not a 502. The client connection closes after it,
/// since the rest of its body is unread; the worker connection is never reused.
async fn early_answer(
    req: &mut Request<'_>,
    mut upstream: Upstream,
    exchange: &Exchange<'_>,
) -> (Outcome, Option<Upstream>) {
    match read_head(&mut upstream, EARLY_ANSWER).await {
        Ok(head) if head.status != StatusCode::SWITCHING_PROTOCOLS => {
            (relay(req, upstream, head, exchange).await.0, None)
        }
        _ => failed(exchange, UpstreamError::Reset),
    }
}

async fn send_body(
    req: &mut Request<'_>,
    upstream: &mut Upstream,
    framing: BodyFraming,
    stuck: Duration,
) -> Result<(), SendError> {
    let stream = &mut upstream.stream;
    let chunked = framing == BodyFraming::Chunked;
    loop {
        let chunk = req.chunk().await.map_err(SendError::Client)?;
        let Some(chunk) = chunk else {
            if chunked {
                write_all_within(stream, &b"0\r\n\r\n"[..], stuck)
                    .await
                    .ok_or(SendError::Upstream)?;
            }
            return Ok(());
        };
        if chunked {
            let size = format!("{:x}\r\n", chunk.len()).into_bytes();
            write_all_within(stream, size, stuck)
                .await
                .ok_or(SendError::Upstream)?;
        }
        write_all_within(stream, chunk, stuck)
            .await
            .ok_or(SendError::Upstream)?;
        if chunked {
            write_all_within(stream, &b"\r\n"[..], stuck)
                .await
                .ok_or(SendError::Upstream)?;
        }
    }
}

enum HeadFailure {
    TimedOut,
    /// Closed or reset before any byte of an answer.
    Closed,
    /// Not an HTTP/1.1 answer head, too large, or cut off in the middle.
    Malformed,
}

async fn read_head(
    upstream: &mut Upstream,
    timeout: Duration,
) -> Result<http::response::Parts, HeadFailure> {
    let mut decoder = ResponseHeadDecoder::new(MAX_RESPONSE_HEAD);
    let reading = async {
        loop {
            match decoder.decode(&mut upstream.buf) {
                // An interim answer (100 Continue, 103) is not relayed: we sent no Expect.
                Ok(Decoded::Some(head))
                    if head.status.is_informational()
                        && head.status != StatusCode::SWITCHING_PROTOCOLS =>
                {
                    recycle_headers(head.headers);
                }
                Ok(Decoded::Some(head)) => return Ok(head),
                Ok(_) => {}
                Err(_) => return Err(HeadFailure::Malformed),
            }
            let had = upstream.buf.len();
            match read_into(&mut upstream.stream, &mut upstream.buf).await {
                Ok(0) | Err(_) if had == 0 => return Err(HeadFailure::Closed),
                Ok(0) | Err(_) => return Err(HeadFailure::Malformed),
                Ok(_) => {}
            }
        }
    };
    monoio::time::timeout(timeout, reading)
        .await
        .unwrap_or(Err(HeadFailure::TimedOut))
}

/// How the worker delimits its answer's body (RFC 9112 §6.3), by the request side's rules
/// (`content_length`): `None` for an answer that names both framings, a coding other than a
/// lone `chunked`, or a repeated or malformed `Content-Length`. Read leniently, such a body's
/// end could differ from the one the worker meant, and the next answer on a pooled connection
/// would be read from the middle of this one: it is no answer (502, the connection dropped).
fn upstream_framing(method: &Method, head: &http::response::Parts) -> Option<BodyFraming> {
    let status = head.status;
    if method == Method::HEAD
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
    {
        return Some(BodyFraming::None);
    }
    let mut encodings = head.headers.get_all(header::TRANSFER_ENCODING).iter();
    if let Some(te) = encodings.next() {
        let chunked = te.as_bytes().trim_ascii().eq_ignore_ascii_case(b"chunked");
        let alone =
            encodings.next().is_none() && !head.headers.contains_key(header::CONTENT_LENGTH);
        return (chunked && alone).then_some(BodyFraming::Chunked);
    }
    match content_length(&head.headers) {
        Ok(Some(n)) => Some(BodyFraming::Length(n)),
        Ok(None) => Some(BodyFraming::Close),
        Err(_) => None,
    }
}

fn is_refusal(head: &http::response::Parts) -> bool {
    head.status == StatusCode::SERVICE_UNAVAILABLE
        && head.headers.get(REFUSAL).is_some_and(|v| {
            v.as_bytes()
                .eq_ignore_ascii_case(LEASE_UNHEALTHY.as_bytes())
        })
}

async fn relay(
    req: &mut Request<'_>,
    mut upstream: Upstream,
    head: http::response::Parts,
    exchange: &Exchange<'_>,
) -> (Outcome, Option<Upstream>) {
    let timeout = exchange.timeout;
    if is_refusal(&head) {
        recycle_headers(head.headers);
        return (Outcome::Refused, None);
    }
    let Some(from) = upstream_framing(req.method(), &head) else {
        tracing::warn!(
            worker = %exchange.addr.authority(),
            "forward: the worker's answer frames its body ambiguously"
        );
        recycle_headers(head.headers);
        return (Outcome::Failed, None);
    };
    let is_head = *req.method() == Method::HEAD;
    let old_client = req.version() == Version::HTTP_10;
    // A close-delimited answer is re-framed as chunked for an HTTP/1.1 client, so the client
    // connection survives the worker's close.
    let to = match from {
        BodyFraming::Close if old_client => BodyFraming::Close,
        BodyFraming::Close => BodyFraming::Chunked,
        BodyFraming::Chunked if old_client => BodyFraming::Close,
        other => other,
    };
    let announced = match (is_head, from) {
        // HEAD: the worker's length is announced as it gave it.
        (true, _) => content_length(&head.headers)
            .ok()
            .flatten()
            .map_or(BodyFraming::None, BodyFraming::Length),
        _ => to,
    };
    // A body not read to its end (an early answer) leaves the client connection unusable.
    let close = !req.keep_alive() || to == BodyFraming::Close || req.has_body();
    let persistence = match (close, old_client) {
        (true, _) => Persistence::Close,
        (false, true) => Persistence::KeepAlive,
        (false, false) => Persistence::Implicit,
    };
    let request_id = exchange.forwarded.correlation.request_id();
    let written = req.start_answer(head.status, announced, persistence, |fields| {
        headers::response_fields(head.status, &head.headers, request_id, fields)
    });
    if written.is_err() {
        recycle_headers(head.headers);
        return failed(exchange, UpstreamError::Invalid);
    }
    let status = head.status;
    upstream.keep_alive = keep_alive_timeout(&head.headers);
    let upstream_keeps = head.version == Version::HTTP_11
        && !head.headers.get_all(header::CONNECTION).iter().any(|v| {
            v.as_bytes()
                .windows(5)
                .any(|w| w.eq_ignore_ascii_case(b"close"))
        });
    // The body is read into the buffer the head was cut from: given back first, the head's
    // values no longer hold that buffer, so it is reused in place.
    recycle_headers(head.headers);

    let copied = copy_body(req, &mut upstream, from, timeout).await;
    if copied.is_ok() {
        req.end_answer();
    }
    let flushed = req.flush().await;
    match copied {
        Ok(()) if flushed => {
            let reusable = upstream_keeps && from != BodyFraming::Close;
            (
                Outcome::Relayed { status, close },
                reusable.then_some(upstream),
            )
        }
        // The answer was cut short: the client must not take it as complete.
        _ => (
            Outcome::Relayed {
                status,
                close: true,
            },
            None,
        ),
    }
}

/// The `timeout=N` of a `Keep-Alive` header (RFC 2068 §19.7.1.1, still sent by many servers):
/// how many seconds the worker keeps the connection open idle.
fn keep_alive_timeout(headers: &http::HeaderMap) -> Option<Duration> {
    let value = headers.get("keep-alive")?.as_bytes();
    value.split(|b| *b == b',').find_map(|param| {
        let (name, secs) = std::str::from_utf8(param).ok()?.split_once('=')?;
        if !name.trim().eq_ignore_ascii_case("timeout") {
            return None;
        }
        secs.trim().parse().ok().map(Duration::from_secs)
    })
}

/// Relays the worker's `101` (`response_head` restates `Connection: upgrade` and `Upgrade`),
/// then tunnels bytes both ways.
async fn switch(
    req: &mut Request<'_>,
    upstream: Upstream,
    head: http::response::Parts,
    exchange: &Exchange<'_>,
) -> Outcome {
    let websocket = switches_to_websocket(&head);
    let request_id = exchange.forwarded.correlation.request_id();
    let written = req.start_answer(
        head.status,
        BodyFraming::None,
        Persistence::Implicit,
        |fields| headers::response_fields(head.status, &head.headers, request_id, fields),
    );
    recycle_headers(head.headers);
    if written.is_err() {
        return failed(exchange, UpstreamError::Invalid).0;
    }
    if req.flush().await
        && let Some(client) = req.upgraded()
    {
        tunnel(client, upstream, exchange.timeout, websocket).await;
    }
    Outcome::Upgraded
}

/// Whether a `101` switches to WebSocket (and nothing else), whose frames the tunnel can tell
/// apart.
fn switches_to_websocket(answer: &http::response::Parts) -> bool {
    answer.headers.get(header::UPGRADE).is_some_and(|chosen| {
        protocols(chosen.as_bytes()).all(|p| protocol_name(p).eq_ignore_ascii_case(b"websocket"))
    })
}

/// Copies client → worker and worker → client on this task until both directions are done.
///
/// An end of stream on one side is passed on as a half-close (`shutdown(SHUT_WR)` of the other
/// side's socket; over TLS, to an `https` worker or an HTTPS client, a `close_notify` first)
/// while the other direction keeps flowing, as TCP allows: a peer that stops sending may still
/// be owed bytes (a WebSocket server's closing frame after the client's FIN, or any
/// protocol's last answer after the request side shut), and closing both at the first EOF
/// would cut those off or reset them. So that a peer which never closes after a half-close
/// cannot pin the tunnel, the remaining direction ends once it moves nothing for `idle` (the
/// forward timeout). A failure either way (reset, write error) ends both at once: the failed
/// peer can take nothing more.
///
/// When the shutdown grace ends with the tunnel open: a `websocket` one still sending to its
/// client says goodbye ([`goodbye_pipe`]), then reads what the client still sends for
/// [`CLOSE_LINGER`] (its own close frame); any other is cut at once.
async fn tunnel(client: Upgraded<'_>, upstream: Upstream, idle: Duration, websocket: bool) {
    let Upstream { stream, buf, .. } = upstream;
    let (mut worker_read, mut worker_write) = stream.into_split();
    let (sent, received) = (Cell::new(0u64), Cell::new(0u64));
    // The client's bytes that came with (or after) its request head are already read; the
    // worker's that came with its 101 are in the upstream buffer. Each goes first.
    let pending = std::mem::take(client.buffered);
    let stuck = client.write_timeout;
    let shutdown = client.shutdown;
    // The core waits for a WebSocket tunnel's goodbye, its linger included, while it can
    // still say one: until the worker ended its side.
    let mut parting = websocket.then(|| shutdown.parting());
    let said_goodbye = {
        let mut outbound = pin!(pipe(
            pending,
            &mut *client.reader,
            &mut worker_write,
            &sent,
            stuck
        ));
        let to_client = (&mut worker_read, &mut *client.writer);
        let mut inbound = pin!(async {
            if websocket {
                goodbye_pipe(buf, to_client, &received, stuck, shutdown).await
            } else {
                pipe(buf, to_client.0, to_client.1, &received, stuck)
                    .await
                    .map(|()| false)
            }
        });
        let mut grace_over = pin!(shutdown.grace_over());
        let first = monoio::select! {
            r = &mut outbound => r.map(|()| None),
            r = &mut inbound => r.map(Some),
            // A WebSocket's inbound side watches for it itself.
            _ = &mut grace_over, if !websocket => return,
        };
        match first {
            Ok(None) => finish(inbound, &received, idle).await == Some(true),
            Ok(Some(said)) => {
                if !said {
                    parting = None;
                    finish(outbound, &sent, idle).await;
                }
                said
            }
            Err(_) => false,
        }
    };
    if said_goodbye {
        let mut discarded = BytesMut::new();
        let drain = async {
            while let Ok(1..) = read_into(client.reader, &mut discarded).await {
                discarded.clear();
            }
        };
        let _ = monoio::time::timeout(CLOSE_LINGER, drain).await;
    }
    drop(parting);
}

/// Lets the direction still open after a half-close run while it makes progress: its outcome,
/// `None` once it stalled or failed.
async fn finish<T, F: Future<Output = std::io::Result<T>>>(
    mut rest: Pin<&mut F>,
    moved: &Cell<u64>,
    idle: Duration,
) -> Option<T> {
    loop {
        let before = moved.get();
        match monoio::time::timeout(idle, rest.as_mut()).await {
            Ok(done) => return done.ok(),
            Err(_) if moved.get() == before => return None,
            Err(_) => {}
        }
    }
}

/// The worker → client side of a WebSocket tunnel: [`pipe`], with the worker's frames tracked
/// as they pass ([`FrameBoundaries`]). Once the shutdown grace ends it passes the worker's
/// bytes only up to the end of the frame under way (within [`FRAME_END_WAIT`]: past it, an
/// error, and the tunnel closes without a goodbye), then writes a close frame 1001 (going
/// away; none when the worker sent its own Close) and half-closes: true. False when the worker
/// ended its stream first (passed on as in [`pipe`]).
///
/// A read is never cut short by the grace's end but waited for: bytes it took off the socket
/// and dropped would leave the frames tracked apart from the frames sent. Only once the
/// tunnel closes anyway is a pending read dropped.
async fn goodbye_pipe<R: AsyncReadRent, W: AsyncWriteRent>(
    mut buf: BytesMut,
    (from, to): (&mut R, &mut W),
    moved: &Cell<u64>,
    stuck: Duration,
    shutdown: &Shutdown,
) -> std::io::Result<bool> {
    let mut frames = FrameBoundaries::default();
    let mut grace_over = pin!(shutdown.grace_over());
    // Once the grace is over: until when the frame under way may take to end.
    let mut going: Option<monoio::time::Instant> = None;
    loop {
        if !buf.is_empty() {
            let passed = match going {
                None => {
                    frames.feed(&buf);
                    buf.len()
                }
                Some(_) if frames.at_boundary() => 0,
                Some(_) => frames.step(&buf),
            };
            // What follows the frame under way once the grace is over is never sent.
            buf.truncate(passed);
            let n = buf.len() as u64;
            if n > 0 {
                buf = write_all_within(to, buf, stuck)
                    .await
                    .ok_or(std::io::ErrorKind::TimedOut)?;
                moved.set(moved.get() + n);
            }
            buf.clear();
        }
        if going.is_some() && frames.at_boundary() {
            return say_goodbye(to, &frames, stuck).await;
        }
        let mut read = pin!(read_into(from, &mut buf));
        let deadline = match going {
            Some(deadline) => deadline,
            None => {
                let got = monoio::select! {
                    r = &mut read => Some(r),
                    _ = &mut grace_over => None,
                };
                match got {
                    Some(Ok(0)) => return to.shutdown().await.map(|()| false),
                    Some(r) => {
                        r?;
                        continue;
                    }
                    None if frames.at_boundary() => {
                        return say_goodbye(to, &frames, stuck).await;
                    }
                    None => *going.insert(monoio::time::Instant::now() + FRAME_END_WAIT),
                }
            }
        };
        match monoio::time::timeout_at(deadline, read).await {
            Ok(Ok(0)) => return to.shutdown().await.map(|()| false),
            Ok(r) => {
                r?;
            }
            Err(_) => return Err(std::io::ErrorKind::TimedOut.into()),
        }
    }
}

/// The node's close frame (unless the worker's already went), then the half-close.
async fn say_goodbye<W: AsyncWriteRent>(
    to: &mut W,
    frames: &FrameBoundaries,
    stuck: Duration,
) -> std::io::Result<bool> {
    if !frames.closed() {
        write_all_within(to, close_frame(GOING_AWAY).to_vec(), stuck)
            .await
            .ok_or(std::io::ErrorKind::TimedOut)?;
    }
    to.shutdown().await.map(|()| true)
}

/// Copies `from` into `to`, starting with `buf` (bytes already read off `from`), until `from`
/// ends; then half-closes `to`. `moved` counts the bytes delivered. A `to` that takes no byte
/// for `stuck` ends the pipe with an error (a peer that never reads cannot pin the tunnel).
async fn pipe<R: AsyncReadRent, W: AsyncWriteRent>(
    mut buf: BytesMut,
    from: &mut R,
    to: &mut W,
    moved: &Cell<u64>,
    stuck: Duration,
) -> std::io::Result<()> {
    loop {
        if !buf.is_empty() {
            let n = buf.len() as u64;
            buf = write_all_within(to, buf, stuck)
                .await
                .ok_or(std::io::ErrorKind::TimedOut)?;
            buf.clear();
            moved.set(moved.get() + n);
        }
        if read_into(from, &mut buf).await? == 0 {
            return to.shutdown().await;
        }
    }
}

/// Streams the worker's body (delimited by `from`) to the client, re-framed as the answer's
/// head said.
async fn copy_body(
    req: &mut Request<'_>,
    upstream: &mut Upstream,
    from: BodyFraming,
    timeout: Duration,
) -> Result<(), ()> {
    let mut remaining = match from {
        BodyFraming::None => return Ok(()),
        BodyFraming::Length(n) => n,
        _ => u64::MAX,
    };
    let mut chunked = ChunkedDecoder::default();
    loop {
        if matches!(from, BodyFraming::Length(_)) && remaining == 0 {
            return Ok(());
        }
        // Hand over what is buffered before reading more.
        let piece = match from {
            BodyFraming::Chunked => match chunked.decode(&mut upstream.buf) {
                Err(_) => return Err(()),
                Ok(Some(Piece::End)) => return Ok(()),
                Ok(Some(Piece::Data(data))) => Some(data),
                Ok(None) => None,
            },
            _ if upstream.buf.is_empty() => None,
            _ => {
                let n = remaining.min(upstream.buf.len() as u64) as usize;
                remaining -= n as u64;
                Some(upstream.buf.split_to(n).freeze())
            }
        };
        if let Some(data) = piece {
            req.answer_data(data);
            if !req.flush().await {
                return Err(());
            }
            continue;
        }
        let read = read_into(&mut upstream.stream, &mut upstream.buf);
        match monoio::time::timeout(timeout, read).await {
            Ok(Ok(0)) | Ok(Err(_)) if from == BodyFraming::Close => return Ok(()),
            Ok(Ok(0)) | Ok(Err(_)) | Err(_) => return Err(()),
            Ok(Ok(_)) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn asked(pairs: &[(&str, &str)], version: Version) -> Option<String> {
        let mut builder = http::Request::builder().version(version);
        for (k, v) in pairs {
            builder = builder.header(*k, *v);
        }
        let (head, ()) = builder.body(()).unwrap().into_parts();
        let allowed = ["websocket".to_string(), "chat/2".to_string()];
        upgrade_protocol(&head, &allowed).map(|v| v.to_str().unwrap().to_owned())
    }

    /// L6 of issue 23: only an allowed protocol is tunnelled; `h2c` goes on as a plain request.
    #[test]
    fn only_allowed_upgrades_are_tunnelled() {
        let v11 = Version::HTTP_11;
        let ws = [("connection", "Upgrade"), ("upgrade", "WebSocket")];
        assert_eq!(asked(&ws, v11).as_deref(), Some("WebSocket"));
        assert_eq!(asked(&ws, Version::HTTP_10), None);
        assert_eq!(asked(&ws[1..], v11), None);
        let h2c = [
            ("connection", "Upgrade, HTTP2-Settings"),
            ("upgrade", "h2c"),
        ];
        assert_eq!(asked(&h2c, v11), None);
        let mixed = [
            ("connection", "upgrade"),
            ("upgrade", "h2c, websocket/13, chat/1, chat/2"),
        ];
        assert_eq!(asked(&mixed, v11).as_deref(), Some("websocket/13, chat/2"));
    }

    #[test]
    fn a_switch_must_be_to_a_protocol_asked_for() {
        let answer = |upgrade: Option<&str>| {
            let mut builder = http::Response::builder().status(101);
            if let Some(u) = upgrade {
                builder = builder.header("upgrade", u);
            }
            builder.body(()).unwrap().into_parts().0
        };
        assert!(switches_to_asked(b"websocket", &answer(Some("websocket"))));
        assert!(switches_to_asked(
            b"websocket/13",
            &answer(Some("WebSocket"))
        ));
        assert!(!switches_to_asked(b"websocket", &answer(Some("h2c"))));
        assert!(!switches_to_asked(
            b"websocket",
            &answer(Some("websocket, h2c"))
        ));
        assert!(!switches_to_asked(b"websocket", &answer(None)));
    }

    #[test]
    fn keep_alive_timeout_is_read_from_its_parameter() {
        let of = |v: &'static str| {
            let mut h = http::HeaderMap::new();
            h.insert("keep-alive", HeaderValue::from_static(v));
            keep_alive_timeout(&h)
        };
        assert_eq!(of("timeout=5"), Some(Duration::from_secs(5)));
        assert_eq!(of("max=100, Timeout = 2"), Some(Duration::from_secs(2)));
        for bad in [
            "max=100",
            "timeout=",
            "timeout=-1",
            "timeout=1.5",
            "timeouts=3",
        ] {
            assert_eq!(of(bad), None, "{bad}");
        }
        assert_eq!(keep_alive_timeout(&http::HeaderMap::new()), None);
    }
}
