//! Redis Cluster behind the `Redis` handle: the slot map (from CLUSTER SLOTS), one pipelined
//! `Node` per master, routing by the hash slot of a command's first key, and the redirects
//! (MOVED, ASK) a cluster answers while slots move.
//!
//! A background task keeps the map fresh: at start, whenever a request is redirected or finds
//! its master disconnected, and while some slot has no connected master.
//!
//! Failovers (`failover`) are seen two ways: a master's address answering with another server
//! (its node's own check, for the slots the map gives it), and a slot whose new master was one
//! of its replicas in the map before (a promotion, by a refresh or a MOVED).
//!
//! Every connection, to a master or for CLUSTER SLOTS, is opened by the same `login`: over
//! TLS for `rediss-cluster://` (each verified against its own host, as CLUSTER SLOTS or the
//! redirect names it), logged in with the target's credentials. A master found through a
//! redirect or a later map is no exception.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::io;
use std::rc::Rc;
use std::time::Duration;

use local_sync::oneshot;
use redis_protocol::redis_keyslot;
use tracing::{debug, info, warn};

use super::failover::Failovers;
use super::login::Login;
use super::node::{Backoff, Node, OnFailover};
use super::notify::Notify;
use super::options::RedisOptions;
use super::target::parse_endpoint;
use super::{Endpoint, RedisError, Reply};

const SLOTS: usize = 16384;
/// Marks a slot no master serves in the last map seen.
const UNSERVED: u16 = u16::MAX;
/// Redirects followed for one request before giving up. While a slot migrates, a script whose
/// keys are split alternates ASK and TRYAGAIN (two attempts a round, backing off): eight
/// attempts wait about a quarter of a second for the slot to settle. A redirect still pending
/// after the last one is a transient failure (503 + Retry-After), not a server error.
const MAX_ATTEMPTS: u32 = 8;
/// How often a healthy map's connectivity is checked.
const CHECK_INTERVAL: Duration = Duration::from_secs(1);
const MIN_REFRESH_GAP: Duration = Duration::from_millis(100);
/// The longest pause between two refreshes while some slot has no connected master. A
/// refresh is one CLUSTER SLOTS to a master that answers; what it waits for is the cluster
/// promoting a replica, and each pause adds to the outage after that (a 2 s pause made the
/// nodes route a failed-over master's slots to the dead one for up to 2 s more).
const MAX_REFRESH_PAUSE: Duration = Duration::from_millis(500);

pub(crate) struct Cluster {
    shared: Rc<Shared>,
    /// Dropping the handle drops this, which ends the refresh task and with it every node.
    _stop: oneshot::Sender<()>,
}

struct Shared {
    seeds: Vec<Endpoint>,
    nodes: NodeTemplate,
    map: RefCell<SlotMap>,
    refresh: Notify,
    failovers: Rc<Failovers>,
}

/// How every connection of the cluster is opened: one login, one set of options, and who is
/// told when a master's address answers with another server.
struct NodeTemplate {
    login: Rc<Login>,
    opts: RedisOptions,
    on_failover: OnFailover,
}

impl NodeTemplate {
    fn spawn(&self, endpoint: &Endpoint) -> Rc<Node> {
        Rc::new(Node::spawn(
            endpoint.clone(),
            self.login.clone(),
            self.opts.clone(),
            Some(self.on_failover.clone()),
        ))
    }
}

struct SlotMap {
    /// Masters, including any a redirect named since the last refresh.
    nodes: Vec<Rc<Node>>,
    /// Slot → index into `nodes`.
    slots: Vec<u16>,
    /// The ranges of the last CLUSTER SLOTS, with their replicas.
    ranges: Vec<Range>,
}

/// A range of slots as CLUSTER SLOTS lists it: its master and its replicas.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Range {
    first: u16,
    last: u16,
    master: Endpoint,
    replicas: Vec<Endpoint>,
}

