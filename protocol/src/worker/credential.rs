//! The Passport credential a worker sends the registry as `Authorization: Bearer`: a token
//! given once, or a token file read again before a call whenever it changed, so that a
//! credential rotated on disk (a Kubernetes projected service-account token, a Vault agent's
//! sink, a cron job running `pinboard token`) is picked up without a restart.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

use tracing::{info, warn};

pub enum Credential {
    /// `Bearer {token}`, as given.
    Fixed(String),
    File {
        path: PathBuf,
        /// The file as last read: what identified it, and `Bearer {token}`.
        read: Mutex<(Stamp, String)>,
    },
}

/// What tells one version of the file from the next without reading it: a rename over it
/// (how Kubernetes and most agents swap a token in) changes the inode, a rewrite in place the
/// modification time or the length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp {
    dev: u64,
    ino: u64,
    len: u64,
    modified: Option<SystemTime>,
}

impl Credential {
    /// The credential `token` or `token_file` names: exactly one of them (an empty `token`
    /// counts as unset). The file must hold a token now, so a worker started on a wrong path
    /// fails at once; the error names the setting.
    pub fn new(token: &str, token_file: Option<&Path>) -> Result<Credential, String> {
        match (token.is_empty(), token_file) {
            (false, Some(_)) => Err("token and token_file are mutually exclusive: set one".into()),
            (true, None) => Err("no credential: set token or token_file".into()),
            (false, None) => Ok(Credential::Fixed(bearer(token))),
            (true, Some(path)) => {
                let read = read(path).map_err(|e| format!("token_file {}: {e}", path.display()))?;
                Ok(Credential::File {
                    path: path.to_owned(),
                    read: Mutex::new(read),
                })
            }
        }
    }

    /// The `Authorization` value for the next call. A file that changed is read again; one
    /// that cannot be read (removed mid-rotation, empty while being written) keeps the token
    /// last read, with a warning, and is tried again on the next call.
    pub fn authorization(&self) -> String {
        let (path, read) = match self {
            Credential::Fixed(authorization) => return authorization.clone(),
            Credential::File { path, read } => (path, read),
        };
        let mut last = read.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        match stamp(path) {
            Ok(now) if now == last.0 => {}
            Ok(_) => match self::read(path) {
                Ok(fresh) => {
                    if fresh.1 != last.1 {
                        info!(path = %path.display(), "token file changed; using the new token");
                    }
                    *last = fresh;
                }
                Err(e) => warn!(path = %path.display(), error = %e,
                    "token file unreadable; keeping the last token"),
            },
            Err(e) => warn!(path = %path.display(), error = %e,
                "token file unreadable; keeping the last token"),
        }
        last.1.clone()
    }
}

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

fn stamp(path: &Path) -> std::io::Result<Stamp> {
    let meta = std::fs::metadata(path)?;
    Ok(Stamp {
        dev: meta.dev(),
        ino: meta.ino(),
        len: meta.len(),
        modified: meta.modified().ok(),
    })
}

/// The file's stamp and `Bearer` + its token: the contents without surrounding whitespace (a
/// trailing newline, as `pinboard token > file` writes), which must be one non-empty line.
fn read(path: &Path) -> std::io::Result<(Stamp, String)> {
    // Stamped before reading: a change racing with the read is seen on the next call.
    let stamp = stamp(path)?;
    let text = std::fs::read_to_string(path)?;
    let token = text.trim();
    if token.is_empty() || token.contains(char::is_whitespace) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "does not hold one token (empty, or several words)",
        ));
    }
    Ok((stamp, bearer(token)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_of_token_or_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        std::fs::write(&file, "t-1\n").unwrap();
        let error = |token, file: Option<&Path>| Credential::new(token, file).err().unwrap();
        assert!(error("t", Some(&file)).contains("mutually exclusive"));
        assert!(error("", None).contains("no credential"));
        let missing = dir.path().join("missing");
        assert!(
            error("", Some(&missing)).starts_with(&format!("token_file {}", missing.display()))
        );
        for bad in ["", "\n", "two words\n"] {
            std::fs::write(&file, bad).unwrap();
            assert!(error("", Some(&file)).contains("one token"), "{bad:?}");
        }
        assert_eq!(
            Credential::new("t", None).unwrap().authorization(),
            "Bearer t"
        );
    }

    #[test]
    fn a_changed_file_is_read_again_and_a_bad_one_kept_out() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        std::fs::write(&file, "first\n").unwrap();
        let credential = Credential::new("", Some(&file)).unwrap();
        assert_eq!(credential.authorization(), "Bearer first");
        // Swapped in by a rename, as Kubernetes and agents do.
        let next = dir.path().join("token.next");
        std::fs::write(&next, "second-longer\n").unwrap();
        std::fs::rename(&next, &file).unwrap();
        assert_eq!(credential.authorization(), "Bearer second-longer");
        // Removed, then half-written: the last token stays.
        std::fs::remove_file(&file).unwrap();
        assert_eq!(credential.authorization(), "Bearer second-longer");
        std::fs::write(&file, "").unwrap();
        assert_eq!(credential.authorization(), "Bearer second-longer");
        // Rewritten in place.
        std::fs::write(&file, "third\n").unwrap();
        assert_eq!(credential.authorization(), "Bearer third");
    }
}
