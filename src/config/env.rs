//! The environment form of the settings (contract §1, §5): `PINBOARD_` + the key in upper snake
//! case, tables joined with `__` (`forwards.timeout_ms` is `PINBOARD_FORWARDS__TIMEOUT_MS`).
//! Each variable is laid over the file's table as the TOML value it stands for, so the file and
//! the environment share one parser per key and the environment wins.

use std::collections::BTreeMap;

use toml::{Table, Value};

use super::ConfigError;
use super::keys::{self, KEYS, NAMESPACES};

const PREFIX: &str = "PINBOARD_";

/// Read by the CLI itself, not settings: the config file's path, the log filter,
/// `pinboard token`'s secret and `pinboard ctl`'s node and credential.
const NOT_SETTINGS: [&str; 5] = [
    "PINBOARD_CONFIG",
    "PINBOARD_LOG",
    "PINBOARD_TOKEN_SECRET",
    "PINBOARD_URL",
    "PINBOARD_TOKEN",
];

/// The variable that sets `key`.
pub(super) fn var_name(key: &str) -> String {
    format!("{PREFIX}{}", key.replace('.', "__").to_ascii_uppercase())
}

/// The process environment as text: a variable that is not UTF-8 cannot be a setting, and
/// skipping it beats the panic of `std::env::vars()`.
pub fn process_env() -> Vec<(String, String)> {
    std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .collect()
}

/// Lays every `PINBOARD_*` variable of `env` over `table`. Returns, per key set, the variable
/// that set it. Variables are taken in name order so the first error reported is stable.
pub(super) fn overlay(
    table: &mut Table,
    env: impl IntoIterator<Item = (String, String)>,
) -> Result<BTreeMap<String, String>, ConfigError> {
    let vars: BTreeMap<String, String> = env
        .into_iter()
        .filter(|(name, _)| name.starts_with(PREFIX) && !NOT_SETTINGS.contains(&name.as_str()))
        .collect();
    let mut origins = BTreeMap::new();
    for (var, text) in vars {
        // Anything else is someone else's (see `ignored`): never a reason to stop.
        let Some(key) = KEYS.iter().find(|k| var_name(k.name) == var) else {
            continue;
        };
        place(table, key.name, (key.env_value)(&text))?;
        origins.insert(key.name.to_owned(), var);
    }
    Ok(origins)
}

/// The `PINBOARD_*` variables of `env` that name no setting, as one warning line, or `None`
/// when there are none (contract §10). An orchestrator puts such variables in every pod of a
/// Service named `pinboard` (`PINBOARD_PORT=tcp://10.0.0.1:8080`, `PINBOARD_SERVICE_HOST`,
/// …) and a wrapper script may export `PINBOARD_BIN`: they are named, with the closest
/// setting when one looks like a typo, and otherwise ignored.
pub fn ignored<'a>(env: impl IntoIterator<Item = &'a str>) -> Option<String> {
    let mut names: Vec<String> = env
        .into_iter()
        .filter(|name| {
            name.starts_with(PREFIX)
                && !NOT_SETTINGS.contains(name)
                && !KEYS.iter().any(|k| var_name(k.name) == *name)
        })
        .map(|name| match hint(name) {
            Some(hint) => format!("{name} ({hint})"),
            None => name.to_owned(),
        })
        .collect();
    if names.is_empty() {
        return None;
    }
    names.sort();
    Some(format!(
        "ignoring environment variables that name no Pinboard setting: {}",
        names.join(", ")
    ))
}

/// What `var` was probably meant to be: a setting it is the start of (`PINBOARD_LEASE_TTL`),
/// or one a typo or two away (`PINBOARD_SHRADS`).
fn hint(var: &str) -> Option<String> {
    if var.starts_with(&var_name(NAMESPACES)) {
        return Some("namespaces are set in the config file only".into());
    }
    let settings = KEYS.iter().map(|k| var_name(k.name));
    let (best, distance) = settings
        .map(|setting| {
            let d = if setting.starts_with(var) {
                0
            } else {
                edit_distance(var, &setting)
            };
            (setting, d)
        })
        .min_by_key(|(_, d)| *d)?;
    let long_enough = var.len() - PREFIX.len() >= 5;
    (long_enough && distance <= 2).then(|| format!("did you mean {best}?"))
}

/// Edit distance with adjacent transpositions (optimal string alignment), by bytes (the names
/// are ASCII): `SHRADS` is one step from `SHARDS`, two from `THREADS`.
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (d[i - 1][j] + 1)
                .min(d[i][j - 1] + 1)
                .min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(d[i - 2][j - 2] + 1);
            }
            d[i][j] = best;
        }
    }
    d[a.len()][b.len()]
}

