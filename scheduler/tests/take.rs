//! `Inputs::take`: a node takes its predecessor's output by value when it is that output's only
//! reader (checked at run time, or at build along an edge declared with `hand_on`); the value
//! moves (no copy), is dropped exactly once wherever it ends, and is gone for the submitter;
//! markers stay; takes through inlined subgraphs, on the CPU lane, twice, after `input`, of
//! `()`, from a node with no edge. A property test checks random graphs of takes and reads.

#[allow(dead_code)]
mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use boundpool_scheduler::backend::{InputsExt, NodeCtxExt};
use boundpool_scheduler::{ErrorKind, GraphBuilder, NodeRef, PoolBuilder};
use common::pool;
use proptest::prelude::*;

/// A value that counts its drops.
struct Counted(Arc<AtomicUsize>, Vec<u64>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn take_moves_the_value_and_it_is_gone_for_the_submitter() {
    let pool = pool("take-move", 2);
    let made_at = Arc::new(AtomicUsize::new(0));
    let mut g = GraphBuilder::new("move");
    let m = made_at.clone();
    let a = g.node("a", move |_| {
        let v = vec![1u64; 1000];
        m.store(v.as_ptr() as usize, Ordering::SeqCst);
        Ok(v)
    });
    let m = made_at.clone();
    let b = g.node("b", move |ctx| {
        let mut v = ctx.take(a)?;
        // The very buffer `a` made: moved, not copied.
        assert_eq!(v.as_ptr() as usize, m.load(Ordering::SeqCst));
        v.iter_mut().for_each(|x| *x += 1);
        Ok(v)
    });
    g.edge(a, b);
    let graph = g.build().unwrap();
    for _ in 0..50 {
        let mut out = pool.run(&graph).unwrap();
        assert_eq!(out.get(a), None, "taken: gone for the submitter");
        assert_eq!(out.take(a), None);
        let v = out.take(b).unwrap();
        assert_eq!(v.as_ptr() as usize, made_at.load(Ordering::SeqCst));
        assert!(v.iter().all(|&x| x == 2));
    }
}

#[test]
fn a_value_is_dropped_exactly_once_wherever_it_ends() {
    let pool = pool("take-drops", 2);
    let drops = Arc::new(AtomicUsize::new(0));
    let mut g = GraphBuilder::new("drops");
    let d = drops.clone();
    let a = g.node("a", move |_| Ok(Counted(d.clone(), vec![1])));
    let d = drops.clone();
    let b = g.node("b", move |_| Ok(Counted(d.clone(), vec![2])));
    let d = drops.clone();
    let c = g.node("c", move |_| Ok(Counted(d.clone(), vec![3])));
    // Takes `a` and hands it on; takes `b` and drops it; reads `c`, which stays.
    let sink = g.node("sink", move |ctx| {
        let kept = ctx.take(a)?;
        drop(ctx.take(b)?);
        assert_eq!(ctx.input(c)?.1, [3]);
        Ok(kept)
    });
    g.edge(a, sink).edge(b, sink).edge(c, sink);
    let graph = g.build().unwrap();
    let out = pool.run(&graph).unwrap();
    assert_eq!(drops.load(Ordering::SeqCst), 1, "b dropped by the body");
    assert!(out.get(a).is_none() && out.get(b).is_none());
    assert_eq!(out.get(c).unwrap().1, [3]);
    assert_eq!(out.get(sink).unwrap().1, [1]);
    drop(out);
    assert_eq!(
        drops.load(Ordering::SeqCst),
        3,
        "a (in sink's output) and c dropped once"
    );

    // A taker that fails after the take: the value dies with its body, once; the graph
    // fails naming the taker.
    drops.store(0, Ordering::SeqCst);
    let mut g = GraphBuilder::new("fails");
    let d = drops.clone();
    let a = g.node("a", move |_| Ok(Counted(d.clone(), vec![1])));
    let b = g.node("b", move |ctx| -> Result<(), _> {
        let _v = ctx.take(a)?;
        Err("gave up".into())
    });
    let after = g.node("after", |_| Ok(()));
    g.edge(a, b).edge(b, after);
    let err = pool.run(&g.build().unwrap()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NodeFailed);
    assert!(err.to_string().contains("'b'"), "{err}");
    assert_eq!(err.cancelled_nodes(), 1);
    assert_eq!(drops.load(Ordering::SeqCst), 1);

    // A graph cancelled before the taker ran: the value is dropped with the run, once.
    drops.store(0, Ordering::SeqCst);
    let mut g = GraphBuilder::new("cancelled");
    let d = drops.clone();
    let a = g.node("a", move |_| Ok(Counted(d.clone(), vec![1])));
    let fail = g.node("fail", |_| -> Result<(), _> { Err("no".into()) });
    let b = g.node("b", move |ctx| Ok(ctx.take(a)?.1.len()));
    g.edge(a, b).edge(fail, b);
    let err = pool.run(&g.build().unwrap()).unwrap_err();
    assert!(err.to_string().contains("'fail'"), "{err}");
    assert_eq!(drops.load(Ordering::SeqCst), 1);
}

#[test]
fn another_reader_makes_a_take_an_error_naming_the_nodes() {
    let pool = pool("take-readers", 2);
    let mut g = GraphBuilder::new("two readers");
    let a = g.node("a", |_| Ok(String::from("shared")));
    let b = g.node("b", move |ctx| Ok(ctx.take(a)?.len()));
    let c = g.node("reader-c", move |ctx| Ok(ctx.input(a)?.len()));
    g.edge(a, b).edge(a, c);
    let graph = g.build().unwrap();
    let err = pool.run(&graph).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NodeFailed);
    let src = err.into_source().unwrap();
    let e = src.downcast_ref::<boundpool_scheduler::Error>().unwrap();
    assert_eq!(e.kind(), ErrorKind::BadInput);
    let msg = e.to_string();
    assert!(
        msg.contains("node 'b' (#1) of graph 'two readers' takes the output of node 'a' (#0)")
            && msg.contains("node 'reader-c' (#2)")
            && msg.contains("only successor"),
        "{msg}"
    );

    // Declared with `hand_on`, the same graph is refused at build, naming both nodes and the
    // other reader.
    let mut g = GraphBuilder::<()>::new("declared");
    let a = g.node("a", |_| Ok(String::from("shared")));
    let b = g.node("b", move |ctx| Ok(ctx.take(a)?.len()));
    let c = g.node("reader-c", move |ctx| Ok(ctx.input(a)?.len()));
    g.hand_on(a, b).edge(a, c);
    let err = g.build().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::BadInput);
    let msg = err.to_string();
    assert!(
        msg.contains("graph 'declared': node 'b' (#1) takes the output of node 'a' (#0)")
            && msg.contains("node 'reader-c' (#2)"),
        "{msg}"
    );
    // A repeated edge to the taker is still one reader.
    let mut g = GraphBuilder::new("repeated");
    let a = g.node("a", |_| Ok(5u32));
    let b = g.node("b", move |ctx| Ok(ctx.take(a)?));
    g.hand_on(a, b).edge(a, b);
    assert_eq!(pool.run(&g.build().unwrap()).unwrap().get(b), Some(&5));
}

