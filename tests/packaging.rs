//! What the packages ship, checked against the real binary and the node's own config loader:
//! the shell completions and man pages generated from the command line, the .deb's settings
//! file, the container file and the Kubernetes manifests (no container runtime or cluster is
//! needed: their shape is read, their settings are loaded by `pinboard check-config`).

use std::path::Path;
use std::process::{Command, Output};

use serde::Deserialize;
use serde_yaml_ng::Value as Yaml;

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

/// One setting of check-config's output, by its dotted name.
fn effective(rendered: &str, key: &str) -> toml::Value {
    let table: toml::Table = rendered.parse().unwrap();
    let mut value = toml::Value::Table(table);
    for part in key.split('.') {
        value = value
            .get(part)
            .unwrap_or_else(|| panic!("{key} not in {rendered}"))
            .clone();
    }
    value
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

/// The Containerfile's instructions, stage by stage: (keyword, arguments), continuation lines
/// joined, comments left out.
fn containerfile_stages() -> Vec<Vec<(String, String)>> {
    let text = repo_file("Containerfile");
    let mut stages: Vec<Vec<(String, String)>> = Vec::new();
    let mut logical = String::new();
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('#') || (line.is_empty() && logical.is_empty()) {
            continue;
        }
        if let Some(head) = line.strip_suffix('\\') {
            logical.push_str(head);
            logical.push(' ');
            continue;
        }
        logical.push_str(line);
        let instruction = std::mem::take(&mut logical);
        let (keyword, args) = instruction.split_once(' ').unwrap_or((&instruction, ""));
        let keyword = keyword.to_ascii_uppercase();
        if keyword == "FROM" {
            stages.push(Vec::new());
        }
        let stage = stages
            .last_mut()
            .expect("an instruction before the first FROM");
        stage.push((
            keyword,
            args.split_whitespace().collect::<Vec<_>>().join(" "),
        ));
    }
    stages
}

/// `KEY=value` pairs of ENV instructions.
fn env_pairs(args: &str) -> Vec<(String, String)> {
    args.split_whitespace()
        .map(|pair| {
            let (k, v) = pair.split_once('=').expect("ENV KEY=value");
            (k.to_owned(), v.to_owned())
        })
        .collect()
}

/// The image's user id, as Kubernetes' runAsNonRoot reads it (numeric).
fn container_uid() -> u32 {
    let stages = containerfile_stages();
    let user = stages
        .last()
        .unwrap()
        .iter()
        .rev()
        .find(|(k, _)| k == "USER")
        .expect("the runtime stage sets USER")
        .1
        .clone();
    let uid = user.split(':').next().unwrap();
    uid.parse()
        .unwrap_or_else(|_| panic!("USER {user}: numeric, for runAsNonRoot"))
}

#[test]
fn the_containerfile_builds_in_stages_and_runs_unprivileged() {
    let stages = containerfile_stages();
    assert_eq!(stages.len(), 2, "a build stage and a runtime stage");
    let (build, runtime) = (&stages[0], &stages[1]);
    let from = |stage: &Vec<(String, String)>| stage[0].1.clone();
    let build_from = from(build);
    let (image, alias) = build_from.split_once(" AS ").expect("FROM image AS name");
    assert!(
        image.contains("/rust:") && image.ends_with("-bookworm"),
        "{image}"
    );
    let runtime_from = from(runtime);
    assert!(
        runtime_from.contains("/debian:") && runtime_from.ends_with("bookworm-slim"),
        "the runtime is the build's Debian release, slim: {runtime_from}"
    );
    assert!(
        build.iter().any(|(k, a)| k == "RUN"
            && a.contains("cargo build --release --locked --bin pinboard")),
        "{build:?}"
    );

    // Runs as a user of its own, set after everything that needs root.
    let uid = container_uid();
    assert_ne!(uid, 0);
    let user_at = runtime.iter().rposition(|(k, _)| k == "USER").unwrap();
    assert!(runtime[user_at..].iter().all(|(k, _)| k != "RUN"));
    assert!(
        runtime
            .iter()
            .all(|(k, a)| k != "USER" || !a.starts_with("root")),
        "{runtime:?}"
    );

    // The binary comes from the build stage to where ENTRYPOINT runs it.
    let args = |keyword: &str| -> Vec<&str> {
        runtime
            .iter()
            .filter(|(k, _)| k == keyword)
            .map(|(_, a)| a.as_str())
            .collect()
    };
    let from_build = format!("--from={alias} ");
    let binary = args("COPY")
        .iter()
        .find_map(|a| a.strip_prefix(&from_build))
        .expect("COPY --from=build")
        .split_whitespace()
        .last()
        .unwrap()
        .to_owned();
    assert_eq!(args("ENTRYPOINT"), [format!("[\"{binary}\"]")]);
    assert_eq!(args("CMD"), ["[\"serve\"]"]);

    // The default settings: a file of the repository, loaded with the image's environment.
    let env: Vec<(String, String)> = args("ENV").iter().flat_map(|a| env_pairs(a)).collect();
    let config_path = &env.iter().find(|(k, _)| k == "PINBOARD_CONFIG").unwrap().1;
    let source = args("COPY")
        .iter()
        .filter(|a| !a.starts_with("--"))
        .find_map(|a| a.strip_suffix(&format!(" {config_path}")))
        .unwrap_or_else(|| panic!("nothing copied to {config_path}"))
        .to_owned();
    let ignored = repo_file(".dockerignore");
    assert!(
        !ignored.lines().any(|l| source.starts_with(l.trim())),
        "{source} is left out of the build context"
    );
    let mut run_env = env.clone();
    run_env.retain(|(k, _)| k != "PINBOARD_CONFIG");
    let secret = "a-packaging-test-secret-of-32-bytes-or-more";
    run_env.push(("PINBOARD_PASSPORT__HS256_SECRET".into(), secret.into()));
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join(source);
    let rendered = check_config_with(Some(&source), &run_env);
    let listen = effective(&rendered, "listen");
    let port = listen.as_str().unwrap().rsplit_once(':').unwrap().1;
    assert!(listen.as_str().unwrap().starts_with("0.0.0.0:"), "{listen}");
    assert_eq!(args("EXPOSE"), [port]);
}

