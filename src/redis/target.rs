//! Where Redis lives: the parsed form of the `redis_url` setting.
//!
//! - `redis://[[user]:password@]host:port[/db]` names one server;
//! - `redis-cluster://[[user]:password@]host:port[,host:port…]` names seed nodes of a Redis
//!   Cluster (every node, seeds and the masters found later, is logged in the same way);
//! - `rediss://…` and `rediss-cluster://…`, the same forms, speak TLS to every one of those
//!   servers (the client verifies each against the host written here or found in the cluster,
//!   see `login`).
//!
//! `user:password@` logs in with `AUTH user password` (a Redis 6+ ACL user); `:password@` with
//! `AUTH password`, Redis's `default` user (`requirepass`). The credentials end at the last `@`
//! and the user at the first `:`, and both may carry `%XX` escapes (RFC 3986 percent-encoding):
//! a user with `:` or `@` in it, or a password with `%` in it, must be written escaped
//! (`%3A`, `%40`, `%25`). A `%` not followed by two hex digits is refused.
//!
//! Parsing is strict so that a typo stops startup with a message naming the key instead of
//! surfacing later as a connection error on every core; no message ever quotes the
//! credentials. [`RedisTarget::masked`] is the form for logs and `check-config`: the password
//! as `***`, the user shown.
//!
//! The credentials and the TLS flag sit on both forms alike.

use std::fmt;

use pinboard_http::tls::is_server_name;

/// A `host:port` pair as written by the operator (host may be a name or an IP).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    pub host: String,
    pub port: u16,
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// Who a connection logs in as, percent-decoded.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// `None`: the password-only form, `AUTH password` (the `default` user).
    pub user: Option<String>,
    /// Never empty.
    pub password: String,
}

/// Shows the user, never the password: a target printed with `{:?}` (a test failure, a debug
/// log) must not leak it.
impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("user", &self.user)
            .field("password", &"***")
            .finish()
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RedisTarget {
    Single {
        endpoint: Endpoint,
        credentials: Option<Credentials>,
        db: u32,
        /// `rediss://`: the connection speaks TLS.
        tls: bool,
    },
    Cluster {
        seeds: Vec<Endpoint>,
        credentials: Option<Credentials>,
        /// `rediss-cluster://`: every node's connection speaks TLS.
        tls: bool,
    },
}

const FORMS: &str = "expected redis[s]://[[user]:password@]host:port[/db] or \
                     redis[s]-cluster://[[user]:password@]host:port[,host:port…]";

/// The schemes: (prefix, cluster, tls).
const SCHEMES: [(&str, bool, bool); 4] = [
    ("redis://", false, false),
    ("rediss://", false, true),
    ("redis-cluster://", true, false),
    ("rediss-cluster://", true, true),
];

impl RedisTarget {
    pub fn parse(url: &str) -> Result<RedisTarget, String> {
        let Some((cluster, tls, rest)) = SCHEMES
            .iter()
            .find_map(|(scheme, cluster, tls)| Some((*cluster, *tls, url.strip_prefix(scheme)?)))
        else {
            return Err(FORMS.into());
        };
        // Everything up to the last `@` is the credentials: the endpoints cannot hold one.
        let (credentials, rest) = match rest.rsplit_once('@') {
            Some((auth, rest)) => (Some(Credentials::parse(auth)?), rest),
            None => (None, rest),
        };
        let endpoint = |text: &str| {
            let endpoint = parse_endpoint(text)?;
            if tls && !is_server_name(&endpoint.host) {
                return Err(format!(
                    "{text:?}: over TLS the host must be a DNS name or an IP address, \
                     which the server's certificate is verified against"
                ));
            }
            Ok(endpoint)
        };
        if cluster {
            let seeds = rest
                .split(',')
                .map(endpoint)
                .collect::<Result<Vec<_>, _>>()?;
            return Ok(RedisTarget::Cluster {
                seeds,
                credentials,
                tls,
            });
        }
        let (hostport, db) = match rest.split_once('/') {
            None => (rest, 0),
            Some((hp, "")) => (hp, 0),
            Some((hp, db)) => (
                hp,
                db.parse::<u32>()
                    .map_err(|_| format!("database {db:?} is not a number"))?,
            ),
        };
        Ok(RedisTarget::Single {
            endpoint: endpoint(hostport)?,
            credentials,
            db,
            tls,
        })
    }

