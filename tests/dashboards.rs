//! The Grafana dashboard and the Prometheus alerting rules under `deploy/`, held to what a real
//! node exports: a real node on a real redis-server, with a worker and traffic so that every
//! family has samples, is scraped, and every metric, label and label value the dashboard's and
//! the rules' PromQL names must be in that scrape. The dashboard's shape (data source, `job` and
//! `instance` variables, a query and a unit on every panel) and the rules' (severity, runbook,
//! a promtool case firing each alert) are checked too, and `promtool check rules` / `promtool
//! test rules` run on them. Then a real Prometheus scrapes a real node with the rules loaded:
//! every panel's query has data, no alert is pending on a healthy node, and the fleet's alerts
//! go pending once Redis is gone. promtool and prometheus are Debian's `prometheus` package:
//! without it those checks are skipped with a note, unless `CI` is set.
//!
//! The PromQL is read by a small scanner ([`reads`]): selectors with their matchers, and the
//! labels of `by`/`without`/`on`/`ignoring`/`group_left`/`group_right`.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use serde_yaml_ng::Value as Yaml;

use support::fleet::Fixture;
use support::http::get;
use support::node::eventually;
use support::process::installed_or_skipped;

/// Labels Prometheus puts on every series of a target: valid on any family.
const TARGET_LABELS: [&str; 2] = ["job", "instance"];

/// The families of these prefixes are the node's: an expression naming one must find it in
/// the scrape (`up` and others are Prometheus' own).
const NODE_PREFIXES: [&str; 2] = ["pinboard_", "process_"];

/// Units a panel may show its values in (Grafana's unit ids).
const UNITS: [&str; 7] = ["reqps", "ops", "s", "percentunit", "short", "none", "bytes"];

/// The alerts the issue asks for; alerts.yml may hold more.
const REQUIRED_ALERTS: [&str; 6] = [
    "PinboardNodeNotServing",
    "PinboardFleetLicenseLost",
    "PinboardRedisErrors",
    "PinboardHigh5xxRatio",
    "PinboardSweeperLeaseUnheld",
    "PinboardWakesFailing",
];

