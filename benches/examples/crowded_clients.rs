//! A latency-critical client among more client threads than cores, host work only:
//! `crowded_clients [clients] [seconds] [workers]` (defaults 16, 2, 1). Each batch client
//! submits a one-node graph and waits for it, back to back; the high client submits a one-node
//! `Priority::High` graph every 200 µs and waits for it. Prints the high client's latency
//! percentiles and the batch's graphs/s. A diagnostic of the pool's shared start and finish
//! path under oversubscription (docs/benchmarks.md, "Serving a model", stop 45): run it on two
//! builds to compare them; it has no peer of its own.
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use boundpool_scheduler::{GraphBuilder, PoolBuilder, Priority};

fn arg(i: usize, default: u64) -> u64 {
    std::env::args()
        .nth(i)
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let (clients, seconds, workers) = (arg(1, 16), arg(2, 2), arg(3, 1));
    let pool = Arc::new(
        PoolBuilder::new()
            .workers(workers as usize)
            .build()
            .expect("pool"),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let batch: Vec<_> = (0..clients)
        .map(|_| {
            let (pool, stop, done) = (pool.clone(), stop.clone(), done.clone());
            std::thread::spawn(move || {
                let mut g = GraphBuilder::<()>::new("batch");
                g.node("work", |_| Ok(std::hint::black_box(1u64)));
                let g = g.build().expect("graph");
                while !stop.load(Ordering::Relaxed) {
                    pool.submit(&g).expect("submit").wait().expect("run");
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    let mut g = GraphBuilder::<()>::new("high");
    g.node("work", |_| Ok(std::hint::black_box(1u64)));
    g.priority(Priority::High);
    let g = g.build().expect("graph");
    let start = Instant::now();
    let mut lat = Vec::new();
    while start.elapsed() < Duration::from_secs(seconds) {
        let t = Instant::now();
        pool.submit(&g).expect("submit").wait().expect("run");
        lat.push(t.elapsed().as_secs_f64() * 1e6);
        std::thread::sleep(Duration::from_micros(200));
    }
    let secs = start.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    for b in batch {
        b.join().expect("batch client");
    }
    lat.sort_by(f64::total_cmp);
    let pct = |p: f64| lat[((lat.len() - 1) as f64 * p) as usize];
    println!(
        "clients {clients} workers {workers}: high requests {}, p50 {:.1} us, p99 {:.1} us, p99.9 {:.1} us, max {:.0} us; batch {:.0} graphs/s",
        lat.len(),
        pct(0.5),
        pct(0.99),
        pct(0.999),
        lat[lat.len() - 1],
        done.load(Ordering::Relaxed) as f64 / secs
    );
}
