//! An empty graph is a graph: it builds, and submitting it (from any thread, also inside a
//! node) completes at once with an empty output, counted as a completed graph.

#[allow(dead_code)]
mod common;

use boundpool_scheduler::{BoxError, Graph, GraphBuilder};
use common::pool;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};

fn empty() -> Graph {
    GraphBuilder::<()>::new("nothing")
        .build()
        .expect("an empty graph builds")
}

#[test]
fn an_empty_graph_builds_and_completes_at_once() {
    common::with_deadline(30, "empty", || {
        let pool = pool("empty", 1);
        let g = empty();
        assert!(g.is_empty());
        assert_eq!((g.len(), g.edge_count(), g.nodes().count()), (0, 0, 0));
        let h = pool.submit(&g).unwrap();
        assert!(h.is_done(), "an empty graph is done when submitted");
        let out = h.wait().unwrap();
        assert_eq!(out.graph_name(), "nothing");
        let out = pool.run(&g).unwrap();
        assert_eq!(out.graph_name(), "nothing");
        // A timed wait and `.await`-style polling see it done too.
        assert!(pool
            .submit(&g)
            .unwrap()
            .wait_timeout(std::time::Duration::ZERO)
            .is_ok());
        let stats = pool.stats();
        assert_eq!(stats.graphs_submitted, 3);
        assert_eq!(stats.graphs_completed, 3);
        assert_eq!(stats.graphs_failed, 0);
        assert_eq!(stats.nodes_run(), 0);
        assert_eq!(pool.graphs_in_flight(), 0);
    });
}

#[test]
fn an_empty_graph_is_exported_as_a_completed_graph() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    // The empty graph completes on the submitting thread, so a thread-local recorder sees it.
    metrics::with_local_recorder(&recorder, || {
        let pool = pool("empty", 1);
        pool.run(&empty()).unwrap();
        pool.run(&empty()).unwrap();
    });
    // One snapshot: taking one resets the recorder's counters.
    let snapshot = snapshotter.snapshot().into_vec();
    let count = |name: &str| {
        snapshot
            .iter()
            .filter(|(k, ..)| k.key().name() == name)
            .map(|(.., v)| match v {
                DebugValue::Counter(c) => *c,
                other => panic!("{name} is not a counter: {other:?}"),
            })
            .sum::<u64>()
    };
    assert_eq!(count("boundpool_graphs_submitted_total"), 2);
    // Before the fix an empty graph was submitted but never exported as completed.
    assert_eq!(count("boundpool_graphs_completed_total"), 2);
}

#[test]
fn nested_empty_graphs_complete() {
    common::with_deadline(30, "nested_empty", || {
        let pool = pool("empty", 1);
        let mut g = GraphBuilder::<()>::new("outer");
        let x = g.node("submits-empty", |ctx| -> Result<usize, BoxError> {
            let inner = GraphBuilder::<()>::new("inner-empty").build()?;
            let mut n = 0;
            for _ in 0..10 {
                ctx.submit(&inner)?.wait()?;
                n += 1;
            }
            match ctx
                .submit(&inner)?
                .wait_timeout(std::time::Duration::from_secs(10))
            {
                Ok(r) => {
                    r?;
                    n += 1;
                }
                Err(_) => return Err("an empty graph timed out".into()),
            }
            Ok(n)
        });
        let graph = g.build().unwrap();
        assert_eq!(pool.run(&graph).unwrap().get(x), Some(&11));
        assert_eq!(pool.stats().graphs_completed, 12);
    });
}