fn repo_file(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo_file(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

// ---- What a node exports -------------------------------------------------------------------

/// A `/metrics` text as the checks need it: each sample name (`pinboard_resolutions_total`,
/// `pinboard_redis_duration_seconds_bucket`) with each of its labels and the values seen.
#[derive(Debug, Default)]
struct Exported {
    samples: BTreeMap<String, BTreeMap<String, BTreeSet<String>>>,
}

impl Exported {
    fn parse(text: &str) -> Exported {
        let mut exported = Exported::default();
        for line in text
            .lines()
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
        {
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            let labels = exported.samples.entry(line[..end].to_owned()).or_default();
            if line[end..].starts_with('{') {
                let mut scan = Scanner::new(&line[end..]);
                for m in scan.matchers() {
                    labels.entry(m.label).or_default().insert(m.value);
                }
            }
        }
        exported
    }

    fn has_label(&self, metric: &str, label: &str) -> bool {
        TARGET_LABELS.contains(&label)
            || self
                .samples
                .get(metric)
                .is_some_and(|labels| labels.contains_key(label))
    }
}

// ---- What a PromQL expression reads --------------------------------------------------------

#[derive(Debug, PartialEq)]
struct Matcher {
    label: String,
    op: String,
    value: String,
}

#[derive(Debug, PartialEq)]
struct Selector {
    metric: String,
    matchers: Vec<Matcher>,
}

/// The selectors of an expression and the labels its groupings and vector matchings name.
#[derive(Debug, Default, PartialEq)]
struct Reads {
    selectors: Vec<Selector>,
    grouping: Vec<String>,
}

/// Words followed by a list of label names.
const GROUPING: [&str; 6] = [
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];

/// Words that are not metric names where they stand alone: binary operators and modifiers,
/// and the aggregations, which a `by (…)` or `without (…)` may follow.
const KEYWORDS: [&str; 21] = [
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "atan2",
    "inf",
    "nan",
    "group_left",
    "group_right",
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
];

struct Scanner<'a> {
    text: &'a str,
    at: usize,
}

impl<'a> Scanner<'a> {
    fn new(text: &'a str) -> Scanner<'a> {
        Scanner { text, at: 0 }
    }

    fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.at).copied()
    }

    fn skip_space(&mut self) {
        while self.peek().is_some_and(|c| c.is_ascii_whitespace()) {
            self.at += 1;
        }
    }

    /// The run of bytes from here on that `keep` accepts.
    fn take_while(&mut self, keep: impl Fn(u8) -> bool) -> &'a str {
        let start = self.at;
        while self.peek().is_some_and(&keep) {
            self.at += 1;
        }
        &self.text[start..self.at]
    }

    /// A metric or label name, `[a-zA-Z_:][a-zA-Z0-9_:]*`.
    fn ident(&mut self) -> &'a str {
        let name = self.take_while(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b':');
        assert!(
            !name.is_empty() && !name.as_bytes()[0].is_ascii_digit(),
            "a name expected at {} of {:?}",
            self.at,
            self.text
        );
        name
    }

    /// A quoted string from its opening quote on, escapes resolved.
    fn string(&mut self) -> String {
        let quote = self.peek().unwrap();
        self.at += 1;
        let mut out = String::new();
        let mut chars = self.text[self.at..].char_indices();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' if quote != b'`' => {
                    let (_, escaped) = chars.next().expect("an escape ends the text");
                    out.push(if escaped == 'n' { '\n' } else { escaped });
                }
                c if c as u32 == u32::from(quote) => {
                    self.at += i + 1;
                    return out;
                }
                c => out.push(c),
            }
        }
        panic!("unterminated string in {:?}", self.text)
    }

    /// Skips past the next `close`.
    fn skip_past(&mut self, close: u8) {
        self.take_while(|c| c != close);
        assert_eq!(
            self.peek(),
            Some(close),
            "no {} in {:?}",
            close as char,
            self.text
        );
        self.at += 1;
    }

    /// The comma-separated items of a list, from its opening bracket through `close`.
    fn list<T>(&mut self, close: u8, mut item: impl FnMut(&mut Self) -> T) -> Vec<T> {
        self.at += 1;
        let mut items = Vec::new();
        loop {
            self.skip_space();
            match self.peek() {
                Some(c) if c == close => {
                    self.at += 1;
                    return items;
                }
                Some(b',') => self.at += 1,
                Some(_) => items.push(item(self)),
                None => panic!("no {} in {:?}", close as char, self.text),
            }
        }
    }

    /// `{label op "value", …}` from its `{` on.
    fn matchers(&mut self) -> Vec<Matcher> {
        self.list(b'}', |scan| {
            let label = scan.ident().to_owned();
            scan.skip_space();
            let op = scan.take_while(|c| b"=!~".contains(&c)).to_owned();
            assert!(
                ["=", "!=", "=~", "!~"].contains(&op.as_str()),
                "matcher {label}{op} in {:?}",
                scan.text
            );
            scan.skip_space();
            let value = scan.string();
            Matcher { label, op, value }
        })
    }

    /// `(label, …)` from its `(` on.
    fn label_list(&mut self) -> Vec<String> {
        self.list(b')', |scan| scan.ident().to_owned())
    }
}

/// What `expr` reads: its selectors and the labels it groups or matches on. Strings outside
/// matchers, range and subquery brackets, numbers and Grafana's `$variables` are passed over.
fn reads(expr: &str) -> Reads {
    let mut scan = Scanner::new(expr);
    let mut reads = Reads::default();
    loop {
        scan.skip_space();
        let Some(c) = scan.peek() else {
            return reads;
        };
        match c {
            b'"' | b'\'' | b'`' => {
                scan.string();
            }
            b'[' => scan.skip_past(b']'),
            b'$' => {
                scan.at += 1;
                if scan.peek() == Some(b'{') {
                    scan.skip_past(b'}');
                } else {
                    scan.ident();
                }
            }
            b'{' => panic!("a selector without a metric name in {expr:?}"),
            c if c.is_ascii_digit() || c == b'.' => {
                scan.take_while(|c| c.is_ascii_alphanumeric() || c == b'.');
            }
            c if c.is_ascii_alphabetic() || c == b'_' || c == b':' => {
                let name = scan.ident();
                scan.skip_space();
                match scan.peek() {
                    Some(b'{') => reads.selectors.push(Selector {
                        metric: name.to_owned(),
                        matchers: scan.matchers(),
                    }),
                    Some(b'(') if GROUPING.contains(&name) => {
                        reads.grouping.extend(scan.label_list())
                    }
                    // A function: its arguments are read on.
                    Some(b'(') => {}
                    _ if KEYWORDS.contains(&name) => {}
                    _ => reads.selectors.push(Selector {
                        metric: name.to_owned(),
                        matchers: Vec::new(),
                    }),
                }
            }
            _ => scan.at += 1,
        }
    }
}