/// Runs a one-edge graph `a -> b` whose `b` does `body`; the error `b` reports.
fn taker_error<T: Send + Sync + 'static>(
    make: impl Fn() -> T + Send + Sync + 'static,
    body: impl Fn(&boundpool_scheduler::NodeCtx<'_, ()>, NodeRef<T>) -> Result<(), String>
        + Send
        + Sync
        + 'static,
) -> String {
    let pool = pool("take-errors", 1);
    let mut g = GraphBuilder::new("g");
    let a = g.node("a", move |_| Ok(make()));
    let b = g.node("b", move |ctx| body(ctx, a).map_err(Into::into));
    g.edge(a, b);
    let err = pool.run(&g.build().unwrap()).unwrap_err();
    err.into_source().unwrap().to_string()
}

#[test]
fn taking_twice_after_reading_or_reading_after_taking_is_an_error() {
    let twice = taker_error(
        || vec![1u8],
        |ctx, a| {
            let first = ctx.take(a).map_err(|e| e.to_string())?;
            assert_eq!(first, [1]);
            ctx.take(a).map(drop).map_err(|e| e.to_string())
        },
    );
    assert!(
        twice.contains(
            "node 'b' (#1) of graph 'g' takes the output of node 'a' (#0), which it took before"
        ),
        "{twice}"
    );
    let after_input = taker_error(
        || vec![1u8],
        |ctx, a| {
            let r = ctx.input(a).map_err(|e| e.to_string())?;
            let taken = ctx.take(a).map(drop).map_err(|e| e.to_string());
            // The `&` from `input` is still alive here: the take must have been refused.
            assert_eq!(r[0], 1);
            taken
        },
    );
    assert!(
        after_input
            .contains("takes the output of node 'a' (#0), which it read with `input` before"),
        "{after_input}"
    );
    let input_after = taker_error(
        || vec![1u8],
        |ctx, a| {
            drop(ctx.take(a).map_err(|e| e.to_string())?);
            ctx.input(a).map(drop).map_err(|e| e.to_string())
        },
    );
    assert!(
        input_after.contains("reads the output of node 'a' (#0), which it took"),
        "{input_after}"
    );
}

