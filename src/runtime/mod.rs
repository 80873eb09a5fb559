//! The thread-per-core runtime: one OS thread per core, each running its own monoio event loop
//! (io_uring, or epoll where the kernel refuses io_uring) with its own `SO_REUSEPORT` listener,
//! Redis connection and connection tasks. Nothing on the request path is shared between cores.
//!
//! Also owns the process lifecycle: binding, signal handling, the bounded graceful stop
//! (stop accepting, let in-flight requests finish, let WebSocket tunnels still open say
//! goodbye, exit), the binary upgrade ([`upgrade`]) and
//! the pid file ([`pid_file`]); and the metrics listener (`metrics_listen`, [`scrape`]) on the
//! first core.

mod accept;
pub mod pid_file;
mod reload;
mod scrape;
pub mod upgrade;

use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use monoio::{LegacyDriver, RuntimeBuilder};
use tracing::{error, info, warn};

use pinboard_http::Shutdown;
pub use scrape::bind as bind_metrics;

use crate::config::DriverKind;
use crate::error::{Error, Origin};
use crate::http::serve_connection;
use crate::node::{Core, Shared};
use crate::{fleet, mirror};
use reload::Reloads;
use upgrade::{Handed, Sockets, TakenOver};

/// How often each core looks at the process-wide stop flag. Only the shutdown path waits on
/// this; requests never do.
const STOP_POLL: Duration = Duration::from_millis(50);

/// Where a node's listening sockets come from.
pub enum Start {
    /// Bound by this process ([`bind_listeners`], one per core; [`bind_metrics`]), which
    /// wrote its pid file.
    Bound {
        listeners: Vec<std::net::TcpListener>,
        metrics: Option<std::net::TcpListener>,
    },
    /// Taken over from the running node ([`upgrade::take_over`]).
    TakenOver(TakenOver),
}

/// Runs the node until SIGTERM or SIGINT (or until a new process took its sockets over), then
/// stops gracefully. The metrics listener is served by the first core.
pub fn serve(shared: Arc<Shared>, start: Start) -> Result<(), Error> {
    let (listeners, mut metrics, taken) = match start {
        Start::Bound { listeners, metrics } => (listeners, metrics, None),
        Start::TakenOver(mut taken) => {
            let listeners = std::mem::take(&mut taken.listeners);
            (listeners, taken.metrics.take(), Some(taken))
        }
    };
    let threads = listeners.len();
    let cloned = |e| Error::because(Origin::Internal, "cloning a listening socket", e);
    let handed = Handed {
        listeners: (listeners.iter().map(|l| l.try_clone().map_err(cloned)))
            .collect::<Result<_, _>>()?,
        metrics: metrics
            .as_ref()
            .map(|m| m.try_clone().map_err(cloned))
            .transpose()?,
    };
    let addr = listeners[0]
        .local_addr()
        .map_err(|e| Error::because(Origin::Internal, "reading the bound address", e))?;
    let https = shared.tls.listener.is_some();
    info!(%addr, threads, driver = %shared.config.driver, https, "pinboard listening");
    let sockets = Arc::new(Sockets::default());
    watch_signals(shared.clone())?;

    let (accepting, accepts) = std::sync::mpsc::channel();
    let taking_over = taken.is_some();
    let cores: Vec<_> = listeners
        .into_iter()
        .enumerate()
        .map(|(index, listener)| {
            let (shared, metrics, sockets) = (shared.clone(), metrics.take(), sockets.clone());
            let accepting = accepting.clone();
            std::thread::Builder::new()
                .name(format!("pinboard-core-{index}"))
                .spawn(move || {
                    let listening = Listening {
                        listener,
                        metrics,
                        sockets,
                        accepting,
                        taking_over,
                    };
                    run_core(index, threads, listening, shared)
                })
                .map_err(|e| Error::because(Origin::Internal, "starting a core thread", e))
        })
        .collect::<Result<_, _>>()?;
    drop(accepting);
    // Every core accepts (or one failed, and the node stops with its error).
    let all_accept = accepts.iter().take(threads).count() == threads;
    let mut result = Ok(());
    if all_accept {
        result = hand_over_done(&shared, addr, handed, taken, sockets);
    }
    for core in cores {
        match core.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => result = Err(e),
            Err(_) => result = Err(Error::new(Origin::Internal, "a core thread panicked")),
        }
    }
    if let Some(path) = &shared.config.pid_file {
        pid_file::remove_if_mine(path);
    }
    info!("pinboard stopped");
    result
}

