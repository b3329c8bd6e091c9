//! `boundpool run`: one graph, a built-in shape or a graph file, run `--repeat` times on a fresh
//! pool and verified every time; with `--gpu`, a shape as empty-kernel GPU nodes, eager or
//! replayed ([`gpu`]).
//!
//! One file per step of a host run: the graph described and checked before any thread starts
//! ([`graph`]; one too large for the machine refused by [`memory`]), the pool and the runs ([`host`]), the exactly-once-after-predecessors check
//! ([`verify`]), the summary ([`summary`]).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use boundpool_workloads::Shape;
use clap::{Args, ValueEnum};

use crate::gpu_pool::PartitionArg;

mod gpu;
mod graph;
mod host;
mod memory;
#[cfg(feature = "mpi")]
mod ranks;
mod summary;
mod verify;

#[derive(Args, Debug)]
pub(crate) struct RunArgs {
    /// Built-in graph shape (default: wavefront, unless --graph is given).
    #[arg(long, value_enum, conflicts_with = "graph")]
    shape: Option<ShapeArg>,
    /// Nodes of the built-in shape.
    #[arg(long, default_value_t = 1_000_000, conflicts_with = "graph")]
    size: usize,
    /// Busy work in every node of the built-in shape, in nanoseconds.
    #[arg(long, default_value_t = 0, conflicts_with = "graph")]
    work_ns: u64,
    /// Run the graph described in this JSON file instead (see the README for the format).
    #[arg(long, value_name = "FILE.json")]
    graph: Option<PathBuf>,
    /// With --graph, under mpirun: run the file's nodes on the ranks they name (`"rank": r`),
    /// each rank with --threads workers (default 2) and one communication thread.
    #[cfg(feature = "mpi")]
    #[arg(long, requires = "graph")]
    ranks: bool,
    /// Worker threads (default: the cores this process may use).
    #[arg(long)]
    threads: Option<usize>,
    /// Runs of the graph on one pool. The first is cold (caches, the graph's counters
    /// allocated); ns per node is the median of the others, warm, with the cold one beside it.
    /// With --gpu: timed runs after the first.
    #[arg(long, default_value_t = 5)]
    repeat: usize,
    /// Print the summary as one JSON object.
    #[arg(long)]
    json: bool,
    /// No progress bar and no notes on stderr.
    #[arg(long)]
    quiet: bool,
    /// Serve Prometheus metrics at http://ADDR/metrics while running.
    #[arg(long, value_name = "ADDR:PORT")]
    prometheus: Option<SocketAddr>,
    /// Keep serving --prometheus for this many seconds after the runs.
    #[arg(
        long,
        value_name = "SECS",
        default_value_t = 0.0,
        requires = "prometheus"
    )]
    linger: f64,
    /// Write the Prometheus exposition text at the end.
    #[arg(long, value_name = "FILE")]
    metrics_out: Option<PathBuf>,
    /// Record a timeline and write it in the Chrome trace format (Perfetto, chrome://tracing).
    #[arg(long, value_name = "FILE.json")]
    trace: Option<PathBuf>,
    /// Write the graph in Graphviz DOT.
    #[arg(long, value_name = "FILE")]
    dot: Option<PathBuf>,
    /// Run the built-in shape as empty-kernel GPU nodes on a GPU pool of device 0 (exits 2
    /// without a GPU). `--threads` is then the workers of the device (default 4).
    #[arg(long, conflicts_with = "graph")]
    gpu: bool,
    /// With --gpu: run it as a replayable graph (captured at the first run into CUDA graphs,
    /// replayed after).
    #[arg(long, requires = "gpu")]
    replay: bool,
    /// With --replay: capture each segment with at most this many branches (lane edges added,
    /// `ReplayBuilder::max_width`): launch-bound graphs of short kernels replay faster.
    #[arg(long, requires = "replay", value_parser = clap::value_parser!(u64).range(1..))]
    max_width: Option<u64>,
    #[command(flatten)]
    part: PartitionArg,
}

/// A built-in graph shape.
#[derive(ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
enum ShapeArg {
    /// Each node after the previous one.
    Chain,
    /// A full binary out-tree (size rounded down to 2^d - 1).
    Tree,
    /// One source, size - 2 independent nodes, one sink.
    Wide,
    /// A square grid, each cell after its left and upper neighbour (size rounded down to a square).
    #[default]
    Wavefront,
    /// A seeded random DAG, each node after up to 4 of the 64 nodes before it.
    Random,
}

impl ShapeArg {
    fn shape(self) -> Shape {
        match self {
            ShapeArg::Chain => Shape::Chain,
            ShapeArg::Tree => Shape::Tree,
            ShapeArg::Wide => Shape::Wide,
            ShapeArg::Wavefront => Shape::Wavefront,
            ShapeArg::Random => Shape::Random,
        }
    }
}

/// Why `run` stopped: bad input (exit 2, nothing ran) or a failed run (exit 1).
enum Fail {
    Input(String),
    Run(String),
}

pub(crate) fn main(a: RunArgs) -> ExitCode {
    #[cfg(feature = "mpi")]
    if let (true, Some(path)) = (a.ranks, &a.graph) {
        return ranks::run(path, a.threads.unwrap_or(2), a.repeat, a.quiet);
    }
    if a.gpu {
        return gpu::main(&a);
    }
    match host::main(&a) {
        Ok(code) => code,
        Err(Fail::Input(m)) => {
            eprintln!("boundpool run: {m}");
            ExitCode::from(2)
        }
        Err(Fail::Run(m)) => {
            eprintln!("boundpool run: {m}");
            ExitCode::from(1)
        }
    }
}
