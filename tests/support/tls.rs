//! TLS clients for tests: blocking rustls sessions that trust a test's own CA
//! ([`super::certs`]), and the test's [`Client`] over one; and a node serving HTTPS.

use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore, StreamOwned};

use super::certs::{Ca, LOCAL, Pair};
use super::fleet::{Fixture, SHARDS};
use super::http::{Client, Reply};
use super::node::{Node, eventually};
use super::redis::RedisServer;

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
    session_over(TcpStream::connect(addr)?, config)
}

/// [`session`] over a connection the caller made (from an address of its choosing, say).
pub fn session_over(
    tcp: TcpStream,
    config: &Arc<ClientConfig>,
) -> std::io::Result<(TcpStream, StreamOwned<ClientConnection, TcpStream>)> {
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

/// A private CA, a leaf for localhost it signed, and a node serving HTTPS with that pair
/// (plus `env`), ready, past its cold start.
pub fn https_node(env: &[(&str, &str)]) -> (Ca, Pair, Fixture) {
    let pki = Ca::new();
    let pair = pki.leaf("node", &LOCAL);
    let redis = RedisServer::start();
    let (cert, key) = (
        pair.cert.display().to_string(),
        pair.key.display().to_string(),
    );
    let shards = SHARDS.to_string();
    let mut env = env.to_vec();
    env.extend([
        ("PINBOARD_TLS__CERT_FILE", cert.as_str()),
        ("PINBOARD_TLS__KEY_FILE", key.as_str()),
        ("PINBOARD_SHARDS", shards.as_str()),
        ("PINBOARD_VERIFY_TIMEOUT_MS", "500"),
    ]);
    let node = Node::spawn(&redis.url(), &env);
    let config = client_config(&pki);
    let ready = eventually(Duration::from_secs(20), || {
        (0..6).all(|_| {
            session(node.addr, &config).is_ok()
                && get(node.addr, &config, "/readyz", None).status == 200
        })
    });
    assert!(ready, "never ready over TLS:\n{}", node.log());
    let f = Fixture {
        token: node.worker_token("acct-a"),
        keys: super::keys(SHARDS),
        redis,
        node,
    };
    f.warm();
    (pki, pair, f)
}

/// One GET over a fresh TLS connection.
pub fn get(addr: SocketAddr, config: &Arc<ClientConfig>, path: &str, token: Option<&str>) -> Reply {
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    connect(addr, config)
        .request(format!("GET {path} HTTP/1.1\r\nHost: t\r\n{auth}\r\n").as_bytes())
}
