//! The placement epoch as a fencing token for the worker's own storage: [`Fence`] (an epoch's
//! significant digits, ordered exactly at any size), the refusal of a write from an earlier
//! epoch ([`StaleEpoch`], [`FencedError`]), and the conditional writes that make a store
//! refuse one — SQLite's statements ([`sqlite`]) and Redis's compare-and-set script
//! ([`REDIS_COMPARE_AND_SET`]) — as text, for whichever client runs them (`pinned`'s helpers,
//! features `sqlite` and `redis`, or an application's own).
//!
//! A worker paused past its lease (a GC pause, a stopped VM) may resume believing it still owns
//! an instance that the node has placed elsewhere at a higher epoch. The libraries refuse its
//! late answers, but not what it writes to a store of its own: only the store can, by keeping
//! the highest epoch that wrote each key and refusing a write from a lower one.

use std::cmp::Ordering;
use std::fmt;

use super::epoch::Epoch;
use super::serve::Instance;

/// A placement epoch as a fencing token: what to hand every store the application writes, so
/// that a write from an owner the instance has moved on from is refused.
///
/// Kept as its significant digits (`"0"` for zero; the node sends no leading zeros, and
/// `"007"` is the same token as `"7"`), ordered numerically by length then bytes: never
/// converted to a number, so an epoch past 2^53 or 2^64 compares exactly.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Fence(String);

/// Digits in [`Fence::padded`], the form SQLite compares: any epoch up to 10^40 − 1. The node
/// mints epochs from the clock in milliseconds (13 digits) plus one per claim at most.
pub const PADDED_WIDTH: usize = 40;

impl Fence {
    /// The fence of a store that no fenced write reached (a file of before fencing): every
    /// epoch is at least this.
    pub fn zero() -> Fence {
        Fence("0".to_owned())
    }

    /// A non-empty run of ASCII digits (leading zeros allowed), or `None`.
    pub fn parse(text: &str) -> Option<Fence> {
        let epoch = Epoch::parse(text.as_bytes())?;
        Some(Fence::from(&epoch))
    }

    /// The significant digits (`"0"` for zero): what a store keeps.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Zero-padded to [`PADDED_WIDTH`] digits, so that text comparison (SQLite's `BINARY`
    /// collation, `ORDER BY`) is numeric order; `None` for an epoch of more digits.
    pub fn padded(&self) -> Option<String> {
        (self.0.len() <= PADDED_WIDTH).then(|| format!("{:0>PADDED_WIDTH$}", self.0))
    }
}

impl Default for Fence {
    fn default() -> Fence {
        Fence::zero()
    }
}

impl From<&Epoch> for Fence {
    fn from(epoch: &Epoch) -> Fence {
        match epoch.as_str().trim_start_matches('0') {
            "" => Fence::zero(),
            digits => Fence(digits.to_owned()),
        }
    }
}

/// The epoch the instance's request was admitted at.
impl From<&Instance> for Fence {
    fn from(instance: &Instance) -> Fence {
        Fence::from(&instance.epoch)
    }
}

impl Ord for Fence {
    fn cmp(&self, other: &Fence) -> Ordering {
        // Significant digits only: the longer is the larger, else the first differing digit.
        let (a, b) = (&self.0, &other.0);
        a.len().cmp(&b.len()).then_with(|| a.cmp(b))
    }
}

impl PartialOrd for Fence {
    fn partial_cmp(&self, other: &Fence) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Display for Fence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A write refused because the store holds a later epoch's: the writer is no longer the
/// instance's owner, and what it wrote must not replace what the owner did.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("stale epoch: stored {stored}, offered {offered}")]
pub struct StaleEpoch {
    /// The epoch the store holds (at least the one that refused the write).
    pub stored: Fence,
    /// The writer's epoch.
    pub offered: Fence,
}

/// Why a fenced write did not happen: refused as stale, or the store failed (`E`: its own
/// error, `std::io::Error` for the `FileStore`).
#[derive(Debug, thiserror::Error)]
pub enum FencedError<E> {
    #[error(transparent)]
    Stale(#[from] StaleEpoch),
    #[error(transparent)]
    Store(E),
}

/// Compare-and-set by fencing token, for Redis (`EVALSHA`; `KEYS[1]` the key, a hash of
/// `value` and `epoch`; `ARGV` the offered epoch's digits and the value): written only when
/// the offered epoch is at least the stored one, compared as digit strings (length, then
/// bytes). Answers `[1, offered]` when written, `[0, stored]` when refused.
pub const REDIS_COMPARE_AND_SET: &str = include_str!("fencing.lua");

/// The statements of a fenced SQLite table (`key TEXT PRIMARY KEY, value BLOB, epoch TEXT`),
/// each epoch stored as [`Fence::padded`] text: fixed-width digits compare as numbers under
/// SQLite's `BINARY` collation at any size, where an `INTEGER` would overflow past 2^63.
pub mod sqlite {
    /// `table` as an SQL identifier, quoted: any name, never more SQL.
    fn quoted(table: &str) -> String {
        format!("\"{}\"", table.replace('"', "\"\""))
    }

