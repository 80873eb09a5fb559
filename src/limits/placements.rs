//! New placements per client (`limits.new_placements_per_ip_per_s`): a token bucket per client,
//! per core. A client is the `sub` of its data-plane credential when it sent one, else its
//! address ([`super::client_address`] of the one `trusted_proxies` names): each new id is a
//! placement row in Redis, and without a bound one anonymous client filled Redis at 7,300 rows
//! a second.
//!
//! The bucket is read before the resolve (a client out of tokens is told to `lua/resolve.lua`,
//! which refuses only when the id needs a new placement, and writes nothing then) and spent
//! when the resolve answers `placed`; an id with a live owner never asks for a token.
//!
//! Each core keeps its own buckets, so nothing on the request path is shared between cores: a
//! core refills a client's bucket at `rate / cores` a second, holding at most as much (at least
//! one). A client whose connections all land on one core gets that core's share, one spread
//! over every core gets the whole rate: the limit is the node's to within a factor of `cores`,
//! and exact for a client that uses every core.
//!
//! A core tracks at most [`MAX_CLIENTS`] clients: a full bucket is as good as none and goes
//! first; past that the least recently spent half goes (each such client gets a full bucket
//! again, no more), so a client spraying addresses costs memory up to the bound, never past it.

use std::cell::RefCell;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use ahash::AHashMap;

use super::client_address;

/// Clients one core keeps a bucket for (about 40 bytes each).
pub const MAX_CLIENTS: usize = 16_384;

/// Whom a bucket belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Client {
    Address(IpAddr),
    /// A credential's `sub`, hashed (seeded at random per core): a fixed-size key whatever
    /// the credential says.
    Account(u64),
}

pub struct PlacementRate {
    /// Tokens a core's bucket gains a second.
    per_second: f64,
    /// Tokens a core's bucket holds at most.
    burst: f64,
    accounts: ahash::RandomState,
    buckets: RefCell<AHashMap<Client, Bucket>>,
}

#[derive(Clone, Copy)]
struct Bucket {
    /// Below zero when placements admitted at once outran the bucket: paid back first.
    tokens: f64,
    /// When `tokens` was counted (the last placement).
    at: Instant,
}

impl PlacementRate {
    /// One core's share of `per_node` placements a second; `None` when it is 0 (no limit).
    pub fn new(per_node: u64, cores: usize) -> Option<PlacementRate> {
        (per_node > 0).then(|| {
            let per_second = per_node as f64 / cores.max(1) as f64;
            PlacementRate {
                per_second,
                burst: per_second.max(1.0),
                accounts: ahash::RandomState::new(),
                buckets: RefCell::default(),
            }
        })
    }

    /// The client a request counts as: its credential's `sub`, else its address.
    pub fn client(&self, address: IpAddr, account: Option<&str>) -> Client {
        match account {
            Some(sub) => Client::Account(self.accounts.hash_one(sub)),
            None => Client::Address(client_address(address)),
        }
    }

    /// How long `client` must wait before a new placement: zero when it may place now.
    pub fn wait(&self, client: &Client, now: Instant) -> Duration {
        let Some(bucket) = self.buckets.borrow().get(client).copied() else {
            return Duration::ZERO;
        };
        let tokens = self.level(bucket, now);
        if tokens >= 1.0 {
            return Duration::ZERO;
        }
        Duration::from_secs_f64((1.0 - tokens) / self.per_second)
    }

    /// `client` made a new placement.
    pub fn spend(&self, client: Client, now: Instant) {
        let mut buckets = self.buckets.borrow_mut();
        let tokens = match buckets.get(&client) {
            Some(bucket) => self.level(*bucket, now),
            None => {
                self.make_room(&mut buckets, now);
                self.burst
            }
        };
        let bucket = Bucket {
            tokens: tokens - 1.0,
            at: now,
        };
        buckets.insert(client, bucket);
    }

    /// The bucket's tokens at `now`.
    fn level(&self, bucket: Bucket, now: Instant) -> f64 {
        let gained = now.saturating_duration_since(bucket.at).as_secs_f64() * self.per_second;
        (bucket.tokens + gained).min(self.burst)
    }

