//! `boundpool run --gpu [--replay]` and `boundpool bench --gpu`: built-in shapes as empty-kernel
//! GPU nodes on a GPU pool of device 0, eager or replayed as CUDA graphs; with `--partitions`,
//! a pool of SM partitions whose workers all serve the nodes (placed on the device).

use std::process::ExitCode;
use std::time::Instant;

use boundpool::gpu::{gpu_unavailable_reason, GpuPool};
use boundpool_workloads::{
    bench_replay_on, eager_graph, gpu_pool_with, median, replay_graph_with, replay_table, GpuShape,
    ReplayBenchConfig, Shape,
};
use serde_json::json;

use super::partitions::{self, DeviceSplit};
use super::progress::Progress;
use crate::{BenchArgs, RunArgs};

/// Exit 2 with the reason when there is no GPU.
fn no_gpu(cmd: &str) -> Option<ExitCode> {
    let why = gpu_unavailable_reason()?;
    eprintln!("boundpool {cmd} --gpu: no GPU: {why}");
    Some(ExitCode::from(2))
}

pub(crate) fn run_main(a: &RunArgs, shape: Shape) -> ExitCode {
    if let Some(c) = no_gpu("run") {
        return c;
    }
    if a.repeat == 0 {
        eprintln!("boundpool run: --repeat must be at least 1");
        return ExitCode::from(2);
    }
    let workers = a.threads.unwrap_or(4).max(1);
    let (pool, splits) = match open_pool("run", workers, &a.part.partitions, a.json) {
        Ok(p) => p,
        Err(code) => return code,
    };
    match run(a, shape, pool, &splits) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("boundpool run: {e}");
            ExitCode::from(1)
        }
    }
}

fn run(
    a: &RunArgs,
    shape: Shape,
    pool: GpuPool,
    splits: &[DeviceSplit],
) -> Result<(), boundpool::gpu::BoxError> {
    let dev = pool.devices()[0].clone();
    let gshape = GpuShape::Builtin(shape);
    let preds = gshape.preds(a.size);
    let nodes = preds.len();
    let edges: usize = preds.iter().map(Vec::len).sum();
    let mut times = Vec::with_capacity(a.repeat);
    let mut first_us = 0.0;
    let mut extra = serde_json::Map::new();
    if a.replay {
        let r = replay_graph_with(&dev, gshape, &preds, a.max_width.map(|w| w as usize))?;
        for i in 0..a.repeat + 1 {
            let t = Instant::now();
            r.run(&pool)?;
            let us = t.elapsed().as_secs_f64() * 1e6;
            if i == 0 {
                first_us = us;
            } else {
                times.push(us);
            }
        }
        let s = r.stats();
        let per = |d: std::time::Duration| d.as_secs_f64() * 1e6 / nodes.max(1) as f64;
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
    } else {
        let g = eager_graph(&dev, gshape, &preds)?;
        for i in 0..a.repeat + 1 {
            let t = Instant::now();
            pool.submit(&g)?.wait()?;
            let us = t.elapsed().as_secs_f64() * 1e6;
            if i == 0 {
                first_us = us;
            } else {
                times.push(us);
            }
        }
    }
    let med = median(&times);
    pool.shutdown(boundpool::gpu::ShutdownMode::Finish);
    let mut out = serde_json::Map::new();
    out.insert("shape".into(), json!(shape.name()));
    out.insert(
        "mode".into(),
        json!(if a.replay { "replay" } else { "eager" }),
    );
    out.insert("nodes".into(), json!(nodes));
    out.insert("edges".into(), json!(edges));
    out.insert("runs".into(), json!(a.repeat));
    out.insert("first_run_us".into(), json!(first_us));
    out.insert("median_run_us".into(), json!(med));
    out.insert("ns_per_node".into(), json!(med * 1e3 / nodes.max(1) as f64));
    out.extend(extra);
    if a.json {
        if !splits.is_empty() {
            out.insert("partitions".into(), partitions::json_of(splits));
        }
        println!("{}", serde_json::Value::Object(out));
    } else {
        for (k, v) in out {
            println!("{k:<24} {v}");
        }
    }
    Ok(())
}

pub(crate) fn bench_main(a: &BenchArgs) -> ExitCode {
    if let Some(c) = no_gpu("bench") {
        return c;
    }
    let cfg = ReplayBenchConfig {
        rounds: a.runs.max(1),
        ..ReplayBenchConfig::default()
    };
    let (pool, splits) = match open_pool("bench --gpu", cfg.workers, &a.part.partitions, a.json) {
        Ok(p) => p,
        Err(code) => return code,
    };
    let mut progress = Progress::new(1000, "bench --gpu", a.quiet || a.json);
    let r = bench_replay_on(&pool, &cfg, |done, total| {
        progress.set(done as u64 * 1000 / total.max(1) as u64)
    });
    progress.finish();
    pool.shutdown(boundpool::gpu::ShutdownMode::Finish);
    match r {
        Ok((rows, upd)) => {
            if a.json {
                let mut items: Vec<String> = rows.iter().map(|r| r.to_json()).collect();
                items.push(upd.to_json());
                if !splits.is_empty() {
                    // One more element, told apart as the update row is, by its `shape`.
                    let v = serde_json::json!({
                        "shape": "partitions",
                        "partitions": partitions::json_of(&splits),
                    });
                    items.push(v.to_string());
                }
                println!("[{}]", items.join(","));
            } else {
                print!("{}", replay_table(&rows, &upd));
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("boundpool bench --gpu: {e}");
            ExitCode::from(1)
        }
    }
}

/// The command's GPU pool (`workers` workers, or the partitions' of `spec`) and what each
/// partition got, printed unless `json`; a pool that cannot be built is reported as `cmd`'s
/// error and its exit status.
fn open_pool(
    cmd: &str,
    workers: usize,
    spec: &Option<partitions::PartitionSpec>,
    json: bool,
) -> Result<(GpuPool, Vec<DeviceSplit>), ExitCode> {
    let pool = gpu_pool_with(workers, partitions::of(spec)).map_err(|e| {
        eprintln!("boundpool {cmd}: {e}");
        partitions::build_failure(&e)
    })?;
    let splits = partitions::splits(&pool);
    if !json {
        partitions::print_lines(&splits);
    }
    Ok((pool, splits))
}
