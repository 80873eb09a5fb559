//! The top of a worker: [`Worker`] starts it (validating its configuration, binding, spawning
//! the serving and control threads) and stops it; its [`Handle`] is the application's while it
//! runs.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;

use pinboard_http::WorkerAddr;
use pinboard_http::tls::{Alpn, ClientTls, PemFile, ServerTls};

use crate::app::App;
use crate::config::Config;
use crate::handle::Handle;
use crate::registry::Registry;
use crate::runtime::{bind, choose_driver, spawn_control, spawn_serving};
use crate::state::Shared;
use pinboard_protocol::worker::credential::Credential;

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("invalid worker configuration: {0}")]
    Config(String),
    #[error("cannot start the worker: {0}")]
    Io(#[from] std::io::Error),
}

/// A running worker. [`shutdown`](Worker::shutdown) stops it gracefully; dropping it stops it
/// at once, without releasing or deregistering (the registry then lets the lease lapse).
pub struct Worker {
    handle: Handle,
    threads: Vec<JoinHandle<()>>,
}

impl Worker {
    /// Binds the listener, then starts the serving threads and the control thread, which
    /// registers in the background. Returns once the listener is bound, so Pinboard's probe
    /// of the first registration finds it.
    pub fn start<A: App>(config: Config, app: A) -> Result<Worker, StartError> {
        let registry = config.validate().map_err(StartError::Config)?;
        let driver = choose_driver(config.driver).map_err(StartError::Config)?;
        let (listener_tls, registry_tls) = load_tls(&config)?;
        let listeners = bind(config.listen, config.threads)?;
        let local_addr = listeners[0].local_addr()?;
        let advertise_url = config
            .advertise_url
            .clone()
            .unwrap_or_else(|| default_advertise_url(local_addr, listener_tls.is_some()));
        let base = WorkerAddr::parse(&advertise_url)
            .map_err(|rule| StartError::Config(rule.to_owned()))?
            .base;
        let credential = Credential::new(&config.token, config.token_file.as_deref())
            .map_err(StartError::Config)?;
        let registry = Registry::new(registry, registry_tls, credential, config.call_timeout);
        let shared = Arc::new(Shared::new(
            config,
            registry,
            advertise_url,
            base,
            local_addr,
            driver,
        ));
        let app = Arc::new(app);
        // On a failure, the threads already started end with the serving stop.
        let spawned =
            spawn_serving(&shared, &app, listeners, listener_tls).and_then(|mut threads| {
                threads.push(spawn_control(&shared, &app)?);
                Ok(threads)
            });
        let threads = spawned.inspect_err(|_| shared.serving_stop.fire())?;
        Ok(Worker {
            handle: Handle::new(shared),
            threads,
        })
    }

    pub fn handle(&self) -> &Handle {
        &self.handle
    }

    /// Stops gracefully: refuses new activations, releases every held instance, deregisters
    /// (each call given up after three tries), then closes the listener and lets in-flight
    /// requests finish within the configured grace. Returns once every thread has ended.
    pub fn shutdown(mut self) {
        self.stop(true);
    }

    fn stop(&mut self, graceful: bool) {
        let shared = &self.handle.shared;
        if !shared.stop.is_fired() {
            shared.graceful.store(graceful, Ordering::SeqCst);
            shared.stop.fire();
        }
        for thread in self.threads.drain(..) {
            // A panicking thread has already reported itself through the panic hook.
            let _ = thread.join();
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.stop(false);
    }
}

/// The listener's certificate pair when it serves TLS, and the trust the registry's certificate
/// is verified with (the system roots plus `registry_ca_file`). An error names the setting.
fn load_tls(config: &Config) -> Result<(Option<Arc<ServerTls>>, ClientTls), StartError> {
    let listener = match (&config.tls_cert_file, &config.tls_key_file) {
        (Some(cert), Some(key)) => Some(Arc::new(ServerTls::load(cert, key, false).map_err(
            |e| {
                let setting = match e.file {
                    PemFile::Key => "tls_key_file",
                    _ => "tls_cert_file",
                };
                StartError::Config(format!("{setting}: {e}"))
            },
        )?)),
        _ => None,
    };
    let registry = ClientTls::new(config.registry_ca_file.as_deref(), Alpn::Http1)
        .map_err(|e| StartError::Config(format!("registry_ca_file: {e}")))?;
    Ok((listener, registry))
}

/// `http://` (`https://` when the listener serves TLS) + the bound address, with loopback in
/// place of an unspecified address (which Pinboard could not connect to).
fn default_advertise_url(addr: SocketAddr, tls: bool) -> String {
    let ip = match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    let scheme = if tls { "https" } else { "http" };
    format!("{scheme}://{}", SocketAddr::new(ip, addr.port()))
}
