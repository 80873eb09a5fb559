//! This core's cache of the header names its parsers met: a name seen before costs a
//! reference count, not an allocation.
//!
//! `HeaderName::from_bytes` copies every name `http` does not know (`x-request-id`,
//! `pinned-refusal`, a worker's own) into a fresh allocation, per header, per head. The cache is
//! direct-mapped (a name's slot is a hash of its lowercased bytes; a new name takes its slot
//! over) and bounded, in slots and in the length of a name kept: a client sending endless new
//! names only makes its own names allocate, as they all did before, and holds at most
//! `SLOTS * MAX_CACHED_LEN` bytes of this core.

use std::cell::RefCell;

use http::HeaderName;
use http::header::InvalidHeaderName;

const SLOTS: usize = 128;
/// Longer names are made afresh each time (and never held here).
const MAX_CACHED_LEN: usize = 64;

/// The cache's slots, each the last name met that hashed to it.
pub(crate) struct Names([Option<HeaderName>; SLOTS]);

thread_local! {
    static CACHE: RefCell<Names> = const { RefCell::new(Names([const { None }; SLOTS])) };
}

/// Runs `f` with this core's cache (borrowed once for a whole head's names).
pub(crate) fn with_names<R>(f: impl FnOnce(&mut Names) -> R) -> R {
    CACHE.with_borrow_mut(f)
}

impl Names {
    /// The `HeaderName` of `name` (any case): the cached one when this core met it before.
    /// Refused as `HeaderName::from_bytes` refuses (a byte that is not a token's, or none).
    pub(crate) fn get(&mut self, name: &[u8]) -> Result<HeaderName, InvalidHeaderName> {
        if name.len() > MAX_CACHED_LEN {
            return HeaderName::from_bytes(name);
        }
        let slot = &mut self.0[slot_of(name)];
        if let Some(cached) = slot
            && cached.as_str().as_bytes().eq_ignore_ascii_case(name)
        {
            // Equal but for ASCII case to a name `http` made: the same name, valid as it is.
            return Ok(cached.clone());
        }
        let made = HeaderName::from_bytes(name)?;
        *slot = Some(made.clone());
        Ok(made)
    }
}

/// FNV-1a of the name's bytes with ASCII letters folded to lower case (`| 0x20` also folds some
/// punctuation together, which only makes two names share a slot).
fn slot_of(name: &[u8]) -> usize {
    let hash = name.iter().fold(0x811c_9dc5_u32, |h, &b| {
        (h ^ u32::from(b | 0x20)).wrapping_mul(0x0100_0193)
    });
    hash as usize % SLOTS
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header_name(name: &[u8]) -> Result<HeaderName, InvalidHeaderName> {
        with_names(|names| names.get(name))
    }

    #[test]
    fn a_name_is_the_same_in_any_case_and_refused_as_http_refuses_it() {
        for name in [
            "x-request-id",
            "X-Request-ID",
            "x-request-id",
            "HOST",
            "Pinned-Refusal",
        ] {
            let made = header_name(name.as_bytes()).unwrap();
            assert_eq!(made, HeaderName::from_bytes(name.as_bytes()).unwrap());
            assert_eq!(made.as_str(), name.to_ascii_lowercase());
        }
        for bad in ["", "a b", "a:b", "x\0", "é"] {
            assert!(header_name(bad.as_bytes()).is_err(), "{bad:?}");
        }
        let long = "x".repeat(MAX_CACHED_LEN + 1);
        assert_eq!(header_name(long.as_bytes()).unwrap().as_str(), long);
    }

    #[test]
    fn names_sharing_a_slot_take_it_over() {
        // Every name lands somewhere; two in one slot alternate without mixing up.
        let names: Vec<String> = (0..4 * SLOTS).map(|i| format!("x-name-{i}")).collect();
        for _ in 0..2 {
            for name in &names {
                assert_eq!(header_name(name.as_bytes()).unwrap().as_str(), name);
            }
        }
    }
}