/// What a Grafana query variable reads: `label_values(selector, label)` reads the selector and
/// needs the label on it; anything else is PromQL.
fn variable_reads(query: &str) -> Reads {
    let Some(args) = query
        .strip_prefix("label_values(")
        .and_then(|q| q.strip_suffix(')'))
    else {
        return reads(query);
    };
    let (selector, label) = args
        .rsplit_once(',')
        .expect("label_values(selector, label)");
    let mut reads = reads(selector);
    reads.grouping.push(label.trim().to_owned());
    reads
}

/// Where a query stands.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Origin {
    /// A dashboard panel's target: each of its node selectors takes `$job` and `$instance`.
    Panel,
    /// A dashboard variable's query (`label_values(…)`).
    Variable,
    /// An alerting rule's `expr`.
    Alert,
}

struct Query {
    origin: Origin,
    /// Which panel, variable or alert, for the messages.
    place: String,
    expr: String,
}

impl Query {
    fn reads(&self) -> Reads {
        match self.origin {
            Origin::Variable => variable_reads(&self.expr),
            Origin::Panel | Origin::Alert => reads(&self.expr),
        }
    }
}

/// What is wrong with a query (`reads`, from `source`) against what the node exports: a node
/// family it does not export, a label that family does not have, a value it never takes; and
/// a panel's node selector without the dashboard's `$job` and `$instance`.
fn problems(exported: &Exported, source: &str, reads: &Reads, origin: Origin) -> Vec<String> {
    let mut problems = Vec::new();
    let node: Vec<&Selector> = reads
        .selectors
        .iter()
        .filter(|s| NODE_PREFIXES.iter().any(|p| s.metric.starts_with(p)))
        .collect();
    // `up`, Prometheus' own health of a scrape, is the one other series an alert may read.
    if node.is_empty() && !reads.selectors.iter().any(|s| s.metric == "up") {
        problems.push(format!("{source}: reads no family of the node"));
    }
    for selector in &node {
        let metric = &selector.metric;
        let Some(labels) = exported.samples.get(metric) else {
            problems.push(format!("{source}: the node exports no {metric}"));
            continue;
        };
        for m in &selector.matchers {
            if !exported.has_label(metric, &m.label) {
                problems.push(format!("{source}: {metric} has no label {}", m.label));
                continue;
            }
            // A value written out must be one the node gives (the target's labels are not its).
            let literal = m.op == "=" && !m.value.contains('$');
            let unknown = labels
                .get(&m.label)
                .filter(|values| literal && !values.contains(&m.value));
            if let Some(values) = unknown {
                problems.push(format!(
                    "{source}: {metric}{{{}=\"{}\"}} is never exported (values: {values:?})",
                    m.label, m.value
                ));
            }
        }
        if origin == Origin::Panel {
            for (label, value) in [("job", "$job"), ("instance", "$instance")] {
                let takes = selector
                    .matchers
                    .iter()
                    .any(|m| m.label == label && m.op == "=~" && m.value == value);
                if !takes {
                    problems.push(format!("{source}: {metric} lacks {label}=~\"{value}\""));
                }
            }
        }
    }
    for label in &reads.grouping {
        if !node.iter().any(|s| exported.has_label(&s.metric, label)) {
            problems.push(format!(
                "{source}: no family it reads has the label {label}"
            ));
        }
    }
    problems
}

// ---- The dashboard -------------------------------------------------------------------------

/// Every query of the dashboard: the panels' targets and the query variables.
fn dashboard_queries(dashboard: &Value) -> Vec<Query> {
    let mut queries = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            queries.push(Query {
                origin: Origin::Panel,
                place: format!("panel {} {}", panel["title"], target["refId"]),
                expr: target["expr"].as_str().unwrap().to_owned(),
            });
        }
    }
    for variable in dashboard["templating"]["list"].as_array().unwrap() {
        if variable["type"] == "query" {
            let place = format!("variable {}", variable["name"]);
            let query = variable["query"]["query"].as_str().unwrap();
            assert_eq!(variable["definition"], query, "{place}");
            queries.push(Query {
                origin: Origin::Variable,
                place,
                expr: query.to_owned(),
            });
        }
    }
    queries
}

