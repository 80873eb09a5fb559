//! Connecting to a host by name without blocking the core: a worker by its advertise host, a
//! Redis server by its `redis_url` host.
//!
//! `getaddrinfo` blocks, for as long as a DNS server takes to answer (seconds when one is
//! down), and monoio's own `TcpStream::connect` calls it on the event-loop thread: one slow
//! name would stall every connection of that core. So an IP literal is connected to directly,
//! and a name is looked up by the process's resolver: a pool of [`THREADS`] threads fed by a
//! queue of at most [`QUEUE`] lookups. A lookup that finds the queue full fails at once (a name
//! server that never answers would otherwise cost a thread per registration for as long as
//! registrations come), and one whose asker gave up before a thread took it is skipped. A name
//! that does not resolve fails like a worker that does not answer.
//!
//! `getaddrinfo` says nothing of a record's TTL, so what it found is kept a fixed
//! [`CACHE_TTL`], for at most [`CACHE_NAMES`] names: a registration's probe and its first
//! forwards resolve once. Failures are not kept.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use monoio::net::TcpStream;

/// Lookups running at once, process-wide.
pub const THREADS: usize = 4;
/// Lookups waiting for a thread, process-wide; past it a lookup fails at once.
pub const QUEUE: usize = 64;
/// How long a name's addresses are reused.
pub const CACHE_TTL: Duration = Duration::from_secs(5);
/// Names whose addresses are kept at once.
pub const CACHE_NAMES: usize = 256;

