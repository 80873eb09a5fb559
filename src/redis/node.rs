//! One pipelined, self-healing connection to one Redis server.
//!
//! Requests are encoded straight into a shared write buffer and answered in FIFO order by a
//! background task that owns the socket; it reconnects with exponential backoff after any
//! failure. While no connection is up, requests fail at once instead of queueing behind an
//! outage. A single server is one `Node`; a cluster is one `Node` per master.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::rc::Rc;
use std::time::Duration;

use bytes::BytesMut;
use local_sync::oneshot;
use monoio::io::AsyncWriteRentExt;
use tracing::{debug, info, warn};

use super::client::RedisOptions;
use super::connection::{Connection, Decimal, ReadHalf, WriteHalf, encode_command};
use super::notify::Notify;
use super::{Endpoint, RedisError, Reply};

/// What to send on every (re)connect before the connection is used.
pub(crate) struct Login {
    pub(crate) password: Option<String>,
    pub(crate) db: u32,
}

pub(crate) struct Node {
    shared: Rc<Shared>,
    /// Dropping the last handle drops this, which ends the background task.
    _stop: oneshot::Sender<()>,
}

struct Shared {
    endpoint: Endpoint,
    login: Login,
    opts: RedisOptions,
    link: RefCell<Link>,
    wake_writer: Notify,
}

struct Link {
    up: bool,
    /// Encoded requests not yet handed to the socket.
    wbuf: BytesMut,
    /// One entry per request written or buffered, in wire order. A timed-out caller drops its
    /// receiver but the entry stays, so its late reply is consumed (and discarded) in turn.
    waiting: VecDeque<oneshot::Sender<Result<Reply, RedisError>>>,
}

impl Node {
    /// Starts connecting in the background on the current monoio runtime.
    pub(crate) fn spawn(endpoint: Endpoint, login: Login, opts: RedisOptions) -> Node {
        let shared = Rc::new(Shared {
            endpoint,
            login,
            opts,
            link: RefCell::new(Link {
                up: false,
                wbuf: BytesMut::new(),
                waiting: VecDeque::new(),
            }),
            wake_writer: Notify::default(),
        });
        let (stop, stopped) = oneshot::channel();
        monoio::spawn(supervise(shared.clone(), stopped));
        Node {
            shared,
            _stop: stop,
        }
    }

    pub(crate) fn endpoint(&self) -> &Endpoint {
        &self.shared.endpoint
    }

    pub(crate) fn is_connected(&self) -> bool {
        self.shared.link.borrow().up
    }

    /// Queues the command (the concatenation of `parts`) now, and returns the future of its
    /// reply. Commands queued back to back without an await between them reach the server back
    /// to back, which is what `ASKING` needs.
    pub(crate) fn send(
        &self,
        parts: &[&[&[u8]]],
    ) -> impl Future<Output = Result<Reply, RedisError>> + 'static {
        let queued = self.enqueue(parts);
        let timeout = self.shared.opts.request_timeout;
        async move {
            match monoio::time::timeout(timeout, queued?).await {
                Err(_) => Err(RedisError::Timeout),
                // The sender was dropped: the connection went down with this request on it.
                Ok(Err(_)) => Err(RedisError::Disconnected),
                Ok(Ok(reply)) => reply,
            }
        }
    }

    fn enqueue(
        &self,
        parts: &[&[&[u8]]],
    ) -> Result<oneshot::Receiver<Result<Reply, RedisError>>, RedisError> {
        let mut link = self.shared.link.borrow_mut();
        if !link.up {
            return Err(RedisError::Disconnected);
        }
        encode_command(&mut link.wbuf, parts);
        let (tx, rx) = oneshot::channel();
        link.waiting.push_back(tx);
        drop(link);
        self.shared.wake_writer.notify();
        Ok(rx)
    }
}

impl Shared {
    fn go_up(&self) {
        self.link.borrow_mut().up = true;
    }

    fn go_down(&self) {
        let mut link = self.link.borrow_mut();
        link.up = false;
        link.wbuf.clear();
        let waiting = std::mem::take(&mut link.waiting);
        drop(link);
        // Dropping the senders wakes every caller with `Disconnected`.
        drop(waiting);
    }
}

/// Exponential backoff with jitter: 50 ms doubling to 2 s, each delay drawn from its upper half
/// so that cores (and nodes) restarted together do not reconnect in lockstep.
pub(crate) struct Backoff {
    next: Duration,
}

