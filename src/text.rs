//! Short strings kept inline: what the request path holds of a key name, an affinity key or a
//! reply's session and epoch lives on the stack (up to `N` bytes, as any sane name is) and
//! costs no heap allocation per request. Longer text spills to the heap and still works.

use std::fmt;
use std::ops::Deref;

use smallvec::SmallVec;

/// A UTF-8 string of up to `N` bytes inline. Built only from whole `&str`s, so it is always
/// valid UTF-8.
#[derive(Clone, PartialEq, Eq)]
pub struct InlineStr<const N: usize>(SmallVec<[u8; N]>);

impl<const N: usize> InlineStr<N> {
    /// The parts one after the other.
    pub fn concat(parts: &[&str]) -> Self {
        let mut text = SmallVec::with_capacity(parts.iter().map(|p| p.len()).sum());
        for part in parts {
            text.extend_from_slice(part.as_bytes());
        }
        InlineStr(text)
    }

    pub fn as_str(&self) -> &str {
        self
    }

    pub fn push_str(&mut self, text: &str) {
        self.0.extend_from_slice(text.as_bytes());
    }

    /// The low `digits` hex digits of `n`, lowercase and zero-padded (at most 32).
    pub fn push_hex(&mut self, n: u128, digits: usize) {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut text = [0u8; 32];
        for (i, digit) in text.iter_mut().enumerate() {
            *digit = HEX[((n >> ((31 - i) * 4)) & 0xf) as usize];
        }
        self.0.extend_from_slice(&text[32 - digits.min(32)..]);
    }
}

impl<const N: usize> Default for InlineStr<N> {
    fn default() -> Self {
        InlineStr(SmallVec::new())
    }
}

impl<const N: usize> From<&str> for InlineStr<N> {
    fn from(text: &str) -> Self {
        InlineStr(SmallVec::from_slice(text.as_bytes()))
    }
}

impl<const N: usize> Deref for InlineStr<N> {
    type Target = str;

    fn deref(&self) -> &str {
        // SAFETY: every constructor and `write_str` append whole `&str`s only.
        unsafe { std::str::from_utf8_unchecked(&self.0) }
    }
}

impl<const N: usize> fmt::Write for InlineStr<N> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.push_str(s);
        Ok(())
    }
}

impl<const N: usize> fmt::Display for InlineStr<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self)
    }
}

impl<const N: usize> fmt::Debug for InlineStr<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}

impl<const N: usize> PartialEq<&str> for InlineStr<N> {
    fn eq(&self, other: &&str) -> bool {
        &**self == *other
    }
}

#[cfg(test)]
mod tests {
    use std::fmt::Write;

    use super::InlineStr;

    #[test]
    fn short_text_stays_inline_and_long_text_spills() {
        let short = InlineStr::<8>::concat(&["ab", "", "cd"]);
        assert_eq!((short.as_str(), short.0.spilled()), ("abcd", false));
        let mut long = InlineStr::<4>::from("naïve");
        write!(long, "-{}", 42).unwrap();
        assert_eq!((long.as_str(), long.0.spilled()), ("naïve-42", true));
        assert_eq!(format!("{long} {long:?}"), "naïve-42 \"naïve-42\"");
    }
}
