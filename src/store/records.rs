//! The records stored under the keys of [`super::Keys`], each with its one encoding (JSON, as
//! the contract fixes it and as the Lua scripts read it): a session's master record and the
//! copy each bucket holds, placement rows, client records, bindings and drains.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize};

/// Hostname-aware mode's takeover policy: the worker protocol's, shared with `pinned`.
pub use pinboard_protocol::Takeover;

/// In single mode every key's `{env}` part is this literal (contract §3).
pub const SINGLE_ENV: &str = "default";

/// The master record of a session, in the registry slot's `sessions` hash.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Session {
    pub session_id: String,
    pub client_id: String,
    pub account: String,
    pub secret: String,
    pub advertise_url: String,
    pub namespaces: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<String>,
    /// Always written (possibly `{}`): the scripts index it without a nil check.
    #[serde(default)]
    pub envs: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub takeover: Option<Takeover>,
    pub headroom: f64,
    /// The worker's own draining flag (an operator drain is kept apart).
    pub draining: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub degraded_since: Option<u64>,
    /// Epoch ms; the lease runs out at this instant. Set by the scripts.
    #[serde(default)]
    pub expiry: u64,
}

impl Session {
    /// The env of this session's placements in `ns`: `envs[ns]`, else `env`, and in single mode
    /// the literal `default`.
    pub fn env_of(&self, ns: &str) -> &str {
        match &self.env {
            Some(env) => self.envs.get(ns).unwrap_or(env),
            None => SINGLE_ENV,
        }
    }

    /// The copy each bucket holds: what a resolve needs to pick and reach this worker.
    pub fn bucket_copy(&self, operator_draining: bool) -> BucketCopy {
        BucketCopy {
            expiry: self.expiry,
            headroom: self.headroom,
            draining: self.draining || operator_draining,
            degraded: self.degraded_since.is_some(),
            hostname: self.hostname.clone(),
            advertise_url: self.advertise_url.clone(),
            secret: self.secret.clone(),
            dropped: false,
            namespaces: Vec::new(),
        }
    }

    /// The `{hostname}{ns}` name of each namespace list this session's copies are members of
    /// (`hostname` is `""` in single mode), as the bucket's membership entry records them.
    pub fn list_names(&self) -> Vec<String> {
        list_names(self.hostname.as_deref(), &self.namespaces)
    }

    pub fn decode(raw: &[u8]) -> Result<Session, serde_json::Error> {
        serde_json::from_slice(raw)
    }

    pub fn encode(&self) -> String {
        serde_json::to_string(self).expect("a session serializes")
    }
}

/// A worker's copy in one bucket's `workers` hash: what a resolve reads of it, no namespace
/// list (a resolve decodes the copies of a namespace's workers; the lists a copy is a member
/// of are its membership entry, read by `bucket_worker.lua` only). A dropped session leaves a
/// tombstone (`dropped`, expired) for a lease, so that a heartbeat racing the drop cannot
/// write the copy back; the tombstone is pruned like any dead copy.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BucketCopy {
    pub expiry: u64,
    #[serde(default)]
    pub headroom: f64,
    #[serde(default)]
    pub draining: bool,
    #[serde(default)]
    pub degraded: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    #[serde(default)]
    pub advertise_url: String,
    #[serde(default)]
    pub secret: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dropped: bool,
    /// Read, never written: a copy written before membership entries existed (by an older
    /// node, until its worker's next heartbeat rewrites it) names its namespaces itself.
    #[serde(default, skip_serializing, deserialize_with = "lua_list")]
    pub namespaces: Vec<String>,
}

impl BucketCopy {
    pub fn decode(raw: &[u8]) -> Result<BucketCopy, serde_json::Error> {
        serde_json::from_slice(raw)
    }

    pub fn encode(&self) -> String {
        serde_json::to_string(self).expect("a bucket copy serializes")
    }

    /// The lists an older copy names itself (see `namespaces`); none for a current one.
    pub fn legacy_list_names(&self) -> Vec<String> {
        list_names(self.hostname.as_deref(), &self.namespaces)
    }
}

/// The `{hostname}{ns}` names of a worker's namespace lists.
fn list_names(hostname: Option<&str>, namespaces: &[String]) -> Vec<String> {
    let hostname = hostname.unwrap_or("");
    namespaces
        .iter()
        .map(|ns| format!("{hostname}{ns}"))
        .collect()
}

