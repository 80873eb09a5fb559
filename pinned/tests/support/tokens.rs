//! Worker credentials for the credential tests (shared by `pinned`'s and `pinned-tower`'s
//! integration tests): one the node refuses from a chosen moment on, and a token file replaced
//! as a rotating agent replaces it.

use std::time::Duration;

/// A worker credential of `account` (the `pinboard:worker` scope, every namespace, loopback
/// backends) that the node refuses from `valid_for` on: its `exp` is set so that the node's
/// 30 s of leeway (contract §2) ends then.
pub fn expiring_worker_token(account: &str, valid_for: Duration) -> String {
    let now = pinboard_protocol::worker::mint::now();
    super::node::credential(&serde_json::json!({
        "sub": account, "iat": now - 60, "exp": now + valid_for.as_secs() - 30,
        "scope": "pinboard:worker",
        "pinboard": { "namespaces": ["*"], "allowedBackendHosts": ["127.0.0.1", "localhost"] },
    }))
}

/// Puts `token` in `file` as a rotating agent does: written aside, then renamed over it.
pub fn replace_token(file: &std::path::Path, token: &str) {
    let aside = file.with_extension("next");
    std::fs::write(&aside, format!("{token}\n")).unwrap();
    std::fs::rename(&aside, file).unwrap();
}
