//! Nested submission: a node submits a graph and waits on it; the waiting worker runs other
//! nodes meanwhile, so nesting never deadlocks, even with one worker.

#[allow(dead_code)]
mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use boundpool_scheduler::{BoxError, ErrorKind, Graph, GraphBuilder, NodeRef};

/// A small inner graph: a -> {b, c} -> d, d = 2 * (a + 1).
fn inner(k: u64) -> (Graph, NodeRef<u64>) {
    let mut g = GraphBuilder::<()>::new("inner");
    let a = g.node("a", move |_| Ok(k));
    let b = g.node("b", move |ctx| Ok(ctx.input(a)? + 1));
    let c = g.node("c", move |ctx| Ok(ctx.input(a)? + 1));
    let d = g.node("d", move |ctx| Ok(ctx.input(b)? + ctx.input(c)?));
    g.edge(a, b).edge(a, c).edge(b, d).edge(c, d);
    (g.build().unwrap(), d)
}

#[test]
fn nested_wait_with_one_worker() {
    common::with_deadline(30, "nested_wait_with_one_worker", || {
        let pool = Arc::new(common::pool("nest", 1));
        let mut g = GraphBuilder::<()>::new("outer");
        let x = g.node("submitter", |ctx| -> Result<u64, BoxError> {
            let (graph, d) = inner(20);
            let out = ctx.submit(&graph)?.wait()?;
            Ok(*out.get(d).unwrap())
        });
        let y = g.node("after", move |ctx| Ok(ctx.input(x)? + 100));
        g.edge(x, y);
        let graph = g.build().unwrap();
        for _ in 0..if cfg!(miri) { 3 } else { 100 } {
            assert_eq!(pool.run(&graph).unwrap().get(y), Some(&142));
        }
    });
}

/// A graph whose single node submits `nest(depth - 1)` and waits; depth 0 is a plain node.
fn nest(depth: u32, max_seen: Arc<AtomicUsize>) -> (Graph, NodeRef<u32>) {
    let mut g = GraphBuilder::<()>::new(format!("depth{depth}"));
    let n = g.node("level", move |ctx| -> Result<u32, BoxError> {
        if depth == 0 {
            return Ok(0);
        }
        let (inner, r) = nest(depth - 1, max_seen.clone());
        let h = ctx.submit(&inner)?;
        max_seen.fetch_max(depth as usize, Ordering::SeqCst);
        Ok(h.wait()?.get(r).unwrap() + 1)
    });
    (g.build().unwrap(), n)
}

#[test]
fn deep_nesting() {
    for workers in [1, 2] {
        common::with_deadline(30, "deep_nesting", move || {
            let pool = Arc::new(common::pool("nest", workers));
            let seen = Arc::new(AtomicUsize::new(0));
            for depth in [1, 8, 16] {
                let (g, r) = nest(depth, seen.clone());
                assert_eq!(
                    pool.run(&g).unwrap().get(r),
                    Some(&depth),
                    "workers {workers}"
                );
            }
            assert_eq!(seen.load(Ordering::SeqCst), 16);
        });
    }
}

#[test]
fn many_concurrent_nested_waits() {
    for workers in [1, 2, 4] {
        common::with_deadline(60, "many_concurrent_nested_waits", move || {
            let pool = Arc::new(common::pool("nest", workers));
            // 64 nodes, each submitting and waiting on its own inner graph; outer graphs from
            // several threads at once.
            let mut g = GraphBuilder::<()>::new("fan");
            // Under Miri (an interpreter, thousands of times slower) the same shape, smaller.
            let (fan, threads, runs) = if cfg!(miri) { (4u64, 2, 1) } else { (64, 4, 5) };
            let leaves: Vec<NodeRef<u64>> = (0..fan)
                .map(|k| {
                    g.node(format!("nested{k}"), move |ctx| -> Result<u64, BoxError> {
                        let (graph, d) = inner(k);
                        // Submit two and wait in reverse order.
                        let h1 = ctx.submit(&graph)?;
                        let h2 = ctx.submit(&graph)?;
                        let v2 = *h2.wait()?.get(d).unwrap();
                        let v1 = *h1.wait()?.get(d).unwrap();
                        Ok(v1 + v2)
                    })
                })
                .collect();
            let ls = leaves.clone();
            let sum = g.node("sum", move |ctx| {
                let mut s = 0;
                for &l in &ls {
                    s += ctx.input(l)?;
                }
                Ok(s)
            });
            for l in leaves {
                g.edge(l, sum);
            }
            let graph = g.build().unwrap();
            let expected: u64 = (0..fan).map(|k| 4 * (k + 1)).sum();
            std::thread::scope(|s| {
                for _ in 0..threads {
                    s.spawn(|| {
                        for _ in 0..runs {
                            assert_eq!(pool.run(&graph).unwrap().get(sum), Some(&expected));
                        }
                    });
                }
            });
            assert_eq!(
                pool.stats().graphs_submitted,
                threads as u64 * runs * (1 + 2 * fan)
            );
        });
    }
}