#[test]
fn unit_outputs_no_edge_and_foreign_nodes() {
    let pool = pool("take-misc", 1);
    // `()` is never stored: taking it gives `()`, as `input` does.
    let mut g = GraphBuilder::new("unit");
    let a = g.node("a", |_| Ok(()));
    let b = g.node("b", move |ctx| {
        ctx.take(a)?;
        ctx.take(a)?;
        Ok(1u8)
    });
    g.hand_on(a, b);
    assert_eq!(pool.run(&g.build().unwrap()).unwrap().get(b), Some(&1));

    // No edge from the node taken from.
    let mut g = GraphBuilder::new("no edge");
    let a = g.node("a", |_| Ok(3u32));
    let b = g.node("b", move |ctx| Ok(ctx.take(a)?));
    let _ = b;
    let err = pool.run(&g.build().unwrap()).unwrap_err();
    let msg = err.into_source().unwrap().to_string();
    assert!(
        msg.contains("takes node #0, which is not a direct predecessor"),
        "{msg}"
    );

    // A node of another graph.
    let mut other = GraphBuilder::<()>::new("other");
    let foreign = other.node("x", |_| Ok(3u32));
    let mut g = GraphBuilder::new("foreign");
    let a = g.node("a", |_| Ok(3u32));
    let b = g.node("b", move |ctx| Ok(ctx.take(foreign)?));
    g.edge(a, b);
    let err = pool.run(&g.build().unwrap()).unwrap_err();
    let msg = err.into_source().unwrap().to_string();
    assert!(
        msg.contains("which is not a node of the graph that defined it"),
        "{msg}"
    );
}

#[test]
fn markers_survive_a_take() {
    let pool = pool("take-markers", 2);
    let mut g = GraphBuilder::new("markers");
    let a = g.node("a", |ctx| {
        ctx.set_marker(Box::new(42u32));
        Ok(vec![7u8])
    });
    let b = g.node("b", move |ctx| {
        let v = ctx.take(a)?;
        let markers: Vec<u32> = ctx
            .predecessor_markers()
            .filter_map(|(_, m)| m.downcast_ref::<u32>().copied())
            .collect();
        Ok((v, markers))
    });
    g.hand_on(a, b);
    let out = pool.run(&g.build().unwrap()).unwrap();
    assert_eq!(out.get(b), Some(&(vec![7u8], vec![42u32])));
}

#[test]
fn inlined_subgraphs_take_from_their_own_nodes() {
    let pool = pool("take-inlined", 2);
    let mut inner = GraphBuilder::new("inner");
    let x = inner.node("x", |_| Ok(vec![1u32, 2]));
    let y = inner.node("y", move |ctx| {
        let mut v = ctx.take(x)?;
        v.push(3);
        Ok(v)
    });
    inner.hand_on(x, y);
    let inner = inner.build().unwrap();
    let mut g = GraphBuilder::new("outer");
    let first = g.node("first", |_| Ok(0u8));
    let s1 = g.subgraph(&inner);
    let s2 = g.subgraph(&inner);
    let y1 = s1.node(y);
    let y2 = s2.node(y);
    let sum = g.node("sum", move |ctx| {
        Ok(ctx.take(y1)?.iter().sum::<u32>() + ctx.input(y2)?.iter().sum::<u32>())
    });
    g.edge(first, s1.node(x)).edge(y1, sum).edge(y2, sum);
    let out = pool.run(&g.build().unwrap()).unwrap();
    assert_eq!(out.get(sum), Some(&12));
    assert_eq!(out.get(y1), None);
    assert_eq!(out.get(y2), Some(&vec![1, 2, 3]));
    assert_eq!(out.get(s1.node(x)), None);

    // An outer edge that gives an inlined node a second reader makes its inner take an error.
    let mut g = GraphBuilder::new("outer2");
    let s = g.subgraph(&inner);
    let spy = g.node("spy", move |_| Ok(()));
    g.edge(s.node(x), spy);
    let err = pool.run(&g.build().unwrap()).unwrap_err();
    assert!(err.to_string().contains("'y'"), "{err}");
    let msg = err.into_source().unwrap().to_string();
    assert!(msg.contains("node 'spy' (#2)"), "{msg}");
}