impl Backoff {
    const FIRST: Duration = Duration::from_millis(50);
    const MAX: Duration = Duration::from_secs(2);

    pub(crate) fn new() -> Backoff {
        Backoff { next: Self::FIRST }
    }

    pub(crate) fn reset(&mut self) {
        self.next = Self::FIRST;
    }

    pub(crate) fn next_delay(&mut self) -> Duration {
        let base = self.next;
        self.next = (base * 2).min(Self::MAX);
        let half = base.as_millis() as u32 / 2;
        Duration::from_millis(u64::from(half + monoio::utils::thread_rng_n(half + 1)))
    }
}

async fn supervise(shared: Rc<Shared>, mut stop: oneshot::Receiver<()>) {
    let endpoint = &shared.endpoint;
    let mut backoff = Backoff::new();
    // Only the first failure of a streak is worth a warning; the rest would flood the log while
    // Redis is down.
    let mut failing = false;
    loop {
        let opened = monoio::select! {
            _ = &mut stop => return,
            opened = monoio::time::timeout(shared.opts.connect_timeout, open_session(&shared)) => opened,
        };
        match opened.unwrap_or_else(|_| Err(io::ErrorKind::TimedOut.into())) {
            Ok(conn) => {
                backoff.reset();
                failing = false;
                info!(%endpoint, "redis connected");
                shared.go_up();
                let error = monoio::select! {
                    _ = &mut stop => {
                        shared.go_down();
                        return;
                    }
                    error = pipeline(&shared, conn) => error,
                };
                shared.go_down();
                warn!(%endpoint, %error, "redis connection lost");
            }
            Err(error) if !failing => {
                failing = true;
                warn!(%endpoint, %error, "redis connect failed; retrying with backoff");
            }
            Err(error) => debug!(%endpoint, %error, "redis connect failed"),
        }
        let delay = backoff.next_delay();
        monoio::select! {
            _ = &mut stop => return,
            _ = monoio::time::sleep(delay) => {}
        }
    }
}

/// Connects and logs in. The closing PING makes sure the server actually serves requests
/// (a full server answers `-ERR max clients` and hangs up) before the node reports connected.
async fn open_session(shared: &Shared) -> io::Result<Connection> {
    let mut conn = Connection::open(&shared.endpoint).await?;
    if let Some(password) = &shared.login.password {
        login_step(&mut conn, &[b"AUTH", password.as_bytes()]).await?;
    }
    if shared.login.db != 0 {
        let db = Decimal::new(shared.login.db as usize);
        login_step(&mut conn, &[b"SELECT", db.as_bytes()]).await?;
    }
    login_step(&mut conn, &[b"PING"]).await?;
    Ok(conn)
}

async fn login_step(conn: &mut Connection, args: &[&[u8]]) -> io::Result<()> {
    conn.request(args).await?.map(drop).map_err(|e| {
        let command = String::from_utf8_lossy(args[0]);
        io::Error::other(format!("{command} failed: {e}"))
    })
}

/// Runs the connection until it fails; returns why.
async fn pipeline(shared: &Shared, conn: Connection) -> io::Error {
    let (reader, writer, spare) = conn.into_parts();
    monoio::select! {
        error = read_replies(shared, reader) => error,
        error = write_requests(shared, writer, spare) => error,
    }
}

async fn read_replies(shared: &Shared, mut reader: ReadHalf) -> io::Error {
    loop {
        let reply = match reader.next().await {
            Ok(reply) => reply,
            Err(error) => return error,
        };
        let Some(waiter) = shared.link.borrow_mut().waiting.pop_front() else {
            return io::Error::new(io::ErrorKind::InvalidData, "reply without a request");
        };
        // A closed receiver is a caller that timed out: its reply is dropped here.
        let _ = waiter.send(reply);
    }
}

/// Writes everything queued since the last write in one syscall. Two buffers alternate: callers
/// fill one while the other is on the wire, so steady state allocates nothing.
async fn write_requests(shared: &Shared, mut writer: WriteHalf, mut spare: BytesMut) -> io::Error {
    loop {
        while shared.link.borrow().wbuf.is_empty() {
            shared.wake_writer.notified().await;
        }
        let batch = std::mem::replace(&mut shared.link.borrow_mut().wbuf, spare);
        let (written, mut batch) = writer.write_all(batch).await;
        if let Err(error) = written {
            return error;
        }
        batch.clear();
        spare = batch;
    }
}
