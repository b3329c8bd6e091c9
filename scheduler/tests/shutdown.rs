//! Shutdown: dropping the pool finishes submitted graphs; `ShutdownMode::Cancel` cancels them;
//! submitting afterwards is an error; shutting down from inside a node does not deadlock; stop
//! hooks run once per worker, on that worker.

#[allow(dead_code)]
mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use boundpool_scheduler::{Cores, ErrorKind, Graph, GraphBuilder, PoolBuilder, ShutdownMode};
use common::pool;

/// A chain of `n` nodes, each sleeping `us` microseconds and counting its run in `ran`.
fn slow_chain(n: usize, us: u64, ran: &Arc<AtomicUsize>) -> Graph {
    let mut g = GraphBuilder::<()>::new("slow");
    let mut prev = None;
    for i in 0..n {
        let r = ran.clone();
        let x = g.node(format!("s{i}"), move |_| {
            std::thread::sleep(Duration::from_micros(us));
            r.fetch_add(1, Ordering::SeqCst);
            Ok(())
        });
        if let Some(p) = prev {
            g.edge(p, x);
        }
        prev = Some(x);
    }
    g.build().unwrap()
}

#[test]
fn drop_finishes_submitted_graphs() {
    common::with_deadline(60, "drop_finishes", || {
        for workers in [1, 2] {
            let pool = pool("dropper", workers);
            let ran = Arc::new(AtomicUsize::new(0));
            let graph = slow_chain(10, 300, &ran);
            let handles: Vec<_> = (0..20).map(|_| pool.submit(&graph).unwrap()).collect();
            assert!(
                handles.iter().any(|h| !h.is_done()),
                "the graphs should still be running when the pool is dropped"
            );
            drop(pool);
            assert_eq!(
                ran.load(Ordering::SeqCst),
                200,
                "dropping the pool finished every graph"
            );
            for h in handles {
                assert!(h.is_done());
                h.wait().expect("a graph finished by drop completes Ok");
            }
        }
    });
}

#[test]
fn shutdown_finish_is_explicit_drop() {
    common::with_deadline(30, "shutdown_finish", || {
        let pool = pool("finisher", 2);
        let ran = Arc::new(AtomicUsize::new(0));
        let graph = slow_chain(5, 200, &ran);
        let handles: Vec<_> = (0..10).map(|_| pool.submit(&graph).unwrap()).collect();
        pool.shutdown(ShutdownMode::Finish);
        assert_eq!(ran.load(Ordering::SeqCst), 50);
        for h in handles {
            h.wait().unwrap();
        }
        // Idempotent, and submit is refused from now on.
        pool.shutdown(ShutdownMode::Finish);
        pool.shutdown(ShutdownMode::Cancel);
        let err = pool.submit(&graph).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ShutDown);
        assert!(
            err.to_string().contains("finisher") && err.to_string().contains("slow"),
            "{err}"
        );
        assert_eq!(pool.run(&graph).unwrap_err().kind(), ErrorKind::ShutDown);
        assert_eq!(ran.load(Ordering::SeqCst), 50);
    });
}

#[test]
fn shutdown_cancel_cancels_pending_graphs() {
    common::with_deadline(30, "shutdown_cancel", || {
        let pool = Arc::new(pool("canceller", 1));
        // Graph 1: `blocker` holds the only worker until released; `tail` follows it.
        let release = Arc::new(AtomicBool::new(false));
        let started = Arc::new(AtomicBool::new(false));
        let tail_ran = Arc::new(AtomicUsize::new(0));
        let mut g = GraphBuilder::<()>::new("blocked");
        let (rel, st) = (release.clone(), started.clone());
        let blocker = g.node("blocker", move |_| {
            st.store(true, Ordering::SeqCst);
            while !rel.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(1));
            }
            Ok(())
        });
        let t = tail_ran.clone();
        let tail = g.node("tail", move |_| {
            t.fetch_add(1, Ordering::SeqCst);
            Ok(())
        });
        g.edge(blocker, tail);
        let first = pool.submit(&g.build().unwrap()).unwrap();
        while !started.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
        // Graphs 2..: queued behind the blocker, never started.
        let ran = Arc::new(AtomicUsize::new(0));
        let queued_graph = slow_chain(4, 0, &ran);
        let queued: Vec<_> = (0..10)
            .map(|_| pool.submit(&queued_graph).unwrap())
            .collect();

        let p = pool.clone();
        let shutter = std::thread::spawn(move || p.shutdown(ShutdownMode::Cancel));
        // Once a submit is refused, the shutdown has begun and every running graph is failed.
        let mut probes = Vec::new();
        loop {
            match pool.submit(&queued_graph) {
                Ok(h) => probes.push(h),
                Err(e) => {
                    assert_eq!(e.kind(), ErrorKind::ShutDown);
                    break;
                }
            }
            std::thread::sleep(Duration::from_micros(100));
        }
        release.store(true, Ordering::SeqCst);
        shutter.join().unwrap();

        let err = first.wait().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Cancelled, "{err}");
        assert!(err.to_string().contains("blocked"), "{err}");
        assert_eq!(err.cancelled_nodes(), 1, "the tail never started");
        assert_eq!(tail_ran.load(Ordering::SeqCst), 0);
        for h in queued.into_iter().chain(probes) {
            let err = h.wait().unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Cancelled);
            assert_eq!(err.cancelled_nodes(), 4, "{err}");
        }
        assert_eq!(ran.load(Ordering::SeqCst), 0, "no queued node ran");
        let st = pool.stats();
        assert_eq!(st.graphs_failed, st.graphs_submitted);
        assert_eq!(
            st.nodes_cancelled as usize,
            (st.graphs_submitted as usize - 1) * 4 + 1
        );
    });
}

