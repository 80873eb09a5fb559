//! The worker's threads: `threads` serving threads, each a monoio event loop with its own
//! `SO_REUSEPORT` listener (as the node does), and one control thread running the registry
//! protocol, so a heartbeat is never queued behind busy request handling. What stops them, the
//! stop `Signal`s, is shared state (`state.rs`).

use std::cell::Cell;
use std::future::Future;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use monoio::{LegacyDriver, RuntimeBuilder};
use pinboard_http::tls::ServerTls;
use pinboard_http::{DriverKind, Http2, Limits, Listening, serve_connection};
use tracing::{error, warn};

use crate::app::App;
use crate::control;
use crate::state::{Shared, local_shutdown};
use crate::surface::Surface;

/// The listening sockets, bound before any thread starts so that a bad address fails
/// [`Worker::start`](crate::Worker::start) and port 0 resolves to one port for all threads.
pub(crate) fn bind(
    addr: SocketAddr,
    threads: usize,
) -> std::io::Result<Vec<std::net::TcpListener>> {
    use socket2::{Domain, Socket, Type};
    let mut addr = addr;
    (0..threads)
        .map(|_| {
            let socket = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
            socket.set_reuse_address(true)?;
            // Only to share the port between our own threads.
            socket.set_reuse_port(threads > 1)?;
            socket.set_nonblocking(true)?;
            socket.bind(&addr.into())?;
            socket.listen(1024)?;
            let listener: std::net::TcpListener = socket.into();
            addr = listener.local_addr()?;
            Ok(listener)
        })
        .collect()
}

/// With `tls`, every serving thread speaks HTTPS on its listener.
pub(crate) fn spawn_serving<A: App>(
    shared: &Arc<Shared>,
    app: &Arc<A>,
    listeners: Vec<std::net::TcpListener>,
    tls: Option<Arc<ServerTls>>,
) -> std::io::Result<Vec<JoinHandle<()>>> {
    listeners
        .into_iter()
        .enumerate()
        .map(|(index, listener)| {
            let surface = Surface::new(shared.clone(), app.clone());
            let (shared, tls) = (shared.clone(), tls.clone());
            std::thread::Builder::new()
                .name(format!("pinned-serve-{index}"))
                .spawn(move || {
                    block_on(shared.driver, serve(listener, surface, shared.clone(), tls))
                })
        })
        .collect()
}

pub(crate) fn spawn_control<A: App>(
    shared: &Arc<Shared>,
    app: &Arc<A>,
) -> std::io::Result<JoinHandle<()>> {
    let (shared, app) = (shared.clone(), app.clone());
    std::thread::Builder::new()
        .name("pinned-control".into())
        .spawn(move || block_on(shared.driver, control::run(shared.clone(), app)))
}

/// The event-loop driver every thread will run: `Auto` decided once, up front, so that all
/// threads agree and a forced io_uring the kernel refuses fails the start.
pub(crate) fn choose_driver(driver: DriverKind) -> Result<DriverKind, String> {
    match driver {
        DriverKind::Auto if uring_available() => Ok(DriverKind::IoUring),
        DriverKind::Auto => Ok(DriverKind::Epoll),
        DriverKind::IoUring if !uring_available() => {
            Err("driver io_uring: the kernel does not offer the io_uring operations needed".into())
        }
        chosen => Ok(chosen),
    }
}

/// Whether the kernel offers the io_uring operations monoio needs, probed on a throwaway
/// thread, never on the caller's.
///
/// The probe (monoio's `detect_uring`, once per process) sets up a ring and drops it, which
/// registers the probing thread with io_uring. The kernel tears a closed ring down later, from
/// a work queue, and then interrupts every thread registered with it (task work with
/// `TWA_SIGNAL`) to detach it: whatever blocking call that thread is in at that moment returns
/// early, and one that cannot be restarted, such as a socket read with `SO_RCVTIMEO` set, fails
/// with `EINTR` though no signal was sent. Probed on the caller's thread, that hit the
/// embedding application's (or a test's) next blocking read some milliseconds after
/// [`Worker::start`](crate::Worker::start), later on a loaded machine. A thread is detached as
/// it exits, so once the probing thread is joined the teardown has no one left to interrupt.
pub(crate) fn uring_available() -> bool {
    std::thread::scope(|scope| {
        std::thread::Builder::new()
            .name("pinned-uring-probe".into())
            .spawn_scoped(scope, monoio::utils::detect_uring)
            .map(|probe| probe.join().unwrap_or(false))
            // No thread to spare (the process is at its limit): probe here after all, a wrong
            // answer being worse than an early EINTR.
            .unwrap_or_else(|_| monoio::utils::detect_uring())
    })
}

/// Runs `future` on a fresh event loop of the chosen driver.
fn block_on<F: Future>(driver: DriverKind, future: F) -> F::Output {
    let epoll = || {
        RuntimeBuilder::<LegacyDriver>::new()
            .enable_timer()
            .build()
            // Building an epoll loop fails only when the process is out of file descriptors
            // or memory; the worker cannot serve at all then.
            .expect("starting an epoll event loop")
    };
    if driver == DriverKind::Epoll {
        return epoll().block_on(future);
    }
    match pinboard_http::io_uring_runtime() {
        Ok(mut rt) => rt.block_on(future),
        Err(e) => {
            // Detected as available, then refused (a ring limit reached, say): epoll serves.
            warn!(error = %e, "io_uring event loop refused; running on epoll");
            epoll().block_on(future)
        }
    }
}

/// One serving thread: accepts until the serving stop fires, then lets open connections
/// finish within the shutdown grace. With `tls`, each connection is a TLS handshake first
/// (bounded by the header timeout).
async fn serve<A: App>(
    listener: std::net::TcpListener,
    surface: Surface<A>,
    shared: Arc<Shared>,
    tls: Option<Arc<ServerTls>>,
) {
    let listening = match Listening::new(listener) {
        Ok(listening) => listening,
        Err(e) => {
            error!(error = %e, "registering the listener failed; this thread serves nothing");
            return;
        }
    };
    let shutdown = local_shutdown(&shared, |shared| &shared.serving_stop);
    let surface = Rc::new(surface);
    let limits = Rc::new(Limits {
        header_timeout: Duration::from_secs(10),
        idle_timeout: Duration::from_secs(75),
        // Attestations carrying a client's claims can be long.
        max_header_bytes: 64 * 1024,
        write_timeout: Duration::from_secs(60),
        // Behind the node, which speaks HTTP/1.1 to workers.
        http2: Http2::OFF,
    });
    let active = Rc::new(Cell::new(0usize));
    while let Some((stream, peer)) = listening.next(&shutdown, "serving thread").await {
        let (surface, limits, active, shutdown, tls) = (
            surface.clone(),
            limits.clone(),
            active.clone(),
            shutdown.clone(),
            tls.clone(),
        );
        active.set(active.get() + 1);
        monoio::spawn(async move {
            let tls = tls.as_deref();
            serve_connection(stream, peer, &*surface, &limits, &shutdown, tls).await;
            active.set(active.get() - 1);
        });
    }
    listening.stop();
    let deadline = Instant::now() + shared.config.shutdown_grace;
    while active.get() > 0 && Instant::now() < deadline {
        monoio::time::sleep(Duration::from_millis(10)).await;
    }
    if active.get() > 0 {
        warn!(
            open = active.get(),
            "shutdown grace over; dropping connections"
        );
    }
}
