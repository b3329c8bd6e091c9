//! `boundpool run --gpu [--replay]`: a built-in shape as empty-kernel GPU nodes on a GPU pool of
//! device 0, eager or replayed as CUDA graphs; with `--partitions`, a pool of SM partitions
//! whose workers all serve the nodes (placed on the device).

use std::process::ExitCode;
use std::time::{Duration, Instant};

use boundpool::gpu::{BoxError, GpuDevice, GpuPool, ShutdownMode};
use boundpool_workloads::{eager_graph, median, replay_graph_with, GpuShape};
use serde_json::{json, Map, Value};

use super::RunArgs;
use crate::gpu_pool::{self, DeviceSplit};

pub(super) fn main(a: &RunArgs) -> ExitCode {
    if let Some(c) = gpu_pool::no_gpu("run") {
        return c;
    }
    if a.repeat == 0 {
        eprintln!("boundpool run: --repeat must be at least 1");
        return ExitCode::from(2);
    }
    let shape = a.shape.unwrap_or_default().shape();
    if let Err(m) = super::graph::check_shape(shape, a.size) {
        eprintln!("boundpool run: {m}");
        return ExitCode::from(2);
    }
    let workers = a.threads.unwrap_or(4).max(1);
    let (pool, splits) = match gpu_pool::open("run", workers, &a.part, a.json) {
        Ok(p) => p,
        Err(code) => return code,
    };
    let shape = GpuShape::Builtin(shape);
    let r = run(a, shape, &pool);
    pool.shutdown(ShutdownMode::Finish);
    match r {
        Ok(out) => {
            print(a, out, &splits);
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("boundpool run: {e}");
            ExitCode::from(1)
        }
    }
}

/// Runs the shape `--repeat` times after a first run (eagerly, or replayed: the first run
/// captures and instantiates) and returns the figures, in print order.
fn run(a: &RunArgs, shape: GpuShape, pool: &GpuPool) -> Result<Map<String, Value>, BoxError> {
    let dev = pool.devices()[0].clone();
    let preds = shape.preds(a.size);
    let nodes = preds.len();
    let mut out = Map::new();
    out.insert("shape".into(), json!(shape.name()));
    let mode = if a.replay { "replay" } else { "eager" };
    out.insert("mode".into(), json!(mode));
    out.insert("nodes".into(), json!(nodes));
    out.insert(
        "edges".into(),
        json!(preds.iter().map(Vec::len).sum::<usize>()),
    );
    out.insert("runs".into(), json!(a.repeat));
    let (t, extra) = if a.replay {
        replayed(a, &dev, pool, shape, &preds)?
    } else {
        let g = eager_graph(&dev, shape, &preds)?;
        let t = timed(a.repeat, || Ok(pool.submit(&g)?.wait().map(drop)?))?;
        (t, Map::new())
    };
    let med = median(&t.later_us);
    out.insert("first_run_us".into(), json!(t.first_us));
    out.insert("median_run_us".into(), json!(med));
    out.insert("ns_per_node".into(), json!(med * 1e3 / nodes.max(1) as f64));
    out.extend(extra);
    Ok(out)
}

/// The shape as a replayable graph: its runs' times, and what the capture made (segments, CUDA
/// graph nodes and edges, capture and instantiation per node).
fn replayed(
    a: &RunArgs,
    dev: &GpuDevice,
    pool: &GpuPool,
    shape: GpuShape,
    preds: &[Vec<u32>],
) -> Result<(Timed, Map<String, Value>), BoxError> {
    let r = replay_graph_with(dev, shape, preds, a.max_width.map(|w| w as usize))?;
    let t = timed(a.repeat, || Ok(r.run(pool).map(drop)?))?;
    let s = r.stats();
    let per = |d: Duration| d.as_secs_f64() * 1e6 / preds.len().max(1) as f64;
    let mut extra = Map::new();
    extra.insert("max_width".into(), json!(a.max_width));
    extra.insert("segments".into(), json!(r.segments()));
    extra.insert("executables".into(), json!(r.executables()));
    extra.insert("captured_nodes".into(), json!(s.captured_nodes));
    extra.insert("captured_edges".into(), json!(s.captured_edges));
    extra.insert("capture_us_per_node".into(), json!(per(s.capture_time)));
    extra.insert(
        "instantiate_us_per_node".into(),
        json!(per(s.instantiate_time)),
    );
    Ok((t, extra))
}

/// The times of a first run and of the runs after it, in µs.
struct Timed {
    first_us: f64,
    later_us: Vec<f64>,
}

/// Calls `once` `1 + repeat` times and times each call.
fn timed(repeat: usize, mut once: impl FnMut() -> Result<(), BoxError>) -> Result<Timed, BoxError> {
    let mut t = Timed {
        first_us: 0.0,
        later_us: Vec::with_capacity(repeat),
    };
    for i in 0..repeat + 1 {
        let t0 = Instant::now();
        once()?;
        let us = t0.elapsed().as_secs_f64() * 1e6;
        if i == 0 {
            t.first_us = us;
        } else {
            t.later_us.push(us);
        }
    }
    Ok(t)
}

/// Prints `out` as one JSON object (with the partitions) or one line per figure.
fn print(a: &RunArgs, mut out: Map<String, Value>, splits: &[DeviceSplit]) {
    if a.json {
        if !splits.is_empty() {
            out.insert("partitions".into(), gpu_pool::json_of(splits));
        }
        println!("{}", Value::Object(out));
    } else {
        for (k, v) in out {
            println!("{k:<24} {v}");
        }
    }
}
