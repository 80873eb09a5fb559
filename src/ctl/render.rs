//! What `pinboard ctl` prints without `--json`: the node's answers read into the few fields a
//! table shows, columns aligned, times relative to now ("in 42s", "3m ago"), one line for
//! what an act did. Pure: text in, text out.

use std::collections::BTreeMap;

use http::StatusCode;
use serde::Deserialize;
use serde::de::DeserializeOwned;

use super::Failure;

/// A `/registry/workers` entry (also the overview's `workers`), as far as it is shown.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Worker {
    session_id: String,
    client_id: String,
    namespaces: Vec<String>,
    hostname: Option<String>,
    /// Hostname-aware mode: each namespace's env; empty in single mode.
    #[serde(default)]
    envs: BTreeMap<String, String>,
    headroom: f64,
    draining: bool,
    /// An operator drain of the worker's client: a cordon (`deadline: null`) or a timed drain.
    #[serde(default)]
    operator_drain: Option<OperatorDrain>,
    /// Forwards in flight from the asked node to the worker.
    #[serde(default)]
    inflight: u64,
    degraded_since: Option<u64>,
    expiry: u64,
}

#[derive(Deserialize)]
struct OperatorDrain {
    deadline: Option<u64>,
}

#[derive(Deserialize)]
struct Workers {
    workers: Vec<Worker>,
}

#[derive(Deserialize)]
struct Overview {
    workers: Vec<Worker>,
    namespaces: Vec<Group>,
}