/// Once every core accepts: the old node told to stop accepting (after an upgrade, then this
/// process's pid file), and the control socket served for the next upgrade. An old node that
/// does not take the hand-over keeps the sockets: this process stops, and fails.
fn hand_over_done(
    shared: &Arc<Shared>,
    addr: SocketAddr,
    handed: Handed,
    taken: Option<TakenOver>,
    sockets: Arc<Sockets>,
) -> Result<(), Error> {
    if let Some(taken) = taken {
        let from = taken.from;
        if let Err(e) = taken.ready() {
            // Two nodes accepting on one address is what `--upgrade` exists to avoid: the old
            // one, which gave up on this one, keeps the sockets.
            sockets.lend();
            shared.stopping.store(true, Ordering::SeqCst);
            return Err(Error::new(
                Origin::Internal,
                format!(
                    "upgrade: the old node (pid {from}) did not take the hand-over ({e}); it serves on, this process stops"
                ),
            ));
        }
        info!(
            from,
            "upgrade: serving on the sockets taken over; the old node drains"
        );
        if let Some(path) = &shared.config.pid_file
            && let Err(e) = pid_file::write(path)
        {
            error!(path = %path.display(), error = %e, "cannot write the pid file: it still names the old node");
        }
    }
    upgrade::serve_control(addr, handed, shared.clone(), sockets);
    Ok(())
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
                     (a second node there would share its connections; to replace a node, \
                     `pinboard serve --upgrade`)"
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

/// The first SIGTERM/SIGINT starts the graceful stop (after `http.shutdown_delay_ms` of
/// serving with `/readyz` 503); a second one, during the delay too, exits at once. SIGHUP,
/// which nginx and HAProxy operators send to reload (and `pinboard reload` sends), reads the
/// configuration and the listener's certificate pair again and swaps them in on the reload
/// thread ([`reload`]), so that nothing a reload waits on keeps this thread from the next
/// signal (its default action, to exit, would kill the node). SIGUSR2 starts a binary upgrade
/// ([`upgrade::start_successor`]).
fn watch_signals(shared: Arc<Shared>) -> Result<(), Error> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM, SIGUSR1, SIGUSR2};
    let mut signals =
        signal_hook::iterator::Signals::new([SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2])
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
                if signal == SIGUSR2 {
                    upgrade::start_successor();
                    continue;
                }
                if shared.stopping.swap(true, Ordering::SeqCst) {
                    warn!(signal, "second stop signal: exiting now");
                    std::process::exit(1);
                }
                match shared.settings().config.http.shutdown_delay_ms {
                    0 => info!(signal, "stop signal: finishing in-flight requests"),
                    delay_ms => info!(
                        signal,
                        delay_ms,
                        "stop signal: /readyz answers 503; serving on for http.shutdown_delay_ms, \
                         then finishing in-flight requests"
                    ),
                }
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

/// One core's listening sockets, and who else holds them.
struct Listening {
    listener: std::net::TcpListener,
    /// The metrics listener's, on the first core.
    metrics: Option<std::net::TcpListener>,
    sockets: Arc<Sockets>,
    /// Told once the core accepts.
    accepting: std::sync::mpsc::Sender<()>,
    /// The sockets were taken over: the old node accepts on them until this node is the
    /// serving fleet, which answers rather than 503 `not the serving fleet`.
    taking_over: bool,
}

