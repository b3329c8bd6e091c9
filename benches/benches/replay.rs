//! Replay bench: graphs of 1,000 empty-kernel GPU nodes (independent, chain, 32x32 wavefront)
//! run eagerly on boundpool, replayed as CUDA graphs, and launched as a raw CUDA graph of the
//! same topology built with the driver API, in one process, interleaved; then the cost of an
//! update that changes only kernel arguments against a fresh capture + instantiate. See
//! `boundpool_workloads::bench_replay`.
//!
//! `cargo bench -p boundpool-bench --bench replay [-- --rounds N --per-round N --nodes N
//! --workers N --widths 1,4 --shapes chain,independent --json]` (`--shapes`: which shapes, in
//! that order: independent, chain, wavefront, tree, wide). Without a GPU it says why and exits (status 1 with
//! `BOUNDPOOL_REQUIRE_GPU=1`).
//!
//! `-- --variants [--shapes independent,chain] [--rounds N] [--runs N] [--json]`: instead, the
//! graph-variants experiment (`boundpool_workloads::bench_variants`): each shape's graph made six
//! ways (node by node, with an empty root removed or kept, captured, the capture cloned, the
//! capture rebuilt node by node) on one bound thread, each round instantiating every variant
//! anew and launching them in turn `--runs` times (default 100); one row per variant: median us
//! per launch, ratio to the node-by-node graph, instantiation, node and edge counts.

use boundpool_workloads::{
    bench_replay, bench_variants, replay_table, variants_table, GpuShape, ReplayBenchConfig, Shape,
};

/// Empty-kernel GPU graphs eager, replayed and as a raw CUDA graph, interleaved (see the top of
/// this file).
#[derive(clap::Parser, Debug)]
struct Args {
    /// Rounds; each times every implementation, on an instantiation of its own.
    #[arg(long)]
    rounds: Option<usize>,
    /// Timed runs per implementation and round.
    #[arg(long)]
    per_round: Option<usize>,
    /// Workers of the pool.
    #[arg(long)]
    workers: Option<usize>,
    /// Nodes per graph (the wavefront: the square at or above it).
    #[arg(long)]
    nodes: Option<usize>,
    /// More rows of the independent shape, replayed with `max_width(w)`.
    #[arg(long, value_delimiter = ',')]
    widths: Option<Vec<usize>>,
    /// These shapes, in this order (the first is captured and instantiated first in the
    /// process): independent, chain, tree, wide, wavefront, random.
    #[arg(long, value_delimiter = ',', value_parser = gpu_shape)]
    shapes: Option<Vec<GpuShape>>,
    /// The graph-variants experiment instead (no pool).
    #[arg(long)]
    variants: bool,
    /// With --variants: timed launches of each variant per round, interleaved.
    #[arg(long, default_value_t = 100)]
    runs: usize,
    /// A JSON array of rows.
    #[arg(long)]
    json: bool,
}

fn gpu_shape(name: &str) -> Result<GpuShape, String> {
    match name.trim() {
        "independent" => Ok(GpuShape::Independent),
        other => Shape::parse(other).map(GpuShape::Builtin).ok_or_else(|| {
            format!("unknown shape `{other}` (independent, chain, tree, wide, wavefront, random)")
        }),
    }
}

/// The bench's settings: the defaults, with what the flags change.
fn config(a: &Args) -> ReplayBenchConfig {
    let mut cfg = ReplayBenchConfig::default();
    if let Some(n) = a.rounds {
        cfg.rounds = n.max(1);
    }
    if let Some(n) = a.per_round {
        cfg.per_round = n.max(1);
    }
    if let Some(n) = a.workers {
        cfg.workers = n.max(1);
    }
    let n = a.nodes.map_or(cfg.nodes, |n| n.max(2));
    let side = (n as f64).sqrt().ceil() as usize;
    let size = |shape| match shape {
        GpuShape::Builtin(Shape::Wavefront) => side * side,
        _ => n,
    };
    if a.nodes.is_some() {
        cfg.nodes = n;
        cfg.shapes = [
            GpuShape::Independent,
            GpuShape::Builtin(Shape::Chain),
            GpuShape::Builtin(Shape::Wavefront),
        ]
        .map(|shape| (shape, size(shape)))
        .to_vec();
    }
    if let Some(shapes) = &a.shapes {
        cfg.shapes = shapes.iter().map(|&shape| (shape, size(shape))).collect();
    }
    if let Some(w) = &a.widths {
        cfg.widths = w.clone();
    }
    cfg
}

fn main() {
    let a: Args = boundpool_bench::flags::parse();
    if let Some(why) = boundpool_gpu::gpu_unavailable_reason() {
        eprintln!("SKIPPED replay bench: no GPU: {why}");
        if std::env::var("BOUNDPOOL_REQUIRE_GPU").is_ok_and(|v| v == "1") {
            std::process::exit(1);
        }
        return;
    }
    let json = a.json;
    let cfg = config(&a);
    // `--variants`: the graph-variants experiment instead (no pool; `--runs` timed launches of
    // each variant per round, interleaved).
    if a.variants {
        let runs = a.runs.max(1);
        match bench_variants(&cfg.shapes, cfg.rounds, runs, |done, total| {
            if !json {
                eprint!("\rreplay bench --variants: {done}/{total} rounds");
            }
        }) {
            Ok((rows, notes)) => {
                if json {
                    let items: Vec<String> = rows.iter().map(|r| r.to_json()).collect();
                    println!("[{}]", items.join(","));
                } else {
                    eprintln!();
                    print!("{}", variants_table(&rows, &notes));
                }
            }
            Err(e) => {
                eprintln!("replay bench --variants failed: {e}");
                std::process::exit(1);
            }
        }
        return;
    }
    match bench_replay(&cfg, |done, total| {
        if !json {
            eprint!("\rreplay bench: {done}/{total} rounds");
        }
    }) {
        Ok((rows, upd)) => {
            if json {
                let mut items: Vec<String> = rows.iter().map(|r| r.to_json()).collect();
                items.push(upd.to_json());
                println!("[{}]", items.join(","));
            } else {
                eprintln!();
                print!("{}", replay_table(&rows, &upd));
            }
        }
        Err(e) => {
            eprintln!("replay bench failed: {e}");
            std::process::exit(1);
        }
    }
}
