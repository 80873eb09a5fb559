//! `pinboard-protocol`: the worker protocol's vocabulary (`docs/api.md`, "The worker protocol",
//! "Headers" and "The worker's side"), defined once for the node that speaks it and for
//! `pinned`, the worker library: the [`header`] names either side writes or reads, what an
//! attestation is for ([`Purpose`]), hostname-aware mode's [`Takeover`] policy, and the
//! [`registry`] routes' request and answer bodies, the request-[`path`] rules both sides
//! apply; and the [`worker`] side's rules, decided
//! without a runtime for both worker libraries. Nothing here does network I/O (a worker's
//! token file is read by [`worker::credential`]).

use serde::{Deserialize, Serialize};

pub mod path;
pub mod registry;
pub mod worker;

/// The `Pinboard-*` and `Pinned-*` headers of the protocol, lowercased as they arrive.
///
/// Constants rather than strings: looking a `&str` up in a header map parses it every time,
/// and every data-plane request asks for some of these.
pub mod header {
    use http::HeaderName;

    /// The node's signed statement of what a request to a worker is for (forwards, `_wake`,
    /// `_pinned/stats`, and the `_pinned/challenge` probe when the secret is not sent).
    pub const ATTESTATION: HeaderName = HeaderName::from_static("pinboard-attestation");
    /// The placement epoch a forward or `_wake` is sent under.
    pub const EPOCH: HeaderName = HeaderName::from_static("pinboard-epoch");
    /// The worker's registered secret, on the node's `_pinned/challenge` probe.
    pub const PROXY_SECRET: HeaderName = HeaderName::from_static("pinboard-proxy-secret");
    /// A worker's in-band refusal of a new activation (spec "In-band refusal"), with the value
    /// [`LEASE_UNHEALTHY`] on a 503.
    pub const REFUSAL: HeaderName = HeaderName::from_static("pinned-refusal");
    /// The one [`REFUSAL`] value: the worker's lease is not known to be live (or it is
    /// stopping, or superseded), so the node re-places the instance.
    pub const LEASE_UNHEALTHY: &str = "lease-unhealthy";

    /// Caller attestation, from an instance calling another through the node: the calling
    /// instance, `{ns}/{id}`.
    pub const FROM: HeaderName = HeaderName::from_static("pinboard-from");
    /// Caller attestation: the calling worker's session.
    pub const SESSION: HeaderName = HeaderName::from_static("pinboard-session");
    /// Caller attestation: the calling worker's registered secret.
    pub const SESSION_SECRET: HeaderName = HeaderName::from_static("pinboard-session-secret");
    /// Caller attestation: the call chain's depth.
    pub const SUBREQUEST_DEPTH: HeaderName = HeaderName::from_static("pinboard-subrequest-depth");
}

/// What an attestation is for (contract §11), its `purpose` claim: a worker accepts it only on
/// the matching route, so a token seen on one route cannot be replayed on another.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Purpose {
    /// An instance request (`/{ns}/{id}...`).
    Forward,
    /// The durability sweep's `POST {ns}/{id}/_wake`.
    Wake,
    /// `GET /_pinned/stats`.
    Stats,
    /// `GET /_pinned/challenge`.
    Challenge,
}

impl Purpose {
    const ALL: [Purpose; 4] = [
        Purpose::Forward,
        Purpose::Wake,
        Purpose::Stats,
        Purpose::Challenge,
    ];

    /// The `purpose` claim's value.
    pub fn as_str(self) -> &'static str {
        match self {
            Purpose::Forward => "forward",
            Purpose::Wake => "wake",
            Purpose::Stats => "stats",
            Purpose::Challenge => "challenge",
        }
    }

    /// The purpose a `purpose` claim names, if it names one.
    pub fn from_claim(claim: &str) -> Option<Purpose> {
        Purpose::ALL.into_iter().find(|p| p.as_str() == claim)
    }
}

/// Hostname-aware mode's policy when another hostname's worker holds an instance a
/// registering worker's hostname asks for (spec "Placement"): sent at registration, kept in the
/// session record.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn purposes_round_trip_through_their_claim() {
        for purpose in Purpose::ALL {
            assert_eq!(Purpose::from_claim(purpose.as_str()), Some(purpose));
        }
        for unknown in ["", "admin", "Forward", "forward "] {
            assert_eq!(Purpose::from_claim(unknown), None, "{unknown:?}");
        }
    }
}
