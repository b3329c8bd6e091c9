//! Joins with many predecessors (counted through leaf counters first, see `run/wide.rs`): the join
//! runs once, after every predecessor, and sees every input; several wide joins share
//! predecessors; a failure among the predecessors cancels the join and what follows it, and
//! the cancelled count is exact.

#[allow(dead_code)]
mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use boundpool_scheduler::{BoxError, ErrorKind, GraphBuilder, NodeRef};
use common::pool;

/// `preds` predecessors (interleaved with unrelated one-node chains, so that the join's
/// predecessors are not numbered in one range) feeding two joins: `all` after every
/// predecessor, `odd` after the odd ones. `fail` names a predecessor whose body fails.
/// A node after every one of `inputs` whose output is the sum of theirs (a wide join when there
/// are many).
fn sum_of(g: &mut GraphBuilder<()>, name: &str, inputs: &[NodeRef<u64>]) -> NodeRef<u64> {
    let ins = inputs.to_vec();
    let sum = g.node(name.to_owned(), move |ctx| -> Result<u64, BoxError> {
        let mut sum = 0;
        for &p in &ins {
            sum += *ctx.input(p)?;
        }
        Ok(sum)
    });
    for &p in inputs {
        g.edge(p, sum);
    }
    sum
}

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
    let all = sum_of(&mut g, "all", &inputs);
    let odd_ins: Vec<_> = inputs.iter().copied().skip(1).step_by(2).collect();
    let odd = sum_of(&mut g, "odd", &odd_ins);
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

/// A graph's dependency counters carry over from one of its runs that succeeded to the next
/// (each counts on from where the last one stopped, `run.rs`'s `CounterCache`): runs of one
/// graph (wide joins, a grid of two-predecessor joins), some failing, some submitted several
/// at once, each succeed with every input or fail with the exact cancelled count.
#[test]
fn counters_carry_over_between_runs_of_a_graph() {
    use std::sync::atomic::AtomicU64;
    let pool = pool("wide-rerun", 3);
    let ran = Arc::new(AtomicUsize::new(0));
    // The predecessor of the wide joins that fails in a round, if any (u64::MAX: none).
    let fail = Arc::new(AtomicU64::new(u64::MAX));
    let mut g = GraphBuilder::<()>::new("rerun");
    let mut inputs = Vec::new();
    for i in 0..600u64 {
        let (r, f) = (ran.clone(), fail.clone());
        inputs.push(g.node(format!("p{i}"), move |_| -> Result<u64, BoxError> {
            r.fetch_add(1, Ordering::SeqCst);
            if f.load(Ordering::SeqCst) == i {
                return Err("predecessor failed".into());
            }
            Ok(i)
        }));
    }
    let all = sum_of(&mut g, "all", &inputs);
    // A 20x20 grid after `all`: cell (r, c) adds its left and upper neighbours.
    let side = 20usize;
    let mut cells: Vec<NodeRef<u64>> = Vec::new();
    for r in 0..side {
        for c in 0..side {
            let left = (c > 0).then(|| cells[r * side + c - 1]);
            let up = (r > 0).then(|| cells[(r - 1) * side + c]);
            let rr = ran.clone();
            let cell = g.node(format!("c{r}_{c}"), move |ctx| -> Result<u64, BoxError> {
                rr.fetch_add(1, Ordering::SeqCst);
                let mut v = 0;
                if let Some(l) = left {
                    v += *ctx.input(l)?;
                }
                if let Some(u) = up {
                    v += *ctx.input(u)?;
                }
                Ok(if left.is_none() && up.is_none() {
                    *ctx.input(all)?
                } else {
                    v
                })
            });
            if let Some(l) = left {
                g.edge(l, cell);
            }
            if let Some(u) = up {
                g.edge(u, cell);
            }
            if r == 0 && c == 0 {
                g.edge(all, cell);
            }
            cells.push(cell);
        }
    }
    let graph = g.build().expect("builds");
    let sum = 600 * 599 / 2;
    // Paths from the corner to the far corner: C(2 (side - 1), side - 1).
    let paths: u64 =
        (0..side as u64 - 1).fold(1, |acc, k| acc * (2 * (side as u64 - 1) - k) / (k + 1));
    let last = cells[side * side - 1];
    for round in 0..16u64 {
        let failing = round % 5 == 3;
        fail.store(if failing { 7 + round } else { u64::MAX }, Ordering::SeqCst);
        ran.store(0, Ordering::SeqCst);
        // Some rounds that succeed submit the graph three times at once (more runs than the
        // cached counter sets); a failing round runs it once (its count of bodies run is then
        // that run's).
        let copies = if round % 4 == 1 && !failing { 3 } else { 1 };
        let handles: Vec<_> = (0..copies)
            .map(|_| pool.submit(&graph).expect("submits"))
            .collect();
        for h in handles {
            match h.wait() {
                Ok(out) => {
                    assert!(!failing, "round {round}");
                    assert_eq!(out.get(all), Some(&sum), "round {round}");
                    assert_eq!(out.get(last), Some(&(sum * paths)), "round {round}");
                }
                Err(err) => {
                    assert!(failing, "round {round}: {err}");
                    assert_eq!(err.kind(), ErrorKind::NodeFailed, "{err}");
                    // The grid and the join never run.
                    assert!(err.cancelled_nodes() > side * side, "round {round}: {err}");
                    let not_run = graph.len() - ran.load(Ordering::SeqCst);
                    assert_eq!(err.cancelled_nodes(), not_run, "round {round}: {err}");
                }
            }
        }
        if !failing {
            assert_eq!(
                ran.load(Ordering::SeqCst),
                copies * (600 + side * side),
                "round {round}"
            );
        }
    }
}
