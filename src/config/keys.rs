//! The settings table: for every key, how its TOML value is parsed and checked, how an
//! environment variable's text becomes that TOML value, and how the key is rendered back.
//! The key names come from the `Config` field paths, so the table cannot drift from the struct.
//! `namespaces`, the one table with operator-chosen keys, has its own parser here.

use std::collections::BTreeMap;
use std::fmt::Display;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use ipnet::IpNet;
use toml::{Table, Value};

use super::{AccessLogFormat, Affinity, Config, ConfigError, DriverKind, LogFormat, NamespaceRule};
use crate::passport::Retiring;
use crate::redis::RedisTarget;

/// One configuration key.
pub(super) struct Key {
    /// Dotted, as in the file: `forwards.timeout_ms`.
    pub name: &'static str,
    /// Rendered as `***`.
    pub secret: bool,
    /// Parses and checks a value and stores it; `Err` says what is wrong, without the key.
    pub set: fn(&mut Config, &Value) -> Result<(), String>,
    /// The TOML value an environment variable's text stands for; `None` unsets the key.
    pub env_value: fn(&str) -> Option<Value>,
    /// The current value, `None` when unset.
    pub render: fn(&Config) -> Option<Value>,
}

macro_rules! key {
    (@secret $secret:literal, $first:ident $(. $rest:ident)* : $ty:ty = $parse:expr) => {
        Key {
            name: concat!(stringify!($first) $(, ".", stringify!($rest))*),
            secret: $secret,
            set: |config, value| {
                let parsed: $ty = ($parse)(value)?;
                config.$first $(. $rest)* = parsed;
                Ok(())
            },
            env_value: |text| {
                (!<$ty as Setting>::env_unsets(text)).then(|| <$ty as Setting>::env_value(text))
            },
            render: |config| config.$first $(. $rest)*.to_toml(),
        }
    };
    (secret $($t:tt)*) => { key!(@secret true, $($t)*) };
    ($($t:tt)*) => { key!(@secret false, $($t)*) };
}

/// Upper bound of durations in ms: a day. Longer is almost certainly a unit mistake, and it keeps
/// deadline arithmetic far from overflow.
const MAX_MS: u64 = 86_400_000;

