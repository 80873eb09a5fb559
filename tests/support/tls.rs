//! TLS for tests: a private CA and certificates it signs (made with rcgen when the test runs),
//! written as the PEM files a node or worker reads, and blocking rustls clients of the test's
//! [`Client`] kind that trust that CA.

use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore, StreamOwned};

use super::http::Client;

/// The names every leaf certificate here is valid for.
const NAMES: [&str; 2] = ["localhost", "127.0.0.1"];

pub struct Pki {
    dir: tempfile::TempDir,
    issuer: Issuer<'static, KeyPair>,
    ca: CertificateDer<'static>,
}

/// A certificate chain and its key, as files.
#[derive(Clone, Debug)]
pub struct Pair {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl Default for Pki {
    fn default() -> Pki {
        Pki::new()
    }
}

impl Pki {
    pub fn new() -> Pki {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "pinboard test CA");
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ca.pem"), cert.pem()).unwrap();
        Pki {
            dir,
            issuer: Issuer::new(params, key),
            ca: cert.der().clone(),
        }
    }

    /// The CA certificate's PEM file (what `forwards.ca_file` or `curl --cacert` takes).
    pub fn ca_file(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A new leaf for localhost and 127.0.0.1 signed by this CA, written to `name.crt` and
    /// `name.key` (overwriting: a reload test writes a second pair over the first).
    pub fn leaf(&self, name: &str, common_name: &str) -> Pair {
        self.leaf_for(name, common_name, &NAMES)
    }

    /// A new leaf signed by this CA for `names` only (DNS names, or IP addresses as text).
    pub fn leaf_for(&self, name: &str, common_name: &str, names: &[&str]) -> Pair {
        let (params, key) = leaf_params(common_name, names);
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        self.write(name, &cert.pem(), &key.serialize_pem())
    }

    /// A leaf that no CA here signed: verification must refuse it.
    pub fn self_signed(&self, name: &str) -> Pair {
        let (params, key) = leaf_params("untrusted", &NAMES);
        let cert = params.self_signed(&key).unwrap();
        self.write(name, &cert.pem(), &key.serialize_pem())
    }

    pub fn write(&self, name: &str, cert_pem: &str, key_pem: &str) -> Pair {
        let pair = Pair {
            cert: self.dir.path().join(format!("{name}.crt")),
            key: self.dir.path().join(format!("{name}.key")),
        };
        std::fs::write(&pair.cert, cert_pem).unwrap();
        std::fs::write(&pair.key, key_pem).unwrap();
        pair
    }

    /// A client configuration that trusts this CA only, offering ALPN `http/1.1`.
    pub fn client_config(&self) -> Arc<ClientConfig> {
        let mut roots = RootCertStore::empty();
        roots.add(self.ca.clone()).unwrap();
        let mut config =
            ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_root_certificates(roots)
                .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Arc::new(config)
    }
}

fn leaf_params(common_name: &str, names: &[&str]) -> (CertificateParams, KeyPair) {
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    let mut params = CertificateParams::new(names).unwrap();
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    (params, KeyPair::generate().unwrap())
}

/// A TLS session to `addr` for `localhost`, its handshake done, and the certificate the
/// server presented (leaf first).
pub fn session(
    addr: SocketAddr,
    config: &Arc<ClientConfig>,
) -> std::io::Result<(TcpStream, StreamOwned<ClientConnection, TcpStream>)> {
    let tcp = TcpStream::connect(addr)?;
    tcp.set_read_timeout(Some(std::time::Duration::from_secs(10)))?;
    let name = ServerName::try_from("localhost").unwrap();
    let conn = ClientConnection::new(config.clone(), name).map_err(std::io::Error::other)?;
    let mut stream = StreamOwned::new(conn, tcp.try_clone()?);
    while stream.conn.is_handshaking() {
        stream.conn.complete_io(&mut stream.sock)?;
    }
    Ok((tcp, stream))
}

/// Whether a session was shown the leaf certificate of `pair`.
pub fn presented(stream: &StreamOwned<ClientConnection, TcpStream>, pair: &Pair) -> bool {
    use rustls::pki_types::pem::PemObject;
    let leaf = CertificateDer::pem_file_iter(&pair.cert)
        .unwrap()
        .next()
        .unwrap()
        .unwrap();
    stream.conn.peer_certificates().unwrap()[0] == leaf
}

/// A test [`Client`] over a TLS session to `addr`.
pub fn connect(addr: SocketAddr, config: &Arc<ClientConfig>) -> Client {
    let (tcp, stream) = session(addr, config).expect("TLS handshake with the node");
    Client::over(tcp, Box::new(stream))
}
