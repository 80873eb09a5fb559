//! Pinboard: an edge proxy and control plane for stateful instances.
//!
//! The tree follows the architecture, bottom up: pure parts ([`names`], [`text`], [`clock`],
//! [`attestation`], [`passport`]), [`config`], [`http`] (HTTP/1.1, the `pinboard-http` crate it
//! shares with the workers; [`error`] is that crate's), [`redis`] (the per-core pipelined
//! client), [`store`] (the Redis layout: keys, records, scripts), [`answers`] (every answer the
//! node writes itself), [`node`] (the per-node and per-core state, with [`upstream`], [`limits`] and
//! [`metrics`] counters; [`settings`], what a reload replaces), the route modules on it ([`placement`], [`proxy`], [`registry`],
//! [`operator`]), [`routes`] (the route table) on top, and [`fleet`] and [`runtime`] (event
//! loops, the process lifecycle) driving it all; [`logs`] is how the node's log lines look.
//! [`ctl`] is the operator's command-line client, which only calls a node's operator routes.

pub mod access_log;
pub mod answers;
pub mod attestation;
pub mod clock;
pub mod config;
pub mod correlation;
pub mod ctl;
pub mod fleet;
pub mod limits;
pub mod logs;
pub mod metrics;
pub mod mirror;
pub mod names;
pub mod node;
pub mod operator;
pub mod passport;
pub mod placement;
pub mod proxy;
pub mod redis;
pub mod registry;
pub mod routes;
pub mod runtime;
pub mod settings;
pub mod store;
pub mod sweeper;
pub mod text;
pub mod upstream;

pub use pinboard_http as http;
pub use pinboard_http::error;
