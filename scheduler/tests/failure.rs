//! Failing and panicking nodes: the graph fails at once naming the node, nodes not started are
//! cancelled and counted, the worker survives and other graphs are unaffected.

#[allow(dead_code)]
mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use boundpool_scheduler::{BoxError, Error, ErrorKind, Graph, GraphBuilder, NodeRef};
use common::pool;

#[derive(Debug, PartialEq)]
struct MyError(u32);
impl std::fmt::Display for MyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "my error {}", self.0)
    }
}
impl std::error::Error for MyError {}

/// source -> fail -> c1 -> c2 -> c3, plus source -> side (independent of the failure).
/// Returns the graph and the per-node run counters.
fn failing_chain(
    fail: impl Fn() -> Result<u32, BoxError> + Send + Sync + 'static,
) -> (Graph, Arc<Vec<AtomicUsize>>) {
    let ran: Arc<Vec<AtomicUsize>> = Arc::new((0..5).map(|_| AtomicUsize::new(0)).collect());
    let mut g = GraphBuilder::<()>::new("doomed");
    let r = ran.clone();
    let src = g.node("source", move |_| {
        r[0].fetch_add(1, Ordering::SeqCst);
        Ok(1u32)
    });
    let r = ran.clone();
    let f = g.node("the-failing-node", move |ctx| {
        ctx.input(src)?;
        r[1].fetch_add(1, Ordering::SeqCst);
        fail()
    });
    g.edge(src, f);
    let mut prev = f;
    for i in 2..5 {
        let r = ran.clone();
        let n = g.node(format!("after{i}"), move |_| {
            r[i].fetch_add(1, Ordering::SeqCst);
            Ok(0u32)
        });
        g.edge(prev, n);
        prev = n;
    }
    (g.build().unwrap(), ran)
}

fn counts(ran: &[AtomicUsize]) -> Vec<usize> {
    ran.iter().map(|a| a.load(Ordering::SeqCst)).collect()
}

#[test]
fn node_error_fails_the_graph_naming_the_node() {
    let pool = pool("fail1", 1);
    let (graph, ran) = failing_chain(|| Err(Box::new(MyError(42))));
    let err = pool.run(&graph).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NodeFailed);
    let msg = err.to_string();
    assert!(msg.contains("the-failing-node"), "{msg}");
    assert!(msg.contains("doomed"), "{msg}");
    assert!(
        msg.contains("my error 42"),
        "Display includes the node's error: {msg}"
    );
    let src = std::error::Error::source(&err).expect("source is the node's error");
    assert_eq!(src.downcast_ref::<MyError>(), Some(&MyError(42)));
    assert_eq!(
        err.cancelled_nodes(),
        3,
        "the three successors never started"
    );
    assert_eq!(counts(&ran), vec![1, 1, 0, 0, 0]);
    let stats = pool.stats();
    assert_eq!(stats.nodes_cancelled, 3);
    assert_eq!(stats.graphs_failed, 1);
    assert_eq!(stats.graphs_completed, 0);
    // into_source hands the boxed error back.
    let boxed = err.into_source().unwrap();
    assert_eq!(*boxed.downcast::<MyError>().unwrap(), MyError(42));
}

#[test]
fn panic_fails_the_graph_with_the_message() {
    common::quiet_worker_panics();
    let pool = pool("fail2", 1);
    let (graph, ran) = failing_chain(|| panic!("kaboom number {}", 7));
    let err = pool.run(&graph).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NodePanicked);
    let msg = err.to_string();
    assert!(
        msg.contains("the-failing-node") && msg.contains("kaboom number 7"),
        "{msg}"
    );
    assert_eq!(err.cancelled_nodes(), 3);
    assert_eq!(counts(&ran), vec![1, 1, 0, 0, 0]);
    // A `&str` payload too.
    let (graph, _) = failing_chain(|| std::panic::panic_any("static payload"));
    let err = pool.run(&graph).unwrap_err();
    assert!(err.to_string().contains("static payload"), "{err}");
    assert_eq!(pool.stats().nodes_cancelled, 6);
}

