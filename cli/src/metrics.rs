//! What the command line prints about the scheduler itself: the metric table and the process's
//! OS thread count.

use std::fmt::Write as _;

use boundpool::gpu::GPU_METRICS;
use boundpool::METRICS;

/// The number of OS threads of this process, counted from `/proc/self/task` (`None` where that
/// does not exist, i.e. off Linux).
pub(crate) fn os_threads() -> Option<usize> {
    std::fs::read_dir("/proc/self/task").ok().map(|d| d.count())
}

/// The markdown table of every metric the scheduler emits (name, type, unit, labels, meaning),
/// generated from [`METRICS`] and the GPU backend's [`GPU_METRICS`]. `boundpool metrics`
/// prints it; the README holds a copy.
pub(crate) fn metrics_table() -> String {
    let mut s = String::from(
        "| name | type | unit | labels | meaning |\n| --- | --- | --- | --- | --- |\n",
    );
    for &(name, kind, unit, labels, meaning) in METRICS.iter().chain(GPU_METRICS) {
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
        for &(name, ..) in METRICS.iter().chain(GPU_METRICS) {
            assert!(t.contains(&format!("`{name}`")), "{name} missing");
        }
        assert_eq!(t.lines().count(), METRICS.len() + GPU_METRICS.len() + 2);
    }
}
