//! Placement epochs: the `Pinboard-Epoch` a forward carries, recorded per held instance,
//! quoted back on release and tag, and compared to fence off stale forwards.
//!
//! The spec promises only "a decimal string", so an epoch is kept as the exact string received
//! (release compares it byte for byte in Redis) and ordered numerically without converting it
//! to a fixed-width integer that a long value could overflow.

use std::cmp::Ordering;

#[derive(Clone, Debug)]
pub struct Epoch(String);

impl Epoch {
    /// A non-empty run of ASCII digits, or `None` (answered 400 `malformed placement epoch`).
    pub fn parse(value: &[u8]) -> Option<Epoch> {
        if value.is_empty() || !value.iter().all(u8::is_ascii_digit) {
            return None;
        }
        // All ASCII digits, so valid UTF-8.
        Some(Epoch(String::from_utf8(value.to_vec()).ok()?))
    }

    /// The epoch exactly as Pinboard sent it.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    fn significant(&self) -> &str {
        self.0.trim_start_matches('0')
    }
}

impl Ord for Epoch {
    fn cmp(&self, other: &Epoch) -> Ordering {
        let (a, b) = (self.significant(), other.significant());
        a.len().cmp(&b.len()).then_with(|| a.cmp(b))
    }
}

impl PartialOrd for Epoch {
    fn partial_cmp(&self, other: &Epoch) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Epoch {
    fn eq(&self, other: &Epoch) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Epoch {}

impl std::fmt::Display for Epoch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(s: &str) -> Epoch {
        Epoch::parse(s.as_bytes()).unwrap()
    }

    #[test]
    fn only_digits_parse() {
        for good in [
            "0",
            "7",
            "1700000000123",
            "000123",
            "99999999999999999999999999999",
        ] {
            assert_eq!(e(good).as_str(), good);
        }
        for bad in [
            "", " 1", "1 ", "-1", "+1", "1.0", "1e3", "0x10", "١٢", "12a",
        ] {
            assert!(Epoch::parse(bad.as_bytes()).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn ordered_numerically_past_u64() {
        assert!(e("9") < e("10"));
        assert!(e("1700000000123") < e("1700000000124"));
        assert!(e("18446744073709551615") < e("18446744073709551616"));
        assert!(e("99999999999999999999999") > e("18446744073709551616"));
        assert_eq!(e("007"), e("7"));
        assert_eq!(e("0"), e("000"));
        assert!(e("0") < e("1"));
    }
}
