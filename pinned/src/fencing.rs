//! Fenced writes to the stores an application keeps besides its durability store, by placement
//! epoch ([`Fence`](crate::Fence)): a SQLite table ([`FencedTable`], feature `sqlite`) and
//! Redis ([`FencedRedis`], feature `redis`). Each writes a key's value only when the writer's
//! epoch is at least the one stored with it, in one statement or script (race-free between
//! writers), and answers [`FencedError::Stale`](crate::FencedError::Stale) otherwise. The
//! statements and the script are `pinboard_protocol::worker::fencing`'s; this runs them.

#[cfg(feature = "redis")]
mod redis;
#[cfg(feature = "sqlite")]
mod sqlite;

#[cfg(feature = "redis")]
pub use self::redis::FencedRedis;
#[cfg(feature = "sqlite")]
pub use self::sqlite::FencedTable;
