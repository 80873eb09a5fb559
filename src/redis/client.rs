//! `Redis`: the per-core handle every caller uses, the same API for a single server and for a
//! Redis Cluster. It picks the key a command is routed by, runs scripts through EVALSHA, waits
//! for replicas to hold a write (strict mode's `WAIT`), and keeps the failovers its connections
//! saw until the placement path takes them.

use std::rc::Rc;
use std::time::{Duration, Instant};

use super::cluster::Cluster;
use super::connection::Decimal;
use super::failover::{FailedOver, Failovers};
use super::login::Login;
use super::node::Node;
use super::options::RedisOptions;
use super::wait_lane::WaitLane;
use super::{RedisError, RedisTarget, Reply, Script};

/// A core's Redis client. Cheap to clone; not `Send` (it belongs to the runtime that created
/// it). Dropping the last clone stops its background tasks.
#[derive(Clone)]
pub struct Redis {
    backend: Rc<Backend>,
    failovers: Rc<Failovers>,
    /// Told each script call's index and duration (the node's per-script histograms).
    observer: Option<Rc<dyn Fn(usize, Duration)>>,
}

enum Backend {
    Single { node: Rc<Node>, lane: WaitLane },
    Cluster(Cluster),
}

impl Redis {
    /// Starts connecting in the background; must be called inside a running monoio runtime
    /// with timers enabled. Until the first connection is up (through TLS for a `rediss`
    /// target, and logged in), requests fail with `Disconnected`; so they do while the server
    /// refuses the login or its certificate does not verify.
    pub fn connect(target: &RedisTarget, opts: RedisOptions) -> Redis {
        let login = Rc::new(Login::of(target, &opts));
        let failovers = Rc::new(Failovers::default());
        let backend = match target {
            RedisTarget::Single { endpoint, .. } => {
                let marks = failovers.clone();
                let node = Node::spawn(
                    endpoint.clone(),
                    login.clone(),
                    opts.clone(),
                    Some(Rc::new(move |_: &_, server_ms| marks.mark(None, server_ms))),
                );
                Backend::Single {
                    node: Rc::new(node),
                    lane: WaitLane::new(endpoint.clone(), login, opts),
                }
            }
            RedisTarget::Cluster { seeds, .. } => Backend::Cluster(Cluster::connect(
                seeds.clone(),
                login,
                opts,
                failovers.clone(),
            )),
        };
        Redis {
            backend: Rc::new(backend),
            failovers,
            observer: None,
        }
    }

    /// The failovers this handle's connections saw since the last call (see
    /// [`super::failover`]).
    pub fn take_failed_over(&self) -> FailedOver {
        self.failovers.take()
    }

    /// Gives back what [`Redis::take_failed_over`] took, when acting on it failed.
    pub fn restore_failed_over(&self, failed: FailedOver) {
        self.failovers.restore(failed);
    }

    /// `WAIT replicas timeout` after a write answered on the connection `key` is routed by:
    /// how many replicas acknowledged it (fewer than `replicas` when `timeout` ran out first).
    /// A single server's goes on a connection of its own ([`WaitLane`]); in a cluster it goes
    /// on the master's pipelined connection, right behind the write (a `PUBLISH` there is not
    /// replicated through the stream), which the core's other requests to that master then
    /// wait behind.
    pub async fn wait_for_replicas(
        &self,
        key: &[u8],
        replicas: u32,
        timeout: Duration,
    ) -> Result<i64, RedisError> {
        let cluster = match &*self.backend {
            Backend::Single { lane, .. } => return lane.wait(replicas, timeout).await,
            Backend::Cluster(cluster) => cluster,
        };
        let replicas = Decimal::new(replicas as usize);
        let millis = Decimal::new(timeout.as_millis() as usize);
        let wait: [&[u8]; 3] = [b"WAIT", replicas.as_bytes(), millis.as_bytes()];
        let acknowledged = cluster.request(Some(key), &[&wait]).await.0?;
        acknowledged
            .as_int()
            .ok_or_else(|| RedisError::Protocol(format!("WAIT answered {acknowledged:?}")))
    }

    /// Tells `observer` how long each script call took (its reply included, and a NOSCRIPT
    /// reload when there was one), by the script's index.
    pub fn observed(self, observer: impl Fn(usize, Duration) + 'static) -> Redis {
        Redis {
            observer: Some(Rc::new(observer)),
            ..self
        }
    }

    /// Single server: the connection is up. Cluster: every slot is served by a connected master.
    pub fn is_connected(&self) -> bool {
        match &*self.backend {
            Backend::Single { node, .. } => node.is_connected(),
            Backend::Cluster(cluster) => cluster.is_connected(),
        }
    }

