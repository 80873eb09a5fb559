//! `POST /registry/deregister`: the session leaves every namespace list and its records go;
//! its placements are left to dead-owner eviction.

use http::StatusCode;
use serde::Deserialize;

use super::{owned_session, unknown_session};
use crate::error::Error;
use crate::http::{Request, Response, read_json};
use crate::node::Core;
use crate::passport::Credential;

const SHAPE: &str = "{sessionId}";

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Body {
    session_id: String,
}

pub async fn deregister(
    core: &Core,
    req: &mut Request<'_>,
    credential: &Credential,
) -> Result<Response, Error> {
    let body: Body = match read_json(req, 1024 * 1024, SHAPE).await {
        Ok(body) => body,
        Err(refusal) => return Ok(refusal),
    };
    if let Err(refusal) = owned_session(core, credential, &body.session_id, true).await? {
        return Ok(refusal);
    }
    if !core.store.drop_session(&body.session_id, true).await? {
        return Ok(unknown_session());
    }
    Ok(Response::json(StatusCode::OK, &b"{}"[..]))
}