    /// Below [`MAX_CLIENTS`] before a new client's bucket goes in: refilled buckets go (as good
    /// as none), then, when that freed too little, the least recently spent half. Each pass
    /// leaves at most half the bound, so its cost is spread over as many placements.
    fn make_room(&self, buckets: &mut AHashMap<Client, Bucket>, now: Instant) {
        if buckets.len() < MAX_CLIENTS {
            return;
        }
        buckets.retain(|_, b| self.level(*b, now) < self.burst);
        if buckets.len() > MAX_CLIENTS / 2 {
            let mut spent: Vec<Instant> = buckets.values().map(|b| b.at).collect();
            let (_, median, _) = spent.select_nth_unstable(buckets.len() / 2);
            let median = *median;
            buckets.retain(|_, b| b.at > median);
        }
    }

    #[cfg(test)]
    fn clients(&self) -> usize {
        self.buckets.borrow().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn address(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_client_past_its_burst_waits_for_a_token() {
        // 10 a second on 2 cores: each core 5 a second, 5 at once.
        let rate = PlacementRate::new(10, 2).unwrap();
        let now = Instant::now();
        let a = rate.client(address("10.0.0.1"), None);
        for _ in 0..5 {
            assert_eq!(rate.wait(&a, now), Duration::ZERO);
            rate.spend(a, now);
        }
        let wait = rate.wait(&a, now);
        assert_eq!(wait, Duration::from_millis(200));
        // Another client, and the same one once a token came back.
        let b = rate.client(address("10.0.0.2"), None);
        assert_eq!(rate.wait(&b, now), Duration::ZERO);
        assert_eq!(rate.wait(&a, now + wait), Duration::ZERO);
        // Never more than the burst, however long it waited.
        let later = now + Duration::from_secs(3600);
        for _ in 0..5 {
            rate.spend(a, later);
        }
        assert!(rate.wait(&a, later) > Duration::ZERO);
    }

    #[test]
    fn a_credential_is_one_client_whatever_its_address() {
        let rate = PlacementRate::new(1, 4).unwrap();
        let now = Instant::now();
        let one = rate.client(address("10.0.0.1"), Some("acct-1"));
        assert_eq!(one, rate.client(address("10.9.9.9"), Some("acct-1")));
        assert_ne!(one, rate.client(address("10.0.0.1"), Some("acct-2")));
        assert_ne!(one, rate.client(address("10.0.0.1"), None));
        // A quarter of a placement a second is still one at once, then one every 4 s.
        rate.spend(one, now);
        assert_eq!(rate.wait(&one, now), Duration::from_secs(4));
        // An IPv6 /64 is one client.
        let v6 = rate.client(address("2001:db8::1"), None);
        assert_eq!(v6, rate.client(address("2001:db8::ffff:1"), None));
    }

    #[test]
    fn placements_admitted_at_once_are_paid_back() {
        let rate = PlacementRate::new(1, 1).unwrap();
        let now = Instant::now();
        let a = rate.client(address("10.0.0.1"), None);
        // Three resolves were in flight when the bucket still had its token.
        for _ in 0..3 {
            rate.spend(a, now);
        }
        assert_eq!(rate.wait(&a, now), Duration::from_secs(3));
    }

    #[test]
    fn a_spray_of_clients_stays_bounded() {
        let rate = PlacementRate::new(1000, 1).unwrap();
        let start = Instant::now();
        for i in 0..(3 * MAX_CLIENTS as u32) {
            let at = start + Duration::from_micros(u64::from(i));
            rate.spend(Client::Address(IpAddr::from(i.to_be_bytes())), at);
            assert!(rate.clients() <= MAX_CLIENTS);
        }
        // The most recent clients are the ones kept.
        let last = Client::Address(IpAddr::from((3 * MAX_CLIENTS as u32 - 1).to_be_bytes()));
        let at = start + Duration::from_micros(3 * MAX_CLIENTS as u64);
        assert!(rate.buckets.borrow().contains_key(&last));
        assert!(rate.wait(&last, at) == Duration::ZERO);
        // Refilled buckets go first, and losslessly.
        let much_later = at + Duration::from_secs(60);
        rate.spend(Client::Address(address("192.0.2.1")), much_later);
        let kept = rate.clients();
        assert!(kept <= MAX_CLIENTS, "{kept}");
    }
}