impl Cluster {
    /// A master that fails over marks the slots the map gives it in `failovers`.
    pub(crate) fn connect(
        seeds: Vec<Endpoint>,
        login: Rc<Login>,
        opts: RedisOptions,
        failovers: Rc<Failovers>,
    ) -> Cluster {
        let shared = Rc::new_cyclic(|shared: &std::rc::Weak<Shared>| Shared {
            seeds,
            nodes: NodeTemplate {
                login,
                opts,
                on_failover: {
                    let shared = shared.clone();
                    Rc::new(move |endpoint: &Endpoint, server_ms| {
                        if let Some(shared) = shared.upgrade() {
                            let slots = shared.map.borrow().slots_of(endpoint);
                            shared.failovers.mark(Some(slots), server_ms);
                        }
                    })
                },
            },
            map: RefCell::new(SlotMap {
                nodes: Vec::new(),
                slots: vec![UNSERVED; SLOTS],
                ranges: Vec::new(),
            }),
            refresh: Notify::default(),
            failovers,
        });
        let (stop, stopped) = oneshot::channel();
        monoio::spawn(maintain(shared.clone(), stopped));
        Cluster {
            shared,
            _stop: stop,
        }
    }

    pub(crate) fn is_connected(&self) -> bool {
        self.shared.map.borrow().is_connected()
    }

    /// Whether some master is connected: a command without a key has somewhere to go.
    pub(crate) fn reaches_any(&self) -> bool {
        self.shared
            .map
            .borrow()
            .nodes
            .iter()
            .any(|n| n.is_connected())
    }

    /// Sends the command to the master of `key`'s slot (any connected master for `None`),
    /// following redirects. Also returns the node that gave the final answer.
    pub(crate) async fn request(
        &self,
        key: Option<&[u8]>,
        parts: &[&[&[u8]]],
    ) -> (Result<Reply, RedisError>, Option<Rc<Node>>) {
        let slot = key.map(redis_keyslot);
        let mut asking: Option<Rc<Node>> = None;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let redirected = asking.is_some();
            let node = match asking.take() {
                Some(node) => node,
                None => match self.shared.map.borrow().route(slot) {
                    Some(node) => node,
                    None => {
                        self.shared.refresh.notify();
                        return (Err(RedisError::Disconnected), None);
                    }
                },
            };
            let result = if redirected {
                let asked = node.send(&[&[b"ASKING"]]);
                let reply = node.send(parts);
                // Its outcome shows in the reply: a refused ASKING gets the command redirected.
                let _ = asked.await;
                reply.await
            } else {
                node.send(parts).await
            };
            let last = attempt == MAX_ATTEMPTS;
            match result {
                Err(RedisError::Reply(msg)) if !last => {
                    if let Some((moved, target)) = redirect(&msg, "MOVED ", node.endpoint()) {
                        let mut map = self.shared.map.borrow_mut();
                        if map.was_replica(moved, &target) {
                            warn!(slot = moved, %target, "redis cluster failed over: a replica took the slot");
                            (self.shared.failovers).mark(Some([moved].into()), None);
                        }
                        map.assign(moved, &target, &self.shared.nodes);
                        drop(map);
                        self.shared.refresh.notify();
                    } else if let Some((_, target)) = redirect(&msg, "ASK ", node.endpoint()) {
                        asking = Some(
                            self.shared
                                .map
                                .borrow_mut()
                                .node(&target, &self.shared.nodes),
                        );
                    } else if msg.starts_with("TRYAGAIN") {
                        // A multi-key command while its slot is half migrated.
                        monoio::time::sleep(retry_delay(attempt)).await;
                    } else {
                        return (Err(RedisError::Reply(msg)), Some(node));
                    }
                }
                // After a redirect the target may be a master this core has only just started
                // connecting to: give it a moment instead of failing the request.
                Err(RedisError::Disconnected) if attempt > 1 && !last => {
                    monoio::time::sleep(retry_delay(attempt)).await;
                }
                Err(RedisError::Disconnected) => {
                    self.shared.refresh.notify();
                    return (Err(RedisError::Disconnected), Some(node));
                }
                result => return (result, Some(node)),
            }
        }
    }
}

