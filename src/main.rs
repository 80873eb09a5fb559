//! The `pinboard` binary: `serve`, `reload`, `check-config`, `token` and `ctl` (the operator's
//! client, `pinboard::ctl`), and the shell completions and man page generated from this
//! command line's definition.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use clap::{CommandFactory, Parser, Subcommand};
use mimalloc::MiMalloc;

use pinboard::config::Config;
use pinboard::http::tls::{TlsFailure, tls_failure};
use pinboard::node::{NodeTls, Shared};
use pinboard::passport::{self, TokenRequest};
use pinboard::redis::LoginError;
use pinboard::runtime::{Start, pid_file};
use pinboard::settings::Settings;

#[global_allocator]
static GLOBAL: MiMalloc = MiMalloc;

/// Exit code for a configuration that cannot be used (contract §1).
const EXIT_CONFIG: u8 = 2;

#[derive(Parser)]
#[command(
    name = "pinboard",
    version = env!("PINBOARD_BUILD"),
    about = "Edge proxy and control plane for stateful instances"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a node: listen, route, register workers.
    Serve {
        /// TOML configuration file; PINBOARD_* environment variables override it.
        #[arg(short, long, env = "PINBOARD_CONFIG")]
        config: Option<PathBuf>,
        /// Take the listening sockets over from the node running on `listen` (a binary
        /// upgrade): this process serves on them, then the old node drains and exits.
        #[arg(long)]
        upgrade: bool,
    },
    /// Reload the running node's settings: send it SIGHUP.
    Reload {
        /// TOML configuration file; PINBOARD_* environment variables override it. Its
        /// `pid_file`, else its `listen` address, finds the node.
        #[arg(short, long, env = "PINBOARD_CONFIG")]
        config: Option<PathBuf>,
        /// The node's pid file (instead of the configuration's).
        #[arg(long)]
        pid_file: Option<PathBuf>,
    },
    /// Validate the configuration and print the effective result (secrets masked).
    CheckConfig {
        /// TOML configuration file; PINBOARD_* environment variables override it.
        #[arg(short, long, env = "PINBOARD_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Mint an HS256 Passport credential for development.
    Token(Box<TokenArgs>),
    /// Ask a running node: its workers, placements and health; drain, undrain, wind down.
    Ctl(Box<pinboard::ctl::CtlArgs>),
    /// Print the shell completion script for SHELL on stdout.
    Completions {
        /// The shell: bash, zsh or fish (elvish and powershell too).
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff) on stdout, or write one page per subcommand into a directory.
    Man {
        /// Write pinboard.1 and pinboard-SUBCOMMAND.1 into this directory instead.
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
}

#[derive(clap::Args)]
struct TokenArgs {
    /// The HS256 secret the node is configured with (passport.hs256_secret). On the command
    /// line every user sees it in `ps` and the shell keeps it in its history: prefer
    /// --secret-file or the PINBOARD_TOKEN_SECRET environment variable (exactly one of the three).
    #[arg(long)]
    secret: Option<String>,
    /// A file holding the HS256 secret: its contents, a trailing newline trimmed.
    #[arg(long, value_name = "FILE")]
    secret_file: Option<PathBuf>,
    /// The account (`sub`).
    #[arg(long)]
    sub: String,
    /// A scope; repeat or space-separate for several (pinboard:worker, pinboard:operator, ...).
    #[arg(long = "scope", required = true)]
    scopes: Vec<String>,
    /// A namespace the holder may use (`/name` or `*`); repeatable.
    #[arg(long = "ns", required = true)]
    namespaces: Vec<String>,
    /// A host pattern advertise URLs may name (`name`, `*`, `*.suffix`); repeatable.
    #[arg(long = "backend-host")]
    backend_hosts: Vec<String>,
    /// A port advertise URLs may use; repeatable. None given: every port.
    #[arg(long = "port")]
    ports: Vec<u16>,
    /// A hostname pattern the holder may register; repeatable. None given: unrestricted.
    #[arg(long = "hostname")]
    hostnames: Vec<String>,
    /// An env the holder may register (`*` for any); repeatable. None given: unrestricted.
    #[arg(long = "env")]
    envs: Vec<String>,
    /// Lifetime in seconds.
    #[arg(long, default_value_t = 3600)]
    ttl: u64,
    /// The `iss` claim (must match passport.issuer when the node sets one).
    #[arg(long)]
    issuer: Option<String>,
    /// The `aud` claim (must match passport.audience when the node sets one).
    #[arg(long)]
    audience: Option<String>,
}

/// The scopes the registry knows; any other `pinboard:*` scope is a typo.
const PINBOARD_SCOPES: [&str; 2] = ["pinboard:worker", "pinboard:operator"];

/// `pinboard token`'s secret from the environment: out of `ps` and shell history. Empty is
/// unset, as for the node's settings.
const TOKEN_SECRET_ENV: &str = "PINBOARD_TOKEN_SECRET";

impl TokenArgs {
    /// The HS256 secret from the one place it was given: --secret, --secret-file or
    /// PINBOARD_TOKEN_SECRET. Two places are refused rather than one silently winning.
    fn secret(&self) -> Result<String, String> {
        let from_env = std::env::var_os(TOKEN_SECRET_ENV).filter(|v| !v.is_empty());
        let given: Vec<&str> = [
            (self.secret.is_some(), "--secret"),
            (self.secret_file.is_some(), "--secret-file"),
            (from_env.is_some(), TOKEN_SECRET_ENV),
        ]
        .into_iter()
        .filter_map(|(given, source)| given.then_some(source))
        .collect();
        if given.len() > 1 {
            return Err(format!(
                "the secret was given {} ways ({}): give exactly one",
                given.len(),
                given.join(", ")
            ));
        }
        if let Some(secret) = &self.secret {
            return Ok(secret.clone());
        }
        if let Some(path) = &self.secret_file {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("--secret-file {}: {e}", path.display()))?;
            let secret = text.trim_end_matches(['\n', '\r']);
            if secret.is_empty() {
                return Err(format!(
                    "--secret-file {}: the file is empty",
                    path.display()
                ));
            }
            return Ok(secret.to_owned());
        }
        match from_env {
            Some(value) => value
                .into_string()
                .map_err(|_| format!("{TOKEN_SECRET_ENV} is not UTF-8")),
            None => Err(format!(
                "no secret: give --secret-file FILE, {TOKEN_SECRET_ENV} or --secret"
            )),
        }
    }

    /// Refuses what would mint a credential the node can never accept; warns about one that
    /// can do less than it looks like.
    fn check(&self, scopes: &[String]) -> Result<(), String> {
        if let Some(bad) = scopes
            .iter()
            .find(|s| s.starts_with("pinboard:") && !PINBOARD_SCOPES.contains(&s.as_str()))
        {
            return Err(format!(
                "unknown scope {bad} (the registry's are {})",
                PINBOARD_SCOPES.join(" and ")
            ));
        }
        if let Some(bad) = self
            .namespaces
            .iter()
            .find(|ns| *ns != "*" && !ns.starts_with('/'))
        {
            return Err(format!(
                "namespace {bad:?} must start with / (or be * for every namespace)"
            ));
        }
        if scopes.iter().any(|s| s == "pinboard:worker") && self.backend_hosts.is_empty() {
            eprintln!(
                "pinboard token: warning: a worker credential without --backend-host can \
                 register no advertise URL"
            );
        }
        Ok(())
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve { config, upgrade } => {
            let shared = match load(config.as_deref()) {
                Ok(shared) => shared,
                Err(message) => return config_error(&message),
            };
            let start = match start(&shared, upgrade) {
                Ok(start) => start,
                Err(message) => return config_error(&message),
            };
            match pinboard::runtime::serve(Arc::new(shared), start) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("pinboard: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::CheckConfig { config } => match load(config.as_deref()) {
            Ok(shared) => {
                let config = &shared.config;
                print!("{}", config.render_masked());
                if config.threads == 0 {
                    println!(
                        "# threads = 0: one event loop per available core ({} here)",
                        config.cores()
                    );
                }
                ExitCode::SUCCESS
            }
            Err(message) => config_error(&message),
        },
        Command::Token(args) => token(*args),
        Command::Ctl(args) => ctl(*args),
        Command::Completions { shell } => completions(shell),
        Command::Man { dir } => man(dir.as_deref()),
        Command::Reload { config, pid_file } => reload(config.as_deref(), pid_file),
    }
}

fn completions(shell: clap_complete::Shell) -> ExitCode {
    clap_complete::generate(
        shell,
        &mut Cli::command(),
        "pinboard",
        &mut std::io::stdout(),
    );
    ExitCode::SUCCESS
}

/// The man page on stdout, or one page per subcommand in `dir`.
fn man(dir: Option<&Path>) -> ExitCode {
    // Without clap's `help` subcommand, as generate_to makes the pages: it has no page.
    let cli = Cli::command().disable_help_subcommand(true);
    let written = match dir {
        Some(dir) => {
            clap_mangen::generate_to(cli, dir).map_err(|e| format!("{}: {e}", dir.display()))
        }
        None => clap_mangen::Man::new(cli)
            .render(&mut std::io::stdout())
            .map_err(|e| e.to_string()),
    };
    match written {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pinboard man: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The listening sockets: bound (after the Redis login is checked, so a node whose address is
/// served says so first), and the pid file written; or, with `--upgrade`, taken over from the
/// running node (once this process could serve: the Redis login checked). The error is the
/// one line that stops startup.
fn start(shared: &Shared, upgrade: bool) -> Result<Start, String> {
    let config = &shared.config;
    if upgrade {
        check_redis_login(shared)?;
        return pinboard::runtime::upgrade::take_over(config).map(Start::TakenOver);
    }
    let listeners = pinboard::runtime::bind_listeners(config)?;
    let metrics = pinboard::runtime::bind_metrics(config)?;
    check_redis_login(shared)?;
    if let Some(path) = &config.pid_file {
        pid_file::write(path).map_err(|e| {
            format!(
                "config error: pid_file: cannot write {}: {e}",
                path.display()
            )
        })?;
    }
    Ok(Start::Bound { listeners, metrics })
}

/// `pinboard reload`: SIGHUP to the node the pid file names (`--pid-file`, else the
/// configuration's `pid_file`), else to the one serving the configuration's `listen` (found by
/// its control socket).
fn reload(config: Option<&Path>, pid_file: Option<PathBuf>) -> ExitCode {
    let failed = |message: String| {
        eprintln!("pinboard reload: {message}");
        ExitCode::FAILURE
    };
    let (pid, from) = match pid_file {
        Some(path) => match pid_file::read(&path) {
            Ok(pid) => (pid, format!("pid file {}", path.display())),
            Err(e) => return failed(format!("no node: {e}")),
        },
        None => {
            let config = match read_config(config) {
                Ok(config) => config,
                Err(message) => return config_error(&message),
            };
            let found = match &config.pid_file {
                Some(path) => {
                    pid_file::read(path).map(|pid| (pid, format!("pid file {}", path.display())))
                }
                None => pinboard::runtime::upgrade::node_pid(config.listen)
                    .map(|pid| (pid, format!("the node serving {}", config.listen))),
            };
            match found {
                Ok(found) => found,
                Err(e) => return failed(format!("no node: {e}")),
            }
        }
    };
    let signalled = rustix::process::Pid::from_raw(pid)
        .ok_or(rustix::io::Errno::INVAL)
        .and_then(|p| rustix::process::kill_process(p, rustix::process::Signal::HUP));
    match signalled {
        Ok(()) => {
            println!("pinboard reload: sent SIGHUP to pid {pid} ({from})");
            ExitCode::SUCCESS
        }
        Err(rustix::io::Errno::SRCH) => failed(format!(
            "no node: pid {pid} ({from}) is not running (a stale pid file?)"
        )),
        Err(e) => failed(format!("cannot signal pid {pid} ({from}): {e}")),
    }
}

/// `pinboard ctl`: exit 2 for bad usage or no usable credential (nothing sent), 1 when the
/// node cannot be reached or refuses.
fn ctl(args: pinboard::ctl::CtlArgs) -> ExitCode {
    match pinboard::ctl::run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            eprintln!("pinboard ctl: {failure}");
            match failure {
                pinboard::ctl::Failure::Usage(_) => ExitCode::from(EXIT_CONFIG),
                pinboard::ctl::Failure::Failed(_) => ExitCode::FAILURE,
            }
        }
    }
}

fn token(args: TokenArgs) -> ExitCode {
    let scopes: Vec<String> = args
        .scopes
        .iter()
        .flat_map(|s| s.split_whitespace().map(str::to_owned))
        .collect();
    let secret = match args.check(&scopes).and_then(|()| args.secret()) {
        Ok(secret) => secret,
        Err(e) => {
            eprintln!("pinboard token: {e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let TokenArgs {
        sub,
        namespaces,
        backend_hosts,
        ports,
        hostnames,
        envs,
        ttl,
        issuer,
        audience,
        ..
    } = args;
    let request = TokenRequest {
        sub,
        scopes,
        namespaces,
        backend_hosts,
        ports,
        hostnames,
        envs,
        ttl_secs: ttl,
        issuer,
        audience,
    };
    match passport::mint(&secret, &request) {
        Ok(token) => {
            println!("{token}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("pinboard token: {e}");
            ExitCode::from(EXIT_CONFIG)
        }
    }
}

/// The validated configuration, without logging; with the environment variables it ignored, if
/// any (a warning).
fn read_config(file: Option<&Path>) -> Result<Config, String> {
    read_config_noting(file).map(|(config, _)| config)
}

fn read_config_noting(file: Option<&Path>) -> Result<(Config, Option<String>), String> {
    let text = pinboard::config::read_file(file)?;
    let env = pinboard::config::process_env();
    let ignored = pinboard::config::ignored_env(env.iter().map(|(k, _)| k.as_str()));
    let config = Config::load(file.zip(text.as_deref()), env).map_err(|e| e.to_string())?;
    Ok((config, ignored))
}

/// The validated configuration and the settings built from it, or the one-line reason why not.
fn load(file: Option<&Path>) -> Result<Shared, String> {
    let (config, ignored) = read_config_noting(file)?;
    // Logging starts once its format and the node's name are known; a refused configuration
    // is one plain line.
    pinboard::logs::init(config.log_format, &config.log_level, &config.node_id);
    if let Some(warning) = ignored {
        tracing::warn!("{warning}");
    }
    let tls = NodeTls::load(&config)?;
    let settings = Settings::build(config, None)?;
    Ok(Shared::new(settings, tls, file.map(Path::to_path_buf)))
}

/// Connects and logs in to Redis once before any core starts: credentials or a database that
/// Redis refuses, or TLS that cannot work (a certificate that does not verify, a server that
/// does not speak TLS), are a configuration that cannot be used (exit 2, one line naming
/// `redis_url`, the password masked). A Redis that cannot be reached yet is no such thing: the
/// node starts and waits for it, `/readyz` 503 meanwhile.
fn check_redis_login(shared: &Shared) -> Result<(), String> {
    let target = &shared.config.redis_url;
    pinboard::redis::check_login(target, &shared.redis_options()).map_err(|e| {
        let why = match &e {
            LoginError::Tls(io) => match tls_failure(io) {
                Some(TlsFailure::Certificate) => {
                    format!("{e} (trusted: the system roots and redis_ca_file)")
                }
                Some(TlsFailure::NotTls) => format!("{e} (does it speak TLS on that port?)"),
                _ => e.to_string(),
            },
            LoginError::NoTlsConfiguration => e.to_string(),
            _ => format!("Redis refused the login: {e}"),
        };
        format!("config error: redis_url: {}: {why}", target.masked())
    })
}

fn config_error(message: &str) -> ExitCode {
    eprintln!("{message}");
    ExitCode::from(EXIT_CONFIG)
}
