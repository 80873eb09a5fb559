//! One pipelined, self-healing connection to one Redis server.
//!
//! Requests are encoded straight into a shared write buffer and answered in FIFO order by a
//! background task that owns the connection; it opens and logs in every connection first
//! (`login`: TLS too for a `rediss` target), and reconnects with exponential backoff after any
//! failure, a refused login or a certificate that does not verify included (the first failure
//! of a streak is logged at warn, and the first that is the configuration's if it came later;
//! the rest at debug). While no connection is up, requests fail
//! at once instead of queueing behind an outage. A single server is one `Node`; a cluster is
//! one `Node` per master. A watched node asks every server it connects to who it is
//! (`failover`) before using the connection, and reports a different one at its address.

use std::cell::RefCell;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::BytesMut;
use local_sync::oneshot;
use monoio::io::AsyncWriteRentExt;
use tracing::{debug, info, warn};

use super::connection::{Connection, ReadHalf, WriteHalf, encode_command};
use super::failover::{Identity, server_time_ms};
use super::login::Login;
use super::notify::Notify;
use super::options::RedisOptions;
use super::slots::ReplySlots;
use super::{Endpoint, RedisError, Reply};

pub(crate) struct Node {
    shared: Rc<Shared>,
    /// Dropping the last handle drops this, which ends the background task.
    _stop: oneshot::Sender<()>,
}

struct Shared {
    endpoint: Endpoint,
    /// Run on every (re)connect before the connection is used.
    login: Rc<Login>,
    opts: RedisOptions,
    link: RefCell<Link>,
    wake_writer: Notify,
    watch: Option<Watch>,
}

/// Told when the server at the node's address is another than the one it last connected to:
/// with Redis's clock then (ms), when it could be read.
pub(crate) type OnFailover = Rc<dyn Fn(&Endpoint, Option<i64>)>;

/// Who the node last found at its address, and whom to tell when that changes.
struct Watch {
    seen: RefCell<Option<Identity>>,
    on_failover: OnFailover,
    /// Whether a server's refusal to say who it is was logged.
    told_unseen: std::cell::Cell<bool>,
}

struct Link {
    up: bool,
    /// Encoded requests not yet handed to the socket.
    wbuf: BytesMut,
    /// A reply slot per request written or buffered, in wire order. A timed-out caller gives up
    /// its slot but the slot stays queued, so its late reply is consumed (and discarded) in turn.
    slots: ReplySlots,
}

