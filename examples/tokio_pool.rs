//! A tokio application driving a boundpool pool: thousands of tasks each submit a graph and
//! `.await` its `GraphHandle`, while the Prometheus endpoint is up, and the process's OS thread
//! count stays fixed at pool workers + tokio workers + main the whole time.
//!
//! ```text
//! cargo run --release --example tokio_pool                # 5,000 tasks, metrics on 127.0.0.1:9185
//! cargo run --release --example tokio_pool -- 20000 127.0.0.1:9300
//! curl -s 127.0.0.1:9185/metrics | grep boundpool_graphs  # while it runs
//! ```
//!
//! The Prometheus listener runs as a task of this tokio runtime (see
//! `boundpool::observe::install_prometheus`), so it adds no thread. Exits non-zero if the thread
//! count ever moved.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use boundpool::observe::install_prometheus;
use boundpool::{GraphBuilder, PoolBuilder};
use boundpool_workloads::busy_work;

const POOL_WORKERS: usize = 2;
const TOKIO_WORKERS: usize = 2;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let tasks: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(5_000);
    let addr: std::net::SocketAddr = args
        .next()
        .unwrap_or_else(|| "127.0.0.1:9185".into())
        .parse()?;

    let metrics = install_prometheus(addr)?;
    println!("metrics at http://{addr}/metrics");
    let pool = Arc::new(
        PoolBuilder::new()
            .name("tokio-demo")
            .workers(POOL_WORKERS)
            .build()?,
    );

    // A diamond whose nodes do 25 µs of work each: 5,000 graphs keep the pool busy ~0.25 s.
    let mut g = GraphBuilder::new("diamond");
    let a = g.node("fetch", |_| {
        busy_work(25_000);
        Ok(2u64)
    });
    let b = g.node("left", move |ctx| {
        busy_work(25_000);
        Ok(ctx.input(a)? * 10)
    });
    let c = g.node("right", move |ctx| {
        busy_work(25_000);
        Ok(ctx.input(a)? * 100)
    });
    let d = g.node("join", move |ctx| {
        busy_work(25_000);
        Ok(ctx.input(b)? + ctx.input(c)?)
    });
    g.edge(a, b).edge(a, c).edge(b, d).edge(c, d);
    let graph = g.build()?;

    let expected = POOL_WORKERS + TOKIO_WORKERS + 1;
    let start_threads = os_threads();
    println!("OS threads at start: {start_threads:?} (expected {expected}: {POOL_WORKERS} pool workers + {TOKIO_WORKERS} tokio workers + main)");

    let waiting = Arc::new(AtomicUsize::new(0));
    let t0 = Instant::now();
    let mut joins = Vec::with_capacity(tasks);
    for _ in 0..tasks {
        let (pool, graph, waiting) = (pool.clone(), graph.clone(), waiting.clone());
        joins.push(tokio::spawn(async move {
            let handle = pool.submit(&graph)?;
            waiting.fetch_add(1, Ordering::Relaxed);
            let out = handle.await;
            waiting.fetch_sub(1, Ordering::Relaxed);
            Ok::<u64, boundpool::Error>(*out?.get(d).expect("join's output"))
        }));
    }

    // Watch the thread count while the tasks wait.
    let mut samples = Vec::new();
    let monitor = {
        let waiting = waiting.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(25));
            let mut seen = Vec::new();
            loop {
                tick.tick().await;
                let w = waiting.load(Ordering::Relaxed);
                seen.push((w, os_threads()));
                if w == 0 && seen.len() > 1 {
                    return seen;
                }
            }
        })
    };
    let mut sum = 0u64;
    for j in joins {
        sum += j.await??;
    }
    samples.extend(monitor.await?);
    let elapsed = t0.elapsed();

    let peak_waiting = samples.iter().map(|s| s.0).max().unwrap_or(0);
    for (i, (w, n)) in samples.iter().enumerate() {
        if i % 4 == 0 || *w == peak_waiting {
            println!(
                "  {w:>6} tasks awaiting a graph   OS threads: {}",
                n.map_or("?".into(), |n| n.to_string())
            );
        }
    }
    assert_eq!(sum, tasks as u64 * 220, "every graph computed 2*10 + 2*100");
    let counts: Vec<usize> = samples
        .iter()
        .filter_map(|s| s.1)
        .chain(start_threads)
        .chain(os_threads())
        .collect();
    let (lo, hi) = (counts.iter().min().copied(), counts.iter().max().copied());
    println!(
        "{tasks} graphs in {:.0} ms; up to {peak_waiting} tasks waiting at once; OS threads min {lo:?} max {hi:?}",
        elapsed.as_secs_f64() * 1e3
    );
    let completed: f64 = metrics
        .render()
        .lines()
        .filter(|l| l.starts_with("boundpool_graphs_completed_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    println!("boundpool_graphs_completed_total on the endpoint: {completed}");
    if cfg!(target_os = "linux") && (lo != hi || hi != Some(expected)) {
        return Err(format!(
            "the OS thread count moved or is not {expected}: min {lo:?} max {hi:?}"
        )
        .into());
    }
    Ok(())
}

/// The number of OS threads of this process, counted from `/proc/self/task` (`None` off Linux).
fn os_threads() -> Option<usize> {
    std::fs::read_dir("/proc/self/task").ok().map(|d| d.count())
}
