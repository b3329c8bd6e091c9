//! `boundpool sim check-cholesky` and `check-serve`: what the GPU machine recorded
//! (`benches/device/sim_call.sh`, `sim_record`) against its simulation. Only the recorded
//! files are needed: the costs come from the one-stream (Cholesky) or one-client (serving)
//! trace, the GPU's sharing from one other recorded run (named in the output), and every
//! other run is predicted.

use std::path::Path;

use serde_json::Value;

mod cholesky;
mod serve;

pub(crate) use cholesky::{cholesky, CheckCholeskyArgs};
pub(crate) use serve::{serve, CheckServeArgs};

fn read_json(path: &Path) -> Result<Value, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{} is not JSON: {e}", path.display()))
}

/// The numbers `K` of the files `PREFIX{K}SUFFIX` in `dir`, ascending.
fn recorded(dir: &Path, prefix: &str, suffix: &str) -> Result<Vec<usize>, String> {
    let mut ks: Vec<usize> = std::fs::read_dir(dir)
        .map_err(|e| format!("cannot read {}: {e}", dir.display()))?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.strip_prefix(prefix)?
                .strip_suffix(suffix)?
                .parse()
                .ok()
        })
        .collect();
    ks.sort_unstable();
    if ks.is_empty() {
        return Err(format!("{}: no {prefix}K{suffix}", dir.display()));
    }
    Ok(ks)
}

/// The GPU node spans of a Chrome trace (`args.kind == "span"` with a node): name, start and
/// end in µs.
fn node_spans(trace: &Value) -> Vec<(String, f64, f64)> {
    trace["traceEvents"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["ph"] == "X" && e["args"]["kind"] == "span" && !e["args"]["node"].is_null())
        .filter_map(|e| {
            let ts = e["ts"].as_f64()?;
            Some((e["name"].as_str()?.to_owned(), ts, ts + e["dur"].as_f64()?))
        })
        .collect()
}

/// The time exactly one of `spans` runs and the time two or more do, µs.
fn busy_time(spans: &[(f64, f64)]) -> (f64, f64) {
    let mut edges: Vec<(f64, i32)> = spans.iter().flat_map(|&(a, b)| [(a, 1), (b, -1)]).collect();
    // Ends before starts at one instant: touching spans do not overlap.
    edges.sort_by(|x, y| x.0.total_cmp(&y.0).then(x.1.cmp(&y.1)));
    let (mut one, mut more, mut depth, mut last) = (0.0, 0.0, 0, f64::NEG_INFINITY);
    for (t, d) in edges {
        match depth {
            0 => {}
            1 => one += t - last,
            _ => more += t - last,
        }
        depth += d;
        last = t;
    }
    (one, more)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_alone_and_shared() {
        // [0, 10) and [5, 20) overlap on [5, 10); [20, 25) touches the second.
        let (one, more) = busy_time(&[(0.0, 10.0), (5.0, 20.0), (20.0, 25.0), (40.0, 41.0)]);
        assert_eq!((one, more), (21.0, 5.0));
    }
}
