//! What a tower worker is started with, and the checks made before anything starts: a worker
//! that could never register (a malformed namespace or URL, no credential) fails at once.

use std::path::PathBuf;
use std::time::Duration;

use http::Uri;
use pinboard_protocol::worker::control::{Registration, check_identity};

#[derive(Clone, Debug)]
pub struct Config {
    /// The registry's base URL: the node's address plus its `base_path`
    /// (`http://127.0.0.1:8080`, `http://pinboard.internal/edge`). `/registry/...` is appended.
    pub registry: String,
    /// The Passport credential (`pinboard:worker` scope) sent as `Authorization: Bearer`;
    /// empty with [`token_file`](Self::token_file).
    pub token: String,
    /// A file holding the credential instead, read at start and again before a registry call
    /// whenever it changed (a Kubernetes projected token, a Vault agent's sink). Set either
    /// this or `token`, not both.
    pub token_file: Option<PathBuf>,
    pub client_id: String,
    /// Namespaces to register, each `/` plus one path segment.
    pub namespaces: Vec<String>,
    /// The URL Pinboard reaches the service at: where the server the layer wraps listens
    /// (`http://10.0.0.7:3000`). A path in it is put before every path Pinboard sends.
    pub advertise_url: String,
    /// Capacity announced at registration and on every heartbeat.
    pub headroom: u64,
    /// Hostname-aware mode's fields (each sent only when set), and whether to stop when the
    /// registry refuses the credential (401/403) past the lease (default true: the
    /// application is told, [`Event::CredentialRefused`], and should exit non-zero).
    ///
    /// [`Event::CredentialRefused`]: crate::Event::CredentialRefused
    pub registration: Registration,
    /// Deadline of each registry call. Registration includes Pinboard's probe of the service.
    pub call_timeout: Duration,
    /// Instances expected at once, to size the held map up front (default 0: grown as needed).
    pub expected_instances: usize,
}

impl Config {
    /// A single-mode configuration with defaults for the rest: headroom 100, 10 s calls.
    pub fn new(
        registry: &str,
        token: &str,
        client_id: &str,
        namespaces: &[&str],
        advertise_url: &str,
    ) -> Config {
        Config {
            registry: registry.to_owned(),
            token: token.to_owned(),
            token_file: None,
            client_id: client_id.to_owned(),
            namespaces: namespaces.iter().map(|ns| ns.to_string()).collect(),
            advertise_url: advertise_url.to_owned(),
            headroom: 100,
            registration: Registration::default(),
            call_timeout: Duration::from_secs(10),
            expected_instances: 0,
        }
    }

    /// The registry's base (scheme, authority and path without a trailing `/`) and the
    /// advertise URL's path, or why the configuration cannot work.
    pub(crate) fn validate(&self) -> Result<(Uri, String), String> {
        let registry = plain_http(&self.registry).ok_or_else(|| {
            format!(
                "registry URL {:?} is not an http URL with a host",
                self.registry
            )
        })?;
        let advertised = plain_http(&self.advertise_url).ok_or_else(|| {
            format!(
                "advertise URL {:?} is not an http URL with a host",
                self.advertise_url
            )
        })?;
        if advertised.query().is_some() || self.advertise_url.contains('#') {
            return Err("advertise URL must not carry a query or fragment".into());
        }
        check_identity(&self.client_id, &self.namespaces, &self.registration.envs)?;
        let base = advertised.path().trim_end_matches('/').to_owned();
        Ok((registry, base))
    }
}

/// `url` as an `http` URI with a host and no userinfo. TLS to the registry and from the node is
/// the server's and a front's business here: the layer's registry client speaks plain HTTP.
fn plain_http(url: &str) -> Option<Uri> {
    let uri: Uri = url.parse().ok()?;
    let authority = uri.authority()?;
    (uri.scheme_str() == Some("http")
        && !authority.host().is_empty()
        && !authority.as_str().contains('@'))
    .then_some(uri)
}

#[cfg(test)]
mod tests {
    use super::*;

    type Change = fn(&mut Config);

    #[test]
    fn refuses_what_could_never_register() {
        let good = Config::new(
            "http://127.0.0.1:8080/edge",
            "t",
            "c",
            &["/threads"],
            "http://127.0.0.1:3000/w/",
        );
        let (registry, base) = good.validate().unwrap();
        assert_eq!((registry.path(), base.as_str()), ("/edge", "/w"));
        let cases: [(Change, &str); 7] = [
            (|c| c.registry = "127.0.0.1:8080".into(), "registry URL"),
            (|c| c.registry = "https://pinboard".into(), "registry URL"),
            (
                |c| c.advertise_url = "http://u:p@h:1".into(),
                "advertise URL",
            ),
            (|c| c.advertise_url = "http://h:1/?q".into(), "query"),
            (
                |c| c.namespaces = vec!["threads".into()],
                "namespace \"threads\"",
            ),
            (|c| c.namespaces.clear(), "no namespaces"),
            (|c| c.client_id.clear(), "client id"),
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
