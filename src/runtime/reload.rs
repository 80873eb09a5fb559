//! SIGHUP's reload (`pinboard reload` sends one): the configuration file and the environment
//! read again into the next generation of [`Settings`], and the listener's certificate pair,
//! all swapped in at once or none of it; off the signal thread.
//!
//! Reading files can block (a file on a hung mount; a FIFO is refused as not a regular file,
//! see `pinboard_http::tls::open_regular_file`), and the signal thread must stay free for the
//! SIGTERM that follows. So the signal thread only asks ([`Reloads::ask`], which never
//! blocks); the reload thread reloads one at a time, a SIGHUP that comes while one runs is
//! coalesced into one more after it, and each reload's reads get [`RELOAD_TIMEOUT`]: past it
//! the running settings stay, and while that read is still stuck no other starts.

use std::sync::Arc;
use std::sync::mpsc::{self, RecvTimeoutError, SyncSender, TrySendError};
use std::thread::JoinHandle;
use std::time::Duration;

use tracing::{error, info, warn};

use crate::config::{Config, process_env, read_file};
use crate::error::{Error, Origin};
use crate::http::tls::LoadedPair;
use crate::node::Shared;
use crate::settings::Settings;

/// The longest a reload may take to read its files.
pub const RELOAD_TIMEOUT: Duration = Duration::from_secs(5);

/// The way to the reload thread.
pub struct Reloads {
    asked: SyncSender<()>,
}

impl Reloads {
    /// Starts the reload thread.
    pub fn start(shared: Arc<Shared>) -> Result<Reloads, Error> {
        // One reload may wait while another runs: later SIGHUPs join it.
        let (asked, asks) = mpsc::sync_channel::<()>(1);
        std::thread::Builder::new()
            .name("pinboard-reload".into())
            .spawn(move || {
                let mut reader = Reader::default();
                for () in asks {
                    reload(&shared, &mut reader);
                }
            })
            .map_err(|e| Error::because(Origin::Internal, "starting the reload thread", e))?;
        Ok(Reloads { asked })
    }

    /// Asks for a reload; never blocks.
    pub fn ask(&self) {
        match self.asked.try_send(()) {
            Ok(()) => {}
            Err(TrySendError::Full(())) => {
                info!("SIGHUP: a reload is already waiting to run; this one is part of it");
            }
            Err(TrySendError::Disconnected(())) => {
                error!("SIGHUP: the reload thread is gone; nothing reloaded");
            }
        }
    }
}

/// What a reload read, ready to be swapped in.
struct Next {
    settings: Settings,
    /// The live keys whose value changed.
    changed: Vec<&'static str>,
    /// The restart-only keys the file asks to change, kept at their running values.
    kept: Vec<&'static str>,
    pair: Option<LoadedPair>,
}

/// Why a reload changed nothing.
enum Refused {
    Config(String),
    Pair(String),
}

fn reload(shared: &Arc<Shared>, reader: &mut Reader) {
    let reading = shared.clone();
    match reader.within(RELOAD_TIMEOUT, move || read_next(&reading)) {
        Read::Done(Ok(next)) => apply(shared, next),
        Read::Done(Err(Refused::Config(why))) => {
            warn!(reason = %why, "SIGHUP: the configuration was refused; the running one stays")
        }
        Read::Done(Err(Refused::Pair(why))) => warn!(
            reason = %why,
            "SIGHUP: the certificate pair did not load; the one in use and the running \
             configuration stay"
        ),
        Read::TimedOut => error!(
            timeout_ms = RELOAD_TIMEOUT.as_millis() as u64,
            "SIGHUP: reading the configuration and certificate pair did not finish in time; \
             the running ones stay"
        ),
        Read::StillStuck => {
            error!("SIGHUP: an earlier reload is still stuck reading its files; ignored")
        }
        Read::Failed(why) => error!(reason = %why, "SIGHUP: the reload did not run"),
    }
}

