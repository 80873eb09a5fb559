//! The binary upgrade (issue 24): a running node hands its listening sockets (every core's
//! `SO_REUSEPORT` listener, and the metrics listener) to a new process started with
//! `pinboard serve --upgrade`, which serves on the very same sockets: no connection is refused
//! in between, and none queued is lost. Once the new process accepts, the old one stops
//! accepting and drains like a graceful stop, then exits 0.
//!
//! They meet on the node's control socket: a Unix socket in Linux's abstract namespace named
//! `pinboard/` + the listen address (`pinboard/127.0.0.1:8080`), so the configuration alone
//! finds it and no file is left behind by a crash. Any process of the network namespace may
//! connect to it, so both ends check the other's user (`SO_PEERCRED`): the sockets go only to
//! a process of the node's own uid, and a new process takes sockets only from one.
//!
//! The exchange, in lines: the new process sends `upgrade`; the node answers
//! `sockets listen=ADDR metrics=ADDR|- count=N pid=PID` with the N descriptors (`SCM_RIGHTS`,
//! at most [`FDS_PER_MESSAGE`] a message, the later ones on a `+` byte each), or `refused: why`;
//! the new process serves on them and sends `ready`; the node stops accepting, closes its control
//! socket and answers `released`, and the new process binds the control socket in turn. A new
//! process that goes away before `ready` leaves the node serving as before.
//!
//! Also here: the pid of the node behind a control socket (`pinboard reload`) and SIGUSR2's
//! upgrade, which starts the node's own command line again with `--upgrade`.