/// One (hostname, env, namespace) of the overview and its live placements.
#[derive(Deserialize)]
struct Group {
    hostname: Option<String>,
    env: String,
    namespace: String,
    entries: Vec<Entry>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Entry {
    id: String,
    /// `None`: a paused id with no live owner.
    session_id: Option<String>,
    /// A pending wind-down fence, epoch ms.
    expiry: Option<u64>,
    paused: Option<Pause>,
    tag: Option<String>,
}

/// An operator's pause of an instance.
#[derive(Deserialize)]
struct Pause {
    at: u64,
    reason: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Health {
    resolutions: BTreeMap<String, u64>,
    connections: u64,
    quarantine_ms: u64,
    uptime_ms: u64,
    rss_bytes: Option<u64>,
}

fn read<T: DeserializeOwned>(body: &[u8]) -> Result<T, Failure> {
    serde_json::from_slice(body)
        .map_err(|e| Failure::Failed(format!("the node's answer is not what ctl reads: {e}")))
}

/// `GET /registry/workers` as a table, with a count line.
pub fn workers(body: &[u8], now: u64) -> Result<String, Failure> {
    let Workers { workers } = read(body)?;
    let mut table = Table::new(&[
        "CLIENT",
        "HOSTNAME",
        "SESSION",
        "NAMESPACES",
        "HEADROOM",
        "IN FLIGHT",
        "STATE",
        "DEGRADED",
        "LEASE LEFT",
    ]);
    for w in &workers {
        let namespaces: Vec<String> = w
            .namespaces
            .iter()
            .map(|ns| match w.envs.get(ns) {
                Some(env) => format!("{ns}={env}"),
                None => ns.clone(),
            })
            .collect();
        let state = match (&w.operator_drain, w.draining) {
            (Some(OperatorDrain { deadline: Some(at) }), _) => {
                format!("drain {}", relative(*at, now))
            }
            (Some(OperatorDrain { deadline: None }), _) => "cordoned".to_owned(),
            (None, true) => "draining".to_owned(),
            (None, false) => "serving".to_owned(),
        };
        table.row(vec![
            w.client_id.clone(),
            or_dash(w.hostname.as_deref()),
            short(&w.session_id).to_owned(),
            namespaces.join(","),
            number(w.headroom),
            w.inflight.to_string(),
            state,
            w.degraded_since
                .map_or_else(|| "-".to_owned(), |since| relative(since, now)),
            match w.expiry.checked_sub(now) {
                Some(left) if left > 0 => span(left),
                _ => "expired".to_owned(),
            },
        ]);
    }
    Ok(table.render() + &count(workers.len(), "worker"))
}

/// `GET /registry/overview` as a table of placements, each with its owner's client id (from
/// the answer's `workers`), with a count line.
pub fn instances(body: &[u8], now: u64) -> Result<String, Failure> {
    let overview: Overview = read(body)?;
    let clients: BTreeMap<&str, &str> = overview
        .workers
        .iter()
        .map(|w| (w.session_id.as_str(), w.client_id.as_str()))
        .collect();
    let mut table = Table::new(&[
        "NAMESPACE",
        "ID",
        "SESSION",
        "CLIENT",
        "HOSTNAME",
        "ENV",
        "WIND-DOWN",
        "PAUSED",
        "TAG",
    ]);
    let mut placements = 0;
    for group in &overview.namespaces {
        for entry in &group.entries {
            placements += 1;
            let session = entry.session_id.as_deref();
            let paused = entry.paused.as_ref().map_or_else(
                || "-".to_owned(),
                |p| match &p.reason {
                    Some(reason) => format!("{}: {reason}", relative(p.at, now)),
                    None => relative(p.at, now),
                },
            );
            table.row(vec![
                group.namespace.clone(),
                entry.id.clone(),
                or_dash(session.map(short)),
                or_dash(session.and_then(|s| clients.get(s).copied())),
                or_dash(group.hostname.as_deref()),
                group.env.clone(),
                entry
                    .expiry
                    .map_or_else(|| "-".to_owned(), |at| relative(at, now)),
                paused,
                or_dash(entry.tag.as_deref()),
            ]);
        }
    }
    Ok(table.render() + &count(placements, "instance"))
}

/// `GET /registry/health` and the `/readyz` status as a list of facts, then the resolutions
/// by outcome (those that happened).
pub fn health(body: &[u8], ready: StatusCode) -> Result<String, Failure> {
    let health: Health = read(body)?;
    let ready = match ready {
        StatusCode::OK => "yes".to_owned(),
        StatusCode::SERVICE_UNAVAILABLE => {
            "no (503: stopping, not the serving fleet, or its Redis away)".to_owned()
        }
        other => format!("no ({})", other.as_u16()),
    };
    let mut facts = Table::untitled();
    facts.row(vec!["ready".into(), ready]);
    facts.row(vec!["connections".into(), health.connections.to_string()]);
    let quarantine = match health.quarantine_ms {
        0 => "none".to_owned(),
        ms => format!("{} left", span(ms)),
    };
    facts.row(vec!["quarantine".into(), quarantine]);
    facts.row(vec!["uptime".into(), span(health.uptime_ms)]);
    if let Some(rss) = health.rss_bytes {
        facts.row(vec![
            "memory (RSS)".into(),
            format!("{:.1} MiB", rss as f64 / 1048576.0),
        ]);
    }
    let mut outcomes = Table::new(&["OUTCOME", "RESOLUTIONS"]);
    for (outcome, n) in health.resolutions.iter().filter(|(_, n)| **n > 0) {
        outcomes.row(vec![outcome.clone(), n.to_string()]);
    }
    let resolutions = if outcomes.rows.len() > 1 {
        outcomes.render()
    } else {
        "no resolutions yet\n".to_owned()
    };
    Ok(facts.render() + "\n" + &resolutions)
}

#[derive(Deserialize)]
struct Revoked {
    revoked: bool,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Queued {
    One(bool),
    Many(u64),
}

#[derive(Deserialize)]
struct WindDownAnswer {
    queued: Queued,
}

/// What `POST /registry/drain` did (the answer is `{"drained":true}`).
pub fn drained(client_id: &str, deadline: Option<u64>) -> String {
    match deadline {
        None => format!(
            "drained: {client_id} is cordoned: no new placements from its next heartbeat, its own keep routing\n"
        ),
        Some(seconds) => format!(
            "drained: {client_id} takes no new placements, and its lease ends within {} (one lease at least)\n",
            span(seconds * 1000)
        ),
    }
}

/// What `POST /registry/undrain` did.
pub fn undrained(body: &[u8], client_id: &str) -> Result<String, Failure> {
    let Revoked { revoked } = read(body)?;
    Ok(if revoked {
        format!("undrained: {client_id} takes placements again from its next heartbeat\n")
    } else {
        format!("{client_id} was not drained\n")
    })
}

/// What `POST /registry/wind_down` queued for `target` (`/NS/ID` or `/NS`); `deadline` is the
/// one sent, `None` for a revocation.
pub fn wound_down(body: &[u8], target: &str, deadline: Option<u64>) -> Result<String, Failure> {
    let WindDownAnswer { queued } = read(body)?;
    let when = match deadline {
        Some(0) => ", the fence falls in one lease".to_owned(),
        Some(seconds) => format!(
            ", the fence falls in {} (one lease at least)",
            span(seconds * 1000)
        ),
        None => String::new(),
    };
    let act = if deadline.is_some() {
        "wind-down"
    } else {
        "revocation"
    };
    Ok(match queued {
        Queued::One(true) => format!("queued: {act} of {target}{when}\n"),
        Queued::One(false) => {
            format!("nothing queued: {target} has no placement (or its owner is gone)\n")
        }
        Queued::Many(n) => format!(
            "queued: {act} of {} in {target}{when}\n",
            count_words(n as usize, "placement")
        ),
    })
}

#[derive(Deserialize)]
struct MoveAnswer {
    queued: bool,
    /// The successor's session, `None` when `to` could not take the instance.
    to: Option<String>,
}

/// What `POST /registry/move` did with `target` (`/NS/ID`) for the client `to`; `deadline` is
/// the one sent.
pub fn moved(
    body: &[u8],
    target: &str,
    to: &str,
    deadline: Option<u64>,
) -> Result<String, Failure> {
    let MoveAnswer {
        queued,
        to: session,
    } = read(body)?;
    let when = match deadline {
        None | Some(0) => "one lease".to_owned(),
        Some(seconds) => format!("{} (one lease at least)", span(seconds * 1000)),
    };
    Ok(match (queued, session) {
        (false, _) => format!("nothing queued: {target} has no placement\n"),
        (true, Some(session)) => format!(
            "queued: move of {target} to {to} (session {}): its owner lets go within {when}, then it is placed there\n",
            short(&session)
        ),
        (true, None) => format!(
            "queued: move of {target}: its owner lets go within {when}; {to} cannot take it (unknown, draining, degraded or not serving it), so it is placed as any other\n"
        ),
    })
}

/// What `POST /registry/pause` did (the answer is `{"ok":true}`).
pub fn paused(target: &str) -> String {
    format!("paused: {target} answers 503 on every node until it is resumed\n")
}

/// What `POST /registry/resume` did (the answer is `{"ok":true}`).
pub fn resumed(target: &str) -> String {
    format!("resumed: {target} is served again\n")
}

/// Columns aligned: each cell padded to its column's widest, two spaces apart, the last
/// column unpadded. The first row is the header, when there is one.
struct Table {
    rows: Vec<Vec<String>>,
}

impl Table {
    fn new(header: &[&str]) -> Table {
        Table {
            rows: vec![header.iter().map(|h| (*h).to_owned()).collect()],
        }
    }