/// The dashboard's shape: an importable JSON model with a Prometheus data-source variable,
/// `job` and `instance` variables over the node's series, and on every panel a title, the
/// data source, a unit and at least one query.
fn dashboard_shape_problems(dashboard: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    let mut problem = |ok: bool, what: String| {
        if !ok {
            problems.push(what);
        }
    };
    problem(
        dashboard["schemaVersion"].as_u64().is_some_and(|v| v >= 36),
        format!("schemaVersion {}", dashboard["schemaVersion"]),
    );
    problem(
        dashboard["uid"].is_string() && dashboard["title"].is_string(),
        "uid and title".into(),
    );
    let variables = dashboard["templating"]["list"].as_array().unwrap();
    let variable = |name: &str| variables.iter().find(|v| v["name"] == name);
    let source = variable("datasource");
    problem(
        source.is_some_and(|v| v["type"] == "datasource" && v["query"] == "prometheus"),
        format!("a datasource variable of type prometheus: {source:?}"),
    );
    let ours = json!({"type": "prometheus", "uid": "${datasource}"});
    for name in ["job", "instance"] {
        let v = variable(name);
        problem(
            v.is_some_and(|v| {
                v["type"] == "query" && v["datasource"] == ours && v["multi"] == true
            }),
            format!("a multi-value query variable {name} on ${{datasource}}: {v:?}"),
        );
    }
    let mut ids = BTreeSet::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        let title = panel["title"].as_str().unwrap_or("");
        problem(
            !title.is_empty(),
            format!("a panel without a title: {panel}"),
        );
        problem(
            ids.insert(panel["id"].as_u64()),
            format!("panel {title:?}: id {} again", panel["id"]),
        );
        let grid = &panel["gridPos"];
        let right = grid["x"].as_u64().unwrap_or(99) + grid["w"].as_u64().unwrap_or(99);
        problem(
            right <= 24 && grid["h"].as_u64().is_some() && grid["y"].as_u64().is_some(),
            format!("panel {title:?}: gridPos {grid}"),
        );
        if panel["type"] == "row" {
            problem(
                panel.get("targets").is_none(),
                format!("row {title:?} has queries"),
            );
            continue;
        }
        problem(
            panel["datasource"] == ours,
            format!("panel {title:?}: datasource {}", panel["datasource"]),
        );
        let unit = panel["fieldConfig"]["defaults"]["unit"].as_str();
        problem(
            unit.is_some_and(|u| UNITS.contains(&u)),
            format!("panel {title:?}: unit {unit:?}, not one of {UNITS:?}"),
        );
        let targets = panel["targets"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        problem(!targets.is_empty(), format!("panel {title:?} has no query"));
        for target in targets {
            let expr = target["expr"].as_str().unwrap_or("");
            problem(
                !expr.trim().is_empty() && target["refId"].is_string(),
                format!("panel {title:?}: a target without expr or refId: {target}"),
            );
            problem(
                target.get("datasource").is_none_or(|d| *d == ours),
                format!(
                    "panel {title:?}: target datasource {}",
                    target["datasource"]
                ),
            );
        }
    }
    problems
}

// ---- The alerting rules --------------------------------------------------------------------

/// The rules of alerts.yml's one group, `pinboard`.
fn alert_rules() -> Vec<Yaml> {
    let file: Yaml = serde_yaml_ng::from_str(&read("deploy/prometheus/alerts.yml")).unwrap();
    let groups = file["groups"].as_sequence().unwrap();
    assert_eq!(groups.len(), 1, "one group");
    assert_eq!(groups[0]["name"].as_str(), Some("pinboard"));
    groups[0]["rules"].as_sequence().unwrap().clone()
}

/// The anchors of a Markdown file's headings (not `#` lines of code blocks), as GitHub makes
/// them.
fn anchors(markdown: &str) -> BTreeSet<String> {
    let mut in_code = false;
    markdown
        .lines()
        .filter(|l| {
            in_code ^= l.starts_with("```");
            !in_code
        })
        .filter_map(|l| l.strip_prefix('#'))
        .map(|heading| {
            heading
                .trim_start_matches('#')
                .trim()
                .to_lowercase()
                .chars()
                .filter_map(|c| match c {
                    ' ' => Some('-'),
                    c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                    _ => None,
                })
                .collect()
        })
        .collect()
}

/// Each rule's shape: an alert with a `for`, a severity of `page` or `ticket`, a summary, a
/// description and a `runbook_url` that names a heading of the docs.
fn rule_shape_problems(rules: &[Yaml]) -> Vec<String> {
    let mut problems = Vec::new();
    let mut names = BTreeSet::new();
    for rule in rules {
        let name = rule["alert"].as_str().unwrap_or("");
        if !name.starts_with("Pinboard") || !names.insert(name) {
            problems.push(format!("an alert named {name:?} (again?)"));
        }
        if rule["for"].as_str().is_none() {
            problems.push(format!("{name}: no `for`"));
        }
        let severity = rule["labels"]["severity"].as_str();
        if !matches!(severity, Some("page" | "ticket")) {
            problems.push(format!("{name}: severity {severity:?}"));
        }
        for key in ["summary", "description"] {
            if rule["annotations"][key].as_str().is_none_or(str::is_empty) {
                problems.push(format!("{name}: no {key}"));
            }
        }
        let runbook = rule["annotations"]["runbook_url"].as_str().unwrap_or("");
        let documented = runbook.split_once('#').is_some_and(|(doc, anchor)| {
            doc.ends_with(".md") && anchors(&read(doc)).contains(anchor)
        });
        if !documented {
            problems.push(format!(
                "{name}: runbook_url {runbook:?} is no heading of the docs"
            ));
        }
    }
    for required in REQUIRED_ALERTS {
        if !names.contains(required) {
            problems.push(format!("no {required}"));
        }
    }
    problems
}

