use boundpool_scheduler::*;
use std::time::Instant;
fn main() {
    let pool = PoolBuilder::new().workers(2).build().unwrap();
    let mut g = GraphBuilder::new("sum");
    let a = g.node("a", |_| Ok(20u64));
    let b = g.node("b", |_| Ok(22u64));
    let sum = g.node("sum", move |ctx| Ok(ctx.input(a)? + ctx.input(b)?));
    g.edge(a, sum); g.edge(b, sum);
    let graph = g.build().unwrap();
    let out = pool.submit(&graph).unwrap().wait().unwrap();
    assert_eq!(out.get(sum), Some(&42));
    for (name, n) in [("chain", 1_000_000u32), ("wide", 1_000_000)] {
        let t0 = Instant::now();
        let mut g = GraphBuilder::with_capacity(name, n as usize + 2, n as usize * 2);
        let mut prev = g.node("n", |_| Ok(()));
        let first = prev;
        if name == "chain" {
            for _ in 1..n { let x = g.node("n", |_| Ok(())); g.edge(prev, x); prev = x; }
        } else {
            let sink = g.node("sink", |_| Ok(()));
            for _ in 0..n { let x = g.node("n", |_| Ok(())); g.edge(first, x); g.edge(x, sink); }
        }
        let graph = g.build().unwrap();
        let tb = t0.elapsed();
        for _ in 0..3 {
            let t1 = Instant::now();
            pool.submit(&graph).unwrap().wait().unwrap();
            let te = t1.elapsed();
            println!("{name}: build {:.1} ns/node, exec {:.1} ns/node", tb.as_nanos() as f64 / n as f64, te.as_nanos() as f64 / n as f64);
        }
    }
    println!("{:?}", pool.stats());
}