    fn untitled() -> Table {
        Table { rows: Vec::new() }
    }

    fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    fn render(&self) -> String {
        let columns = self.rows.iter().map(Vec::len).max().unwrap_or(0);
        let widths: Vec<usize> = (0..columns)
            .map(|c| {
                self.rows
                    .iter()
                    .filter_map(|r| r.get(c))
                    .map(|cell| cell.chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let mut out = String::new();
        for row in &self.rows {
            let mut line = String::new();
            for (cell, width) in row.iter().zip(&widths) {
                line.push_str(&format!("{cell:<width$}  "));
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

/// `at` (epoch ms) against `now`: "in 42s", "3m ago", "now".
fn relative(at: u64, now: u64) -> String {
    match at.cmp(&now) {
        std::cmp::Ordering::Greater => format!("in {}", span(at - now)),
        std::cmp::Ordering::Less => format!("{} ago", span(now - at)),
        std::cmp::Ordering::Equal => "now".to_owned(),
    }
}

/// A length of time in ms, rounded to the second, in its two largest units: "42s", "3m5s",
/// "2h14m", "3d4h" (a zero second unit left out: "1m").
fn span(ms: u64) -> String {
    let s = (ms + 500) / 1000;
    let (big, small) = match s {
        0..60 => return format!("{s}s"),
        60..3600 => ((s / 60, 'm'), (s % 60, 's')),
        3600..86400 => ((s / 3600, 'h'), (s % 3600 / 60, 'm')),
        _ => ((s / 86400, 'd'), (s % 86400 / 3600, 'h')),
    };
    match small {
        (0, _) => format!("{}{}", big.0, big.1),
        _ => format!("{}{}{}{}", big.0, big.1, small.0, small.1),
    }
}

/// The first 8 characters of a session id (32 hex digits): enough to tell sessions apart.
fn short(session: &str) -> &str {
    session.get(..8).unwrap_or(session)
}

fn or_dash(value: Option<&str>) -> String {
    value.unwrap_or("-").to_owned()
}

/// A headroom: whole numbers without decimals.
fn number(value: f64) -> String {
    if value.fract() == 0.0 {
        format!("{value:.0}")
    } else {
        format!("{value:.1}")
    }
}

fn count_words(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

fn count(n: usize, noun: &str) -> String {
    count_words(n, noun) + "\n"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_and_relative_times() {
        for (ms, text) in [
            (0, "0s"),
            (499, "0s"),
            (42_000, "42s"),
            (59_600, "1m"),
            (185_000, "3m5s"),
            (3_600_000, "1h"),
            (8_040_000, "2h14m"),
            (100_800_000, "1d4h"),
        ] {
            assert_eq!(span(ms), text, "{ms}");
        }
        assert_eq!(relative(1_042_000, 1_000_000), "in 42s");
        assert_eq!(relative(1_000_000, 1_180_000), "3m ago");
        assert_eq!(relative(5, 5), "now");
    }

    #[test]
    fn tables_align_their_columns() {
        let mut t = Table::new(&["A", "LONGER"]);
        t.row(vec!["wide cell".into(), "x".into()]);
        t.row(vec!["é".into(), "".into()]);
        assert_eq!(t.render(), "A          LONGER\nwide cell  x\né\n");
    }

    #[test]
    fn a_worker_row_shows_its_drain_and_lease() {
        let now = 1_000_000;
        let body = br#"{"workers":[{"sessionId":"0123456789abcdef0123456789abcdef","clientId":"w2",
            "advertiseUrl":"http://127.0.0.1:1","namespaces":["/docs","/threads"],"hostname":"h1",
            "envs":{"/docs":"prod","/threads":"prod"},"takeover":"wind_down","headroom":9.5,
            "draining":true,"workerDraining":false,"operatorDrain":{"deadline":1060000},
            "inflight":3,"drain":{"deadline":1060000},"degradedSince":940000,"expiry":1015000}]}"#;
        let text = workers(body, now).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        let cells: Vec<&str> = lines[1]
            .split("  ")
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .collect();
        assert_eq!(
            cells,
            [
                "w2",
                "h1",
                "01234567",
                "/docs=prod,/threads=prod",
                "9.5",
                "3",
                "drain in 1m",
                "1m ago",
                "15s"
            ]
        );
        assert_eq!(lines[2], "1 worker");
        assert!(matches!(workers(b"{}", now), Err(Failure::Failed(_))));
    }

    #[test]
    fn wind_down_lines() {
        assert_eq!(
            wound_down(br#"{"queued":true}"#, "/t/a", Some(30)).unwrap(),
            "queued: wind-down of /t/a, the fence falls in 30s (one lease at least)\n"
        );
        assert_eq!(
            wound_down(br#"{"queued":3}"#, "/t", None).unwrap(),
            "queued: revocation of 3 placements in /t\n"
        );
        assert_eq!(
            wound_down(br#"{"queued":false}"#, "/t/a", Some(0)).unwrap(),
            "nothing queued: /t/a has no placement (or its owner is gone)\n"
        );
    }

    #[test]
    fn move_lines() {
        let to = br#"{"queued":true,"to":"0123456789abcdef0123456789abcdef"}"#;
        assert_eq!(
            moved(to, "/t/a", "w2", None).unwrap(),
            "queued: move of /t/a to w2 (session 01234567): its owner lets go within one lease, then it is placed there\n"
        );
        assert_eq!(
            moved(br#"{"queued":true,"to":null}"#, "/t/a", "w9", Some(90)).unwrap(),
            "queued: move of /t/a: its owner lets go within 1m30s (one lease at least); w9 cannot take it (unknown, draining, degraded or not serving it), so it is placed as any other\n"
        );
        assert_eq!(
            moved(br#"{"queued":false,"to":null}"#, "/t/a", "w2", None).unwrap(),
            "nothing queued: /t/a has no placement\n"
        );
    }

    #[test]
    fn a_paused_instance_without_an_owner_is_listed() {
        let body = br#"{"workers":[],"namespaces":[{"hostname":null,"env":"default",
            "namespace":"/t","sessionIds":[],"entries":[{"id":"a","sessionId":null,
            "paused":{"at":940000,"by":"ops","reason":"incident 7"}},{"id":"b","sessionId":null,
            "paused":{"at":1000000,"by":"ops","reason":null}}]}]}"#;
        let text = instances(body, 1_000_000).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].contains("WIND-DOWN  PAUSED  "), "{text}");
        fn cells(line: &str) -> Vec<&str> {
            let all = line.split("  ").map(str::trim);
            all.filter(|c| !c.is_empty()).collect()
        }
        assert_eq!(
            cells(lines[1]),
            [
                "/t",
                "a",
                "-",
                "-",
                "-",
                "default",
                "-",
                "1m ago: incident 7",
                "-"
            ]
        );
        assert_eq!(
            cells(lines[2]),
            ["/t", "b", "-", "-", "-", "default", "-", "now", "-"]
        );
        assert_eq!(lines[3], "2 instances");
    }
}
