//! A Lua script as the client runs it: its source and the SHA1 EVALSHA knows it by (on
//! NOSCRIPT the client loads the source and retries). Which scripts exist is the store's
//! business (`crate::store::scripts`).

pub struct Script {
    /// Its position in the store's list of scripts: what a per-script series is kept under.
    pub index: usize,
    pub name: &'static str,
    pub source: String,
    /// Lowercase hex SHA1 of `source`, the name EVALSHA knows the script by.
    sha: String,
}

impl Script {
    pub fn new(index: usize, name: &'static str, source: String) -> Script {
        Script {
            index,
            name,
            sha: sha1_smol::Sha1::from(&source).digest().to_string(),
            source,
        }
    }

    pub fn sha(&self) -> &str {
        &self.sha
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha_is_hex_sha1_of_source() {
        assert_eq!(
            Script::new(0, "t", "return 1".into()).sha(),
            "e0e1f9fabfc9d4800c877a703b823ac0578ff8db"
        );
    }
}