impl Node {
    /// Starts connecting in the background on the current monoio runtime. With `on_failover`,
    /// every connection asks the server who it is before it carries a request.
    pub(crate) fn spawn(
        endpoint: Endpoint,
        login: Rc<Login>,
        opts: RedisOptions,
        on_failover: Option<OnFailover>,
    ) -> Node {
        let shared = Rc::new(Shared {
            endpoint,
            login,
            opts,
            link: RefCell::new(Link {
                up: false,
                wbuf: BytesMut::new(),
                slots: ReplySlots::default(),
            }),
            wake_writer: Notify::default(),
            watch: on_failover.map(|on_failover| Watch {
                seen: RefCell::new(None),
                on_failover,
                told_unseen: std::cell::Cell::new(false),
            }),
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

    /// Whether the node is connected, or gets connected within `within`.
    pub(crate) async fn connected_within(&self, within: Duration) -> bool {
        const POLL: Duration = Duration::from_millis(5);
        let deadline = std::time::Instant::now() + within;
        while !self.is_connected() {
            if std::time::Instant::now() >= deadline {
                return false;
            }
            monoio::time::sleep(POLL).await;
        }
        true
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
            // On a timeout the `Pending` is dropped, which gives its slot up.
            monoio::time::timeout(timeout, queued?)
                .await
                .unwrap_or(Err(RedisError::Timeout))
        }
    }

    fn enqueue(&self, parts: &[&[&[u8]]]) -> Result<Pending, RedisError> {
        let mut link = self.shared.link.borrow_mut();
        if !link.up {
            return Err(RedisError::Disconnected);
        }
        encode_command(&mut link.wbuf, parts);
        let slot = link.slots.queue();
        drop(link);
        self.shared.wake_writer.notify();
        Ok(Pending {
            shared: self.shared.clone(),
            slot: Some(slot),
        })
    }
}

/// A queued command's reply: resolves once it has come in (or the connection has gone down with
/// the command on it, as `Disconnected`). Dropped before that, it gives its slot up.
struct Pending {
    shared: Rc<Shared>,
    /// Ours until the reply is taken.
    slot: Option<usize>,
}

impl Future for Pending {
    type Output = Result<Reply, RedisError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let Some(slot) = self.slot else {
            return Poll::Ready(Err(RedisError::Disconnected));
        };
        let polled = self.shared.link.borrow_mut().slots.poll(slot, cx);
        if polled.is_ready() {
            self.slot = None;
        }
        polled
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if let Some(slot) = self.slot
            && let Ok(mut link) = self.shared.link.try_borrow_mut()
        {
            link.slots.abandon(slot);
        }
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
        drop(link);
        // Every command still on the connection fails with `Disconnected`; each caller is woken
        // with the link no longer borrowed.
        loop {
            let answered = self
                .link
                .borrow_mut()
                .slots
                .answer(Err(RedisError::Disconnected));
            match answered {
                Ok(waker) => waker.into_iter().for_each(|w| w.wake()),
                Err(_) => break,
            }
        }
    }
}

/// Exponential backoff with jitter: 50 ms doubling to 2 s, each delay drawn from its upper half
/// so that cores (and nodes) restarted together do not reconnect in lockstep.
pub(crate) struct Backoff {
    next: Duration,
    max: Duration,
}

impl Backoff {
    const FIRST: Duration = Duration::from_millis(50);
    const MAX: Duration = Duration::from_secs(2);

    pub(crate) fn new() -> Backoff {
        Backoff::up_to(Self::MAX)
    }

    /// Doubling from 50 ms up to `max` (jittered: each delay is between half and all of it).
    pub(crate) fn up_to(max: Duration) -> Backoff {
        Backoff {
            next: Self::FIRST,
            max,
        }
    }

    pub(crate) fn reset(&mut self) {
        self.next = Self::FIRST;
    }

