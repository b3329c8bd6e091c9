//! Scheduler benchmark: the standard shapes on boundpool against rayon-core in the same process.
//!
//! `cargo bench -p boundpool-bench --bench scheduler` (set `BOUNDPOOL_BENCH_SCALE=0.1` for a quick run). Prints each
//! implementation's median ns per node and boundpool's ratio to the better rayon-core variant.

use boundpool_workloads::{bench_build, bench_shapes, BenchConfig};

fn main() {
    let scale: f64 = std::env::var("BOUNDPOOL_BENCH_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.0);
    let runs: usize = std::env::var("BOUNDPOOL_BENCH_RUNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(7);
    let cfg = BenchConfig {
        threads: 2,
        runs,
        scale,
        thread_per_node_nodes: 20_000,
    };
    println!(
        "{:<10} {:<16} {:>9} {:>12} {:>14}",
        "shape", "impl", "nodes", "ns/node", "vs best rayon"
    );
    for r in bench_shapes(&cfg, |_, _| {}) {
        let vs = r
            .vs_best_rayon
            .map(|v| format!("{v:.2}x"))
            .unwrap_or_default();
        println!(
            "{:<10} {:<16} {:>9} {:>12.1} {:>14}",
            r.shape, r.implementation, r.nodes, r.ns_per_node, vs
        );
    }
    println!();
    println!("{:<10} {:>9} {:>16}", "build", "nodes", "ns/node (median)");
    for (shape, n, ns) in bench_build(scale, runs) {
        println!("{:<10} {:>9} {:>16.1}", shape, n, ns);
    }
}
