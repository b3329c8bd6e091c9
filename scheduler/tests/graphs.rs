//! Graph validation, typed outputs, reruns, subgraph inlining and `GraphHandle` as a future.

#[allow(dead_code)]
mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use boundpool_scheduler::backend::FromIndex;
use boundpool_scheduler::{Error, ErrorKind, GraphBuilder, GroupId, NodeRef, Placement};
use common::pool;

/// A node body that counts its runs in `c`.
fn counting(
    c: &Arc<AtomicUsize>,
) -> impl Fn(&boundpool_scheduler::NodeCtx<'_, ()>) -> Result<(), boundpool_scheduler::BoxError>
       + Send
       + Sync
       + 'static {
    let c = c.clone();
    move |_| {
        c.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

// ---------------------------------------------------------------- validation

#[test]
fn cycle_is_an_error_naming_nodes_on_it() {
    let ran = Arc::new(AtomicUsize::new(0));
    let mut g = GraphBuilder::<()>::new("cyclic");
    let src = g.node("source", counting(&ran));
    let a = g.node("alpha", counting(&ran));
    let b = g.node("beta", counting(&ran));
    let c = g.node("gamma", counting(&ran));
    let off = g.node("offcycle", counting(&ran));
    g.edge(src, a)
        .edge(a, b)
        .edge(b, c)
        .edge(c, a)
        .edge(src, off);
    let err = g.build().expect_err("a cycle must not build");
    assert_eq!(err.kind(), ErrorKind::Cycle);
    let msg = err.to_string();
    for name in ["alpha", "beta", "gamma"] {
        assert!(
            msg.contains(name),
            "cycle message {msg:?} should name {name}"
        );
    }
    assert!(
        !msg.contains("offcycle"),
        "{msg:?} names a node that is not on the cycle"
    );
    assert!(msg.contains("cyclic"), "{msg:?} should name the graph");
    assert_eq!(
        ran.load(Ordering::SeqCst),
        0,
        "nothing runs before the error"
    );
}

#[test]
fn two_node_cycle_and_self_loop() {
    let mut g = GraphBuilder::<()>::new("pair");
    let a = g.node("ping", |_| Ok(()));
    let b = g.node("pong", |_| Ok(()));
    g.edge(a, b).edge(b, a);
    let err = g.build().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Cycle);
    assert!(
        err.to_string().contains("ping") && err.to_string().contains("pong"),
        "{err}"
    );

    let mut g = GraphBuilder::<()>::new("selfish");
    let _x = g.node("x", |_| Ok(()));
    let me = g.node("narcissus", |_| Ok(()));
    g.edge(me, me);
    let err = g.build().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Cycle);
    assert!(err.to_string().contains("narcissus"), "{err}");
}

#[test]
fn cycle_deep_in_a_large_graph_is_found() {
    // A long chain whose tail loops back to its middle; plus many well-formed nodes.
    let mut g = GraphBuilder::<()>::new("big");
    let nodes: Vec<NodeRef<()>> = (0..5000)
        .map(|i| g.node(format!("n{i}"), |_| Ok(())))
        .collect();
    for w in nodes.windows(2) {
        g.edge(w[0], w[1]);
    }
    g.edge(nodes[4999], nodes[2500]);
    let err = g.build().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Cycle);
    let msg = err.to_string();
    assert!(
        msg.contains("'n4999'") && msg.contains("'n2500'"),
        "{}",
        &msg[..msg.len().min(300)]
    );
    assert!(!msg.contains("'n2499'"), "n2499 is not on the cycle");
}

#[test]
fn edge_to_a_node_of_another_graph_is_foreign() {
    let mut other = GraphBuilder::<()>::new("other");
    let theirs = other.node("theirs", |_| Ok(1u32));
    let ran = Arc::new(AtomicUsize::new(0));
    let mut g = GraphBuilder::<()>::new("mine");
    let ours = g.node("ours", counting(&ran));
    g.edge(theirs, ours);
    let err = g.build().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ForeignNode);
    assert!(err.to_string().contains("mine"), "{err}");

    // Either direction, and placements too.
    let mut g = GraphBuilder::<()>::new("mine2");
    let ours = g.node("ours", |_| Ok(()));
    g.edge(ours, theirs);
    assert_eq!(g.build().unwrap_err().kind(), ErrorKind::ForeignNode);

    let mut g = GraphBuilder::<()>::new("mine3");
    g.node("ours", |_| Ok(()));
    g.place(theirs, GroupId::from_index(0));
    assert_eq!(g.build().unwrap_err().kind(), ErrorKind::ForeignNode);
    assert_eq!(ran.load(Ordering::SeqCst), 0);
    // `other` is untouched and still builds.
    other.build().unwrap();
}

