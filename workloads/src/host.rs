//! The host bench: the standard shapes on boundpool and on the schedulers a user would
//! otherwise pick, in one process: rayon-core with every ready successor spawned
//! ([`rayon_spawn`]) or the last one run inline ([`rayon_inline`]), and an OS thread per node
//! ([`thread_per_node`]), each node's body called through a `dyn Fn` as boundpool calls it.
//! `boundpool bench` (and `--scaling`) and the scheduler bench run these, so every figure
//! compares like with like.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use boundpool_scheduler::{Graph, GraphBuilder, Pool};

use crate::shapes::{empty_graph, Adjacency, Dag, Shape};
use crate::stats::median;

/// Runs `dag` on `pool` with empty bodies (plus busy work) and returns the elapsed time.
pub fn run_boundpool(pool: &Pool, graph: &Graph) -> Duration {
    let t0 = Instant::now();
    pool.submit(graph)
        .and_then(|h| h.wait())
        .expect("the benchmark graph runs");
    t0.elapsed()
}

/// Baseline (a): rayon-core, every ready successor spawned on the scope.
pub fn rayon_spawn(pool: &rayon_core::ThreadPool, adj: &Adjacency) -> Duration {
    let t0 = Instant::now();
    let pending = adj.counters();
    pool.scope(|s| {
        for src in adj.sources() {
            spawn_node(s, adj, &pending, src);
        }
    });
    t0.elapsed()
}

fn spawn_node<'s>(s: &rayon_core::Scope<'s>, adj: &'s Adjacency, pending: &'s [AtomicU32], i: u32) {
    s.spawn(move |s| {
        adj.run_body(i);
        for &j in adj.successors(i) {
            if pending[j as usize].fetch_sub(1, Ordering::AcqRel) == 1 {
                spawn_node(s, adj, pending, j);
            }
        }
    });
}

/// Baseline (b): rayon-core, the last ready successor run inline, the others spawned.
pub fn rayon_inline(pool: &rayon_core::ThreadPool, adj: &Adjacency) -> Duration {
    let t0 = Instant::now();
    let pending = adj.counters();
    pool.scope(|s| {
        for src in adj.sources() {
            let pending = &pending;
            s.spawn(move |s| inline_from(s, adj, pending, src));
        }
    });
    t0.elapsed()
}

fn inline_from<'s>(
    s: &rayon_core::Scope<'s>,
    adj: &'s Adjacency,
    pending: &'s [AtomicU32],
    mut i: u32,
) {
    loop {
        adj.run_body(i);
        let mut next = None;
        for &j in adj.successors(i) {
            if pending[j as usize].fetch_sub(1, Ordering::AcqRel) == 1 {
                if let Some(prev) = next.replace(j) {
                    s.spawn(move |s| inline_from(s, adj, pending, prev));
                }
            }
        }
        match next {
            Some(j) => i = j,
            None => return,
        }
    }
}

/// Baseline: one OS thread per node (spawned when the node is ready, joined at the end).
/// Only sensible for small graphs; the benches use it for the wide shape at 20,000 nodes.
pub fn thread_per_node(adj: &Adjacency) -> Duration {
    let t0 = Instant::now();
    let pending = adj.counters();
    std::thread::scope(|s| {
        fn go<'s, 'e>(
            s: &'s std::thread::Scope<'s, 'e>,
            adj: &'e Adjacency,
            pending: &'e [AtomicU32],
            i: u32,
        ) {
            s.spawn(move || {
                adj.run_body(i);
                for &j in adj.successors(i) {
                    if pending[j as usize].fetch_sub(1, Ordering::AcqRel) == 1 {
                        go(s, adj, pending, j);
                    }
                }
            });
        }
        for src in adj.sources() {
            go(s, adj, &pending, src);
        }
    });
    t0.elapsed()
}

