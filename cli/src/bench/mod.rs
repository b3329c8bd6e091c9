//! `boundpool bench`: the standard shapes on boundpool and the rayon-core baselines, in one
//! process; `--scaling` at 1, 2, 4, ... workers; `--latency` what priorities buy
//! ([`latency`]); `--gpu` the replay bench ([`gpu`]).

use std::process::ExitCode;

use boundpool::default_workers;
use boundpool_workloads::{
    bench_scaling, bench_shapes, scaling_workers, BenchConfig, BenchRow, ScalingRow,
};
use clap::Args;

use crate::gpu_pool::PartitionArg;
use crate::progress::Progress;

mod gpu;
mod latency;

#[derive(Args, Debug)]
pub(crate) struct BenchArgs {
    /// Print a JSON array of rows instead of the table.
    #[arg(long)]
    json: bool,
    /// Scale factor on the standard sizes (1.0: chain 1,000,000, tree depth 20, wide 1,000,000,
    /// wavefront 1000x1000).
    #[arg(long, default_value_t = 1.0)]
    scale: f64,
    /// Runs per implementation and shape (the median is reported).
    #[arg(long, default_value_t = 7)]
    runs: usize,
    /// Worker threads for boundpool and rayon (default: the cores this process may use); with
    /// --scaling, the most workers measured.
    #[arg(long)]
    threads: Option<usize>,
    /// Run each shape at 1, 2, 4, 8, 16, ... workers (up to --threads, default the cores this
    /// process may use) and print ns per node and the speedup over one worker, boundpool beside
    /// rayon-core (a JSON array of rows with --json).
    #[arg(long, conflicts_with_all = ["latency", "thread_per_node"])]
    scaling: bool,
    /// Nodes of the wide shape for the thread-per-node baseline (default: 20,000 times the
    /// scale, at most 20,000; 0 skips it).
    #[arg(long)]
    thread_per_node: Option<usize>,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
    /// The latency bench instead: a high-priority 20-node chain every millisecond, alone and
    /// under low-priority wide graphs that keep every worker busy (one JSON object with --json).
    #[arg(long)]
    latency: bool,
    /// With --latency: GPU nodes on device 0. Alone: the replay bench (graphs of 1,000
    /// empty-kernel GPU nodes, eager, replayed and as a raw CUDA graph; --runs rounds). Exits 2
    /// without a GPU.
    #[arg(long)]
    gpu: bool,
    /// With --latency: seconds per phase (five phases; seven with --gpu).
    #[arg(long, default_value_t = 2.0)]
    seconds: f64,
    #[command(flatten)]
    part: PartitionArg,
}

pub(crate) fn main(a: BenchArgs) -> ExitCode {
    if a.latency {
        return latency::main(&a);
    }
    if a.gpu {
        return gpu::main(&a);
    }
    if a.scale.is_nan() || a.scale <= 0.0 || a.runs == 0 {
        eprintln!("boundpool bench: --scale must be positive and --runs at least 1");
        return ExitCode::from(2);
    }
    let threads = a.threads.unwrap_or_else(default_workers);
    if threads == 0 {
        eprintln!("boundpool bench: --threads must be at least 1");
        return ExitCode::from(2);
    }
    if a.scaling {
        return scaling(&a, threads);
    }
    let cfg = BenchConfig {
        threads,
        runs: a.runs,
        scale: a.scale,
        thread_per_node_nodes: a
            .thread_per_node
            .unwrap_or(((20_000.0 * a.scale.min(1.0)) as usize).max(2)),
    };
    // Per mille of the measurements done (the bar's length must match the positions set).
    let mut progress = Progress::new(1000, "bench", a.quiet);
    let rows = bench_shapes(&cfg, |done, total| {
        progress.set(done as u64 * 1000 / total.max(1) as u64);
    });
    progress.finish();
    emit(
        a.json,
        || serde_json::to_string_pretty(&rows),
        || table(&rows, threads, a.runs),
    )
}