#[test]
fn placement_on_a_missing_group_fails_at_submit() {
    let pool = pool("graphs", 2);
    let ran = Arc::new(AtomicUsize::new(0));
    let mut g = GraphBuilder::<()>::new("placed");
    let a = g.node("a", counting(&ran));
    let far = g.node("far-away", counting(&ran));
    g.edge(a, far);
    g.place(far, GroupId::from_index(3));
    let graph = g
        .build()
        .expect("placement is checked against the pool, not at build");
    let err = pool.submit(&graph).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::UnknownGroup);
    assert!(err.to_string().contains("far-away"), "{err}");
    assert_eq!(ran.load(Ordering::SeqCst), 0, "nothing ran");
    assert_eq!(pool.stats().graphs_submitted, 0);
    // Group 0 exists: placing there is fine.
    let mut g = GraphBuilder::<()>::new("placed-ok");
    let a = g.node("a", counting(&ran));
    g.place(a, GroupId::from_index(0));
    pool.run(&g.build().unwrap()).unwrap();
    assert_eq!(ran.load(Ordering::SeqCst), 1);
}

#[test]
fn empty_graph_completes() {
    let pool = pool("graphs", 1);
    let g = GraphBuilder::<()>::new("empty").build().unwrap();
    assert!(g.is_empty());
    let out = pool.submit(&g).unwrap().wait().unwrap();
    assert_eq!(out.graph_name(), "empty");
    let (res, _) = common::block_on(pool.submit(&g).unwrap());
    res.unwrap();
}

#[test]
fn graph_introspection() {
    let mut g = GraphBuilder::<()>::new("intro");
    let a = g.node("a", |_| Ok(1u8));
    let b = g.node("b", |_| Ok(2u8));
    let c = g.cpu_node("c", |_| Ok(3u8));
    g.edge(a, b).edge(a, c).edge(b, c);
    g.place(b, GroupId::from_index(0));
    assert_eq!(g.len(), 3);
    let graph = g.build().unwrap();
    assert_eq!(graph.len(), 3);
    assert_eq!(graph.edge_count(), 3);
    assert_eq!(graph.name(), "intro");
    assert_eq!(graph.node_name(b.id()), Some("b"));
    assert_eq!(
        graph.placement(b.id()),
        Some(Placement::Group(GroupId::from_index(0)))
    );
    assert_eq!(graph.placement(a.id()), Some(Placement::Any));
    assert!(graph.is_cpu_node(c.id()) && !graph.is_cpu_node(a.id()));
    let mut succ: Vec<_> = graph.successors(a.id()).collect();
    succ.sort();
    assert_eq!(succ, vec![b.id(), c.id()]);
    let mut pred: Vec<_> = graph.predecessors(c.id()).collect();
    pred.sort();
    assert_eq!(pred, vec![a.id(), b.id()]);
    assert_eq!(
        graph.nodes().map(|n| n.index()).collect::<Vec<_>>(),
        vec![0, 1, 2]
    );
    let dot = graph.to_dot();
    assert!(
        dot.contains("cpu lane") && dot.contains("group 0") && dot.contains("n0 -> n1"),
        "{dot}"
    );
    // Ids of another graph are not this graph's.
    let mut other = GraphBuilder::<()>::new("o");
    let x = other.node("x", |_| Ok(()));
    assert_eq!(graph.node_name(x.id()), None);
}

// ---------------------------------------------------------------- outputs