/// Each alert must have a promtool case where it fires and one where it is expected quiet.
fn untested_alerts(rules: &[Yaml]) -> Vec<String> {
    let file: Yaml = serde_yaml_ng::from_str(&read("deploy/prometheus/alerts_test.yml")).unwrap();
    let mut fired = BTreeSet::new();
    let mut quiet = BTreeSet::new();
    for case in file["tests"].as_sequence().unwrap() {
        for check in case["alert_rule_test"].as_sequence().into_iter().flatten() {
            let name = check["alertname"].as_str().unwrap().to_owned();
            let expected = check["exp_alerts"].as_sequence().map_or(0, Vec::len);
            if expected == 0 {
                quiet.insert(name);
            } else {
                fired.insert(name);
            }
        }
    }
    let mut missing = Vec::new();
    for name in rules.iter().filter_map(|r| r["alert"].as_str()) {
        if !fired.contains(name) {
            missing.push(format!("{name}: no promtool case fires it"));
        }
        if !quiet.contains(name) {
            missing.push(format!("{name}: no promtool case keeps it quiet"));
        }
    }
    missing
}

// ---- promtool and a Prometheus server ------------------------------------------------------

/// `promtool ARGS`: whether it succeeded, and what it said.
fn promtool(args: &[&str]) -> (bool, String) {
    let out = Command::new("promtool").args(args).output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), said)
}

/// A Prometheus server on a loopback port of its own, scraping one target every second as job
/// `pinboard` and evaluating alerts.yml every second; killed when dropped.
struct Prometheus {
    child: Child,
    addr: SocketAddr,
    dir: tempfile::TempDir,
}

impl Prometheus {
    fn start(target: SocketAddr) -> Prometheus {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("prometheus.yml");
        let rules = repo_file("deploy/prometheus/alerts.yml");
        let scrape = json!({
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "rule_files": [rules],
            "scrape_configs": [{
                "job_name": "pinboard",
                "static_configs": [{"targets": [target.to_string()]}],
            }],
        });
        std::fs::write(&config, scrape.to_string()).unwrap();
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let log = std::fs::File::create(dir.path().join("log")).unwrap();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let prometheus = Prometheus { child, addr, dir };
        let ready = eventually(Duration::from_secs(30), || {
            TcpStream::connect(addr).is_ok() && get(addr, "/-/ready", None).status == 200
        });
        assert!(ready, "prometheus not ready:\n{}", prometheus.log());
        prometheus
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("log")).unwrap_or_default()
    }

    /// The instant vector `promql` evaluates to now.
    fn query(&self, promql: &str) -> Vec<Value> {
        let r = get(
            self.addr,
            &format!("/api/v1/query?query={}", url_encoded(promql)),
            None,
        );
        let answer = r.json();
        assert_eq!(answer["status"], "success", "{promql}: {}", r.text());
        answer["data"]["result"].as_array().unwrap().clone()
    }

    /// The alerts pending or firing now.
    fn alerts(&self) -> Vec<Value> {
        let answer = get(self.addr, "/api/v1/alerts", None).json();
        answer["data"]["alerts"].as_array().unwrap().clone()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `text` as a URL's query value: every byte but the unreserved ones percent-encoded.
fn url_encoded(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

// ---- The tests -----------------------------------------------------------------------------

/// The families a `/metrics` text declares in its `# TYPE` lines, each with its sample names:
/// a histogram's `_bucket`, `_sum` and `_count`, the family's own name for the others.
fn declared(text: &str) -> Vec<(String, Vec<String>)> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|family| {
            let (name, kind) = family.split_once(' ').unwrap();
            let samples = match kind {
                "histogram" => ["_bucket", "_sum", "_count"]
                    .map(|suffix| format!("{name}{suffix}"))
                    .to_vec(),
                _ => vec![name.to_owned()],
            };
            (name.to_owned(), samples)
        })
        .collect()
}

