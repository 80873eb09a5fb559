//! The tower layer: what a worker serves (contract §4) in front of any HTTP service. The routes
//! and checks are the core's (`pinboard_protocol::worker::serve`), as `pinned` serves them:
//!
//! - `GET /_pinned/challenge` and `GET /_pinned/stats` are answered here;
//! - `/{ns}/{id}{rest}` of a registered namespace passes only with a valid attestation bound to
//!   the instance and its one `Pinboard-Epoch`, not stale, and (for a new activation) on a live
//!   lease; the inner service then gets it with the [`Instance`] in its extensions, and a
//!   WebSocket upgrade also with its instance's [`Goodbye`](crate::Goodbye) (`ws::serve` runs
//!   it);
//! - `/{ns}/{id}/_wake` is not found: the layer keeps no durability store;
//! - every other path goes to the inner service untouched (its own health checks, say).
//!
//! An answer the inner service produced once the lease had lapsed is withheld (the instance may
//! be another worker's by then) and refused like a forward that came past the lease.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{Either, Full};
use pinboard_protocol::Purpose;
use pinboard_protocol::path::splits_when_decoded;
use pinboard_protocol::worker::serve::{Answer, Core, Instance, Route, pinned_route_method, route};
use tower_layer::Layer;
use tower_service::Service;

/// Wraps a service in a [`Pinned`] service of the worker it came from
/// ([`Worker::layer`](crate::Worker::layer)).
#[derive(Clone)]
pub struct PinnedLayer {
    core: Arc<Core>,
}

impl PinnedLayer {
    pub(crate) fn new(core: Arc<Core>) -> PinnedLayer {
        PinnedLayer { core }
    }
}

impl<S> Layer<S> for PinnedLayer {
    type Service = Pinned<S>;

    fn layer(&self, inner: S) -> Pinned<S> {
        Pinned {
            core: self.core.clone(),
            inner,
        }
    }
}

/// A service answering as a Pinboard worker in front of `S`.
#[derive(Clone)]
pub struct Pinned<S> {
    core: Arc<Core>,
    inner: S,
}

/// The answer's body: the inner service's, or one the worker wrote.
pub type PinnedBody<B> = Either<B, Full<Bytes>>;

type Answering<R, E> = Pin<Box<dyn Future<Output = Result<R, E>> + Send>>;

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for Pinned<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    ReqBody: Send + 'static,
{
    type Response = Response<PinnedBody<ResBody>>;
    type Error = S::Error;
    type Future = Answering<Self::Response, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<ReqBody>) -> Self::Future {
        let core = self.core.clone();
        let instance = match decide(&core, &req) {
            Decision::Answer(answer) => return Box::pin(async move { Ok(write(answer)) }),
            Decision::Pass => None,
            Decision::Instance(instance) => Some(instance),
        };
        // The service polled ready is the one to call; a fresh clone takes its place (tower's
        // pattern for services called from a future).
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        if let Some(instance) = &instance {
            if asks_websocket(req.headers()) {
                let goodbye = core
                    .goodbyes
                    .open(&instance.ns, &instance.id, &instance.epoch);
                req.extensions_mut().insert(goodbye);
            }
            req.extensions_mut().insert(instance.clone());
        }
        Box::pin(async move {
            let answer = inner.call(req).await?;
            if let Some(instance) = instance
                && core.withholds_answer(&instance)
            {
                return Ok(write(Answer::lease_unhealthy()));
            }
            Ok(answer.map(Either::Left))
        })
    }
}

/// What the worker makes of a request before the inner service may see it.
enum Decision {
    /// The worker answers it.
    Answer(Answer),
    /// Not the worker's: the inner service's, as it is.
    Pass,
    /// An admitted instance request.
    Instance(Instance),
}

fn decide<B>(core: &Core, req: &Request<B>) -> Decision {
    let headers = req.headers();
    let (ns, id, rest) = match route(req.uri().path(), &core.base, &core.namespaces) {
        Route::Challenge | Route::Stats if pinned_route_method(req.method()).is_some() => {
            return Decision::Answer(pinned_route_method(req.method()).expect("checked"));
        }
        Route::Challenge => {
            let query = req.uri().query().unwrap_or("");
            return Decision::Answer(core.challenge(headers, query));
        }
        Route::Stats => return Decision::Answer(core.stats(headers, Default::default())),
        Route::Elsewhere | Route::Other => return Decision::Pass,
        Route::Instance { ns, id, rest } => (ns, id, rest),
    };
    // Pinboard never sends such a path; a router that decodes would route it as another.
    if splits_when_decoded(rest) {
        return Decision::Answer(Answer::text(
            StatusCode::BAD_REQUEST,
            "invalid instance path",
        ));
    }
    // `_wake` needs a durability store, which the layer does not keep (contract §4, §7).
    if rest == "/_wake" {
        return Decision::Answer(Answer::not_found());
    }
    match core.admit_request(headers, ns, id, rest, Purpose::Forward) {
        Ok(instance) => Decision::Instance(instance),
        Err(refused) => Decision::Answer(refused),
    }
}

/// Whether a request asks to switch to WebSocket (`Upgrade: websocket`, RFC 6455 §4.1).
fn asks_websocket(headers: &http::HeaderMap) -> bool {
    headers.get_all(http::header::UPGRADE).iter().any(|value| {
        value
            .as_bytes()
            .split(|b| *b == b',')
            .any(|p| p.trim_ascii().eq_ignore_ascii_case(b"websocket"))
    })
}

/// The core's answer as an HTTP response of the layer's body type.
fn write<B>(answer: Answer) -> Response<PinnedBody<B>> {
    let mut response = Response::new(Either::Right(Full::new(Bytes::from(answer.body))));
    *response.status_mut() = answer.status;
    let headers = response.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static(answer.content_type),
    );
    for (name, value) in answer.headers {
        headers.insert(name, value);
    }
    response
}
