//! The summary of a host run: one JSON object with `--json`, else one line per figure.

use std::time::{Duration, Instant};

use boundpool::{bounded, PoolStats};
use boundpool_workloads::{median, Shape};
use serde_json::json;

use super::graph::Described;
use super::RunArgs;

/// What the runs measured.
pub(super) struct Runs {
    /// Each run's time per node, ns (none for a graph of no nodes).
    pub(super) per_node: Vec<f64>,
    /// Each run's check (and the reset before it) per node, ns.
    pub(super) verify_per_node: Vec<f64>,
    /// Each run's start and end.
    pub(super) windows: Vec<(Instant, Instant)>,
    /// The first violation the check found.
    pub(super) failure: Option<String>,
    /// Nodes taken from another worker's deque during the runs.
    pub(super) steals: u64,
}

/// Every figure the summary prints.
pub(super) struct Summary {
    nodes: usize,
    edges: usize,
    threads: usize,
    /// Each worker's core.
    cores: Vec<Option<usize>>,
    /// Each run's ns per node.
    runs: Vec<f64>,
    /// The figure `run` gives: the warm one, else (one run) the cold one. None for a graph of
    /// no nodes: null in JSON, "-" in the table.
    ns_per_node: Option<f64>,
    /// The first run's: the pool's and the graph's first (cold caches, the dependency counters
    /// allocated and zeroed).
    cold_ns_per_node: Option<f64>,
    /// The median of the runs after the first, which count on in warm counters.
    warm_ns_per_node: Option<f64>,
    verify_ns_per_node: Option<f64>,
    build_ns_per_node: Option<f64>,
    peak_os_threads: Option<usize>,
    steals: u64,
    nodes_run: u64,
    parks: u64,
    failure: Option<String>,
}

impl Summary {
    pub(super) fn new(
        d: &Described,
        threads: usize,
        cores: Vec<Option<usize>>,
        build: Duration,
        runs: &Runs,
        peak_os_threads: Option<usize>,
        stats: &PoolStats,
    ) -> Self {
        let nodes = d.dag.len();
        let some = |v: &[f64]| (!v.is_empty()).then(|| median(v));
        let cold = runs.per_node.first().copied();
        let warm = runs.per_node.get(1..).and_then(some);
        Summary {
            nodes,
            edges: d.dag.edges.len(),
            threads,
            cores,
            runs: runs.per_node.clone(),
            ns_per_node: warm.or(cold),
            cold_ns_per_node: cold,
            warm_ns_per_node: warm,
            verify_ns_per_node: some(&runs.verify_per_node),
            build_ns_per_node: (nodes > 0).then(|| build.as_nanos() as f64 / nodes as f64),
            peak_os_threads,
            steals: runs.steals,
            nodes_run: stats.nodes_run(),
            parks: stats.parks(),
            failure: runs.failure.clone(),
        }
    }
}

/// Prints `s` as `a` asks (`--json` or the table).
pub(super) fn print(a: &RunArgs, d: &Described, s: &Summary) {
    if a.json {
        print_json(a, d, s);
    } else {
        print_table(a, d, s);
    }
}

fn print_json(a: &RunArgs, d: &Described, s: &Summary) {
    let v = json!({
        "graph": d.name,
        "shape": d.shape.map(|s| s.name()),
        "file": a.graph.as_ref().map(|p| p.display().to_string()),
        "nodes": s.nodes,
        "edges": s.edges,
        "threads": s.threads,
        "repeat": a.repeat,
        "ns_per_node": s.ns_per_node,
        "cold_ns_per_node": s.cold_ns_per_node,
        "warm_ns_per_node": s.warm_ns_per_node,
        "runs_ns_per_node": s.runs,
        "verify_ns_per_node": s.verify_ns_per_node,
        "build_ns_per_node": s.build_ns_per_node,
        "peak_os_threads": s.peak_os_threads,
        "steals": s.steals,
        "nodes_run": s.nodes_run,
        "parks": s.parks,
        "verified": s.failure.is_none(),
        "verify_error": s.failure,
    });
    println!("{v}");
}

fn print_table(a: &RunArgs, d: &Described, s: &Summary) {
    let what = match (d.shape, &a.graph) {
        (Some(Shape::Wavefront), _) => {
            format!("wavefront {0}x{0}", (s.nodes as f64).sqrt() as usize)
        }
        (Some(shape), _) => shape.name().to_string(),
        (None, Some(p)) => format!("{} (from {})", bounded::name(&d.name), p.display()),
        (None, None) => bounded::name(&d.name),
    };
    // Lists are bounded (the first ten, then how many more): 1,000 workers or runs make one
    // short line each.
    let cores = bounded::list(
        s.cores
            .iter()
            .map(|c| c.map_or("-".into(), |c| c.to_string())),
        ", ",
    );
    println!("graph            {what}");
    println!("nodes            {} ({} edges)", s.nodes, s.edges);
    println!("threads          {} workers (cores {cores})", s.threads);
    print_times(a, s);
    match s.peak_os_threads {
        Some(p) => println!("peak OS threads  {p}"),
        None => println!("peak OS threads  unknown (no /proc/self/task)"),
    }
    println!("steals           {}", s.steals);
    match &s.failure {
        None => println!(
            "verified         yes: every node ran exactly once, after all its predecessors"
        ),
        Some(e) => println!("verified         NO: {e}"),
    }
}

/// The lines of per-node times: the warm and cold figures, every run's, the check's, the
/// build's.
fn print_times(a: &RunArgs, s: &Summary) {
    let (Some(cold), Some(build)) = (s.cold_ns_per_node, s.build_ns_per_node) else {
        println!("ns per node      - (no nodes; {} run(s))", a.repeat);
        println!("build            - (no nodes)");
        return;
    };
    let runs = bounded::list(s.runs.iter().map(|x| format!("{x:.1}")), " ");
    match s.warm_ns_per_node {
        Some(warm) => {
            let which = match a.repeat {
                2 => "run 2".to_string(),
                r => format!("median of runs 2-{r}"),
            };
            println!(
                "ns per node      {warm:.1} warm ({which}); cold {cold:.1} (run 1, the graph's first)"
            );
        }
        None => println!(
            "ns per node      {cold:.1} cold (1 run, the graph's first; --repeat 2 or more gives the warm figure)"
        ),
    }
    println!("runs             {runs} (ns per node, each timed from submit to wait returning)");
    println!(
        "                 every node body also records for the check (2 increments of one \
         shared atomic)"
    );
    if let Some(v) = s.verify_ns_per_node {
        println!("verify           {v:.1} ns per node (after each run; not in its time)");
    }
    println!("build            {build:.1} ns per node");
}
