//! The one error type for failures that cross module boundaries.
//!
//! Shaped after Pingora's: every error records where it came from (the client side of a
//! connection, an upstream worker, Redis, or our own code) and whether trying again may help,
//! so that callers decide status codes and retries from data rather than from message text.

use std::borrow::Cow;
use std::fmt;

/// Which side of the node a failure came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// The client connection: malformed input, a peer that went away.
    Downstream,
    /// A worker we forward to or probe.
    Upstream,
    /// The Redis server or cluster holding the registry.
    Redis,
    /// The machine the node runs on: a port already taken, a resource it cannot have.
    Host,
    /// A bug or broken invariant in this process.
    Internal,
}

impl Origin {
    fn as_str(self) -> &'static str {
        match self {
            Origin::Downstream => "client",
            Origin::Upstream => "worker",
            Origin::Redis => "redis",
            Origin::Host => "host",
            Origin::Internal => "internal",
        }
    }
}

pub struct Error {
    origin: Origin,
    retryable: bool,
    context: Cow<'static, str>,
    cause: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl Error {
    pub fn new(origin: Origin, context: impl Into<Cow<'static, str>>) -> Error {
        Error {
            origin,
            retryable: false,
            context: context.into(),
            cause: None,
        }
    }

    pub fn because(
        origin: Origin,
        context: impl Into<Cow<'static, str>>,
        cause: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Error {
        Error {
            cause: Some(cause.into()),
            ..Error::new(origin, context)
        }
    }

    /// Marks the failure as transient: the same request may succeed if sent again.
    pub fn retryable(mut self, retryable: bool) -> Error {
        self.retryable = retryable;
        self
    }

    pub fn origin(&self) -> Origin {
        self.origin
    }

    pub fn is_retryable(&self) -> bool {
        self.retryable
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.origin.as_str(), self.context)?;
        if let Some(cause) = &self.cause {
            write!(f, ": {cause}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self} (retryable: {})", self.retryable)
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.cause
            .as_deref()
            .map(|c| c as &(dyn std::error::Error + 'static))
    }
}
