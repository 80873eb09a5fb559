//! `POST /registry/deregister`: the session leaves every namespace list and its records go;
//! its placements are left to dead-owner eviction.

use http::StatusCode;
use pinboard_protocol::registry::DeregisterRequest;

use super::owned_session;
use crate::answers::Handled;
use crate::answers::{BODY_LIMIT, unknown_session};
use crate::http::{Request, Response, read_json};
use crate::node::Core;
use crate::passport::Credential;

const SHAPE: &str = "{sessionId}";

pub async fn deregister(core: &Core, req: &mut Request<'_>, credential: &Credential) -> Handled {
    let body: DeregisterRequest = read_json(req, BODY_LIMIT, SHAPE).await?;
    owned_session(core, credential, &body.session_id, true).await?;
    if !core.store.drop_session(&body.session_id, true).await? {
        return Ok(unknown_session());
    }
    Ok(Response::json(StatusCode::OK, &b"{}"[..]))
}
