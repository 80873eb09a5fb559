//! The registry's routes under `{base_path}/registry/`: authentication of every route, and
//! the answer for paths that name no route.

use http::StatusCode;

use crate::error::Error;
use crate::http::{Request, Response};
use crate::node::Core;
use crate::passport::Credential;

pub const WORKER_SCOPE: &str = "pinboard:worker";

pub async fn handle(core: &Core, req: &mut Request<'_>, _path: &str) -> Result<Response, Error> {
    // Unknown registry paths authenticate as worker routes before answering, so probing
    // them tells an unauthenticated caller nothing about which routes exist.
    if let Err(refusal) = authorize(core, req, WORKER_SCOPE) {
        return Ok(refusal);
    }
    Ok(Response::error(StatusCode::NOT_FOUND, "not found"))
}

/// The credential of a registry request, or the answer refusing it: 401 without a valid
/// credential; 403 when it lacks `scope`, an account (`sub`) or a well-formed `pinboard` claim.
pub fn authorize(core: &Core, req: &Request<'_>, scope: &str) -> Result<Credential, Response> {
    let authorization = req
        .header(http::header::AUTHORIZATION)
        .map(|v| v.as_bytes());
    let credential = core
        .shared
        .passport
        .verify(authorization)
        .map_err(|_| Response::error(StatusCode::UNAUTHORIZED, "unauthorized"))?;
    let forbidden = || Response::error(StatusCode::FORBIDDEN, "forbidden");
    if !credential.has_scope(scope) || credential.sub.is_none() {
        return Err(forbidden());
    }
    credential.route_claim().map_err(|_| forbidden())?;
    Ok(credential)
}
