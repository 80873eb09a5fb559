//! The settings a running node can change (SIGHUP, `pinboard reload`), and how every core sees
//! the newest ones without a lock on the request path.
//!
//! [`Settings`] is one whole generation: the configuration (its restart-only keys pinned to the
//! running values, [`Config::reload`]) and what is built from it: the Passport verifier, the
//! resolve script's constants, the access log's target. [`LiveSettings`] holds the current
//! generation for the node: a reload builds the next one aside (off the signal thread, files
//! read there) and swaps it in whole, so a request sees the old settings or the new, never a
//! mix. A core looks at the generation number (one relaxed load) and takes the lock only when
//! it moved (`node::Core::live`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::RwLock;

use crate::access_log::AccessLogSetup;
use crate::config::{AccessLogFormat, Config};
use crate::http::{Http2, Limits};
use crate::passport::{Passport, Retiring};
use crate::placement;

/// One generation of the settings that may change while the node runs.
pub struct Settings {
    pub config: Config,
    pub passport: Passport,
    /// The resolve script's constant arguments (`balance_factor`, `placement.*`).
    pub resolve: placement::Constants,
    /// The access log's format and target, when it is on.
    pub access_log: Option<Arc<AccessLogSetup>>,
}

impl Settings {
    /// Reads the files `config` names (Ed25519 keys; the access log's target is opened, unless
    /// `previous` already has it open) and builds the generation. The error is one line naming
    /// the key.
    pub fn build(config: Config, previous: Option<&Settings>) -> Result<Settings, String> {
        let p = &config.passport;
        let pems = p
            .ed25519_public_keys
            .iter()
            .map(|path| {
                std::fs::read(&path.key).map(|pem| Retiring {
                    key: pem,
                    not_after: path.not_after,
                })
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("config error: passport.ed25519_public_keys: {e}"))?;
        let secrets: Vec<Retiring<&str>> = (p.hs256_secret.iter().map(|s| s.as_str().into()))
            .chain(p.hs256_secrets.iter().map(|s| Retiring {
                key: s.key.as_str(),
                not_after: s.not_after,
            }))
            .collect();
        let passport = Passport::new(&secrets, &pems, p.issuer.as_deref(), p.audience.as_deref())
            .map_err(|e| format!("config error: passport: {e}"))?;
        let access_log = match previous.and_then(|previous| previous.same_access_log(&config)) {
            Some(kept) => kept,
            None => open_access_log(&config)?,
        };
        Ok(Settings {
            resolve: placement::Constants::new(&config),
            passport,
            access_log,
            config,
        })
    }

    /// The HTTP front end's limits, for a new connection.
    pub fn http_limits(&self) -> Limits {
        let http = &self.config.http;
        Limits {
            header_timeout: Duration::from_millis(http.header_timeout_ms),
            idle_timeout: Duration::from_millis(http.idle_timeout_ms),
            max_header_bytes: http.max_header_bytes,
            write_timeout: Duration::from_millis(http.write_timeout_ms),
            http2: Http2 {
                cleartext: http.h2c,
                max_streams: http.h2_max_streams,
            },
        }
    }

    /// This generation's access log, when `config` asks for the same one (kept open, not
    /// reopened).
    fn same_access_log(&self, config: &Config) -> Option<Option<Arc<AccessLogSetup>>> {
        let running = &self.config;
        (running.access_log == config.access_log
            && running.access_log_path == config.access_log_path)
            .then(|| self.access_log.clone())
    }
}

/// Turns the access log on as the configuration says (`access_log`, `access_log_path`); the
/// error is one line naming the key whose target cannot be opened.
fn open_access_log(config: &Config) -> Result<Option<Arc<AccessLogSetup>>, String> {
    if config.access_log == AccessLogFormat::Off {
        return Ok(None);
    }
    let path = config.access_log_path.as_deref();
    let setup = AccessLogSetup::new(config.access_log, path).map_err(|e| match path {
        Some(p) => format!(
            "config error: access_log_path: cannot open {}: {e}",
            p.display()
        ),
        None => format!("config error: access_log: cannot write to standard output: {e}"),
    })?;
    Ok(Some(Arc::new(setup)))
}

/// The node's current [`Settings`] and their generation number.
pub struct LiveSettings {
    generation: AtomicU64,
    current: RwLock<Arc<Settings>>,
}

impl LiveSettings {
    pub fn new(settings: Settings) -> LiveSettings {
        LiveSettings {
            generation: AtomicU64::new(0),
            current: RwLock::new(Arc::new(settings)),
        }
    }

    /// Bumped by every [`LiveSettings::replace`]; a core compares it with the one it holds.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    pub fn current(&self) -> Arc<Settings> {
        self.current.read().clone()
    }

    /// Makes `settings` the current generation.
    pub fn replace(&self, settings: Settings) {
        *self.current.write() = Arc::new(settings);
        self.generation.fetch_add(1, Ordering::Release);
    }
}