/// Every key with an environment form, top-level keys first, each table's keys together (the
/// rendering relies on that order).
pub(super) const KEYS: &[Key] = &[
    key!(listen: SocketAddr = text_with(address)),
    key!(threads: usize = whole(0, 1024)),
    key!(driver: DriverKind = text_with(str::parse)),
    key!(redis_url: RedisTarget = text_with(RedisTarget::parse)),
    key!(redis_ca_file: Option<PathBuf> = optional(text_with(path))),
    key!(prefix: String = text_with(prefix)),
    key!(shards: u32 = whole(1, 16384)),
    key!(hostname_aware: bool = flag),
    key!(lease_ttl_ms: u64 = whole(1_000, 3_600_000)),
    key!(verify_timeout_ms: u64 = whole(1, MAX_MS)),
    key!(redis_timeout_ms: u64 = whole(1, MAX_MS)),
    key!(sweep_interval_ms: u64 = whole(100, MAX_MS)),
    key!(base_path: String = text_with(base_path)),
    key!(balance_factor: f64 = factor),
    key!(affinity: Affinity = text_with(str::parse)),
    key!(trusted_proxies: Vec<IpNet> = list(text_with(cidr))),
    key!(metrics: bool = flag),
    key!(metrics_listen: Option<SocketAddr> = optional(text_with(address))),
    key!(console: bool = flag),
    // TOML integers are signed 64-bit, so that is the most a file (or a rendering) can hold.
    key!(fleet_epoch: u64 = whole(0, i64::MAX as u64)),
    key!(node_id: String = text_with(node_id)),
    key!(max_connections: u64 = whole(1, 10_000_000)),
    key!(log_format: LogFormat = text_with(str::parse)),
    key!(log_level: String = text_with(log_level)),
    key!(access_log: AccessLogFormat = text_with(str::parse)),
    key!(access_log_path: Option<PathBuf> = optional(text_with(path))),
    key!(pid_file: Option<PathBuf> = optional(text_with(path))),
    key!(forwards.timeout_ms: u64 = whole(1, MAX_MS)),
    key!(forwards.max_inflight: u32 = whole(1, u32::MAX)),
    key!(forwards.ca_file: Option<PathBuf> = optional(text_with(path))),
    key!(forwards.upstream_idle_timeout_ms: u64 = whole(0, MAX_MS)),
    key!(forwards.upgrade_protocols: Vec<String> = list(text_with(upgrade_protocol))),
    key!(forwards.keep_authorization: bool = flag),
    key!(secret passport.hs256_secret: Option<String> = optional(text_with(hs256_secret))),
    // At most 16 of each kind: a token signed by none is tried under every one.
    key!(secret passport.hs256_secrets: Vec<Retiring<String>> = keys(retiring(hs256_secret))),
    key!(passport.ed25519_public_keys: Vec<Retiring<PathBuf>> = keys(retiring(path))),
    key!(passport.issuer: Option<String> = optional(text_with(non_empty))),
    key!(passport.audience: Option<String> = optional(text_with(non_empty))),
    // At most 1024: each namespace is a list key every bucket call of the worker declares.
    key!(registry.max_namespaces_per_worker: usize = whole(1, 1024)),
    key!(registry.max_instances_per_register: usize = whole(0, 10_000_000)),
    key!(http.header_timeout_ms: u64 = whole(1, MAX_MS)),
    key!(http.idle_timeout_ms: u64 = whole(1, MAX_MS)),
    // At most 64 KiB: the head parser panics on a header name of 64 KiB or more (the `http`
    // crate's limit), which a larger cap would let a client send.
    key!(http.max_header_bytes: usize = whole(1024, 64 * 1024)),
    key!(http.shutdown_grace_ms: u64 = whole(0, MAX_MS)),
    // At most 10 min: load balancers notice a failing readiness probe within seconds; a longer
    // delay is more likely a unit mistake than a wish, and keeps a stopping node for as long.
    key!(http.shutdown_delay_ms: u64 = whole(0, 600_000)),
    key!(http.write_timeout_ms: u64 = whole(1, MAX_MS)),
    key!(http.h2: bool = flag),
    key!(http.h2c: bool = flag),
    // RFC 9113 §6.5.2 recommends no fewer than 100; more than 65535 at once on one connection
    // is a client to refuse, not to serve.
    key!(http.h2_max_streams: u32 = whole(1, 65_535)),
    key!(tls.cert_file: Option<PathBuf> = optional(text_with(path))),
    key!(tls.key_file: Option<PathBuf> = optional(text_with(path))),
    key!(limits.max_connections_per_ip: u64 = whole(0, 10_000_000)),
    key!(limits.new_placements_per_ip_per_s: u64 = whole(0, 1_000_000)),
    key!(placement.max_rows_per_namespace: Option<u64> = optional(whole(1, 1_000_000_000))),
    key!(ledger.enabled: bool = flag),
    // At least 100: `XADD … MAXLEN ~` trims a whole node of the stream (100 entries) at a time.
    key!(ledger.max_entries_per_bucket: u64 = whole(100, 100_000_000)),
    key!(proxy_protocol.trusted: Vec<IpNet> = list(text_with(cidr))),
    // At most 100: more replicas than that is a typo, and WAIT could never be satisfied.
    key!(redis.wait_replicas: u32 = whole(0, 100)),
    key!(redis.wait_timeout_ms: u64 = whole(1, MAX_MS)),
];

/// The key with its own parser and no environment form (contract §5).
pub(super) const NAMESPACES: &str = "namespaces";

/// Stores every value of `table` (the file with the environment laid over it) into `config`.
pub(super) fn apply(config: &mut Config, table: &Table) -> Result<(), ConfigError> {
    apply_under(config, table, "")
}