fn retry_delay(attempt: u32) -> Duration {
    Duration::from_millis(20 * u64::from(attempt))
}

/// Parses `MOVED 3999 127.0.0.1:6381` / `ASK …` into (slot, target). Redis leaves the host
/// empty (`:6381`) when it does not know the target's address; that means "same host as me".
fn redirect(msg: &str, kind: &str, from: &Endpoint) -> Option<(u16, Endpoint)> {
    let (slot, addr) = msg.strip_prefix(kind)?.split_once(' ')?;
    let slot = slot.parse().ok().filter(|s| usize::from(*s) < SLOTS)?;
    let target = match addr.strip_prefix(':') {
        Some(port) => Endpoint {
            host: from.host.clone(),
            port: port.parse().ok()?,
        },
        None => parse_endpoint(addr).ok()?,
    };
    Some((slot, target))
}

impl SlotMap {
    fn is_connected(&self) -> bool {
        !self.slots.contains(&UNSERVED) && self.nodes.iter().all(|n| n.is_connected())
    }

    fn route(&self, slot: Option<u16>) -> Option<Rc<Node>> {
        let node = match slot {
            Some(slot) => self.nodes.get(usize::from(self.slots[usize::from(slot)])),
            None => self
                .nodes
                .iter()
                .find(|n| n.is_connected())
                .or(self.nodes.first()),
        };
        node.cloned()
    }

    /// Whether `endpoint` was a replica of `slot` by the last CLUSTER SLOTS.
    fn was_replica(&self, slot: u16, endpoint: &Endpoint) -> bool {
        self.ranges
            .iter()
            .any(|r| (r.first..=r.last).contains(&slot) && r.replicas.contains(endpoint))
    }

    /// The slots this map gives the master at `endpoint`.
    fn slots_of(&self, endpoint: &Endpoint) -> std::collections::BTreeSet<u16> {
        let Some(index) = self.nodes.iter().position(|n| n.endpoint() == endpoint) else {
            return Default::default();
        };
        (0..)
            .zip(&self.slots)
            .filter(|(_, owner)| usize::from(**owner) == index)
            .map(|(slot, _)| slot)
            .collect()
    }

    /// The node for `endpoint`, started now if this map has none yet.
    fn node(&mut self, endpoint: &Endpoint, template: &NodeTemplate) -> Rc<Node> {
        let index = self.index_of(endpoint, template);
        self.nodes[usize::from(index)].clone()
    }

    fn assign(&mut self, slot: u16, endpoint: &Endpoint, template: &NodeTemplate) {
        self.slots[usize::from(slot)] = self.index_of(endpoint, template);
    }

    fn index_of(&mut self, endpoint: &Endpoint, template: &NodeTemplate) -> u16 {
        let index = match self.nodes.iter().position(|n| n.endpoint() == endpoint) {
            Some(index) => index,
            None => {
                self.nodes.push(template.spawn(endpoint));
                self.nodes.len() - 1
            }
        };
        index as u16
    }

    /// Replaces the map with `ranges`, keeping the nodes (and their connections) of masters
    /// that are still masters; the others are dropped, closing their connections.
    fn replace(&mut self, ranges: Vec<Range>, template: &NodeTemplate) {
        let old = std::mem::take(&mut self.nodes);
        self.slots.fill(UNSERVED);
        for Range {
            first,
            last,
            master: endpoint,
            ..
        } in &ranges
        {
            let index = match self.nodes.iter().position(|n| n.endpoint() == endpoint) {
                Some(index) => index,
                None => {
                    let node = match old.iter().find(|n| n.endpoint() == endpoint) {
                        Some(node) => node.clone(),
                        None => template.spawn(endpoint),
                    };
                    self.nodes.push(node);
                    self.nodes.len() - 1
                }
            };
            self.slots[usize::from(*first)..=usize::from(*last)].fill(index as u16);
        }
        self.ranges = ranges;
    }
}

