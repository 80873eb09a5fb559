//! What the node notes of each request while it answers it ([`Record`]), and the access log
//! that writes it out (`access_log = "text" | "json"`): one line per request, to standard output
//! or to `access_log_path`, reopened on `SIGUSR1` for logrotate.
//!
//! Each core writes its own lines into its own buffer and hands it to the kernel in one
//! `write(2)` once it holds [`FLUSH_BYTES`] or is [`FLUSH_EVERY`] old (and at the core's
//! periodic flush, and at the stop), as nginx's `access_log … buffer= flush=` does: no lock, and
//! a line is never split between two writes, so the cores' lines interleave whole (the file is
//! opened `O_APPEND`). A blocking write on the core is the price, as with nginx: a log target
//! that stops taking bytes (a full disk, a stuck pipe reader) slows the node down.

use std::cell::{Cell, RefCell};
use std::fs::File;
use std::io::Write;
use std::net::IpAddr;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;

use crate::config::AccessLogFormat;
use crate::correlation::Correlation;
use crate::http::{Request, Response};
use crate::metrics::{CoreCounters, RequestKind, protocol_name};
use crate::redis::Text;

/// A core's buffer is written out once it holds this much.
pub const FLUSH_BYTES: usize = 32 * 1024;
/// … or once its oldest line is this old.
pub const FLUSH_EVERY: Duration = Duration::from_secs(1);

/// What the node notes of one request while answering it: the access log's line and the request
/// metrics are made of it. Filled by the routes and the data plane; `Default` is a request that
/// has not reached a route yet.
#[derive(Default)]
pub struct Record {
    /// When the handler got the request (its head read).
    pub started: Option<Instant>,
    pub correlation: Option<Correlation>,
    pub kind: RequestKind,
    /// The instance asked for (data plane), empty otherwise.
    pub ns: Text,
    pub id: Text,
    /// The last resolution's outcome (`forward`, `unknown-ns`, …).
    pub outcome: Option<&'static str>,
    /// The placement forwarded to: its owner session and epoch.
    pub session: Text,
    pub epoch: Text,
    /// Time spent resolving (every resolve of the request together).
    pub resolve: Duration,
    /// Time spent in forwards to workers.
    pub upstream: Option<Duration>,
}

impl Record {
    /// A resolution outcome (one of [`crate::metrics::OUTCOMES`]): counted on the core's
    /// counters, and noted as this request's.
    pub fn outcome(&mut self, counters: &CoreCounters, outcome: &'static str) {
        counters.count(outcome);
        self.outcome = Some(outcome);
    }
}

/// The line's fields, as both formats write them.
#[derive(Serialize)]
struct Line<'a> {
    time: &'a str,
    node_id: &'a str,
    request_id: &'a str,
    trace_id: &'a str,
    client: String,
    method: &'a str,
    path: &'a str,
    /// `HTTP/1.0` or `HTTP/1.1`; empty for a head refused before it was read whole.
    #[serde(skip_serializing_if = "str::is_empty")]
    protocol: &'a str,
    /// `http`, or `https` on the TLS listener; empty as `protocol`.
    #[serde(skip_serializing_if = "str::is_empty")]
    scheme: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    ns: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    id: &'a str,
    status: u16,
    bytes_in: u64,
    bytes_out: u64,
    total_ms: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    upstream_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    resolve_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    outcome: Option<&'a str>,
    #[serde(skip_serializing_if = "str::is_empty")]
    session: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    epoch: &'a str,
    /// The `error` of an answer the node wrote itself (`{"error": …}`).
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

/// Where the lines go: standard output (a duplicate of its descriptor, written without
/// std's lock) or a file opened for appending.
#[derive(Clone, Debug)]
pub enum Target {
    Stdout,
    File(PathBuf),
}

impl Target {
    fn open(&self) -> std::io::Result<File> {
        match self {
            Target::Stdout => Ok(File::from(std::io::stdout().as_fd().try_clone_to_owned()?)),
            Target::File(path) => open_append(path),
        }
    }
}

fn open_append(path: &Path) -> std::io::Result<File> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
}

/// Shared by the node's cores: the format, the target and the reopen signal.
pub struct AccessLogSetup {
    pub format: AccessLogFormat,
    pub target: Target,
    /// Bumped by `SIGUSR1`: each core reopens its target when it sees a new value.
    pub reopen: AtomicU64,
}

impl AccessLogSetup {
    /// Checks that the target opens (the caller turns the error into the config error naming
    /// `access_log_path`).
    pub fn new(format: AccessLogFormat, path: Option<&Path>) -> std::io::Result<AccessLogSetup> {
        let target = path.map_or(Target::Stdout, |p| Target::File(p.to_owned()));
        target.open()?;
        Ok(AccessLogSetup {
            format,
            target,
            reopen: AtomicU64::new(0),
        })
    }
}

