//! The metrics listener (`metrics_listen`): a second, plain-HTTP socket answering
//! `GET /metrics` without credentials, for a scraper on a private network, as Envoy's admin
//! and HAProxy's stats listeners do, and, with `console = true`, the operator console and the
//! operator routes it calls ([`routes::on_metrics_listener`]). Bound before any core starts (a
//! bad or busy address stops startup like a bad setting) and served by the first core, which
//! stops it with the node.

use std::rc::Rc;

use tracing::info;

use super::Shutdown;
use super::accept::Acceptor;
use crate::access_log::Record;
use crate::config::Config;
use crate::error::Error;
use crate::http::{Handler, Limits, Request, Response, serve_connection};
use crate::node::Core;
use crate::routes;

/// The socket of `metrics_listen`, when it is set; the error is the one line that stops
/// startup, naming the key.
pub fn bind(config: &Config) -> Result<Option<std::net::TcpListener>, String> {
    let Some(addr) = config.metrics_listen else {
        return Ok(None);
    };
    // No SO_REUSEPORT: a second node on the same address is refused, not handed half the
    // scrapes.
    let listener = std::net::TcpListener::bind(addr)
        .and_then(|l| l.set_nonblocking(true).map(|()| l))
        .map_err(|e| format!("config error: metrics_listen: cannot listen on {addr}: {e}"))?;
    // With port 0 the kernel picked one: the log says which.
    if let Ok(addr) = listener.local_addr() {
        info!(%addr, "metrics listening");
    }
    Ok(Some(listener))
}

/// Accepts scrapes until the stop; each connection is served like a client's (the same
/// limits, finished within the grace period), but is not counted among the client connections.
pub(super) async fn serve(
    core: Rc<Core>,
    acceptor: Acceptor,
    limits: Rc<Limits>,
    shutdown: Shutdown,
) {
    while let Some((stream, peer)) = acceptor.next(&shutdown).await {
        let (core, limits, shutdown) = (core.clone(), limits.clone(), shutdown.clone());
        monoio::spawn(async move {
            serve_connection(stream, peer, &Scrapes(core), &limits, &shutdown, None).await;
        });
    }
    acceptor.close();
}

/// What the metrics listener answers.
struct Scrapes(Rc<Core>);

/// Identified, counted and logged as the node's operator routes are.
impl Handler for Scrapes {
    type Note = Record;

    async fn handle(&self, req: &mut Request<'_>, record: &mut Record) -> Result<Response, Error> {
        routes::on_metrics_listener(&self.0, req, record).await
    }

    fn answered(&self, record: Record, req: &Request<'_>, response: &Response, sent: u64) {
        self.0.answered(record, req, response, sent);
    }
}
