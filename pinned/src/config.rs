//! What a worker is started with, and the checks made before anything starts: a worker that
//! could never register (a malformed namespace or URL) fails at once instead of retrying
//! forever.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use pinboard_http::{DriverKind, WorkerAddr};

pub use pinboard_protocol::worker::control::Registration;
use pinboard_protocol::worker::control::check_identity;

use crate::durable::DurabilityStore;

/// Hostname-aware mode's policy when another hostname's worker holds an instance this
/// worker's hostname asks for (spec "Placement"): the protocol's own type, the registry's too.
pub use pinboard_protocol::Takeover;

#[derive(Clone, Debug)]
pub struct Config {
    /// The registry's base URL: the node's address plus its `base_path`
    /// (`http://127.0.0.1:8080`, `https://pinboard.internal/edge`). `/registry/...` is appended.
    /// An `https` registry is called over TLS, its certificate verified against the system
    /// roots plus [`registry_ca_file`](Self::registry_ca_file).
    pub registry: String,
    /// A PEM file of CA certificates trusted, besides the system roots (`/etc/ssl/certs`), when
    /// verifying an `https` registry's certificate.
    pub registry_ca_file: Option<PathBuf>,
    /// The Passport credential sent as `Authorization: Bearer`; empty with
    /// [`token_file`](Self::token_file).
    pub token: String,
    /// A file holding the credential instead (one token; surrounding whitespace ignored),
    /// read at start and again before a registry call whenever it changed: a rotated token
    /// (a Kubernetes projected token, a Vault agent's sink) is used without a restart. While
    /// it cannot be read the token last read is kept. Set either this or `token`, not both.
    pub token_file: Option<PathBuf>,
    pub client_id: String,
    /// Namespaces to register, each `/` plus one path segment.
    pub namespaces: Vec<String>,
    /// Where to listen; port 0 lets the kernel pick.
    pub listen: SocketAddr,
    /// The URL Pinboard reaches this worker at. Default: `http://` (`https://` with
    /// [`tls_cert_file`](Self::tls_cert_file)) + the bound address (loopback in place of an
    /// unspecified address). It is `https` exactly when the worker serves TLS.
    pub advertise_url: Option<String>,
    /// With [`tls_key_file`](Self::tls_key_file): the listener speaks HTTPS (TLS 1.2 and 1.3,
    /// ALPN `http/1.1`) with this PEM certificate chain, leaf first. Pinboard verifies it
    /// against the system roots plus its `forwards.ca_file`, for the advertise URL's host (a
    /// name, or an IP literal as an IP address of the certificate).
    pub tls_cert_file: Option<PathBuf>,
    /// The certificate's private key (PEM: PKCS#8, RSA or EC); set with `tls_cert_file`.
    pub tls_key_file: Option<PathBuf>,
    /// Capacity announced at registration and on every heartbeat; see
    /// [`Handle::set_headroom`](crate::Handle::set_headroom).
    pub headroom: u64,
    /// Hostname-aware mode's fields (each sent only when set), and whether to stop when the
    /// registry refuses the credential past the lease (default true; see
    /// [`Registration::stop_on_refused_credential`]).
    pub registration: Registration,
    /// Event-loop threads serving the listener (each with its own `SO_REUSEPORT` socket).
    pub threads: usize,
    /// `Auto`: io_uring, or epoll where the kernel does not offer it.
    pub driver: DriverKind,
    /// Deadline of each registry call. Registration includes Pinboard's probe of this worker.
    pub call_timeout: Duration,
    /// On shutdown, how long in-flight requests may take once the listener closed.
    pub shutdown_grace: Duration,
    /// How many instances the worker expects to hold at once, to size its map of held
    /// instances up front. Default 0: the map grows as instances are activated. It is split
    /// into 64 shards, each growing on its own, so a growth only ever holds up the requests
    /// to one shard's instances. Sized for the peak, it does not grow at all until then; the
    /// cost is 95–190 bytes per expected instance allocated at start (tables round up to a
    /// power of two).
    pub expected_instances: usize,
    /// Where durable instances keep their state (contract §7). With a store the worker serves
    /// `POST /{ns}/{id}/_wake` (hydrating the instance through [`App::on_wake`]) and
    /// [`Handle::schedule_wake`] works; without one, `_wake` is not found.
    ///
    /// [`App::on_wake`]: crate::App::on_wake
    /// [`Handle::schedule_wake`]: crate::Handle::schedule_wake
    pub durability: Option<Arc<dyn DurabilityStore>>,
    /// How long a `_wake` waits for [`App::on_wake`](crate::App::on_wake) before answering 202
    /// (`activating`) and letting the hook finish in the background. Default 1 s.
    pub wake_wait: Duration,
}