    /// Creates the table when missing.
    pub fn create(table: &str) -> String {
        format!(
            "CREATE TABLE IF NOT EXISTS {} (key TEXT PRIMARY KEY NOT NULL, value BLOB NOT NULL, \
             epoch TEXT NOT NULL)",
            quoted(table)
        )
    }

    /// Inserts or replaces `?1`'s value with `?2` at the padded epoch `?3`, in one statement
    /// (race-free between connections): a new key is inserted, an existing one updated only
    /// while its stored epoch is at most `?3`. One row changed when written, none when stale.
    pub fn write(table: &str) -> String {
        let table = quoted(table);
        format!(
            "INSERT INTO {table} (key, value, epoch) VALUES (?1, ?2, ?3) \
             ON CONFLICT (key) DO UPDATE SET value = excluded.value, epoch = excluded.epoch \
             WHERE excluded.epoch >= {table}.epoch"
        )
    }

    /// `?1`'s value and padded epoch.
    pub fn read(table: &str) -> String {
        format!("SELECT value, epoch FROM {} WHERE key = ?1", quoted(table))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(digits: &str) -> Fence {
        Fence::parse(digits).unwrap()
    }

    #[test]
    fn a_fence_is_the_epochs_significant_digits() {
        assert_eq!(f("007").as_str(), "7");
        assert_eq!(f("000"), Fence::zero());
        assert_eq!(f("0").as_str(), "0");
        assert_eq!(Fence::default(), Fence::zero());
        assert_eq!(f("1700000000123").to_string(), "1700000000123");
        for bad in ["", " 1", "-1", "+1", "1.0", "1e3", "١٢", "12a"] {
            assert_eq!(Fence::parse(bad), None, "{bad:?}");
        }
        let epoch = Epoch::parse(b"00042").unwrap();
        assert_eq!(Fence::from(&epoch).as_str(), "42");
    }

    #[test]
    fn fences_order_exactly_past_2_53_and_2_64() {
        assert!(f("9") < f("10"));
        assert!(f("0") < f("1"));
        // 2^53 + 1 is the first integer a float cannot hold: it still orders after 2^53.
        assert!(f("9007199254740992") < f("9007199254740993"));
        assert!(f("18446744073709551615") < f("18446744073709551616"));
        assert!(f("99999999999999999999999") > f("18446744073709551616"));
        assert!(f("0018446744073709551616") == f("18446744073709551616"));
        let mut sorted = [f("100"), f("99"), f("0"), f("1000"), f("101")];
        sorted.sort();
        let digits: Vec<&str> = sorted.iter().map(Fence::as_str).collect();
        assert_eq!(digits, ["0", "99", "100", "101", "1000"]);
    }

    #[test]
    fn padded_fences_compare_as_text_in_numeric_order() {
        let padded = f("42").padded().unwrap();
        assert_eq!(padded.len(), PADDED_WIDTH);
        assert_eq!(padded, format!("{}42", "0".repeat(PADDED_WIDTH - 2)));
        let epochs = ["0", "9", "10", "9007199254740993", "18446744073709551616"];
        for pair in epochs.windows(2) {
            let (a, b) = (f(pair[0]).padded().unwrap(), f(pair[1]).padded().unwrap());
            assert!(a < b, "{a} < {b}");
        }
        let widest = "9".repeat(PADDED_WIDTH);
        assert_eq!(f(&widest).padded().as_deref(), Some(widest.as_str()));
        assert_eq!(f(&format!("1{}", "0".repeat(PADDED_WIDTH))).padded(), None);
    }

    #[test]
    fn a_stale_epoch_says_both() {
        let stale = StaleEpoch {
            stored: f("1700000000124"),
            offered: f("1700000000123"),
        };
        assert_eq!(
            stale.to_string(),
            "stale epoch: stored 1700000000124, offered 1700000000123"
        );
        let error: FencedError<std::io::Error> = stale.clone().into();
        assert_eq!(error.to_string(), stale.to_string());
    }

    #[test]
    fn sqlite_names_the_table_quoted() {
        assert_eq!(
            sqlite::read("notes"),
            "SELECT value, epoch FROM \"notes\" WHERE key = ?1"
        );
        let hostile = sqlite::write("t\"; DROP TABLE x; --");
        assert!(hostile.starts_with("INSERT INTO \"t\"\"; DROP TABLE x; --\" "));
        assert!(hostile.ends_with("WHERE excluded.epoch >= \"t\"\"; DROP TABLE x; --\".epoch"));
    }
}
