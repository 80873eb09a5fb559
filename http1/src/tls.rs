//! TLS from PEM files, for both ends: a listener's certificate chain and key ([`ServerTls`],
//! reloadable while connections stay up) and the trust a client verifies its peer with
//! ([`ClientTls`]: the system roots plus an operator's CA file), and the two handshakes that
//! turn an accepted or connected `TcpStream` into a [`Transport`]. No sockets are opened here.
//! PEM files are read only when regular files ([`open_regular_file`]).
//!
//! rustls 0.23 with the ring provider, driven on monoio by monoio-rustls; TLS 1.2 and 1.3.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arc_swap::ArcSwap;
use monoio::net::TcpStream;
use monoio_rustls::{TlsAcceptor, TlsConnector};
use rustls::crypto::CryptoProvider;
use rustls::server::ProducesTickets;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};

use crate::transport::Transport;

/// The one ALPN protocol either end offers.
const HTTP_1_1: &[u8] = b"http/1.1";

/// Which of the PEM files a setup error is about, so a caller can name its own setting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PemFile {
    Certificate,
    Key,
    CaBundle,
}

#[derive(Debug)]
pub struct TlsSetupError {
    pub file: PemFile,
    pub reason: String,
}

impl fmt::Display for TlsSetupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reason)
    }
}

impl std::error::Error for TlsSetupError {}

fn fail(file: PemFile, reason: impl Into<String>) -> TlsSetupError {
    TlsSetupError {
        file,
        reason: reason.into(),
    }
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A listener's TLS: the certificate pair it was started with or last reloaded, swapped
/// without a lock on the accept path. Connections keep the configuration they shook hands
/// with; a reload changes only what later handshakes present.
pub struct ServerTls {
    cert: PathBuf,
    key: PathBuf,
    /// Kept across reloads so a ticket issued before one still resumes after it.
    ticketer: Arc<dyn ProducesTickets>,
    /// Whether ALPN offers `h2` (before `http/1.1`).
    h2: bool,
    current: ArcSwap<ServerConfig>,
}

impl ServerTls {
    /// The listener's TLS from a certificate chain and its key; ALPN offers `h2` first when
    /// `h2`, and `http/1.1`.
    pub fn load(cert: &Path, key: &Path, h2: bool) -> Result<ServerTls, TlsSetupError> {
        let ticketer = rustls::crypto::ring::Ticketer::new()
            .map_err(|e| fail(PemFile::Key, format!("no session ticketer: {e}")))?;
        let config = server_config(cert, key, &ticketer, h2)?;
        Ok(ServerTls {
            cert: cert.to_owned(),
            key: key.to_owned(),
            ticketer,
            h2,
            current: ArcSwap::from_pointee(config),
        })
    }

    /// Reads the pair again from the same paths, for [`ServerTls::present`]. Blocking (file
    /// IO): off any event loop, and bounded by the caller (a file on a hung mount).
    pub fn read_again(&self) -> Result<LoadedPair, TlsSetupError> {
        server_config(&self.cert, &self.key, &self.ticketer, self.h2).map(LoadedPair)
    }

    /// Later handshakes present `pair`.
    pub fn present(&self, pair: LoadedPair) {
        self.current.store(Arc::new(pair.0));
    }

    /// The server side of the handshake on an accepted connection.
    pub async fn accept(&self, tcp: TcpStream) -> io::Result<Transport> {
        let acceptor = TlsAcceptor::from(self.current.load_full());
        let stream = acceptor.accept(tcp).await?;
        Ok(Transport::TlsServer(Box::new(stream)))
    }
}

/// A certificate pair read and checked, not yet presented.
pub struct LoadedPair(ServerConfig);

/// `path` opened for reading only when it is a regular file (after symlinks): a FIFO or a
/// device in place of a PEM file is an error naming it, never a read that blocks. Opened
/// non-blocking, so that opening a FIFO with no writer does not wait for one.
pub fn open_regular_file(path: &Path) -> io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    if file.metadata()?.is_file() {
        Ok(file)
    } else {
        Err(io::Error::other("not a regular file"))
    }
}

/// The bytes of a PEM file, named in the error.
fn read_pem(path: &Path, file: PemFile) -> Result<Vec<u8>, TlsSetupError> {
    let mut bytes = Vec::new();
    open_regular_file(path)
        .and_then(|mut opened| opened.read_to_end(&mut bytes))
        .map_err(|e| fail(file, format!("{}: {e}", path.display())))?;
    Ok(bytes)
}