use std::io::{BufRead, BufReader, IoSlice, IoSliceMut, Read, Write};
use std::mem::MaybeUninit;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::{AsFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use tracing::{debug, error, info, warn};

use crate::config::Config;
use crate::node::Shared;

/// Below the kernel's `SCM_MAX_FD` (253) descriptors in one message.
const FDS_PER_MESSAGE: usize = 250;
/// The most sockets a node holds: 1024 cores (`threads`) and the metrics listener.
const MOST_SOCKETS: usize = 1025;
/// How long either side waits for the other's next line, but for `ready`. The new process has
/// loaded its configuration and logged in to Redis before it asks.
const ANSWER_WITHIN: Duration = Duration::from_secs(30);
/// How long a node taking the sockets over may take to become the serving fleet (a claim in
/// Redis) before it gives up, and the old node serves on.
pub(super) const SERVING_WITHIN: Duration = Duration::from_secs(30);
/// How long the old node waits for `ready`: longer than the new one may try, so that it is
/// never given up on while it could still say it.
const READY_WITHIN: Duration = Duration::from_secs(45);

/// The abstract name of the control socket of the node listening on `listen`.
fn control_address(listen: SocketAddr) -> std::io::Result<std::os::unix::net::SocketAddr> {
    std::os::unix::net::SocketAddr::from_abstract_name(format!("pinboard/{listen}"))
}

/// Whether `peer` runs as this process's user; else why not.
fn same_user(peer: &UnixStream) -> Result<rustix::process::Pid, String> {
    let cred = rustix::net::sockopt::socket_peercred(peer)
        .map_err(|e| format!("cannot read the peer's credentials: {e}"))?;
    let mine = rustix::process::geteuid();
    if cred.uid != mine {
        return Err(format!(
            "its uid {} is not this node's ({})",
            cred.uid.as_raw(),
            mine.as_raw()
        ));
    }
    Ok(cred.pid)
}

/// Who holds this node's listening sockets: a stop takes sockets the node holds alone out of
/// `LISTEN` (`shutdown(2)`, whoever else holds a descriptor); sockets lent to a new process
/// (a hand-over under way) or given to it must go on listening for it.
#[derive(Default)]
pub(super) struct Sockets(AtomicU8);

const ALONE: u8 = 0;
const LENT: u8 = 1;
const GIVEN: u8 = 2;

impl Sockets {
    /// Another process holds them and serves on: this one must leave them listening.
    pub(super) fn lend(&self) {
        self.0.store(LENT, Ordering::SeqCst);
    }

    fn give(&self) {
        self.0.store(GIVEN, Ordering::SeqCst);
    }

    /// The process they were lent to went away.
    fn take_back(&self) {
        self.0.store(ALONE, Ordering::SeqCst);
    }

    pub(super) fn held_alone(&self) -> bool {
        self.0.load(Ordering::SeqCst) == ALONE
    }

    /// The new process serves on them: this node stops accepting at once.
    pub(super) fn given(&self) -> bool {
        self.0.load(Ordering::SeqCst) == GIVEN
    }
}

/// What the running node hands over: clones of its listening sockets.
pub(super) struct Handed {
    pub listeners: Vec<TcpListener>,
    pub metrics: Option<TcpListener>,
}

/// Serves the control socket of the node listening on `listen`, on a thread of its own, until
/// the sockets are given away. A control socket that cannot be bound (another process holds
/// the name) leaves the node serving without upgrades, said at warn.
pub(super) fn serve_control(
    listen: SocketAddr,
    handed: Handed,
    shared: Arc<Shared>,
    sockets: Arc<Sockets>,
) {
    let control = control_address(listen).and_then(|name| UnixListener::bind_addr(&name));
    let control = match control {
        Ok(control) => control,
        Err(e) => {
            warn!(error = %e, "cannot bind the control socket: `pinboard serve --upgrade` cannot take this node's sockets over");
            return;
        }
    };
    let spawned = std::thread::Builder::new()
        .name("pinboard-control".into())
        .spawn(move || {
            for peer in control.incoming() {
                let Ok(mut peer) = peer else { continue };
                if answer(&mut peer, listen, &handed, &shared, &sockets) {
                    // The new process binds the name once this node no longer holds it.
                    drop(control);
                    let _ = peer.write_all(b"released\n");
                    return;
                }
            }
        });
    if let Err(e) = spawned {
        warn!(error = %e, "cannot start the control thread: upgrades are unavailable");
    }
}

/// Answers one peer of the control socket; true once the sockets are given away.
fn answer(
    peer: &mut UnixStream,
    listen: SocketAddr,
    handed: &Handed,
    shared: &Shared,
    sockets: &Sockets,
) -> bool {
    // A peer asks at once: one that says nothing holds the control socket up this long at most.
    let _ = peer.set_read_timeout(Some(Duration::from_secs(5)));
    let mut line = String::new();
    // A peer that asks nothing (`pinboard reload` reading the pid) is no event.
    if BufReader::new(&mut *peer)
        .take(64)
        .read_line(&mut line)
        .is_err()
        || line.is_empty()
    {
        return false;
    }
    let refuse = |peer: &mut UnixStream, why: String| {
        warn!(reason = %why, "refused a take-over on the control socket");
        let _ = peer.write_all(format!("refused: {why}\n").as_bytes());
        false
    };
    if line.trim_end() != "upgrade" {
        return refuse(peer, format!("unknown request {:?}", line.trim_end()));
    }
    let pid = match same_user(peer) {
        Ok(pid) => pid,
        Err(why) => return refuse(peer, why),
    };
    if shared.is_stopping() {
        return refuse(peer, "this node is stopping".into());
    }
    sockets.lend();
    let given = lend(peer, listen, handed).and_then(|()| {
        let _ = peer.set_read_timeout(Some(READY_WITHIN));
        let mut ready = String::new();
        BufReader::new(&mut *peer)
            .take(64)
            .read_line(&mut ready)
            .map_err(|e| e.to_string())?;
        match ready.trim_end() {
            "ready" => Ok(()),
            "" => Err("it went away before it was ready".into()),
            other => Err(format!("it said {other:?}")),
        }
    });
    match given {
        Ok(()) => {
            sockets.give();
            shared.stopping.store(true, Ordering::SeqCst);
            info!(
                pid = pid.as_raw_pid(),
                "upgrade: the new process serves on the listening sockets; this node stops accepting and finishes in-flight requests"
            );
            true
        }
        Err(why) => {
            sockets.take_back();
            warn!(pid = pid.as_raw_pid(), reason = %why, "upgrade abandoned; this node serves on");
            false
        }
    }
}

/// Sends the header line and every socket.
fn lend(peer: &UnixStream, listen: SocketAddr, handed: &Handed) -> Result<(), String> {
    let metrics = handed.metrics.as_ref().map(TcpListener::local_addr);
    let metrics = match metrics.transpose().map_err(|e| e.to_string())? {
        Some(addr) => addr.to_string(),
        None => "-".into(),
    };
    let fds: Vec<_> = (handed.listeners.iter().chain(&handed.metrics))
        .map(|l| l.as_fd())
        .collect();
    let header = format!(
        "sockets listen={listen} metrics={metrics} count={} pid={}\n",
        fds.len(),
        std::process::id()
    );
    let mut payload = header.as_bytes();
    for chunk in fds.chunks(FDS_PER_MESSAGE) {
        let mut space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(chunk.len()))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        control.push(SendAncillaryMessage::ScmRights(chunk));
        rustix::net::sendmsg(
            peer,
            &[IoSlice::new(payload)],
            &mut control,
            SendFlags::empty(),
        )
        .map_err(|e| format!("sending the sockets: {e}"))?;
        payload = b"+";
    }
    Ok(())
}

