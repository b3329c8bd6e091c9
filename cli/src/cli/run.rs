//! `boundpool run`: one graph, run `--repeat` times on a fresh pool, verified every time.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use boundpool::bounded;
use boundpool::observe::{self, PrometheusHandle};
use boundpool::{default_workers, PoolBuilder};
use boundpool_bench::workloads::{median, Dag, Shape};
use serde_json::json;

use super::graph_file;
use super::progress::{block_on_with, Progress};
use super::verify::{build_graph, Check};
use crate::{RunArgs, ShapeArg};

/// Why `run` stopped: bad input (exit 2, nothing ran) or a failed run (exit 1).
enum Fail {
    Input(String),
    Run(String),
}

pub(crate) fn main(a: RunArgs) -> ExitCode {
    #[cfg(feature = "mpi")]
    if let (true, Some(path)) = (a.ranks, &a.graph) {
        return super::ranks_run::run(path, a.threads.unwrap_or(2), a.repeat, a.quiet);
    }
    if a.gpu {
        return super::gpu_replay::run_main(&a, shape_of(a.shape.unwrap_or(ShapeArg::Wavefront)));
    }
    match run(a) {
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

fn shape_of(s: ShapeArg) -> Shape {
    match s {
        ShapeArg::Chain => Shape::Chain,
        ShapeArg::Tree => Shape::Tree,
        ShapeArg::Wide => Shape::Wide,
        ShapeArg::Wavefront => Shape::Wavefront,
        ShapeArg::Random => Shape::Random,
    }
}

fn write(path: &std::path::Path, what: &str, text: &str) -> Result<(), Fail> {
    std::fs::write(path, text)
        .map_err(|e| Fail::Run(format!("cannot write {what} to {}: {e}", path.display())))
}

fn run(a: RunArgs) -> Result<ExitCode, Fail> {
    let note = |m: String| {
        if !a.quiet {
            eprintln!("{m}");
        }
    };
    if a.repeat == 0 {
        return Err(Fail::Input("--repeat must be at least 1".into()));
    }
    let threads = a.threads.unwrap_or_else(default_workers);

    // The graph: described, checked and validated before any thread starts.
    let (name, shape, dag) = match &a.graph {
        Some(path) => {
            let (name, dag) = graph_file::load(path).map_err(Fail::Input)?;
            (name, None, dag)
        }
        None => {
            let shape = shape_of(a.shape.unwrap_or(ShapeArg::Wavefront));
            // A size that rounds to no nodes gives an empty graph, which runs (and completes at once).
            let mut dag = Dag::shape(shape, a.size);
            dag.work_ns.iter_mut().for_each(|w| *w = a.work_ns);
            (shape.name().to_string(), Some(shape), dag)
        }
    };
    let n = dag.len();
    let check = Arc::new(Check::new(n));
    let t_build = Instant::now();
    // The scheduler's message names nodes of a cycle; clipped here too, so that no graph makes
    // this line long.
    let graph = build_graph(&dag, &name, &check).map_err(|e| match &a.graph {
        Some(path) => Fail::Input(format!(
            "bad graph file {}: {}",
            path.display(),
            bounded::clip_message(e.to_string())
        )),
        None => Fail::Input(bounded::clip_message(e.to_string())),
    })?;
    let per = |d: Duration| (n > 0).then(|| d.as_nanos() as f64 / n as f64);
    let build_ns_per_node = per(t_build.elapsed());
    if let Some(path) = &a.dot {
        write(path, "the DOT graph", &graph.to_dot_with(|_| "host".into()))?;
        note(format!("wrote the graph in DOT to {}", path.display()));
    }

    // Observability, then the pool.
    let prom: Option<PrometheusHandle> = match (&a.prometheus, &a.metrics_out) {
        (Some(addr), _) => {
            let h = observe::install_prometheus(*addr).map_err(|e| Fail::Input(e.to_string()))?;
            note(format!(
                "serving Prometheus metrics at http://{addr}/metrics"
            ));
            Some(h)
        }
        (None, Some(_)) => {
            Some(observe::install_prometheus_recorder().map_err(|e| Fail::Run(e.to_string()))?)
        }
        (None, None) => None,
    };
    let pool = PoolBuilder::new()
        .name("boundpool")
        .workers(threads)
        .trace(a.trace.is_some())
        // The command writes the whole recording, not a window of it: room for every node of
        // every run (and a park after each) on any one worker. Slots are touched only as used.
        .trace_window((2 * n * a.repeat).max(1 << 20))
        .build()
        .map_err(|e| Fail::Input(e.to_string()))?;
    let mut peak = super::observe::os_threads();
    let steals_before = pool.stats().steals();

    let mut progress = Progress::new(
        (n * a.repeat) as u64,
        &format!("{}: {n} nodes x {}", bounded::name(&name), a.repeat),
        a.quiet,
    );
    let mut per_node = Vec::with_capacity(a.repeat);
    // The check after each run (and its reset before the next) is timed apart from the run.
    let mut verify_per_node = Vec::with_capacity(a.repeat);
    let mut windows = Vec::with_capacity(a.repeat);
    let mut failure: Option<String> = None;
    for r in 0..a.repeat {
        let mut t_verify = Duration::ZERO;
        if r > 0 {
            let t = Instant::now();
            check.reset();
            t_verify += t.elapsed();
        }
        let t0 = Instant::now();
        let handle = pool.submit(&graph).map_err(|e| Fail::Run(e.to_string()))?;
        let res = if progress.enabled() {
            block_on_with(handle, || {
                progress.set((r * n) as u64 + check.finished_approx())
            })
        } else {
            handle.wait()
        };
        let dt = t0.elapsed();
        windows.push((t0, t0 + dt));
        res.map_err(|e| Fail::Run(bounded::clip_message(format!("run {} failed: {e}", r + 1))))?;
        if let Some(x) = per(dt) {
            per_node.push(x);
        }
        let t = Instant::now();
        if failure.is_none() {
            if let Err(e) = check.verify(&dag) {
                failure = Some(format!("run {}: {e}", r + 1));
            }
        }
        t_verify += t.elapsed();
        if let Some(x) = per(t_verify) {
            verify_per_node.push(x);
        }
        progress.set(((r + 1) * n) as u64);
    }
    progress.finish();
    let stats = pool.stats();
    let steals = stats.steals() - steals_before;
    let inner = check
        .peak_threads
        .load(std::sync::atomic::Ordering::Relaxed);
    peak = [
        peak,
        (inner > 0).then_some(inner),
        super::observe::os_threads(),
    ]
    .into_iter()
    .flatten()
    .max();
    let cores: Vec<Option<usize>> = pool.workers().iter().map(|w| w.core).collect();

    if let Some(path) = &a.trace {
        let trace = pool.take_trace();
        let epoch = trace.epoch;
        let rel = |t: Instant| t.saturating_duration_since(epoch).as_nanos() as u64;
        let wins: Vec<(u64, u64)> = windows.iter().map(|&(s, e)| (rel(s), rel(e))).collect();
        let v = observe::chrome_trace(&trace, |s, args| {
            if let Some(k) = wins
                .iter()
                .position(|&(s0, s1)| s.start_ns >= s0 && s.start_ns <= s1)
            {
                args.insert("run".into(), json!(k + 1));
            }
        });
        let text = serde_json::to_string(&v).map_err(|e| Fail::Run(e.to_string()))?;
        write(path, "the trace", &text)?;
        note(format!(
            "wrote a Chrome trace of {} slices to {} (open it in https://ui.perfetto.dev)",
            trace.slices.len(),
            path.display()
        ));
    }
    // Dropping the pool joins the workers, which flush their counters to the recorder.
    drop(pool);
    if let (Some(path), Some(h)) = (&a.metrics_out, &prom) {
        write(path, "the metrics", &h.render())?;
        note(format!(
            "wrote the Prometheus exposition text to {}",
            path.display()
        ));
    }

    // No per-node figure for a graph of no nodes (null in JSON, "-" in the table).
    let ns_per_node = (!per_node.is_empty()).then(|| median(&mut per_node.clone()));
    // The runs after the first: the first is the pool's and the graph's first (cold caches,
    // the dependency counters allocated and zeroed), later ones count on in warm counters.
    let warm_ns_per_node = (per_node.len() > 1).then(|| median(&mut per_node[1..].to_vec()));
    let verify_ns_per_node =
        (!verify_per_node.is_empty()).then(|| median(&mut verify_per_node.clone()));
    let verified = failure.is_none();
    if a.json {
        let v = json!({
            "graph": name,
            "shape": shape.map(|s| s.name()),
            "file": a.graph.as_ref().map(|p| p.display().to_string()),
            "nodes": n,
            "edges": dag.edges.len(),
            "threads": threads,
            "repeat": a.repeat,
            "ns_per_node": ns_per_node,
            "runs_ns_per_node": per_node,
            "warm_ns_per_node": warm_ns_per_node,
            "verify_ns_per_node": verify_ns_per_node,
            "build_ns_per_node": build_ns_per_node,
            "peak_os_threads": peak,
            "steals": steals,
            "nodes_run": stats.nodes_run(),
            "parks": stats.parks(),
            "verified": verified,
            "verify_error": failure,
        });
        println!("{v}");
    } else {
        let what = match (shape, &a.graph) {
            (Some(Shape::Wavefront), _) => format!("wavefront {0}x{0}", (n as f64).sqrt() as usize),
            (Some(s), _) => s.name().to_string(),
            (None, Some(p)) => format!("{} (from {})", bounded::name(&name), p.display()),
            (None, None) => bounded::name(&name),
        };
        // Lists are bounded (the first ten, then how many more): 1,000 workers or runs make
        // one short line each.
        let cores = bounded::list(
            cores
                .iter()
                .map(|c| c.map_or("-".into(), |c| c.to_string())),
            ", ",
        );
        let runs = bounded::list(per_node.iter().map(|x| format!("{x:.1}")), " ");
        println!("graph            {what}");
        println!("nodes            {n} ({} edges)", dag.edges.len());
        println!("threads          {threads} workers (cores {cores})");
        match (ns_per_node, build_ns_per_node) {
            (Some(ns), Some(build)) => {
                if a.repeat == 1 {
                    println!("ns per node      {ns:.1} (1 run, the graph's first: cold)");
                } else {
                    println!(
                        "ns per node      {ns:.1} (median of {} run(s): {runs})",
                        a.repeat
                    );
                }
                println!(
                    "                 a run is timed from submit to wait; every node body also \
                     records for the check (2 increments of one shared atomic)"
                );
                match warm_ns_per_node {
                    Some(w) if a.repeat == 2 => {
                        println!("warm runs        {w:.1} ns per node (run 2; run 1 is cold)")
                    }
                    Some(w) => println!(
                        "warm runs        {w:.1} ns per node (median of runs 2-{}; run 1 is cold)",
                        a.repeat
                    ),
                    None => println!("warm runs        - (--repeat 2 or more gives them)"),
                }
                if let Some(v) = verify_ns_per_node {
                    println!(
                        "verify           {v:.1} ns per node (after each run; not in its time)"
                    );
                }
                println!("build            {build:.1} ns per node");
            }
            _ => {
                println!("ns per node      - (no nodes; {} run(s))", a.repeat);
                println!("build            - (no nodes)");
            }
        }
        match peak {
            Some(p) => println!("peak OS threads  {p}"),
            None => println!("peak OS threads  unknown (no /proc/self/task)"),
        }
        println!("steals           {steals}");
        match &failure {
            None => println!(
                "verified         yes: every node ran exactly once, after all its predecessors"
            ),
            Some(e) => println!("verified         NO: {e}"),
        }
    }
    if let (Some(addr), true) = (&a.prometheus, a.linger > 0.0) {
        note(format!(
            "still serving http://{addr}/metrics for {} s",
            a.linger
        ));
        std::thread::sleep(Duration::from_secs_f64(a.linger));
    }
    Ok(if verified {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