fn run_core(
    index: usize,
    threads: usize,
    listening: Listening,
    shared: Arc<Shared>,
) -> Result<(), Error> {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    if threads <= cpus {
        // Best effort: a container may forbid pinning, and the node works unpinned.
        let _ = monoio::utils::bind_to_cpu_set([index]);
    }
    let io_uring = pinboard_http::io_uring_runtime;
    let epoll = || {
        RuntimeBuilder::<LegacyDriver>::new()
            .enable_timer()
            .build()
            .map_err(|e| Error::because(Origin::Internal, "starting the epoll event loop", e))
    };
    let task = core_main(index, listening, shared.clone());
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

async fn core_main(index: usize, listening: Listening, shared: Arc<Shared>) -> Result<(), Error> {
    let Listening {
        listener,
        metrics,
        sockets,
        accepting,
        taking_over,
    } = listening;
    let acceptor = accept::Acceptor::new(listener, index, sockets.clone())?;
    let metrics = metrics
        .map(|listener| accept::Acceptor::new(listener, index, sockets.clone()))
        .transpose()?;
    let shutdown = Shutdown::default();
    let core = Rc::new(Core::new(shared.clone(), index));
    monoio::spawn({
        let (core, shutdown) = (core.clone(), shutdown.clone());
        async move {
            loop {
                // Given to a new process: it accepts on them already.
                if sockets.given() {
                    break;
                }
                if core.shared.stopping.load(Ordering::Relaxed) {
                    // `/readyz` answers 503; balancers take that time to stop sending here.
                    let delay = core.live().config().http.shutdown_delay_ms;
                    monoio::time::sleep(Duration::from_millis(delay)).await;
                    break;
                }
                monoio::time::sleep(STOP_POLL).await;
            }
            shutdown.fire();
        }
    });
    monoio::spawn({
        let (core, shutdown) = (core.clone(), shutdown.clone());
        async move { core.watch_redis(STOP_POLL, shutdown.fired()).await }
    });
    // The fleet claim, the mirror poll and the sweeper: the first core.
    let sweeper = (index == 0).then(|| {
        monoio::spawn({
            let (core, shutdown) = (core.clone(), shutdown.clone());
            async move {
                let shared = &core.shared;
                fleet::keep_claiming(&core.store, &shared.config, &shared.standing, shutdown).await
            }
        });
        monoio::spawn({
            let (core, shutdown) = (core.clone(), shutdown.clone());
            async move {
                let shared = &core.shared;
                let (config, standing) = (&shared.config, &shared.standing);
                mirror::keep_polling(&core.store, config, standing, &shared.mirror, shutdown).await
            }
        });
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
    if taking_over {
        let deadline = Instant::now() + upgrade::SERVING_WITHIN;
        while !shared.is_serving() {
            if Instant::now() > deadline {
                return Err(Error::new(
                    Origin::Internal,
                    "upgrade: this node did not become the serving fleet in time; the old node serves on",
                ));
            }
            monoio::time::sleep(STOP_POLL).await;
        }
    }
    let _ = accepting.send(());
    drop(accepting);
    if let Some(metrics) = metrics {
        let limits = Rc::new(core.live().settings.http_limits());
        let (core, shutdown) = (core.clone(), shutdown.clone());
        monoio::spawn(scrape::serve(core, metrics, limits, shutdown));
    }
    while let Some((mut stream, peer)) = acceptor.next(&shutdown).await {
        let balancer = (core.live().config().proxy_protocol).expected_from(peer.ip());
        let slot = match accept::admit(&core, peer, balancer) {
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
            let (peer, slot) = if balancer {
                match accept::proxied(&core, &mut stream, peer, limits.header_timeout).await {
                    Ok(client) => client,
                    Err(reason) => {
                        core.counters().connection_refused(reason);
                        core.counters().connection_closed();
                        return;
                    }
                }
            } else {
                (peer, slot)
            };
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
        // WebSocket tunnels say goodbye first (a close frame between two of the worker's).
        shutdown.end_grace();
        let goodbyes = Instant::now() + crate::proxy::GOODBYE_WITHIN;
        while shutdown.partings() > 0 && Instant::now() < goodbyes {
            monoio::time::sleep(Duration::from_millis(10)).await;
        }
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