/// One row of the shape benchmark: an implementation's median ns per node on a shape.
#[derive(Clone, Debug, serde::Serialize)]
pub struct BenchRow {
    /// Shape name.
    pub shape: &'static str,
    /// `boundpool`, `rayon-spawn`, `rayon-inline` or `thread-per-node`.
    #[serde(rename = "impl")]
    pub implementation: &'static str,
    /// Nodes in the graph.
    pub nodes: usize,
    /// Worker threads.
    pub threads: usize,
    /// Median execution time per node over the runs, in nanoseconds.
    pub ns_per_node: f64,
    /// Every run's ns per node.
    pub runs: Vec<f64>,
    /// `ns_per_node` divided by the better rayon-core variant's (boundpool rows only; lower is better).
    pub vs_best_rayon: Option<f64>,
}

/// Settings of [`bench_shapes`].
#[derive(Clone, Debug)]
pub struct BenchConfig {
    /// Worker threads for boundpool and rayon.
    pub threads: usize,
    /// Runs per implementation and shape (the median is reported).
    pub runs: usize,
    /// Scale factor on the standard sizes (1.0: chain 1,000,000, tree depth 20, wide 1,000,000,
    /// wavefront 1000x1000).
    pub scale: f64,
    /// Nodes of the wide shape for the thread-per-node baseline (0: skip it).
    pub thread_per_node_nodes: usize,
}

impl Default for BenchConfig {
    fn default() -> Self {
        BenchConfig {
            threads: 2,
            runs: 7,
            scale: 1.0,
            thread_per_node_nodes: 20_000,
        }
    }
}

/// The standard benchmark shapes and sizes at `scale`.
pub fn standard_shapes(scale: f64) -> Vec<(Shape, usize)> {
    let s = |n: f64| ((n * scale) as usize).max(4);
    vec![
        (Shape::Chain, s(1_000_000.0)),
        (Shape::Tree, s((1u64 << 20) as f64 - 1.0)),
        (Shape::Wide, s(1_000_002.0)),
        (Shape::Wavefront, s(1_000_000.0)),
    ]
}

/// Evicts the caches (writes and reads a buffer larger than any last-level cache these
/// machines have), so that a timed run does not find the data of the run before it in cache:
/// the two rayon-core variants share one DAG, and whichever ran second would otherwise start
/// warm while boundpool starts cold.
pub fn evict_caches(buf: &mut [u64]) -> u64 {
    let mut sum = 0u64;
    for (i, x) in buf.iter_mut().enumerate() {
        *x = x.wrapping_add(i as u64);
        sum = sum.wrapping_add(*x);
    }
    std::hint::black_box(sum)
}

/// Bytes written by [`evict_caches`] before each timed run of [`bench_shapes`].
pub const EVICT_BYTES: usize = 128 << 20;