    /// Whether every connection speaks TLS (`rediss://`, `rediss-cluster://`).
    pub fn tls(&self) -> bool {
        match self {
            RedisTarget::Single { tls, .. } | RedisTarget::Cluster { tls, .. } => *tls,
        }
    }

    /// What every connection logs in with, if anything.
    pub fn credentials(&self) -> Option<&Credentials> {
        match self {
            RedisTarget::Single { credentials, .. } | RedisTarget::Cluster { credentials, .. } => {
                credentials.as_ref()
            }
        }
    }

    /// The URL with any password replaced by `***` (the user kept, escaped as needed), for logs
    /// and `check-config`. It parses back to this target with `***` for the password.
    pub fn masked(&self) -> String {
        let auth = match self.credentials() {
            None => String::new(),
            Some(c) => format!("{}:***@", c.user.as_deref().map(escape).unwrap_or_default()),
        };
        let s = if self.tls() { "s" } else { "" };
        match self {
            RedisTarget::Single { endpoint, db, .. } => {
                format!("redis{s}://{auth}{endpoint}/{db}")
            }
            RedisTarget::Cluster { seeds, .. } => {
                let seeds: Vec<String> = seeds.iter().map(|s| s.to_string()).collect();
                format!("redis{s}-cluster://{auth}{}", seeds.join(","))
            }
        }
    }
}

impl Credentials {
    /// `[user]:password`, as written before the `@`. The messages name the part at fault and
    /// never quote it.
    fn parse(auth: &str) -> Result<Credentials, String> {
        let Some((user, password)) = auth.split_once(':') else {
            return Err("credentials must be written user:password@ or :password@ \
                        (a user alone cannot log in)"
                .into());
        };
        let user = match user {
            "" => None,
            user => Some(unescape(user, "user")?),
        };
        let password = unescape(password, "password")?;
        if password.is_empty() {
            return Err(
                "the password is empty (leave the credentials out for a server \
                        without one)"
                    .into(),
            );
        }
        Ok(Credentials { user, password })
    }
}

/// Decodes the `%XX` escapes of `text`, the credentials' `part` (named in a refusal).
fn unescape(text: &str, part: &str) -> Result<String, String> {
    if !text.contains('%') {
        return Ok(text.to_owned());
    }
    let mut bytes = text.bytes();
    let mut out = Vec::with_capacity(text.len());
    while let Some(byte) = bytes.next() {
        if byte != b'%' {
            out.push(byte);
            continue;
        }
        let digit = |b: Option<u8>| (b? as char).to_digit(16);
        match (digit(bytes.next()), digit(bytes.next())) {
            (Some(high), Some(low)) => out.push((high * 16 + low) as u8),
            _ => {
                return Err(format!(
                    "the {part} has a % not followed by two hex digits (write % itself as %25)"
                ));
            }
        }
    }
    String::from_utf8(out).map_err(|_| format!("the {part} is not UTF-8 once its %XX are decoded"))
}

/// Escapes what `unescape` would not read back as itself: every byte but RFC 3986's
/// unreserved characters.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

