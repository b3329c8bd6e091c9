//! Builds a wavefront-shaped graph repeatedly (for profiling the builder):
//! `build_profile [runs]`.
use boundpool_scheduler::GraphBuilder;
use std::time::Instant;

fn main() {
    let runs: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let side = 1000u32;
    let n = side * side;
    let mut edges = Vec::new();
    for i in 0..n {
        if i % side > 0 {
            edges.push((i - 1, i));
        }
        if i >= side {
            edges.push((i - side, i));
        }
    }
    let mut xs = Vec::new();
    for _ in 0..runs {
        let t0 = Instant::now();
        let mut g = GraphBuilder::<()>::with_capacity("wavefront", n as usize, edges.len());
        let ids: Vec<_> = (0..n).map(|_| g.node("n", |_| Ok(()))).collect();
        for &(f, t) in &edges {
            g.edge(ids[f as usize], ids[t as usize]);
        }
        let graph = g.build().expect("acyclic");
        xs.push(t0.elapsed().as_nanos() as f64 / n as f64);
        drop(graph);
    }
    println!(
        "build: {:.1} ns/node (median of {runs})",
        boundpool_workloads::median(&xs)
    );
}
