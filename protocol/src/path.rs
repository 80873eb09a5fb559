//! Request paths as the node routes and forwards them: dot segments removed once, before any
//! route or `{ns}/{id}` is taken from the path (RFC 3986 §5.2.4, as nginx does).
//!
//! A worker stack or a proxy behind the node that normalizes the path itself would otherwise
//! serve `/threads/../_pinned/stats` as `/_pinned/stats`, or `/a/x/../../b/y` as another
//! instance than the one Pinboard placed: framing and identity are decided here, never again
//! downstream. `%2e` counts as a dot (RFC 3986 §2.3: an encoded unreserved character is the
//! character).
//!
//! An instance's path below `{id}` must also say the same thing to every server that reads it:
//! [`splits_when_decoded`] finds what a server decoding before it routes (uvicorn does: its
//! `scope["path"]` is decoded) would read as other segments than the node did, `%2F` turning
//! `..%2F..%2Fadmin` into `../../admin`. The node refuses such a path and so do both worker
//! libraries.

use std::borrow::Cow;

/// `path` with its dot segments removed; borrowed when it has none (the common case: no `.`
/// and no `%` at all is one scan).
pub fn remove_dot_segments(path: &str) -> Cow<'_, str> {
    let has_dots = memchr::memchr2(b'.', b'%', path.as_bytes()).is_some()
        && path.split('/').any(|seg| dots(seg) > 0);
    if !has_dots {
        return Cow::Borrowed(path);
    }
    let mut kept: Vec<&str> = Vec::new();
    // Whether the path ends in a directory (`/a/.` is `/a/`).
    let mut ends_in_dir = false;
    for seg in path.strip_prefix('/').unwrap_or(path).split('/') {
        ends_in_dir = true;
        match dots(seg) {
            1 => {}
            2 => {
                kept.pop();
            }
            _ => {
                kept.push(seg);
                ends_in_dir = false;
            }
        }
    }
    let mut clean = String::with_capacity(path.len());
    for seg in &kept {
        clean.push('/');
        clean.push_str(seg);
    }
    if ends_in_dir || clean.is_empty() {
        clean.push('/');
    }
    Cow::Owned(clean)
}

/// Whether `path`, once percent-decoded, holds other segments than it shows: a dot segment
/// (`.`, `..`, either spelled with `%2e`), an encoded `/` (`%2F`) or a `\` (`%5C` or as is,
/// which some servers take for `/`). Any case of the hex digits.
pub fn splits_when_decoded(path: &str) -> bool {
    let bytes = path.as_bytes();
    let encoded_separator = memchr::memchr2_iter(b'%', b'\\', bytes).any(|at| {
        bytes[at] == b'\\'
            || matches!(
                bytes.get(at + 1..at + 3),
                Some([b'2', b'f' | b'F'] | [b'5', b'c' | b'C'])
            )
    });
    encoded_separator || path.split('/').any(|seg| dots(seg) > 0)
}

/// 1 for `.`, 2 for `..` (either spelled with `%2e`, in any case), 0 for any other segment.
fn dots(seg: &str) -> u8 {
    let seg = seg.as_bytes();
    if seg.len() > 6 {
        return 0;
    }
    let mut rest = seg;
    let mut n = 0;
    while !rest.is_empty() {
        rest = match rest {
            [b'.', tail @ ..] => tail,
            [b'%', b'2', e, tail @ ..] if e.eq_ignore_ascii_case(&b'e') => tail,
            _ => return 0,
        };
        n += 1;
    }
    if n > 2 { 0 } else { n }
}

#[cfg(test)]
mod tests {
    use super::{remove_dot_segments, splits_when_decoded};

    #[test]
    fn dot_segments_are_removed() {
        for (raw, clean) in [
            ("/threads/abc/x", "/threads/abc/x"),
            ("/threads/a.b/x.y", "/threads/a.b/x.y"),
            ("/threads/.../x", "/threads/.../x"),
            ("/threads/../_pinned/stats", "/_pinned/stats"),
            ("/threads/%2e%2e/_pinned/stats", "/_pinned/stats"),
            ("/threads/.%2E/x", "/x"),
            ("/threads/%2E./x", "/x"),
            ("/a/x/../../b/y", "/b/y"),
            ("/a/./b", "/a/b"),
            ("/a/%2e/b", "/a/b"),
            ("/a/b/.", "/a/b/"),
            ("/a/b/..", "/a/"),
            ("/a/./", "/a/"),
            ("/..", "/"),
            ("/../../x", "/x"),
            ("/.", "/"),
            ("/a//../b", "/a/b"),
            ("/a/%2e%2e%2e/b", "/a/%2e%2e%2e/b"),
            ("/a/%2f../b", "/a/%2f../b"),
        ] {
            assert_eq!(remove_dot_segments(raw), clean, "{raw}");
        }
        assert!(matches!(
            remove_dot_segments("/threads/abc"),
            std::borrow::Cow::Borrowed(_)
        ));
    }

    #[test]
    fn what_splits_when_decoded() {
        for plain in [
            "",
            "/",
            "/x",
            "/x/y.z/...",
            "/a%20b/%41",
            "/.well-known/x",
            "/a%2",
            "/a%",
            "/a%25%32%46",
            "/%2e%2e%2e",
        ] {
            assert!(!splits_when_decoded(plain), "{plain:?}");
        }
        for split in [
            "/..%2F..%2Fadmin%2Fsecret",
            "/a%2fb",
            "/a%5Cb",
            "/a%5cb",
            "/a\\b",
            "/..",
            "/.",
            "/x/%2e%2E/y",
            "/x/.%2e",
            "/x/./",
            "%2F",
        ] {
            assert!(splits_when_decoded(split), "{split:?}");
        }
    }
}