/// The slots whose master in `after` was one of their replicas in `before`: promoted.
fn promoted(before: &[Range], after: &[Range]) -> BTreeSet<u16> {
    let mut slots = BTreeSet::new();
    for now in after {
        for then in before {
            let (first, last) = (now.first.max(then.first), now.last.min(then.last));
            if first <= last && now.master != then.master && then.replicas.contains(&now.master) {
                slots.extend(first..=last);
            }
        }
    }
    slots
}

async fn maintain(shared: Rc<Shared>, mut stop: oneshot::Receiver<()>) {
    let mut backoff = Backoff::up_to(MAX_REFRESH_PAUSE);
    let mut failing = false;
    let mut due = true;
    loop {
        if due {
            let refreshed = monoio::select! {
                _ = &mut stop => return,
                refreshed = refresh(&shared) => refreshed,
            };
            match refreshed {
                Ok(()) => failing = false,
                Err(error) if !failing => {
                    failing = true;
                    warn!(%error, "redis cluster slot map refresh failed; retrying with backoff");
                }
                Err(error) => debug!(%error, "redis cluster slot map refresh failed"),
            }
        }
        // Pace refreshes: never back to back (every request to a dead master asks for one), and
        // backing off while some slot has no connected master.
        let pause = if shared.map.borrow().is_connected() {
            backoff.reset();
            MIN_REFRESH_GAP
        } else {
            backoff.next_delay()
        };
        monoio::select! {
            _ = &mut stop => return,
            _ = monoio::time::sleep(pause) => {}
        }
        due = !shared.map.borrow().is_connected()
            || monoio::select! {
                _ = &mut stop => return,
                _ = shared.refresh.notified() => true,
                _ = monoio::time::sleep(CHECK_INTERVAL) => false,
            };
    }
}

/// Fetches the map from the first node that answers: known masters first (they are the most
/// likely to be up), then the configured seeds.
async fn refresh(shared: &Shared) -> Result<(), String> {
    let mut candidates: Vec<Endpoint> = shared
        .map
        .borrow()
        .nodes
        .iter()
        .map(|n| n.endpoint().clone())
        .collect();
    for seed in &shared.seeds {
        if !candidates.contains(seed) {
            candidates.push(seed.clone());
        }
    }
    let mut errors = Vec::new();
    for endpoint in &candidates {
        let fetched = monoio::time::timeout(
            shared.nodes.opts.connect_timeout,
            fetch_slots(endpoint, &shared.nodes.login),
        )
        .await
        .unwrap_or_else(|_| Err(io::ErrorKind::TimedOut.into()));
        match fetched {
            Ok(ranges) => {
                let mut map = shared.map.borrow_mut();
                let promoted = promoted(&map.ranges, &ranges);
                if !promoted.is_empty() {
                    warn!(
                        slots = promoted.len(),
                        "redis cluster failed over: replicas took slots"
                    );
                    shared.failovers.mark(Some(promoted), None);
                }
                let before = map.nodes.len();
                map.replace(ranges, &shared.nodes);
                if map.nodes.len() != before {
                    info!(masters = map.nodes.len(), via = %endpoint, "redis cluster slot map loaded");
                }
                return Ok(());
            }
            Err(error) => errors.push(format!("{endpoint}: {error}")),
        }
    }
    Err(errors.join("; "))
}

async fn fetch_slots(endpoint: &Endpoint, login: &Login) -> io::Result<Vec<Range>> {
    let mut conn = login.open(endpoint).await.map_err(io::Error::other)?;
    let reply = conn
        .request(&[b"CLUSTER", b"SLOTS"])
        .await?
        .map_err(io::Error::other)?;
    parse_slots(&reply, endpoint).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("unexpected CLUSTER SLOTS reply {reply:?}"),
        )
    })
}

