//! A pool's life around its graphs: dropping the pool while other threads' graphs are in
//! flight finishes them and returns; a handle dropped without waiting leaks nothing; a timed
//! wait returns the handle without cancelling the graph, also inside a node.

#[allow(dead_code)]
mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use boundpool_scheduler::backend::FromIndex;
use boundpool_scheduler::{
    BoxError, Cores, ErrorKind, Graph, GraphBuilder, GroupId, GroupSpec, NodeRef, PoolBuilder,
    ShutdownMode,
};
use common::pool;

/// A chain of `n` nodes that each sleep a little; the sink returns `n`.
fn slow_chain(n: usize, ran: &Arc<AtomicUsize>) -> (Graph, NodeRef<usize>) {
    let mut g = GraphBuilder::<()>::new("slow");
    let mut prev = None;
    for i in 0..n - 1 {
        let r = ran.clone();
        let x = g.node(format!("s{i}"), move |_| {
            std::thread::sleep(Duration::from_micros(200));
            r.fetch_add(1, Ordering::SeqCst);
            Ok(())
        });
        if let Some(p) = prev {
            g.edge(p, x);
        }
        prev = Some(x);
    }
    let r = ran.clone();
    let sink = g.node("sink", move |_| {
        r.fetch_add(1, Ordering::SeqCst);
        Ok(n)
    });
    g.edge(prev.unwrap(), sink);
    (g.build().unwrap(), sink)
}

#[test]
fn dropping_the_pool_with_other_threads_graphs_in_flight_finishes_them() {
    common::with_deadline(60, "drop_in_flight", || {
        let pool = Arc::new(pool("dropper", 2));
        let ran = Arc::new(AtomicUsize::new(0));
        let (tx, rx) = mpsc::channel();
        let submitters: Vec<_> = (0..8)
            .map(|_| {
                let pool = pool.clone();
                let ran = ran.clone();
                let tx = tx.clone();
                std::thread::spawn(move || {
                    for _ in 0..4 {
                        let (g, sink) = slow_chain(20, &ran);
                        tx.send((pool.submit(&g).unwrap(), sink)).unwrap();
                    }
                })
            })
            .collect();
        drop(tx);
        for s in submitters {
            s.join().unwrap();
        }
        // The last reference: `Drop` finishes every graph (32 × 20 nodes) and joins.
        drop(pool);
        assert_eq!(ran.load(Ordering::SeqCst), 8 * 4 * 20);
        // Other threads still hold the handles; every one has its result.
        let waiters: Vec<_> = rx
            .into_iter()
            .map(|(h, sink)| std::thread::spawn(move || *h.wait().unwrap().get(sink).unwrap()))
            .collect();
        for w in waiters {
            assert_eq!(w.join().unwrap(), 20);
        }
    });
}

