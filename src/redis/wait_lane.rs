//! A single server's `WAIT` lane: a second connection per core, opened at the first `WAIT` and
//! used for nothing else. A `WAIT` blocks its connection for up to its timeout; on the
//! pipelined one every request of the core would wait behind it.
//!
//! `WAIT` counts the replicas holding the writes of its own connection, and this one writes
//! nothing else: so each `WAIT` follows a `PUBLISH` on [`BARRIER`] (nobody need listen), which
//! a single server replicates like a write, later in the stream than every write already
//! answered on the other connection. One `PUBLISH` + `WAIT` is in flight at a time; the callers
//! that come meanwhile share the next one (a group commit): each came after its own write was
//! answered, and the next `PUBLISH` is sent after they all came, so it covers every one.

use std::cell::{Cell, OnceCell, RefCell};
use std::rc::Rc;
use std::time::Duration;

use local_sync::oneshot;

use super::connection::Decimal;
use super::login::Login;
use super::node::Node;
use super::options::RedisOptions;
use super::{Endpoint, RedisError};

/// The channel of the `PUBLISH` each `WAIT` follows.
const BARRIER: &str = "pinboard:wait-barrier";

pub(crate) struct WaitLane {
    endpoint: Endpoint,
    login: Rc<Login>,
    opts: RedisOptions,
    state: OnceCell<Rc<Lane>>,
}

struct Lane {
    node: Node,
    /// Whether a `PUBLISH` + `WAIT` is in flight (its task then sends the next).
    busy: Cell<bool>,
    /// The callers for the next one: how many replicas each wants, within how long, and where
    /// its answer goes.
    next: RefCell<Vec<Waiter>>,
}

struct Waiter {
    replicas: u32,
    timeout: Duration,
    answer: oneshot::Sender<Result<i64, RedisError>>,
}

impl WaitLane {
    pub(crate) fn new(endpoint: Endpoint, login: Rc<Login>, opts: RedisOptions) -> WaitLane {
        WaitLane {
            endpoint,
            login,
            opts,
            state: OnceCell::new(),
        }
    }

    /// How many replicas acknowledged every write answered on this core's other connection
    /// before the call (at least `replicas`, or fewer once `timeout` ran out).
    pub(crate) async fn wait(&self, replicas: u32, timeout: Duration) -> Result<i64, RedisError> {
        let lane = self.lane();
        if !lane.node.connected_within(self.opts.connect_timeout).await {
            return Err(RedisError::Disconnected);
        }
        let (answer, answered) = oneshot::channel();
        lane.next.borrow_mut().push(Waiter {
            replicas,
            timeout,
            answer,
        });
        if !lane.busy.replace(true) {
            monoio::spawn(send_while_asked(lane.clone()));
        }
        answered.await.unwrap_or(Err(RedisError::Disconnected))
    }

    fn lane(&self) -> &Rc<Lane> {
        self.state.get_or_init(|| {
            Rc::new(Lane {
                node: Node::spawn(
                    self.endpoint.clone(),
                    self.login.clone(),
                    self.opts.clone(),
                    None,
                ),
                busy: Cell::new(false),
                next: RefCell::new(Vec::new()),
            })
        })
    }
}

/// Sends one `PUBLISH` + `WAIT` for the callers waiting, answers them all, and again while
/// more came meanwhile.
async fn send_while_asked(lane: Rc<Lane>) {
    loop {
        let waiters = std::mem::take(&mut *lane.next.borrow_mut());
        let (Some(replicas), Some(timeout)) = (
            waiters.iter().map(|w| w.replicas).max(),
            waiters.iter().map(|w| w.timeout).min(),
        ) else {
            lane.busy.set(false);
            return;
        };
        let replicas = Decimal::new(replicas as usize);
        let millis = Decimal::new(timeout.as_millis() as usize);
        let barrier = lane.node.send(&[&[b"PUBLISH", BARRIER.as_bytes(), b""]]);
        let waited = lane
            .node
            .send(&[&[b"WAIT", replicas.as_bytes(), millis.as_bytes()]]);
        let acknowledged = match barrier.await {
            Ok(_) => waited.await.and_then(|reply| {
                reply
                    .as_int()
                    .ok_or_else(|| RedisError::Protocol(format!("WAIT answered {reply:?}")))
            }),
            Err(e) => Err(e),
        };
        for waiter in waiters {
            let _ = waiter.answer.send(acknowledged.clone());
        }
    }
}
