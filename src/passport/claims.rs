//! The typed `pinboard` route claim (contract §2) and the host patterns it carries.
//!
//! The claim is parsed once, when its credential is verified; the registry and the data plane
//! then only ask it questions. Its shape rules are the contract's: `namespaces` is a non-empty
//! array of `"*"` or `/segment`, every other field has a fixed JSON type, and anything else makes
//! the whole claim the wrong shape (403 on registry routes).

use std::net::IpAddr;

use serde_json::{Map, Value};

/// What a credential's `pinboard` claim lets its holder register, see and act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteClaim {
    namespaces: Vec<String>,
    all_namespaces: bool,
    backend_hosts: Vec<HostPattern>,
    ports: Option<Vec<u16>>,
    hostnames: Option<Vec<HostPattern>>,
    envs: Option<Vec<String>>,
}

impl RouteClaim {
    /// Parses the value of a `pinboard` claim; the error says which rule it breaks.
    pub(super) fn from_json(value: &Value) -> Result<RouteClaim, &'static str> {
        let Value::Object(claim) = value else {
            return Err("pinboard claim is not an object");
        };
        let namespaces = match claim.get("namespaces").and_then(strings) {
            Some(namespaces) if !namespaces.is_empty() => namespaces,
            _ => return Err("pinboard.namespaces is not a non-empty array of strings"),
        };
        if !namespaces.iter().all(|ns| ns == "*" || is_namespace(ns)) {
            return Err("pinboard.namespaces has an entry that is neither \"*\" nor /segment");
        }
        let backend_hosts = optional(
            claim,
            "allowedBackendHosts",
            host_patterns,
            "pinboard.allowedBackendHosts is not an array of strings",
        )?;
        let ports = optional(
            claim,
            "allowedPorts",
            ports,
            "pinboard.allowedPorts is not an array of integers 1-65535",
        )?;
        let hostnames = optional(
            claim,
            "hostnames",
            host_patterns,
            "pinboard.hostnames is not an array of strings",
        )?;
        let envs = optional(
            claim,
            "envs",
            strings,
            "pinboard.envs is not an array of strings",
        )?;
        Ok(RouteClaim {
            all_namespaces: namespaces.iter().any(|ns| ns == "*"),
            namespaces,
            // Absent means no backend host at all: a credential must name where it may point.
            backend_hosts: backend_hosts.unwrap_or_default(),
            ports,
            hostnames,
            envs,
        })
    }

    /// Whether `ns` (like `/threads`) is granted; namespaces are paths, so case matters.
    pub fn allows_namespace(&self, ns: &str) -> bool {
        self.all_namespaces || self.namespaces.iter().any(|granted| granted == ns)
    }

    /// Whether an `advertiseUrl` may name `host` (brackets around an IPv6 literal optional).
    pub fn allows_backend_host(&self, host: &str) -> bool {
        self.backend_hosts
            .iter()
            .any(|pattern| pattern.matches(host))
    }

    pub fn allows_port(&self, port: u16) -> bool {
        self.ports
            .as_ref()
            .is_none_or(|ports| ports.contains(&port))
    }

    pub fn allows_hostname(&self, hostname: &str) -> bool {
        self.hostnames
            .as_ref()
            .is_none_or(|patterns| patterns.iter().any(|pattern| pattern.matches(hostname)))
    }

    /// Env names compare case-insensitively: the registry lowercases the envs it records, and a
    /// claim written as `Prod` is plainly meant to grant `prod`.
    pub fn allows_env(&self, env: &str) -> bool {
        self.envs.as_ref().is_none_or(|envs| {
            envs.iter()
                .any(|granted| granted == "*" || granted.eq_ignore_ascii_case(env))
        })
    }

    /// `"*"` is among the namespaces.
    pub fn all_namespaces(&self) -> bool {
        self.all_namespaces
    }

    /// The claim has no `hostnames` field (`["*"]` is a restriction that happens to match all).
    pub fn unrestricted_hostnames(&self) -> bool {
        self.hostnames.is_none()
    }

    /// The claim has no `envs` field (`["*"]` is a restriction that happens to match all).
    pub fn unrestricted_envs(&self) -> bool {
        self.envs.is_none()
    }
}