/// A connection to `host:port`; `ip` is `host` already parsed as an IP literal, when it is one.
/// Every address a name has is tried in turn.
pub async fn connect(host: &str, ip: Option<IpAddr>, port: u16) -> io::Result<TcpStream> {
    if let Some(ip) = ip {
        return TcpStream::connect_addr(SocketAddr::new(ip, port)).await;
    }
    let mut last = io::Error::new(io::ErrorKind::NotFound, format!("{host} has no address"));
    for ip in resolver()?.lookup(host).await?.iter() {
        match TcpStream::connect_addr(SocketAddr::new(*ip, port)).await {
            Ok(stream) => return Ok(stream),
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// The process's resolver, its threads started on first use.
fn resolver() -> io::Result<&'static Resolver> {
    static RESOLVER: OnceLock<Result<Resolver, String>> = OnceLock::new();
    RESOLVER
        .get_or_init(|| {
            Resolver::start(
                THREADS,
                QUEUE,
                Cache::new(CACHE_TTL, CACHE_NAMES),
                getaddrinfo,
            )
            .map_err(|e| format!("starting the resolver's threads: {e}"))
        })
        .as_ref()
        .map_err(|e| io::Error::other(e.clone()))
}

/// The system's lookup (`getaddrinfo`): blocking.
fn getaddrinfo(host: &str) -> io::Result<Addresses> {
    Ok((host, 0).to_socket_addrs()?.map(|a| a.ip()).collect())
}

/// A name's addresses, shared between the cache and its askers.
type Addresses = Arc<[IpAddr]>;
type Lookup = dyn Fn(&str) -> io::Result<Addresses> + Send + Sync;

struct Job {
    host: String,
    answer: flume::Sender<io::Result<Addresses>>,
}

/// A bounded pool of lookup threads behind a bounded queue, and what they found.
struct Resolver {
    jobs: flume::Sender<Job>,
    cache: Arc<Mutex<Cache>>,
}

impl Resolver {
    /// `threads` threads running `lookup`, fed by a queue of `queue` jobs.
    fn start(
        threads: usize,
        queue: usize,
        cache: Cache,
        lookup: impl Fn(&str) -> io::Result<Addresses> + Send + Sync + 'static,
    ) -> io::Result<Resolver> {
        let (jobs, waiting) = flume::bounded::<Job>(queue);
        let cache = Arc::new(Mutex::new(cache));
        let lookup: Arc<Lookup> = Arc::new(lookup);
        for _ in 0..threads {
            let (waiting, cache, lookup) = (waiting.clone(), cache.clone(), lookup.clone());
            std::thread::Builder::new()
                .name("pinboard-dns".into())
                .spawn(move || {
                    for job in waiting.iter() {
                        // The asker timed out and went: nobody to look it up for.
                        if job.answer.is_disconnected() {
                            continue;
                        }
                        let found = lookup(&job.host);
                        if let Ok(addresses) = &found {
                            lock(&cache).keep(&job.host, addresses.clone(), Instant::now());
                        }
                        let _ = job.answer.send(found);
                    }
                })?;
        }
        Ok(Resolver { jobs, cache })
    }

    /// `host`'s addresses: kept ones, or looked up on a pool thread while the caller's core
    /// goes on serving. Fails at once when the queue is full.
    async fn lookup(&self, host: &str) -> io::Result<Addresses> {
        if let Some(kept) = lock(&self.cache).get(host, Instant::now()) {
            return Ok(kept);
        }
        let (answer, answered) = flume::bounded(1);
        let job = Job {
            host: host.to_owned(),
            answer,
        };
        self.jobs.try_send(job).map_err(|_| {
            io::Error::other(format!("looking up {host}: the resolver's queue is full"))
        })?;
        answered
            .recv_async()
            .await
            .map_err(|_| io::Error::other("the resolver ended without an answer"))?
    }
}

/// A poisoned lock only means a lookup thread panicked mid-insert; the map is still whole.
fn lock(cache: &Mutex<Cache>) -> std::sync::MutexGuard<'_, Cache> {
    cache
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Names' addresses until their expiry, at most `names` of them.
struct Cache {
    ttl: Duration,
    names: usize,
    kept: HashMap<String, (Instant, Addresses)>,
}

impl Cache {
    fn new(ttl: Duration, names: usize) -> Cache {
        Cache {
            ttl,
            names,
            kept: HashMap::new(),
        }
    }

    fn get(&self, host: &str, now: Instant) -> Option<Addresses> {
        let (expiry, addresses) = self.kept.get(host)?;
        (*expiry > now).then(|| addresses.clone())
    }

    /// Keeps `host`'s addresses for the TTL; when full, the expired go first, then the name
    /// closest to expiring.
    fn keep(&mut self, host: &str, addresses: Addresses, now: Instant) {
        if self.names == 0 {
            return;
        }
        if self.kept.len() >= self.names && !self.kept.contains_key(host) {
            self.kept.retain(|_, (expiry, _)| *expiry > now);
            if self.kept.len() >= self.names
                && let Some(oldest) = self
                    .kept
                    .iter()
                    .min_by_key(|(_, (expiry, _))| *expiry)
                    .map(|(name, _)| name.clone())
            {
                self.kept.remove(&oldest);
            }
        }
        self.kept
            .insert(host.to_owned(), (now + self.ttl, addresses));
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    fn block_on<F: Future>(future: F) -> F::Output {
        monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
            .enable_timer()
            .build()
            .unwrap()
            .block_on(future)
    }

    /// Polls `future` once (its lookup is queued), without waiting for it.
    fn poll_once<F: Future + Unpin>(future: &mut F) {
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        assert!(std::pin::Pin::new(future).poll(&mut cx).is_pending());
    }

    fn loopback() -> Addresses {
        Arc::from([IpAddr::from([127, 0, 0, 1])])
    }

    #[test]
    fn names_resolve_off_the_core_and_unknown_names_fail() {
        block_on(async {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let port = listener.local_addr().unwrap().port();
            assert!(connect("localhost", None, port).await.is_ok());
            let ip = Some("127.0.0.1".parse().unwrap());
            assert!(connect("127.0.0.1", ip, port).await.is_ok());
            assert!(connect("no-such-host.invalid", None, port).await.is_err());
        });
    }

    /// A lookup that blocks until the test lets it go, counting how many run at once.
    struct Stuck {
        running: AtomicUsize,
        most: AtomicUsize,
        calls: AtomicUsize,
        release: Mutex<Option<flume::Receiver<()>>>,
    }

    #[test]
    fn the_pool_and_its_queue_are_bounded_and_a_full_queue_fails_at_once() {
        let (let_go, held) = flume::unbounded::<()>();
        let stuck = Arc::new(Stuck {
            running: AtomicUsize::new(0),
            most: AtomicUsize::new(0),
            calls: AtomicUsize::new(0),
            release: Mutex::new(Some(held)),
        });
        let release = stuck.release.lock().unwrap().clone().unwrap();
        let seen = stuck.clone();
        let resolver = Resolver::start(2, 3, Cache::new(CACHE_TTL, 16), move |_: &str| {
            seen.calls.fetch_add(1, Ordering::SeqCst);
            let now = seen.running.fetch_add(1, Ordering::SeqCst) + 1;
            seen.most.fetch_max(now, Ordering::SeqCst);
            let _ = release.recv();
            seen.running.fetch_sub(1, Ordering::SeqCst);
            Err(io::Error::other("no answer"))
        })
        .unwrap();
        block_on(async {
            // Two lookups run, three wait; every further one fails without waiting.
            let mut asked = Vec::new();
            for n in 0..5 {
                let (resolver, name) = (&resolver, format!("n{n}.invalid"));
                asked.push(Box::pin(async move { resolver.lookup(&name).await }));
                // Polled once: the job is queued.
                poll_once(asked.last_mut().unwrap());
                if n < 2 {
                    while stuck.running.load(Ordering::SeqCst) <= n {
                        std::thread::yield_now();
                    }
                }
            }
            let started = Instant::now();
            for n in 0..20 {
                let refused = resolver.lookup(&format!("m{n}.invalid")).await.unwrap_err();
                assert!(refused.to_string().contains("queue is full"), "{refused}");
            }
            assert!(started.elapsed() < Duration::from_secs(1));
            for _ in 0..5 {
                let_go.send(()).unwrap();
            }
            for lookup in asked {
                assert!(lookup.await.is_err());
            }
        });
        assert_eq!(stuck.most.load(Ordering::SeqCst), 2);
        assert_eq!(stuck.calls.load(Ordering::SeqCst), 5);
    }

    #[test]
    fn a_lookup_whose_asker_left_is_skipped() {
        let calls = Arc::new(AtomicUsize::new(0));
        let (let_go, held) = flume::unbounded::<()>();
        let counted = calls.clone();
        let resolver = Resolver::start(1, 8, Cache::new(CACHE_TTL, 16), move |_: &str| {
            counted.fetch_add(1, Ordering::SeqCst);
            let _ = held.recv();
            Ok(loopback())
        })
        .unwrap();
        block_on(async {
            let mut first = Box::pin(resolver.lookup("first.test"));
            poll_once(&mut first);
            while calls.load(Ordering::SeqCst) == 0 {
                std::thread::yield_now();
            }
            // Asked while the only thread is busy, then given up on.
            for n in 0..5 {
                let name = format!("gone{n}.test");
                let mut gone = Box::pin(resolver.lookup(&name));
                poll_once(&mut gone);
            }
            let_go.send(()).unwrap();
            assert!(first.await.is_ok());
            let_go.send(()).unwrap();
            assert!(resolver.lookup("last.test").await.is_ok());
        });
        assert_eq!(calls.load(Ordering::SeqCst), 2, "first and last only");
    }

    #[test]
    fn addresses_are_kept_for_the_ttl_and_failures_are_not() {
        let calls = Arc::new(AtomicUsize::new(0));
        let counted = calls.clone();
        let ttl = Duration::from_millis(300);
        let resolver = Resolver::start(1, 8, Cache::new(ttl, 16), move |host: &str| {
            counted.fetch_add(1, Ordering::SeqCst);
            match host {
                "bad.test" => Err(io::Error::other("no such name")),
                _ => Ok(loopback()),
            }
        })
        .unwrap();
        block_on(async {
            for _ in 0..3 {
                assert_eq!(&*resolver.lookup("good.test").await.unwrap(), &*loopback());
            }
            assert_eq!(calls.load(Ordering::SeqCst), 1);
            for _ in 0..3 {
                assert!(resolver.lookup("bad.test").await.is_err());
            }
            assert_eq!(calls.load(Ordering::SeqCst), 4);
            std::thread::sleep(ttl);
            assert!(resolver.lookup("good.test").await.is_ok());
            assert_eq!(
                calls.load(Ordering::SeqCst),
                5,
                "looked up again past the TTL"
            );
        });
    }

    #[test]
    fn the_cache_keeps_at_most_its_names() {
        let mut cache = Cache::new(Duration::from_secs(5), 3);
        let start = Instant::now();
        for n in 0..10u64 {
            let at = start + Duration::from_millis(n);
            cache.keep(&format!("n{n}"), loopback(), at);
            assert!(cache.kept.len() <= 3);
        }
        // The newest stay; the one closest to expiring went first.
        let now = start + Duration::from_millis(10);
        assert!(cache.get("n9", now).is_some() && cache.get("n7", now).is_some());
        assert!(cache.get("n6", now).is_none());
        // Expired names make room before a live one is dropped, and are never served.
        let later = start + Duration::from_secs(6);
        cache.keep("fresh", loopback(), later);
        assert_eq!(cache.kept.len(), 1);
        assert!(cache.get("n9", later).is_none());
        assert!(Cache::new(CACHE_TTL, 0).get("x", later).is_none());
    }
}