/// A node with a registered worker kept live, placements, forwards on a pooled connection, a
/// refusal, Redis scripts run and the sweeper lease held, scraped until every name of `wanted`
/// that it declares has samples (a name it does not declare is for the checks to report).
/// Returns the fixture and its worker (to keep them alive) and that scrape.
fn busy_node_scrape(wanted: &BTreeSet<String>) -> (Fixture, support::worker::TestWorker, String) {
    let (f, worker, session) = Fixture::with_worker(&[("PINBOARD_SWEEP_INTERVAL_MS", "100")], "w");
    let addr = f.node.addr;
    for i in 0..5 {
        let r = get(addr, &format!("/threads/t{i}/x"), None);
        assert_eq!(r.status, 200, "{}\n{}", r.text(), f.node.log());
    }
    assert_eq!(get(addr, "/nowhere/t1", None).status, 404);
    assert_eq!(get(addr, "/healthz", None).status, 200);
    let mut scrape = String::new();
    let mut waiting_for = Vec::new();
    let complete = eventually(Duration::from_secs(20), || {
        let beat = f.heartbeat(&worker, &session, json!({}));
        assert_eq!(beat.status, 200, "{}", beat.text());
        scrape = f.metrics();
        let exported = Exported::parse(&scrape);
        let declared: BTreeSet<String> = declared(&scrape).into_iter().flat_map(|f| f.1).collect();
        waiting_for = wanted
            .iter()
            .filter(|name| declared.contains(*name) && !exported.samples.contains_key(*name))
            .cloned()
            .collect();
        waiting_for.is_empty()
    });
    assert!(
        complete,
        "no samples of {waiting_for:?} in:\n{scrape}\n{}",
        f.node.log()
    );
    (f, worker, scrape)
}

#[test]
fn every_metric_label_and_value_the_dashboard_and_the_alerts_read_is_exported() {
    let dashboard: Value = serde_json::from_str(&read("deploy/grafana/pinboard.json")).unwrap();
    let rules = alert_rules();
    let mut queries = dashboard_queries(&dashboard);
    for rule in &rules {
        queries.push(Query {
            origin: Origin::Alert,
            place: format!("alert {}", rule["alert"].as_str().unwrap()),
            expr: rule["expr"].as_str().unwrap().to_owned(),
        });
    }
    let read_by: Vec<(&Query, Reads)> = queries.iter().map(|q| (q, q.reads())).collect();
    let wanted: BTreeSet<String> = read_by
        .iter()
        .flat_map(|(_, reads)| &reads.selectors)
        .map(|s| s.metric.clone())
        .filter(|m| NODE_PREFIXES.iter().any(|p| m.starts_with(p)))
        .collect();

    let (_f, _worker, scrape) = busy_node_scrape(&wanted);
    let exported = Exported::parse(&scrape);
    let mut all: Vec<String> = read_by
        .iter()
        .flat_map(|(q, reads)| problems(&exported, &q.place, reads, q.origin))
        .collect();

    // The dashboard shows every family of the node's own (`pinboard_`): a new family wants a
    // panel.
    let shown: BTreeSet<&str> = read_by
        .iter()
        .filter(|(q, _)| q.origin == Origin::Panel)
        .flat_map(|(_, reads)| &reads.selectors)
        .map(|s| s.metric.as_str())
        .collect();
    for (family, samples) in declared(&scrape) {
        let ours = family.starts_with("pinboard_");
        if ours && !samples.iter().any(|s| shown.contains(s.as_str())) {
            all.push(format!("no panel shows {family}"));
        }
    }
    assert!(all.is_empty(), "{}", all.join("\n"));
}

#[test]
fn the_dashboard_is_an_importable_model_with_a_query_and_unit_on_every_panel() {
    let dashboard: Value = serde_json::from_str(&read("deploy/grafana/pinboard.json")).unwrap();
    let problems = dashboard_shape_problems(&dashboard);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    // The issue's rows are there.
    let titles: Vec<&str> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["type"] == "row")
        .filter_map(|p| p["title"].as_str())
        .collect();
    for row in [
        "Requests by kind (RED)",
        "Forwards to workers",
        "Redis",
        "Fleet",
        "Sweeper and wakes",
        "Connections",
        "Build and process",
    ] {
        assert!(titles.contains(&row), "no row {row:?} in {titles:?}");
    }
}

