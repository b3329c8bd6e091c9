//! The timeline: every node and park of the window, names resolved at take time, the rolling
//! window, drains against snapshots, takes racing the workers, and extra tracks.

#[allow(dead_code)]
mod common;

use std::collections::HashMap;
use std::time::Duration;

use boundpool_scheduler::backend::PoolExt;
use boundpool_scheduler::{Graph, GraphBuilder, Pool, PoolBuilder, SliceKind, Trace};

/// The tests' pool builder (`common::pool_builder`), tracing.
fn traced(workers: usize) -> PoolBuilder<()> {
    common::pool_builder("trace", workers).trace(true)
}

/// A chain of `n` empty nodes named `c{i}`.
fn chain(name: &str, n: usize) -> Graph {
    let mut g = GraphBuilder::new(name.to_string());
    let mut prev = None;
    for i in 0..n {
        let x = g.node(format!("c{i}"), |_| Ok(()));
        if let Some(p) = prev {
            g.edge(p, x);
        }
        prev = Some(x);
    }
    g.build().unwrap()
}

/// A `side` x `side` grid, each node after its left and upper neighbours, named `r{row}c{col}`.
fn grid(name: &str, side: usize) -> Graph {
    let mut g = GraphBuilder::new(name.to_string());
    let mut ids = Vec::new();
    for r in 0..side {
        for c in 0..side {
            let x = g.node(format!("r{r}c{c}"), |_| Ok(()));
            if c > 0 {
                g.edge(ids[r * side + c - 1], x);
            }
            if r > 0 {
                g.edge(ids[(r - 1) * side + c], x);
            }
            ids.push(x);
        }
    }
    g.build().unwrap()
}

/// Node index -> its slices' (name, start, end, stolen, track).
type NodeSlices = HashMap<u32, Vec<(String, u64, u64, bool, usize)>>;

/// The node slices of `graph`.
fn nodes_of(t: &Trace, graph: &str) -> NodeSlices {
    let mut m: HashMap<u32, Vec<_>> = HashMap::new();
    for s in &t.slices {
        if let SliceKind::Node { stolen } = s.kind {
            if s.graph == graph {
                m.entry(s.node.unwrap()).or_default().push((
                    s.name.clone(),
                    s.start_ns,
                    s.end_ns,
                    stolen,
                    s.track,
                ));
            }
        }
    }
    m
}

/// Every node of a `side` x `side` grid (see [`grid`]) started after its left and upper
/// neighbours ended, by its first slice in `nodes`; `what` prefixes the failure message.
fn assert_after_predecessors(nodes: &NodeSlices, side: usize, what: &str) {
    for (&i, v) in nodes {
        let (r, c) = (i as usize / side, i as usize % side);
        let start = v[0].1;
        for pred in [
            c.checked_sub(1).map(|c| r * side + c),
            r.checked_sub(1).map(|r| r * side + c),
        ]
        .into_iter()
        .flatten()
        {
            let pend = nodes[&(pred as u32)][0].2;
            assert!(
                pend <= start,
                "{what}node {i} started at {start}, before its predecessor {pred} ended at {pend}"
            );
        }
    }
}

#[test]
fn every_node_once_with_its_name_in_dependency_order() {
    let p = traced(2).build().unwrap();
    let side = 30;
    let g = grid("grid", side);
    p.run(&g).unwrap();
    // Let the workers park, then wake them: their park slices end and are recorded.
    std::thread::sleep(Duration::from_millis(100));
    p.run(&chain("wake", 2)).unwrap();
    drop(g); // names are resolved from the rings' plan tables, not from the caller's graph
    let t = p.take_trace();
    assert_eq!(t.tracks.len(), 2);
    assert_eq!(t.dropped, 0);
    let nodes = nodes_of(&t, "grid");
    assert_eq!(nodes.len(), side * side, "every node of the grid");
    for r in 0..side {
        for c in 0..side {
            let i = (r * side + c) as u32;
            let v = &nodes[&i];
            assert_eq!(v.len(), 1, "node {i} once: {v:?}");
            let (name, start, end, _, track) = &v[0];
            assert_eq!(name, &format!("r{r}c{c}"));
            assert!(start <= end);
            assert!(*track < 2);
        }
    }
    // After its predecessors ended (one clock for every worker).
    assert_after_predecessors(&nodes, side, "");
    let parks: Vec<_> = t
        .slices
        .iter()
        .filter(|s| s.kind == SliceKind::Park)
        .collect();
    assert!(!parks.is_empty(), "the idle workers' parks are recorded");
    assert!(parks
        .iter()
        .all(|s| s.name == "park" && s.graph.is_empty() && s.node.is_none()));
    // Parks and nodes of one worker do not overlap.
    for w in 0..2 {
        let mut v: Vec<(u64, u64)> = t
            .slices
            .iter()
            .filter(|s| s.track == w)
            .map(|s| (s.start_ns, s.end_ns))
            .collect();
        v.sort();
        for pair in v.windows(2) {
            assert!(pair[0].1 <= pair[1].0, "worker {w}: {pair:?} overlap");
        }
    }
    // A take drains: nothing of the grid comes back.
    assert!(nodes_of(&p.take_trace(), "grid").is_empty());
}

/// A node whose last arrival came from this worker but whose other predecessor ended later on
/// another (its clock read after this worker's, its arrival before) must still start after
/// both: a race of a few nanoseconds, so the grid runs many times.
#[test]
fn no_node_starts_before_a_predecessor_that_another_worker_ended() {
    let p = traced(2).build().unwrap();
    let side = 30;
    let g = grid("grid", side);
    let runs = if cfg!(miri) { 2 } else { 300 };
    for run in 0..runs {
        p.run(&g).unwrap();
        let t = p.take_trace();
        assert_eq!(t.dropped, 0);
        let nodes = nodes_of(&t, "grid");
        assert_eq!(
            nodes.len(),
            side * side,
            "run {run}: every node of the grid"
        );
        assert_after_predecessors(&nodes, side, &format!("run {run}: "));
    }
}

