//! Seeing the scheduler: Prometheus export, Chrome-format timelines, SVG timeline pictures, the
//! metric table, and the process's OS thread count.
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
//! * [`Timeline`] — reads such a file back and draws it as an SVG picture ([`Timeline::to_svg`]).
//! * [`metrics_table`] — the markdown table of every metric, generated from [`METRICS`].
//! * [`os_threads`] — the number of OS threads of this process (Linux: `/proc/self/task`).
//!
//! One file per output: `prometheus.rs` (the exporter and the `/metrics` + `/trace` endpoint,
//! behind the facade's `prometheus` feature, off by default), `chrome_trace.rs` (the Chrome
//! trace JSON) and `timeline.rs` (reading it back, the SVG picture).

use std::fmt::{self, Write as _};

use crate::METRICS;

mod chrome_trace;
#[cfg(feature = "prometheus")]
mod prometheus;
mod timeline;

pub use chrome_trace::chrome_trace;
#[cfg(feature = "prometheus")]
pub use prometheus::{
    install_prometheus, install_prometheus_recorder, publish_trace, publish_trace_of,
    serve_metrics_and_trace, PrometheusHandle, BUCKETS_SECONDS,
};
pub use timeline::{Bar, BarKind, ColorBy, Timeline};

/// Why an observability set-up failed.
#[derive(Debug)]
pub struct ObserveError(String);

impl fmt::Display for ObserveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ObserveError {}

/// The number of OS threads of this process, counted from `/proc/self/task` (`None` where that
/// does not exist, i.e. off Linux).
pub fn os_threads() -> Option<usize> {
    std::fs::read_dir("/proc/self/task").ok().map(|d| d.count())
}

/// The markdown table of every metric the scheduler emits (name, type, unit, labels, meaning),
/// generated from [`METRICS`]. `boundpool metrics` prints it; the README holds a copy.
pub fn metrics_table() -> String {
    let mut s = String::from(
        "| name | type | unit | labels | meaning |\n| --- | --- | --- | --- | --- |\n",
    );
    for &(name, kind, unit, labels, meaning) in METRICS {
        let labels = if labels.is_empty() {
            "—".to_string()
        } else {
            format!("`{}`", labels.replace(", ", "`, `"))
        };
        let _ = writeln!(s, "| `{name}` | {kind} | {unit} | {labels} | {meaning} |");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_table_lists_every_metric() {
        let t = metrics_table();
        for &(name, ..) in METRICS {
            assert!(t.contains(&format!("`{name}`")), "{name} missing");
        }
        assert_eq!(t.lines().count(), METRICS.len() + 2);
    }
}
