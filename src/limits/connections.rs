//! Client connections per address, node-wide (`limits.max_connections_per_ip`), and, on a TLS
//! listener, connections per address whose handshake is not done ([`MAX_HANDSHAKES_PER_IP`]):
//! decided at accept, before a byte is read, so that one address cannot hold every slot of the
//! node (`max_connections`) with idle keep-alive connections or silent handshakes.
//!
//! A client's connections land on every core (`SO_REUSEPORT` spreads them), so the count is one
//! table for the node: a sharded map behind `parking_lot` mutexes, taken at accept, at the end
//! of a handshake and at close, never per request. An accept is a syscall and a task spawn
//! already; an uncontended lock is a few tens of nanoseconds beside it, and 64 shards keep the
//! cores from meeting on one. The address is the TCP peer's (`trusted_proxies` speaks about
//! headers, which are not read yet), or on a balancer's connection the client its PROXY
//! protocol header names (`proxy_protocol.trusted`: admitted once the header is read).
//!
//! The table holds an entry per address with a connection open and removes it when its last
//! closes: it never holds more entries than the node has connections (`max_connections`).
//!
//! A reload may change the limit: connections already held still count against the new one;
//! those accepted while it was 0 (off) were not counted and never are.

use std::cell::Cell;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use ahash::AHashMap;
use parking_lot::Mutex;

use super::client_address;
use crate::metrics::ConnectionRefusal;

/// TLS handshakes one address may have in progress (from accept to the handshake's end, the
/// wait for its first byte included). A browser opens about six connections to a host at once;
/// past this a client is opening connections it does not finish, and each holds a slot until
/// `http.header_timeout_ms`.
pub const MAX_HANDSHAKES_PER_IP: u32 = 16;

/// Mutexes the table is split into, by a hash of the address.
const SHARDS: usize = 64;

pub struct ConnectionTable {
    /// 0: no per-address limit (nothing is counted).
    max_per_address: AtomicU32,
    /// Picks an address's shard; seeded at random, so that no client can aim at one.
    spread: ahash::RandomState,
    shards: Box<[Mutex<AHashMap<IpAddr, Held>>]>,
}

/// What one address holds.
#[derive(Default)]
struct Held {
    connections: u32,
    handshakes: u32,
}

impl ConnectionTable {
    /// The table for `max_connections_per_ip` (0: no limit).
    pub fn new(max_connections_per_ip: u64) -> Arc<ConnectionTable> {
        let table = Arc::new(ConnectionTable {
            max_per_address: AtomicU32::new(0),
            spread: ahash::RandomState::new(),
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
        });
        table.set_limit(max_connections_per_ip);
        table
    }

    /// `max_connections_per_ip` as a reload sets it.
    pub fn set_limit(&self, max_connections_per_ip: u64) {
        let max = u32::try_from(max_connections_per_ip).unwrap_or(u32::MAX);
        self.max_per_address.store(max, Ordering::Relaxed);
    }

    fn shard(&self, address: &IpAddr) -> &Mutex<AHashMap<IpAddr, Held>> {
        &self.shards[self.spread.hash_one(address) as usize % SHARDS]
    }

    /// A slot for a connection from `peer`, held until the slot is dropped (`None` while the
    /// limit is off); `handshake`: the connection starts with a TLS handshake, in progress
    /// until [`Slot::handshake_done`].
    pub fn admit(
        self: &Arc<Self>,
        peer: IpAddr,
        handshake: bool,
    ) -> Result<Option<Slot>, ConnectionRefusal> {
        let max = self.max_per_address.load(Ordering::Relaxed);
        if max == 0 {
            return Ok(None);
        }
        let address = client_address(peer);
        let mut shard = self.shard(&address).lock();
        let held = shard.entry(address).or_default();
        if held.connections >= max {
            return Err(ConnectionRefusal::PerIp);
        }
        if handshake && held.handshakes >= MAX_HANDSHAKES_PER_IP {
            return Err(ConnectionRefusal::HandshakesPerIp);
        }
        held.connections += 1;
        held.handshakes += u32::from(handshake);
        Ok(Some(Slot {
            table: self.clone(),
            address,
            handshaking: Cell::new(handshake),
        }))
    }