fn apply_under(config: &mut Config, table: &Table, prefix: &str) -> Result<(), ConfigError> {
    for (name, value) in table {
        let path = format!("{prefix}{}", segment(name));
        if path == NAMESPACES {
            config.namespaces = namespaces(value)?;
        } else if let Some(key) = KEYS.iter().find(|k| k.name == path) {
            (key.set)(config, value).map_err(|why| ConfigError::new(&path, why))?;
        } else if is_table_name(&path) {
            let Value::Table(inner) = value else {
                return Err(ConfigError::new(
                    &path,
                    format!("expected a table, got {}", shown(value)),
                ));
            };
            apply_under(config, inner, &format!("{path}."))?;
        } else {
            return Err(ConfigError::new(path, "unknown key"));
        }
    }
    Ok(())
}

/// Whether `path` is a table of settings, like `forwards`.
fn is_table_name(path: &str) -> bool {
    KEYS.iter().any(|k| {
        k.name
            .strip_prefix(path)
            .is_some_and(|r| r.starts_with('.'))
    })
}

/// A key as it would be written in a dotted path: bare when TOML allows, else quoted.
fn segment(name: &str) -> String {
    let bare = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if bare {
        name.to_owned()
    } else {
        format!("{name:?}")
    }
}

/// A value as quoted in a message: scalars verbatim, containers by kind (they may span lines).
pub(super) fn shown(value: &Value) -> String {
    match value {
        Value::String(s) => format!("{s:?}"),
        Value::Array(_) => "an array".into(),
        Value::Table(_) => "a table".into(),
        scalar => scalar.to_string(),
    }
}

fn whole<T>(lo: T, hi: T) -> impl Fn(&Value) -> Result<T, String>
where
    T: TryFrom<i64> + PartialOrd + Display + Copy,
{
    move |value| {
        value
            .as_integer()
            .and_then(|i| T::try_from(i).ok())
            .filter(|n| (lo..=hi).contains(n))
            .ok_or_else(|| {
                format!(
                    "expected a whole number from {lo} to {hi}, got {}",
                    shown(value)
                )
            })
    }
}

fn flag(value: &Value) -> Result<bool, String> {
    value
        .as_bool()
        .ok_or_else(|| format!("expected true or false, got {}", shown(value)))
}

fn factor(value: &Value) -> Result<f64, String> {
    // `2` reads as naturally as `2.0`; both are accepted.
    let number = match value {
        Value::Float(f) => Some(*f),
        Value::Integer(i) => Some(*i as f64),
        _ => None,
    };
    number
        .filter(|f| f.is_finite() && *f >= 1.0)
        .ok_or_else(|| format!("expected a finite number ≥ 1.0, got {}", shown(value)))
}

fn text_with<T>(parse: impl Fn(&str) -> Result<T, String>) -> impl Fn(&Value) -> Result<T, String> {
    move |value| match value {
        Value::String(s) => parse(s),
        _ => Err(format!("expected a string, got {}", shown(value))),
    }
}

fn optional<T>(
    parse: impl Fn(&Value) -> Result<T, String>,
) -> impl Fn(&Value) -> Result<Option<T>, String> {
    move |value| parse(value).map(Some)
}

fn list<T>(
    item: impl Fn(&Value) -> Result<T, String>,
) -> impl Fn(&Value) -> Result<Vec<T>, String> {
    move |value| {
        let Value::Array(items) = value else {
            return Err(format!("expected an array, got {}", shown(value)));
        };
        items
            .iter()
            .enumerate()
            .map(|(i, v)| item(v).map_err(|why| format!("item {}: {why}", i + 1)))
            .collect()
    }
}

/// The most keys of one kind Passport tries a token under.
const MAX_KEYS: usize = 16;

