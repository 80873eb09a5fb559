//! Helpers shared by the integration tests. Every test binary compiles this module but uses only
//! part of it, so unused items are expected here.
#![allow(dead_code)]

pub mod attest;
pub mod fleet;
pub mod http;
pub mod node;
pub mod redis;
pub mod worker;
