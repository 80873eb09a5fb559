//! `Config::load`: the TOML config file with `PINBOARD_*` environment variables laid over it.
//!
//! Input: UTF-8 text. Up to a line `#%env` it is the config file; each line after it is one
//! environment variable, `NAME=VALUE`. Beyond "no panic", it checks that:
//! - a refusal displays as one line (the documented form of `ConfigError`);
//! - an accepted configuration, rendered by `render_masked` and loaded back with no environment,
//!   gives the same `Config` once the masked secrets are put back (the HS256 secret through
//!   the environment, as an operator would; the promise `check-config` output rests on).
//!
//! Inputs that name a file (Ed25519 keys, the listener's pair, a CA file) are skipped:
//! `Config::load` opens each one, and a fuzzer must not open arbitrary paths (a FIFO would hang
//! it, a device could do worse).
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use pinboard::config::Config;
use pinboard::redis::RedisTarget;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (file, env) = text.split_once("\n#%env\n").unwrap_or((text, ""));
    let env: Vec<(String, String)> = env
        .lines()
        .filter_map(|line| line.split_once('='))
        .map(|(name, value)| (name.to_owned(), value.to_owned()))
        .collect();
    if names_key_files(file, &env) {
        return;
    }

    let path = Path::new("/etc/pinboard.toml");
    let config = match Config::load(Some((path, file)), env) {
        Ok(config) => config,
        Err(e) => {
            let shown = e.to_string();
            assert!(!shown.contains('\n'), "a multi-line error: {shown:?}");
            return;
        }
    };

    // The masked secret (`***`) is no valid secret: it is given back the way an operator
    // would, through the environment, which wins over the file.
    let rendered = config.render_masked();
    let secret = config
        .passport
        .hs256_secret
        .iter()
        .map(|secret| ("PINBOARD_PASSPORT__HS256_SECRET".to_owned(), secret.clone()));
    let mut reloaded = Config::load(Some((path, &rendered)), secret.collect::<Vec<_>>())
        .unwrap_or_else(|e| panic!("the rendering does not load back ({e}):\n{rendered}"));
    // The Redis password is put back the same way (`***` is a password, for the parser).
    if let (
        RedisTarget::Single {
            credentials: Some(reloaded),
            ..
        }
        | RedisTarget::Cluster {
            credentials: Some(reloaded),
            ..
        },
        Some(original),
    ) = (&mut reloaded.redis_url, config.redis_url.credentials())
    {
        reloaded.password.clone_from(&original.password);
    }
    assert_eq!(
        reloaded, config,
        "the rendering loads back differently:\n{rendered}"
    );
});

/// The keys whose values are paths `Config::load` opens: (table, key, environment variable).
const FILE_KEYS: [(&str, &str, &str); 5] = [
    (
        "passport",
        "ed25519_public_keys",
        "PINBOARD_PASSPORT__ED25519_PUBLIC_KEYS",
    ),
    ("tls", "cert_file", "PINBOARD_TLS__CERT_FILE"),
    ("tls", "key_file", "PINBOARD_TLS__KEY_FILE"),
    ("forwards", "ca_file", "PINBOARD_FORWARDS__CA_FILE"),
    ("", "redis_ca_file", "PINBOARD_REDIS_CA_FILE"),
];

/// Whether the file or the environment sets any of `FILE_KEYS` (a list: to a non-empty one).
/// A file that is not TOML sets nothing: loading stops before any key is read.
fn names_key_files(file: &str, env: &[(String, String)]) -> bool {
    let table = file.parse::<toml::Table>().ok();
    FILE_KEYS.iter().any(|(section, key, var)| {
        let in_env = env
            .iter()
            .any(|(name, value)| name == var && !value.is_empty());
        let in_file = table.as_ref().is_some_and(|table| {
            let value = match *section {
                "" => table.get(*key),
                section => table.get(section).and_then(|t| t.get(*key)),
            };
            value.is_some_and(|v| v.as_array().is_none_or(|paths| !paths.is_empty()))
        });
        in_env || in_file
    })
}
