//! Priorities: on one worker the order of ready nodes is exactly high → normal → low, but for
//! the fixed share that lets low (and normal) through once every 16 takes; node overrides;
//! inlined subgraphs keep their overrides; priorities on every worker of a larger pool.

use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use boundpool_scheduler::{Cores, GraphBuilder, Pool, PoolBuilder, Priority};

fn one_worker() -> Pool {
    PoolBuilder::new()
        .workers(1)
        .cores(Cores::Unpinned)
        .build()
        .unwrap()
}

/// Holds the pool's one worker in a node until the returned sender is dropped or sent to.
fn hold(pool: &Pool) -> (mpsc::Sender<()>, boundpool_scheduler::GraphHandle) {
    let (tx, rx) = mpsc::channel::<()>();
    let (started_tx, started_rx) = mpsc::channel::<()>();
    let rx = Mutex::new(rx);
    let mut g = GraphBuilder::new("blocker");
    g.node("block", move |_| {
        started_tx.send(()).unwrap();
        let _ = rx.lock().unwrap().recv_timeout(Duration::from_secs(30));
        Ok(())
    });
    let h = pool.submit(&g.build().unwrap()).unwrap();
    started_rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the blocker started");
    (tx, h)
}

/// A graph of `n` independent nodes at `p`, each appending `tag` to `log`.
fn tagged(
    name: &'static str,
    p: Priority,
    n: usize,
    tag: char,
    log: &Arc<Mutex<Vec<char>>>,
) -> boundpool_scheduler::Graph {
    let mut g = GraphBuilder::new(name);
    for _ in 0..n {
        let log = log.clone();
        g.node("n", move |_| {
            log.lock().unwrap().push(tag);
            Ok(())
        });
    }
    g.priority(p);
    g.build().unwrap()
}

#[test]
fn one_worker_takes_high_then_normal_then_low() {
    let pool = one_worker();
    let log = Arc::new(Mutex::new(Vec::new()));
    let (release, blocker) = hold(&pool);
    // Submitted lowest first, so that arrival order would give the opposite answer.
    let low = pool
        .submit(&tagged("low", Priority::Low, 4, 'L', &log))
        .unwrap();
    let normal = pool
        .submit(&tagged("normal", Priority::Normal, 4, 'N', &log))
        .unwrap();
    let high = pool
        .submit(&tagged("high", Priority::High, 4, 'H', &log))
        .unwrap();
    release.send(()).unwrap();
    blocker.wait().unwrap();
    high.wait().unwrap();
    normal.wait().unwrap();
    low.wait().unwrap();
    let order: String = log.lock().unwrap().iter().collect();
    assert_eq!(order, "HHHHNNNNLLLL");
}

#[test]
fn low_gets_its_share_under_a_flood_of_high() {
    let pool = one_worker();
    let log = Arc::new(Mutex::new(Vec::new()));
    let (release, blocker) = hold(&pool);
    let low = pool
        .submit(&tagged("low", Priority::Low, 2, 'L', &log))
        .unwrap();
    let high = pool
        .submit(&tagged("high", Priority::High, 40, 'H', &log))
        .unwrap();
    release.send(()).unwrap();
    blocker.wait().unwrap();
    high.wait().unwrap();
    low.wait().unwrap();
    let order: String = log.lock().unwrap().iter().collect();
    // The blocker was taken before the pool saw a priority; from then on every 16th take looks
    // at low first: takes 16 and 32 are the two low nodes.
    let lows: Vec<usize> = order
        .char_indices()
        .filter(|&(_, c)| c == 'L')
        .map(|(i, _)| i + 1)
        .collect();
    assert_eq!(lows, vec![16, 32], "order {order}");
}

#[test]
fn node_override_beats_the_graph_priority() {
    let pool = one_worker();
    let log = Arc::new(Mutex::new(Vec::new()));
    let (release, blocker) = hold(&pool);
    let mut g = GraphBuilder::new("mixed");
    let mut ids = Vec::new();
    for tag in ['a', 'b', 'c', 'd'] {
        let log = log.clone();
        ids.push(g.node("n", move |_| {
            log.lock().unwrap().push(tag);
            Ok(())
        }));
    }
    g.priority(Priority::Low);
    g.node_priority(ids[2], Priority::High);
    let graph = g.build().unwrap();
    assert_eq!(graph.priority(), Priority::Low);
    assert_eq!(graph.node_priority(ids[2].id()), Some(Priority::High));
    assert_eq!(graph.node_priority(ids[0].id()), Some(Priority::Low));
    let normal = pool
        .submit(&tagged("normal", Priority::Normal, 1, 'N', &log))
        .unwrap();
    let h = pool.submit(&graph).unwrap();
    release.send(()).unwrap();
    blocker.wait().unwrap();
    h.wait().unwrap();
    normal.wait().unwrap();
    let order: String = log.lock().unwrap().iter().collect();
    assert_eq!(&order[..2], "cN", "order {order}");
    assert_eq!(order.len(), 5);
}

#[test]
fn inlined_subgraph_keeps_its_overrides_and_takes_the_outer_priority() {
    let mut inner = GraphBuilder::<()>::new("inner");
    let a = inner.node("a", |_| Ok(()));
    let b = inner.node("b", |_| Ok(()));
    inner.node_priority(a, Priority::High);
    inner.priority(Priority::Low);
    let inner = inner.build().unwrap();
    let mut outer = GraphBuilder::new("outer");
    let sub = outer.subgraph(&inner);
    outer.priority(Priority::Normal);
    let outer = outer.build().unwrap();
    assert_eq!(outer.node_priority(sub.node(a).id()), Some(Priority::High));
    assert_eq!(
        outer.node_priority(sub.node(b).id()),
        Some(Priority::Normal)
    );
}

#[test]
fn node_ctx_reports_the_priority() {
    let pool = one_worker();
    let mut g = GraphBuilder::new("g");
    let n = g.node("n", |ctx| Ok(ctx.priority()));
    g.priority(Priority::High);
    let out = pool.run(&g.build().unwrap()).unwrap();
    assert_eq!(out.get(n), Some(&Priority::High));
}

#[test]
fn every_level_runs_to_completion_on_a_busy_pool() {
    // Many workers, chains and fan-outs of every level at once: each node runs exactly once and
    // nothing hangs (a lost wake-up of a level queue would hang here).
    let pool = PoolBuilder::new()
        .workers(4)
        .cores(Cores::Unpinned)
        .build()
        .unwrap();
    let count = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut handles = Vec::new();
    for round in 0..60 {
        let p = [Priority::High, Priority::Normal, Priority::Low][round % 3];
        let mut g = GraphBuilder::new("fan");
        let src = g.node("src", |_| Ok(()));
        let sink = g.node("sink", |_| Ok(()));
        for _ in 0..20 {
            let c = count.clone();
            let m = g.node("m", move |_| {
                c.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                Ok(())
            });
            g.edge(src, m).edge(m, sink);
        }
        g.priority(p);
        g.node_priority(sink, Priority::High);
        handles.push(pool.submit(&g.build().unwrap()).unwrap());
    }
    for h in handles {
        h.wait_timeout(Duration::from_secs(60))
            .expect("graph finished in time")
            .unwrap();
    }
    assert_eq!(count.load(std::sync::atomic::Ordering::Relaxed), 60 * 20);
    assert_eq!(pool.graphs_in_flight(), 0);
}
