//! TLS clients for tests: blocking rustls sessions that trust a test's own CA
//! ([`super::certs`]), and the test's [`Client`] over one.

use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore, StreamOwned};

use super::certs::{Ca, Pair};
use super::http::Client;

/// A client configuration that trusts `ca` only, offering ALPN `http/1.1`.
pub fn client_config(ca: &Ca) -> Arc<ClientConfig> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(&ca.cert).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let mut config =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(config)
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