fn keys<T>(
    item: impl Fn(&Value) -> Result<T, String>,
) -> impl Fn(&Value) -> Result<Vec<T>, String> {
    let list = list(item);
    move |value| {
        let keys = list(value)?;
        if keys.len() > MAX_KEYS {
            return Err(format!("at most {MAX_KEYS} keys, got {}", keys.len()));
        }
        Ok(keys)
    }
}

/// A key as a string, or `{ key = "…", not_after = 2027-01-01T00:00:00Z }`: a TOML date-time
/// with its offset (a local one names no instant), or Unix seconds.
fn retiring<T>(
    parse: impl Fn(&str) -> Result<T, String>,
) -> impl Fn(&Value) -> Result<Retiring<T>, String> {
    move |value| match value {
        Value::String(s) => parse(s).map(Retiring::from),
        Value::Table(table) => {
            if let Some(unknown) = table.keys().find(|k| *k != "key" && *k != "not_after") {
                return Err(format!(
                    "unknown field {unknown:?} (a key is {{ key = …, not_after = … }})"
                ));
            }
            let key = match table.get("key") {
                Some(Value::String(s)) => parse(s)?,
                Some(other) => return Err(format!("key: expected a string, got {}", shown(other))),
                None => return Err("key: missing".into()),
            };
            let not_after = table
                .get("not_after")
                .map(|at| unix_seconds(at).map_err(|why| format!("not_after: {why}")))
                .transpose()?;
            Ok(Retiring { key, not_after })
        }
        _ => Err(format!(
            "expected a string or {{ key = …, not_after = … }}, got {}",
            shown(value)
        )),
    }
}

