//! The node's log: `tracing` events to stderr, filtered by `log_level` (`PINBOARD_LOG` wins,
//! a reload replaces it),
//! as text or JSON lines (`log_format`), every line naming the node (`node_id`) whichever thread
//! wrote it (a core, the signal thread, startup): a text line ends with ` node_id=…`, a JSON
//! line carries a top-level `"node_id"` member.
//!
//! The name is put in by the formatter, not by a span each thread would have to enter: text
//! lines get it after the event's fields ([`NodeFields`], no copy), JSON lines as their first
//! member ([`JsonWithNode`], one copy of the line through a per-thread buffer). Lines said
//! once per key remember their keys in a [`SaidOnce`].

use std::cell::RefCell;
use std::collections::HashSet;
use std::fmt;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Mutex, OnceLock};

use tracing::{Event, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::format::{DefaultFields, Format, Json, Writer};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

use crate::config::LogFormat;

/// Starts the log; once per process, as soon as the configuration is known. `level`: the
/// configuration's `log_level`, unless `PINBOARD_LOG` is set.
pub fn init(format: LogFormat, level: &str, node_id: &str) {
    let builder = tracing_subscriber::fmt().with_writer(std::io::stderr);
    // The filter goes last: its reload handle names the formatter.
    match format {
        LogFormat::Json => {
            let builder = (builder.json().event_format(JsonWithNode::new(node_id)))
                .with_env_filter(filter(level))
                .with_filter_reloading();
            let handle = builder.reload_handle();
            keep_reload(move |filter| handle.reload(filter).map_err(|e| e.to_string()));
            builder.init();
        }
        // Colour only on a terminal: a log file or a collector gets plain text.
        LogFormat::Text => {
            let builder = builder
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
                .fmt_fields(NodeFields::new(node_id))
                .with_env_filter(filter(level))
                .with_filter_reloading();
            let handle = builder.reload_handle();
            keep_reload(move |filter| handle.reload(filter).map_err(|e| e.to_string()));
            builder.init();
        }
    }
}

/// Replaces the filter with `level` (a reload's `log_level`; `PINBOARD_LOG` still wins).
pub fn set_level(level: &str) -> Result<(), String> {
    match RELOAD.get() {
        Some(reload) => reload(filter(level)),
        None => Err("the log has not started".into()),
    }
}

type Reload = Box<dyn Fn(EnvFilter) -> Result<(), String> + Send + Sync>;

/// How the filter is replaced: the handle's type names the formatter, so it is kept boxed.
static RELOAD: OnceLock<Reload> = OnceLock::new();

fn keep_reload(reload: impl Fn(EnvFilter) -> Result<(), String> + Send + Sync + 'static) {
    let _ = RELOAD.set(Box::new(reload));
}

/// The filter for `level`, or `PINBOARD_LOG` when it is set (not empty).
fn filter(level: &str) -> EnvFilter {
    let asked = std::env::var("PINBOARD_LOG")
        .ok()
        .filter(|asked| !asked.is_empty());
    EnvFilter::try_new(filter_of(asked.as_deref().unwrap_or(level)))
        .unwrap_or_else(|_| EnvFilter::new(filter_of("info")))
}

/// The filter asked for, with rustls at ERROR unless it names rustls itself: rustls logs at
/// WARN what a client sends at will (an illegal SNI, say), once per handshake, as often as any
/// client cares to send one.
fn filter_of(asked: &str) -> String {
    if asked.contains("rustls") {
        asked.to_owned()
    } else {
        format!("{asked},rustls=error")
    }
}

/// The text format's fields, then ` node_id=…`.
pub struct NodeFields {
    inner: DefaultFields,
    suffix: String,
}

impl NodeFields {
    pub fn new(node_id: &str) -> NodeFields {
        NodeFields {
            inner: DefaultFields::new(),
            suffix: format!(" node_id={node_id}"),
        }
    }
}

impl<'writer> FormatFields<'writer> for NodeFields {
    fn format_fields<R: RecordFields>(
        &self,
        mut writer: Writer<'writer>,
        fields: R,
    ) -> fmt::Result {
        self.inner.format_fields(writer.by_ref(), fields)?;
        writer.write_str(&self.suffix)
    }
}

/// The JSON format, with `"node_id"` as the first member of each line's object.
pub struct JsonWithNode {
    inner: Format<Json>,
    /// `"node_id":"…"`, escaped once.
    member: String,
}

impl JsonWithNode {
    pub fn new(node_id: &str) -> JsonWithNode {
        let name = serde_json::to_string(node_id).expect("a string serializes");
        JsonWithNode {
            inner: Format::default().json().with_current_span(false),
            member: format!("\"node_id\":{name}"),
        }
    }

    /// `line` (one JSON object, as the inner format wrote it) with the member put first.
    fn write_line(&self, line: &str, writer: &mut Writer<'_>) -> fmt::Result {
        let Some(rest) = line.strip_prefix('{') else {
            return writer.write_str(line);
        };
        writer.write_char('{')?;
        writer.write_str(&self.member)?;
        if !rest.starts_with('}') {
            writer.write_char(',')?;
        }
        writer.write_str(rest)
    }
}

thread_local! {
    /// Each thread's line buffer, kept between lines.
    static LINE: RefCell<String> = const { RefCell::new(String::new()) };
}

impl<S, N> FormatEvent<S, N> for JsonWithNode
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    Format<Json>: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        LINE.with(|buffer| {
            // A line written while this thread's buffer is in use gets a buffer of its own.
            let mut own = String::new();
            let mut borrowed = buffer.try_borrow_mut();
            let line = match &mut borrowed {
                Ok(line) => {
                    line.clear();
                    &mut **line
                }
                Err(_) => &mut own,
            };
            self.inner.format_event(ctx, Writer::new(line), event)?;
            self.write_line(line, &mut writer)
        })
    }
}

/// The keys whose line was said (a heartbeat refusal's, per session and reason), so that it is
/// said once: at most [`SaidOnce::MAX`], all forgotten at once when full (a line is then said
/// again, once). Shared by the cores; its lock is taken only when such a line is due, never on
/// the data plane.
#[derive(Default)]
pub struct SaidOnce {
    seen: Mutex<HashSet<u64>>,
}

impl SaidOnce {
    const MAX: usize = 4096;

    /// Whether (`key`, `why`) is new, remembering it.
    pub fn first(&self, key: &[u8], why: &str) -> bool {
        let mut hasher = DefaultHasher::new();
        (key, why).hash(&mut hasher);
        let mut seen = self.seen.lock().expect("refusals lock");
        if seen.len() >= Self::MAX {
            seen.clear();
        }
        seen.insert(hasher.finish())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rustls_stays_at_error_unless_named() {
        assert_eq!(filter_of("info"), "info,rustls=error");
        assert_eq!(filter_of("debug"), "debug,rustls=error");
        assert_eq!(filter_of("info,rustls=debug"), "info,rustls=debug");
    }

    #[test]
    fn json_lines_get_the_node_first() {
        let format = JsonWithNode::new("edge\"7");
        let mut out = String::new();
        let mut writer = Writer::new(&mut out);
        format
            .write_line("{\"level\":\"INFO\"}\n", &mut writer)
            .unwrap();
        format.write_line("{}\n", &mut writer).unwrap();
        let lines: Vec<serde_json::Value> = out
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines[0]["node_id"], "edge\"7");
        assert_eq!(lines[0]["level"], "INFO");
        assert_eq!(lines[1], serde_json::json!({"node_id": "edge\"7"}));
    }
}