#[test]
fn shutdown_from_inside_a_node_does_not_deadlock() {
    common::with_deadline(30, "shutdown_inside", || {
        for mode in [ShutdownMode::Finish, ShutdownMode::Cancel] {
            for workers in [1, 2] {
                let pool = Arc::new(pool("inside", workers));
                let weak = Arc::downgrade(&pool);
                let after = Arc::new(AtomicUsize::new(0));
                let mut g = GraphBuilder::<()>::new("self-stop");
                let a = g.node("stopper", move |_| {
                    weak.upgrade().expect("pool alive").shutdown(mode);
                    Ok(())
                });
                let af = after.clone();
                let b = g.node("after", move |_| {
                    af.fetch_add(1, Ordering::SeqCst);
                    Ok(())
                });
                g.edge(a, b);
                let res = pool.run(&g.build().unwrap());
                match mode {
                    ShutdownMode::Finish => {
                        res.unwrap();
                        assert_eq!(after.load(Ordering::SeqCst), 1);
                    }
                    ShutdownMode::Cancel => {
                        let err = res.unwrap_err();
                        assert_eq!(err.kind(), ErrorKind::Cancelled);
                        assert_eq!(err.cancelled_nodes(), 1);
                        assert_eq!(after.load(Ordering::SeqCst), 0);
                    }
                }
                let ran = Arc::new(AtomicUsize::new(0));
                assert_eq!(
                    pool.submit(&slow_chain(1, 0, &ran)).unwrap_err().kind(),
                    ErrorKind::ShutDown
                );
                // Dropping (and joining) afterwards from outside is fine too.
                drop(pool);
            }
        }
    });
}

#[test]
fn stop_hooks_run_once_per_worker_on_the_worker() {
    common::with_deadline(30, "stop_hooks", || {
        let log: Arc<Mutex<Vec<(usize, bool, bool)>>> = Arc::new(Mutex::new(Vec::new()));
        let l = log.clone();
        let pool = PoolBuilder::new()
            .name("hooks")
            .workers(3)
            .cores(Cores::Unpinned)
            .start_hook(|info| Ok((info.index, std::thread::current().id())))
            .stop_hook(move |info, (index, tid)| {
                let me = std::thread::current();
                l.lock().unwrap().push((
                    index,
                    tid == me.id() && index == info.index,
                    me.name() == Some(&*info.name),
                ));
            })
            .build()
            .unwrap();
        let mut g = GraphBuilder::<(usize, std::thread::ThreadId)>::new("uses-state");
        let n = g.node("n", |ctx| {
            Ok(ctx.worker_state().0 == ctx.worker_info().index
                && ctx.worker_state().1 == std::thread::current().id())
        });
        let graph = g.build().unwrap();
        for _ in 0..20 {
            assert_eq!(pool.run(&graph).unwrap().get(n), Some(&true));
        }
        assert!(
            log.lock().unwrap().is_empty(),
            "no stop hook before shutdown"
        );
        pool.shutdown(ShutdownMode::Finish);
        let mut got = log.lock().unwrap().clone();
        got.sort();
        assert_eq!(got, vec![(0, true, true), (1, true, true), (2, true, true)]);
        drop(pool);
        assert_eq!(
            log.lock().unwrap().len(),
            3,
            "dropping after shutdown runs no hook again"
        );
    });
}

#[test]
fn pool_threads_exit_after_drop() {
    common::with_deadline(30, "threads_exit", || {
        let pool = pool("exiting7", 3);
        assert_eq!(common::threads_named("exiting7-"), 3);
        drop(pool);
        assert!(
            common::eventually(2, || common::threads_named("exiting7-") == 0),
            "the workers are joined by drop"
        );
    });
}