#[test]
fn cancelling_shutdown_while_threads_submit_and_wait_hangs_nobody() {
    common::with_deadline(60, "cancel_while_submitting", || {
        let pool = Arc::new(pool("canceller", 2));
        let ran = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let submitters: Vec<_> = (0..8)
            .map(|_| {
                let pool = pool.clone();
                let ran = ran.clone();
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let (mut ok, mut cancelled) = (0, 0);
                    while !stop.load(Ordering::SeqCst) {
                        let (g, sink) = slow_chain(10, &ran);
                        match pool.submit(&g) {
                            Ok(h) => match h.wait() {
                                Ok(out) => {
                                    assert_eq!(out.get(sink), Some(&10));
                                    ok += 1;
                                }
                                Err(e) => {
                                    assert_eq!(e.kind(), ErrorKind::Cancelled, "{e}");
                                    cancelled += 1;
                                }
                            },
                            Err(e) => {
                                assert_eq!(e.kind(), ErrorKind::ShutDown, "{e}");
                                assert!(e.to_string().contains("canceller"), "{e}");
                                break;
                            }
                        }
                    }
                    (ok, cancelled)
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(100));
        pool.shutdown(ShutdownMode::Cancel);
        stop.store(true, Ordering::SeqCst);
        let mut total = 0;
        for s in submitters {
            let (ok, cancelled) = s.join().unwrap();
            total += ok + cancelled;
        }
        assert!(total > 0);
        assert_eq!(pool.graphs_in_flight(), 0);
    });
}

/// Counts live values: +1 when made, −1 when dropped.
struct Live(Arc<AtomicUsize>);

impl Live {
    fn new(c: &Arc<AtomicUsize>) -> Self {
        c.fetch_add(1, Ordering::SeqCst);
        Live(c.clone())
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

#[test]
fn a_handle_dropped_without_waiting_leaks_nothing() {
    common::with_deadline(60, "dropped_handle", || {
        let pool = pool("leaks", 2);
        let bodies = Arc::new(AtomicUsize::new(0));
        let outputs = Arc::new(AtomicUsize::new(0));
        for round in 0..50 {
            let mut g = GraphBuilder::<()>::new("leaky");
            let mut prev = None;
            for i in 0..20 {
                let body = Live::new(&bodies);
                let out = outputs.clone();
                let n = g.node(format!("n{i}"), move |_| {
                    let _keep = &body;
                    if round % 5 == 4 && i == 10 {
                        return Err::<Live, BoxError>("injected".into());
                    }
                    Ok(Live::new(&out))
                });
                if let Some(p) = prev {
                    g.edge(p, n);
                }
                prev = Some(n);
            }
            let graph = g.build().unwrap();
            drop(pool.submit(&graph).unwrap());
            drop(graph);
        }
        // Every run ends on its own; then nothing of it is left: no run in the table, no body,
        // no output (each node's value was never claimed).
        let start = Instant::now();
        while pool.graphs_in_flight() != 0
            || bodies.load(Ordering::SeqCst) != 0
            || outputs.load(Ordering::SeqCst) != 0
        {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "still held after 30 s: {} run(s), {} bodies, {} outputs",
                pool.graphs_in_flight(),
                bodies.load(Ordering::SeqCst),
                outputs.load(Ordering::SeqCst)
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        let stats = pool.stats();
        assert_eq!(stats.graphs_submitted, 50);
        assert_eq!(stats.graphs_completed + stats.graphs_failed, 50);
        assert_eq!(stats.graphs_failed, 10);
    });
}

/// A one-node graph that waits for `gate`, then returns 7.
fn gated(gate: &Arc<AtomicBool>) -> (Graph, NodeRef<u32>) {
    let mut g = GraphBuilder::<()>::new("gated");
    let gate = gate.clone();
    let n = g.node("waits", move |_| {
        while !gate.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_micros(200));
        }
        Ok(7u32)
    });
    (g.build().unwrap(), n)
}

#[test]
fn wait_timeout_returns_the_handle_and_does_not_cancel() {
    common::with_deadline(60, "wait_timeout", || {
        let pool = pool("timed", 1);
        let gate = Arc::new(AtomicBool::new(false));
        let (graph, n) = gated(&gate);
        let handle = pool.submit(&graph).unwrap();
        let start = Instant::now();
        let handle = match handle.wait_timeout(Duration::from_millis(30)) {
            Ok(r) => panic!(
                "returned before the graph could finish: {:?}",
                r.map(|_| ())
            ),
            Err(h) => h,
        };
        assert!(start.elapsed() >= Duration::from_millis(30));
        assert!(!handle.is_done());
        // Still running, not cancelled: open the gate and it completes with its value.
        gate.store(true, Ordering::SeqCst);
        let out = handle
            .wait_timeout(Duration::from_secs(30))
            .expect("done within 30 s")
            .unwrap();
        assert_eq!(out.get(n), Some(&7));
        // A zero timeout only looks: polled until the graph is done, it returns the result.
        let mut h = pool.submit(&graph).unwrap();
        let out = loop {
            match h.wait_timeout(Duration::ZERO) {
                Ok(r) => break r.unwrap(),
                Err(again) => h = again,
            }
            std::thread::sleep(Duration::from_millis(1));
        };
        assert_eq!(out.get(n), Some(&7));
        assert_eq!(pool.stats().graphs_failed, 0);
    });
}

#[test]
fn a_dropped_timed_out_handle_lets_the_graph_finish() {
    common::with_deadline(60, "dropped_after_timeout", || {
        let pool = pool("timed-drop", 1);
        let gate = Arc::new(AtomicBool::new(false));
        let (graph, _) = gated(&gate);
        let h = pool.submit(&graph).unwrap();
        drop(h.wait_timeout(Duration::from_millis(5)).unwrap_err());
        gate.store(true, Ordering::SeqCst);
        let start = Instant::now();
        while pool.stats().graphs_completed != 1 {
            assert!(start.elapsed() < Duration::from_secs(30), "never finished");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(pool.stats().graphs_failed, 0);
    });
}

#[test]
fn nested_wait_timeout_runs_other_work_on_a_one_worker_pool() {
    common::with_deadline(60, "nested_wait_timeout", || {
        let pool = pool("nested-timed", 1);
        let mut g = GraphBuilder::<()>::new("outer");
        let x = g.node("submitter", |ctx| -> Result<u64, BoxError> {
            let mut inner = GraphBuilder::<()>::new("inner");
            let a = inner.node("a", |_| Ok(20u64));
            let b = inner.node("b", move |ctx| Ok(ctx.input(a)? + 1));
            inner.edge(a, b);
            let h = ctx.submit(&inner.build()?)?;
            // Only this worker can run `inner`: the timed wait must run it meanwhile.
            match h.wait_timeout(Duration::from_secs(30)) {
                Ok(r) => Ok(*r?.get(b).unwrap()),
                Err(_) => Err("the nested timed wait timed out".into()),
            }
        });
        let graph = g.build().unwrap();
        for _ in 0..50 {
            assert_eq!(pool.run(&graph).unwrap().get(x), Some(&21));
        }
    });
}

#[test]
fn nested_wait_timeout_times_out_and_keeps_working_meanwhile() {
    common::with_deadline(60, "nested_wait_timeout_expires", || {
        // Group 0 ("a", one worker) runs the waiting node; the awaited graph runs on group 1
        // ("b") and waits for a gate that only the waiting node opens, after its timeout.
        let pool = PoolBuilder::new()
            .name("two-groups")
            .groups(vec![
                GroupSpec::new("a", 1).cores(Cores::Unpinned),
                GroupSpec::new("b", 1).cores(Cores::Unpinned),
            ])
            .build()
            .unwrap();
        let (ga, gb) = (GroupId::from_index(0), GroupId::from_index(1));
        let mut g = GraphBuilder::<()>::new("outer");
        let x = g.node("waiter", move |ctx| -> Result<(bool, u32), BoxError> {
            let gate = Arc::new(AtomicBool::new(false));
            let (awaited, n) = {
                let mut inner = GraphBuilder::<()>::new("gated-on-b");
                let gate = gate.clone();
                let n = inner.node("waits", move |_| {
                    while !gate.load(Ordering::SeqCst) {
                        std::thread::sleep(Duration::from_micros(200));
                    }
                    Ok(7u32)
                });
                inner.place(n, gb);
                (inner.build()?, n)
            };
            // Other work for group "a", which only this (waiting) worker can run.
            let side_ran = Arc::new(AtomicBool::new(false));
            let side = {
                let mut s = GraphBuilder::<()>::new("side-on-a");
                let r = side_ran.clone();
                let n = s.node("side", move |_| {
                    r.store(true, Ordering::SeqCst);
                    Ok(())
                });
                s.place(n, ga);
                s.build()?
            };
            let h = ctx.submit(&awaited)?;
            let side_handle = ctx.submit(&side)?;
            let h = match h.wait_timeout(Duration::from_millis(50)) {
                Ok(_) => return Err("finished although its gate was closed".into()),
                Err(h) => h,
            };
            let helped = side_ran.load(Ordering::SeqCst);
            gate.store(true, Ordering::SeqCst);
            let out = h.wait()?;
            side_handle.wait()?;
            Ok((helped, *out.get(n).unwrap()))
        });
        g.place(x, ga);
        let graph = g.build().unwrap();
        let out = pool.run(&graph).unwrap();
        assert_eq!(out.get(x), Some(&(true, 7)));
    });
}

/// `on_done` runs once per run whether it succeeds or fails, before `wait` returns, also when
/// the handle is dropped unwaited or the hook is registered after the run has finished.
#[test]
fn on_done_runs_once_before_wait_returns_and_for_dropped_handles() {
    common::with_deadline(60, "on_done", || {
        let pool = pool("on_done", 2);
        let gate = Arc::new(AtomicBool::new(false));
        let (graph, n) = gated(&gate);
        let hooks = Arc::new(AtomicUsize::new(0));
        // Registered while the run is held at its gate: runs before `wait` returns.
        let h = pool.submit(&graph).unwrap();
        let k = hooks.clone();
        h.on_done(move || {
            k.fetch_add(1, Ordering::SeqCst);
        });
        assert_eq!(hooks.load(Ordering::SeqCst), 0, "the run is still held");
        gate.store(true, Ordering::SeqCst);
        assert_eq!(h.wait().unwrap().get(n), Some(&7));
        assert_eq!(hooks.load(Ordering::SeqCst), 1);
        // Registered after the run finished: runs at once, on this thread.
        let h = pool.submit(&graph).unwrap();
        while !h.is_done() {
            std::thread::sleep(Duration::from_micros(100));
        }
        let me = std::thread::current().id();
        let (tx, rx) = mpsc::channel();
        h.on_done(move || tx.send(std::thread::current().id()).unwrap());
        assert_eq!(rx.try_recv().ok(), Some(me));
        // A failing run, its handle dropped unwaited.
        let mut g = GraphBuilder::<()>::new("fails");
        g.node("bad", |_| Err::<(), BoxError>("injected".into()));
        let failing = g.build().unwrap();
        let (tx, rx) = mpsc::channel();
        for _ in 0..20 {
            let h = pool.submit(&failing).unwrap();
            let tx = tx.clone();
            h.on_done(move || tx.send(()).unwrap());
            drop(h);
        }
        for i in 0..20 {
            rx.recv_timeout(Duration::from_secs(10))
                .unwrap_or_else(|_| panic!("hook {i} of 20 never ran"));
        }
        assert!(rx.try_recv().is_err(), "each hook runs once");
    });
}

/// A waiter that watches before parking (`wait_spin`) still gets every result, and a timed wait
/// still ends at its deadline when the spin is longer.
#[test]
fn wait_spin_waits_for_results_and_keeps_deadlines() {
    common::with_deadline(60, "wait_spin", || {
        let pool = PoolBuilder::new()
            .name("spin")
            .workers(2)
            .cores(Cores::Unpinned)
            .wait_spin(Duration::from_secs(2))
            .build()
            .unwrap();
        let ran = Arc::new(AtomicUsize::new(0));
        let (graph, sink) = slow_chain(4, &ran);
        for _ in 0..20 {
            assert_eq!(
                pool.submit(&graph).unwrap().wait().unwrap().get(sink),
                Some(&4)
            );
        }
        let gate = Arc::new(AtomicBool::new(false));
        let (held, n) = gated(&gate);
        let h = pool.submit(&held).unwrap();
        let t = Instant::now();
        let h = h
            .wait_timeout(Duration::from_millis(5))
            .expect_err("the gated graph is still running");
        assert!(
            t.elapsed() < Duration::from_secs(1),
            "the 5 ms deadline, not the 2 s spin, ended the wait: {:?}",
            t.elapsed()
        );
        gate.store(true, Ordering::SeqCst);
        assert_eq!(h.wait().unwrap().get(n), Some(&7));
    });
}

/// A done hook that panics neither loses the run's result nor takes a worker down.
#[test]
fn a_panicking_done_hook_loses_nothing() {
    common::with_deadline(60, "on_done_panic", || {
        let pool = pool("hook_panic", 1);
        let gate = Arc::new(AtomicBool::new(false));
        let (graph, n) = gated(&gate);
        for _ in 0..5 {
            let h = pool.submit(&graph).unwrap();
            h.on_done(|| panic!("a hook that panics"));
            gate.store(true, Ordering::SeqCst);
            assert_eq!(h.wait().unwrap().get(n), Some(&7));
            gate.store(false, Ordering::SeqCst);
        }
        assert_eq!(pool.stats().graphs_completed, 5);
    });
}
