//! Stamps `pinboard --version` with the git commit and the build profile, so an operator can
//! tell which build a node runs. Outside a git checkout (a source tarball) the commit reads
//! `unknown`.

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
    // Rebuilt when HEAD moves (a checkout, a commit on the branch HEAD names).
    println!("cargo:rerun-if-changed=.git/HEAD");
    println!("cargo:rerun-if-changed=.git/refs/heads");
    println!("cargo:rerun-if-changed=build.rs");
}
