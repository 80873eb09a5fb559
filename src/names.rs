//! What an instance may be called: the namespace and id rules every route shares (the data
//! plane routes by them, the registry and the operator routes refuse what breaks them).

/// `/` plus one path segment of URL-safe characters (the id alphabet), at most 128 of them;
/// not a dot segment (a path normalizer would remove it) and not `/_pinned`, the worker's own
/// routes (`/_pinned/stats` must never be an instance).
pub fn valid_namespace(ns: &str) -> bool {
    ns.strip_prefix('/')
        .is_some_and(|seg| seg.len() <= 128 && valid_segment(seg) && seg != "_pinned")
}

/// An id or a namespace's segment: non-empty, `[A-Za-z0-9._~-]`, and not `.` or `..`.
fn valid_segment(seg: &str) -> bool {
    !seg.is_empty() && seg.bytes().all(id_byte) && seg != "." && seg != ".."
}

/// The data plane's id alphabet: `[A-Za-z0-9._~-]`.
pub fn id_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'~' | b'-')
}

pub fn valid_id(id: &str) -> bool {
    id.len() <= 256 && valid_segment(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_namespaces() {
        assert!(valid_id("abc-1.2_3~") && valid_id(&"a".repeat(256)));
        for bad in ["", ".", "..", "a b", "a/b", "é"] {
            assert!(!valid_id(bad), "{bad:?}");
        }
        assert!(!valid_id(&"a".repeat(257)));
        assert!(valid_namespace("/threads") && valid_namespace(&format!("/{}", "n".repeat(128))));
        for bad in [
            "", "threads", "/", "//", "/a/b", "/.", "/..", "/_pinned", "/a b", "/ä",
        ] {
            assert!(!valid_namespace(bad), "{bad:?}");
        }
        assert!(!valid_namespace(&format!("/{}", "n".repeat(129))));
    }
}
