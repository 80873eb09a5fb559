//! The thread-per-core runtime: one OS thread per core, each running its own monoio event loop
//! (io_uring, or epoll where the kernel refuses io_uring) with its own `SO_REUSEPORT` listener,
//! Redis connection and connection tasks. Nothing on the request path is shared between cores.
//!
//! Also owns the process lifecycle: binding, signal handling, and the bounded graceful stop
//! (stop accepting, let in-flight requests finish, exit); and the metrics listener
//! (`metrics_listen`, [`scrape`]) on the first core.

mod accept;
mod reload;
mod scrape;

use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use monoio::{IoUringDriver, LegacyDriver, RuntimeBuilder};
use tracing::{info, warn};

pub use pinboard_http::Shutdown;
pub use scrape::bind as bind_metrics;

use crate::config::DriverKind;
use crate::error::{Error, Origin};
use crate::http::serve_connection;
use crate::node::{Core, Shared};
use reload::Reloads;

/// How often each core looks at the process-wide stop flag. Only the shutdown path waits on
/// this; requests never do.
const STOP_POLL: Duration = Duration::from_millis(50);

/// Runs the node until SIGTERM or SIGINT, then stops gracefully, on `listeners`
/// ([`bind_listeners`], one per core). `metrics`: the metrics listener's socket
/// ([`bind_metrics`]), served by the first core.
pub fn serve(
    shared: Arc<Shared>,
    listeners: Vec<std::net::TcpListener>,
    mut metrics: Option<std::net::TcpListener>,
) -> Result<(), Error> {
    let threads = listeners.len();
    let addr = listeners[0]
        .local_addr()
        .map_err(|e| Error::because(Origin::Internal, "reading the bound address", e))?;
    let https = shared.tls.listener.is_some();
    info!(%addr, threads, driver = %shared.config.driver, https, "pinboard listening");
    watch_signals(shared.clone())?;

    let cores: Vec<_> = listeners
        .into_iter()
        .enumerate()
        .map(|(index, listener)| {
            let (shared, metrics) = (shared.clone(), metrics.take());
            std::thread::Builder::new()
                .name(format!("pinboard-core-{index}"))
                .spawn(move || run_core(index, threads, listener, metrics, shared))
                .map_err(|e| Error::because(Origin::Internal, "starting a core thread", e))
        })
        .collect::<Result<_, _>>()?;
    let mut result = Ok(());
    for core in cores {
        match core.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => result = Err(e),
            Err(_) => result = Err(Error::new(Origin::Internal, "a core thread panicked")),
        }
    }
    info!("pinboard stopped");
    result
}

/// One listening socket per core, all in one `SO_REUSEPORT` group so the kernel spreads
/// connections across cores. Bound before any core starts, so a bad address fails startup at
/// once, and so port 0 resolves to one port shared by every core. The error is the one line
/// that stops startup (exit 2), naming the key.
///
/// A live node already listening on the address refuses this one: `SO_REUSEPORT` would let
/// both bind and the kernel would hand each half the connections, two nodes with two
/// configurations (or two Redis) placing one instance twice. So the address is first bound
/// alone, without `SO_REUSEPORT`, which fails while any socket listens there; then released
/// and bound by the group (a node started in that instant is not seen).
pub fn bind_listeners(
    config: &crate::config::Config,
) -> Result<Vec<std::net::TcpListener>, String> {
    use socket2::{Domain, Socket, Type};
    let mut addr = config.listen;
    let refused = |addr: SocketAddr, e: std::io::Error| {
        format!("config error: listen: cannot listen on {addr}: {e}")
    };
    let domain = Domain::for_address(addr);
    let socket = |reuse_port: bool| -> std::io::Result<Socket> {
        let socket = Socket::new(domain, Type::STREAM, None)?;
        socket.set_reuse_address(true)?;
        socket.set_reuse_port(reuse_port)?;
        socket.set_nonblocking(true)?;
        Ok(socket)
    };
    if addr.port() != 0 {
        let alone = socket(false).map_err(|e| refused(addr, e))?;
        alone.bind(&addr.into()).map_err(|e| {
            if e.kind() == std::io::ErrorKind::AddrInUse {
                format!(
                    "config error: listen: {addr} is already served by another process \
                     (a second node there would share its connections)"
                )
            } else {
                refused(addr, e)
            }
        })?;
    }
    let mut listeners = Vec::new();
    for _ in 0..config.cores() {
        let listener: std::net::TcpListener = socket(true)
            .and_then(|s| {
                s.bind(&addr.into())?;
                s.listen(4096)?;
                Ok(s.into())
            })
            .map_err(|e| refused(addr, e))?;
        addr = listener.local_addr().map_err(|e| refused(addr, e))?;
        listeners.push(listener);
    }
    Ok(listeners)
}

/// The first SIGTERM/SIGINT starts the graceful stop; a second one exits at once. SIGHUP, which
/// nginx and HAProxy operators send to reload (and `pinboard reload` sends), reads the
/// configuration and the listener's certificate pair again and swaps them in on the reload
/// thread ([`reload`]), so that nothing a reload waits on keeps this thread from the next
/// signal (its default action, to exit, would kill the node).
fn watch_signals(shared: Arc<Shared>) -> Result<(), Error> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM, SIGUSR1};
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT, SIGHUP, SIGUSR1])
        .map_err(|e| Error::because(Origin::Internal, "installing signal handlers", e))?;
    let reloads = Reloads::start(shared.clone())?;
    std::thread::Builder::new()
        .name("pinboard-signals".into())
        .spawn(move || {
            for signal in signals.forever() {
                if signal == SIGHUP {
                    reloads.ask();
                    continue;
                }
                if signal == SIGUSR1 {
                    reopen_access_log(&shared);
                    continue;
                }
                if shared.stopping.swap(true, Ordering::SeqCst) {
                    warn!(signal, "second stop signal: exiting now");
                    std::process::exit(1);
                }
                info!(signal, "stop signal: finishing in-flight requests");
            }
        })
        .map_err(|e| Error::because(Origin::Internal, "starting the signal thread", e))?;
    Ok(())
}

