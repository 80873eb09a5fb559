//! Durability (contract §7): where a durable instance's state and its wish to be woken live
//! while no worker holds it — the [`DurabilityStore`] trait and [`FileStore`], one directory
//! with a file per instance, each fenced by the placement epoch that last wrote it — and what
//! `_wake` needs to know of wakes under way ([`Wakes`]).
//!
//! The store is the worker's own memory; the wake itself is the node's: the worker asks for it
//! with `POST /registry/schedule` ([`Handle::schedule_wake`](crate::Handle::schedule_wake)),
//! and the node's durability sweep sends `POST {ns}/{id}/_wake` once it is due.

use std::collections::HashMap;
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use pinboard_protocol::worker::fencing::{Fence, FencedError, StaleEpoch};
use rustix::fs::{FlockOperation, flock};
use sha2::{Digest, Sha256};

use crate::Epoch;

/// What a fenced call of a [`DurabilityStore`] returns: refused as stale, or the store's I/O
/// error.
type Fenced<T> = Result<T, FencedError<io::Error>>;

/// Where durable instances keep their state and the wake they asked for, keyed by `(ns, id)`
/// (`ns` with its leading `/`). Every method is synchronous and may block on the disk: call
/// it from a request or hook (a small file costs little) or move it to a thread of your own.
///
/// `ns` and `id` come from request paths and are untrusted: an implementation must keep any
/// value, however hostile, from naming anything but its own entry.
///
/// The application decides when to save: [`Handle::store`](crate::Handle::store) hands it the
/// store in a request or in [`App::on_wake`](crate::App::on_wake), which gets what was saved.
///
/// **Fencing.** A store keeps, per `(ns, id)`, the highest placement epoch that wrote it (a
/// [`Fence`]; none yet is epoch 0). [`save_fenced`](Self::save_fenced) and
/// [`claim`](Self::claim) pass the writer's epoch ([`Fence::from`] the request's
/// [`Instance`](crate::Instance)) and are refused with [`StaleEpoch`] when the store holds a
/// higher one, changing nothing: a worker paused past its lease that resumes and saves after
/// the instance moved on cannot overwrite the new owner's state. The worker claims at its
/// epoch before `on_wake` hydrates; an application that hydrates on `instance.activated`
/// should [`claim`](Self::claim) too. `save`, `schedule`, `cancel` and `remove` write without
/// a fence (keeping the stored epoch): kept for callers from before fencing.
///
/// ```no_run
/// use std::sync::Arc;
/// use std::time::{Duration, SystemTime};
///
/// use pinned::{
///     App, Config, Error, Fence, FileStore, Handle, Instance, Origin, Request, Response, Worker,
/// };
///
/// /// `POST /reminders/{id}` starts a reminder that fires every minute, worker or no worker.
/// struct Reminders;
///
/// impl Reminders {
///     /// Saves how often it fired, and asks to be woken in a minute.
///     async fn save_and_schedule(&self, worker: &Handle, instance: &Instance, fired: u64)
///         -> Result<(), Error>
///     {
///         let (ns, id) = (&instance.ns, &instance.id);
///         let store = worker.store().expect("started with a store");
///         // Fenced: refused (`FencedError::Stale`) once the reminder has moved to another
///         // worker at a later epoch, so a paused former owner cannot overwrite its count.
///         store.save_fenced(ns, id, &Fence::from(instance), fired.to_string().as_bytes())
///             .map_err(|e| Error::because(Origin::Host, "saving a reminder", e))?;
///         let next = SystemTime::now() + Duration::from_secs(60);
///         worker.schedule_wake(ns, id, next).await
///             .map_err(|e| Error::because(Origin::Upstream, "scheduling a reminder", e))?;
///         Ok(())
///     }
/// }
///
/// impl App for Reminders {
///     async fn handle(&self, worker: &Handle, instance: &Instance, _: &mut Request<'_>)
///         -> Result<Response, Error>
///     {
///         self.save_and_schedule(worker, instance, 0).await?;
///         Ok(Response::text(http::StatusCode::ACCEPTED, "reminding\n"))
///     }
///
///     /// A minute passed: on this worker or, if the last one died, on the one the node's
///     /// sweep placed the reminder on, with what was saved.
///     async fn on_wake(&self, worker: &Handle, instance: &Instance, state: Option<Vec<u8>>)
///         -> Result<(), Error>
///     {
///         let Some(fired) = state.and_then(|s| String::from_utf8(s).ok()?.parse::<u64>().ok())
///         else {
///             return Ok(()); // never started, or forgotten meanwhile
///         };
///         println!("{}/{}: reminder {}", instance.ns, instance.id, fired + 1);
///         self.save_and_schedule(worker, instance, fired + 1).await
///     }
/// }
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let mut config = Config::new("http://127.0.0.1:8080", "TOKEN", "reminders-1", &["/reminders"]);
/// config.durability = Some(Arc::new(FileStore::open("/var/lib/reminders")?));
/// let worker = Worker::start(config, Reminders)?;
/// # Ok(()) }
/// ```
pub trait DurabilityStore: Send + Sync + 'static {
    /// The state last saved for `(ns, id)`; `None` when there is none.
    fn load(&self, ns: &str, id: &str) -> io::Result<Option<Vec<u8>>>;
    /// Replaces the state of `(ns, id)`, durably: it survives a crash once this returns. Not
    /// fenced: prefer [`save_fenced`](Self::save_fenced).
    fn save(&self, ns: &str, id: &str, state: &[u8]) -> io::Result<()>;
    /// As [`save`](Self::save), by the owner at `fence`: refused with
    /// [`FencedError::Stale`], changing nothing, when a higher epoch is stored; otherwise
    /// `fence` is stored with the state. An equal epoch writes (the same owner saving again).
    fn save_fenced(&self, ns: &str, id: &str, fence: &Fence, state: &[u8]) -> Fenced<()>;
    /// The state of `(ns, id)` as its owner at `fence` hydrates it: `fence` is stored first
    /// (from then on a save from a lower epoch is refused, whether or not this owner ever
    /// saves); refused with [`FencedError::Stale`] when a higher epoch is stored.
    fn claim(&self, ns: &str, id: &str, fence: &Fence) -> Fenced<Option<Vec<u8>>>;
    /// Records that `(ns, id)` asked to be woken at `wake_at_ms` (ms since the Unix epoch).
    fn schedule(&self, ns: &str, id: &str, wake_at_ms: u64) -> io::Result<()>;
    /// Forgets the wake `(ns, id)` asked for, if any.
    fn cancel(&self, ns: &str, id: &str) -> io::Result<()>;
    /// The wake `(ns, id)` asked for and did not cancel.
    fn scheduled(&self, ns: &str, id: &str) -> io::Result<Option<u64>>;
    /// Forgets `(ns, id)`'s state and wake (its fence stays, so that a former owner cannot
    /// save it back).
    fn remove(&self, ns: &str, id: &str) -> io::Result<()>;
}