/// One core's access log.
pub struct AccessLog {
    setup: Arc<AccessLogSetup>,
    node_id: Arc<str>,
    buf: RefCell<Vec<u8>>,
    /// The open target, and the reopen generation it was opened at.
    out: RefCell<Option<(File, u64)>>,
    /// When the buffer got its oldest unwritten line.
    since: Cell<Option<Instant>>,
    clock: RefCell<Clock>,
}

impl AccessLog {
    pub fn new(setup: Arc<AccessLogSetup>, node_id: Arc<str>) -> AccessLog {
        AccessLog {
            setup,
            node_id,
            buf: RefCell::new(Vec::with_capacity(FLUSH_BYTES + 1024)),
            out: RefCell::default(),
            since: Cell::new(None),
            clock: RefCell::default(),
        }
    }

    /// Writes the line of an answered request (`req` is `None` for a head refused before it
    /// was one).
    pub fn write(
        &self,
        record: &Record,
        client: IpAddr,
        req: Option<&Request<'_>>,
        response: &Response,
        sent: u64,
    ) {
        let now = Instant::now();
        let millis = |d: Duration| (d.as_secs_f64() * 1e6).round() / 1e3;
        let correlation = record.correlation.as_ref();
        let mut clock = self.clock.borrow_mut();
        let line = Line {
            time: clock.now(),
            node_id: &self.node_id,
            request_id: correlation.map_or("", |c| c.request_id()),
            trace_id: correlation.map_or("", |c| c.trace_id()),
            client: client.to_string(),
            method: req.map_or("", |r| r.method().as_str()),
            path: req.map_or("", |r| r.path()),
            protocol: req.map_or("", |r| protocol_name(r.version())),
            scheme: req.map_or("", |r| r.scheme()),
            ns: &record.ns,
            id: &record.id,
            status: response.status.as_u16(),
            bytes_in: req.map_or(0, |r| r.body_bytes_read()),
            bytes_out: sent,
            total_ms: record.started.map_or(0.0, |at| millis(now - at)),
            upstream_ms: record.upstream.map(millis),
            resolve_ms: (!record.resolve.is_zero()).then(|| millis(record.resolve)),
            outcome: record.outcome,
            session: &record.session,
            epoch: &record.epoch,
            error: error_of(response),
        };
        let mut buf = self.buf.borrow_mut();
        match self.setup.format {
            AccessLogFormat::Json => {
                // Our own plain fields serialize.
                let _ = serde_json::to_writer(&mut *buf, &line);
            }
            AccessLogFormat::Text => text_line(&line, &mut buf),
            AccessLogFormat::Off => return,
        }
        buf.push(b'\n');
        drop(clock);
        if self.since.get().is_none() {
            self.since.set(Some(now));
        }
        let due = buf.len() >= FLUSH_BYTES
            || self
                .since
                .get()
                .is_some_and(|at| now.duration_since(at) >= FLUSH_EVERY);
        drop(buf);
        if due {
            self.flush();
        }
    }

    /// Whether this log writes what `setup` describes (a reload that kept the access log's
    /// settings keeps its setup).
    pub fn writes_to(&self, setup: &Arc<AccessLogSetup>) -> bool {
        Arc::ptr_eq(&self.setup, setup)
    }

    /// Writes out the buffered lines (reopening the target first after a `SIGUSR1`).
    pub fn flush(&self) {
        let mut buf = self.buf.borrow_mut();
        if buf.is_empty() {
            return;
        }
        self.since.set(None);
        let generation = self.setup.reopen.load(Ordering::Relaxed);
        let mut out = self.out.borrow_mut();
        if out.as_ref().is_none_or(|(_, at)| *at != generation) {
            match self.setup.target.open() {
                Ok(file) => *out = Some((file, generation)),
                Err(e) => {
                    tracing::warn!(target = ?self.setup.target, error = %e, "access log: cannot open its target; lines dropped");
                    buf.clear();
                    return;
                }
            }
        }
        if let Some((file, _)) = out.as_mut()
            && let Err(e) = file.write_all(&buf)
        {
            tracing::warn!(target = ?self.setup.target, error = %e, "access log: write failed; lines dropped");
        }
        buf.clear();
    }
}

/// A log replaced by a reload writes out its last lines when the last request holding it is
/// done.
impl Drop for AccessLog {
    fn drop(&mut self) {
        self.flush();
    }
}

/// What an answer the node wrote itself says went wrong: its `{"error": …}`, or its plain text
/// (`bad gateway`, `upstream timeout`).
fn error_of(response: &Response) -> Option<String> {
    if response.is_relayed() || response.status.as_u16() < 400 {
        return None;
    }
    #[derive(serde::Deserialize)]
    struct Body {
        error: String,
    }
    let body = &response.body;
    match serde_json::from_slice::<Body>(body) {
        Ok(json) => Some(json.error),
        Err(_) if body.len() <= 256 => std::str::from_utf8(body).ok().map(str::to_owned),
        Err(_) => None,
    }
}