/// A host pattern (contract §2): an exact name or IP, `*`, or `*.suffix`.
///
/// Any string is a pattern: the contract's shape rules judge only JSON types, so a pattern that
/// could never name a real host (say `a*b`) is kept as an exact name that simply never matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPattern(Pattern);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Pattern {
    Any,
    /// The lowercased `.suffix`, leading dot kept so that matching is one comparison.
    Subdomains(String),
    /// IPs compare as addresses, so `::1`, `[::1]` and `0:0::1` are one host.
    Ip(IpAddr),
    /// Lowercased.
    Name(String),
}

impl HostPattern {
    pub fn new(pattern: &str) -> HostPattern {
        let pattern = unbracket(pattern);
        HostPattern(if pattern == "*" {
            Pattern::Any
        } else if let Some(suffix) = pattern.strip_prefix("*.").filter(|s| !s.is_empty()) {
            Pattern::Subdomains(format!(".{}", suffix.to_ascii_lowercase()))
        } else if let Ok(ip) = pattern.parse() {
            Pattern::Ip(ip)
        } else {
            Pattern::Name(pattern.to_ascii_lowercase())
        })
    }

    /// Case-insensitive; `*.example.com` matches `a.example.com` and `a.b.example.com` but
    /// neither `example.com` nor a name with an empty label before the suffix.
    pub fn matches(&self, host: &str) -> bool {
        let host = unbracket(host);
        match &self.0 {
            Pattern::Any => true,
            Pattern::Subdomains(suffix) => {
                let (host, suffix) = (host.as_bytes(), suffix.as_bytes());
                let Some(labels_len) = host.len().checked_sub(suffix.len()) else {
                    return false;
                };
                let (labels, tail) = host.split_at(labels_len);
                !labels.is_empty()
                    && tail.eq_ignore_ascii_case(suffix)
                    && labels.split(|&b| b == b'.').all(|label| !label.is_empty())
            }
            Pattern::Ip(ip) => host.parse::<IpAddr>().is_ok_and(|host| host == *ip),
            Pattern::Name(name) => host.eq_ignore_ascii_case(name),
        }
    }
}

/// `host` without the brackets of a URL's IPv6 literal.
fn unbracket(host: &str) -> &str {
    host.strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host)
}

/// `/` followed by one non-empty path segment.
fn is_namespace(ns: &str) -> bool {
    ns.strip_prefix('/')
        .is_some_and(|segment| !segment.is_empty() && !segment.contains('/'))
}

/// An optional field: absent is `None`, present but failing `parse` is the wrong shape.
fn optional<T>(
    claim: &Map<String, Value>,
    field: &str,
    parse: fn(&Value) -> Option<T>,
    wrong_shape: &'static str,
) -> Result<Option<T>, &'static str> {
    claim
        .get(field)
        .map(|value| parse(value).ok_or(wrong_shape))
        .transpose()
}

fn strings(value: &Value) -> Option<Vec<String>> {
    value
        .as_array()?
        .iter()
        .map(|item| item.as_str().map(str::to_owned))
        .collect()
}

fn host_patterns(value: &Value) -> Option<Vec<HostPattern>> {
    value
        .as_array()?
        .iter()
        .map(|item| item.as_str().map(HostPattern::new))
        .collect()
}