    /// Gives back what a slot held; the address's entry goes with its last connection.
    fn release(&self, address: IpAddr, connections: u32, handshakes: u32) {
        let mut shard = self.shard(&address).lock();
        if let Some(held) = shard.get_mut(&address) {
            held.connections -= connections;
            held.handshakes -= handshakes;
            if held.connections == 0 {
                shard.remove(&address);
            }
        }
    }

    /// Addresses with a connection open (the table's entries).
    #[cfg(test)]
    fn addresses(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }
}

/// One admitted connection's place in the table: released when dropped, whatever ends the
/// connection (its close, a failed handshake, the stop, a panic).
pub struct Slot {
    table: Arc<ConnectionTable>,
    address: IpAddr,
    handshaking: Cell<bool>,
}

impl Slot {
    /// The connection's TLS handshake is done: it no longer counts among the handshakes in
    /// progress.
    pub fn handshake_done(&self) {
        if self.handshaking.replace(false) {
            self.table.release(self.address, 0, 1);
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let handshakes = u32::from(self.handshaking.get());
        self.table.release(self.address, 1, handshakes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn an_address_past_its_connections_is_refused_and_others_are_not() {
        let table = ConnectionTable::new(2);
        let a = [
            table.admit(ip("10.0.0.1"), false).unwrap().unwrap(),
            table.admit(ip("10.0.0.1"), false).unwrap().unwrap(),
        ];
        assert_eq!(
            table.admit(ip("10.0.0.1"), false).err(),
            Some(ConnectionRefusal::PerIp)
        );
        let b = table.admit(ip("10.0.0.2"), false).unwrap().unwrap();
        // One /64 is one client.
        let v6 = table.admit(ip("2001:db8::1"), false).unwrap().unwrap();
        let _v6b = table.admit(ip("2001:db8::2"), false).unwrap().unwrap();
        assert!(table.admit(ip("2001:db8::3:4"), false).is_err());
        assert!(table.admit(ip("2001:db8:0:1::1"), false).is_ok());
        drop(v6);
        assert!(table.admit(ip("2001:db8::3:4"), false).is_ok());
        let [first, _second] = a;
        drop(first);
        let _again = table.admit(ip("10.0.0.1"), false).unwrap().unwrap();
        drop(b);
    }

    #[test]
    fn handshakes_in_progress_are_bounded_apart_from_connections() {
        let table = ConnectionTable::new(100);
        let pending: Vec<Slot> = (0..MAX_HANDSHAKES_PER_IP)
            .map(|_| table.admit(ip("10.0.0.1"), true).unwrap().unwrap())
            .collect();
        assert_eq!(
            table.admit(ip("10.0.0.1"), true).err(),
            Some(ConnectionRefusal::HandshakesPerIp)
        );
        // A finished handshake frees its handshake place, not its connection.
        pending[0].handshake_done();
        pending[0].handshake_done();
        let more = table.admit(ip("10.0.0.1"), true).unwrap().unwrap();
        assert!(table.admit(ip("10.0.0.1"), true).is_err());
        drop(more);
        assert!(table.admit(ip("10.0.0.1"), true).is_ok());
    }

    #[test]
    fn an_address_leaves_the_table_with_its_last_connection() {
        let table = ConnectionTable::new(5);
        let slots: Vec<Slot> = (0..50)
            .map(|i| {
                table
                    .admit(ip(&format!("10.0.{i}.1")), i % 2 == 0)
                    .unwrap()
                    .unwrap()
            })
            .collect();
        assert_eq!(table.addresses(), 50);
        slots.iter().for_each(Slot::handshake_done);
        drop(slots);
        assert_eq!(table.addresses(), 0);
    }

    #[test]
    fn a_reload_moves_the_limit_and_zero_turns_it_off() {
        let table = ConnectionTable::new(1);
        let held = table.admit(ip("10.0.0.1"), false).unwrap();
        assert!(held.is_some());
        assert!(table.admit(ip("10.0.0.1"), false).is_err());
        table.set_limit(2);
        let _second = table.admit(ip("10.0.0.1"), false).unwrap().unwrap();
        assert!(table.admit(ip("10.0.0.1"), false).is_err());
        table.set_limit(0);
        assert!(
            table.admit(ip("10.0.0.1"), false).unwrap().is_none(),
            "off: not counted"
        );
        table.set_limit(1);
        assert!(
            table.admit(ip("10.0.0.1"), false).is_err(),
            "the held ones still count"
        );
    }
}
