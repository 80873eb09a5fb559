//! The environment form of the settings (contract §1, §5): `PINBOARD_` + the key in upper snake
//! case, tables joined with `__` (`forwards.timeout_ms` is `PINBOARD_FORWARDS__TIMEOUT_MS`).
//! Each variable is laid over the file's table as the TOML value it stands for, so the file and
//! the environment share one parser per key and the environment wins.

use std::collections::BTreeMap;

use toml::{Table, Value};

use super::ConfigError;
use super::keys::{self, KEYS, NAMESPACES};

const PREFIX: &str = "PINBOARD_";

/// Read by the CLI itself, not settings: the config file's path and the log filter.
const NOT_SETTINGS: [&str; 2] = ["PINBOARD_CONFIG", "PINBOARD_LOG"];

/// The variable that sets `key`.
pub(super) fn var_name(key: &str) -> String {
    format!("{PREFIX}{}", key.replace('.', "__").to_ascii_uppercase())
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
        let Some(key) = KEYS.iter().find(|k| var_name(k.name) == var) else {
            return Err(ConfigError::new(&var, unknown_var_message(&var)));
        };
        place(table, key.name, (key.env_value)(&text))?;
        origins.insert(key.name.to_owned(), var);
    }
    Ok(origins)
}

fn unknown_var_message(var: &str) -> String {
    if var.starts_with(&var_name(NAMESPACES)) {
        "namespaces are set in the config file only".into()
    } else {
        format!(
            "not a Pinboard setting (settings are {PREFIX} + the key in upper snake case, \
             tables joined with \"__\", e.g. PINBOARD_FORWARDS__TIMEOUT_MS)"
        )
    }
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
        let e = overlay(&mut table, [("PINBOARD_".to_string(), String::new())]).unwrap_err();
        assert_eq!(e.key, "PINBOARD_");
    }
}
