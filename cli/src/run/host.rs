//! A host run: the Prometheus recorder and the pool `run` asks for, the runs (each timed from
//! submit to wait returning, then verified apart from its time), then the trace and the
//! metrics written and the summary printed.

use std::path::Path;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use boundpool::observe::{self, PrometheusHandle};
use boundpool::{bounded, default_workers, Graph, Pool, PoolBuilder};
use serde_json::json;

use super::graph::{self, Described};
use super::summary::{self, Runs, Summary};
use super::verify::Check;
use super::{Fail, RunArgs};
use crate::process::os_threads;
use crate::progress::{block_on_with, Progress};

pub(super) fn main(a: &RunArgs) -> Result<ExitCode, Fail> {
    if a.repeat == 0 {
        return Err(Fail::Input("--repeat must be at least 1".into()));
    }
    let threads = a.threads.unwrap_or_else(default_workers);
    // The graph: described, checked and validated before any thread starts.
    let d = graph::describe(a)?;
    let n = d.dag.len();
    let check = Arc::new(Check::new(n));
    let t_build = Instant::now();
    let graph = graph::build(&d, a, &check)?;
    let build = t_build.elapsed();
    if let Some(path) = &a.dot {
        write(path, "the DOT graph", &graph.to_dot_with(|_| "host".into()))?;
        note(a, format!("wrote the graph in DOT to {}", path.display()));
    }
    let prom = recorder(a)?;
    let pool = PoolBuilder::new()
        .name("boundpool")
        .workers(threads)
        .trace(a.trace.is_some())
        // The command writes the whole recording, not a window of it: room for every node of
        // every run (and a park after each) on any one worker. Slots are touched only as used.
        .trace_window((2 * n * a.repeat).max(1 << 20))
        .build()
        .map_err(|e| Fail::Input(e.to_string()))?;
    let first_peak = os_threads();
    let runs = run_all(a, &pool, &graph, &check, &d)?;
    let inner = check.peak_threads.load(Ordering::Relaxed);
    let peak = [first_peak, (inner > 0).then_some(inner), os_threads()]
        .into_iter()
        .flatten()
        .max();
    if let Some(path) = &a.trace {
        write_trace(a, path, &pool, &runs.windows)?;
    }
    let stats = pool.stats();
    let cores: Vec<Option<usize>> = pool.workers().iter().map(|w| w.core).collect();
    // Dropping the pool joins the workers, which flush their counters to the recorder.
    drop(pool);
    if let (Some(path), Some(h)) = (&a.metrics_out, &prom) {
        write(path, "the metrics", &h.render())?;
        note(
            a,
            format!("wrote the Prometheus exposition text to {}", path.display()),
        );
    }
    let verified = runs.failure.is_none();
    let s = Summary::new(&d, threads, cores, build, &runs, peak, &stats);
    summary::print(a, &d, &s);
    if let (Some(addr), true) = (&a.prometheus, a.linger > 0.0) {
        note(
            a,
            format!("still serving http://{addr}/metrics for {} s", a.linger),
        );
        std::thread::sleep(Duration::from_secs_f64(a.linger));
    }
    Ok(if verified {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// A note on stderr, unless `--quiet`.
fn note(a: &RunArgs, m: String) {
    if !a.quiet {
        eprintln!("{m}");
    }
}

fn write(path: &Path, what: &str, text: &str) -> Result<(), Fail> {
    std::fs::write(path, text)
        .map_err(|e| Fail::Run(format!("cannot write {what} to {}: {e}", path.display())))
}

/// The Prometheus recorder `--prometheus` (with its listener) or `--metrics-out` (without)
/// asks for, installed before the pool is built.
fn recorder(a: &RunArgs) -> Result<Option<PrometheusHandle>, Fail> {
    Ok(match (&a.prometheus, &a.metrics_out) {
        (Some(addr), _) => {
            let h = observe::install_prometheus(*addr).map_err(|e| Fail::Input(e.to_string()))?;
            note(
                a,
                format!("serving Prometheus metrics at http://{addr}/metrics"),
            );
            Some(h)
        }
        (None, Some(_)) => {
            Some(observe::install_prometheus_recorder().map_err(|e| Fail::Run(e.to_string()))?)
        }
        (None, None) => None,
    })
}

/// Runs `graph` `--repeat` times, each timed from submit to wait returning, then checked (the
/// check and its reset timed apart). A failed run ends the command; a violation is kept.
fn run_all(
    a: &RunArgs,
    pool: &Pool,
    graph: &Graph,
    check: &Check,
    d: &Described,
) -> Result<Runs, Fail> {
    let n = d.dag.len();
    let per = |t: Duration| (n > 0).then(|| t.as_nanos() as f64 / n as f64);
    let steals_before = pool.stats().steals();
    let mut progress = Progress::new(
        (n * a.repeat) as u64,
        &format!("{}: {n} nodes x {}", bounded::name(&d.name), a.repeat),
        a.quiet,
    );
    let mut runs = Runs {
        per_node: Vec::with_capacity(a.repeat),
        verify_per_node: Vec::with_capacity(a.repeat),
        windows: Vec::with_capacity(a.repeat),
        failure: None,
        steals: 0,
    };
    for r in 0..a.repeat {
        let mut t_verify = Duration::ZERO;
        if r > 0 {
            let t = Instant::now();
            check.reset();
            t_verify += t.elapsed();
        }
        let t0 = Instant::now();
        let handle = pool.submit(graph).map_err(|e| Fail::Run(e.to_string()))?;
        let res = if progress.enabled() {
            block_on_with(handle, || {
                progress.set((r * n) as u64 + check.finished_approx())
            })
        } else {
            handle.wait()
        };
        let dt = t0.elapsed();
        runs.windows.push((t0, t0 + dt));
        res.map_err(|e| Fail::Run(bounded::clip_message(format!("run {} failed: {e}", r + 1))))?;
        runs.per_node.extend(per(dt));
        let t = Instant::now();
        if runs.failure.is_none() {
            if let Err(e) = check.verify(&d.dag) {
                runs.failure = Some(format!("run {}: {e}", r + 1));
            }
        }
        t_verify += t.elapsed();
        runs.verify_per_node.extend(per(t_verify));
        progress.set(((r + 1) * n) as u64);
    }
    progress.finish();
    runs.steals = pool.stats().steals() - steals_before;
    Ok(runs)
}

/// Writes the pool's recording as a Chrome trace, each node slice marked with its run.
fn write_trace(
    a: &RunArgs,
    path: &Path,
    pool: &Pool,
    windows: &[(Instant, Instant)],
) -> Result<(), Fail> {
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
    note(
        a,
        format!(
            "wrote a Chrome trace of {} slices to {} (open it in https://ui.perfetto.dev)",
            trace.slices.len(),
            path.display()
        ),
    );
    Ok(())
}