/// The sockets taken from the running node, serving until told [`TakenOver::ready`].
pub struct TakenOver {
    pub listeners: Vec<TcpListener>,
    pub metrics: Option<TcpListener>,
    /// The node they came from.
    pub from: u32,
    peer: UnixStream,
}

/// `pinboard serve --upgrade`: the listening sockets of the node running on `config.listen`,
/// checked against `config`. The error is the one line that stops startup (exit 2).
pub fn take_over(config: &Config) -> Result<TakenOver, String> {
    let listen = config.listen;
    let error = |why: String| format!("config error: listen: --upgrade: {why}");
    if listen.port() == 0 {
        return Err(error(
            "listen's port is 0; name the running node's address".into(),
        ));
    }
    let mut peer = control_address(listen)
        .and_then(|name| UnixStream::connect_addr(&name))
        .map_err(|e| {
            error(format!(
                "no running node serves {listen} to take over from ({e}; the node is found by \
                 listen, which must be the running node's address)"
            ))
        })?;
    same_user(&peer).map_err(|why| error(format!("the process on the control socket: {why}")))?;
    peer.set_read_timeout(Some(ANSWER_WITHIN))
        .and_then(|()| peer.write_all(b"upgrade\n"))
        .map_err(|e| error(format!("asking the running node: {e}")))?;
    let (header, fds) = receive(&peer).map_err(|e| error(format!("receiving the sockets: {e}")))?;
    let header = header.trim_end();
    if let Some(why) = header.strip_prefix("refused: ") {
        return Err(error(format!("the running node refused: {why}")));
    }
    let field = |name: &str| {
        header
            .split_whitespace()
            .find_map(|w| w.strip_prefix(name)?.strip_prefix('='))
            .unwrap_or_default()
    };
    let count: usize = field("count").parse().unwrap_or(0);
    if !header.starts_with("sockets ") || count == 0 || fds.len() != count {
        return Err(error(format!(
            "the running node answered {header:?} with {} sockets",
            fds.len()
        )));
    }
    let mut listeners: Vec<TcpListener> = fds.into_iter().map(TcpListener::from).collect();
    let metrics = match field("metrics") {
        "-" => None,
        theirs => Some((theirs, listeners.pop().expect("count > 0"))),
    };
    // An upgrade keeps what clients and scrapers connect to.
    let metrics = match (metrics, config.metrics_listen) {
        (None, None) => None,
        (Some((_, socket)), Some(mine)) if socket.local_addr().ok() == Some(mine) => Some(socket),
        (Some((_, socket)), Some(mine)) if mine.port() == 0 && same_ip(&socket, mine) => {
            Some(socket)
        }
        (theirs, mine) => {
            return Err(format!(
                "config error: metrics_listen: --upgrade: the running node's is {}, this \
                 configuration's {}; an upgrade keeps the listening addresses",
                theirs.map_or("unset", |(addr, _)| addr),
                mine.map_or("unset".into(), |a| a.to_string()),
            ));
        }
    };
    if listeners.len() != config.cores() {
        return Err(format!(
            "config error: threads: --upgrade: the running node has {} listeners and this \
             configuration wants {} cores; an upgrade keeps their number (stop and start the \
             node to change threads)",
            listeners.len(),
            config.cores()
        ));
    }
    for listener in &listeners {
        // A node stopped while it lent them: the sockets are out of LISTEN.
        let listening = rustix::net::sockopt::socket_acceptconn(listener).unwrap_or(false);
        if !listening || listener.set_nonblocking(true).is_err() {
            return Err(error(
                "the running node stopped while handing its sockets over".into(),
            ));
        }
    }
    if let Some(metrics) = &metrics {
        let _ = metrics.set_nonblocking(true);
    }
    Ok(TakenOver {
        listeners,
        metrics,
        from: field("pid").parse().unwrap_or(0),
        peer,
    })
}

