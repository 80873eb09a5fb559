//! The registry: the worker protocol under `{base_path}/registry/` (register, heartbeat,
//! release, tag, deregister). The route table (`crate::routes`) authorizes the credential and
//! calls these handlers.
//!
//! What is stored where, and every script, is the store's (`crate::store`).

mod deregister;
mod fields;
mod heartbeat;
mod probe;
mod register;
mod release;

use crate::answers::{self, Handled};
use crate::error::{Error, Origin};
use crate::node::Core;
use crate::passport::{Credential, RouteClaim};
use crate::store::{Drain, Session};

pub use deregister::deregister;
pub use heartbeat::{HeartbeatRefusal, heartbeat};
pub use register::register;
pub use release::{release, schedule, tag};

/// The route claim of a credential the route table authorized.
fn claim_of(credential: &Credential) -> Result<&RouteClaim, Error> {
    credential.route_claim().map_err(|_| {
        Error::new(
            Origin::Internal,
            "authorized credential without a route claim",
        )
    })
}

/// The account of a credential the route table authorized.
fn account_of(credential: &Credential) -> String {
    credential.sub.clone().unwrap_or_default()
}

fn new_session_id() -> String {
    let bytes: [u8; 16] = rand::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The session a worker route names, refused as the spec says: 409 when the registry has no
/// record (or, with `live`, when its lease ran out), 403 when another account registered it.
async fn owned_session(
    core: &Core,
    credential: &Credential,
    session_id: &str,
    live: bool,
) -> Handled<Session> {
    let Some(session) = core.store.session(session_id).await? else {
        return Err(answers::unknown_session().into());
    };
    if live && session.expiry <= crate::clock::now_ms() {
        return Err(answers::unknown_session().into());
    }
    if credential.sub.as_deref() != Some(session.account.as_str()) {
        return Err(answers::forbidden().into());
    }
    Ok(session)
}

/// The remaining seconds of a timed drain, rounded up (`None` for a cordon).
fn drain_secs_left(drain: &Drain, now: u64) -> Option<u64> {
    drain.deadline.map(|d| secs_left(d, now))
}

/// Seconds from `now` to the `deadline` (both ms), rounded up; 0 once it passed.
fn secs_left(deadline: u64, now: u64) -> u64 {
    deadline.saturating_sub(now).div_ceil(1000)
}
