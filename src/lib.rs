//! Pinboard: an edge proxy and control plane for stateful instances.
//!
//! The tree follows the architecture: [`config`] (settings), [`runtime`] (thread-per-core
//! event loops and the process lifecycle), [`http`] (HTTP/1.1, the `pinboard-http` crate it
//! shares with the workers; [`error`] is that crate's), [`passport`] (credentials),
//! [`redis`] (the per-core pipelined Redis client), [`store`] (the Redis layout: keys,
//! records, scripts), [`registry`] (the worker
//! protocol), [`placement`] (who owns an instance), [`proxy`] (forwarding to it),
//! [`operator`] (health and fleet views), [`fleet`] (whether this node serves), [`metrics`]
//! (counters), with [`node`] tying them into
//! the request dispatch.

pub mod config;
pub mod fleet;
pub mod metrics;
pub mod node;
pub mod operator;
pub mod passport;
pub mod placement;
pub mod proxy;
pub mod redis;
pub mod registry;
pub mod runtime;
pub mod store;

pub use pinboard_http as http;
pub use pinboard_http::error;