/// Every YAML document under deploy/kubernetes/, with the file it is in.
fn manifests() -> Vec<(String, Yaml)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/kubernetes");
    let mut docs = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_owned();
        assert!(name.ends_with(".yaml"), "{name}: only .yaml files here");
        let text = std::fs::read_to_string(&path).unwrap();
        for doc in serde_yaml_ng::Deserializer::from_str(&text) {
            let value = Yaml::deserialize(doc).unwrap_or_else(|e| panic!("{name}: {e}"));
            docs.push((name.clone(), value));
        }
    }
    docs
}

/// The value at a dotted path (list items by index), which must be there.
fn at<'a>(value: &'a Yaml, path: &str) -> &'a Yaml {
    path.split('.').fold(value, |v, part| {
        let next = match part.parse::<usize>() {
            Ok(i) => v.get(i),
            Err(_) => v.get(part),
        };
        next.unwrap_or_else(|| panic!("no {path} ({part}) in {v:?}"))
    })
}

fn text<'a>(value: &'a Yaml, path: &str) -> &'a str {
    at(value, path)
        .as_str()
        .unwrap_or_else(|| panic!("{path}: not a string"))
}

/// A list of strings.
fn strings<'a>(value: &'a Yaml, path: &str) -> Vec<&'a str> {
    let list = at(value, path).as_sequence();
    let list = list.unwrap_or_else(|| panic!("{path}: not a list"));
    list.iter()
        .map(|item| item.as_str().unwrap_or_else(|| panic!("{path}: {item:?}")))
        .collect()
}

fn number(value: &Yaml, path: &str) -> u64 {
    at(value, path)
        .as_u64()
        .unwrap_or_else(|| panic!("{path}: not a whole number"))
}