/// Runs the standard shapes on boundpool and the rayon-core baselines in this process,
/// interleaving the implementations run by run so machine noise hits them alike, and evicting
/// the caches before each timed run ([`evict_caches`]) so none inherits another's warm data.
/// `progress` is called after each run with (done, total).
pub fn bench_shapes(cfg: &BenchConfig, mut progress: impl FnMut(usize, usize)) -> Vec<BenchRow> {
    let pool = boundpool_scheduler::PoolBuilder::new()
        .name("bench")
        .workers(cfg.threads)
        .build()
        .expect("the bench pool starts");
    let rayon = rayon_core::ThreadPoolBuilder::new()
        .num_threads(cfg.threads)
        .build()
        .expect("rayon starts");
    let shapes = standard_shapes(cfg.scale);
    let total = shapes.len() * cfg.runs * 3 + usize::from(cfg.thread_per_node_nodes > 0) * cfg.runs;
    let mut evict = vec![0u64; EVICT_BYTES / 8];
    let mut done = 0;
    let mut rows = Vec::new();
    for (shape, n) in shapes {
        let dag = Dag::shape(shape, n);
        let adj = dag.adjacency();
        let graph = empty_graph(shape, n);
        let nodes = dag.len() as f64;
        let (mut bp, mut rs, mut ri) = (Vec::new(), Vec::new(), Vec::new());
        // One warm-up each.
        run_boundpool(&pool, &graph);
        rayon_spawn(&rayon, &adj);
        rayon_inline(&rayon, &adj);
        for _ in 0..cfg.runs {
            evict_caches(&mut evict);
            bp.push(run_boundpool(&pool, &graph).as_nanos() as f64 / nodes);
            evict_caches(&mut evict);
            rs.push(rayon_spawn(&rayon, &adj).as_nanos() as f64 / nodes);
            evict_caches(&mut evict);
            ri.push(rayon_inline(&rayon, &adj).as_nanos() as f64 / nodes);
            done += 3;
            progress(done, total);
        }
        let (mbp, mrs, mri) = (median(&bp), median(&rs), median(&ri));
        let row = |implementation, ns_per_node, runs, vs| BenchRow {
            shape: shape.name(),
            implementation,
            nodes: dag.len(),
            threads: cfg.threads,
            ns_per_node,
            runs,
            vs_best_rayon: vs,
        };
        rows.push(row("boundpool", mbp, bp, Some(mbp / mrs.min(mri))));
        rows.push(row("rayon-spawn", mrs, rs, None));
        rows.push(row("rayon-inline", mri, ri, None));
    }
    if cfg.thread_per_node_nodes > 0 {
        let n = cfg.thread_per_node_nodes;
        let dag = Dag::shape(Shape::Wide, n);
        let adj = dag.adjacency();
        let graph = empty_graph(Shape::Wide, n);
        let (mut tp, mut bp) = (Vec::new(), Vec::new());
        for _ in 0..cfg.runs {
            tp.push(thread_per_node(&adj).as_nanos() as f64 / n as f64);
            bp.push(run_boundpool(&pool, &graph).as_nanos() as f64 / n as f64);
            done += 1;
            progress(done, total);
        }
        let (mtp, mbp) = (median(&tp), median(&bp));
        rows.push(BenchRow {
            shape: "wide",
            implementation: "thread-per-node",
            nodes: n,
            threads: cfg.threads,
            ns_per_node: mtp,
            runs: tp,
            vs_best_rayon: None,
        });
        rows.push(BenchRow {
            shape: "wide",
            implementation: "boundpool",
            nodes: n,
            threads: cfg.threads,
            ns_per_node: mbp,
            runs: bp,
            vs_best_rayon: None,
        });
    }
    rows
}

/// Times building each standard shape's graph (nodes, edges, validation), median ns per node.
pub fn bench_build(scale: f64, runs: usize) -> Vec<(&'static str, usize, f64)> {
    standard_shapes(scale)
        .into_iter()
        .map(|(shape, n)| {
            let dag = Dag::shape(shape, n);
            let xs: Vec<f64> = (0..runs)
                .map(|_| {
                    let t0 = Instant::now();
                    let mut g =
                        GraphBuilder::<()>::with_capacity(shape.name(), dag.len(), dag.edges.len());
                    let ids: Vec<_> = (0..dag.len()).map(|_| g.node("n", |_| Ok(()))).collect();
                    for &(f, t) in &dag.edges {
                        g.edge(ids[f as usize], ids[t as usize]);
                    }
                    let graph = g.build().expect("acyclic");
                    let dt = t0.elapsed().as_nanos() as f64 / dag.len() as f64;
                    drop(graph);
                    dt
                })
                .collect();
            (shape.name(), dag.len(), median(&xs))
        })
        .collect()
}

/// The worker counts of the scaling bench up to `max`: 1, 2, 4, 8, 16, ..., and `max` itself
/// when it is not a power of two.
pub fn scaling_workers(max: usize) -> Vec<usize> {
    let max = max.max(1);
    let mut ws: Vec<usize> = std::iter::successors(Some(1usize), |w| w.checked_mul(2))
        .take_while(|&w| w <= max)
        .collect();
    if ws.last() != Some(&max) {
        ws.push(max);
    }
    ws
}