#[test]
fn every_alert_has_a_severity_a_runbook_and_promtool_cases_firing_and_quiet() {
    let rules = alert_rules();
    let mut problems = rule_shape_problems(&rules);
    problems.extend(untested_alerts(&rules));
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn promtool_checks_the_rules_runs_their_tests_and_parses_the_dashboard() {
    if !installed_or_skipped(
        "promtool",
        "prometheus",
        "promtool check rules / test rules",
    ) {
        return;
    }
    let rules = repo_file("deploy/prometheus/alerts.yml");
    let (ok, said) = promtool(&["check", "rules", rules.to_str().unwrap()]);
    assert!(
        ok && said.contains("SUCCESS"),
        "promtool check rules:\n{said}"
    );
    let cases = repo_file("deploy/prometheus/alerts_test.yml");
    let (ok, said) = promtool(&["test", "rules", cases.to_str().unwrap()]);
    assert!(
        ok && said.contains("SUCCESS"),
        "promtool test rules:\n{said}"
    );

    // The dashboard's PromQL, as recording rules promtool parses (Grafana's `$__rate_interval`
    // made a duration; `$job` and `$instance` stand in strings).
    let dashboard: Value = serde_json::from_str(&read("deploy/grafana/pinboard.json")).unwrap();
    let records: Vec<Value> = dashboard_queries(&dashboard)
        .into_iter()
        .filter(|q| q.origin == Origin::Panel)
        .enumerate()
        .map(|(i, q)| {
            let expr = q.expr.replace("$__rate_interval", "5m");
            json!({"record": format!("dashboard:query_{i}"), "expr": expr})
        })
        .collect();
    let file = tempfile::NamedTempFile::new().unwrap();
    let groups = json!({"groups": [{"name": "dashboard", "rules": records}]});
    std::fs::write(file.path(), groups.to_string()).unwrap();
    let (ok, said) = promtool(&["check", "rules", file.path().to_str().unwrap()]);
    assert!(ok, "the dashboard's PromQL:\n{said}");
}

/// The scanner and the checks find what is wrong: a name, a label or a value the node does not
/// export, a grouping label no family read has, a panel missing its filter.
#[test]
fn the_checks_catch_a_wrong_name_label_value_or_filter() {
    let exported = Exported::parse(
        "# TYPE pinboard_resolutions_total counter\n\
         pinboard_resolutions_total{outcome=\"forward\"} 3\n\
         pinboard_resolutions_total{outcome=\"unavailable\"} 0\n\
         pinboard_redis_duration_seconds_bucket{script=\"resolve\",le=\"0.001\"} 1\n\
         pinboard_serving 1\n",
    );
    let read = reads(
        "histogram_quantile(0.99, sum by (script, le) (rate(pinboard_redis_duration_seconds_bucket{job=~\"$job\",script=\"resolve\"}[$__rate_interval]))) > 0.5 and on (job) up{job=~\"pinboard.*\"} == 1",
    );
    assert_eq!(
        read,
        Reads {
            selectors: vec![
                Selector {
                    metric: "pinboard_redis_duration_seconds_bucket".into(),
                    matchers: vec![
                        Matcher {
                            label: "job".into(),
                            op: "=~".into(),
                            value: "$job".into()
                        },
                        Matcher {
                            label: "script".into(),
                            op: "=".into(),
                            value: "resolve".into()
                        },
                    ],
                },
                Selector {
                    metric: "up".into(),
                    matchers: vec![Matcher {
                        label: "job".into(),
                        op: "=~".into(),
                        value: "pinboard.*".into()
                    }],
                },
            ],
            grouping: vec!["script".into(), "le".into(), "job".into()],
        }
    );
    assert_eq!(
        problems(&exported, "good", &read, Origin::Alert),
        Vec::<String>::new()
    );
    assert_eq!(
        problems(&exported, "a", &read, Origin::Panel),
        vec![r#"a: pinboard_redis_duration_seconds_bucket lacks instance=~"$instance""#]
    );

    let wrong = |expr: &str| problems(&exported, "q", &reads(expr), Origin::Alert);
    assert_eq!(
        wrong("rate(pinboard_resolution_total[5m])"),
        vec!["q: the node exports no pinboard_resolution_total"]
    );
    assert_eq!(
        wrong(r#"pinboard_resolutions_total{result="forward"}"#),
        vec!["q: pinboard_resolutions_total has no label result"]
    );
    assert_eq!(
        wrong(r#"pinboard_resolutions_total{outcome="unavaliable"}"#),
        vec![
            r#"q: pinboard_resolutions_total{outcome="unavaliable"} is never exported (values: {"forward", "unavailable"})"#
        ]
    );
    assert_eq!(
        wrong("sum by (kind) (pinboard_serving)"),
        vec!["q: no family it reads has the label kind"]
    );
    assert_eq!(
        wrong(r#"count(node_up{job="pinboard"})"#),
        vec!["q: reads no family of the node"]
    );
    // A bare name is a selector; keywords, numbers, strings and variables are not.
    assert_eq!(
        reads("pinboard_serving == bool 0 or label_replace(x, \"pinboard_no\", \"$1\", \"y\", \"(.*)\") offset 5m")
            .selectors
            .iter()
            .map(|s| s.metric.as_str())
            .collect::<Vec<_>>(),
        vec!["pinboard_serving", "x"]
    );
    assert_eq!(
        variable_reads("label_values(pinboard_serving{job=~\"$job\"}, instance)").grouping,
        vec!["instance"]
    );
}

/// The anchors the runbooks point at are the headings GitHub links to.
#[test]
fn anchors_are_made_as_github_makes_them() {
    let made = anchors(
        "## Dashboards and alerts\n```sh\n# a comment\n```\n#### PinboardNodeNotServing\ntext # no\n",
    );
    assert_eq!(
        made,
        BTreeSet::from([
            "dashboards-and-alerts".to_owned(),
            "pinboardnodenotserving".to_owned()
        ])
    );
}

/// A panel's query as Grafana sends it for job `pinboard`, every node, and a rate interval of
/// a few one-second scrapes.
fn as_run(expr: &str) -> String {
    expr.replace("$__rate_interval", "10s")
        .replace("$instance", ".+")
        .replace("$job", "pinboard")
}

/// A real Prometheus scrapes a real node's metrics listener every second with alerts.yml
/// loaded: every panel's query has data, and no alert is pending while the node serves with
/// traffic. Then Redis goes: the node's `/metrics` answers 500 `metrics collection failed` and
/// the fleet's and the node's alerts go pending.
#[test]
fn a_real_prometheus_has_data_for_every_panel_and_alerts_once_redis_is_gone() {
    if !installed_or_skipped(
        "prometheus",
        "prometheus",
        "the scrape by a real Prometheus",
    ) {
        return;
    }
    let env = [
        ("PINBOARD_METRICS_LISTEN", "127.0.0.1:0"),
        ("PINBOARD_SWEEP_INTERVAL_MS", "100"),
    ];
    let (mut f, worker, session) = Fixture::with_worker(&env, "w");
    let target = f.node.metrics_addr();
    let prometheus = Prometheus::start(target);
    let dashboard: Value = serde_json::from_str(&read("deploy/grafana/pinboard.json")).unwrap();
    let panels: Vec<Query> = dashboard_queries(&dashboard)
        .into_iter()
        .filter(|q| q.origin == Origin::Panel)
        .collect();

    let stop = AtomicBool::new(false);
    let (mut empty, mut alerts) = (Vec::new(), Vec::new());
    std::thread::scope(|scope| {
        // Requests all along, so that rates over the last seconds are not empty, and
        // heartbeats, so that the worker stays live.
        scope.spawn(|| {
            for i in 0u32.. {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                get(f.node.addr, &format!("/threads/t{}/x", i % 5), None);
                if i % 20 == 0 {
                    f.heartbeat(&worker, &session, json!({}));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        let answered = eventually(Duration::from_secs(60), || {
            empty = panels
                .iter()
                .filter(|q| prometheus.query(&as_run(&q.expr)).is_empty())
                .map(|q| q.place.clone())
                .collect();
            empty.is_empty()
        });
        alerts = prometheus.alerts();
        stop.store(true, Ordering::Relaxed);
        assert!(answered, "no data for {empty:?}\n{}", prometheus.log());
    });
    assert!(alerts.is_empty(), "alerts on a healthy node: {alerts:#?}");

    f.redis.stop();
    let expected = [
        (
            "PinboardFleetLicenseLost",
            json!({"alertname": "PinboardFleetLicenseLost", "job": "pinboard", "severity": "page"}),
        ),
        (
            "PinboardNodeDown",
            json!({"alertname": "PinboardNodeDown", "job": "pinboard", "instance": target.to_string(), "severity": "ticket"}),
        ),
    ];
    let pending = eventually(Duration::from_secs(60), || {
        alerts = prometheus.alerts();
        expected.iter().all(|(_, labels)| {
            alerts
                .iter()
                .any(|a| a["labels"] == *labels && a["state"] == "pending")
        })
    });
    let scrape = get(target, "/metrics", None);
    assert!(
        pending,
        "{alerts:#?}\nthe node's /metrics: {} {}",
        scrape.status,
        scrape.text()
    );
    assert_eq!(
        (scrape.status, scrape.text().as_str()),
        (500, r#"{"error":"metrics collection failed"}"#)
    );
}