    /// Whether a command without a key would be sent now: single server, the connection is
    /// up; cluster, some master is connected (a partial outage answers for its slots alone).
    pub fn reachable(&self) -> bool {
        match &*self.backend {
            Backend::Single { node, .. } => node.is_connected(),
            Backend::Cluster(cluster) => cluster.reaches_any(),
        }
    }

    /// Runs one command, e.g. `cmd(&[b"SET", key, value])`.
    pub async fn cmd(&self, args: &[&[u8]]) -> Result<Reply, RedisError> {
        self.dispatch(routing_key(args), &[args]).await.0
    }

    /// Runs `script` with EVALSHA. A server that does not know the script (restarted, flushed,
    /// or a cluster node seen for the first time) answers NOSCRIPT: the source is then loaded on
    /// that very node and the call retried once.
    pub async fn evalsha(
        &self,
        script: &Script,
        keys: &[&[u8]],
        args: &[&[u8]],
    ) -> Result<Reply, RedisError> {
        let Some(observer) = &self.observer else {
            return self.run_script(script, keys, args).await;
        };
        let started = Instant::now();
        let result = self.run_script(script, keys, args).await;
        observer(script.index, started.elapsed());
        result
    }

    async fn run_script(
        &self,
        script: &Script,
        keys: &[&[u8]],
        args: &[&[u8]],
    ) -> Result<Reply, RedisError> {
        let numkeys = Decimal::new(keys.len());
        let head: [&[u8]; 3] = [b"EVALSHA", script.sha().as_bytes(), numkeys.as_bytes()];
        let parts = [&head[..], keys, args];
        let key = keys.first().copied();
        let (result, node) = self.dispatch(key, &parts).await;
        match (result, node) {
            (Err(RedisError::Reply(msg)), Some(node)) if msg.starts_with("NOSCRIPT") => {
                let loaded = node
                    .send(&[&[b"SCRIPT", b"LOAD", script.source.as_bytes()]])
                    .await?;
                if loaded.as_bytes() != Some(script.sha().as_bytes()) {
                    return Err(RedisError::Protocol(format!(
                        "SCRIPT LOAD of {} answered {loaded:?}, expected {}",
                        script.name,
                        script.sha()
                    )));
                }
                self.dispatch(key, &parts).await.0
            }
            (result, _) => result,
        }
    }

    /// Sends the command where `key` lives (anywhere for `None`); also returns the node that
    /// gave the final answer, if any did.
    async fn dispatch(
        &self,
        key: Option<&[u8]>,
        parts: &[&[&[u8]]],
    ) -> (Result<Reply, RedisError>, Option<Rc<Node>>) {
        match &*self.backend {
            Backend::Single { node, .. } => (node.send(parts).await, Some(node.clone())),
            Backend::Cluster(cluster) => cluster.request(key, parts).await,
        }
    }
}

/// The key a command is routed by in cluster mode: the first key, or none for commands that do
/// not name one (any master may answer those).
fn routing_key<'a>(args: &[&'a [u8]]) -> Option<&'a [u8]> {
    const SCRIPTS: &[&[u8]] = &[
        b"EVAL",
        b"EVALSHA",
        b"EVAL_RO",
        b"EVALSHA_RO",
        b"FCALL",
        b"FCALL_RO",
    ];
    const KEYLESS: &[&[u8]] = &[
        b"PING",
        b"ECHO",
        b"TIME",
        b"SCRIPT",
        b"INFO",
        b"CLUSTER",
        b"CONFIG",
        b"CLIENT",
        b"COMMAND",
        b"DBSIZE",
        b"FLUSHALL",
        b"FLUSHDB",
    ];
    let (name, rest) = args.split_first()?;
    let is = |set: &[&[u8]]| set.iter().any(|c| c.eq_ignore_ascii_case(name));
    if is(SCRIPTS) {
        // EVALSHA sha numkeys key…
        match rest.get(1) {
            Some(&b"0") => None,
            _ => rest.get(2).copied(),
        }
    } else if is(KEYLESS) {
        None
    } else {
        rest.first().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::routing_key;

    #[test]
    fn routes_by_first_key() {
        let key: Option<&[u8]> = Some(b"k");
        assert_eq!(routing_key(&[b"GET", b"k"]), key);
        assert_eq!(routing_key(&[b"hset", b"k", b"f", b"v"]), key);
        assert_eq!(
            routing_key(&[b"EVALSHA", b"abc", b"2", b"k", b"k2", b"a"]),
            key
        );
        assert_eq!(routing_key(&[b"evalsha", b"abc", b"0", b"a"]), None);
        assert_eq!(routing_key(&[b"SCRIPT", b"LOAD", b"return 1"]), None);
        assert_eq!(routing_key(&[b"PING"]), None);
        assert_eq!(routing_key(&[]), None);
    }
}