#[test]
fn nested_failure_propagates() {
    common::with_deadline(30, "nested_failure_propagates", || {
        let pool = Arc::new(common::pool("nest", 1));
        let mut inner = GraphBuilder::<()>::new("inner-fails");
        inner.node("inner-bad", |_| -> Result<(), BoxError> {
            Err("deep trouble".into())
        });
        let inner = inner.build().unwrap();
        let mut g = GraphBuilder::<()>::new("outer");
        let x = g.node("outer-node", move |ctx| -> Result<(), BoxError> {
            ctx.submit(&inner)?.wait()?;
            Ok(())
        });
        let y = g.node("never", |_| Ok(()));
        g.edge(x, y);
        let err = pool.run(&g.build().unwrap()).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NodeFailed);
        assert!(
            err.to_string().contains("outer-node") && err.to_string().contains("inner-bad"),
            "{err}"
        );
        let src = std::error::Error::source(&err)
            .unwrap()
            .downcast_ref::<boundpool_scheduler::Error>()
            .unwrap();
        assert_eq!(src.kind(), ErrorKind::NodeFailed);
        assert_eq!(err.cancelled_nodes(), 1);
        // The pool is fine afterwards.
        let (g2, d) = inner_plain();
        assert_eq!(pool.run(&g2).unwrap().get(d), Some(&2));
    });
}

fn inner_plain() -> (Graph, NodeRef<u64>) {
    inner(0)
}

#[test]
fn nested_wait_via_the_pool_handle_and_async() {
    // Waiting through `Pool::submit` (not `NodeCtx::submit`) from inside a node also helps.
    common::with_deadline(30, "nested_via_pool", || {
        let pool = Arc::new(common::pool("nest", 1));
        let weak = Arc::downgrade(&pool);
        let mut g = GraphBuilder::<()>::new("outer");
        let x = g.node("outer", move |_| -> Result<u64, BoxError> {
            let pool = weak.upgrade().expect("pool alive");
            let (graph, d) = inner(1);
            let a = *pool.submit(&graph)?.wait()?.get(d).unwrap();
            let b = *pool.run(&graph)?.get(d).unwrap();
            Ok(a + b)
        });
        let graph = g.build().unwrap();
        assert_eq!(pool.run(&graph).unwrap().get(x), Some(&8));
    });
}

/// Nodes that wait on nested graphs inside a binary tree and inside a wide fan-out into a wide
/// join (a span batches the middles' arrivals at the join, which a nested wait must count
/// first, since the waiting worker helps elsewhere and may park): every node runs once and the
/// join sees every input, with one worker and with three.
#[test]
fn nested_waits_inside_trees_and_wide_fan_outs() {
    common::with_deadline(60, "nested_waits_inside_trees_and_wide_fan_outs", || {
        // Under Miri: a smaller tree, a fan-out still wide enough for two-level join counters
        // (256 predecessors) and span tasks, one round each.
        let (tree_nodes, fan, rounds) = if cfg!(miri) {
            (127u64, 300u64, 1)
        } else {
            (1023, 3000, 5)
        };
        for workers in [1, 3] {
            let pool = Arc::new(common::pool("nest", workers));
            // A tree of 2^10 - 1 nodes; every 37th waits on an inner graph.
            let ran = Arc::new(AtomicUsize::new(0));
            let mut g = GraphBuilder::<()>::new("tree");
            let mut ids = Vec::new();
            for i in 0..tree_nodes {
                let r = ran.clone();
                let id = g.node(format!("t{i}"), move |ctx| -> Result<u64, BoxError> {
                    r.fetch_add(1, Ordering::SeqCst);
                    if i % 37 == 0 {
                        let (graph, d) = inner(i);
                        let out = ctx.submit(&graph)?.wait()?;
                        return Ok(*out.get(d).unwrap());
                    }
                    Ok(i)
                });
                if i > 0 {
                    g.edge(ids[((i - 1) / 2) as usize], id);
                }
                ids.push(id);
            }
            let tree = g.build().unwrap();
            for _ in 0..rounds {
                pool.run(&tree).expect("the tree runs");
            }
            assert_eq!(
                ran.load(Ordering::SeqCst),
                rounds * tree_nodes as usize,
                "{workers} workers"
            );

            // source -> `fan` middles (3000; 300 under Miri) -> sink; every 101st middle waits on an inner graph.
            let mut g = GraphBuilder::<()>::new("fan");
            let src = g.node("src", |_| Ok(1u64));
            let mut mids = Vec::new();
            for i in 0..fan {
                let m = g.node(format!("m{i}"), move |ctx| -> Result<u64, BoxError> {
                    if i % 101 == 0 {
                        let (graph, d) = inner(i);
                        let out = ctx.submit(&graph)?.wait()?;
                        // 2 * (i + 1), back to i + 1.
                        return Ok(*out.get(d).unwrap() / 2);
                    }
                    Ok(*ctx.input(src)? + i)
                });
                g.edge(src, m);
                mids.push(m);
            }
            let ins = mids.clone();
            let sink = g.node("sink", move |ctx| -> Result<u64, BoxError> {
                let mut sum = 0;
                for &m in &ins {
                    sum += *ctx.input(m)?;
                }
                Ok(sum)
            });
            for &m in &mids {
                g.edge(m, sink);
            }
            let fan_graph = g.build().unwrap();
            for round in 0..rounds {
                let out = pool.run(&fan_graph).expect("the fan runs");
                assert_eq!(
                    out.get(sink),
                    Some(&(fan + fan * (fan - 1) / 2)),
                    "{workers} workers, round {round}"
                );
            }
        }
    });
}