pub(crate) fn parse_endpoint(s: &str) -> Result<Endpoint, String> {
    // Credentials come before the last `@` of a URL, so an `@` here is a mistake (a redirect
    // naming a strange address), and echoing the text back could print a password.
    if s.contains('@') {
        return Err("an endpoint is host:port only".into());
    }
    let (host, port) = if let Some(v6) = s.strip_prefix('[') {
        let (host, port) = v6
            .split_once("]:")
            .ok_or_else(|| format!("{s:?} is not host:port"))?;
        (host, port)
    } else {
        s.rsplit_once(':')
            .ok_or_else(|| format!("{s:?} is not host:port"))?
    };
    if host.is_empty() {
        return Err(format!("{s:?} has no host"));
    }
    // Brackets only delimit an IPv6 literal; anywhere else the host could not be written
    // back (masked for check-config) and read again as the same endpoint.
    if host.contains(['[', ']']) {
        return Err(format!("{s:?} has brackets outside an IPv6 literal"));
    }
    let port = port
        .parse::<u16>()
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| format!("{s:?} has no valid port"))?;
    Ok(Endpoint {
        host: host.to_string(),
        port,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep(host: &str, port: u16) -> Endpoint {
        Endpoint {
            host: host.into(),
            port,
        }
    }

    fn creds(user: Option<&str>, password: &str) -> Option<Credentials> {
        Some(Credentials {
            user: user.map(str::to_owned),
            password: password.into(),
        })
    }

    #[test]
    fn single_with_password_and_db() {
        let t = RedisTarget::parse("redis://:s3cret@10.0.0.1:6380/2").unwrap();
        assert_eq!(
            t,
            RedisTarget::Single {
                endpoint: ep("10.0.0.1", 6380),
                credentials: creds(None, "s3cret"),
                db: 2,
                tls: false,
            }
        );
        assert_eq!(t.masked(), "redis://:***@10.0.0.1:6380/2");
    }

    #[test]
    fn single_with_user_and_password() {
        let t = RedisTarget::parse("redis://app:s3cret@h:6379").unwrap();
        assert_eq!(
            t,
            RedisTarget::Single {
                endpoint: ep("h", 6379),
                credentials: creds(Some("app"), "s3cret"),
                db: 0,
                tls: false,
            }
        );
        assert_eq!(t.masked(), "redis://app:***@h:6379/0");
        assert!(!format!("{t:?}").contains("s3cret"), "{t:?}");
    }

    #[test]
    fn cluster_seeds() {
        let t = RedisTarget::parse("redis-cluster://a:7000,[::1]:7001").unwrap();
        assert_eq!(t.credentials(), None);
        assert_eq!(t.masked(), "redis-cluster://a:7000,[::1]:7001");
    }

    #[test]
    fn cluster_with_credentials() {
        let t = RedisTarget::parse("redis-cluster://app:pw@a:7000,b:7001").unwrap();
        assert_eq!(
            t,
            RedisTarget::Cluster {
                seeds: vec![ep("a", 7000), ep("b", 7001)],
                credentials: creds(Some("app"), "pw"),
                tls: false,
            }
        );
        assert_eq!(t.masked(), "redis-cluster://app:***@a:7000,b:7001");
        let t = RedisTarget::parse("redis-cluster://:pw@a:7000").unwrap();
        assert_eq!(t.credentials(), creds(None, "pw").as_ref());
        assert_eq!(t.masked(), "redis-cluster://:***@a:7000");
    }

    #[test]
    fn escapes_are_decoded() {
        // `@`, `:`, `/` and `%` itself, escaped in the password and in the user.
        let t = RedisTarget::parse("redis://us%3Aer%40x:p%40ss%3A%2F%25w%2f@h:1/3").unwrap();
        assert_eq!(
            t.credentials(),
            creds(Some("us:er@x"), "p@ss:/%w/").as_ref()
        );
        // The user is escaped again where it has to be, and reads back as itself.
        let masked = t.masked();
        assert_eq!(masked, "redis://us%3Aer%40x:***@h:1/3");
        assert_eq!(
            RedisTarget::parse(&masked).unwrap().credentials(),
            creds(Some("us:er@x"), "***").as_ref()
        );
        // A non-ASCII user, escaped as UTF-8.
        let t = RedisTarget::parse("redis://%C3%A9t%C3%A9:pw@h:1").unwrap();
        assert_eq!(t.credentials().unwrap().user.as_deref(), Some("été"));
        assert_eq!(t.masked(), "redis://%C3%A9t%C3%A9:***@h:1/0");
        // Raw, a `:` belongs to the password and an `@` too while one follows.
        let t = RedisTarget::parse("redis://u:a:b@c@h:1").unwrap();
        assert_eq!(t.credentials(), creds(Some("u"), "a:b@c").as_ref());
    }

    #[test]
    fn masked_round_trips() {
        for url in [
            "redis://h:1/0",
            "redis://:pw@h:1/0",
            "redis://a%20b:pw@h:1/7",
            "redis-cluster://u:p@a:1,[::1]:2",
            "rediss://h:1/0",
            "rediss://u%3A:pw@[::1]:1/2",
            "rediss-cluster://:p@a:1,127.0.0.1:2",
        ] {
            let t = RedisTarget::parse(url).unwrap();
            let mut back = RedisTarget::parse(&t.masked()).unwrap();
            if let RedisTarget::Single {
                credentials: Some(c),
                ..
            }
            | RedisTarget::Cluster {
                credentials: Some(c),
                ..
            } = &mut back
            {
                assert_eq!(c.password, "***");
                c.password.clone_from(&t.credentials().unwrap().password);
            }
            assert_eq!(back, t, "{url}");
        }
    }

    #[test]
    fn rejects_garbage() {
        for bad in [
            "http://x:1",
            "redis://host",
            "redis://host:0",
            "redis://host:99999",
            "redis://host:1/x",
            "redis-cluster://",
            "redis://]::1",
            "redis://[a]b]:1",
            // Credentials but no host.
            "redis://:pw@",
            "redis://u:pw@:1",
            "redis-cluster://u:pw@",
            "redis-cluster://u:pw@a:1,",
        ] {
            assert!(RedisTarget::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn tls_forms() {
        let t = RedisTarget::parse("rediss://app:s3cret@redis.internal:6380/1").unwrap();
        assert_eq!(
            t,
            RedisTarget::Single {
                endpoint: ep("redis.internal", 6380),
                credentials: creds(Some("app"), "s3cret"),
                db: 1,
                tls: true,
            }
        );
        assert!(t.tls());
        assert_eq!(t.masked(), "rediss://app:***@redis.internal:6380/1");
        let t = RedisTarget::parse("rediss-cluster://:pw@10.0.0.1:7000,[::1]:7001").unwrap();
        assert_eq!(
            t,
            RedisTarget::Cluster {
                seeds: vec![ep("10.0.0.1", 7000), ep("::1", 7001)],
                credentials: creds(None, "pw"),
                tls: true,
            }
        );
        assert_eq!(t.masked(), "rediss-cluster://:***@10.0.0.1:7000,[::1]:7001");
        let t = RedisTarget::parse("rediss://h:1").unwrap();
        assert_eq!((t.tls(), t.credentials()), (true, None));
        for plain in ["redis://h:1", "redis-cluster://h:1"] {
            assert!(!RedisTarget::parse(plain).unwrap().tls(), "{plain}");
        }
    }

    #[test]
    fn hostile_tls_forms_are_refused() {
        for bad in [
            "rediss:/h:1",
            "rediss//h:1",
            "rediss:h:1",
            "REDISS://h:1",
            "Rediss://h:1",
            "redisss://h:1",
            "rediss+cluster://h:1",
            "rediss-cluster:/h:1",
            "redis-clusters://h:1",
            "rediss-clusters://h:1",
            "rediss://",
            "rediss-cluster://",
            "rediss://h",
            "rediss://h:0",
            "rediss://h:65536",
            "rediss://:pw@",
            "rediss://u:pw@:1",
            "rediss-cluster://u:pw@a:1,,b:2",
            " rediss://h:1",
            "\0rediss://h:1",
            // A host TLS could not verify a certificate against.
            "rediss://h:1,h:2",
            "rediss://bad_host!:1",
            "rediss://h%41:1",
            "rediss://exa mple:1",
            "rediss://-h-:1",
            "rediss-cluster://a:1,x y:2",
            "rediss://999.1.1.1:1",
            "rediss://[::1%eth0]:1",
        ] {
            assert!(RedisTarget::parse(bad).is_err(), "{bad:?}");
        }
        // Credentials are refused without echo on the TLS forms too.
        for bad in [
            "rediss://SECRET@h:1",
            "rediss://:SECRET%zz@h:1",
            "rediss-cluster://u:SECRET%@h:1",
        ] {
            let error = RedisTarget::parse(bad).unwrap_err();
            assert!(!error.contains("SECRET"), "{bad} echoed: {error}");
        }
        // A very long name is no name (a DNS name is at most 253 bytes); long credentials are
        // still fine.
        let long = "a".repeat(1 << 16);
        assert!(RedisTarget::parse(&format!("rediss://{long}:1")).is_err());
        let t = RedisTarget::parse(&format!("rediss://{long}:{long}@h:1")).unwrap();
        assert_eq!(t.credentials().unwrap().password.len(), 1 << 16);
    }

    /// Every refusal of a malformed credential says what is wrong without quoting it.
    #[test]
    fn hostile_credentials_are_refused_without_echo() {
        for (bad, says) in [
            ("redis://user@host:1", "a user alone"),
            ("redis://SECRET@host:1", "a user alone"),
            ("redis://:@host:1", "password is empty"),
            ("redis://u:@host:1", "password is empty"),
            (
                "redis://:SECRET%zz@host:1",
                "the password has a % not followed",
            ),
            (
                "redis://:SECRET%@host:1",
                "the password has a % not followed",
            ),
            (
                "redis://:SECRET%4@host:1",
                "the password has a % not followed",
            ),
            (
                "redis://:SECRET%+1@host:1",
                "the password has a % not followed",
            ),
            (
                "redis://SECRET%g0:pw@host:1",
                "the user has a % not followed",
            ),
            ("redis://:SECRET%ff@host:1", "the password is not UTF-8"),
            (
                "redis-cluster://u:SECRET%@a:1",
                "the password has a % not followed",
            ),
            ("redis-cluster://SECRET@a:1", "a user alone"),
        ] {
            let error = RedisTarget::parse(bad).unwrap_err();
            assert!(error.contains(says), "{bad}: {error}");
            assert!(!error.contains("SECRET"), "{bad} echoed: {error}");
        }
    }

    #[test]
    fn very_long_and_odd_input() {
        // A long user and password parse (Redis sets no limit), quickly.
        let long = "x".repeat(1 << 20);
        let t = RedisTarget::parse(&format!("redis://{long}:{long}@h:1")).unwrap();
        assert_eq!(t.credentials().unwrap().password.len(), 1 << 20);
        // A long run of escapes, and one broken at the very end.
        let escaped = "%41".repeat(100_000);
        let t = RedisTarget::parse(&format!("redis://:{escaped}@h:1")).unwrap();
        assert_eq!(t.credentials().unwrap().password, "A".repeat(100_000));
        let error = RedisTarget::parse(&format!("redis://:{escaped}%4@h:1")).unwrap_err();
        assert!(error.len() < 200, "{error}");
        // Many `@`: the last one ends the credentials.
        let at = "@".repeat(10_000);
        let t = RedisTarget::parse(&format!("redis://:{at}@h:1")).unwrap();
        assert_eq!(t.credentials().unwrap().password, at);
        assert!(RedisTarget::parse("redis://@@@").is_err());
        // A long host list is only seeds.
        let seeds = vec!["a:1"; 10_000].join(",");
        let t = RedisTarget::parse(&format!("redis-cluster://:p@{seeds}")).unwrap();
        assert!(matches!(t, RedisTarget::Cluster { seeds, .. } if seeds.len() == 10_000));
    }
}
