//! What one client may hold or make before it is refused: connections and TLS handshakes in
//! progress per address, node-wide, decided at accept ([`connections`]); new placements per
//! second per client, per core, decided atomically with the placement ([`placements`]).
//!
//! A client is counted by [`client_address`]: an IPv6 client by its /64.

pub mod connections;
pub mod placements;

use std::net::{IpAddr, Ipv6Addr};

/// The address a limit counts a client by. IPv4 as it is, an IPv4-mapped IPv6 address (what a
/// dual-stack listener sees of an IPv4 client) as the IPv4 address it maps; any other IPv6
/// address by its /64 prefix: a subscriber commonly gets a whole /64, so per single address
/// one client would have 2^64 allowances.
pub fn client_address(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => IpAddr::V6(Ipv6Addr::from_bits(v6.to_bits() & !u128::from(u64::MAX))),
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv6_counts_per_64_and_mapped_ipv4_as_ipv4() {
        let of = |s: &str| client_address(s.parse().unwrap()).to_string();
        assert_eq!(of("203.0.113.7"), "203.0.113.7");
        assert_eq!(of("2001:db8:1:2:aaaa:bbbb:cccc:dddd"), "2001:db8:1:2::");
        assert_eq!(of("2001:db8:1:2::1"), of("2001:db8:1:2:ffff::9"));
        assert_ne!(of("2001:db8:1:2::1"), of("2001:db8:1:3::1"));
        // Two IPv4 clients of a dual-stack listener are two clients, not one ::ffff:0:0/64.
        assert_eq!(of("::ffff:203.0.113.7"), "203.0.113.7");
        assert_ne!(of("::ffff:203.0.113.7"), of("::ffff:203.0.113.8"));
        assert_eq!(of("::1"), "::");
    }
}
