//! What operators use to watch the node: health and readiness probes, `/registry/health`
//! and `/metrics` (and, as the registry grows, the fleet views, drains and wind-downs).

pub mod console;
mod drain;
mod health;
mod listing;
mod metrics;
mod paging;
mod views;
mod wind_down;

pub use drain::{drain, undrain};
pub use health::{healthz, readyz, registry_health};
pub use metrics::{metrics, scrape};
pub use views::{OverviewFilter, overview, stats, workers};
pub use wind_down::wind_down;