/// A placement row (contract §5): the owner session and the epoch it was placed at; a row
/// without a session is an ownerless placeholder. `expiry` is a wind-down fence (ms), `paused`
/// an operator's pause (the data plane answers 503 for the id), `mv` a move's successor (the
/// next placement goes to it).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PlacementRow {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expiry: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<Paused>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mv: Option<Successor>,
}

/// An operator's pause of an instance, as its row holds it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Paused {
    /// The operator's `sub` (`""` for a credential without one).
    pub by: String,
    /// When (ms, Redis's clock).
    pub at: u64,
    /// Why, as the operator said; `null` when they did not.
    #[serde(default)]
    pub reason: Option<String>,
}

/// A move's successor, as the moved row names it until the id is placed again.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Successor {
    /// The successor's session.
    pub to: String,
    /// The operator's `sub`.
    #[serde(default)]
    pub by: String,
}

impl PlacementRow {
    /// A row as stored; `None` for bytes that are not one.
    pub fn decode(raw: &[u8]) -> Option<PlacementRow> {
        serde_json::from_slice(raw).ok()
    }

    /// The owner, or `None` for a placeholder (no sessionId, or an empty one).
    pub fn owner(&self) -> Option<&str> {
        self.session_id.as_deref().filter(|s| !s.is_empty())
    }

    /// The epoch as quoted back by release, tag and wind-down (`""` for an epoch-less row).
    pub fn epoch(&self) -> &str {
        self.epoch.as_deref().unwrap_or("")
    }

    /// Whether a wind-down fence has closed at `now` (ms).
    pub fn fenced(&self, now: u64) -> bool {
        self.expiry.is_some_and(|e| e <= now)
    }
}

/// A client's entry in `clients`: the account that first registered it and its live session.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClientRecord {
    pub account: String,
    pub session_id: String,
}

impl ClientRecord {
    pub fn decode(raw: &[u8]) -> Option<ClientRecord> {
        serde_json::from_slice(raw).ok()
    }
}

/// Hostname-aware: the env a `{hostname}{ns}` is bound to. Stored beside it, the binding
/// epoch (decimal digits, compared by the scripts only: `prelude.lua`'s `epoch_cmp`).
#[derive(Clone, Debug, Deserialize)]
pub struct HostBinding {
    pub env: String,
}

/// Hostname-aware: the takeover rule an env's workers agreed on (and the binding epoch, as
/// for [`HostBinding`]).
#[derive(Clone, Debug, Deserialize)]
pub struct EnvBinding {
    pub takeover: String,
}

/// An operator drain of a client, as stored (`deadline` absent for a cordon).
#[derive(Clone, Debug, Deserialize)]
pub struct Drain {
    pub deadline: Option<u64>,
}

/// A `wind_down` control message as queued (`control:{sessionId}`): `deadline` absolute (ms),
/// absent when it revokes an earlier one; `"moved": true` for a move's (absent otherwise: the
/// worker libraries read it as false), which the node's heartbeat passes on as it is.
#[derive(Debug, Serialize)]
pub struct WindDown<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    ns: &'a str,
    id: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    deadline: Option<u64>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    moved: bool,
}

impl<'a> WindDown<'a> {
    pub fn new(ns: &'a str, id: &'a str, deadline: Option<u64>) -> WindDown<'a> {
        WindDown {
            kind: "wind_down",
            ns,
            id,
            deadline,
            moved: false,
        }
    }

    /// The same message, telling the owner the instance moves to another worker.
    pub fn moved(self, moved: bool) -> WindDown<'a> {
        WindDown { moved, ..self }
    }
}

/// Lua's cjson cannot tell an empty array from an empty object and writes `{}` for both, so a
/// list read back from a script may arrive as `{}`.
pub fn lua_list<'de, D, T>(de: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum ListOrEmpty<T> {
        List(Vec<T>),
        Empty(BTreeMap<String, serde::de::IgnoredAny>),
    }
    match ListOrEmpty::deserialize(de)? {
        ListOrEmpty::List(items) => Ok(items),
        ListOrEmpty::Empty(map) if map.is_empty() => Ok(Vec::new()),
        ListOrEmpty::Empty(_) => Err(serde::de::Error::custom("expected a list")),
    }
}