impl fmt::Debug for dyn DurabilityStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("DurabilityStore")
    }
}

/// Names longer than this are replaced by a hash: a file name has at most 255 bytes.
const MAX_NAME: usize = 200;
/// The first token of every file.
const MAGIC: &str = "pinned-durable/1";

/// A [`DurabilityStore`] in one directory, one file per `(ns, id)`.
///
/// - A file's name is `ns` and `id` escaped: bytes outside `[A-Za-z0-9_-]` become `%XX`, the two
///   parts joined by `.` (never part of an escaped name), so no value can name `.`, `..`, a
///   subdirectory or another instance's file. A name over 200 bytes is `#` + the SHA-256 of
///   both instead, and the file's header names its instance, checked on every read.
/// - A file is one header line (`pinned-durable/1 {name} {wake ms or -} {state length or -}`,
///   then ` {epoch}` once a fenced write stored one) followed by the state's bytes. A file
///   without an epoch (written before fencing, or never fenced) is at epoch 0.
/// - Every change writes a temporary file (`.tmp-…`, fsynced), renames it over the old one and
///   fsyncs the directory: a crash leaves the old file or the new one, never a torn one.
/// - Every change reads, checks and writes under an exclusive `flock` on the directory itself,
///   so that workers in other processes on the host (the Python library's `FileStore` takes
///   the same lock) never interleave a check and a write: of two fenced writers, the higher
///   epoch's state stands. Reads take no lock (a rename is atomic). One lock for the directory:
///   changes to one store are made one at a time.
pub struct FileStore {
    dir: PathBuf,
}