/// One row of the scaling bench: an implementation's median ns per node on a shape at one
/// worker count, and its speedup over its own one-worker figure.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ScalingRow {
    /// Shape name.
    pub shape: &'static str,
    /// `boundpool`, `rayon-spawn` or `rayon-inline`.
    #[serde(rename = "impl")]
    pub implementation: &'static str,
    /// Worker threads.
    pub workers: usize,
    /// Nodes in the graph.
    pub nodes: usize,
    /// Median wall time per node over the runs, in nanoseconds.
    pub ns_per_node: f64,
    /// Every run's ns per node.
    pub runs: Vec<f64>,
    /// This implementation's one-worker ns per node divided by this row's (higher is better).
    pub speedup: f64,
    /// `ns_per_node` divided by the better rayon-core variant's at the same worker count
    /// (boundpool rows only; lower is better).
    pub vs_best_rayon: Option<f64>,
}

/// Runs the standard shapes at each worker count of `workers` (see [`scaling_workers`]) on
/// boundpool and both rayon-core variants, interleaved run by run and with the caches evicted
/// before each timed run as in [`bench_shapes`]. A fresh pool of each kind is built per worker
/// count. `progress` is called after each run with (done, total).
pub fn bench_scaling(
    workers: &[usize],
    runs: usize,
    scale: f64,
    mut progress: impl FnMut(usize, usize),
) -> Vec<ScalingRow> {
    let shapes = standard_shapes(scale);
    let total = shapes.len() * workers.len() * runs * 3;
    let mut evict = vec![0u64; EVICT_BYTES / 8];
    let mut done = 0;
    let mut rows = Vec::new();
    for (shape, n) in shapes {
        let dag = Dag::shape(shape, n);
        let adj = dag.adjacency();
        let graph = empty_graph(shape, n);
        let nodes = dag.len() as f64;
        let first = rows.len();
        for &w in workers {
            let pool = boundpool_scheduler::PoolBuilder::new()
                .name("bench-scaling")
                .workers(w)
                .build()
                .expect("the bench pool starts");
            let rayon = rayon_core::ThreadPoolBuilder::new()
                .num_threads(w)
                .build()
                .expect("rayon starts");
            let (mut bp, mut rs, mut ri) = (Vec::new(), Vec::new(), Vec::new());
            run_boundpool(&pool, &graph);
            rayon_spawn(&rayon, &adj);
            rayon_inline(&rayon, &adj);
            for _ in 0..runs {
                evict_caches(&mut evict);
                bp.push(run_boundpool(&pool, &graph).as_nanos() as f64 / nodes);
                evict_caches(&mut evict);
                rs.push(rayon_spawn(&rayon, &adj).as_nanos() as f64 / nodes);
                evict_caches(&mut evict);
                ri.push(rayon_inline(&rayon, &adj).as_nanos() as f64 / nodes);
                done += 3;
                progress(done, total);
            }
            let (mbp, mrs, mri) = (median(&bp), median(&rs), median(&ri));
            for (implementation, ns, runs, vs) in [
                ("boundpool", mbp, bp, Some(mbp / mrs.min(mri))),
                ("rayon-spawn", mrs, rs, None),
                ("rayon-inline", mri, ri, None),
            ] {
                rows.push(ScalingRow {
                    shape: shape.name(),
                    implementation,
                    workers: w,
                    nodes: dag.len(),
                    ns_per_node: ns,
                    runs,
                    speedup: f64::NAN,
                    vs_best_rayon: vs,
                });
            }
        }
        // Speedups against each implementation's figure at the fewest workers measured.
        let tail = &mut rows[first..];
        let base: Vec<(&'static str, f64)> = tail
            .iter()
            .filter(|r| r.workers == workers[0])
            .map(|r| (r.implementation, r.ns_per_node))
            .collect();
        for r in tail.iter_mut() {
            if let Some(&(_, b)) = base.iter().find(|(i, _)| *i == r.implementation) {
                r.speedup = b / r.ns_per_node;
            }
        }
    }
    rows
}
