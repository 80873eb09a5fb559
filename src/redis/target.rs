//! Where Redis lives: the parsed form of the `redis_url` setting.
//!
//! `redis://[:password@]host:port[/db]` names one server; `redis-cluster://host:port[,host:port…]`
//! names seed nodes of a Redis Cluster. Parsing is strict so that a typo stops startup with a
//! message naming the key instead of surfacing later as a connection error on every core.

use std::fmt;

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

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RedisTarget {
    Single {
        endpoint: Endpoint,
        password: Option<String>,
        db: u32,
    },
    Cluster {
        seeds: Vec<Endpoint>,
    },
}

impl RedisTarget {
    pub fn parse(url: &str) -> Result<RedisTarget, String> {
        if let Some(rest) = url.strip_prefix("redis-cluster://") {
            let seeds = rest
                .split(',')
                .map(parse_endpoint)
                .collect::<Result<Vec<_>, _>>()?;
            return Ok(RedisTarget::Cluster { seeds });
        }
        let rest = url.strip_prefix("redis://").ok_or(
            "expected redis://[:password@]host:port[/db] or redis-cluster://host:port[,host:port…]",
        )?;
        let (auth, rest) = match rest.rsplit_once('@') {
            Some((auth, rest)) => (Some(auth), rest),
            None => (None, rest),
        };
        let password = match auth {
            None => None,
            Some(a) => match a.strip_prefix(':') {
                Some(p) if !p.is_empty() => Some(p.to_string()),
                _ => return Err("credentials must be written :password@".into()),
            },
        };
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
            endpoint: parse_endpoint(hostport)?,
            password,
            db,
        })
    }

    /// The URL with any password replaced by `***`, for logs and `check-config`.
    pub fn masked(&self) -> String {
        match self {
            RedisTarget::Single {
                endpoint,
                password,
                db,
            } => {
                let auth = if password.is_some() { ":***@" } else { "" };
                format!("redis://{auth}{endpoint}/{db}")
            }
            RedisTarget::Cluster { seeds } => {
                let seeds: Vec<String> = seeds.iter().map(|s| s.to_string()).collect();
                format!("redis-cluster://{}", seeds.join(","))
            }
        }
    }
}

pub(crate) fn parse_endpoint(s: &str) -> Result<Endpoint, String> {
    // Only `redis://` URLs carry credentials; an `@` here is a mistake, and echoing the text
    // back could print a password.
    if s.contains('@') {
        return Err("cluster seeds take no credentials (host:port only)".into());
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

    #[test]
    fn single_with_password_and_db() {
        let t = RedisTarget::parse("redis://:s3cret@10.0.0.1:6380/2").unwrap();
        assert_eq!(
            t,
            RedisTarget::Single {
                endpoint: Endpoint {
                    host: "10.0.0.1".into(),
                    port: 6380
                },
                password: Some("s3cret".into()),
                db: 2
            }
        );
        assert_eq!(t.masked(), "redis://:***@10.0.0.1:6380/2");
    }

    #[test]
    fn cluster_seeds() {
        let t = RedisTarget::parse("redis-cluster://a:7000,[::1]:7001").unwrap();
        assert_eq!(t.masked(), "redis-cluster://a:7000,[::1]:7001");
    }

    #[test]
    fn rejects_garbage() {
        for bad in [
            "http://x:1",
            "redis://host",
            "redis://host:0",
            "redis://host:99999",
            "redis://user@host:1",
            "redis://host:1/x",
            "redis-cluster://",
            "redis-cluster://:pw@a:1",
            "redis://]::1",
            "redis://[a]b]:1",
        ] {
            assert!(RedisTarget::parse(bad).is_err(), "{bad}");
        }
    }
}
