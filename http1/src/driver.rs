//! Which I/O driver a monoio event loop runs on, as the node's `driver` setting and a
//! worker's configuration name it.

use std::fmt;
use std::str::FromStr;

/// The event-loop I/O driver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DriverKind {
    /// io_uring, falling back to epoll where the kernel refuses it.
    Auto,
    IoUring,
    Epoll,
}

impl DriverKind {
    const WORDS: [(DriverKind, &'static str); 3] = [
        (DriverKind::Auto, "auto"),
        (DriverKind::IoUring, "io_uring"),
        (DriverKind::Epoll, "epoll"),
    ];
}

impl fmt::Display for DriverKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (_, word) = Self::WORDS
            .iter()
            .find(|(kind, _)| kind == self)
            .expect("every driver has a word");
        f.write_str(word)
    }
}

impl FromStr for DriverKind {
    type Err = String;

    fn from_str(s: &str) -> Result<DriverKind, String> {
        Self::WORDS
            .iter()
            .find(|(_, word)| *word == s)
            .map(|(kind, _)| *kind)
            .ok_or_else(|| format!(r#"expected "auto", "io_uring" or "epoll", got {s:?}"#))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn driver_words_round_trip() {
        for (kind, word) in DriverKind::WORDS {
            assert_eq!(kind.to_string(), word);
            assert_eq!(word.parse::<DriverKind>(), Ok(kind));
        }
    }
}
