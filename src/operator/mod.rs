//! What operators use to watch the node: health and readiness probes (and, as the registry
//! grows, the fleet views, drains and wind-downs).

mod health;

pub use health::{healthz, readyz, registry_health};
