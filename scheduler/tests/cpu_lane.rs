//! The host-work lane: CPU-heavy nodes run on rayon threads (not on workers) when the pool has a
//! lane, their outputs flow back into worker nodes; without a lane they run on workers.

#[allow(dead_code)]
mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use boundpool_scheduler::{
    BoxError, Cores, ErrorKind, Graph, GraphBuilder, NodeRef, Pool, PoolBuilder,
};

/// The graph, its crunch nodes, `sum`, the cpu node `last`, and `sum-thread`.
type LaneGraph = (
    Graph,
    Vec<NodeRef<(u64, String)>>,
    NodeRef<u64>,
    NodeRef<String>,
    NodeRef<String>,
);

/// worker `src` -> cpu `crunch_i` (x 8) -> worker `sum`, and a cpu node after `sum`.
/// Each cpu node reports its thread's name.
fn lane_graph() -> LaneGraph {
    let mut g = GraphBuilder::<()>::new("lane");
    let src = g.node("src", |_| Ok(10u64));
    let crunch: Vec<NodeRef<(u64, String)>> = (0..8u64)
        .map(|k| {
            let c = g.cpu_node(format!("crunch{k}"), move |inputs| {
                let v = *inputs.input(src)?;
                let me = std::thread::current().name().unwrap_or("").to_string();
                Ok((v * k, me))
            });
            g.edge(src, c);
            c
        })
        .collect();
    let cs = crunch.clone();
    let sum = g.node("sum", move |ctx| {
        cs.iter()
            .try_fold(0u64, |s, &c| Ok::<_, BoxError>(s + ctx.input(c)?.0))
    });
    for &c in &crunch {
        g.edge(c, sum);
    }
    let sum_thread = g.node("sum-thread", |ctx| Ok(ctx.worker_info().name.clone()));
    g.edge(sum, sum_thread);
    let last = g.cpu_node("last", move |inputs| {
        Ok(format!(
            "{}@{}",
            inputs.input(sum)?,
            std::thread::current().name().unwrap_or("")
        ))
    });
    g.edge(sum, last);
    (g.build().unwrap(), crunch, sum, last, sum_thread)
}

fn check_on_lane(pool: &Pool, lane_prefix: &str) {
    let (graph, crunch, sum, last, sum_thread) = lane_graph();
    for _ in 0..50 {
        let out = pool.run(&graph).unwrap();
        assert_eq!(out.get(sum), Some(&(10 * 28)));
        for &c in &crunch {
            let (_, thread) = out.get(c).unwrap();
            assert!(
                thread.starts_with(lane_prefix) && thread.contains("-cpu-"),
                "cpu node ran on {thread:?}"
            );
        }
        let last = out.get(last).unwrap();
        assert!(last.starts_with("280@") && last.contains("-cpu-"), "{last}");
        assert!(
            !out.get(sum_thread).unwrap().contains("-cpu-"),
            "worker nodes stay on workers"
        );
    }
    assert_eq!(pool.stats().cpu_lane_nodes, 50 * 9);
    assert_eq!(pool.stats().nodes_run(), 50 * 12);
}

#[test]
fn cpu_nodes_run_on_the_created_lane() {
    let pool = PoolBuilder::new()
        .name("lanepool")
        .workers(2)
        .cores(Cores::Unpinned)
        .cpu_lane_threads(2)
        .build()
        .unwrap();
    // A spawned thread sets its name itself once it starts, so right after `build` the kernel may
    // still list a lane thread under its parent's name: wait (hang guard 10 s) until both are
    // named, then the count must be exactly the configured one.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while common::threads_named("lanepool-cpu-") < 2 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert_eq!(common::threads_named("lanepool-cpu-"), 2);
    check_on_lane(&pool, "lanepool-cpu-");
}

