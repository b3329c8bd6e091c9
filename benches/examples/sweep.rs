//! Profiling aid: boundpool vs rayon-inline on one shape, interleaved pairs, median of ratios.
//! `sweep SHAPE [NODES] [PAIRS]`, or `sweep build`.
use boundpool::backend::FromIndex;
use boundpool_workloads::*;
fn main() {
    let arg = std::env::args().nth(1).unwrap_or("chain".into());
    if arg == "pingpong" {
        // A chain whose nodes alternate between two one-worker groups: the cost of a hand-off.
        let pool = boundpool::PoolBuilder::new()
            .groups(vec![
                boundpool::GroupSpec::new("a", 1),
                boundpool::GroupSpec::new("b", 1),
            ])
            .build()
            .unwrap();
        let edges = 20_000;
        let mut g = boundpool::GraphBuilder::new("pingpong");
        let mut prev = None;
        for i in 0..=edges {
            let n = g.node("n", |_| Ok(()));
            g.place(n, boundpool::GroupId::from_index(i % 2));
            if let Some(p) = prev {
                g.edge(p, n);
            }
            prev = Some(n);
        }
        let g = g.build().unwrap();
        let mut xs = vec![];
        for _ in 0..15 {
            let t = std::time::Instant::now();
            pool.run(&g).unwrap();
            xs.push(t.elapsed().as_nanos() as f64 / edges as f64);
        }
        println!(
            "pingpong: {:.0} ns per hand-off (median of 15)",
            median(&mut xs)
        );
        return;
    }
    if arg == "build" {
        for (s, n, ns) in bench_build(1.0, 5) {
            println!("build {s} {n} {ns:.1} ns/node");
        }
        return;
    }
    let shape = Shape::parse(&arg).unwrap();
    let n: usize = std::env::args()
        .nth(2)
        .map_or(1_000_000, |s| s.parse().unwrap());
    let pairs: usize = std::env::args().nth(3).map_or(31, |s| s.parse().unwrap());
    let pool = boundpool::PoolBuilder::new().workers(2).build().unwrap();
    let rayon = rayon_core::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    let dag = Dag::shape(shape, n);
    let adj = dag.adjacency();
    let g = empty_graph(shape, n);
    let only_bp = std::env::var("BP_ONLY").is_ok();
    let (mut b, mut r, mut q) = (vec![], vec![], vec![]);
    for _ in 0..pairs {
        let x = run_boundpool(&pool, &g).as_nanos() as f64 / dag.len() as f64;
        let y = if only_bp {
            1.0
        } else {
            rayon_inline(&rayon, &adj).as_nanos() as f64 / dag.len() as f64
        };
        b.push(x);
        r.push(y);
        q.push(x / y);
    }
    println!(
        "{arg} {} nodes: boundpool {:.2} rayon-inline {:.2} median pair ratio {:.3}",
        dag.len(),
        median(&mut b),
        median(&mut r),
        median(&mut q)
    );
}
