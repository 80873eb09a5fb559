//! One HTTP/2 stream as the wire under a [`Request`](super::Request): its body read from its
//! `DATA` frames (the window they took given back as they are taken), its answer's head and
//! pieces queued and sent as the client's window allows, and reset when the answer was cut
//! short. The connection that accepts the streams, and makes each a request, is `crate::h2`.

use std::future::poll_fn;
use std::time::Duration;

use bytes::Bytes;
use h2::server::SendResponse;
use h2::{Reason, RecvStream, SendStream};
use http::{HeaderMap, StatusCode, header};

use super::BodyError;
use crate::head_writer::{BodyFraming, HeadWriter, Unwritable};
use crate::response::Response;

enum Body {
    Open,
    Done,
    /// Left half-read after an error.
    Broken,
}

/// One HTTP/2 stream under a [`Request`]: its body as it arrives, and its answer, started,
/// queued and sent as the client's window allows.
pub struct Stream {
    recv: RecvStream,
    body: Body,
    respond: SendResponse<Bytes>,
    /// Once the answer's `HEADERS` went.
    send: Option<SendStream<Bytes>>,
    /// The answer's head, started and not sent yet (it goes with the first flush).
    head: Option<http::Response<()>>,
    /// Body pieces queued and not sent yet.
    queued: Vec<Bytes>,
    /// The answer's end is queued (`END_STREAM` goes with the last piece).
    ended: bool,
    /// `END_STREAM` went.
    finished: bool,
    /// Answer bytes sent or queued: the head's fields, then the body.
    pub(crate) sent: u64,
    pub(crate) secure: bool,
    write_timeout: Duration,
}

impl Stream {
    /// A stream whose head was just read: `declared`, the head announced a body.
    pub(crate) fn new(
        recv: RecvStream,
        respond: SendResponse<Bytes>,
        declared: bool,
        secure: bool,
        write_timeout: Duration,
    ) -> Stream {
        Stream {
            body: if declared { Body::Open } else { Body::Done },
            recv,
            respond,
            send: None,
            head: None,
            queued: Vec::new(),
            ended: false,
            finished: false,
            sent: 0,
            secure,
            write_timeout,
        }
    }

    pub(crate) fn has_body(&self) -> bool {
        !matches!(self.body, Body::Done)
    }

    pub(crate) fn break_body(&mut self) {
        self.body = Body::Broken;
    }

    /// The next `DATA` frame's bytes, the window they took given back to the client.
    pub(crate) async fn next_chunk(
        &mut self,
        read_timeout: Duration,
    ) -> Result<Option<Bytes>, BodyError> {
        match self.body {
            Body::Done => return Ok(None),
            Body::Broken => return Err(BodyError::Malformed),
            Body::Open => {}
        }
        loop {
            let data = monoio::time::timeout(read_timeout, self.recv.data()).await;
            match data {
                Err(_) => return Err(BodyError::TimedOut),
                Ok(None) => {
                    self.body = Body::Done;
                    return Ok(None);
                }
                // A body longer or shorter than its `Content-Length` is the stream's error.
                Ok(Some(Err(e))) if e.reason() == Some(Reason::PROTOCOL_ERROR) => {
                    return Err(BodyError::Malformed);
                }
                Ok(Some(Err(_))) => return Err(BodyError::Aborted),
                Ok(Some(Ok(data))) => {
                    let _ = self.recv.flow_control().release_capacity(data.len());
                    if !data.is_empty() {
                        return Ok(Some(data));
                    }
                }
            }
        }
    }

    /// The answer's head: `fields` (checked as HTTP/1.1's are), then the length when known.
    pub(crate) fn start_answer(
        &mut self,
        status: StatusCode,
        framing: BodyFraming,
        fields: impl FnOnce(&mut HeadWriter<'_>) -> Result<(), Unwritable>,
    ) -> Result<(), Unwritable> {
        let mut map = HeaderMap::new();
        let mut head = HeadWriter::fields(&mut map);
        fields(&mut head)?;
        head.framing(framing)?;
        head.finish()?;
        self.sent += fields_len(&map);
        let mut answer = http::Response::new(());
        *answer.status_mut() = status;
        *answer.headers_mut() = map;
        self.head = Some(answer);
        Ok(())
    }

    pub(crate) fn answer_data(&mut self, data: Bytes) {
        self.sent += data.len() as u64;
        self.queued.push(data);
    }

    pub(crate) fn end_answer(&mut self) {
        self.ended = true;
    }

    /// A whole answer of the node's own: its fields, `Date`, the length, and the body
    /// (announced but not sent to `HEAD`).
    pub(crate) fn answer_whole(&mut self, response: &Response, head_request: bool) {
        let written = self.start_answer(response.status, response.framing(), |head| {
            for (name, value) in &response.headers {
                head.field(name, value.as_bytes())?;
            }
            head.field(&header::DATE, crate::response::date::value().as_bytes())
        });
        if written.is_err() {
            // The node's own fields are valid by construction; a head it cannot write is a
            // bug, and the stream is reset rather than answered wrongly.
            return;
        }
        if let Some(body) = response.body_sent(head_request) {
            self.answer_data(body.clone());
        }
        self.end_answer();
    }

    /// Sends the head and the queued pieces as the stream's window opens; false once the
    /// client reset the stream or gave it no window for the write timeout (then it is reset).
    pub(crate) async fn flush(&mut self) -> bool {
        if let Some(head) = self.head.take() {
            let end = self.ended && self.queued.is_empty();
            match self.respond.send_response(head, end) {
                Ok(send) => self.send = Some(send),
                Err(_) => return false,
            }
            self.finished = end;
        }
        let Some(send) = &mut self.send else {
            return true;
        };
        let pieces = std::mem::take(&mut self.queued);
        let last = pieces.len();
        for (i, mut piece) in pieces.into_iter().enumerate() {
            let end_with = self.ended && i + 1 == last;
            self.finished |= end_with;
            while !piece.is_empty() {
                send.reserve_capacity(piece.len());
                let window = poll_fn(|cx| send.poll_capacity(cx));
                let n = match monoio::time::timeout(self.write_timeout, window).await {
                    Ok(Some(Ok(n))) if n > 0 => n.min(piece.len()),
                    Ok(Some(Ok(_))) => continue,
                    Ok(Some(Err(_))) | Ok(None) => return false,
                    Err(_) => {
                        send.send_reset(Reason::CANCEL);
                        return false;
                    }
                };
                let chunk = piece.split_to(n);
                if send.send_data(chunk, end_with && piece.is_empty()).is_err() {
                    return false;
                }
            }
        }
        if self.ended && !self.finished {
            self.finished = true;
            return send.send_data(Bytes::new(), true).is_ok();
        }
        true
    }

    /// After the handler: an answer never ended (cut short, or never given) resets the stream,
    /// so the client does not take it as complete.
    pub(crate) fn settle(&mut self) {
        if self.ended {
            return;
        }
        match &mut self.send {
            Some(send) => send.send_reset(Reason::INTERNAL_ERROR),
            None => self.respond.send_reset(Reason::INTERNAL_ERROR),
        }
    }
}

/// What an answer's fields take on the wire, uncompressed (as HTTP/1.1 would carry them): what
/// the access log counts as its head.
fn fields_len(fields: &HeaderMap) -> u64 {
    fields
        .iter()
        .map(|(name, value)| (name.as_str().len() + value.len() + 4) as u64)
        .sum()
}
