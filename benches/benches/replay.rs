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

fn arg(name: &str) -> Option<usize> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
}

fn main() {
    if let Some(why) = boundpool_gpu::gpu_unavailable_reason() {
        eprintln!("SKIPPED replay bench: no GPU: {why}");
        if std::env::var("BOUNDPOOL_REQUIRE_GPU").is_ok_and(|v| v == "1") {
            std::process::exit(1);
        }
        return;
    }
    let json = std::env::args().any(|a| a == "--json");
    let mut cfg = ReplayBenchConfig::default();
    if let Some(n) = arg("--rounds") {
        cfg.rounds = n.max(1);
    }
    if let Some(n) = arg("--per-round") {
        cfg.per_round = n.max(1);
    }
    if let Some(n) = arg("--workers") {
        cfg.workers = n.max(1);
    }
    if let Some(n) = arg("--nodes") {
        cfg.nodes = n.max(2);
        let side = (n as f64).sqrt().ceil() as usize;
        cfg.shapes = vec![
            (GpuShape::Independent, n),
            (GpuShape::Builtin(Shape::Chain), n),
            (GpuShape::Builtin(Shape::Wavefront), side * side),
        ];
    }
    // `--shapes chain,independent`: these shapes, in this order (the first is captured and
    // instantiated first in the process).
    if let Some(v) = std::env::args()
        .collect::<Vec<_>>()
        .iter()
        .position(|a| a == "--shapes")
        .and_then(|i| std::env::args().nth(i + 1))
    {
        let n = cfg.nodes;
        let side = (n as f64).sqrt().ceil() as usize;
        let mut shapes = Vec::new();
        for name in v.split(',').map(str::trim) {
            let shape = if name == "independent" {
                GpuShape::Independent
            } else if let Some(s) = Shape::parse(name) {
                GpuShape::Builtin(s)
            } else {
                eprintln!("replay bench: unknown shape '{name}' (independent, chain, tree, wide, wavefront)");
                std::process::exit(2);
            };
            let size = if shape == GpuShape::Builtin(Shape::Wavefront) {
                side * side
            } else {
                n
            };
            shapes.push((shape, size));
        }
        cfg.shapes = shapes;
    }
    // `--variants`: the graph-variants experiment instead (no pool; `--runs` timed launches of
    // each variant per round, interleaved).
    if std::env::args().any(|a| a == "--variants") {
        let runs = arg("--runs").unwrap_or(100).max(1);
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
    // `--widths 1,4`: more rows of the independent shape, replayed with `max_width(w)`.
    let args: Vec<String> = std::env::args().collect();
    if let Some(v) = args
        .iter()
        .position(|a| a == "--widths")
        .and_then(|i| args.get(i + 1))
    {
        cfg.widths = v.split(',').filter_map(|w| w.trim().parse().ok()).collect();
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