/// CLUSTER SLOTS: `[[first, last, [host, port, id, …], replicas…], …]`. An empty host means
/// the answering node does not know its own address: it is the one we asked.
fn parse_slots(reply: &Reply, queried: &Endpoint) -> Option<Vec<Range>> {
    let endpoint = |node: &Reply| {
        let [host, port, ..] = node.as_array()? else {
            return None;
        };
        let host = match host.as_str()? {
            "" | "?" => queried.host.clone(),
            host => host.to_string(),
        };
        let port = u16::try_from(port.as_int()?).ok().filter(|p| *p != 0)?;
        Some(Endpoint { host, port })
    };
    reply
        .as_array()?
        .iter()
        .map(|range| {
            let [first, last, master, replicas @ ..] = range.as_array()? else {
                return None;
            };
            let slot = |r: &Reply| {
                u16::try_from(r.as_int()?)
                    .ok()
                    .filter(|s| usize::from(*s) < SLOTS)
            };
            let (first, last) = (slot(first)?, slot(last)?);
            (first <= last).then_some(Range {
                first,
                last,
                master: endpoint(master)?,
                replicas: replicas.iter().filter_map(endpoint).collect(),
            })
        })
        .collect()
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

    fn range(first: u16, last: u16, master: Endpoint, replicas: &[Endpoint]) -> Range {
        Range {
            first,
            last,
            master,
            replicas: replicas.to_vec(),
        }
    }

    #[test]
    fn a_slot_whose_replica_became_its_master_was_failed_over() {
        let (a, b, c) = (ep("h", 7000), ep("h", 7001), ep("h", 7002));
        let before = [
            range(0, 99, a.clone(), std::slice::from_ref(&b)),
            range(100, 199, c.clone(), &[]),
        ];
        // b promoted for 0–99; 100–149 migrated to a (no replica of it: a resharding).
        let after = [
            range(0, 99, b, std::slice::from_ref(&a)),
            range(100, 149, a, &[]),
            range(150, 199, c, &[]),
        ];
        assert_eq!(promoted(&before, &after), (0..=99).collect());
        assert!(promoted(&after, &after).is_empty());
        assert!(promoted(&[], &after).is_empty());
    }

    #[test]
    fn parses_redirects() {
        let from = ep("10.0.0.1", 7000);
        assert_eq!(
            redirect("MOVED 3999 127.0.0.1:6381", "MOVED ", &from),
            Some((3999, ep("127.0.0.1", 6381)))
        );
        assert_eq!(
            redirect("ASK 12 :7002", "ASK ", &from),
            Some((12, ep("10.0.0.1", 7002)))
        );
        assert_eq!(redirect("MOVED 3999 127.0.0.1:6381", "ASK ", &from), None);
        assert_eq!(redirect("MOVED 16384 h:1", "MOVED ", &from), None);
        assert_eq!(redirect("ERR MOVED", "MOVED ", &from), None);
    }

    #[test]
    fn parses_cluster_slots() {
        let bulk = |s: &str| Reply::Bulk(s.into());
        let reply = Reply::Array(vec![
            Reply::Array(vec![
                Reply::Int(0),
                Reply::Int(5460),
                Reply::Array(vec![bulk("127.0.0.1"), Reply::Int(7000), bulk("id0")]),
                Reply::Array(vec![bulk("127.0.0.1"), Reply::Int(7003), bulk("id3")]),
            ]),
            Reply::Array(vec![
                Reply::Int(5461),
                Reply::Int(16383),
                Reply::Array(vec![bulk(""), Reply::Int(7001), bulk("id1")]),
            ]),
        ]);
        let queried = ep("redis-a", 7001);
        assert_eq!(
            parse_slots(&reply, &queried),
            Some(vec![
                range(0, 5460, ep("127.0.0.1", 7000), &[ep("127.0.0.1", 7003)]),
                range(5461, 16383, ep("redis-a", 7001), &[]),
            ])
        );
        let bad = Reply::Array(vec![Reply::Array(vec![
            Reply::Int(10),
            Reply::Int(5),
            Reply::Array(vec![bulk("h"), Reply::Int(1)]),
        ])]);
        assert_eq!(parse_slots(&bad, &queried), None);
    }
}