#[test]
fn cpu_nodes_take_on_the_host_work_lane() {
    let lane = Arc::new(
        rayon_core::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap(),
    );
    let pool = PoolBuilder::new()
        .workers(1)
        .cores(boundpool_scheduler::Cores::Unpinned)
        .rayon_pool(lane)
        .build()
        .unwrap();
    let mut g = GraphBuilder::new("cpu");
    let a = g.node("a", |_| Ok(vec![2u64; 8]));
    let b = g.cpu_node("b", move |inputs| Ok(inputs.take(a)?.iter().sum::<u64>()));
    g.hand_on(a, b);
    let out = pool.run(&g.build().unwrap()).unwrap();
    assert_eq!(out.get(b), Some(&16));
    assert_eq!(out.get(a), None);
}

/// A random graph over `n` nodes: each node `i > 0` has up to three predecessors among the
/// nodes before it; a node takes from each predecessor whose only successor it is, and reads
/// the others.
fn arb_graph() -> impl Strategy<Value = Vec<Vec<usize>>> {
    (2usize..24).prop_flat_map(|n| {
        (1..n)
            .map(|i| proptest::collection::vec(0..i, 0..=3.min(i)))
            .collect::<Vec<_>>()
            .prop_map(|mut preds| {
                preds.insert(0, Vec::new());
                for p in preds.iter_mut() {
                    p.sort_unstable();
                    p.dedup();
                }
                preds
            })
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: if cfg!(miri) { 4 } else { 64 }, ..ProptestConfig::default() })]

    /// Each node's value is its index plus the sum of its predecessors' values; a node takes
    /// the values it is the only reader of and reads the rest. The outputs match the sums
    /// computed here, a taken value is gone, every value is dropped exactly once, and no
    /// value is taken twice (the run succeeds).
    #[test]
    fn random_graphs_of_takes_and_reads(preds in arb_graph()) {
        let n = preds.len();
        let mut succs = vec![Vec::new(); n];
        for (i, p) in preds.iter().enumerate() {
            for &q in p {
                succs[q].push(i);
            }
        }
        let taken: Vec<bool> = (0..n).map(|q| succs[q].len() == 1).collect();
        let drops = Arc::new(AtomicUsize::new(0));
        let pool = pool("take-prop", 2);
        let mut g = GraphBuilder::new("random");
        let mut refs: Vec<NodeRef<Counted>> = Vec::new();
        for (i, p) in preds.iter().enumerate() {
            let mine: Vec<(NodeRef<Counted>, bool)> =
                p.iter().map(|&q| (refs[q], taken[q])).collect();
            let d = drops.clone();
            refs.push(g.node(format!("n{i}"), move |ctx| {
                let mut sum = i as u64;
                for &(p, take) in &mine {
                    sum += if take { ctx.take(p)?.1[0] } else { ctx.input(p)?.1[0] };
                }
                Ok(Counted(d.clone(), vec![sum]))
            }));
        }
        for (i, p) in preds.iter().enumerate() {
            for &q in p {
                if taken[q] {
                    g.hand_on(refs[q], refs[i]);
                } else {
                    g.edge(refs[q], refs[i]);
                }
            }
        }
        let graph = g.build().unwrap();
        let mut want = vec![0u64; n];
        for i in 0..n {
            want[i] = i as u64 + preds[i].iter().map(|&q| want[q]).sum::<u64>();
        }
        for _ in 0..3 {
            drops.store(0, Ordering::SeqCst);
            let out = pool.run(&graph).unwrap();
            for i in 0..n {
                match out.get(refs[i]) {
                    Some(v) => {
                        prop_assert!(!taken[i]);
                        prop_assert_eq!(v.1[0], want[i]);
                    }
                    None => prop_assert!(taken[i]),
                }
            }
            let taken_count = taken.iter().filter(|&&t| t).count();
            // Taken values were dropped by their takers' bodies.
            prop_assert_eq!(drops.load(Ordering::SeqCst), taken_count);
            drop(out);
            prop_assert_eq!(drops.load(Ordering::SeqCst), n);
        }
    }
}
