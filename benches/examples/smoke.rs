//! Runs one shape repeatedly (for profiling): `smoke [chain|wide|tree|wavefront] [runs]`.
use boundpool_scheduler::*;
use std::time::Instant;
fn main() {
    let shape = std::env::args().nth(1).unwrap_or_else(|| "chain".into());
    let runs: usize = std::env::args()
        .nth(2)
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let workers: usize = std::env::args()
        .nth(3)
        .and_then(|s| s.parse().ok())
        .unwrap_or(2);
    let pool = PoolBuilder::new().workers(workers).build().unwrap();
    let n = 1_000_000u32;
    let mut g = GraphBuilder::with_capacity("g", n as usize + 2, n as usize * 2);
    let first = g.node("n", |_| Ok(()));
    let mut prev = first;
    match shape.as_str() {
        "chain" => {
            for _ in 1..n {
                let x = g.node("n", |_| Ok(()));
                g.edge(prev, x);
                prev = x;
            }
        }
        "tree" => {
            let mut ids = vec![first];
            for i in 1..n {
                let x = g.node("n", |_| Ok(()));
                g.edge(ids[((i - 1) / 2) as usize], x);
                ids.push(x);
            }
        }
        "wavefront" => {
            let side = 1000u32;
            let mut ids = vec![first];
            for i in 1..n {
                let x = g.node("n", |_| Ok(()));
                let (r, c) = (i / side, i % side);
                if c > 0 {
                    g.edge(ids[(i - 1) as usize], x);
                }
                if r > 0 {
                    g.edge(ids[(i - side) as usize], x);
                }
                ids.push(x);
            }
        }
        _ => {
            let sink = g.node("sink", |_| Ok(()));
            for _ in 0..n {
                let x = g.node("n", |_| Ok(()));
                g.edge(first, x);
                g.edge(x, sink);
            }
        }
    }
    let graph = g.build().unwrap();
    let totals = |p: &Pool| {
        let st = p.stats();
        let w = &st.workers;
        (
            w.iter().map(|w| w.steals).sum::<u64>(),
            w.iter().map(|w| w.parks).sum::<u64>(),
        )
    };
    for _ in 0..runs {
        let (s0, p0) = totals(&pool);
        let t1 = Instant::now();
        pool.submit(&graph).unwrap().wait().unwrap();
        let dt = t1.elapsed();
        let (s1, p1) = totals(&pool);
        println!(
            "{shape}: {:.1} ns/node ({} steals, {} parks)",
            dt.as_nanos() as f64 / n as f64,
            s1 - s0,
            p1 - p0
        );
    }
}
