//! What observability costs: tracing off vs on, metrics export off vs on with no recorder, and
//! with a recorder installed.
//!
//! `cargo bench -p boundpool-bench --bench observe` (`BOUNDPOOL_BENCH_SCALE=0.2` for a quick run,
//! `BOUNDPOOL_BENCH_RUNS` for the runs per configuration, default 9).
//!
//! Every configuration is a pool of 2 workers running the same graphs of empty nodes (the
//! worst case: nothing to hide the bookkeeping behind); runs are interleaved configuration by
//! configuration so machine noise hits them alike, and each figure is the median ns per node.
//! Each configuration is also given in CPU ns per node (all threads of the process, from
//! `/proc/self/task/*/schedstat`), which other programs on a shared machine disturb far less
//! than wall time.
//! Tracing runs twice: with the default window (2^20 slices of 32 bytes per worker, so a run of
//! 500,000 nodes streams its records through memory) and with a window of 4,096 (the ring stays
//! in cache), which separates the recording itself from the memory traffic of a large window.
//! The baseline is `metrics(false)` + `trace(false)`: no export and no recording, the closest a
//! build gets to having both compiled out. A global recorder cannot be uninstalled, so the
//! configurations without a recorder run first, then a Prometheus recorder (no listener) is
//! installed and the baseline runs again beside the recorder configuration.

use boundpool::observe::install_prometheus_recorder;
use boundpool::{Graph, Pool, PoolBuilder};
use boundpool_workloads::{empty_graph, median, run_boundpool, Shape};

fn env<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

struct Config {
    label: &'static str,
    pool: Pool,
}

fn pool(label: &'static str, metrics: bool, trace: bool) -> Config {
    pool_with(label, PoolBuilder::new().metrics(metrics).trace(trace))
}

fn pool_with(label: &'static str, b: PoolBuilder) -> Config {
    let pool = b.name(label).workers(2).build().expect("the pool starts");
    Config { label, pool }
}

/// CPU time of every thread of this process so far, in ns (`/proc/self/task/*/schedstat`; `None`
/// off Linux). Unlike wall time it does not count the time other programs had the cores, so on
/// a shared machine it shows what the configuration itself costs.
fn process_cpu_ns() -> Option<u64> {
    let mut total = 0;
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let stat = std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok()?;
        total += stat.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(total)
}

/// Runs every configuration `runs` times on `graph`, interleaved; returns, per configuration,
/// the median wall ns per node and the median CPU ns per node (all threads of the process).
fn measure(configs: &[Config], graph: &Graph, runs: usize) -> Vec<(f64, f64)> {
    let n = graph.len() as f64;
    let mut samples = vec![Vec::new(); configs.len()];
    let mut cpu = vec![Vec::new(); configs.len()];
    for r in 0..runs {
        // Rotate the order each round, and let the previous pool's workers park first, so no
        // configuration always runs beside another's winding-down workers.
        for k in 0..configs.len() {
            let i = (r + k) % configs.len();
            let c = &configs[i];
            // An untimed run first: dropping the previous pool's drained trace hands memory back
            // to the allocator, and the run after that pays page faults the others do not.
            run_boundpool(&c.pool, graph);
            let warm = c.pool.take_trace(); // dropped after the timed run
            std::thread::sleep(std::time::Duration::from_millis(5));
            let cpu0 = process_cpu_ns();
            samples[i].push(run_boundpool(&c.pool, graph).as_nanos() as f64 / n);
            if let (Some(a), Some(b)) = (cpu0, process_cpu_ns()) {
                cpu[i].push(b.saturating_sub(a) as f64 / n);
            }
            // Drain what tracing recorded, outside the timed region.
            let _ = c.pool.take_trace();
            drop(warm);
        }
    }
    samples
        .iter_mut()
        .zip(&mut cpu)
        .map(|(s, c)| (median(s), median(c)))
        .collect()
}

fn report(title: &str, shape: Shape, nodes: usize, configs: &[Config], medians: &[(f64, f64)]) {
    println!("{title}: {} of {nodes} nodes", shape.name());
    let (wall0, cpu0) = medians[0];
    for (c, &(wall, cpu)) in configs.iter().zip(medians) {
        println!(
            "  {:<38} {:>7.1} ns/node {:>6.2}x   cpu {:>7.1} ns/node {:>+7.1}",
            c.label,
            wall,
            wall / wall0,
            cpu,
            cpu - cpu0
        );
    }
}

fn main() {
    let scale: f64 = env("BOUNDPOOL_BENCH_SCALE", 1.0);
    let runs: usize = env("BOUNDPOOL_BENCH_RUNS", 9);
    let shapes = [
        (Shape::Chain, ((500_000.0 * scale) as usize).max(100)),
        (Shape::Wavefront, ((500_000.0 * scale) as usize).max(100)),
    ];
    println!(
        "median ns per node over {runs} runs, 2 workers, empty nodes: wall time and its ratio to \
         the first line; CPU time of the process and its difference from the first line\n"
    );

    let configs = [
        pool("metrics off, tracing off (baseline)", false, false),
        pool("metrics on, no recorder (default)", true, false),
        pool("metrics on, tracing on", true, true),
        // The same recording into a ring that stays in cache: the difference to the line above
        // is what streaming the default window's records through memory costs.
        pool_with(
            "metrics on, tracing on, window 4096",
            PoolBuilder::new()
                .metrics(true)
                .trace(true)
                .trace_window(4096),
        ),
    ];
    for &(shape, n) in &shapes {
        let g = empty_graph(shape, n);
        let m = measure(&configs, &g, runs);
        report("no recorder", shape, g.len(), &configs, &m);
    }
    drop(configs);

    let _handle = install_prometheus_recorder().expect("no recorder installed yet");
    let configs = [
        pool("metrics off, tracing off (baseline)", false, false),
        pool("metrics on, Prometheus recorder", true, false),
    ];
    for &(shape, n) in &shapes {
        let g = empty_graph(shape, n);
        let m = measure(&configs, &g, runs);
        report(
            "with a Prometheus recorder installed",
            shape,
            g.len(),
            &configs,
            &m,
        );
    }
}
