//! `boundpool bench --gpu`: the replay bench (graphs of empty-kernel GPU nodes eager, replayed
//! and as a raw CUDA graph of the same topology, interleaved) on a GPU pool of device 0; with
//! `--partitions`, a pool of SM partitions (the raw and captured graphs use the whole device).

use std::process::ExitCode;

use boundpool::gpu::ShutdownMode;
use boundpool_workloads::{bench_replay_on, replay_table, ReplayBenchConfig};

use super::BenchArgs;
use crate::gpu_pool;
use crate::progress::Progress;

pub(super) fn main(a: &BenchArgs) -> ExitCode {
    if let Some(c) = gpu_pool::no_gpu("bench") {
        return c;
    }
    let cfg = ReplayBenchConfig {
        rounds: a.runs.max(1),
        ..ReplayBenchConfig::default()
    };
    let (pool, splits) = match gpu_pool::open("bench --gpu", cfg.workers, &a.part, a.json) {
        Ok(p) => p,
        Err(code) => return code,
    };
    let mut progress = Progress::new(1000, "bench --gpu", a.quiet || a.json);
    let r = bench_replay_on(&pool, &cfg, |done, total| {
        progress.set(done as u64 * 1000 / total.max(1) as u64)
    });
    progress.finish();
    pool.shutdown(ShutdownMode::Finish);
    let (rows, upd) = match r {
        Ok(r) => r,
        Err(e) => {
            eprintln!("boundpool bench --gpu: {e}");
            return ExitCode::from(1);
        }
    };
    if a.json {
        let mut items: Vec<String> = rows.iter().map(|r| r.to_json()).collect();
        items.push(upd.to_json());
        if !splits.is_empty() {
            // One more element, told apart as the update row is, by its `shape`.
            let v = serde_json::json!({
                "shape": "partitions",
                "partitions": gpu_pool::json_of(&splits),
            });
            items.push(v.to_string());
        }
        println!("[{}]", items.join(","));
    } else {
        print!("{}", replay_table(&rows, &upd));
    }
    ExitCode::SUCCESS
}
