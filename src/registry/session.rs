//! A worker session as the registry stores it, and the copy of it each bucket holds.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// In single mode every key's `{env}` part is this literal (contract §3).
pub const SINGLE_ENV: &str = "default";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Takeover {
    WindDown,
    Deny,
}

impl Takeover {
    pub fn as_str(self) -> &'static str {
        match self {
            Takeover::WindDown => "wind_down",
            Takeover::Deny => "deny",
        }
    }
}

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
    pub fn bucket_record(&self, operator_draining: bool) -> String {
        let record = BucketRecord {
            expiry: self.expiry,
            headroom: self.headroom,
            draining: self.draining || operator_draining,
            degraded: self.degraded_since.is_some(),
            namespaces: &self.namespaces,
            hostname: self.hostname.as_deref(),
            env: self.env.as_deref(),
            envs: &self.envs,
            advertise_url: &self.advertise_url,
            secret: &self.secret,
        };
        serde_json::to_string(&record).expect("bucket record serializes")
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct BucketRecord<'a> {
    expiry: u64,
    headroom: f64,
    draining: bool,
    degraded: bool,
    namespaces: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    hostname: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    env: Option<&'a str>,
    envs: &'a BTreeMap<String, String>,
    advertise_url: &'a str,
    secret: &'a str,
}
