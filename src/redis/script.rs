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

/// The registry half of a registration: ownership, bindings, pruning, the session record.
pub static REGISTER: LazyLock<Script> = script!("register");
/// The registry half of a heartbeat: lease, flags, superseded check, control queue peek.
pub static HEARTBEAT: LazyLock<Script> = script!("heartbeat");
/// Drops a session from the registry slot (deregister, voided registration).
pub static SESSION_DROP: LazyLock<Script> = script!("session_drop");
/// Queues control messages to a session.
pub static CONTROL_PUSH: LazyLock<Script> = script!("control_push");
/// A worker's copy in one bucket: put (register, heartbeat, reclaim) or drop.
pub static BUCKET_WORKER: LazyLock<Script> = script!("bucket_worker");
/// Compare-and-delete of placement rows in one bucket.
pub static RELEASE: LazyLock<Script> = script!("release");
/// Placement: the one live owner of (env, namespace, id), or why not.
pub static RESOLVE: LazyLock<Script> = script!("resolve");
/// An operator wind-down: stamps or clears rows' wind-down expiry, compare-and-set.
pub static WIND_DOWN: LazyLock<Script> = script!("wind_down");
/// An operator drain of a client: set (timed or cordon) or clear.
pub static DRAIN: LazyLock<Script> = script!("drain");
/// The fleet license claim and membership entry of a node.
pub static FLEET: LazyLock<Script> = script!("fleet");
/// Hostname-aware: the env, takeover and quarantine of a (hostname, namespace).
pub static BINDING: LazyLock<Script> = script!("binding");
/// Clears an overwritten marker at or below a served epoch.
pub static OVERWRITTEN_CLEAR: LazyLock<Script> = script!("overwritten_clear");
/// Compare-and-set of a placement's owner tag.
pub static TAG: LazyLock<Script> = script!("tag");

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