/// SIGUSR1, as nginx takes it: the access log file is reopened (by each core, before its next
/// write), so logrotate can move it away and signal.
fn reopen_access_log(shared: &Shared) {
    match &shared.settings().access_log {
        Some(log) => {
            log.reopen.fetch_add(1, Ordering::Relaxed);
            info!("SIGUSR1: reopening the access log");
        }
        None => info!("SIGUSR1: access_log is off, nothing to reopen; ignored"),
    }
}

fn run_core(
    index: usize,
    threads: usize,
    listener: std::net::TcpListener,
    metrics: Option<std::net::TcpListener>,
    shared: Arc<Shared>,
) -> Result<(), Error> {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    if threads <= cpus {
        // Best effort: a container may forbid pinning, and the node works unpinned.
        let _ = monoio::utils::bind_to_cpu_set([index]);
    }
    let io_uring = || {
        RuntimeBuilder::<IoUringDriver>::new()
            .with_entries(1024)
            .enable_timer()
            .build()
    };
    let epoll = || {
        RuntimeBuilder::<LegacyDriver>::new()
            .enable_timer()
            .build()
            .map_err(|e| Error::because(Origin::Internal, "starting the epoll event loop", e))
    };
    let task = core_main(index, listener, metrics, shared.clone());
    match shared.config.driver {
        DriverKind::Epoll => {
            info!(core = index, driver = "epoll", "event loop started");
            epoll()?.block_on(task)
        }
        DriverKind::IoUring => {
            let mut rt = io_uring().map_err(|e| {
                Error::because(Origin::Internal, "starting the io_uring event loop", e)
            })?;
            info!(core = index, driver = "io_uring", "event loop started");
            rt.block_on(task)
        }
        DriverKind::Auto => match io_uring() {
            Ok(mut rt) => {
                info!(core = index, driver = "io_uring", "event loop started");
                rt.block_on(task)
            }
            Err(e) => {
                info!(core = index, driver = "epoll", reason = %e, "io_uring refused; event loop started on epoll");
                epoll()?.block_on(task)
            }
        },
    }
}

async fn core_main(
    index: usize,
    listener: std::net::TcpListener,
    metrics: Option<std::net::TcpListener>,
    shared: Arc<Shared>,
) -> Result<(), Error> {
    let acceptor = accept::Acceptor::new(listener, index)?;
    let metrics = metrics
        .map(|listener| accept::Acceptor::new(listener, index))
        .transpose()?;
    let shutdown = Shutdown::default();
    monoio::spawn({
        let (shared, shutdown) = (shared.clone(), shutdown.clone());
        async move {
            while !shared.stopping.load(Ordering::Relaxed) {
                monoio::time::sleep(STOP_POLL).await;
            }
            shutdown.fire();
        }
    });
    let core = Rc::new(Core::new(shared.clone(), index));
    // The fleet claim, the mirror poll and the sweeper: the first core.
    let sweeper = (index == 0).then(|| {
        monoio::spawn(crate::fleet::keep_claiming(core.clone(), shutdown.clone()));
        monoio::spawn(crate::mirror::keep_polling(core.clone(), shutdown.clone()));
        monoio::spawn(crate::sweeper::keep_sweeping(
            core.clone(),
            shutdown.clone(),
        ))
    });
    {
        let (core, shutdown) = (core.clone(), shutdown.clone());
        monoio::spawn(async move {
            // Lines of a quiet core reach the log within a flush period.
            while !shutdown.is_fired() {
                monoio::select! {
                    _ = monoio::time::sleep(crate::access_log::FLUSH_EVERY) => {}
                    _ = shutdown.fired() => {}
                }
                if let Some(log) = &core.live().access_log {
                    log.flush();
                }
            }
        });
    }
    if let Some(metrics) = metrics {
        let limits = Rc::new(core.live().settings.http_limits());
        let (core, shutdown) = (core.clone(), shutdown.clone());
        monoio::spawn(scrape::serve(core, metrics, limits, shutdown));
    }
    while let Some((stream, peer)) = acceptor.next(&shutdown).await {
        let slot = match accept::admit(&core, peer) {
            Ok(slot) => slot,
            Err(reason) => {
                core.counters().connection_refused(reason);
                continue;
            }
        };
        // The limits of the settings current at accept.
        let limits = core.live().settings.http_limits();
        let (core, shutdown) = (core.clone(), shutdown.clone());
        core.counters().connection_opened();
        monoio::spawn(async move {
            let tls = core.shared.tls.listener.as_ref();
            let handler = accept::Admitted {
                handler: &*core,
                slot,
            };
            serve_connection(stream, peer, &handler, &limits, &shutdown, tls).await;
            core.counters().connection_closed();
        });
    }
    acceptor.close();
    let grace = core.live().config().http.shutdown_grace_ms;
    let deadline = Instant::now() + Duration::from_millis(grace);
    let open = || core.counters().connections();
    while open() > 0 && Instant::now() < deadline {
        monoio::time::sleep(Duration::from_millis(10)).await;
    }
    if open() > 0 {
        warn!(
            core = index,
            open = open(),
            "grace period over; dropping connections"
        );
    }
    // The sweeper gives its lease up before the process goes (bounded by the Redis timeout).
    if let Some(sweeper) = sweeper {
        sweeper.await;
    }
    if let Some(log) = &core.live().access_log {
        log.flush();
    }
    Ok(())
}