/// Reads the configuration file, the environment, the files they name and the listener's
/// certificate pair, into the next settings (nothing applied yet).
fn read_next(shared: &Shared) -> Result<Next, Refused> {
    let running = shared.settings();
    let file = shared.config_file.as_deref();
    let text = read_file(file).map_err(Refused::Config)?;
    let (config, kept) = Config::reload(file.zip(text.as_deref()), process_env(), &running.config)
        .map_err(|e| Refused::Config(e.to_string()))?;
    let changed = config.differences(&running.config);
    let settings = Settings::build(config, Some(&running)).map_err(Refused::Config)?;
    let pair = (shared.tls.listener.as_ref())
        .map(|tls| tls.read_again().map_err(|e| Refused::Pair(e.to_string())))
        .transpose()?;
    Ok(Next {
        settings,
        changed,
        kept,
        pair,
    })
}

fn apply(shared: &Shared, next: Next) {
    let Next {
        settings,
        changed,
        kept,
        pair,
    } = next;
    if changed.contains(&"log_level")
        && let Err(why) = crate::logs::set_level(&settings.config.log_level)
    {
        warn!(reason = %why, "SIGHUP: log_level not applied");
    }
    shared.replace_settings(settings);
    if let (Some(tls), Some(pair)) = (&shared.tls.listener, pair) {
        tls.present(pair);
        info!("SIGHUP: reloaded tls.cert_file and tls.key_file");
    }
    if !kept.is_empty() {
        warn!(
            keys = %kept.join(", "),
            "SIGHUP: these settings change only at a restart; they keep their running values"
        );
    }
    info!(
        changed = %changed.join(", "),
        "SIGHUP: reloaded the configuration"
    );
}

/// What came of a read bounded in time.
#[derive(Debug)]
enum Read<T> {
    Done(T),
    TimedOut,
    /// The read before this one has not returned yet: none was started.
    StillStuck,
    Failed(String),
}

/// Runs reads on a thread of their own, so that a stuck one costs its thread only, and at
/// most one such thread at a time.
#[derive(Default)]
struct Reader {
    last: Option<JoinHandle<()>>,
}

impl Reader {
    fn within<T: Send + 'static>(
        &mut self,
        limit: Duration,
        read: impl FnOnce() -> T + Send + 'static,
    ) -> Read<T> {
        if self.last.as_ref().is_some_and(|last| !last.is_finished()) {
            return Read::StillStuck;
        }
        let (done, result) = mpsc::channel();
        let spawned = std::thread::Builder::new()
            .name("pinboard-reload-read".into())
            .spawn(move || {
                // The reload thread may have stopped waiting: then the result is dropped.
                let _ = done.send(read());
            });
        let handle = match spawned {
            Ok(handle) => handle,
            Err(e) => return Read::Failed(e.to_string()),
        };
        let read = match result.recv_timeout(limit) {
            Ok(value) => Read::Done(value),
            Err(RecvTimeoutError::Timeout) => {
                // Kept: no other read starts until this one returns.
                self.last = Some(handle);
                return Read::TimedOut;
            }
            Err(RecvTimeoutError::Disconnected) => Read::Failed("the read panicked".into()),
        };
        // It has answered (or panicked): only its return is left to wait for.
        let _ = handle.join();
        read
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_is_bounded_and_a_stuck_one_blocks_the_next_until_it_returns() {
        let mut reader = Reader::default();
        assert!(matches!(
            reader.within(Duration::from_secs(5), || 7),
            Read::Done(7)
        ));
        let (release, stuck) = mpsc::channel::<()>();
        let started = std::time::Instant::now();
        let read = reader.within(Duration::from_millis(100), move || stuck.recv().is_ok());
        assert!(matches!(read, Read::TimedOut), "{read:?}");
        assert!(started.elapsed() < Duration::from_secs(2));
        // While the first is stuck, no second read starts.
        assert!(matches!(
            reader.within(Duration::from_secs(5), || true),
            Read::StillStuck
        ));
        release.send(()).unwrap();
        let reopened = (0..100).any(|_| {
            std::thread::sleep(Duration::from_millis(10));
            matches!(
                reader.within(Duration::from_secs(5), || true),
                Read::Done(true)
            )
        });
        assert!(reopened, "a read ran again once the stuck one returned");
        let panicked = reader.within(Duration::from_secs(5), || -> u8 { panic!("boom") });
        assert!(matches!(panicked, Read::Failed(_)), "{panicked:?}");
    }
}
