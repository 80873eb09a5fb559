//! Which I/O driver a monoio event loop runs on, as the node's `driver` setting and a
//! worker's configuration name it, and the io_uring event loop the node and `pinned` build.

use std::fmt;
use std::io;
use std::str::FromStr;

use monoio::{IoUringDriver, Runtime, RuntimeBuilder, time::TimeDriver};

/// An io_uring event loop (1024 entries, timers on) whose ring runs completions' task work
/// only when the loop asks for events: `COOP_TASKRUN` (no interrupt of the running loop to post
/// a completion), `SINGLE_ISSUER` and `DEFER_TASKRUN` (posted in the loop's own
/// `io_uring_enter`, which monoio makes only when it has nothing left to run). Measured on the
/// proxy (perf.md, issue 25): -6 % CPU per request. A kernel older than 6.1 refuses these
/// flags; the ring is then built without them. The kernel tears such a ring down after its
/// thread ends, so a socket with an operation still in flight (a listener's accept) closes a
/// few ms after the loop's thread is gone rather than with it: a loop that stops listening
/// while it lives on shuts its listener down (`shutdown(2)`) instead of relying on the close.
pub fn io_uring_runtime() -> io::Result<Runtime<TimeDriver<IoUringDriver>>> {
    let build = |urb: io_uring::Builder| {
        RuntimeBuilder::<IoUringDriver>::new()
            .with_entries(1024)
            .uring_builder(urb)
            .enable_timer()
            .build()
    };
    let mut deferred = io_uring::IoUring::builder();
    deferred
        .setup_coop_taskrun()
        .setup_single_issuer()
        .setup_defer_taskrun();
    build(deferred).or_else(|_| build(io_uring::IoUring::builder()))
}

/// The event-loop I/O driver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DriverKind {
    /// io_uring, falling back to epoll where the kernel refuses it.
    Auto,
    IoUring,
    Epoll,
}

impl DriverKind {
    const WORDS: [(DriverKind, &'static str); 3] = [
        (DriverKind::Auto, "auto"),
        (DriverKind::IoUring, "io_uring"),
        (DriverKind::Epoll, "epoll"),
    ];
}

impl fmt::Display for DriverKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (_, word) = Self::WORDS
            .iter()
            .find(|(kind, _)| kind == self)
            .expect("every driver has a word");
        f.write_str(word)
    }
}

impl FromStr for DriverKind {
    type Err = String;

    fn from_str(s: &str) -> Result<DriverKind, String> {
        Self::WORDS
            .iter()
            .find(|(_, word)| *word == s)
            .map(|(kind, _)| *kind)
            .ok_or_else(|| format!(r#"expected "auto", "io_uring" or "epoll", got {s:?}"#))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_io_uring_loop_runs_io_and_timers() {
        if !monoio::utils::detect_uring() {
            return;
        }
        let mut rt = io_uring_runtime().expect("io_uring runtime");
        let echoed = rt.block_on(async {
            use monoio::io::{AsyncReadRentExt, AsyncWriteRentExt};
            let listener = monoio::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            let server = monoio::spawn(async move {
                let (mut conn, _) = listener.accept().await.unwrap();
                let (_, buf) = conn.read_exact(vec![0; 4]).await;
                conn.write_all(buf).await.0.unwrap();
            });
            monoio::time::sleep(std::time::Duration::from_millis(5)).await;
            let mut conn = monoio::net::TcpStream::connect(addr).await.unwrap();
            conn.write_all(b"ping".to_vec()).await.0.unwrap();
            let (res, buf) = conn.read_exact(vec![0; 4]).await;
            res.unwrap();
            server.await;
            buf
        });
        assert_eq!(echoed, b"ping");
    }

    #[test]
    fn driver_words_round_trip() {
        for (kind, word) in DriverKind::WORDS {
            assert_eq!(kind.to_string(), word);
            assert_eq!(word.parse::<DriverKind>(), Ok(kind));
        }
    }
}
