//! Lua scripts: the registry of scripts the data plane runs, each embedded from `lua/NAME.lua`
//! at build time and run by SHA1 through `Redis::evalsha`.

use std::sync::LazyLock;

pub struct Script {
    pub name: &'static str,
    pub source: &'static str,
    /// Lowercase hex SHA1 of `source`, the name EVALSHA knows the script by.
    sha: String,
}

impl Script {
    fn new(name: &'static str, source: &'static str) -> Script {
        Script {
            name,
            source,
            sha: sha1_smol::Sha1::from(source).digest().to_string(),
        }
    }

    pub fn sha(&self) -> &str {
        &self.sha
    }
}

/// `script!("name")` embeds `lua/name.lua`; its SHA1 is computed on first use.
macro_rules! script {
    ($name:literal) => {
        LazyLock::new(|| {
            Script::new(
                $name,
                include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/lua/", $name, ".lua")),
            )
        })
    };
}

/// Readiness probe for `GET /readyz`: proves the scripting path works; returns the server clock
/// in milliseconds.
pub static READY: LazyLock<Script> = script!("ready");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha_is_hex_sha1_of_source() {
        assert_eq!(
            Script::new("t", "return 1").sha(),
            "e0e1f9fabfc9d4800c877a703b823ac0578ff8db"
        );
        assert_eq!(READY.name, "ready");
        assert!(READY.source.contains("redis.call('TIME')"));
    }
}