/// `key=value` pairs after the time, values quoted when they hold a space, a quote or a
/// control byte (escaped as JSON strings are), empty fields left out.
fn text_line(line: &Line<'_>, buf: &mut Vec<u8>) {
    let _ = write!(buf, "{}", line.time);
    let mut field = |name: &str, value: &str| {
        if value.is_empty() {
            return;
        }
        let _ = write!(buf, " {name}=");
        if value
            .bytes()
            .all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\\')
        {
            buf.extend_from_slice(value.as_bytes());
        } else {
            let _ = serde_json::to_writer(&mut *buf, value);
        }
    };
    field("node", line.node_id);
    field("request_id", line.request_id);
    field("trace_id", line.trace_id);
    field("client", &line.client);
    field("method", line.method);
    field("path", line.path);
    field("protocol", line.protocol);
    field("scheme", line.scheme);
    field("ns", line.ns);
    field("id", line.id);
    field("status", itoa::Buffer::new().format(line.status));
    field("bytes_in", itoa::Buffer::new().format(line.bytes_in));
    field("bytes_out", itoa::Buffer::new().format(line.bytes_out));
    field("total_ms", &line.total_ms.to_string());
    if let Some(ms) = line.upstream_ms {
        field("upstream_ms", &ms.to_string());
    }
    if let Some(ms) = line.resolve_ms {
        field("resolve_ms", &ms.to_string());
    }
    field("outcome", line.outcome.unwrap_or(""));
    field("session", line.session);
    field("epoch", line.epoch);
    field("error", line.error.as_deref().unwrap_or(""));
}

/// RFC 3339 UTC time with milliseconds; the date and time of day formatted once a second.
#[derive(Default)]
struct Clock {
    second: u64,
    text: String,
}

impl Clock {
    fn now(&mut self) -> &str {
        let since_epoch = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let second = since_epoch.as_secs();
        if second != self.second || self.text.is_empty() {
            self.second = second;
            self.text = rfc3339_second(second);
            self.text.push_str(".000Z");
        }
        let millis = since_epoch.subsec_millis();
        let at = self.text.len() - 4;
        self.text.replace_range(at..at + 3, &format!("{millis:03}"));
        &self.text
    }
}

/// `YYYY-MM-DDTHH:MM:SS` of a Unix time (civil from days, Howard Hinnant's algorithm).
fn rfc3339_second(unix: u64) -> String {
    let (days, rem) = (unix / 86_400, unix % 86_400);
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unix_times_format_as_rfc3339() {
        assert_eq!(rfc3339_second(0), "1970-01-01T00:00:00");
        assert_eq!(rfc3339_second(951_782_400), "2000-02-29T00:00:00");
        assert_eq!(rfc3339_second(1_796_202_815), "2026-12-02T09:13:35");
        assert_eq!(rfc3339_second(4_102_444_799), "2099-12-31T23:59:59");
    }

    fn line<'a>(error: Option<String>) -> Line<'a> {
        Line {
            time: "2026-12-03T09:43:41.123Z",
            node_id: "edge-1",
            request_id: "req 1",
            trace_id: "4bf92f3577b34da6a3ce929d0e0e4736",
            client: "127.0.0.1".into(),
            method: "GET",
            path: "/threads/abc/x",
            protocol: "HTTP/1.1",
            scheme: "https",
            ns: "/threads",
            id: "abc",
            status: 503,
            bytes_in: 0,
            bytes_out: 120,
            total_ms: 1.25,
            upstream_ms: None,
            resolve_ms: Some(0.5),
            outcome: Some("no-backends"),
            session: "",
            epoch: "",
            error,
        }
    }

    #[test]
    fn text_lines_quote_what_needs_it_and_leave_out_empty_fields() {
        let mut buf = Vec::new();
        text_line(&line(Some("no backends".into())), &mut buf);
        assert_eq!(
            String::from_utf8(buf).unwrap(),
            "2026-12-03T09:43:41.123Z node=edge-1 request_id=\"req 1\" \
             trace_id=4bf92f3577b34da6a3ce929d0e0e4736 client=127.0.0.1 method=GET \
             path=/threads/abc/x protocol=HTTP/1.1 scheme=https ns=/threads id=abc status=503 bytes_in=0 bytes_out=120 \
             total_ms=1.25 resolve_ms=0.5 outcome=no-backends error=\"no backends\""
        );
        let json: serde_json::Value = serde_json::to_value(line(None)).unwrap();
        assert_eq!(json["status"], 503);
        assert!(json.get("session").is_none() && json.get("error").is_none());
    }
}
