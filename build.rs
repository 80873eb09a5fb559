//! Stamps `pinboard --version` with the git commit and the build profile, so an operator can
//! tell which build a node runs; the commit alone is `PINBOARD_COMMIT`, for
//! `pinboard_build_info`. Outside a git checkout (a source tarball) the commit reads `unknown`.

use std::process::Command;

fn main() {
    let commit = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|out| out.status.success())
        .and_then(|out| String::from_utf8(out.stdout).ok())
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".into());
    let dirty = Command::new("git")
        .args(["status", "--porcelain", "--untracked-files=no"])
        .output()
        .ok()
        .filter(|out| out.status.success())
        .is_some_and(|out| !out.stdout.is_empty());
    let profile = std::env::var("PROFILE").unwrap_or_else(|_| "unknown".into());
    let version = std::env::var("CARGO_PKG_VERSION").unwrap_or_default();
    let suffix = if dirty { "-dirty" } else { "" };
    println!("cargo:rustc-env=PINBOARD_BUILD={version} (commit {commit}{suffix}, {profile} build)");
    println!("cargo:rustc-env=PINBOARD_COMMIT={commit}{suffix}");
    // Rebuilt when HEAD moves (a checkout, a commit on the branch HEAD names). Asked of git,
    // not spelled `.git/HEAD`: in a worktree `.git` is a file, and a path that never exists
    // would rebuild on every build.
    let git_path = |what: &str| {
        Command::new("git")
            .args(["rev-parse", "--path-format=absolute", what])
            .output()
            .ok()
            .filter(|out| out.status.success())
            .and_then(|out| String::from_utf8(out.stdout).ok())
            .map(|s| s.trim().to_owned())
    };
    // Only the branch HEAD names: a commit on another worktree's branch (the same repository)
    // does not rebuild this one. A branch whose ref is packed has no file of its own: then
    // `packed-refs`, where it lives.
    if let (Some(dir), Some(common)) = (git_path("--git-dir"), git_path("--git-common-dir")) {
        println!("cargo:rerun-if-changed={dir}/HEAD");
        let branch = Command::new("git")
            .args(["symbolic-ref", "--quiet", "HEAD"])
            .output()
            .ok()
            .filter(|out| out.status.success())
            .and_then(|out| String::from_utf8(out.stdout).ok())
            .map(|s| s.trim().to_owned());
        // Detached, HEAD itself holds the commit. A path that never exists would rebuild on
        // every build: each is named only when it is there.
        let packed = format!("{common}/packed-refs");
        let watched = branch
            .map(|r| format!("{common}/{r}"))
            .into_iter()
            .chain([packed])
            .find(|file| std::path::Path::new(file).exists());
        if let Some(file) = watched {
            println!("cargo:rerun-if-changed={file}");
        }
    }
    println!("cargo:rerun-if-changed=build.rs");
}