impl Config {
    /// A single-mode configuration with defaults for the rest: listening on an ephemeral
    /// loopback port, headroom 100, one serving thread.
    pub fn new(registry: &str, token: &str, client_id: &str, namespaces: &[&str]) -> Config {
        Config {
            registry: registry.to_owned(),
            registry_ca_file: None,
            token: token.to_owned(),
            token_file: None,
            client_id: client_id.to_owned(),
            namespaces: namespaces.iter().map(|ns| ns.to_string()).collect(),
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            advertise_url: None,
            tls_cert_file: None,
            tls_key_file: None,
            headroom: 100,
            registration: Registration::default(),
            threads: 1,
            driver: DriverKind::Auto,
            call_timeout: Duration::from_secs(10),
            shutdown_grace: Duration::from_secs(10),
            expected_instances: 0,
            durability: None,
            wake_wait: Duration::from_secs(1),
        }
    }

    /// The registry address, or why the configuration cannot work.
    pub(crate) fn validate(&self) -> Result<WorkerAddr, String> {
        let registry = WorkerAddr::parse(&self.registry).map_err(|_| {
            format!(
                "registry URL {:?} is not an http or https URL with a host",
                self.registry
            )
        })?;
        check_identity(&self.client_id, &self.namespaces, &self.registration.envs)?;
        if self.tls_cert_file.is_some() != self.tls_key_file.is_some() {
            return Err("tls_cert_file and tls_key_file are set together or not at all".into());
        }
        if let Some(url) = &self.advertise_url {
            let addr = WorkerAddr::parse(url).map_err(|rule| format!("{rule}: {url:?}"))?;
            match (addr.tls, self.serves_tls()) {
                (true, false) => {
                    return Err(
                        "this worker serves plain HTTP: an https advertise URL needs \
                         tls_cert_file and tls_key_file"
                            .into(),
                    );
                }
                (false, true) => {
                    return Err(
                        "this worker serves HTTPS (tls_cert_file): its advertise URL must be https"
                            .into(),
                    );
                }
                _ => {}
            }
        }
        if self.threads == 0 {
            return Err("threads must be at least 1".into());
        }
        Ok(registry)
    }
}

impl Config {
    /// Whether the listener speaks TLS.
    pub(crate) fn serves_tls(&self) -> bool {
        self.tls_cert_file.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Change = fn(&mut Config);

    #[test]
    fn refuses_what_could_never_register() {
        let good = Config::new("http://127.0.0.1:8080/edge", "t", "c", &["/threads"]);
        assert_eq!(good.validate().unwrap().base, "/edge");
        let mut https = good.clone();
        https.registry = "https://pinboard.internal/edge".into();
        assert!(https.validate().unwrap().tls);
        let cases: [(Change, &str); 10] = [
            (|c| c.registry = "127.0.0.1:8080".into(), "registry URL"),
            (|c| c.registry = "ftp://pinboard".into(), "registry URL"),
            (
                |c| c.tls_cert_file = Some("cert.pem".into()),
                "tls_cert_file and tls_key_file",
            ),
            (
                |c| c.advertise_url = Some("https://w:1".into()),
                "needs tls_cert_file",
            ),
            (
                |c| {
                    c.tls_cert_file = Some("cert.pem".into());
                    c.tls_key_file = Some("key.pem".into());
                    c.advertise_url = Some("http://w:1".into());
                },
                "must be https",
            ),
            (
                |c| c.namespaces = vec!["threads".into()],
                "namespace \"threads\"",
            ),
            (|c| c.namespaces = vec!["/a/b".into()], "namespace \"/a/b\""),
            (|c| c.namespaces.clear(), "no namespaces"),
            (
                |c| drop(c.registration.envs.insert("/docs".into(), "e".into())),
                "envs names /docs",
            ),
            (
                |c| c.advertise_url = Some("http://u:p@h:1".into()),
                "userinfo",
            ),
        ];
        for (change, message) in cases {
            let mut config = good.clone();
            change(&mut config);
            let error = config.validate().unwrap_err();
            assert!(
                error.contains(message),
                "{error:?} should mention {message:?}"
            );
        }
    }
}