fn ports(value: &Value) -> Option<Vec<u16>> {
    value
        .as_array()?
        .iter()
        .map(|item| {
            item.as_u64()
                .and_then(|port| u16::try_from(port).ok())
                .filter(|&port| port != 0)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn claim(value: Value) -> RouteClaim {
        RouteClaim::from_json(&value).expect("claim should parse")
    }

    fn shape_error(value: Value) -> &'static str {
        RouteClaim::from_json(&value).expect_err("claim should be the wrong shape")
    }

    #[test]
    fn minimal_claim_grants_listed_namespaces_and_nothing_else_restricted() {
        let c = claim(json!({"namespaces": ["/threads", "/docs"]}));
        assert!(c.allows_namespace("/threads"));
        assert!(c.allows_namespace("/docs"));
        assert!(!c.allows_namespace("/Threads"));
        assert!(!c.allows_namespace("/other"));
        assert!(!c.allows_namespace("threads"));
        assert!(!c.all_namespaces());
        // allowedBackendHosts absent: no host at all.
        assert!(!c.allows_backend_host("127.0.0.1"));
        assert!(!c.allows_backend_host("*"));
        // allowedPorts, hostnames, envs absent: unrestricted.
        assert!(c.allows_port(1) && c.allows_port(8080) && c.allows_port(65535));
        assert!(c.unrestricted_hostnames() && c.allows_hostname("anything.example"));
        assert!(c.unrestricted_envs() && c.allows_env("prod"));
    }

    #[test]
    fn star_namespace_grants_all() {
        let c = claim(json!({"namespaces": ["/a", "*"]}));
        assert!(c.all_namespaces());
        assert!(c.allows_namespace("/anything"));
    }

    #[test]
    fn unknown_fields_are_ignored() {
        let c = claim(json!({"namespaces": ["*"], "future": {"x": 1}}));
        assert!(c.all_namespaces());
    }

    #[test]
    fn namespaces_of_the_wrong_shape() {
        for bad in [
            json!({}),
            json!({"namespaces": []}),
            json!({"namespaces": "*"}),
            json!({"namespaces": null}),
            json!({"namespaces": [1]}),
            json!({"namespaces": ["/ok", null]}),
            json!({"namespaces": ["threads"]}),
            json!({"namespaces": ["/"]}),
            json!({"namespaces": [""]}),
            json!({"namespaces": ["/a/b"]}),
            json!({"namespaces": ["/a/"]}),
            json!({"namespaces": ["//a"]}),
            json!({"namespaces": ["**"]}),
            json!({"namespaces": ["/ok", "bad"]}),
        ] {
            assert!(
                shape_error(bad.clone()).starts_with("pinboard.namespaces"),
                "{bad}"
            );
        }
    }

    #[test]
    fn claim_that_is_not_an_object() {
        for bad in [json!(null), json!("*"), json!(["*"]), json!(1)] {
            assert_eq!(shape_error(bad), "pinboard claim is not an object");
        }
    }

    #[test]
    fn optional_fields_of_the_wrong_type() {
        let cases = [
            ("allowedBackendHosts", json!("127.0.0.1")),
            ("allowedBackendHosts", json!([1])),
            ("allowedBackendHosts", json!(null)),
            ("allowedPorts", json!(8080)),
            ("allowedPorts", json!(["8080"])),
            ("allowedPorts", json!([0])),
            ("allowedPorts", json!([65536])),
            ("allowedPorts", json!([-1])),
            ("allowedPorts", json!([80.5])),
            ("allowedPorts", json!([80.0])),
            ("allowedPorts", json!([80, null])),
            ("allowedPorts", json!(null)),
            ("hostnames", json!("a.example")),
            ("hostnames", json!([true])),
            ("hostnames", json!(null)),
            ("envs", json!("prod")),
            ("envs", json!([{}])),
            ("envs", json!(null)),
        ];
        for (field, value) in cases {
            let mut bad = json!({"namespaces": ["*"]});
            bad[field] = value.clone();
            let reason = shape_error(bad);
            assert!(
                reason.starts_with(&format!("pinboard.{field} ")),
                "{field}={value}: {reason}"
            );
        }
    }

    #[test]
    fn ports() {
        let c = claim(json!({"namespaces": ["*"], "allowedPorts": [1, 8080, 65535]}));
        assert!(c.allows_port(1) && c.allows_port(8080) && c.allows_port(65535));
        assert!(!c.allows_port(80) && !c.allows_port(0));
        let none = claim(json!({"namespaces": ["*"], "allowedPorts": []}));
        assert!(!none.allows_port(8080));
    }

    #[test]
    fn envs() {
        let c = claim(json!({"namespaces": ["*"], "envs": ["prod", "Staging"]}));
        assert!(!c.unrestricted_envs());
        assert!(c.allows_env("prod") && c.allows_env("PROD") && c.allows_env("staging"));
        assert!(!c.allows_env("dev") && !c.allows_env("*"));
        let star = claim(json!({"namespaces": ["*"], "envs": ["*"]}));
        assert!(star.allows_env("anything"));
        assert!(!star.unrestricted_envs());
        let empty = claim(json!({"namespaces": ["*"], "envs": []}));
        assert!(!empty.allows_env("prod") && !empty.unrestricted_envs());
    }

    #[test]
    fn hostnames_and_backend_hosts() {
        let c = claim(json!({
            "namespaces": ["*"],
            "allowedBackendHosts": ["10.0.0.7", "*.svc.internal"],
            "hostnames": ["app.example.com"],
        }));
        assert!(c.allows_backend_host("10.0.0.7"));
        assert!(c.allows_backend_host("w1.svc.internal"));
        assert!(!c.allows_backend_host("svc.internal"));
        assert!(!c.allows_backend_host("10.0.0.8"));
        assert!(!c.unrestricted_hostnames());
        assert!(c.allows_hostname("APP.example.com"));
        assert!(!c.allows_hostname("other.example.com"));
        let star = claim(json!({"namespaces": ["*"], "hostnames": ["*"]}));
        assert!(star.allows_hostname("x") && !star.unrestricted_hostnames());
        let empty = claim(json!({"namespaces": ["*"], "hostnames": []}));
        assert!(!empty.allows_hostname("x"));
    }

    #[test]
    fn exact_names_ignore_case() {
        let p = HostPattern::new("Example.COM");
        assert!(p.matches("example.com") && p.matches("EXAMPLE.com"));
        assert!(!p.matches("a.example.com") && !p.matches("example.co") && !p.matches(""));
    }

    #[test]
    fn star_matches_everything() {
        let p = HostPattern::new("*");
        assert!(p.matches("example.com") && p.matches("127.0.0.1") && p.matches("[::1]"));
    }

    #[test]
    fn wildcard_needs_one_or_more_labels_before_the_suffix() {
        let p = HostPattern::new("*.example.com");
        assert!(p.matches("a.example.com"));
        assert!(p.matches("a.b.example.com"));
        assert!(p.matches("A.Example.Com"));
        assert!(!p.matches("example.com"));
        assert!(!p.matches(".example.com"));
        assert!(!p.matches("a..example.com"));
        assert!(!p.matches("aexample.com"));
        assert!(!p.matches("a.example.com.evil"));
        assert!(!p.matches("a.example.org"));
        // Non-ASCII bytes before the suffix must not trip slicing.
        assert!(p.matches("é.example.com"));
        assert!(!HostPattern::new("*.example.com").matches("ééééééééééééé"));
    }

    #[test]
    fn ips_compare_as_addresses() {
        let v4 = HostPattern::new("127.0.0.1");
        assert!(v4.matches("127.0.0.1"));
        assert!(!v4.matches("127.0.0.2") && !v4.matches("localhost"));
        let v6 = HostPattern::new("[::1]");
        assert!(v6.matches("::1") && v6.matches("[::1]") && v6.matches("0:0::1"));
        let upper = HostPattern::new("FE80::A");
        assert!(upper.matches("fe80::a") && upper.matches("[fe80::A]"));
        assert!(!upper.matches("fe80::b"));
    }

    #[test]
    fn degenerate_patterns_are_exact_names() {
        assert!(!HostPattern::new("*.").matches("a."));
        assert!(HostPattern::new("*.").matches("*."));
        assert!(!HostPattern::new("a*b").matches("axb"));
        assert!(!HostPattern::new("").matches("a"));
    }
}
