//! What the packages ship, checked against the real binary and the node's own config loader:
//! the shell completions and man pages generated from the command line, and the .deb's
//! settings file.

use std::path::Path;
use std::process::{Command, Output};

fn pinboard(args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_pinboard"));
    for (key, _) in std::env::vars().filter(|(k, _)| k.starts_with("PINBOARD_")) {
        cmd.env_remove(key);
    }
    cmd.args(args).output().unwrap()
}

fn stdout_of(args: &[&str]) -> String {
    let out = pinboard(args);
    assert!(out.status.success(), "pinboard {args:?}: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// Whether `program` runs here (the shells and groff are optional on a developer's machine).
fn installed(program: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .output()
        .is_ok_and(|out| out.status.success())
}

/// The subcommands `pinboard --help` lists, clap's own `help` left out: what a completion
/// script and the man pages must name, whatever subcommands are added later.
fn subcommands() -> Vec<String> {
    let help = stdout_of(&["--help"]);
    let names: Vec<String> = help
        .lines()
        .skip_while(|l| *l != "Commands:")
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_owned)
        .collect();
    for expected in ["serve", "check-config", "token", "completions", "man"] {
        assert!(names.iter().any(|n| n == expected), "{expected}: {help}");
    }
    names
}

/// Runs `script` in a shell with `args` after it.
fn run_shell(shell: &str, script: &str) -> String {
    let out = Command::new(shell).args(["-c", script]).output().unwrap();
    assert!(
        out.status.success(),
        "{shell}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn completion_scripts_name_every_subcommand() {
    let subcommands = subcommands();
    let dir = tempfile::tempdir().unwrap();
    for shell in ["bash", "zsh", "fish"] {
        let script = stdout_of(&["completions", shell]);
        for name in &subcommands {
            // Each shell's own form of "offer this subcommand".
            let offered = match shell {
                "bash" => format!("pinboard,{name})"),
                "zsh" => format!("'{name}:"),
                _ => format!("-a \"{name}\""),
            };
            assert!(script.contains(&offered), "{shell}: no {offered}");
        }
        let path = dir.path().join(shell);
        std::fs::write(&path, &script).unwrap();
        if installed(shell) {
            // Parsed by the shell itself (fish's -n: "no execute", as bash's and zsh's).
            let out = Command::new(shell).arg("-n").arg(&path).output().unwrap();
            assert!(out.status.success(), "{shell} -n: {out:?}");
        }
    }

    // bash, as on a command line: `pinboard <TAB>`, then `pinboard token --sec<TAB>`.
    let bash = dir.path().join("bash");
    let complete = |words: &str, current: usize| {
        run_shell(
            "bash",
            &format!(
                "source {}; COMP_WORDS=({words}); COMP_CWORD={current}; \
                 _pinboard pinboard \"${{COMP_WORDS[$COMP_CWORD]}}\" \
                 \"${{COMP_WORDS[$COMP_CWORD-1]}}\"; echo \"${{COMPREPLY[*]}}\"",
                bash.display()
            ),
        )
    };
    let offered = complete("pinboard ''", 1);
    for name in &subcommands {
        assert!(offered.split_whitespace().any(|w| w == name), "{offered}");
    }
    assert_eq!(
        complete("pinboard token --secret", 2).trim(),
        "--secret --secret-file"
    );
    let shells = complete("pinboard completions ''", 2);
    for shell in ["bash", "zsh", "fish"] {
        assert!(shells.split_whitespace().any(|w| w == shell), "{shells}");
    }

    if installed("fish") {
        let fish = dir.path().join("fish");
        let offered = run_shell(
            "fish",
            &format!("source {}; complete -C 'pinboard '", fish.display()),
        );
        for name in &subcommands {
            assert!(offered.lines().any(|l| l.starts_with(&format!("{name}\t"))));
        }
    }

    let out = pinboard(&["completions", "tcsh"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid value 'tcsh'"));
}

/// groff's text rendering of a man page, with every warning on: a page that does not render
/// cleanly fails. Words are joined by one space (the rendering justifies lines). Without groff
/// (a minimal machine), the page's roff skeleton is checked and returned.
fn render(page: &Path) -> String {
    let roff = std::fs::read_to_string(page).unwrap();
    assert!(roff.contains(".TH ") && roff.contains(".SH NAME"), "{roff}");
    if !installed("groff") {
        return roff;
    }
    let out = Command::new("groff")
        .args(["-man", "-Tutf8", "-ww", "-rHY=0"])
        .arg(page)
        .env("GROFF_NO_SGR", "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && stderr.is_empty(), "{stderr}");
    // Bold and underline come as overstrikes (`x\bx`, `_\bx`) on a terminal device.
    let text = String::from_utf8(out.stdout).unwrap();
    let mut plain = String::new();
    for c in text.chars() {
        if c == '\u{8}' {
            plain.pop();
        } else {
            plain.push(c);
        }
    }
    plain.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[test]
fn man_pages_render_from_the_command_line() {
    let subcommands = subcommands();
    let dir = tempfile::tempdir().unwrap();
    let single = dir.path().join("stdout.1");
    std::fs::write(&single, stdout_of(&["man"])).unwrap();
    let page = render(&single);
    assert!(page.contains("Edge proxy and control plane"), "{page}");
    for name in &subcommands {
        assert!(
            page.contains(&format!("pinboard-{name}(1)")),
            "{name}: {page}"
        );
    }

    let pages = dir.path().join("pages");
    std::fs::create_dir(&pages).unwrap();
    stdout_of(&["man", "--dir", pages.to_str().unwrap()]);
    assert_eq!(
        std::fs::read_to_string(pages.join("pinboard.1")).unwrap(),
        std::fs::read_to_string(&single).unwrap()
    );
    for name in &subcommands {
        let page = render(&pages.join(format!("pinboard-{name}.1")));
        assert!(page.contains(&format!("pinboard-{name} - ")), "{page}");
    }
    let token = render(&pages.join("pinboard-token.1"));
    assert!(token.contains("--secret-file"), "{token}");

    let out = pinboard(&["man", "--dir", dir.path().join("missing").to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.starts_with("pinboard man: "), "{stderr}");
    assert!(stderr.contains("missing"), "{stderr}");
}

/// A file of the repository.
fn repo_file(path: &str) -> String {
    let full = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{}: {e}", full.display()))
}

/// The settings' names in `src/config/keys.rs`'s `KEYS` table, read from its source: the table
/// is private to the crate, and this file is what a new key is added to.
fn config_keys() -> Vec<String> {
    let source = repo_file("src/config/keys.rs");
    let table = source
        .split_once("pub(super) const KEYS: &[Key] = &[")
        .and_then(|(_, rest)| rest.split_once("\n];"))
        .expect("the KEYS table in src/config/keys.rs")
        .0;
    let keys: Vec<String> = table
        .split("key!(")
        .skip(1)
        .map(|entry| {
            let entry = entry.trim_start();
            let entry = entry.strip_prefix("secret ").unwrap_or(entry);
            entry.split(':').next().unwrap().trim().to_owned()
        })
        .collect();
    assert!(keys.len() > 40, "{keys:?}");
    for key in &keys {
        assert!(
            key.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "_.".contains(c)),
            "not a key name: {key:?}"
        );
    }
    keys
}

/// `pinboard check-config`'s effective configuration from `file` and `env` alone (nothing of
/// this process's environment); it must accept them.
fn check_config_with(file: Option<&Path>, env: &[(String, String)]) -> String {
    let mut args = vec!["check-config".to_owned()];
    if let Some(file) = file {
        args.extend(["--config".to_owned(), file.to_str().unwrap().to_owned()]);
    }
    let out = Command::new(env!("CARGO_BIN_EXE_pinboard"))
        .args(&args)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "check-config {file:?} {env:?}: {stderr}"
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The same, given an HS256 secret by the environment as the package's `pinboard.env` would.
fn check_config(file: Option<&Path>) -> String {
    let secret = "a-packaging-test-secret-of-32-bytes-or-more";
    check_config_with(
        file,
        &[("PINBOARD_PASSPORT__HS256_SECRET".into(), secret.into())],
    )
}

/// The dotted names of every value in a TOML document.
fn dotted_names(table: &toml::Table, prefix: &str, names: &mut Vec<String>) {
    for (name, value) in table {
        match value {
            toml::Value::Table(inner) => dotted_names(inner, &format!("{prefix}{name}."), names),
            _ => names.push(format!("{prefix}{name}")),
        }
    }
}

/// `/etc/pinboard/pinboard.toml` as the .deb ships it: every key of the node, each commented
/// out under a line saying what it means, with its default value (an example for a key unset
/// by default); accepted as shipped, and uncommenting the defaults changes nothing.
#[test]
fn the_packaged_config_lists_every_key_with_its_default() {
    let keys = config_keys();
    let text = repo_file("packaging/pinboard.toml");
    let lines: Vec<&str> = text.lines().collect();
    // `# name = value`, `name` a (dotted) key: a setting line; every other comment is prose.
    let setting = |line: &str| {
        let (name, _) = line.strip_prefix("# ")?.split_once(" = ")?;
        let bare = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || "_.".contains(c);
        let is_key = name.chars().all(bare) || name.starts_with("namespaces.\"");
        is_key.then(|| name.to_owned())
    };
    let mut settings: Vec<(String, &str)> = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let Some(name) = setting(line) else {
            assert!(
                line.is_empty() || line.starts_with("# ") || *line == "#",
                "line {}: only comments ship: {line:?}",
                i + 1
            );
            continue;
        };
        let meaning = i.checked_sub(1).map(|j| lines[j]).unwrap_or_default();
        assert!(
            meaning.starts_with("# ") && setting(meaning).is_none(),
            "{name}: no line above it says what it means"
        );
        assert!(
            keys.contains(&name) || name.starts_with("namespaces."),
            "{name} is no setting of src/config/keys.rs"
        );
        settings.push((name, line.strip_prefix("# ").unwrap()));
    }
    for key in &keys {
        let lines = settings.iter().filter(|(name, _)| name == key).count();
        assert_eq!(
            lines, 1,
            "packaging/pinboard.toml has {lines} lines for {key}"
        );
    }

    let dir = tempfile::tempdir().unwrap();
    let defaults = check_config(None);
    let shipped = dir.path().join("shipped.toml");
    std::fs::write(&shipped, &text).unwrap();
    assert_eq!(check_config(Some(&shipped)), defaults);

    // Every key check-config renders by default, except the two that are not the same on
    // every machine (node_id: the host's name) or given here (the secret, masked).
    let mut rendered = Vec::new();
    dotted_names(&defaults.parse::<toml::Table>().unwrap(), "", &mut rendered);
    rendered.retain(|name| name != "node_id" && name != "passport.hs256_secret");
    let uncommented: Vec<&str> = settings
        .iter()
        .filter(|(name, _)| rendered.contains(name))
        .map(|(_, line)| *line)
        .collect();
    assert_eq!(uncommented.len(), rendered.len(), "{rendered:?}");
    let with_defaults = dir.path().join("defaults.toml");
    std::fs::write(&with_defaults, uncommented.join("\n")).unwrap();
    assert_eq!(
        check_config(Some(&with_defaults)),
        defaults,
        "a default in packaging/pinboard.toml is not the node's:\n{}",
        uncommented.join("\n")
    );
}
