//! `boundpool metrics`: the markdown table of every metric the scheduler and the GPU backend
//! emit.

use std::fmt::Write as _;
use std::process::ExitCode;

use boundpool::gpu::GPU_METRICS;
use boundpool::METRICS;

pub(crate) fn main() -> ExitCode {
    print!("{}", metrics_table());
    ExitCode::SUCCESS
}

/// The markdown table of every metric the scheduler emits (name, type, unit, labels, meaning),
/// generated from [`METRICS`] and the GPU backend's [`GPU_METRICS`]. docs/metrics.md holds a
/// copy.
fn metrics_table() -> String {
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
