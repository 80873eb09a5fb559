//! What operators use to watch and steer the node: health and readiness probes,
//! `/registry/health` and `/metrics`, the fleet views (a page at a time: `paging.rs`), drains
//! and wind-downs, an instance's move (`move_instance.rs`) and pause (`pause.rs`), its
//! ownership history (`history.rs`), and the console that calls them from a browser
//! (`console.rs`).

pub mod console;
mod drain;
mod health;
mod history;
mod listing;
mod metrics;
mod move_instance;
mod paging;
mod pause;
mod views;
mod wind_down;

pub use drain::{drain, undrain};
pub use health::{healthz, readyz, registry_health};
pub use history::history;
pub use metrics::{metrics, scrape};
pub use move_instance::move_instance;
pub use pause::{pause, resume};
pub use views::{OverviewFilter, overview, stats, workers};
pub use wind_down::wind_down;