fn server_config(
    cert: &Path,
    key: &Path,
    ticketer: &Arc<dyn ProducesTickets>,
    h2: bool,
) -> Result<ServerConfig, TlsSetupError> {
    let chain = certificates(cert, PemFile::Certificate)?;
    let key_der = PrivateKeyDer::from_pem_slice(&read_pem(key, PemFile::Key)?).map_err(|e| {
        fail(
            PemFile::Key,
            format!("{}: {}", key.display(), pem_reason(&e, "private key")),
        )
    })?;
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| fail(PemFile::Certificate, e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(chain, key_der)
        .map_err(|e| {
            fail(
                PemFile::Key,
                format!("{} does not go with {}: {e}", key.display(), cert.display()),
            )
        })?;
    config.alpn_protocols = if h2 {
        vec![b"h2".to_vec(), HTTP_1_1.to_vec()]
    } else {
        vec![HTTP_1_1.to_vec()]
    };
    config.ticketer = ticketer.clone();
    Ok(config)
}

/// Every certificate in a PEM file; none at all is an error.
fn certificates(path: &Path, file: PemFile) -> Result<Vec<CertificateDer<'static>>, TlsSetupError> {
    let chain = CertificateDer::pem_slice_iter(&read_pem(path, file)?)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| {
            fail(
                file,
                format!("{}: {}", path.display(), pem_reason(&e, "certificate")),
            )
        })?;
    if chain.is_empty() {
        return Err(fail(
            file,
            format!("{}: no PEM certificate in it", path.display()),
        ));
    }
    Ok(chain)
}

fn pem_reason(e: &rustls_pki_types::pem::Error, what: &str) -> String {
    match e {
        rustls_pki_types::pem::Error::NoItemsFound => format!("no PEM {what} in it"),
        other => format!("not a PEM {what}: {other:?}"),
    }
}

/// A client's TLS: whom it trusts and what it offers. Sessions are resumed (rustls' in-memory
/// cache), so a fresh connection to a worker seen before skips the full handshake.
#[derive(Clone)]
pub struct ClientTls {
    connector: TlsConnector,
}

/// What a client offers in ALPN.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Alpn {
    Http1,
    None,
}

impl ClientTls {
    /// Trusts the system roots plus every certificate in `extra_ca`.
    pub fn new(extra_ca: Option<&Path>, alpn: Alpn) -> Result<ClientTls, TlsSetupError> {
        let mut roots = RootCertStore::empty();
        // Certificates the system store holds but rustls cannot parse are skipped, as a
        // browser skips them; an operator's own CA file must parse whole.
        for cert in rustls_native_certs::load_native_certs().certs {
            let _ = roots.add(cert);
        }
        if let Some(path) = extra_ca {
            for cert in certificates(path, PemFile::CaBundle)? {
                roots.add(cert).map_err(|e| {
                    fail(
                        PemFile::CaBundle,
                        format!("{}: not a CA certificate: {e}", path.display()),
                    )
                })?;
            }
        }
        let mut config = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| fail(PemFile::CaBundle, e.to_string()))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        if alpn == Alpn::Http1 {
            config.alpn_protocols = vec![HTTP_1_1.to_vec()];
        }
        Ok(ClientTls {
            connector: TlsConnector::from(Arc::new(config)),
        })
    }

    /// The client side of the handshake to `host` (a name is sent as SNI and verified against
    /// the certificate; an IP literal is verified against its IP addresses). A `host` that is
    /// neither (see [`is_server_name`]) fails as `InvalidInput`.
    pub async fn connect(&self, tcp: TcpStream, host: &str) -> io::Result<Transport> {
        let name = ServerName::try_from(host.to_owned())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "not a TLS server name"))?;
        let fd = std::os::fd::AsRawFd::as_raw_fd(&tcp);
        let stream = self.connector.connect(name, tcp).await?;
        Ok(Transport::TlsClient(Box::new(stream), fd))
    }
}

/// Whether `host` is something a certificate can be verified against: a DNS name (at most 253
/// bytes, labels of letters, digits, `-` and `_`) or an IP literal (IPv6 without brackets).
pub fn is_server_name(host: &str) -> bool {
    ServerName::try_from(host).is_ok()
}

/// What kind of TLS failure an I/O error of a handshake or a TLS stream is, so a message can
/// say what to check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlsFailure {
    /// The peer's certificate did not verify (issuer, name, validity).
    Certificate,
    /// The peer's bytes were no TLS records: most likely it does not speak TLS at all.
    NotTls,
    /// Anything else TLS itself refused (a fatal alert from the peer, a protocol violation).
    Other,
}

/// The TLS failure `error` is (rustls' error inside it), or `None` when it is the connection
/// under TLS failing (reset, closed, timed out).
pub fn tls_failure(error: &io::Error) -> Option<TlsFailure> {
    let error = error.get_ref()?.downcast_ref::<rustls::Error>()?;
    Some(match error {
        rustls::Error::InvalidCertificate(_) => TlsFailure::Certificate,
        rustls::Error::InvalidMessage(_) => TlsFailure::NotTls,
        _ => TlsFailure::Other,
    })
}

#[cfg(test)]
mod tests {
    use super::open_regular_file;

    #[test]
    fn only_a_regular_file_opens_and_a_fifo_never_waits() {
        let dir = std::env::temp_dir().join(format!("pinboard-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (file, fifo) = (dir.join("key.pem"), dir.join("fifo.pem"));
        std::fs::write(&file, "pem").unwrap();
        let c_path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
        assert!(open_regular_file(&file).is_ok());
        for refused in [&fifo, &dir, std::path::Path::new("/dev/null")] {
            let e = open_regular_file(refused).unwrap_err();
            assert_eq!(e.to_string(), "not a regular file", "{}", refused.display());
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