#[test]
fn worker_survives_failures_even_when_alone() {
    common::quiet_worker_panics();
    let pool = pool("survivor", 1);
    let (bad, _) = failing_chain(|| Err("nope".into()));
    let (panicky, _) = failing_chain(|| panic!("oh no"));
    let (good, ran) = failing_chain(|| Ok(5));
    for i in 0..50 {
        assert_eq!(pool.run(&bad).unwrap_err().kind(), ErrorKind::NodeFailed);
        assert_eq!(
            pool.run(&panicky).unwrap_err().kind(),
            ErrorKind::NodePanicked
        );
        pool.run(&good).unwrap_or_else(|e| panic!("round {i}: {e}"));
    }
    assert_eq!(counts(&ran), vec![50; 5]);
    let st = pool.stats();
    assert_eq!(st.graphs_failed, 100);
    assert_eq!(st.graphs_completed, 50);
    assert_eq!(st.nodes_cancelled, 100 * 3);
    // Failed and panicking nodes count as run: 2 per failing graph, 5 per good one.
    assert_eq!(st.nodes_run(), 100 * 2 + 50 * 5);
}

#[test]
fn failure_cancels_pending_siblings_and_counts_them() {
    // source -> {fail, n0..n199}; n_i -> sink. One worker: the failing node runs first (it is
    // the continuation), so every sibling is skipped. With more workers some siblings may run;
    // run + cancelled always equals the node count.
    for workers in [1, 2, 4] {
        let pool = pool("siblings", workers);
        let ran = Arc::new(AtomicUsize::new(0));
        // A global sequence: the failing node's step, and the last step at which a sibling started.
        let seq = Arc::new(AtomicUsize::new(0));
        let failed_at = Arc::new(AtomicUsize::new(0));
        let last_sibling_start = Arc::new(AtomicUsize::new(0));
        let mut g = GraphBuilder::<()>::new("wide-fail");
        let r = ran.clone();
        let src = g.node("src", move |_| {
            r.fetch_add(1, Ordering::SeqCst);
            Ok(())
        });
        let r = ran.clone();
        let (sq, fd) = (seq.clone(), failed_at.clone());
        let f = g.node("failer", move |_| -> Result<(), BoxError> {
            r.fetch_add(1, Ordering::SeqCst);
            fd.store(sq.fetch_add(1, Ordering::SeqCst), Ordering::SeqCst);
            Err("failer failed".into())
        });
        g.edge(src, f);
        let r = ran.clone();
        let sink = g.node("sink", move |_| {
            r.fetch_add(1, Ordering::SeqCst);
            Ok(())
        });
        for i in 0..200 {
            let r = ran.clone();
            let (sq, last) = (seq.clone(), last_sibling_start.clone());
            let n = g.node(format!("n{i}"), move |_| {
                r.fetch_add(1, Ordering::SeqCst);
                last.fetch_max(sq.fetch_add(1, Ordering::SeqCst), Ordering::SeqCst);
                std::thread::sleep(Duration::from_micros(200));
                Ok(())
            });
            g.edge(src, n).edge(n, sink);
        }
        let graph = g.build().unwrap();
        let total = graph.len();
        for _ in 0..5 {
            seq.store(1, Ordering::SeqCst);
            last_sibling_start.store(0, Ordering::SeqCst);
            let before = ran.load(Ordering::SeqCst);
            let cancelled_before = pool.stats().nodes_cancelled;
            let err = pool.run(&graph).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::NodeFailed);
            assert!(err.to_string().contains("failer"));
            let ran_now = ran.load(Ordering::SeqCst) - before;
            assert_eq!(
                ran_now + err.cancelled_nodes(),
                total,
                "workers {workers}: every node ran or was cancelled"
            );
            assert!(err.cancelled_nodes() >= 1, "the sink never runs");
            if workers == 1 {
                // One worker: once the failing node has run, no sibling starts.
                let (f_at, last) = (
                    failed_at.load(Ordering::SeqCst),
                    last_sibling_start.load(Ordering::SeqCst),
                );
                assert!(
                    ran_now == 2 || last < f_at,
                    "a sibling started (step {last}) after the failure (step {f_at})"
                );
            } else {
                // The failure stops the graph at once: far fewer than the 200 slow siblings run.
                assert!(
                    ran_now < 100,
                    "workers {workers}: {ran_now} nodes ran after the failure"
                );
            }
            assert_eq!(
                pool.stats().nodes_cancelled - cancelled_before,
                err.cancelled_nodes() as u64
            );
        }
    }
}