/// Prints the rows as pretty JSON (`json`) or as the text `table` makes of them.
fn emit(
    json: bool,
    to_json: impl FnOnce() -> serde_json::Result<String>,
    table: impl FnOnce() -> String,
) -> ExitCode {
    if json {
        match to_json() {
            Ok(s) => println!("{s}"),
            Err(e) => {
                eprintln!("boundpool bench: {e}");
                return ExitCode::from(1);
            }
        }
    } else {
        print!("{}", table());
    }
    ExitCode::SUCCESS
}

/// The better rayon-core variant's ns per node for `row`'s shape and size, if measured.
fn best_rayon(rows: &[BenchRow], row: &BenchRow) -> Option<f64> {
    rows.iter()
        .filter(|r| {
            r.shape == row.shape && r.nodes == row.nodes && r.implementation.starts_with("rayon")
        })
        .map(|r| r.ns_per_node)
        .min_by(f64::total_cmp)
}

fn table(rows: &[BenchRow], threads: usize, runs: usize) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(s, "{threads} worker threads, median of {runs} run(s); ratio: ns per node / the better rayon-core variant's (lower is better)");
    let _ = writeln!(
        s,
        "{:<10} {:<16} {:>9} {:>10} {:>14}",
        "shape", "impl", "nodes", "ns/node", "vs best rayon"
    );
    for r in rows {
        let ratio =
            best_rayon(rows, r).map_or("-".to_string(), |b| format!("{:.2}", r.ns_per_node / b));
        let _ = writeln!(
            s,
            "{:<10} {:<16} {:>9} {:>10.1} {:>14}",
            r.shape, r.implementation, r.nodes, r.ns_per_node, ratio
        );
    }
    s
}

/// `bench --scaling`: every shape at 1, 2, 4, ... workers up to `max`.
fn scaling(a: &BenchArgs, max: usize) -> ExitCode {
    let workers = scaling_workers(max);
    let mut progress = Progress::new(1000, "bench --scaling", a.quiet);
    let rows = bench_scaling(&workers, a.runs, a.scale, |done, total| {
        progress.set(done as u64 * 1000 / total.max(1) as u64);
    });
    progress.finish();
    emit(
        a.json,
        || serde_json::to_string_pretty(&rows),
        || scaling_table(&rows, a.runs),
    )
}

fn scaling_table(rows: &[ScalingRow], runs: usize) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "median of {runs} run(s); ns/node: wall time per node; speedup: over the same \
         implementation on 1 worker; rayon: the better rayon-core variant at that worker count; \
         vs rayon: boundpool ns/node / rayon's (lower is better)"
    );
    let _ = writeln!(
        s,
        "{:<10} {:>7} {:>9} {:>10} {:>8} {:>10} {:>8} {:>9}",
        "shape", "workers", "nodes", "boundpool", "speedup", "rayon", "speedup", "vs rayon"
    );
    for bp in rows.iter().filter(|r| r.implementation == "boundpool") {
        let rayon = rows
            .iter()
            .filter(|r| {
                r.shape == bp.shape
                    && r.workers == bp.workers
                    && r.implementation.starts_with("rayon")
            })
            .min_by(|x, y| x.ns_per_node.total_cmp(&y.ns_per_node));
        let (rns, rsp, vs) = match rayon {
            Some(r) => (
                format!("{:.1}", r.ns_per_node),
                format!("{:.2}x", r.speedup),
                format!("{:.2}", bp.ns_per_node / r.ns_per_node),
            ),
            None => ("-".into(), "-".into(), "-".into()),
        };
        let _ = writeln!(
            s,
            "{:<10} {:>7} {:>9} {:>10.1} {:>8} {:>10} {:>8} {:>9}",
            bp.shape,
            bp.workers,
            bp.nodes,
            bp.ns_per_node,
            format!("{:.2}x", bp.speedup),
            rns,
            rsp,
            vs
        );
    }
    s
}