#[test]
fn typed_outputs_flow_to_successors_and_the_submitter() {
    let pool = pool("graphs", 2);
    let mut g = GraphBuilder::<()>::new("typed");
    let text = g.node("text", |_| Ok(String::from("forty")));
    let num = g.node("num", |_| Ok(2u64));
    let vec = g.node("vec", move |ctx| Ok(vec![*ctx.input(num)?; 3]));
    let unit = g.node("unit", |_| Ok(()));
    let join = g.node("join", move |ctx| {
        ctx.input(unit)?;
        let s: &String = ctx.input(text)?;
        let v: &Vec<u64> = ctx.input(vec)?;
        Ok(format!("{s}-{}", v.iter().sum::<u64>()))
    });
    g.edge(text, join)
        .edge(num, vec)
        .edge(vec, join)
        .edge(unit, join);
    let graph = g.build().unwrap();
    let mut out = pool.run(&graph).unwrap();
    assert_eq!(out.graph_name(), "typed");
    assert_eq!(out.get(join).map(String::as_str), Some("forty-6"));
    assert_eq!(out.get(num), Some(&2));
    assert_eq!(out.get(vec), Some(&vec![2, 2, 2]));
    // take moves the value out; afterwards it is gone.
    assert_eq!(out.take(vec), Some(vec![2, 2, 2]));
    assert_eq!(out.take(vec), None);
    assert_eq!(out.get(vec), None);
    assert_eq!(out.take(text).as_deref(), Some("forty"));
    assert_eq!(
        out.get(join).map(String::as_str),
        Some("forty-6"),
        "other outputs stay"
    );
    // A node returning `()` stores nothing, yet its output is there (`GpuPool::call` of a
    // body returning `()` reads it with `take`).
    assert_eq!(out.get(unit), Some(&()));
    assert_eq!(out.take(unit), Some(()));
    assert_eq!(out.take(unit), Some(()));
    // A ref of another graph reads nothing.
    let mut other = GraphBuilder::<()>::new("other");
    let foreign = other.node("x", |_| Ok(2u64));
    let foreign_unit = other.node("y", |_| Ok(()));
    assert_eq!(out.get(foreign), None);
    assert_eq!(out.get(foreign_unit), None);
    assert_eq!(out.take(foreign_unit), None);
}

#[test]
fn reading_a_non_predecessor_is_bad_input() {
    let pool = pool("graphs", 2);
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut g = GraphBuilder::<()>::new("bad-input");
    let a = g.node("a", |_| Ok(1u32));
    let b = g.node("b", |_| Ok(2u32));
    let c = g.node("c", move |ctx| Ok(ctx.input(a)? + 1));
    let d = {
        let seen = seen.clone();
        // `a` is a predecessor of `c`, not of `d`; `b` is an indirect predecessor only.
        g.node("reader", move |ctx| {
            let mut s = seen.lock().unwrap();
            s.push(ctx.input(a).map(|_| ()).map_err(|e| e.kind()));
            s.push(ctx.input(b).map(|_| ()).map_err(|e| e.kind()));
            s.push(ctx.input(c).map(|_| ()).map_err(|e| e.kind()));
            Ok(())
        })
    };
    g.edge(a, c).edge(b, c).edge(c, d);
    pool.run(&g.build().unwrap()).unwrap();
    assert_eq!(
        *seen.lock().unwrap(),
        vec![Err(ErrorKind::BadInput), Err(ErrorKind::BadInput), Ok(())]
    );

    // Propagated with `?` it fails the graph, naming the node, with the BadInput error as source.
    let mut g = GraphBuilder::<()>::new("bad-input-2");
    let a = g.node("a", |_| Ok(1u32));
    let lonely = g.node("lonely", move |ctx| Ok(*ctx.input(a)?));
    let _ = lonely;
    let err = pool.run(&g.build().unwrap()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NodeFailed);
    assert!(err.to_string().contains("lonely"), "{err}");
    let src = std::error::Error::source(&err).expect("source");
    let inner = src
        .downcast_ref::<Error>()
        .expect("the source is the BadInput error");
    assert_eq!(inner.kind(), ErrorKind::BadInput);
    assert!(inner.to_string().contains("lonely"), "{inner}");
}

#[test]
fn a_ref_of_another_graph_is_bad_input() {
    let pool = pool("graphs", 1);
    let mut other = GraphBuilder::<()>::new("other");
    let foreign = other.node("x", |_| Ok(2u64));
    let mut g = GraphBuilder::<()>::new("g");
    let a = g.node("a", |_| Ok(1u64));
    let b = g.node("b", move |ctx| {
        assert_eq!(ctx.input(foreign).unwrap_err().kind(), ErrorKind::BadInput);
        Ok(*ctx.input(a)?)
    });
    g.edge(a, b);
    assert_eq!(pool.run(&g.build().unwrap()).unwrap().get(b), Some(&1));
}

