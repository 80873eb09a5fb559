//! The affinity key of a request: what keeps one client on one worker when a new placement is
//! made (`affinity` in the configuration). `None` skips the preference.

use std::borrow::Cow;
use std::net::IpAddr;

use http::header;
use ipnet::IpNet;

use crate::config::Affinity;
use crate::http::Request;

pub fn key<'r>(
    affinity: &Affinity,
    trusted: &[IpNet],
    req: &'r Request<'_>,
) -> Option<Cow<'r, str>> {
    match affinity {
        Affinity::None => None,
        Affinity::Ip => Some(Cow::Owned(
            client_ip(req.peer.ip(), trusted, req).to_string(),
        )),
        Affinity::Header(name) => req
            .head
            .headers
            .get(name.as_str())
            .and_then(|v| v.to_str().ok())
            .map(Cow::Borrowed),
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
            .map(Cow::Borrowed),
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
            .map(Cow::Borrowed),
    }
}

/// The client's address: the peer, unless the peer is a trusted proxy, in which case the
/// right-most `X-Forwarded-For` entry that is not itself a trusted proxy (entries further
/// left were written by whoever the first untrusted hop was, and prove nothing).
pub fn client_ip(peer: IpAddr, trusted: &[IpNet], req: &Request<'_>) -> IpAddr {
    let is_trusted = |ip: &IpAddr| trusted.iter().any(|net| net.contains(ip));
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