/// Scripts answer `false` for "none" (Lua has no null inside tables).
pub fn lua_option<'de, D, T>(de: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum FalseOr<T> {
        False(bool),
        Some(T),
    }
    match Option::<FalseOr<T>>::deserialize(de)? {
        None | Some(FalseOr::False(false)) => Ok(None),
        Some(FalseOr::Some(v)) => Ok(Some(v)),
        Some(FalseOr::False(true)) => Err(serde::de::Error::custom("expected false or a value")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_decode_as_the_scripts_write_them() {
        let row = PlacementRow::decode(br#"{"sessionId":"s1","epoch":"17","tag":"t"}"#).unwrap();
        assert_eq!(row.owner(), Some("s1"));
        assert_eq!(row.epoch(), "17");
        assert!(!row.fenced(0));
        let placeholder = PlacementRow::decode(br#"{"sessionId":""}"#).unwrap();
        assert_eq!(placeholder.owner(), None);
        assert_eq!(placeholder.epoch(), "");
        let fenced = PlacementRow::decode(br#"{"sessionId":"s","expiry":5}"#).unwrap();
        assert!(fenced.fenced(5) && !fenced.fenced(4));
        assert!(PlacementRow::decode(b"[1]").is_none());
    }

    #[test]
    fn a_paused_or_moved_row_keeps_what_the_scripts_wrote() {
        let raw = br#"{"sessionId":"","paused":{"by":"ops","at":7,"reason":"incident 12"},"mv":{"to":"s2","by":"ops"}}"#;
        let row = PlacementRow::decode(raw).unwrap();
        assert_eq!(row.owner(), None);
        let paused = row.paused.as_ref().unwrap();
        assert_eq!(
            (&*paused.by, paused.at, paused.reason.as_deref()),
            ("ops", 7, Some("incident 12"))
        );
        assert_eq!(row.mv.as_ref().unwrap().to, "s2");
        // A pause without a reason (the script leaves it out).
        let row = PlacementRow::decode(br#"{"sessionId":"s","paused":{"by":"","at":1}}"#).unwrap();
        assert_eq!(row.paused.unwrap().reason, None);
    }

    #[test]
    fn a_moves_wind_down_says_moved_and_only_then() {
        let plain = serde_json::to_value(WindDown::new("/t", "a", Some(5))).unwrap();
        assert_eq!(
            plain,
            serde_json::json!({"type": "wind_down", "ns": "/t", "id": "a", "deadline": 5})
        );
        let moved = WindDown::new("/t", "a", Some(5)).moved(true);
        assert_eq!(
            serde_json::to_value(moved).unwrap(),
            serde_json::json!({"type": "wind_down", "ns": "/t", "id": "a", "deadline": 5, "moved": true})
        );
        let revoked = serde_json::to_value(WindDown::new("/t", "a", None).moved(false)).unwrap();
        assert_eq!(
            revoked,
            serde_json::json!({"type": "wind_down", "ns": "/t", "id": "a"})
        );
    }

    #[test]
    fn a_tombstone_is_an_expired_copy_in_no_list() {
        // As bucket_worker.lua writes one; cjson writes an empty list as {}.
        for raw in [
            &br#"{"expiry":1,"dropped":true}"#[..],
            br#"{"expiry":1,"dropped":true,"namespaces":{}}"#,
        ] {
            let tombstone = BucketCopy::decode(raw).unwrap();
            assert!(tombstone.dropped && tombstone.legacy_list_names().is_empty());
        }
    }

    #[test]
    fn a_copy_holds_no_namespace_list() {
        let session = Session {
            session_id: "s".into(),
            client_id: "c".into(),
            account: "a".into(),
            secret: "k".repeat(16),
            advertise_url: "http://127.0.0.1:1".into(),
            namespaces: vec!["/a".into(), "/b".into()],
            hostname: Some("h.example".into()),
            env: Some("e".into()),
            envs: BTreeMap::from([("/b".into(), "f".into())]),
            takeover: None,
            headroom: 1.0,
            draining: false,
            degraded_since: None,
            expiry: 5,
        };
        assert_eq!(session.list_names(), ["h.example/a", "h.example/b"]);
        let copy = session.bucket_copy(false).encode();
        for absent in ["namespaces", "envs", "/a", "dropped"] {
            assert!(!copy.contains(absent), "{absent} in {copy}");
        }
        // An older node's copy still says which lists it is in.
        let legacy =
            BucketCopy::decode(br#"{"expiry":1,"hostname":"h","namespaces":["/a"]}"#).unwrap();
        assert_eq!(legacy.legacy_list_names(), ["h/a"]);
    }
}
