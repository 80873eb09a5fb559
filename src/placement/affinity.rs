//! The affinity key of a request: what keeps one client on one worker when a new placement is
//! made (`affinity` in the configuration). `None` skips the preference.

use std::fmt::Write;
use std::net::IpAddr;

use http::header;
use ipnet::IpNet;

use crate::config::Affinity;
use crate::http::Request;
use crate::text::InlineStr;

/// A request's affinity key, copied out of the request (which the forward goes on to consume)
/// onto the stack when it fits, as an address always does: no allocation per request.
pub type Key = InlineStr<64>;

fn address(ip: IpAddr) -> Key {
    let mut key = Key::default();
    write!(key, "{ip}").expect("writing to memory");
    key
}

/// `client`: the request's client address ([`client_ip`]), which `affinity = "ip"` keys on.
pub fn key(affinity: &Affinity, client: IpAddr, req: &Request<'_>) -> Option<Key> {
    match affinity {
        Affinity::None => None,
        Affinity::Ip => Some(address(client)),
        Affinity::Header(name) => req
            .head
            .headers
            .get(name.as_str())
            .and_then(|v| v.to_str().ok())
            .map(Key::from),
        Affinity::Query(name) => req
            .head
            .uri
            .query()?
            .split('&')
            .find_map(|pair| match pair.split_once('=') {
                Some((k, v)) if k == name => Some(v),
                None if pair == name => Some(""),
                _ => None,
            })
            .map(Key::from),
        Affinity::Cookie(name) => req
            .head
            .headers
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(';'))
            .find_map(|pair| {
                let (k, v) = pair.trim().split_once('=')?;
                (k == name).then_some(v)
            })
            .map(Key::from),
    }
}

/// The client's address: the peer, unless the peer is a trusted proxy, in which case the
/// right-most `X-Forwarded-For` entry that is not itself a trusted proxy (entries further
/// left were written by whoever the first untrusted hop was, and prove nothing).
pub fn client_ip(peer: IpAddr, trusted: &[IpNet], req: &Request<'_>) -> IpAddr {
    let is_trusted = |ip: &IpAddr| crate::config::in_cidrs(trusted, *ip);
    if !is_trusted(&peer) {
        return peer;
    }
    let forwarded: Vec<&str> = req
        .head
        .headers
        .get_all("x-forwarded-for")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .collect();
    let mut client = peer;
    for hop in forwarded.iter().rev() {
        match hop.trim().parse::<IpAddr>() {
            Ok(ip) => {
                client = ip;
                if !is_trusted(&ip) {
                    break;
                }
            }
            Err(_) => break,
        }
    }
    client
}