/// What one file holds.
#[derive(Clone, Default, PartialEq)]
struct Entry {
    wake_at: Option<u64>,
    state: Option<Vec<u8>>,
    /// The highest epoch that wrote it.
    epoch: Fence,
}

impl Entry {
    fn is_empty(&self) -> bool {
        self.wake_at.is_none() && self.state.is_none() && self.epoch == Fence::zero()
    }
}

impl FileStore {
    /// A store in `dir`, created (with its parents) when missing.
    pub fn open(dir: impl Into<PathBuf>) -> io::Result<FileStore> {
        let dir = dir.into();
        fs::create_dir_all(&dir)?;
        Ok(FileStore { dir })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The path of `(ns, id)`'s file, always directly inside the directory.
    pub fn path_of(&self, ns: &str, id: &str) -> PathBuf {
        self.dir.join(file_name(ns, id))
    }

    fn read(&self, ns: &str, id: &str) -> io::Result<Entry> {
        let bytes = match fs::read(self.path_of(ns, id)) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Entry::default()),
            Err(e) => return Err(e),
        };
        parse(&bytes, &key(ns, id)).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{}: not a durable state file of {ns}/{id}",
                    self.path_of(ns, id).display()
                ),
            )
        })
    }

    /// Changes `(ns, id)`'s entry under the directory's lock, writing it back atomically (or
    /// removing the file once it holds nothing) unless nothing changed. With a `fence`, first
    /// refused as stale when the entry holds a higher epoch, else raised to it.
    fn update(
        &self,
        ns: &str,
        id: &str,
        fence: Option<&Fence>,
        change: impl FnOnce(&mut Entry),
    ) -> io::Result<Result<(), StaleEpoch>> {
        let _locked = self.lock()?;
        let old = self.read(ns, id)?;
        let mut entry = old.clone();
        if let Some(offered) = fence {
            if *offered < entry.epoch {
                let (stored, offered) = (entry.epoch, offered.clone());
                return Ok(Err(StaleEpoch { stored, offered }));
            }
            entry.epoch = offered.clone();
        }
        change(&mut entry);
        if entry != old {
            self.write(ns, id, &entry)?;
        }
        Ok(Ok(()))
    }

    /// The directory's exclusive `flock`, held until the returned file is dropped.
    fn lock(&self) -> io::Result<File> {
        let dir = File::open(&self.dir)?;
        flock(&dir, FlockOperation::LockExclusive)?;
        Ok(dir)
    }

    /// Puts `entry` in place of `(ns, id)`'s file: renamed over it, or the file removed once
    /// the entry holds nothing.
    fn write(&self, ns: &str, id: &str, entry: &Entry) -> io::Result<()> {
        let path = self.path_of(ns, id);
        if entry.is_empty() {
            return match fs::remove_file(&path) {
                Ok(()) => self.sync_dir(),
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(e),
            };
        }
        let tmp = self
            .dir
            .join(format!(".tmp-{:016x}", rand::random::<u64>()));
        let written =
            write_synced(&tmp, &render(&key(ns, id), entry)).and_then(|()| fs::rename(&tmp, &path));
        if written.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        written?;
        self.sync_dir()
    }

    /// An unfenced change: one that no epoch can refuse.
    fn change(&self, ns: &str, id: &str, change: impl FnOnce(&mut Entry)) -> io::Result<()> {
        self.update(ns, id, None, change)?.map_err(io::Error::other)
    }

    /// Makes a rename or removal in the directory durable.
    fn sync_dir(&self) -> io::Result<()> {
        File::open(&self.dir)?.sync_all()
    }
}