    pub(crate) fn next_delay(&mut self) -> Duration {
        let base = self.next;
        self.next = (base * 2).min(self.max);
        let half = base.as_millis() as u32 / 2;
        Duration::from_millis(u64::from(half + monoio::utils::thread_rng_n(half + 1)))
    }
}

async fn supervise(shared: Rc<Shared>, mut stop: oneshot::Receiver<()>) {
    let endpoint = &shared.endpoint;
    let mut backoff = Backoff::new();
    // Only the first failure of a streak is worth a warning, and the first that waiting will not
    // fix (a refused login, a certificate that does not verify) when the streak began with
    // another (Redis restarting into it): the rest would flood the log while Redis is down.
    let mut failing = false;
    let mut told_configuration = false;
    loop {
        let opened = monoio::select! {
            _ = &mut stop => return,
            opened = shared.login.open_within(endpoint, shared.opts.connect_timeout) => opened,
        };
        let opened = match opened {
            Ok(conn) => {
                let checked = monoio::select! {
                    _ = &mut stop => return,
                    checked = tell_failover(&shared, conn) => checked,
                };
                checked.map_err(super::LoginError::Io)
            }
            Err(error) => Err(error),
        };
        match opened {
            Ok(conn) => {
                backoff.reset();
                failing = false;
                told_configuration = false;
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
            Err(error) if !failing || (!told_configuration && error.is_configuration_error()) => {
                failing = true;
                told_configuration |= error.is_configuration_error();
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

/// A watched node's new connection: who answers is asked, and a server other than the one
/// last seen there reported, before the connection carries any request (so that whatever the
/// report sets in motion is queued ahead of them). A server that will not say is used all
/// the same (and said once).
async fn tell_failover(shared: &Shared, mut conn: Connection) -> io::Result<Connection> {
    let Some(watch) = &shared.watch else {
        return Ok(conn);
    };
    let endpoint = &shared.endpoint;
    let within = shared.opts.connect_timeout;
    let asked = monoio::time::timeout(within, Identity::ask(&mut conn))
        .await
        .unwrap_or_else(|_| Err(io::ErrorKind::TimedOut.into()))?;
    let identity = match asked {
        Ok(identity) => identity,
        Err(error) => {
            if !watch.told_unseen.replace(true) {
                warn!(%endpoint, %error, "redis will not say who it is: failovers there go unseen");
            }
            return Ok(conn);
        }
    };
    let changed = watch
        .seen
        .borrow()
        .as_ref()
        .is_some_and(|seen| *seen != identity);
    if changed {
        // Asked before `seen` moves on: a connection lost here reports it at the next one.
        let server_ms = monoio::time::timeout(within, server_time_ms(&mut conn))
            .await
            .unwrap_or_else(|_| Err(io::ErrorKind::TimedOut.into()))?;
        warn!(%endpoint, ?identity, "redis failed over: another server answers at this address");
        (watch.on_failover)(endpoint, server_ms);
    }
    watch.seen.replace(Some(identity));
    Ok(conn)
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
        // A caller that timed out has given its slot up: its reply is dropped here.
        let answered = shared.link.borrow_mut().slots.answer(reply);
        match answered {
            Ok(waker) => waker.into_iter().for_each(|w| w.wake()),
            Err(_) => return io::Error::new(io::ErrorKind::InvalidData, "reply without a request"),
        }
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

#[cfg(test)]
mod tests {
    use local_sync::mpsc::unbounded;
    use monoio::io::AsyncReadRent;
    use monoio::net::TcpListener;

    use super::*;

    /// A Redis stand-in that answers the login's PING, then writes whatever it is handed (and
    /// hangs up when handed nothing): the test decides when each reply arrives.
    fn scripted_server() -> (Endpoint, unbounded::Tx<Option<&'static [u8]>>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let (tx, mut rx) = unbounded::channel::<Option<&'static [u8]>>();
        monoio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let (read, _) = stream.read(vec![0u8; 64]).await;
            read.unwrap();
            stream.write_all(&b"+PONG\r\n"[..]).await.0.unwrap();
            while let Some(Some(replies)) = rx.recv().await {
                stream.write_all(replies).await.0.unwrap();
            }
        });
        let endpoint = Endpoint {
            host: "127.0.0.1".into(),
            port,
        };
        (endpoint, tx)
    }

    fn bulk(s: &'static str) -> Result<Reply, RedisError> {
        Ok(Reply::Bulk(s.into()))
    }

    #[test]
    fn callers_that_gave_up_never_see_a_later_callers_reply() {
        let mut runtime = monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
            .enable_timer()
            .build()
            .unwrap();
        runtime.block_on(async {
            let (endpoint, server) = scripted_server();
            let login = Rc::new(Login::new(None, 0));
            let node = Node::spawn(endpoint, login, RedisOptions::default(), None);
            while !node.is_connected() {
                monoio::time::sleep(Duration::from_millis(5)).await;
            }
            // Dropped before it was ever polled.
            drop(node.send(&[&[b"GET", b"a"]]));
            // Timed out, with its waker registered.
            let short = Duration::from_millis(20);
            assert!(
                monoio::time::timeout(short, node.send(&[&[b"GET", b"b"]]))
                    .await
                    .is_err()
            );
            let c = node.send(&[&[b"GET", b"c"]]);
            server
                .send(Some(b"$1\r\na\r\n$1\r\nb\r\n$1\r\nc\r\n"))
                .unwrap();
            assert_eq!(c.await, bulk("c"));
            // The freed slots are reused, still in wire order.
            let (d, e) = (node.send(&[&[b"GET", b"d"]]), node.send(&[&[b"GET", b"e"]]));
            server.send(Some(b"$1\r\nd\r\n$1\r\ne\r\n")).unwrap();
            assert_eq!((e.await, d.await), (bulk("e"), bulk("d")));
            // The connection lost with a command on it: `Disconnected`, not a hang.
            let f = node.send(&[&[b"GET", b"f"]]);
            server.send(None).unwrap();
            assert_eq!(f.await, Err(RedisError::Disconnected));
        });
    }
}