#[test]
fn cpu_nodes_run_on_a_given_rayon_pool() {
    let rayon = Arc::new(
        rayon_core::ThreadPoolBuilder::new()
            .num_threads(2)
            .thread_name(|i| format!("mine-cpu-{i}"))
            .build()
            .unwrap(),
    );
    let pool = PoolBuilder::new()
        .name("given")
        .workers(1)
        .cores(Cores::Unpinned)
        .rayon_pool(rayon)
        .cpu_lane_threads(5)
        .build()
        .unwrap();
    // The given pool wins over cpu_lane_threads.
    assert_eq!(common::threads_named("given-cpu-"), 0);
    check_on_lane(&pool, "mine-cpu-");
}

#[test]
fn without_a_lane_cpu_nodes_run_on_workers() {
    let pool = PoolBuilder::new()
        .name("nolane")
        .workers(2)
        .cores(Cores::Unpinned)
        .build()
        .unwrap();
    let (graph, crunch, sum, last, _) = lane_graph();
    for _ in 0..20 {
        let out = pool.run(&graph).unwrap();
        assert_eq!(out.get(sum), Some(&280));
        for &c in &crunch {
            let (_, thread) = out.get(c).unwrap();
            assert!(thread.starts_with("nolane-host-"), "{thread}");
        }
        assert!(out.get(last).unwrap().starts_with("280@nolane-host-"));
    }
    assert_eq!(pool.stats().cpu_lane_nodes, 0);
}

#[test]
fn failures_on_the_lane() {
    common::quiet_worker_panics();
    common::with_deadline(30, "lane_failures", || {
        let pool = PoolBuilder::new()
            .name("lanefail")
            .workers(1)
            .cores(Cores::Unpinned)
            .cpu_lane_threads(2)
            .build()
            .unwrap();
        let after = Arc::new(AtomicUsize::new(0));
        for panic in [false, true] {
            let mut g = GraphBuilder::<()>::new("lane-fails");
            let src = g.node("src", |_| Ok(()));
            let bad = g.cpu_node("bad-crunch", move |_| -> Result<u32, BoxError> {
                if panic {
                    panic!("lane panic");
                }
                Err("lane error".into())
            });
            let a = after.clone();
            let next = g.node("next", move |_| {
                a.fetch_add(1, Ordering::SeqCst);
                Ok(())
            });
            let next_cpu = g.cpu_node("next-cpu", |_| Ok(()));
            g.edge(src, bad).edge(bad, next).edge(bad, next_cpu);
            let err = pool.run(&g.build().unwrap()).unwrap_err();
            assert_eq!(
                err.kind(),
                if panic {
                    ErrorKind::NodePanicked
                } else {
                    ErrorKind::NodeFailed
                }
            );
            assert!(err.to_string().contains("bad-crunch"), "{err}");
            if panic {
                assert!(err.to_string().contains("lane panic"));
            }
            assert_eq!(err.cancelled_nodes(), 2);
        }
        assert_eq!(after.load(Ordering::SeqCst), 0);
        // The lane and the worker still work.
        let (graph, _, sum, _, _) = lane_graph();
        assert_eq!(pool.run(&graph).unwrap().get(sum), Some(&280));
    });
}

#[test]
fn cpu_lane_graphs_from_many_threads() {
    let pool = PoolBuilder::new()
        .name("lanemany")
        .workers(2)
        .cores(Cores::Unpinned)
        .cpu_lane_threads(2)
        .build()
        .unwrap();
    let (graph, _, sum, _, _) = lane_graph();
    // Under Miri (an interpreter) the same pattern, smaller.
    let (threads, each) = if cfg!(miri) { (2, 2) } else { (4, 25) };
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                let hs: Vec<_> = (0..each).map(|_| pool.submit(&graph).unwrap()).collect();
                for h in hs {
                    assert_eq!(h.wait().unwrap().get(sum), Some(&280));
                }
            });
        }
    });
    assert_eq!(pool.stats().cpu_lane_nodes, (threads * each) as u64 * 9);
}
