//! Seeing the scheduler: Prometheus export and Chrome-format timelines. (The SVG timeline
//! pictures, the metric table and the OS thread count are the command line's, in `cli/`.)
//!
//! The scheduler emits its metrics through the [`metrics`] facade and records timelines only when
//! asked ([`PoolBuilder::trace`](crate::PoolBuilder::trace)); this module turns both into what
//! people already look at:
//!
//! * `install_prometheus` (feature `prometheus`) — one line that installs a Prometheus
//!   recorder and serves `/metrics`:
//!
//!   ```no_run
//!   # #[cfg(feature = "prometheus")] {
//!   let handle = boundpool::observe::install_prometheus(([127, 0, 0, 1], 9000))?;
//!   // ... build pools, run graphs; scrape http://127.0.0.1:9000/metrics meanwhile ...
//!   println!("{}", handle.render()); // the same exposition text, in process
//!   # }
//!   # Ok::<(), boundpool::observe::ObserveError>(())
//!   ```
//! * [`chrome_trace`] — a [`Trace`](crate::Trace) in the Chrome trace format that Perfetto's UI and
//!   `chrome://tracing` open.
//! * `serve_metrics_and_trace` (feature `prometheus`) — `/metrics` and, for the pools given to
//!   `publish_trace`, `/trace` (the rolling window as Chrome trace JSON) on one port.
//!
//! One file per output: `prometheus.rs` (the exporter, and where a server runs),
//! `endpoint.rs` (the `/metrics` + `/trace` endpoint, on hyper), both behind the facade's
//! `prometheus` feature, off by default, and `chrome_trace.rs` (the Chrome trace JSON).

use std::fmt;

mod chrome_trace;
#[cfg(feature = "prometheus")]
mod endpoint;
#[cfg(feature = "prometheus")]
mod prometheus;

pub use chrome_trace::chrome_trace;
#[cfg(feature = "prometheus")]
pub use endpoint::{publish_trace, publish_trace_of, serve_metrics_and_trace};
#[cfg(feature = "prometheus")]
pub use prometheus::{
    install_prometheus, install_prometheus_recorder, PrometheusHandle, BUCKETS_SECONDS,
};

/// Why an observability set-up failed.
#[derive(Debug)]
pub struct ObserveError(String);

impl fmt::Display for ObserveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ObserveError {}
