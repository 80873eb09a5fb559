//! A request's identity across hops and logs: its `X-Request-Id` (the client's when it sent a
//! usable one, else a new one) and its W3C trace context (`traceparent`: the client's trace
//! kept, or a new trace started). The node returns the request id on every answer, forwards
//! both to the worker, and writes both in the access log. Pure: the caller hands in the
//! randomness, and nothing here allocates for ids of a sane length.

use http::HeaderMap;

use crate::text::InlineStr;

pub const REQUEST_ID: &str = "x-request-id";
pub const TRACEPARENT: &str = "traceparent";
pub const TRACESTATE: &str = "tracestate";

/// The longest client request id kept; a longer one (or one with a space or a control byte) is
/// replaced by a new one, so that no client can bloat or break the log lines that carry it.
const MAX_REQUEST_ID: usize = 128;

/// `00-{trace-id: 32 hex}-{parent-id: 16 hex}-{flags: 2 hex}`.
const TRACEPARENT_LEN: usize = 55;

#[derive(Clone, Debug)]
pub struct Correlation {
    request_id: InlineStr<32>,
    traceparent: InlineStr<TRACEPARENT_LEN>,
    /// The client sent no usable trace context: this request starts a trace.
    started_trace: bool,
}

impl Correlation {
    /// The request's ids from its headers; `random` makes the ones it did not send.
    pub fn of(headers: &HeaderMap, mut random: impl FnMut() -> u128) -> Correlation {
        let request_id = headers
            .get(REQUEST_ID)
            .map(|v| v.as_bytes())
            .filter(|v| usable_request_id(v))
            // Visible ASCII only: always UTF-8.
            .and_then(|v| std::str::from_utf8(v).ok())
            .map_or_else(|| hex32(random()), InlineStr::from);
        let kept = headers
            .get(TRACEPARENT)
            .and_then(|v| std::str::from_utf8(v.as_bytes()).ok())
            .and_then(parse_traceparent);
        let started_trace = kept.is_none();
        let traceparent = kept.unwrap_or_else(|| {
            let (trace, span) = (random(), random() as u64);
            let mut text = InlineStr::from("00-");
            text.push_hex(trace, 32);
            text.push_str("-");
            text.push_hex(u128::from(span), 16);
            text.push_str("-00");
            text
        });
        Correlation {
            request_id,
            traceparent,
            started_trace,
        }
    }

    pub fn request_id(&self) -> &str {
        &self.request_id
    }

    /// The `traceparent` sent to the worker: the client's (restated as version `00`), or the
    /// new trace's.
    pub fn traceparent(&self) -> &str {
        &self.traceparent
    }

    /// The 32 hex digits every hop of the trace shares.
    pub fn trace_id(&self) -> &str {
        &self.traceparent[3..35]
    }

    /// Whether this request starts its trace (a client's `tracestate` then belongs to no
    /// trace of ours and is not forwarded).
    pub fn started_trace(&self) -> bool {
        self.started_trace
    }
}

fn usable_request_id(id: &[u8]) -> bool {
    (1..=MAX_REQUEST_ID).contains(&id.len()) && id.iter().all(|b| (0x21..=0x7e).contains(b))
}

/// 32 lowercase hex digits.
fn hex32(n: u128) -> InlineStr<32> {
    let mut text = InlineStr::default();
    text.push_hex(n, 32);
    text
}

/// A W3C `traceparent` (Trace Context level 1, §3.2) as version `00`, or `None` when it is not
/// one: `version-traceid-parentid-flags`, lowercase hex, neither id all zeros, version `ff`
/// refused. A later version is read by its first 55 characters, as the recommendation says.
fn parse_traceparent(value: &str) -> Option<InlineStr<TRACEPARENT_LEN>> {
    let value = value.trim_matches([' ', '\t']);
    let b = value.as_bytes();
    if b.len() < TRACEPARENT_LEN {
        return None;
    }
    let lower_hex = |s: &[u8]| s.iter().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'));
    let (version, trace, parent, flags) = (&b[0..2], &b[3..35], &b[36..52], &b[53..55]);
    let dashes = b[2] == b'-' && b[35] == b'-' && b[52] == b'-';
    let zeros = |s: &[u8]| s.iter().all(|c| *c == b'0');
    let length_fits = match version {
        b"00" => b.len() == TRACEPARENT_LEN,
        _ => b.len() == TRACEPARENT_LEN || b[TRACEPARENT_LEN] == b'-',
    };
    let valid = dashes
        && length_fits
        && version != b"ff"
        && [version, trace, parent, flags].into_iter().all(lower_hex)
        && !zeros(trace)
        && !zeros(parent);
    valid.then(|| InlineStr::concat(&["00-", &value[3..TRACEPARENT_LEN]]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        pairs
            .iter()
            .map(|(k, v)| (k.parse().unwrap(), v.parse().unwrap()))
            .collect()
    }

    fn counting() -> impl FnMut() -> u128 {
        let mut n = 0u128;
        move || {
            n += 1;
            n * 0x1111_1111_1111_1111_1111_1111_1111_1111
        }
    }

    const TRACE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_clients_ids_are_kept() {
        let c = Correlation::of(
            &headers(&[("x-request-id", "req-42"), ("traceparent", TRACE)]),
            counting(),
        );
        assert_eq!(c.request_id(), "req-42");
        assert_eq!(c.traceparent(), TRACE);
        assert_eq!(c.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert!(!c.started_trace());
        // A later version is read by its first 55 characters, restated as 00.
        let later = "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-comes-next";
        let c = Correlation::of(&headers(&[("traceparent", later)]), counting());
        assert_eq!(c.traceparent(), TRACE);
    }

    #[test]
    fn missing_or_unusable_ids_are_made_anew() {
        let c = Correlation::of(&HeaderMap::new(), counting());
        assert_eq!(c.request_id(), "11111111111111111111111111111111");
        assert_eq!(
            c.traceparent(),
            "00-22222222222222222222222222222222-3333333333333333-00"
        );
        assert!(c.started_trace());
        let long = "a".repeat(MAX_REQUEST_ID + 1);
        for bad in ["", "has space", "tab\there", long.as_str(), "é"] {
            let Ok(value) = http::HeaderValue::from_bytes(bad.as_bytes()) else {
                continue;
            };
            let mut h = HeaderMap::new();
            h.insert(REQUEST_ID, value);
            let c = Correlation::of(&h, counting());
            assert_eq!(c.request_id().len(), 32, "{bad:?}");
        }
        assert_eq!(
            Correlation::of(&headers(&[("x-request-id", &"b".repeat(128))]), counting())
                .request_id()
                .len(),
            128
        );
    }

    #[test]
    fn malformed_trace_contexts_start_a_new_trace() {
        for bad in [
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
            "zz-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            let c = Correlation::of(&headers(&[("traceparent", bad)]), counting());
            assert!(c.started_trace(), "{bad}");
            assert_eq!(c.traceparent().len(), TRACEPARENT_LEN);
        }
    }
}