impl fmt::Debug for FileStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FileStore").field("dir", &self.dir).finish()
    }
}

impl DurabilityStore for FileStore {
    fn load(&self, ns: &str, id: &str) -> io::Result<Option<Vec<u8>>> {
        Ok(self.read(ns, id)?.state)
    }

    fn save(&self, ns: &str, id: &str, state: &[u8]) -> io::Result<()> {
        self.change(ns, id, |entry| entry.state = Some(state.to_vec()))
    }

    fn save_fenced(&self, ns: &str, id: &str, fence: &Fence, state: &[u8]) -> Fenced<()> {
        let set = |entry: &mut Entry| entry.state = Some(state.to_vec());
        self.update(ns, id, Some(fence), set)
            .map_err(FencedError::Store)??;
        Ok(())
    }

    fn claim(&self, ns: &str, id: &str, fence: &Fence) -> Fenced<Option<Vec<u8>>> {
        let mut state = None;
        let take = |entry: &mut Entry| state = entry.state.clone();
        self.update(ns, id, Some(fence), take)
            .map_err(FencedError::Store)??;
        Ok(state)
    }

    fn schedule(&self, ns: &str, id: &str, wake_at_ms: u64) -> io::Result<()> {
        self.change(ns, id, |entry| entry.wake_at = Some(wake_at_ms))
    }

    fn cancel(&self, ns: &str, id: &str) -> io::Result<()> {
        self.change(ns, id, |entry| entry.wake_at = None)
    }

    fn scheduled(&self, ns: &str, id: &str) -> io::Result<Option<u64>> {
        Ok(self.read(ns, id)?.wake_at)
    }

    fn remove(&self, ns: &str, id: &str) -> io::Result<()> {
        self.change(ns, id, |entry| {
            (entry.wake_at, entry.state) = (None, None);
        })
    }
}

