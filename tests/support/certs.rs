//! Certificates made for a test, written as PEM files in a temporary directory: a CA, leaves it
//! signed, and self-signed ones nobody trusts. Keys are ECDSA P-256 (rcgen's default).

use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};

/// The names a test's server is reached by: a leaf for these verifies on loopback either way.
pub const LOCAL: [&str; 2] = ["localhost", "127.0.0.1"];

/// A certificate chain file and its key file.
#[derive(Clone, Debug)]
pub struct Pair {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl Pair {
    pub fn cert_str(&self) -> &str {
        self.cert.to_str().expect("a UTF-8 temp path")
    }

    pub fn key_str(&self) -> &str {
        self.key.to_str().expect("a UTF-8 temp path")
    }
}

/// A test's own certificate authority, and the directory its files are written to.
pub struct Ca {
    dir: tempfile::TempDir,
    issuer: Issuer<'static, KeyPair>,
    /// The CA certificate (what `forwards.ca_file` or `registry_ca_file` names).
    pub cert: PathBuf,
}

impl Ca {
    pub fn new() -> Ca {
        let dir = tempfile::tempdir().unwrap();
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "pinboard test CA");
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let cert = params.self_signed(&key).unwrap();
        let path = dir.path().join("ca.pem");
        std::fs::write(&path, cert.pem()).unwrap();
        Ca {
            dir,
            issuer: Issuer::new(params, key),
            cert: path,
        }
    }

    pub fn cert_str(&self) -> &str {
        self.cert.to_str().expect("a UTF-8 temp path")
    }

    /// A leaf for `names` (host names, or IP literals as IP addresses) signed by this CA,
    /// written as `{label}.pem` and `{label}.key`.
    pub fn leaf(&self, label: &str, names: &[&str]) -> Pair {
        let key = KeyPair::generate().unwrap();
        let params = leaf_params(label, names);
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        write_pair(self.dir.path(), label, &cert.pem(), &key.serialize_pem())
    }

    /// A self-signed leaf for `names`, which no CA vouches for.
    pub fn untrusted(&self, label: &str, names: &[&str]) -> Pair {
        let key = KeyPair::generate().unwrap();
        let cert = leaf_params(label, names).self_signed(&key).unwrap();
        write_pair(self.dir.path(), label, &cert.pem(), &key.serialize_pem())
    }

    /// A path in this CA's directory, for a test's own files.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

impl Default for Ca {
    fn default() -> Ca {
        Ca::new()
    }
}

fn leaf_params(label: &str, names: &[&str]) -> CertificateParams {
    let mut params =
        CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).unwrap();
    params.distinguished_name.push(DnType::CommonName, label);
    params
}

fn write_pair(dir: &Path, label: &str, cert: &str, key: &str) -> Pair {
    let pair = Pair {
        cert: dir.join(format!("{label}.pem")),
        key: dir.join(format!("{label}.key")),
    };
    std::fs::write(&pair.cert, cert).unwrap();
    std::fs::write(&pair.key, key).unwrap();
    pair
}