fn diamond_sum() -> (boundpool_scheduler::Graph, NodeRef<u64>, Arc<AtomicUsize>) {
    let ran = Arc::new(AtomicUsize::new(0));
    let mut g = GraphBuilder::<()>::new("rerun");
    let r = ran.clone();
    let src = g.node("src", move |_| {
        r.fetch_add(1, Ordering::SeqCst);
        Ok(3u64)
    });
    let mids: Vec<NodeRef<u64>> = (0..16u64)
        .map(|k| {
            let r = ran.clone();
            let m = g.node(format!("m{k}"), move |ctx| {
                r.fetch_add(1, Ordering::SeqCst);
                Ok(ctx.input(src)? * k)
            });
            g.edge(src, m);
            m
        })
        .collect();
    let r = ran.clone();
    let ms = mids.clone();
    let sink = g.node("sink", move |ctx| {
        r.fetch_add(1, Ordering::SeqCst);
        let mut s = 0;
        for &m in &ms {
            s += ctx.input(m)?;
        }
        Ok(s)
    });
    for m in mids {
        g.edge(m, sink);
    }
    (g.build().unwrap(), sink, ran)
}

#[test]
fn rerunning_a_graph_gives_the_same_result() {
    let pool = pool("graphs", 2);
    let (graph, sink, ran) = diamond_sum();
    for i in 0..500 {
        let out = pool.run(&graph).unwrap();
        assert_eq!(out.get(sink), Some(&(3 * 120)), "run {i}");
    }
    assert_eq!(ran.load(Ordering::SeqCst), 500 * 18);
}

#[test]
fn rerunning_a_graph_concurrently_from_many_threads() {
    let pool = pool("graphs", 3);
    let (graph, sink, ran) = diamond_sum();
    // Under Miri (an interpreter) the same pattern, smaller.
    let (threads, rounds) = if cfg!(miri) { (2, 2) } else { (6, 50) };
    let graphs = threads * rounds * 4;
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                // Keep several runs of the same graph in flight from each thread.
                for _ in 0..rounds {
                    let hs: Vec<_> = (0..4).map(|_| pool.submit(&graph).unwrap()).collect();
                    for h in hs {
                        assert_eq!(h.wait().unwrap().get(sink), Some(&360));
                    }
                }
            });
        }
    });
    assert_eq!(ran.load(Ordering::SeqCst), graphs * 18);
    let st = pool.stats();
    assert_eq!(st.graphs_submitted, graphs as u64);
    assert_eq!(st.graphs_completed, graphs as u64);
    assert_eq!(st.graphs_failed, 0);
    assert_eq!(st.nodes_run(), graphs as u64 * 18);
}

// ---------------------------------------------------------------- subgraphs

/// inner: a = 5 -> b = a * 2 (inner bodies read inner refs).
fn inner_graph(
    runs: &Arc<AtomicUsize>,
) -> (boundpool_scheduler::Graph, NodeRef<u64>, NodeRef<u64>) {
    let mut g = GraphBuilder::<()>::new("inner");
    let r = runs.clone();
    let a = g.node("inner-a", move |_| {
        r.fetch_add(1, Ordering::SeqCst);
        Ok(5u64)
    });
    let r = runs.clone();
    let b = g.node("inner-b", move |ctx| {
        r.fetch_add(1, Ordering::SeqCst);
        Ok(ctx.input(a)? * 2)
    });
    g.edge(a, b);
    (g.build().unwrap(), a, b)
}

#[test]
fn subgraph_inlining_maps_nodes_and_shares_bodies() {
    let pool = pool("graphs", 2);
    let runs = Arc::new(AtomicUsize::new(0));
    let (inner, ia, ib) = inner_graph(&runs);
    let mut g = GraphBuilder::<()>::new("outer");
    let start = g.node("start", |_| Ok(1u64));
    let s1 = g.subgraph(&inner);
    let s2 = g.subgraph(&inner);
    let b1 = s1.node(ib);
    let b2 = s2.node(ib);
    assert_ne!(b1.id(), b2.id());
    assert_ne!(b1.id(), ib.id());
    assert_eq!(s1.sources().collect::<Vec<_>>(), vec![s1.node(ia).id()]);
    assert_eq!(s1.sinks().collect::<Vec<_>>(), vec![b1.id()]);
    for src in s1.sources().chain(s2.sources()).collect::<Vec<_>>() {
        g.edge(start, src);
    }
    let a2 = s2.node(ia);
    let end = g.node("end", move |ctx| {
        Ok(ctx.input(start)? + ctx.input(b1)? + ctx.input(b2)? + ctx.input(a2)?)
    });
    for sink in s1.sinks().chain(s2.sinks()).collect::<Vec<_>>() {
        g.edge(sink, end);
    }
    g.edge(a2, end).edge(start, end);
    let graph = g.build().unwrap();
    assert_eq!(graph.len(), 6);
    assert_eq!(graph.node_name(b2.id()), Some("inner-b"));
    for _ in 0..20 {
        let out = pool.run(&graph).unwrap();
        assert_eq!(out.get(end), Some(&(1 + 10 + 10 + 5)));
        assert_eq!(out.get(b1), Some(&10));
        assert_eq!(out.get(s2.node(ia)), Some(&5));
        // Inner refs are not refs of the outer graph.
        assert_eq!(out.get(ib), None);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 20 * 4);
    // The inner graph still runs on its own.
    assert_eq!(pool.run(&inner).unwrap().get(ib), Some(&10));
}

