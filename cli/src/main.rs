//! The `boundpool` command line: run a built-in or file-described graph on a pool and verify it,
//! benchmark the standard shapes against rayon-core, draw recorded timelines, list the metrics.
//!
//! ```text
//! boundpool run --shape wavefront --size 1000000 --threads 2
//! boundpool run --graph pipeline.json --trace trace.json --dot graph.dot
//! boundpool bench --scale 0.1
//! boundpool trace trace.json --svg timeline.svg
//! boundpool metrics
//! boundpool soak --seconds 600 --submitters 64 [--gpu]
//! boundpool run --gpu --shape chain --size 1000 --partitions latency:8:1,bulk:rest:3
//! boundpool sim cholesky --n 131072 --tile 2048 --gpus 64 --network ib
//! ```
//!
//! Exit status: 0 on success, 1 when a run failed or its verification did not pass, 2 for bad
//! arguments or a bad graph file (reported before any node runs).
//!
//! One module per subcommand (`run`, `bench`, `trace`, `metrics`, `soak`, `sim`), each with its
//! arguments (a clap `Args` struct) beside its code and a `main` taking them; below them what
//! several share: the GPU pool of `--gpu` and `--partitions` (`gpu_pool`), progress bars
//! (`progress`) and this process as `/proc` shows it (`process`). A new subcommand is a module
//! and one variant of [`Command`].

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod bench;
mod gpu_pool;
mod metrics;
mod process;
mod progress;
mod run;
mod sim;
mod soak;
mod trace;

/// Task graphs on a bounded pool of pinned, work-stealing worker threads.
#[derive(Parser, Debug)]
#[command(name = "boundpool", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a built-in graph shape or a graph file, check every node ran exactly once after its
    /// predecessors, and print nodes, ns per node (warm, and the first run's, cold), peak OS
    /// threads and steals.
    Run(run::RunArgs),
    /// Benchmark the standard shapes on boundpool against the rayon-core baselines.
    Bench(bench::BenchArgs),
    /// Summarise a Chrome trace written by `run --trace`, or draw it as an SVG timeline.
    Trace(trace::TraceArgs),
    /// Print the markdown table of every metric the scheduler exports.
    Metrics,
    /// Submit random graphs with injected errors, panics, cancels, nested submits and dropped
    /// handles from many threads for a while; check every outcome, the OS threads and the
    /// memory; exit 1 on any violation.
    Soak(soak::SoakArgs),
    /// Simulate a graph's run on a described machine (ranks, GPUs, links) in virtual time:
    /// the tiled Cholesky on up to thousands of GPUs, a graph file on host ranks; build cost
    /// models from traces; check the simulator against real runs.
    Sim(sim::SimArgs),
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Run(a) => run::main(a),
        Command::Bench(a) => bench::main(a),
        Command::Trace(a) => trace::main(a),
        Command::Metrics => metrics::main(),
        Command::Soak(a) => soak::main(a),
        Command::Sim(a) => sim::main(a),
    }
}
