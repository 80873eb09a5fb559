//! The JSON bodies of the registry's worker routes (`docs/api.md`, "The worker protocol"):
//! `POST {base}/registry/register`, `/heartbeat`, `/release`, `/tag`, `/schedule` and
//! `/deregister`, and
//! their answers. The node parses the requests and writes the answers; `pinned` writes the
//! requests and reads the answers.
//!
//! Field names are the wire's (camelCase), fields are declared in the order the spec lists
//! them, and optional fields are left out when absent. A request type deserializes as strictly
//! as the node has always parsed it (a missing or mistyped field is a shape error); the field
//! rules past the types (non-empty strings, digits, a finite headroom ≥ 0…) are the node's.
//! An answer type deserializes as leniently as a worker has always read it: the fields it
//! cannot do without are required, any other field reads as absent when it is missing or not
//! of its type, and an element of a list that does not decode is skipped, so a registry adding
//! to or reshaping an answer never breaks an older worker.

use std::collections::BTreeMap;

use serde::de::{Deserializer, IgnoredAny};
use serde::{Deserialize, Serialize};
use serde_json::{Number, Value};

use crate::Takeover;

/// `POST /registry/register`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RegisterRequest {
    pub client_id: String,
    pub secret: String,
    pub namespaces: Vec<String>,
    pub advertise_url: String,
    /// Any JSON number, kept as written (a worker counting instances sends an integer); the
    /// node reads it as an `f64`.
    pub headroom: Number,
    pub draining: bool,
    pub challenge: String,
    /// Any JSON value: the probe must answer it for `challenge`.
    pub challenge_value: Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub env: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub envs: Option<BTreeMap<String, String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub takeover: Option<Takeover>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub epoch: Option<u64>,
    /// What the worker still holds, by namespace, reclaimed from `prev_session_id`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instances: Option<BTreeMap<String, Vec<String>>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prev_session_id: Option<String>,
}

/// The `200` answer to a registration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RegisterAnswer {
    pub session_id: String,
    #[serde(flatten)]
    pub lease: Lease,
    /// The `instances` ids the worker must drop.
    #[serde(
        default,
        deserialize_with = "lenient_list",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub duplicates: Vec<Held>,
}

/// What a registration's and a heartbeat's answers both say about the lease.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Lease {
    /// The lease TTL.
    pub expires_in_ms: u64,
    /// The worker's own flag or an operator drain.
    #[serde(default, deserialize_with = "lenient")]
    pub draining: bool,
    /// Seconds left until a timed operator drain's deadline.
    #[serde(
        default,
        deserialize_with = "lenient",
        skip_serializing_if = "Option::is_none"
    )]
    pub drain_deadline: Option<Number>,
}

/// An instance named by namespace and id.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Held {
    pub ns: String,
    pub id: String,
}

/// `POST /registry/heartbeat`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HeartbeatRequest {
    pub session_id: String,
    /// As at registration.
    pub headroom: Number,
    pub draining: bool,
    pub challenge: String,
    pub challenge_value: Value,
    /// The control messages taken in since the last heartbeat that got through.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub acks: Vec<MsgId>,
}

/// A control message's id: the node sends numbers; a worker may ack them as numbers or
/// strings.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(untagged)]
pub enum MsgId {
    Number(u64),
    Text(String),
}

impl From<MsgId> for Value {
    fn from(id: MsgId) -> Value {
        match id {
            MsgId::Number(n) => n.into(),
            MsgId::Text(s) => s.into(),
        }
    }
}

/// The `200` answer to a heartbeat. `M` is how a reader takes each message: the node writes
/// [`ControlMessage`]s; a worker reads them as raw JSON first, so that one it cannot decode
/// (an unknown `type`, say) is still acked by its `msgId`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", bound(deserialize = "M: Deserialize<'de>"))]
pub struct HeartbeatAnswer<M = ControlMessage> {
    #[serde(flatten)]
    pub lease: Lease,
    /// `Some(true)` while the last probe failed; never `Some(false)` from the node.
    #[serde(
        default,
        deserialize_with = "lenient",
        skip_serializing_if = "Option::is_none"
    )]
    pub degraded: Option<bool>,
    /// Delivered again on every heartbeat until acked.
    #[serde(
        default,
        deserialize_with = "lenient_list",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub messages: Vec<M>,
}