#[test]
fn subgraph_of_a_subgraph() {
    let pool = pool("graphs", 2);
    let runs = Arc::new(AtomicUsize::new(0));
    let (inner, _ia, ib) = inner_graph(&runs);
    // middle: x -> inner -> y, y reads inner's b through the mapping.
    let mut m = GraphBuilder::<()>::new("middle");
    let x = m.node("x", |_| Ok(100u64));
    let s = m.subgraph(&inner);
    let mb = s.node(ib);
    for src in s.sources().collect::<Vec<_>>() {
        m.edge(x, src);
    }
    let y = m.node("y", move |ctx| Ok(ctx.input(x)? + ctx.input(mb)?));
    m.edge(mb, y);
    m.edge(x, y);
    let middle = m.build().unwrap();
    assert_eq!(pool.run(&middle).unwrap().get(y), Some(&110));

    let mut o = GraphBuilder::<()>::new("outermost");
    let pre = o.node("pre", |_| Ok(()));
    let s1 = o.subgraph(&middle);
    let s2 = o.subgraph(&middle);
    let (y1, y2) = (s1.node(y), s2.node(y));
    for src in s1.sources().chain(s2.sources()).collect::<Vec<_>>() {
        o.edge(pre, src);
    }
    let fin = o.node("fin", move |ctx| Ok(ctx.input(y1)? * 1000 + ctx.input(y2)?));
    o.edge(y1, fin).edge(y2, fin);
    let graph = o.build().unwrap();
    assert_eq!(graph.len(), 1 + 4 + 4 + 1);
    let out = pool.run(&graph).unwrap();
    assert_eq!(out.get(fin), Some(&110_110));
    assert_eq!(out.get(s2.node(mb)), Some(&10));
}

#[test]
#[should_panic(expected = "not a node of the inlined subgraph")]
fn subgraph_node_rejects_refs_of_other_graphs() {
    let runs = Arc::new(AtomicUsize::new(0));
    let (inner, _, _) = inner_graph(&runs);
    let mut g = GraphBuilder::<()>::new("outer");
    let mine = g.node("mine", |_| Ok(1u8));
    let s = g.subgraph(&inner);
    let _ = s.node(mine);
}

// ---------------------------------------------------------------- async

#[test]
fn handle_is_a_future() {
    let pool = pool("graphs", 2);
    let (graph, sink, _) = diamond_sum();
    let (out, _) = common::block_on(pool.submit(&graph).unwrap());
    assert_eq!(out.unwrap().get(sink), Some(&360));

    // A graph that is still running when first polled: the waker must be woken.
    let gate = Arc::new(std::sync::Barrier::new(2));
    let mut g = GraphBuilder::<()>::new("slow");
    let gt = gate.clone();
    let n = g.node("waits", move |_| {
        gt.wait();
        std::thread::sleep(std::time::Duration::from_millis(20));
        Ok(7i32)
    });
    let graph = g.build().unwrap();
    let handle = pool.submit(&graph).unwrap();
    assert!(!handle.is_done());
    assert_eq!(handle.graph_name(), "slow");
    let (res, wakes) = common::block_on(async move {
        gate.wait();
        handle.await
    });
    assert_eq!(res.unwrap().get(n), Some(&7));
    assert!(wakes >= 1, "the waker was never woken");

    // Many futures awaited in sequence inside one async block, and a failing one.
    let (graph, sink, _) = diamond_sum();
    let (results, _) = common::block_on(async {
        let mut v = Vec::new();
        for _ in 0..50 {
            v.push(pool.submit(&graph).unwrap());
        }
        let mut outs = Vec::new();
        for h in v {
            outs.push(*h.await.unwrap().get(sink).unwrap());
        }
        outs
    });
    assert_eq!(results, vec![360; 50]);
    let mut g = GraphBuilder::<()>::new("fails");
    g.node("bad", |_| -> Result<(), _> { Err("nope".into()) });
    let (res, _) = common::block_on(pool.submit(&g.build().unwrap()).unwrap());
    assert_eq!(res.unwrap_err().kind(), ErrorKind::NodeFailed);
}
