//! The ownership ledger as the node reads and prunes it: one page of an id's history
//! (`history.lua`, by the chain of its entries) and the sweeper's pruning of `ledger:last`
//! fields whose entry the stream's cap trimmed (`ledger_prune.lua`). The entries themselves
//! are written by the scripts that change an owner or a fence (`lua/prelude.lua`'s
//! `ledger_append`); `src/store/README.md` says how.

use serde::{Deserialize, Serialize};

use super::records::{lua_list, lua_option};
use super::scripts::{HISTORY, LEDGER_PRUNE};
use super::{HashPages, KeyName, Keys, SCRIPT_PAGE, Store};
use crate::error::Error;

/// One change of an id's owner or fence, as `GET /registry/history` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LedgerEntry {
    /// When (ms, Redis's clock): its stream ID's time.
    pub at: u64,
    /// The row's epoch after the change (digits), `None` for an epoch-less row.
    pub epoch: Option<String>,
    /// The owner before, `None` for none.
    pub from: Option<String>,
    /// The owner after, `None` for none.
    pub to: Option<String>,
    /// `placed`, `re-placed-dead-owner`, `reclaimed`, `released`, `wind-down`, `takeover`,
    /// `swept`, `woken` (and, later, `moved`, `paused`, `resumed`).
    pub reason: String,
    /// The operator's `sub`, for an operator's act.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    /// A fence change's wind-down expiry (ms), `Some(None)` for a fence cleared.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fence: Option<Option<u64>>,
}

impl LedgerEntry {
    /// An entry as `history.lua` hands it: its stream ID, then its fields and values.
    fn decode(flat: &[String]) -> Option<LedgerEntry> {
        let (stream_id, fields) = flat.split_first()?;
        let at = stream_id.split('-').next()?.parse().ok()?;
        let mut entry = LedgerEntry {
            at,
            epoch: None,
            from: None,
            to: None,
            reason: String::new(),
            by: None,
            fence: None,
        };
        let text = |value: &str| (!value.is_empty()).then(|| value.to_owned());
        for pair in fields.chunks(2) {
            let [field, value] = pair else {
                return None;
            };
            match field.as_str() {
                "epoch" => entry.epoch = text(value),
                "from" => entry.from = text(value),
                "to" => entry.to = text(value),
                "reason" => entry.reason.clone_from(value),
                "by" => entry.by = text(value),
                "fence" => entry.fence = Some(value.parse().ok()),
                _ => {}
            }
        }
        (!entry.reason.is_empty()).then_some(entry)
    }
}

/// What a page of history asks for.
pub struct HistoryAsk<'a> {
    pub env: &'a str,
    pub ns: &'a str,
    pub id: &'a str,
    /// Where to start: a page's [`HistoryPage::next`]; `None` for the newest entry.
    pub cursor: Option<&'a str>,
    /// The most entries read, 1–1000.
    pub limit: usize,
    /// The walk stops after the first entry at or before this (ms): the one in force then.
    pub since: Option<u64>,
}

/// One page of an id's history, newest first.
#[derive(Debug, PartialEq, Eq)]
pub enum HistoryPage {
    Entries {
        entries: Vec<LedgerEntry>,
        /// The stream ID the next page starts at; `None` at the end.
        next: Option<String>,
        /// The chain reached an entry the stream's cap had trimmed: older history is gone.
        truncated: bool,
    },
    /// The cursor named an entry of another id.
    ForeignCursor,
}

#[derive(Deserialize)]
struct Walked {
    #[serde(deserialize_with = "lua_list")]
    entries: Vec<Vec<String>>,
    #[serde(deserialize_with = "lua_option")]
    next: Option<String>,
    truncated: bool,
    foreign: bool,
}

/// Whether `text` is a stream ID as Redis writes one (`{ms}-{sequence}`): what a cursor is.
pub fn is_stream_id(text: &str) -> bool {
    text.bytes().all(|b| b.is_ascii_digit() || b == b'-') && stream_id_order(text).is_some()
}

impl Store {
    /// The ledger's `KEYS` in `bucket`: its stream, then its `ledger:last` hash.
    pub(super) fn ledger_keys(&self, bucket: u32) -> [&[u8]; 2] {
        let keys = self.keys.bucket(bucket);
        [keys.ledger.as_bytes(), keys.ledger_last.as_bytes()]
    }

    /// The ledger's argument to the scripts that append: its cap, or `""` when it is off.
    pub fn ledger_cap(&self) -> &str {
        &self.ledger
    }

