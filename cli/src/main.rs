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
//! ```
//!
//! Exit status: 0 on success, 1 when a run failed or its verification did not pass, 2 for bad
//! arguments or a bad graph file (reported before any node runs).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};

mod cli;

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
    /// predecessors, and print nodes, ns per node, peak OS threads and steals.
    Run(RunArgs),
    /// Benchmark the standard shapes on boundpool against the rayon-core baselines.
    Bench(BenchArgs),
    /// Summarise a Chrome trace written by `run --trace`, or draw it as an SVG timeline.
    Trace(TraceArgs),
    /// Print the markdown table of every metric the scheduler exports.
    Metrics,
    /// Submit random graphs with injected errors, panics, cancels, nested submits and dropped
    /// handles from many threads for a while; check every outcome, the OS threads and the
    /// memory; exit 1 on any violation.
    Soak(SoakArgs),
}

/// `--partitions`, shared by the subcommands that build a GPU pool (each has `--gpu` and
/// `--threads`).
#[derive(Args, Debug)]
struct PartitionArg {
    /// With --gpu: split device 0's SMs into partitions (green contexts; CUDA driver 12.5 or
    /// newer), each a worker group of its own. SPEC: comma-separated `NAME:SMS[:WORKERS]`, SMS a
    /// number or `rest` (the SMs the others leave; at most one), WORKERS 1 if left out, e.g.
    /// `latency:8:1,bulk:rest:3`. The GPU pool's workers are then the partitions' (so no
    /// --threads); GPU nodes run on any of them (`bench --latency`: the foreground on the first
    /// partition, the background on the last). Prints what each partition got before running
    /// (in the JSON too). A size the device cannot give exits 2.
    #[arg(
        long,
        value_name = "SPEC",
        value_parser = cli::partitions::parse,
        requires = "gpu",
        conflicts_with = "threads"
    )]
    partitions: Option<cli::partitions::PartitionSpec>,
}

#[derive(Args, Debug)]
struct SoakArgs {
    /// How long to run, in seconds.
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// Also run GPU graphs, on a GPU pool of device 0 (exit 2 when there is no GPU).
    #[arg(long)]
    gpu: bool,
    #[command(flatten)]
    part: PartitionArg,
    /// Submitter threads.
    #[arg(long, default_value_t = 64)]
    submitters: usize,
    /// Worker threads (default: the cores this process may use; with --gpu, per device).
    #[arg(long)]
    threads: Option<usize>,
    /// Seed of the submitters' random choices.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print the figures as one JSON object.
    #[arg(long)]
    json: bool,
    /// Test only: make the checker expect a wrong value once (a violation must be reported).
    #[arg(long, hide = true)]
    inject_wrong_value: bool,
}

/// A built-in graph shape.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum ShapeArg {
    /// Each node after the previous one.
    Chain,
    /// A full binary out-tree (size rounded down to 2^d - 1).
    Tree,
    /// One source, size - 2 independent nodes, one sink.
    Wide,
    /// A square grid, each cell after its left and upper neighbour (size rounded down to a square).
    Wavefront,
    /// A seeded random DAG, each node after up to 4 of the 64 nodes before it.
    Random,
}

#[derive(Args, Debug)]
struct RunArgs {
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
    /// Runs of the graph; ns per node is the median over them.
    #[arg(long, default_value_t = 1)]
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

#[derive(Args, Debug)]
struct BenchArgs {
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

#[derive(Args, Debug)]
struct TraceArgs {
    /// A Chrome trace file (as written by `boundpool run --trace`).
    file: PathBuf,
    /// Draw the timeline to this SVG file.
    #[arg(long, value_name = "OUT.svg")]
    svg: Option<PathBuf>,
    /// Width of the picture in pixels.
    #[arg(long, default_value_t = 1400)]
    width: u32,
    /// Colour node bars by graph, run or node name (auto: graph if several, else run if several, else node).
    #[arg(long, value_enum, default_value_t = ColorArg::Auto)]
    color: ColorArg,
}

/// How node bars are coloured.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum ColorArg {
    /// By graph when the trace holds several graphs, else by run when it holds several runs,
    /// else by node name.
    Auto,
    /// One colour per graph.
    Graph,
    /// One colour per run (`run --repeat`).
    Run,
    /// One colour per node name.
    Node,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Run(a) => cli::run::main(a),
        Command::Bench(a) => cli::bench::main(a),
        Command::Trace(a) => cli::trace::main(a),
        Command::Soak(a) => cli::soak::main(a),
        Command::Metrics => {
            print!("{}", cli::observe::metrics_table());
            ExitCode::SUCCESS
        }
    }
}
