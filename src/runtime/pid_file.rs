//! `pid_file`: the serving node's process id in a file, for `pinboard reload` and init systems
//! (systemd's `PIDFile=`). Written whole (a temporary file renamed over it, so a reader never
//! sees half a number), replaced by the new process of a binary upgrade, and removed at a clean
//! exit only while it still names this process (after an upgrade it names the new one).

use std::path::Path;

/// Writes this process's id to `path`.
pub fn write(path: &Path) -> std::io::Result<()> {
    let mut temporary = path.as_os_str().to_owned();
    temporary.push(format!(".{}", std::process::id()));
    std::fs::write(&temporary, format!("{}\n", std::process::id()))?;
    std::fs::rename(&temporary, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&temporary);
    })
}

/// The process id `path` holds; the error says why there is none.
pub fn read(path: &Path) -> Result<i32, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read the pid file {}: {e}", path.display()))?;
    text.trim()
        .parse()
        .ok()
        .filter(|pid| *pid > 0)
        .ok_or_else(|| format!("the pid file {} holds no pid: {text:?}", path.display()))
}

/// Removes `path` if it still names this process.
pub(super) fn remove_if_mine(path: &Path) {
    if read(path).is_ok_and(|pid| pid == std::process::id() as i32) {
        let _ = std::fs::remove_file(path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_read_and_removed_only_while_it_names_this_process() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pinboard.pid");
        write(&path).unwrap();
        assert_eq!(read(&path), Ok(std::process::id() as i32));
        remove_if_mine(&path);
        assert!(!path.exists());

        std::fs::write(&path, "1\n").unwrap();
        remove_if_mine(&path);
        assert_eq!(read(&path), Ok(1), "another process's file stays");
        std::fs::write(&path, "garbage").unwrap();
        assert!(read(&path).unwrap_err().contains("holds no pid"));
        let missing = dir.path().join("missing.pid");
        assert!(
            read(&missing)
                .unwrap_err()
                .contains("cannot read the pid file")
        );
    }
}
