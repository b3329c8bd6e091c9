//! Joins with many predecessors (counted through leaf counters first, see `run.rs`): the join
//! runs once, after every predecessor, and sees every input; several wide joins share
//! predecessors; a failure among the predecessors cancels the join and what follows it, and
//! the cancelled count is exact.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use boundpool_scheduler::{BoxError, Cores, ErrorKind, GraphBuilder, NodeRef, Pool, PoolBuilder};

fn pool(name: &str, workers: usize) -> Pool {
    PoolBuilder::new()
        .name(name)
        .workers(workers)
        .cores(Cores::Unpinned)
        .build()
        .expect("build pool")
}

/// `preds` predecessors (interleaved with unrelated one-node chains, so that the join's
/// predecessors are not numbered in one range) feeding two joins: `all` after every
/// predecessor, `odd` after the odd ones. `fail` names a predecessor whose body fails.
fn build(
    preds: u64,
    fail: Option<u64>,
    ran: Arc<AtomicUsize>,
) -> (boundpool_scheduler::Graph, NodeRef<u64>, NodeRef<u64>) {
    let mut g = GraphBuilder::<()>::new("wide-joins");
    let mut inputs = Vec::new();
    for i in 0..preds {
        let r = ran.clone();
        let p = g.node(format!("p{i}"), move |_| -> Result<u64, BoxError> {
            r.fetch_add(1, Ordering::SeqCst);
            if Some(i) == fail {
                return Err("predecessor failed".into());
            }
            Ok(i)
        });
        inputs.push(p);
        if i % 3 == 0 {
            // Unrelated nodes between the predecessors.
            let r = ran.clone();
            let x = g.node(format!("x{i}"), move |_| {
                r.fetch_add(1, Ordering::SeqCst);
                Ok(())
            });
            let r = ran.clone();
            let y = g.node(format!("y{i}"), move |_| {
                r.fetch_add(1, Ordering::SeqCst);
                Ok(())
            });
            g.edge(x, y);
        }
    }
    let ins = inputs.clone();
    let all = g.node("all", move |ctx| -> Result<u64, BoxError> {
        let mut sum = 0;
        for &p in &ins {
            sum += *ctx.input(p)?;
        }
        Ok(sum)
    });
    let odd_ins: Vec<_> = inputs.iter().copied().skip(1).step_by(2).collect();
    let ins = odd_ins.clone();
    let odd = g.node("odd", move |ctx| -> Result<u64, BoxError> {
        let mut sum = 0;
        for &p in &ins {
            sum += *ctx.input(p)?;
        }
        Ok(sum)
    });
    for &p in &inputs {
        g.edge(p, all);
    }
    for &p in &odd_ins {
        g.edge(p, odd);
    }
    // The join's successors: cancelled with it when it is.
    let after = g.node("after-all", move |ctx| Ok(*ctx.input(all)? + 1));
    g.edge(all, after);
    (g.build().expect("builds"), all, odd)
}

#[test]
fn wide_joins_run_once_with_every_input() {
    let pool = pool("wide-joins", 4);
    for preds in [300u64, 1000, 4099] {
        let ran = Arc::new(AtomicUsize::new(0));
        let (graph, all, odd) = build(preds, None, ran.clone());
        for round in 0..20 {
            let out = pool.run(&graph).expect("runs");
            assert_eq!(
                out.get(all),
                Some(&(preds * (preds - 1) / 2)),
                "{preds} preds, round {round}"
            );
            let odd_sum: u64 = (1..preds).step_by(2).sum();
            assert_eq!(out.get(odd), Some(&odd_sum), "{preds} preds, round {round}");
        }
        let others = 2 * preds.div_ceil(3) as usize;
        assert_eq!(ran.load(Ordering::SeqCst), 20 * (preds as usize + others));
    }
}

#[test]
fn a_failed_predecessor_cancels_the_wide_join_exactly() {
    let pool = pool("wide-fail", 3);
    for round in 0..10 {
        let ran = Arc::new(AtomicUsize::new(0));
        let (graph, _, _) = build(1000, Some(1 + 2 * round), ran.clone());
        let err = pool.run(&graph).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NodeFailed, "{err}");
        // Every node that did not run is cancelled: predecessors and unrelated nodes skipped
        // or never released once the run failed, and the joins `all` and `odd` (the failed
        // predecessor is odd) and `after-all`, never released.
        assert_eq!(graph.len(), 1000 + 2 * 334 + 3);
        let not_run = graph.len() - ran.load(Ordering::SeqCst);
        assert!(not_run >= 3, "round {round}");
        assert_eq!(err.cancelled_nodes(), not_run, "round {round}: {err}");
    }
}

/// source -> `n` middles -> sink: the source's successors go out as spans that workers split,
/// the sink is a wide join. `fail` names a middle whose body fails.
fn fan(
    n: u64,
    fail: Option<u64>,
    ran: Arc<AtomicUsize>,
) -> (boundpool_scheduler::Graph, NodeRef<u64>) {
    let mut g = GraphBuilder::<()>::new("fan");
    let r = ran.clone();
    let src = g.node("src", move |_| {
        r.fetch_add(1, Ordering::SeqCst);
        Ok(7u64)
    });
    let mut mids = Vec::new();
    for i in 0..n {
        let r = ran.clone();
        let m = g.node(format!("m{i}"), move |ctx| -> Result<u64, BoxError> {
            r.fetch_add(1, Ordering::SeqCst);
            if Some(i) == fail {
                return Err("middle failed".into());
            }
            Ok(*ctx.input(src)? + i)
        });
        g.edge(src, m);
        mids.push(m);
    }
    let ins = mids.clone();
    let r = ran.clone();
    let sink = g.node("sink", move |ctx| -> Result<u64, BoxError> {
        r.fetch_add(1, Ordering::SeqCst);
        let mut sum = 0;
        for &m in &ins {
            sum += *ctx.input(m)?;
        }
        Ok(sum)
    });
    for &m in &mids {
        g.edge(m, sink);
    }
    (g.build().expect("builds"), sink)
}

#[test]
fn wide_fan_out_runs_every_successor_once() {
    let pool = pool("wide-fan", 4);
    for n in [63u64, 64, 65, 1000, 20_000] {
        let ran = Arc::new(AtomicUsize::new(0));
        let (graph, sink) = fan(n, None, ran.clone());
        let rounds = if n > 10_000 { 3 } else { 20 };
        for round in 0..rounds {
            let out = pool.run(&graph).expect("runs");
            assert_eq!(
                out.get(sink),
                Some(&(7 * n + n * (n - 1) / 2)),
                "{n}, round {round}"
            );
        }
        assert_eq!(ran.load(Ordering::SeqCst), rounds * (n as usize + 2));
    }
}

#[test]
fn a_failed_successor_of_a_wide_fan_out_cancels_the_rest_exactly() {
    let pool = pool("wide-fan-fail", 3);
    for round in 0..10u64 {
        let ran = Arc::new(AtomicUsize::new(0));
        let (graph, _) = fan(5000, Some(round * 499), ran.clone());
        let err = pool.run(&graph).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NodeFailed, "{err}");
        let not_run = graph.len() - ran.load(Ordering::SeqCst);
        assert!(not_run >= 1, "the sink never runs");
        assert_eq!(err.cancelled_nodes(), not_run, "round {round}: {err}");
    }
}
