//! A TLS terminator in front of a plain test worker: it accepts TLS on a loopback port with a
//! certificate pair (`pinboard_http::tls::ServerTls`, the node's own listener code), and relays
//! each connection's bytes to and from the worker's port, passing an end of stream on either
//! side on as a half-close of the other. So a [`TestWorker`](super::worker::TestWorker) is
//! reached as an `https` worker, every way it can misbehave included.

use std::cell::Cell;
use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use monoio::buf::IoBuf;
use monoio::io::{AsyncReadRent, AsyncWriteRent, AsyncWriteRentExt, Splitable};
use pinboard_http::tls::ServerTls;

pub struct TlsFront {
    pub addr: SocketAddr,
    stop: Arc<AtomicBool>,
    handshakes: Arc<AtomicUsize>,
    thread: Option<JoinHandle<()>>,
}

impl TlsFront {
    /// A front on a port the kernel picks, relaying to `backend`.
    pub fn start(backend: SocketAddr, cert: &Path, key: &Path) -> TlsFront {
        TlsFront::on(SocketAddr::from(([127, 0, 0, 1], 0)), backend, cert, key)
    }

    /// A front on `addr` (a port a stopped front had, say), relaying to `backend`.
    pub fn on(addr: SocketAddr, backend: SocketAddr, cert: &Path, key: &Path) -> TlsFront {
        let tls = ServerTls::load(cert, key, false).expect("the front's certificate pair loads");
        let listener = TcpListener::bind(addr).unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let handshakes = Arc::new(AtomicUsize::new(0));
        let (halt, shaken) = (stop.clone(), handshakes.clone());
        let thread = std::thread::spawn(move || {
            monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
                .enable_timer()
                .build()
                .unwrap()
                .block_on(serve(listener, Arc::new(tls), backend, halt, shaken));
        });
        TlsFront {
            addr,
            stop,
            handshakes,
            thread: Some(thread),
        }
    }

    /// The worker's `https` URL by its IP address (the certificate must name 127.0.0.1).
    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.addr.port())
    }

    /// The same by the name `localhost`.
    pub fn url_by_name(&self) -> String {
        format!("https://localhost:{}", self.addr.port())
    }

    /// TLS handshakes completed so far: the connections the node opened.
    pub fn handshakes(&self) -> usize {
        self.handshakes.load(Ordering::SeqCst)
    }

    /// Stops accepting and closes every relayed connection; the port is free again after.
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = std::net::TcpStream::connect(self.addr);
        if let Some(thread) = self.thread.take() {
            thread.join().unwrap();
        }
    }
}

impl Drop for TlsFront {
    fn drop(&mut self) {
        self.stop();
    }
}

async fn serve(
    listener: TcpListener,
    tls: Arc<ServerTls>,
    backend: SocketAddr,
    stop: Arc<AtomicBool>,
    handshakes: Arc<AtomicUsize>,
) {
    let listener = monoio::net::TcpListener::from_std(listener).unwrap();
    let open = Rc::new(Cell::new(0usize));
    while let Ok((tcp, _)) = listener.accept().await {
        if stop.load(Ordering::SeqCst) {
            break;
        }
        let (tls, handshakes, stop, open) =
            (tls.clone(), handshakes.clone(), stop.clone(), open.clone());
        open.set(open.get() + 1);
        monoio::spawn(async move {
            monoio::select! {
                () = relay(tcp, &tls, backend, &handshakes) => {}
                () = stopped(&stop) => {}
            }
            open.set(open.get() - 1);
        });
    }
    // A dropped runtime does not close the sockets of tasks still pending: every relay ends
    // (its sockets closed) before the thread does.
    drop(listener);
    while open.get() > 0 {
        monoio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn stopped(stop: &AtomicBool) {
    while !stop.load(Ordering::SeqCst) {
        monoio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn relay(
    tcp: monoio::net::TcpStream,
    tls: &ServerTls,
    backend: SocketAddr,
    handshakes: &AtomicUsize,
) {
    let Ok(client) = tls.accept(tcp).await else {
        return;
    };
    handshakes.fetch_add(1, Ordering::SeqCst);
    let Ok(worker) = monoio::net::TcpStream::connect_addr(backend).await else {
        return;
    };
    let (mut client_read, mut client_write) = client.into_split();
    let (mut worker_read, mut worker_write) = worker.into_split();
    monoio::join!(
        pipe(&mut client_read, &mut worker_write),
        pipe(&mut worker_read, &mut client_write)
    );
}

/// Copies until `from` ends (or fails), then half-closes `to` (over TLS: `close_notify`, FIN).
async fn pipe<R: AsyncReadRent, W: AsyncWriteRent>(from: &mut R, to: &mut W) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let (read, back) = from.read(buf).await;
        buf = back;
        let n = match read {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let (written, back) = to.write_all(buf.slice(..n)).await;
        buf = back.into_inner();
        if written.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}