/// A control message, as a heartbeat answer carries it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ControlMessage {
    pub msg_id: MsgId,
    /// `wind_down`, the one type so far.
    #[serde(rename = "type")]
    pub kind: String,
    pub ns: String,
    pub id: String,
    /// Seconds left until the instance's placement is fenced, as of the answer (the node
    /// writes whole seconds; a reader takes a negative one as already past); `None`, written
    /// `null`, revokes an earlier wind-down.
    pub deadline: Option<Number>,
    /// The wind-down is a move (`POST /registry/move`): the instance goes on on another
    /// worker. Written only when true; absent (an older node), or anything but `true`, is false.
    #[serde(
        default,
        deserialize_with = "lenient",
        skip_serializing_if = "std::ops::Not::not"
    )]
    pub moved: bool,
}

/// One row of `POST /registry/release`, whose body is a non-empty array of them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReleaseRow {
    pub session_id: String,
    pub namespace: String,
    pub id: String,
    /// The placement epoch quoted, digits; absent (or `""`) for an epoch-less row.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub epoch: Option<String>,
}

/// The `200` answer to a release.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReleaseAnswer {
    /// How many rows were freed.
    #[serde(default, deserialize_with = "lenient")]
    pub released: u64,
}

/// `POST /registry/tag`: a row as for release (its `epoch` required), and the tag.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TagRequest {
    #[serde(flatten)]
    pub row: ReleaseRow,
    pub tag: String,
}

/// The `200` answer to a tag.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TagAnswer {
    /// False when the row is not (or no longer) the quoted one.
    pub tagged: bool,
}

/// One entry of `POST /registry/schedule` (contract §7), a non-empty array of them: the wake
/// of a durable instance, compare-and-set on its placement row like a tag (written only while
/// the row's `sessionId` and `epoch` are the quoted ones).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ScheduleRow {
    pub session_id: String,
    pub namespace: String,
    pub id: String,
    /// The placement epoch quoted, digits.
    pub epoch: String,
    /// When to wake the instance, in ms since the Unix epoch; `null` removes its entry. Always
    /// sent, and required (as `null` at least) when read.
    #[serde(deserialize_with = "Option::deserialize")]
    pub wake_at: Option<u64>,
}

/// The `200` answer to a schedule.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ScheduleAnswer {
    /// How many entries were written or removed.
    pub scheduled: u64,
}

/// `POST /registry/deregister`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeregisterRequest {
    pub session_id: String,
}

/// A value of `T`, or anything else.
#[derive(Deserialize)]
#[serde(untagged)]
enum Either<T> {
    Is(T),
    Not(IgnoredAny),
}

impl<T> Either<T> {
    fn ok(self) -> Option<T> {
        match self {
            Either::Is(value) => Some(value),
            Either::Not(_) => None,
        }
    }
}

/// An answer field a worker can do without: its default when it is not a `T`.
fn lenient<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Either::deserialize(deserializer)?.ok().unwrap_or_default())
}

/// An answer list a worker can do without: empty when it is not a list, and without the
/// elements that are not a `T`.
fn lenient_list<'de, D, T>(deserializer: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    let elements: Vec<Either<T>> = lenient(deserializer)?;
    Ok(elements.into_iter().filter_map(Either::ok).collect())
}

#[cfg(test)]
mod tests {
    use std::fmt::Debug;

    use serde::de::DeserializeOwned;
    use serde_json::json;

    use super::*;

    /// `message` serializes to exactly `text`, and `text` reads back as `message`.
    fn round_trip<T>(message: &T, text: &str)
    where
        T: Serialize + DeserializeOwned + PartialEq + Debug,
    {
        assert_eq!(serde_json::to_string(message).unwrap(), text);
        assert_eq!(&serde_json::from_str::<T>(text).unwrap(), message);
    }