#[test]
fn snapshot_leaves_the_window_for_the_next_take() {
    let p = traced(2).build().unwrap();
    p.run(&chain("c", 50)).unwrap();
    let a = p.snapshot_trace();
    let b = p.snapshot_trace();
    let c = p.take_trace();
    for t in [&a, &b, &c] {
        assert_eq!(nodes_of(t, "c").len(), 50);
    }
    assert!(nodes_of(&p.snapshot_trace(), "c").is_empty());
}

#[test]
fn the_window_keeps_the_last_slices_of_each_worker() {
    let p = traced(1).trace_window(100).build().unwrap();
    p.run(&chain("long", 1000)).unwrap();
    let t = p.take_trace();
    let nodes = nodes_of(&t, "long");
    assert_eq!(t.slices.len(), 100, "the window holds 100 slices");
    let mut idx: Vec<u32> = nodes.keys().copied().collect();
    idx.sort();
    assert_eq!(idx, (900..1000).collect::<Vec<u32>>(), "the last 100 nodes");
    for (i, v) in &nodes {
        assert_eq!(v[0].0, format!("c{i}"));
    }
    // 900 nodes (and the park before the submit, if the worker had parked) were overwritten.
    assert!((900..=901).contains(&t.dropped), "dropped {}", t.dropped);
    // The next take starts where this one ended.
    p.run(&chain("next", 10)).unwrap();
    let t = p.take_trace();
    assert_eq!(nodes_of(&t, "next").len(), 10);
    assert!(t.dropped == 0, "dropped {}", t.dropped);
}

#[test]
fn many_graphs_keep_their_names_in_a_small_window() {
    // More graphs than the plan table keeps before it prunes, each dropped after its run.
    let p = traced(2).trace_window(64).build().unwrap();
    for k in 0..200 {
        p.run(&chain(&format!("g{k}"), 3)).unwrap();
    }
    let t = p.take_trace();
    let named: Vec<_> = t
        .slices
        .iter()
        .filter(|s| matches!(s.kind, SliceKind::Node { .. }))
        .collect();
    assert!(!named.is_empty());
    for s in &named {
        let n = s.node.unwrap();
        assert_eq!(s.name, format!("c{n}"), "{s:?}");
        assert!(s.graph.starts_with('g'), "{s:?}");
    }
    // The last graph is whole (it is the newest).
    assert_eq!(nodes_of(&t, "g199").len(), 3);
}

#[test]
fn takes_racing_the_workers_lose_and_repeat_nothing() {
    let p = std::sync::Arc::new(traced(2).build().unwrap());
    let g = grid("race", 20);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let taker = {
        let (p, stop) = (p.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut all: Vec<Trace> = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                all.push(p.take_trace());
                std::thread::yield_now();
            }
            all
        })
    };
    // Under Miri the window is 4,096 slices a worker (see `DEFAULT_WINDOW`): fewer runs, so
    // that a taker Miri schedules seldom still loses nothing.
    let runs = if cfg!(miri) { 5 } else { 50 };
    for _ in 0..runs {
        p.run(&g).unwrap();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut traces = taker.join().unwrap();
    traces.push(p.take_trace());
    let mut count: HashMap<u32, usize> = HashMap::new();
    for t in &traces {
        assert_eq!(t.dropped, 0);
        for s in &t.slices {
            if let SliceKind::Node { .. } = s.kind {
                assert_eq!(s.graph, "race");
                let n = s.node.unwrap();
                let (r, c) = (n / 20, n % 20);
                assert_eq!(s.name, format!("r{r}c{c}"), "a torn record: {s:?}");
                assert!(s.start_ns <= s.end_ns, "a torn record: {s:?}");
                *count.entry(n).or_default() += 1;
            }
        }
    }
    assert_eq!(count.len(), 400);
    assert!(count.values().all(|&c| c == runs), "each node once per run");
}

#[test]
fn extra_tracks_keep_a_window_too() {
    let p: Pool = traced(1).trace_window(3).build().unwrap();
    let rec = p.span_recorder().unwrap();
    let t0 = rec.epoch();
    for i in 0..5u64 {
        let s = t0 + Duration::from_micros(i);
        p.record_span("gpu", &format!("s{i}"), s, s + Duration::from_nanos(500));
    }
    let t = rec.snapshot();
    let spans: Vec<&str> = t
        .slices
        .iter()
        .filter(|s| s.kind == SliceKind::Span)
        .map(|s| s.name.as_str())
        .collect();
    assert_eq!(spans, ["s2", "s3", "s4"]);
    assert_eq!(t.tracks.last().unwrap().name, "gpu");
    assert_eq!(t.dropped, 2);
    let t = rec.take();
    assert_eq!(t.dropped, 2);
    assert!(rec.take().slices.iter().all(|s| s.kind != SliceKind::Span));
}

#[test]
fn untraced_pool_gives_an_empty_trace() {
    // A window alone does not turn tracing on.
    let p = PoolBuilder::new()
        .workers(1)
        .trace_window(10)
        .build()
        .unwrap();
    p.run(&chain("c", 5)).unwrap();
    assert!(!p.is_tracing());
    assert!(p.take_trace().slices.is_empty());
    assert!(p.snapshot_trace().tracks.is_empty());
    assert!(p.span_recorder().is_none());
}