fn write_synced(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut file = OpenOptions::new().write(true).create_new(true).open(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}

/// `ns` and `id` escaped and joined: the instance's key, and its file name when short enough.
fn key(ns: &str, id: &str) -> String {
    format!("{}.{}", escape(ns), escape(id))
}

fn file_name(ns: &str, id: &str) -> String {
    let key = key(ns, id);
    if key.len() <= MAX_NAME {
        return key;
    }
    let digest = Sha256::digest(key.as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("#{hex}")
}

/// Bytes outside `[A-Za-z0-9_-]` as `%XX`.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || byte == b'_' || byte == b'-' {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

fn render(key: &str, entry: &Entry) -> Vec<u8> {
    let dash = || "-".to_owned();
    let wake = entry.wake_at.map_or_else(dash, |at| at.to_string());
    let length = entry
        .state
        .as_ref()
        .map_or_else(dash, |s| s.len().to_string());
    let mut header = format!("{MAGIC} {key} {wake} {length}");
    if entry.epoch != Fence::zero() {
        header = format!("{header} {}", entry.epoch);
    }
    let mut bytes = format!("{header}\n").into_bytes();
    bytes.extend_from_slice(entry.state.as_deref().unwrap_or_default());
    bytes
}

/// A file's entry, when it is a whole one and `key`'s.
fn parse(bytes: &[u8], key: &str) -> Option<Entry> {
    let newline = bytes.iter().position(|&b| b == b'\n')?;
    let header = std::str::from_utf8(&bytes[..newline]).ok()?;
    let body = &bytes[newline + 1..];
    let fields: Vec<&str> = header.split(' ').collect();
    let (stored_key, wake, length, epoch) = match fields[..] {
        [MAGIC, stored_key, wake, length] => (stored_key, wake, length, Fence::zero()),
        [MAGIC, stored_key, wake, length, epoch] => {
            (stored_key, wake, length, Fence::parse(epoch)?)
        }
        _ => return None,
    };
    if stored_key != key {
        return None;
    }
    let number = |field: &str| match field {
        "-" => Some(None),
        digits => digits.parse().ok().map(Some),
    };
    let wake_at = number(wake)?;
    let state = match number(length)? {
        None if body.is_empty() => None,
        Some(length) if length == body.len() as u64 => Some(body.to_vec()),
        _ => return None,
    };
    Some(Entry {
        wake_at,
        state,
        epoch,
    })
}

/// A finished wake is reported to the next `_wake` for this long, no longer.
const DONE_KEPT: Duration = Duration::from_secs(60);

/// The wakes under way or just finished, so that the sweep's next `_wake` after a 202 learns
/// the outcome instead of starting another: one hook at a time per instance.
#[derive(Default)]
pub(crate) struct Wakes {
    runs: Mutex<HashMap<(String, String), Run>>,
}

struct Run {
    epoch: Epoch,
    /// When the hook finished; `None` while it runs.
    done: Option<Instant>,
}

/// What a `_wake` finds.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Begin {
    /// Nothing under way: this request runs the hook.
    Start,
    /// A hook runs (perhaps for an earlier epoch): 202.
    Running,
    /// The hook of a wake at this epoch finished since the last `_wake` asked: 200.
    Done,
}

impl Wakes {
    fn runs(&self) -> MutexGuard<'_, HashMap<(String, String), Run>> {
        self.runs
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn begin(&self, ns: &str, id: &str, epoch: &Epoch, now: Instant) -> Begin {
        let mut runs = self.runs();
        let key = (ns.to_owned(), id.to_owned());
        match runs.get(&key) {
            Some(run) if run.done.is_none() => return Begin::Running,
            Some(run)
                if run.epoch == *epoch
                    && run
                        .done
                        .is_some_and(|at| now.duration_since(at) < DONE_KEPT) =>
            {
                runs.remove(&key);
                return Begin::Done;
            }
            _ => {}
        }
        let epoch = epoch.clone();
        runs.insert(key, Run { epoch, done: None });
        Begin::Start
    }

    /// The hook of the wake `begin` started has returned: a success is kept for the next
    /// `_wake` to collect, a failure forgotten (the next `_wake` tries again).
    pub fn finish(&self, ns: &str, id: &str, ok: bool, now: Instant) {
        let mut runs = self.runs();
        let key = (ns.to_owned(), id.to_owned());
        if ok && let Some(run) = runs.get_mut(&key) {
            run.done = Some(now);
        } else {
            runs.remove(&key);
        }
    }

    /// The request that started the wake saw it finish: nothing is left to report.
    pub fn collect(&self, ns: &str, id: &str) {
        self.runs().remove(&(ns.to_owned(), id.to_owned()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_stay_inside_the_directory_and_apart() {
        assert_eq!(file_name("/threads", "a-1_B"), "%2Fthreads.a-1_B");
        assert_eq!(file_name("/threads", "../x"), "%2Fthreads.%2E%2E%2Fx");
        assert_eq!(file_name("/t", "a/b"), "%2Ft.a%2Fb");
        assert_eq!(file_name("/t", "a\0b"), "%2Ft.a%00b");
        assert_eq!(file_name("/t", "é"), "%2Ft.%C3%A9");
        // The separator is never part of an escaped name, so splitting elsewhere differs.
        assert_ne!(file_name("/a.b", "c"), file_name("/a", "b.c"));
        let long = file_name("/t", &"x".repeat(300));
        assert_eq!((long.len(), &long[..1]), (65, "#"));
        assert_ne!(long, file_name("/t", &"x".repeat(301)));
        for id in [
            "..",
            ".",
            "",
            "../../etc/passwd",
            "a/../../b",
            "\0",
            "~",
            "%2F",
        ] {
            let name = file_name("/t", id);
            assert!(
                !name.contains('/') && !name.contains('\0') && !name.starts_with('.'),
                "{id:?} → {name:?}"
            );
        }
    }

    #[test]
    fn a_file_is_read_only_as_a_whole_and_as_its_own() {
        let entry = Entry {
            wake_at: Some(17),
            state: Some(b"one\ntwo".to_vec()),
            epoch: Fence::zero(),
        };
        let bytes = render("k", &entry);
        assert_eq!(bytes, b"pinned-durable/1 k 17 7\none\ntwo");
        let read = parse(&bytes, "k").unwrap();
        assert_eq!(
            (read.wake_at, read.state),
            (Some(17), Some(b"one\ntwo".to_vec()))
        );
        assert!(parse(&bytes, "other").is_none(), "another instance's file");
        assert!(parse(&bytes[..bytes.len() - 1], "k").is_none(), "torn");
        let empty = render("k", &Entry::default());
        assert_eq!(empty, b"pinned-durable/1 k - -\n");
        assert!(parse(b"garbage", "k").is_none());
    }

    #[test]
    fn a_fenced_file_names_its_epoch_last_and_an_unfenced_one_is_epoch_0() {
        let epoch = Fence::parse("18446744073709551616").unwrap();
        let entry = Entry {
            wake_at: None,
            state: Some(b"s".to_vec()),
            epoch: epoch.clone(),
        };
        let bytes = render("k", &entry);
        assert_eq!(bytes, b"pinned-durable/1 k - 1 18446744073709551616\ns");
        assert!(parse(&bytes, "k").unwrap() == entry);
        let legacy = parse(b"pinned-durable/1 k 5 -\n", "k").unwrap();
        assert_eq!((legacy.wake_at, legacy.epoch), (Some(5), Fence::zero()));
        let padded = parse(b"pinned-durable/1 k - - 007\n", "k").unwrap();
        assert_eq!(padded.epoch.as_str(), "7");
        for bad in [
            &b"pinned-durable/1 k - - x\n"[..],
            b"pinned-durable/1 k - - -7\n",
            b"pinned-durable/1 k - - \n",
            b"pinned-durable/1 k - - 7 8\n",
        ] {
            assert!(
                parse(bad, "k").is_none(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn one_wake_at_a_time_and_its_outcome_once() {
        let wakes = Wakes::default();
        let (e5, e6) = (Epoch::parse(b"5").unwrap(), Epoch::parse(b"6").unwrap());
        let now = Instant::now();
        assert_eq!(wakes.begin("/t", "a", &e5, now), Begin::Start);
        assert_eq!(wakes.begin("/t", "a", &e5, now), Begin::Running);
        assert_eq!(wakes.begin("/t", "a", &e6, now), Begin::Running);
        assert_eq!(wakes.begin("/t", "b", &e5, now), Begin::Start);
        wakes.finish("/t", "a", true, now);
        assert_eq!(wakes.begin("/t", "a", &e5, now), Begin::Done);
        // Collected: the next wake runs the hook again.
        assert_eq!(wakes.begin("/t", "a", &e5, now), Begin::Start);
        wakes.finish("/t", "a", true, now);
        // A success at another epoch, or one too old, is not this wake's.
        assert_eq!(wakes.begin("/t", "a", &e6, now), Begin::Start);
        wakes.finish("/t", "a", true, now);
        let later = now + DONE_KEPT;
        assert_eq!(wakes.begin("/t", "a", &e6, later), Begin::Start);
        // A failure is forgotten.
        wakes.finish("/t", "a", false, later);
        assert_eq!(wakes.begin("/t", "a", &e6, later), Begin::Start);
        wakes.collect("/t", "a");
        assert_eq!(wakes.begin("/t", "a", &e6, later), Begin::Start);
    }
}
