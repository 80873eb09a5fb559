//! `GET /healthz` (the process answers) and `GET /readyz` (this node should get traffic).

use bytes::Bytes;
use http::StatusCode;
use tracing::debug;

use crate::http::Response;
use crate::node::Core;
use crate::redis::READY;

pub fn healthz() -> Response {
    Response::json(StatusCode::OK, Bytes::from_static(b"{\"ok\":true}"))
}

/// 200 with an empty body while the node is not stopping and its core's Redis runs scripts;
/// 503 otherwise. Asked per core, so a core whose connection is down reports itself.
pub async fn readyz(core: &Core) -> Response {
    if core.shared.is_stopping() {
        return Response::empty(StatusCode::SERVICE_UNAVAILABLE);
    }
    match core.redis.evalsha(&READY, &[], &[]).await {
        Ok(_) => Response::empty(StatusCode::OK),
        Err(e) => {
            debug!(error = %e, "not ready: redis");
            Response::empty(StatusCode::SERVICE_UNAVAILABLE)
        }
    }
}