#[test]
fn kubernetes_manifests_fit_together() {
    let docs = manifests();
    let one = |kind: &str| -> &Yaml {
        let found: Vec<&Yaml> = docs
            .iter()
            .map(|(_, d)| d)
            .filter(|d| d.get("kind").and_then(Yaml::as_str) == Some(kind))
            .collect();
        assert_eq!(found.len(), 1, "one {kind}");
        found[0]
    };
    // kubectl apply -k takes every manifest.
    let kustomization = one("Kustomization");
    let listed = strings(kustomization, "resources");
    for (file, doc) in &docs {
        if file != "kustomization.yaml" {
            assert!(
                listed.contains(&file.as_str()),
                "{file} not in kustomization"
            );
            text(doc, "apiVersion");
            text(doc, "metadata.name");
        }
    }
    let deployment = one("Deployment");
    let (service, pdb) = (one("Service"), one("PodDisruptionBudget"));
    let (configmap, secret) = (one("ConfigMap"), one("Secret"));
    assert_eq!(text(deployment, "apiVersion"), "apps/v1");
    assert_eq!(text(pdb, "apiVersion"), "policy/v1");

    // The selectors pick the Deployment's pods.
    let pod_labels = at(deployment, "spec.template.metadata.labels")
        .as_mapping()
        .unwrap();
    let picks_pods = |selector: &Yaml| {
        let selector = selector.as_mapping().unwrap();
        assert!(!selector.is_empty());
        for (k, v) in selector {
            assert_eq!(pod_labels.get(k), Some(v), "selector {k:?}");
        }
    };
    picks_pods(at(deployment, "spec.selector.matchLabels"));
    picks_pods(at(pdb, "spec.selector.matchLabels"));
    picks_pods(at(service, "spec.selector"));
    assert_eq!(
        at(pdb, "spec.selector.matchLabels"),
        at(deployment, "spec.selector.matchLabels")
    );

    let pod = at(deployment, "spec.template.spec");
    assert_eq!(at(pod, "containers").as_sequence().unwrap().len(), 1);
    let container = at(pod, "containers.0");
    let image = text(container, "image");
    assert_eq!(text(kustomization, "images.0.name"), image);

    // Probes and the Service reach the container's named port.
    let port_name = text(container, "ports.0.name");
    let container_port = number(container, "ports.0.containerPort");
    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        assert_eq!(text(container, &format!("{probe}.httpGet.path")), path);
        assert_eq!(text(container, &format!("{probe}.httpGet.port")), port_name);
    }
    assert_eq!(text(service, "spec.ports.0.targetPort"), port_name);

    // The environment: plain values, and the Passport key from the Secret by its name and key.
    let mut env: Vec<(String, String)> = Vec::new();
    for var in at(container, "env").as_sequence().unwrap() {
        let name = text(var, "name").to_owned();
        let value = match var.get("value") {
            Some(value) => value.as_str().expect("env values are strings").to_owned(),
            None => {
                assert_eq!(
                    text(var, "valueFrom.secretKeyRef.name"),
                    text(secret, "metadata.name")
                );
                let key = text(var, "valueFrom.secretKeyRef.key");
                text(secret, &format!("stringData.{key}")).to_owned()
            }
        };
        env.push((name, value));
    }
    assert!(
        env.iter()
            .any(|(k, _)| k == "PINBOARD_PASSPORT__HS256_SECRET"),
        "{env:?}"
    );

    // The ConfigMap is mounted where --config points, and the node accepts what it holds.
    let volume = at(pod, "volumes.0");
    assert_eq!(
        text(volume, "configMap.name"),
        text(configmap, "metadata.name")
    );
    let mount = at(container, "volumeMounts.0");
    assert_eq!(text(mount, "name"), text(volume, "name"));
    let args = strings(container, "args");
    let config_path = args[args.iter().position(|a| *a == "--config").unwrap() + 1];
    let (mount_dir, key) = config_path.rsplit_once('/').unwrap();
    assert_eq!(text(mount, "mountPath"), mount_dir);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join(key);
    // A key with a dot (pinboard.toml): looked up whole.
    let data = at(configmap, "data").get(key).and_then(Yaml::as_str);
    std::fs::write(&file, data.expect("the ConfigMap holds the file")).unwrap();
    let rendered = check_config_with(Some(&file), &env);
    let listen = effective(&rendered, "listen");
    assert_eq!(
        listen.as_str().unwrap(),
        format!("0.0.0.0:{container_port}")
    );

    // Stopping: preStop sleeps as long as the node's shutdown delay, and the grace period
    // covers the sleep, the delay and the node's own drain.
    let delay_ms: u64 = env
        .iter()
        .find(|(k, _)| k == "PINBOARD_HTTP__SHUTDOWN_DELAY_MS")
        .expect("PINBOARD_HTTP__SHUTDOWN_DELAY_MS set")
        .1
        .parse()
        .unwrap();
    assert!(delay_ms > 0);
    let pre_stop = strings(container, "lifecycle.preStop.exec.command");
    assert_eq!(pre_stop[..1], ["/bin/sleep"]);
    let sleep_ms = pre_stop[1].parse::<u64>().unwrap() * 1000;
    assert_eq!(sleep_ms, delay_ms, "preStop sleep vs the shutdown delay");
    let grace_ms = effective(&rendered, "http.shutdown_grace_ms")
        .as_integer()
        .unwrap() as u64;
    let termination_ms = number(pod, "terminationGracePeriodSeconds") * 1000;
    assert!(
        termination_ms > sleep_ms + delay_ms + grace_ms,
        "terminationGracePeriodSeconds {termination_ms} ms <= {sleep_ms} + {delay_ms} + {grace_ms}"
    );

    // Unprivileged, read-only, as the image's user.
    assert_eq!(
        at(pod, "securityContext.runAsNonRoot").as_bool(),
        Some(true)
    );
    assert_eq!(
        number(pod, "securityContext.runAsUser"),
        u64::from(container_uid())
    );
    let security = at(container, "securityContext");
    assert_eq!(at(security, "readOnlyRootFilesystem").as_bool(), Some(true));
    assert_eq!(
        at(security, "allowPrivilegeEscalation").as_bool(),
        Some(false)
    );
    assert_eq!(text(security, "capabilities.drop.0"), "ALL");
}
