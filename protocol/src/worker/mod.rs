//! The worker's side of the protocol without a runtime: what both worker libraries (`pinned`,
//! on monoio, and `pinned-tower`, on tokio) decide alike, each doing its own I/O around it.
//!
//! - [`attest`]: `Pinboard-Attestation` verification; [`epoch`]: placement epochs;
//! - [`fencing`]: the epoch as a fencing token for the worker's own storage, and the
//!   conditional writes (SQLite, Redis) that refuse a former owner's late write;
//! - [`held`]: the sharded map of held instances and the admission it decides under a
//!   [`Gate`](held::Gate); [`state`]: the session, lease, challenges and flags;
//! - [`serve`]: the routes a worker serves and the checks before its application sees a
//!   request, over a [`Core`](serve::Core) holding the above;
//! - [`control`]: the registry protocol's loop (register, heartbeat, re-register, leave),
//!   generic over the runtime that sleeps and sends;
//! - [`credential`]: the Passport credential, a token or a token file read again when it
//!   changed;
//! - [`goodbye`]: the WebSocket goodbye (1012) when an instance's epoch ends with sockets
//!   open: which events end which epochs, and the futures that tell the sockets;
//! - `mint` (feature `mint`): attestations minted as Pinboard mints them, for tests.

pub mod attest;
pub mod control;
pub mod credential;
pub mod epoch;
pub mod fencing;
pub mod goodbye;
pub mod held;
#[cfg(any(test, feature = "mint"))]
pub mod mint;
pub mod serve;
pub mod state;