fn same_ip(socket: &TcpListener, addr: SocketAddr) -> bool {
    socket.local_addr().is_ok_and(|a| a.ip() == addr.ip())
}

/// The header line and the descriptors that came with it: one byte a call, so that no read
/// runs into the next message and drops its descriptors.
fn receive(peer: &UnixStream) -> std::io::Result<(String, Vec<OwnedFd>)> {
    let mut space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(FDS_PER_MESSAGE))];
    let (mut header, mut fds, mut count) = (Vec::new(), Vec::new(), None);
    while count.is_none_or(|n| fds.len() < n) {
        let mut byte = [0u8];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let got = rustix::net::recvmsg(
            peer,
            &mut [IoSliceMut::new(&mut byte)],
            &mut control,
            RecvFlags::CMSG_CLOEXEC,
        )?;
        for message in control.drain() {
            if let RecvAncillaryMessage::ScmRights(received) = message {
                fds.extend(received);
            }
        }
        if got.bytes == 0 || fds.len() > MOST_SOCKETS {
            break;
        }
        if count.is_none() && byte[0] != b'+' {
            header.push(byte[0]);
            if byte[0] == b'\n' || header.len() > 512 {
                let line = String::from_utf8_lossy(&header);
                count = Some(
                    line.split_whitespace()
                        .find_map(|w| w.strip_prefix("count=")?.parse().ok())
                        .unwrap_or(0),
                );
            }
        }
    }
    Ok((String::from_utf8_lossy(&header).into_owned(), fds))
}

impl TakenOver {
    /// Tells the old node this process accepts on the sockets: it stops accepting, and gives
    /// its control socket up, which this process then binds (by the caller).
    pub(super) fn ready(self) -> Result<(), String> {
        let mut peer = self.peer;
        peer.write_all(b"ready\n")
            .map_err(|e| format!("telling the running node: {e}"))?;
        let mut released = String::new();
        let _ = BufReader::new(&mut peer).take(64).read_line(&mut released);
        match released.trim_end() {
            "released" => Ok(()),
            other => Err(format!("the old node answered {other:?} to ready")),
        }
    }
}

/// The pid of the node serving on `listen`, from its control socket.
pub fn node_pid(listen: SocketAddr) -> Result<i32, String> {
    let peer = control_address(listen)
        .and_then(|name| UnixStream::connect_addr(&name))
        .map_err(|e| format!("no node serves {listen} on this host ({e})"))?;
    let cred = rustix::net::sockopt::socket_peercred(&peer)
        .map_err(|e| format!("cannot read the node's credentials: {e}"))?;
    Ok(cred.pid.as_raw_pid())
}

/// SIGUSR2, as nginx takes it: this node's own command line runs again with `--upgrade` (the
/// binary at its path now: the new one once the package replaced it), and takes the sockets
/// over. A new process that fails is logged; this node serves on.
pub(super) fn start_successor() {
    let mut args = std::env::args_os();
    let Some(program) = args.next() else {
        error!("SIGUSR2: the command line of this process is unknown; no upgrade");
        return;
    };
    let mut args: Vec<_> = args.collect();
    if !args.iter().any(|a| a == "--upgrade") {
        args.push("--upgrade".into());
    }
    let child = std::process::Command::new(&program)
        .args(&args)
        .stdin(std::process::Stdio::null())
        .spawn();
    let mut child = match child {
        Ok(child) => child,
        Err(e) => {
            error!(program = %program.to_string_lossy(), error = %e, "SIGUSR2: cannot start the new binary; no upgrade");
            return;
        }
    };
    info!(
        pid = child.id(),
        "SIGUSR2: started the new binary to take the sockets over"
    );
    // Reaped here, so a new process that fails is said (and leaves no zombie).
    let _ = std::thread::Builder::new()
        .name("pinboard-upgrade".into())
        .spawn(move || match child.wait() {
            Ok(status) if status.success() => debug!("the process started by SIGUSR2 exited 0"),
            Ok(status) => error!(%status, "SIGUSR2: the new binary failed; this node serves on"),
            Err(e) => error!(error = %e, "SIGUSR2: cannot wait for the new binary"),
        });
}