/// Stores `value` at the dotted `key`, creating tables on the way; `None` removes the key.
fn place(table: &mut Table, key: &str, value: Option<Value>) -> Result<(), ConfigError> {
    let (tables, leaf) = key.rsplit_once('.').unwrap_or(("", key));
    let mut here = table;
    let mut path = String::new();
    for name in tables.split('.').filter(|name| !name.is_empty()) {
        path.push_str(name);
        let slot = here
            .entry(name)
            .or_insert_with(|| Value::Table(Table::new()));
        here = match slot {
            Value::Table(inner) => inner,
            // Only the file can have put a non-table here.
            other => {
                return Err(ConfigError::new(
                    path,
                    format!("expected a table, got {}", keys::shown(other)),
                ));
            }
        };
        path.push('.');
    }
    match value {
        Some(value) => here.insert(leaf.to_owned(), value),
        None => here.remove(leaf),
    };
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(var_name("shards"), "PINBOARD_SHARDS");
        assert_eq!(
            var_name("forwards.timeout_ms"),
            "PINBOARD_FORWARDS__TIMEOUT_MS"
        );
        assert_eq!(
            var_name("passport.hs256_secret"),
            "PINBOARD_PASSPORT__HS256_SECRET"
        );
    }

    #[test]
    fn overlay_replaces_and_unsets() {
        let mut table: Table = "shards = 4\n[passport]\nissuer = \"a\"\n".parse().unwrap();
        let origins = overlay(
            &mut table,
            [
                ("PINBOARD_SHARDS".to_string(), "8".to_string()),
                ("PINBOARD_PASSPORT__ISSUER".to_string(), String::new()),
                ("PINBOARD_FORWARDS__TIMEOUT_MS".to_string(), "9".to_string()),
                ("OTHER".to_string(), "x".to_string()),
            ],
        )
        .unwrap();
        let expected: Table = "shards = 8\n[passport]\n[forwards]\ntimeout_ms = 9\n"
            .parse()
            .unwrap();
        assert_eq!(table, expected);
        assert_eq!(origins["shards"], "PINBOARD_SHARDS");
        assert_eq!(origins["passport.issuer"], "PINBOARD_PASSPORT__ISSUER");
        assert_eq!(origins.len(), 3);
    }

    #[test]
    fn ignores_the_cli_variables_only() {
        let mut table = Table::new();
        let vars = NOT_SETTINGS.map(|v| (v.to_string(), "x".to_string()));
        assert!(overlay(&mut table, vars).unwrap().is_empty());
        assert!(table.is_empty());
        assert_eq!(ignored(NOT_SETTINGS), None);
    }

    #[test]
    fn foreign_variables_are_named_and_ignored() {
        let foreign = [
            ("PINBOARD_PORT", "tcp://10.0.0.1:8080"),
            ("PINBOARD_SERVICE_HOST", "10.0.0.1"),
            ("PINBOARD_PORT_8080_TCP_ADDR", "10.0.0.1"),
            ("PINBOARD_BIN", "/usr/local/bin/pinboard"),
            ("PINBOARD_LEASE_TTL", "15000"),
            ("PINBOARD_SHRADS", "4"),
            ("PINBOARD_NAMESPACES", "x"),
            ("PINBOARD_", ""),
            ("PINBOARD_SHARDS", "8"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()));
        let mut table = Table::new();
        let origins = overlay(&mut table, foreign.clone()).unwrap();
        assert_eq!(origins.len(), 1, "only PINBOARD_SHARDS is read");
        assert_eq!(table, "shards = 8".parse::<Table>().unwrap());
        assert_eq!(
            ignored(foreign.iter().map(|(k, _)| k.as_str())).unwrap(),
            "ignoring environment variables that name no Pinboard setting: PINBOARD_, \
             PINBOARD_BIN, PINBOARD_LEASE_TTL (did you mean PINBOARD_LEASE_TTL_MS?), \
             PINBOARD_NAMESPACES (namespaces are set in the config file only), PINBOARD_PORT, \
             PINBOARD_PORT_8080_TCP_ADDR, PINBOARD_SERVICE_HOST, \
             PINBOARD_SHRADS (did you mean PINBOARD_SHARDS?)"
        );
        assert_eq!(ignored(["PINBOARD_SHARDS", "HOME"]), None);
    }
}
