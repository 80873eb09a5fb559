//! Helpers for pinned-tower's integration tests: the node's own harnesses (`/tests/support`:
//! the redis-server, the raw HTTP client, the `pinboard` binary), as `pinned`'s tests use them.
#![allow(dead_code)]

#[path = "../../../tests/support/http.rs"]
pub mod http;
#[path = "../../../pinned/tests/support/layout.rs"]
pub mod layout;
#[path = "../../../tests/support/node.rs"]
pub mod node;
#[path = "../../../tests/support/process.rs"]
pub mod process;
#[path = "../../../tests/support/redis.rs"]
pub mod redis;
#[path = "../../../pinned/tests/support/tokens.rs"]
pub mod tokens;
#[path = "../../../pinned/tests/support/workers.rs"]
pub mod workers;