    /// One page of the history of (env, ns, id): one `history.lua` call of at most
    /// `ask.limit` exact lookups in the id's bucket.
    pub async fn history(&self, ask: &HistoryAsk<'_>) -> Result<HistoryPage, Error> {
        let bucket = super::bucket_of(ask.id, self.keys.shards());
        let limit = ask.limit.to_string();
        let since = ask.since.map(|ms| ms.to_string()).unwrap_or_default();
        let walked: Walked = self
            .run(
                &HISTORY,
                &self.ledger_keys(bucket),
                &[
                    ask.env.as_bytes(),
                    ask.ns.as_bytes(),
                    ask.id.as_bytes(),
                    ask.cursor.unwrap_or("").as_bytes(),
                    limit.as_bytes(),
                    since.as_bytes(),
                ],
            )
            .await?;
        if walked.foreign {
            return Ok(HistoryPage::ForeignCursor);
        }
        Ok(HistoryPage::Entries {
            entries: walked
                .entries
                .iter()
                .filter_map(|flat| LedgerEntry::decode(flat))
                .collect(),
            next: walked.next,
            truncated: walked.truncated,
        })
    }

    /// The stream ID of `bucket`'s oldest ledger entry, `None` when the stream is empty or
    /// gone: one `XRANGE … COUNT 1`.
    pub async fn ledger_first(&self, bucket: u32) -> Result<Option<String>, Error> {
        let stream = &self.keys.bucket(bucket).ledger;
        let reply = self
            .redis
            .cmd(&[b"XRANGE", stream.as_bytes(), b"-", b"+", b"COUNT", b"1"])
            .await?;
        Ok(reply
            .as_array()
            .and_then(|entries| entries.first()?.as_array()?.first()?.as_str())
            .map(str::to_owned))
    }

    /// Every bucket's `ledger:last` hash, a page at a time, as (field, the stream ID of its
    /// newest entry): the sweeper's walk of them.
    pub fn ledger_last_pages(&self) -> HashPages<'_> {
        let last = |keys: &Keys, bucket: u32, _: &str, _: &str| {
            KeyName::concat(&[&keys.bucket(bucket).ledger_last])
        };
        self.hash_pages(last, "", "", None)
    }

    /// Deletes those of `fields` (at most [`SCRIPT_PAGE`]) of `bucket`'s `ledger:last` whose
    /// entry is older than the stream's first, judged again on Redis. How many went.
    pub async fn prune_ledger_last(&self, bucket: u32, fields: &[&str]) -> Result<u64, Error> {
        debug_assert!(fields.len() <= SCRIPT_PAGE);
        let args: Vec<&[u8]> = fields.iter().map(|f| f.as_bytes()).collect();
        let deleted = self
            .run_int(&LEDGER_PRUNE, &self.ledger_keys(bucket), &args)
            .await?;
        Ok(deleted.try_into().unwrap_or(0))
    }
}

/// A stream ID as (ms, sequence), for ordering two of them; `None` for anything else.
pub fn stream_id_order(stream_id: &str) -> Option<(u64, u64)> {
    let (ms, seq) = stream_id.split_once('-')?;
    Some((ms.parse().ok()?, seq.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn an_entry_decodes_from_its_stream_fields() {
        let placed = strings(&[
            "1764400000123-0",
            "env",
            "default",
            "ns",
            "/threads",
            "id",
            "a",
            "epoch",
            "1764400000123",
            "reason",
            "placed",
            "to",
            "s1",
        ]);
        assert_eq!(
            LedgerEntry::decode(&placed),
            Some(LedgerEntry {
                at: 1_764_400_000_123,
                epoch: Some("1764400000123".into()),
                from: None,
                to: Some("s1".into()),
                reason: "placed".into(),
                by: None,
                fence: None,
            })
        );
        let cleared = strings(&[
            "5-1",
            "epoch",
            "",
            "reason",
            "wind-down",
            "from",
            "s1",
            "to",
            "s1",
            "by",
            "ops",
            "fence",
            "",
            "prev",
            "4-0",
        ]);
        let entry = LedgerEntry::decode(&cleared).unwrap();
        assert_eq!(
            (entry.at, &entry.epoch, entry.fence),
            (5, &None, Some(None))
        );
        assert_eq!(entry.by.as_deref(), Some("ops"));
        let json = serde_json::to_value(&entry).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"at": 5, "epoch": null, "from": "s1", "to": "s1",
                "reason": "wind-down", "by": "ops", "fence": null})
        );
        for bad in [
            &["x-0", "reason", "placed"][..],
            &["1-0", "reason"],
            &["1-0"],
        ] {
            assert_eq!(LedgerEntry::decode(&strings(bad)), None, "{bad:?}");
        }
    }

    #[test]
    fn a_cursor_is_a_stream_id() {
        for good in ["0-0", "1764400000123-7", "18446744073709551615-0"] {
            assert!(is_stream_id(good), "{good}");
        }
        for bad in [
            "",
            "1",
            "1-",
            "-1",
            "1-2-3",
            "a-1",
            "1-+",
            "18446744073709551616-0",
            "+",
            "-",
        ] {
            assert!(!is_stream_id(bad), "{bad}");
        }
        assert!(stream_id_order("2-0") > stream_id_order("1-9"));
        assert!(stream_id_order("2-10") > stream_id_order("2-9"));
        assert_eq!(stream_id_order("x"), None);
    }
}