/// An instant: a TOML offset date-time, or whole Unix seconds.
fn unix_seconds(value: &Value) -> Result<u64, String> {
    let refused = || {
        format!(
            "expected a date-time with its offset (2027-01-01T00:00:00Z) or Unix seconds, got {}",
            shown(value)
        )
    };
    match value {
        Value::Integer(secs) => u64::try_from(*secs).map_err(|_| refused()),
        Value::Datetime(at) => {
            let (Some(date), Some(time), Some(offset)) = (at.date, at.time, at.offset) else {
                return Err(refused());
            };
            let offset_minutes = match offset {
                toml::value::Offset::Z => 0,
                toml::value::Offset::Custom { minutes } => i64::from(minutes),
            };
            let days = days_from_civil(
                i64::from(date.year),
                u32::from(date.month),
                u32::from(date.day),
            );
            let secs = days * 86_400
                + i64::from(time.hour) * 3600
                + i64::from(time.minute) * 60
                + i64::from(time.second.unwrap_or(0))
                - offset_minutes * 60;
            u64::try_from(secs).map_err(|_| refused())
        }
        _ => Err(refused()),
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's `days_from_civil`).
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let month = i64::from(month);
    let day_of_year =
        (153 * (if month > 2 { month - 3 } else { month + 9 }) + 2) / 5 + i64::from(day) - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// A `tracing` filter, as `PINBOARD_LOG` takes it.
fn log_level(s: &str) -> Result<String, String> {
    tracing_subscriber::EnvFilter::try_new(s)
        .map(|_| s.to_owned())
        .map_err(|e| format!("expected a log filter like info or warn,pinboard=debug: {e}"))
}

/// A listening address: an IP literal and a port, not a host name.
fn address(s: &str) -> Result<SocketAddr, String> {
    s.parse()
        .map_err(|_| format!("expected an address like 127.0.0.1:8080 or [::]:8080, got {s:?}"))
}

fn prefix(s: &str) -> Result<String, String> {
    if s.is_empty() || s.contains(|c: char| c.is_whitespace() || c == '{' || c == '}') {
        return Err(format!(
            "expected a non-empty prefix without whitespace, \"{{\" or \"}}\" (braces would break \
             the cluster hash tag), got {s:?}"
        ));
    }
    Ok(s.to_owned())
}

fn base_path(s: &str) -> Result<String, String> {
    let segments_ok = |rest: &str| {
        rest.split('/').all(|seg| {
            !seg.is_empty() && !seg.contains(|c: char| c.is_whitespace() || c == '?' || c == '#')
        })
    };
    if s.is_empty() || s.strip_prefix('/').is_some_and(segments_ok) {
        return Ok(s.to_owned());
    }
    Err(format!(
        "expected \"\" or a path like \"/edge\" (leading \"/\", no trailing \"/\", no empty \
         segment, no \"?\", \"#\" or whitespace), got {s:?}"
    ))
}

fn node_id(s: &str) -> Result<String, String> {
    if s.is_empty() || s.contains(char::is_whitespace) {
        return Err(format!(
            "expected a non-empty name without whitespace, got {s:?}"
        ));
    }
    Ok(s.to_owned())
}

/// An `Upgrade` protocol name (RFC 9110 §7.8: a token, a `/version` allowed), lowercased:
/// protocols are matched without regard to case.
fn upgrade_protocol(s: &str) -> Result<String, String> {
    let token = |part: &str| crate::http::is_token(part.as_bytes());
    let valid = match s.split_once('/') {
        Some((name, version)) => token(name) && token(version),
        None => token(s),
    };
    if !valid {
        return Err(format!(
            "expected a protocol name like \"websocket\", got {s:?}"
        ));
    }
    Ok(s.to_ascii_lowercase())
}

fn non_empty(s: &str) -> Result<String, String> {
    if s.is_empty() {
        return Err("expected a non-empty string (leave the key out to unset it), got \"\"".into());
    }
    Ok(s.to_owned())
}

/// RFC 7518 §3.2: an HS256 key must be at least as long as the hash output, 32 bytes; a
/// shorter one makes every credential forgeable by brute force.
fn hs256_secret(s: &str) -> Result<String, String> {
    let secret = non_empty(s)?;
    if secret.len() < 32 {
        return Err(format!(
            "must be at least 32 bytes (RFC 7518 §3.2), got {}",
            secret.len()
        ));
    }
    Ok(secret)
}

fn cidr(s: &str) -> Result<IpNet, String> {
    s.parse::<IpNet>()
        .or_else(|_| s.parse::<IpAddr>().map(IpNet::from))
        .map_err(|_| format!("expected a CIDR like 10.0.0.0/8 or an IP address, got {s:?}"))
}

fn path(s: &str) -> Result<PathBuf, String> {
    if s.is_empty() {
        return Err("expected a file path, got \"\"".into());
    }
    Ok(PathBuf::from(s))
}

/// Scopes are space-separated in credentials, so one with whitespace could never match.
fn scope(s: &str) -> Result<String, String> {
    if s.is_empty() || s.contains(char::is_whitespace) {
        return Err(format!(
            "expected a non-empty scope without whitespace, got {s:?}"
        ));
    }
    Ok(s.to_owned())
}

/// `[namespaces."/ns"]` tables: each `scopes = ["…", …]`, non-empty.
fn namespaces(value: &Value) -> Result<BTreeMap<String, NamespaceRule>, ConfigError> {
    let Value::Table(table) = value else {
        return Err(ConfigError::new(
            NAMESPACES,
            format!(
                "expected a table of [namespaces.\"/ns\"] tables, got {}",
                shown(value)
            ),
        ));
    };
    let scopes = list(text_with(scope));
    table
        .iter()
        .map(|(ns, rule)| {
            let key = format!("{NAMESPACES}.{}", segment(ns));
            let one_segment = ns.strip_prefix('/').is_some_and(|seg| {
                !seg.is_empty()
                    && !seg
                        .contains(|c: char| c == '/' || c == '?' || c == '#' || c.is_whitespace())
            });
            if !one_segment {
                return Err(ConfigError::new(
                    key,
                    "expected a namespace: \"/\" and one path segment, like \"/threads\"",
                ));
            }
            let Value::Table(rule) = rule else {
                return Err(ConfigError::new(
                    key,
                    format!(
                        "expected a table like {{ scopes = [\"…\"] }}, got {}",
                        shown(rule)
                    ),
                ));
            };
            if let Some(unknown) = rule.keys().find(|k| *k != "scopes") {
                return Err(ConfigError::new(
                    format!("{key}.{}", segment(unknown)),
                    "unknown key",
                ));
            }
            let key = format!("{key}.scopes");
            let Some(value) = rule.get("scopes") else {
                return Err(ConfigError::new(
                    key,
                    format!("required: the scopes a credential for {ns} must carry"),
                ));
            };
            let scopes = scopes(value).map_err(|why| ConfigError::new(&key, why))?;
            if scopes.is_empty() {
                return Err(ConfigError::new(
                    key,
                    "expected a non-empty array of scopes",
                ));
            }
            Ok((ns.clone(), NamespaceRule { scopes }))
        })
        .collect()
}

/// How a field's type travels through the environment and back out to TOML.
trait Setting {
    /// The TOML value an environment variable's text stands for. Text that is not of the type
    /// stays a string, so the key's parser reports it like a wrong value in the file.
    fn env_value(text: &str) -> Value {
        Value::String(text.to_owned())
    }

    /// Whether this text unsets the key (only an optional key's empty text does).
    fn env_unsets(_text: &str) -> bool {
        false
    }

    /// The value as TOML, `None` when unset.
    fn to_toml(&self) -> Option<Value>;
}

macro_rules! whole_setting {
    ($($ty:ty),*) => {$(
        impl Setting for $ty {
            fn env_value(text: &str) -> Value {
                text.parse().map_or_else(|_| Value::String(text.to_owned()), Value::Integer)
            }

            fn to_toml(&self) -> Option<Value> {
                i64::try_from(*self).ok().map(Value::Integer)
            }
        }
    )*};
}
whole_setting!(u32, u64, usize);

macro_rules! text_setting {
    ($($ty:ty),*) => {$(
        impl Setting for $ty {
            fn to_toml(&self) -> Option<Value> {
                Some(Value::String(self.to_string()))
            }
        }
    )*};
}
text_setting!(
    String,
    SocketAddr,
    DriverKind,
    LogFormat,
    AccessLogFormat,
    Affinity,
    IpNet
);

impl Setting for bool {
    fn env_value(text: &str) -> Value {
        text.parse()
            .map_or_else(|_| Value::String(text.to_owned()), Value::Boolean)
    }

    fn to_toml(&self) -> Option<Value> {
        Some(Value::Boolean(*self))
    }
}

impl Setting for f64 {
    fn env_value(text: &str) -> Value {
        text.parse()
            .map_or_else(|_| Value::String(text.to_owned()), Value::Float)
    }

    fn to_toml(&self) -> Option<Value> {
        Some(Value::Float(*self))
    }
}

impl Setting for RedisTarget {
    /// Masked: the rendering is for display.
    fn to_toml(&self) -> Option<Value> {
        Some(Value::String(self.masked()))
    }
}

impl Setting for PathBuf {
    fn to_toml(&self) -> Option<Value> {
        Some(Value::String(self.to_string_lossy().into_owned()))
    }
}

impl<T: Setting> Setting for Option<T> {
    fn env_value(text: &str) -> Value {
        T::env_value(text)
    }

    /// An empty variable is how an environment says "not set" (e.g. `${VAR}` of an unset VAR).
    fn env_unsets(text: &str) -> bool {
        text.is_empty()
    }

    fn to_toml(&self) -> Option<Value> {
        self.as_ref().and_then(T::to_toml)
    }
}

impl<T: Setting> Setting for Retiring<T> {
    fn env_value(text: &str) -> Value {
        T::env_value(text)
    }

    /// The key alone, or `{ key, not_after }` with `not_after` in Unix seconds.
    fn to_toml(&self) -> Option<Value> {
        let key = self.key.to_toml()?;
        Some(match self.not_after {
            None => key,
            Some(at) => {
                let mut table = Table::new();
                table.insert("key".into(), key);
                table.insert(
                    "not_after".into(),
                    Value::Integer(i64::try_from(at).unwrap_or(i64::MAX)),
                );
                Value::Table(table)
            }
        })
    }
}

impl<T: Setting> Setting for Vec<T> {
    /// Comma-separated (contract §5), blanks around items ignored; empty text is the empty list.
    fn env_value(text: &str) -> Value {
        let items = match text {
            "" => Vec::new(),
            _ => text
                .split(',')
                .map(|item| T::env_value(item.trim()))
                .collect(),
        };
        Value::Array(items)
    }

    fn to_toml(&self) -> Option<Value> {
        Some(Value::Array(self.iter().filter_map(T::to_toml).collect()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_come_from_field_paths() {
        let names: Vec<&str> = KEYS.iter().map(|k| k.name).collect();
        assert!(names.contains(&"forwards.timeout_ms"));
        assert!(names.contains(&"passport.hs256_secret"));
        assert!(!names.contains(&NAMESPACES));
        let secrets: Vec<&str> = KEYS.iter().filter(|k| k.secret).map(|k| k.name).collect();
        assert_eq!(secrets, ["passport.hs256_secret", "passport.hs256_secrets"]);
    }

    #[test]
    fn tables_follow_top_level_keys_and_stay_together() {
        let tables: Vec<&str> = KEYS
            .iter()
            .map(|k| k.name.rsplit_once('.').map_or("", |(t, _)| t))
            .collect();
        let mut seen = vec![tables[0]];
        for pair in tables.windows(2) {
            if pair[0] != pair[1] {
                assert!(!seen.contains(&pair[1]), "{} is split", pair[1]);
                seen.push(pair[1]);
            }
        }
        assert_eq!(seen[0], "", "top-level keys come first");
    }

    #[test]
    fn environment_text_becomes_typed_values() {
        assert_eq!(<u32 as Setting>::env_value("12"), Value::Integer(12));
        assert_eq!(<u32 as Setting>::env_value("-1"), Value::Integer(-1));
        assert_eq!(
            <u32 as Setting>::env_value("1x"),
            Value::String("1x".into())
        );
        assert_eq!(<bool as Setting>::env_value("true"), Value::Boolean(true));
        assert_eq!(
            <bool as Setting>::env_value("yes"),
            Value::String("yes".into())
        );
        assert_eq!(<f64 as Setting>::env_value("2"), Value::Float(2.0));
        assert_eq!(
            <Vec<IpNet> as Setting>::env_value(" a , b"),
            Value::Array(vec![Value::String("a".into()), Value::String("b".into())])
        );
        assert_eq!(<Vec<IpNet> as Setting>::env_value(""), Value::Array(vec![]));
        assert!(<Option<String> as Setting>::env_unsets(""));
        assert!(!<String as Setting>::env_unsets(""));
    }

    #[test]
    fn bare_ips_are_host_networks() {
        assert_eq!(cidr("10.1.2.3").unwrap().to_string(), "10.1.2.3/32");
        assert_eq!(cidr("::1").unwrap().to_string(), "::1/128");
        assert_eq!(cidr("10.0.0.0/8").unwrap().to_string(), "10.0.0.0/8");
        for bad in ["", "10.0.0.0/33", "10.0.0", "host", "::1/129"] {
            assert!(cidr(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn base_paths() {
        for good in ["", "/a", "/a/b", "/a.b-c_d~"] {
            assert_eq!(base_path(good).as_deref(), Ok(good));
        }
        for bad in ["a", "/", "/a/", "//a", "/a//b", "/a?", "/a#", "/a b", " /a"] {
            assert!(base_path(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn quoted_segments() {
        assert_eq!(segment("timeout_ms"), "timeout_ms");
        assert_eq!(segment("/ns"), "\"/ns\"");
        assert_eq!(segment(""), "\"\"");
    }
}