    fn strings(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn register_request() {
        let mut request = RegisterRequest {
            client_id: "worker-1".into(),
            secret: "0123456789abcdef".into(),
            namespaces: strings(&["/threads", "/docs"]),
            advertise_url: "http://127.0.0.1:9000".into(),
            headroom: 7.into(),
            draining: false,
            challenge: "c1".into(),
            challenge_value: json!("v1"),
            hostname: None,
            env: None,
            envs: None,
            takeover: None,
            epoch: None,
            instances: None,
            prev_session_id: None,
        };
        round_trip(
            &request,
            r#"{"clientId":"worker-1","secret":"0123456789abcdef","namespaces":["/threads","/docs"],"advertiseUrl":"http://127.0.0.1:9000","headroom":7,"draining":false,"challenge":"c1","challengeValue":"v1"}"#,
        );
        request.hostname = Some("edge-1".into());
        request.env = Some("blue".into());
        request.envs = Some(BTreeMap::from([("/docs".into(), "green".into())]));
        request.takeover = Some(Takeover::Deny);
        request.epoch = Some(3);
        request.instances = Some(BTreeMap::from([("/threads".into(), strings(&["a", "b"]))]));
        request.prev_session_id = Some("s0".into());
        request.headroom = Number::from_f64(2.5).unwrap();
        request.challenge_value = json!({"any": [1, null]});
        round_trip(
            &request,
            r#"{"clientId":"worker-1","secret":"0123456789abcdef","namespaces":["/threads","/docs"],"advertiseUrl":"http://127.0.0.1:9000","headroom":2.5,"draining":false,"challenge":"c1","challengeValue":{"any":[1,null]},"hostname":"edge-1","env":"blue","envs":{"/docs":"green"},"takeover":"deny","epoch":3,"instances":{"/threads":["a","b"]},"prevSessionId":"s0"}"#,
        );
    }

    #[test]
    fn register_answer() {
        let mut answer = RegisterAnswer {
            session_id: "5e55".into(),
            lease: Lease {
                expires_in_ms: 15000,
                draining: false,
                drain_deadline: None,
            },
            duplicates: Vec::new(),
        };
        round_trip(
            &answer,
            r#"{"sessionId":"5e55","expiresInMs":15000,"draining":false}"#,
        );
        answer.lease.draining = true;
        answer.lease.drain_deadline = Some(30.into());
        answer.duplicates = vec![Held {
            ns: "/threads".into(),
            id: "t9".into(),
        }];
        round_trip(
            &answer,
            r#"{"sessionId":"5e55","expiresInMs":15000,"draining":true,"drainDeadline":30,"duplicates":[{"ns":"/threads","id":"t9"}]}"#,
        );
    }

    #[test]
    fn register_answer_reads_leniently() {
        let read = |text| serde_json::from_str::<RegisterAnswer>(text);
        let answer = read(
            r#"{"sessionId":"s","expiresInMs":1,"draining":"yes","drainDeadline":"soon",
                "duplicates":[{"ns":"/t"},{"ns":"/t","id":"a","more":1},3,{"ns":"/t","id":4}]}"#,
        )
        .unwrap();
        assert!(!answer.lease.draining);
        assert_eq!(answer.lease.drain_deadline, None);
        assert_eq!(
            answer.duplicates,
            [Held {
                ns: "/t".into(),
                id: "a".into()
            }]
        );
        let answer =
            read(r#"{"sessionId":"s","expiresInMs":1,"duplicates":{},"drainDeadline":-2.5}"#)
                .unwrap();
        assert!(answer.duplicates.is_empty());
        assert_eq!(
            answer.lease.drain_deadline.and_then(|d| d.as_f64()),
            Some(-2.5)
        );
        // What a worker cannot do without stays required.
        assert!(read(r#"{"expiresInMs":1}"#).is_err());
        assert!(read(r#"{"sessionId":"s","expiresInMs":"1"}"#).is_err());
    }

    #[test]
    fn heartbeat_request() {
        let mut request = HeartbeatRequest {
            session_id: "5e55".into(),
            headroom: 7.into(),
            draining: true,
            challenge: "c2".into(),
            challenge_value: json!("v2"),
            acks: Vec::new(),
        };
        round_trip(
            &request,
            r#"{"sessionId":"5e55","headroom":7,"draining":true,"challenge":"c2","challengeValue":"v2"}"#,
        );
        request.acks = vec![MsgId::Number(1), MsgId::Text("2".into())];
        round_trip(
            &request,
            r#"{"sessionId":"5e55","headroom":7,"draining":true,"challenge":"c2","challengeValue":"v2","acks":[1,"2"]}"#,
        );
        // Neither a negative number nor a fraction is a msgId.
        for ack in ["-1", "1.5", "null", "true"] {
            let text = format!(
                r#"{{"sessionId":"s","headroom":0,"draining":false,"challenge":"c","challengeValue":0,"acks":[{ack}]}}"#
            );
            assert!(
                serde_json::from_str::<HeartbeatRequest>(&text).is_err(),
                "{ack}"
            );
        }
    }

    #[test]
    fn heartbeat_answer() {
        let mut answer = HeartbeatAnswer {
            lease: Lease {
                expires_in_ms: 15000,
                draining: false,
                drain_deadline: None,
            },
            degraded: None,
            messages: Vec::new(),
        };
        round_trip(&answer, r#"{"expiresInMs":15000,"draining":false}"#);
        answer.lease.drain_deadline = Some(12.into());
        answer.degraded = Some(true);
        answer.messages = vec![
            ControlMessage {
                msg_id: MsgId::Number(4),
                kind: "wind_down".into(),
                ns: "/threads".into(),
                id: "a".into(),
                deadline: Some(30.into()),
                moved: false,
            },
            ControlMessage {
                msg_id: MsgId::Number(5),
                kind: "wind_down".into(),
                ns: "/threads".into(),
                id: "a".into(),
                deadline: None,
                moved: false,
            },
            ControlMessage {
                msg_id: MsgId::Number(6),
                kind: "wind_down".into(),
                ns: "/threads".into(),
                id: "b".into(),
                deadline: Some(0.into()),
                moved: true,
            },
        ];
        round_trip(
            &answer,
            r#"{"expiresInMs":15000,"draining":false,"drainDeadline":12,"degraded":true,"messages":[{"msgId":4,"type":"wind_down","ns":"/threads","id":"a","deadline":30},{"msgId":5,"type":"wind_down","ns":"/threads","id":"a","deadline":null},{"msgId":6,"type":"wind_down","ns":"/threads","id":"b","deadline":0,"moved":true}]}"#,
        );
    }

    #[test]
    fn heartbeat_answer_reads_messages_raw() {
        let answer: HeartbeatAnswer<Value> = serde_json::from_str(
            r#"{"expiresInMs":1,"degraded":"no","messages":[{"msgId":9,"type":"rebalance"},7]}"#,
        )
        .unwrap();
        assert_eq!(answer.degraded, None);
        assert_eq!(
            answer.messages,
            [json!({"msgId": 9, "type": "rebalance"}), json!(7)]
        );
        let answer: HeartbeatAnswer<Value> =
            serde_json::from_str(r#"{"expiresInMs":1,"messages":null}"#).unwrap();
        assert!(answer.messages.is_empty());
        assert!(serde_json::from_str::<HeartbeatAnswer<Value>>(r#"{"draining":true}"#).is_err());
    }

    #[test]
    fn msg_ids_as_json() {
        assert_eq!(Value::from(MsgId::Number(7)), json!(7));
        assert_eq!(Value::from(MsgId::Text("m-1".into())), json!("m-1"));
    }

    #[test]
    fn release_row_and_answer() {
        let mut row = ReleaseRow {
            session_id: "5e55".into(),
            namespace: "/threads".into(),
            id: "t1".into(),
            epoch: Some("4".into()),
        };
        round_trip(
            &row,
            r#"{"sessionId":"5e55","namespace":"/threads","id":"t1","epoch":"4"}"#,
        );
        row.epoch = None;
        round_trip(
            &row,
            r#"{"sessionId":"5e55","namespace":"/threads","id":"t1"}"#,
        );
        round_trip(&ReleaseAnswer { released: 2 }, r#"{"released":2}"#);
        let read = |text| {
            serde_json::from_str::<ReleaseAnswer>(text)
                .unwrap()
                .released
        };
        assert_eq!((read("{}"), read(r#"{"released":-1}"#)), (0, 0));
    }

    #[test]
    fn tag_request_and_answer() {
        round_trip(
            &TagRequest {
                row: ReleaseRow {
                    session_id: "5e55".into(),
                    namespace: "/threads".into(),
                    id: "t1".into(),
                    epoch: Some("4".into()),
                },
                tag: "ws:W".into(),
            },
            r#"{"sessionId":"5e55","namespace":"/threads","id":"t1","epoch":"4","tag":"ws:W"}"#,
        );
        round_trip(&TagAnswer { tagged: true }, r#"{"tagged":true}"#);
    }

    #[test]
    fn schedule_row_and_answer() {
        let mut row = ScheduleRow {
            session_id: "5e55".into(),
            namespace: "/threads".into(),
            id: "t1".into(),
            epoch: "4".into(),
            wake_at: Some(1_700_000_000_000),
        };
        round_trip(
            &row,
            r#"{"sessionId":"5e55","namespace":"/threads","id":"t1","epoch":"4","wakeAt":1700000000000}"#,
        );
        row.wake_at = None;
        round_trip(
            &row,
            r#"{"sessionId":"5e55","namespace":"/threads","id":"t1","epoch":"4","wakeAt":null}"#,
        );
        // `wakeAt` is required, as a number or null.
        for text in [
            r#"{"sessionId":"5e55","namespace":"/threads","id":"t1","epoch":"4"}"#,
            r#"{"sessionId":"5e55","namespace":"/threads","id":"t1","epoch":"4","wakeAt":"1"}"#,
        ] {
            assert!(serde_json::from_str::<ScheduleRow>(text).is_err(), "{text}");
        }
        round_trip(&ScheduleAnswer { scheduled: 1 }, r#"{"scheduled":1}"#);
        assert!(serde_json::from_str::<ScheduleAnswer>("{}").is_err());
    }

    #[test]
    fn deregister_request() {
        round_trip(
            &DeregisterRequest {
                session_id: "5e55".into(),
            },
            r#"{"sessionId":"5e55"}"#,
        );
    }
}