#[test]
fn other_graphs_are_unaffected() {
    common::quiet_worker_panics();
    let pool = pool("mixed", 2);
    let (bad, _) = failing_chain(|| Err("bad".into()));
    let (panicky, _) = failing_chain(|| panic!("panicky"));
    // A good graph with a checkable output.
    let mut g = GraphBuilder::<()>::new("good");
    let leaves: Vec<NodeRef<u64>> = (0..32u64)
        .map(|i| g.node(format!("l{i}"), move |_| Ok(i)))
        .collect();
    let ls = leaves.clone();
    let sum = g.node("sum", move |ctx| {
        ls.iter()
            .map(|&l| ctx.input(l).copied())
            .sum::<Result<u64, Error>>()
            .map_err(Into::into)
    });
    for l in leaves {
        g.edge(l, sum);
    }
    let good = g.build().unwrap();
    std::thread::scope(|s| {
        for t in 0..4 {
            let (pool, bad, panicky, good) = (&pool, &bad, &panicky, &good);
            s.spawn(move || {
                for i in 0..100 {
                    let hs = [
                        pool.submit(good).unwrap(),
                        pool.submit(if (i + t) % 2 == 0 { bad } else { panicky })
                            .unwrap(),
                        pool.submit(good).unwrap(),
                    ];
                    let [g1, b, g2] = hs;
                    assert_eq!(g1.wait().unwrap().get(sum), Some(&496));
                    assert!(matches!(
                        b.wait().unwrap_err().kind(),
                        ErrorKind::NodeFailed | ErrorKind::NodePanicked
                    ));
                    assert_eq!(g2.wait().unwrap().get(sum), Some(&496));
                }
            });
        }
    });
    let st = pool.stats();
    assert_eq!(st.graphs_completed, 800);
    assert_eq!(st.graphs_failed, 400);
    assert_eq!(st.nodes_cancelled, 400 * 3);
}

#[test]
fn first_failure_wins_when_several_nodes_fail() {
    let pool = pool("multi", 2);
    let mut g = GraphBuilder::<()>::new("many-failures");
    for i in 0..20 {
        g.node(format!("f{i}"), move |_| -> Result<(), BoxError> {
            Err(format!("failure {i}").into())
        });
    }
    let graph = g.build().unwrap();
    for _ in 0..50 {
        let err = pool.run(&graph).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NodeFailed);
        let msg = err.to_string();
        // Exactly one node is named: the one whose error is the source.
        let src = std::error::Error::source(&err).unwrap().to_string();
        let i: usize = src.strip_prefix("failure ").unwrap().parse().unwrap();
        assert!(msg.contains(&format!("'f{i}'")), "{msg}");
    }
}

#[test]
fn failing_cpu_node_without_a_lane() {
    let pool = pool("cpufail", 1);
    let mut g = GraphBuilder::<()>::new("cpu");
    let a = g.cpu_node("crunch", |_| -> Result<u8, BoxError> {
        Err("cpu error".into())
    });
    let b = g.node("after", |_| Ok(()));
    g.edge(a, b);
    let err = pool.run(&g.build().unwrap()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NodeFailed);
    assert!(err.to_string().contains("crunch"));
    assert_eq!(err.cancelled_nodes(), 1);
}

#[test]
fn error_clone_keeps_kind_message_and_source_text() {
    let pool = pool("clone", 1);
    let (graph, _) = failing_chain(|| Err(Box::new(MyError(3))));
    let err = pool.run(&graph).unwrap_err();
    let c = err.clone();
    assert_eq!(c.kind(), err.kind());
    assert_eq!(c.to_string(), err.to_string());
    assert_eq!(c.cancelled_nodes(), err.cancelled_nodes());
    assert_eq!(
        std::error::Error::source(&c).unwrap().to_string(),
        "my error 3"
    );
    assert!(format!("{err:?}").contains("NodeFailed"));
}
