//! External completion (`NodeCtxExt::complete_later`): a node's completion handed to a
//! `Completer` that any thread calls, before or after the body returns; dropped, failed,
//! racing a failed or cancelled run, and outstanding at a pool's shutdown.

#[allow(dead_code)]
mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::Duration;

use boundpool_scheduler::backend::{Completer, NodeCtxExt, PoolBuilderExt};
use boundpool_scheduler::{Cores, ErrorKind, GraphBuilder, GroupSpec, PoolBuilder, ShutdownMode};

/// A graph `a -> b`: `a` sends its completer down `tx` and returns 41 (setting `returned`
/// last); `b` checks that `a`'s body had returned and reads its output.
fn handed_pair(
    tx: mpsc::Sender<Completer>,
    returned: Arc<AtomicBool>,
    b_ran: Arc<AtomicUsize>,
    delay_return: Duration,
) -> (
    boundpool_scheduler::Graph,
    boundpool_scheduler::NodeRef<u32>,
) {
    let tx = Mutex::new(tx);
    let mut g = GraphBuilder::new("handed");
    let r = returned.clone();
    let a = g.node("a", move |ctx| {
        tx.lock().unwrap().send(ctx.complete_later()).unwrap();
        thread::sleep(delay_return);
        r.store(true, Ordering::SeqCst);
        Ok(41u32)
    });
    let b = g.node("b", move |ctx| {
        assert!(
            returned.load(Ordering::SeqCst),
            "b ran before a's body returned"
        );
        b_ran.fetch_add(1, Ordering::SeqCst);
        Ok(ctx.input(a)? + 1)
    });
    g.edge(a, b);
    (g.build().unwrap(), b)
}

#[test]
fn completed_from_a_foreign_thread_after_the_body_returned() {
    common::with_deadline(30, "after", || {
        let pool = common::pool("after", 2);
        let (tx, rx) = mpsc::channel();
        let (returned, b_ran) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicUsize::new(0)),
        );
        let (graph, b) = handed_pair(tx, returned.clone(), b_ran.clone(), Duration::ZERO);
        for run in 0..20 {
            returned.store(false, Ordering::SeqCst);
            let h = pool.submit(&graph).unwrap();
            let c = rx.recv().unwrap();
            // Let the body return and the workers run dry and park: nothing polls for `a`.
            assert!(common::eventually(10, || returned.load(Ordering::SeqCst)));
            if run == 0 {
                thread::sleep(Duration::from_millis(30));
                assert_eq!(b_ran.load(Ordering::SeqCst), 0, "b waits for the completer");
            }
            let caller = thread::spawn(move || c.complete(Ok(())));
            let out = h.wait().unwrap();
            caller.join().unwrap();
            assert_eq!(out.get(b), Some(&42));
        }
        assert_eq!(b_ran.load(Ordering::SeqCst), 20);
    });
}

#[test]
fn completed_before_the_body_returned() {
    common::with_deadline(30, "before", || {
        let pool = common::pool("before", 2);
        let (tx, rx) = mpsc::channel::<Completer>();
        // The completing thread calls as soon as it gets the completer; the body returns 20 ms
        // later: the successor still waits for the body.
        let caller = thread::spawn(move || {
            for c in rx {
                c.complete(Ok(()));
            }
        });
        let (returned, b_ran) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicUsize::new(0)),
        );
        let (graph, b) = handed_pair(
            tx,
            returned.clone(),
            b_ran.clone(),
            Duration::from_millis(20),
        );
        for _ in 0..5 {
            returned.store(false, Ordering::SeqCst);
            assert_eq!(pool.run(&graph).unwrap().get(b), Some(&42));
        }
        assert_eq!(b_ran.load(Ordering::SeqCst), 5);
        drop(graph);
        caller.join().unwrap();
    });
}

#[test]
fn completed_by_the_body_itself() {
    common::with_deadline(30, "itself", || {
        let pool = common::pool("itself", 1);
        let mut g = GraphBuilder::new("itself");
        let a = g.node("a", |ctx| {
            ctx.complete_later().complete(Ok(()));
            Ok(1u32)
        });
        let b = g.node("b", move |ctx| Ok(ctx.input(a)? + 1));
        g.edge(a, b);
        assert_eq!(pool.run(&g.build().unwrap()).unwrap().get(b), Some(&2));
    });
}

/// Runs `a -> b` where `a`'s completer goes to `finish`, on its own thread, after `a`'s body
/// returned; returns the graph's error.
fn failed_by(finish: impl FnOnce(Completer) + Send + 'static) -> boundpool_scheduler::Error {
    let pool = common::pool("fails", 2);
    let (tx, rx) = mpsc::channel();
    let (returned, b_ran) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicUsize::new(0)),
    );
    let (graph, _) = handed_pair(tx, returned.clone(), b_ran.clone(), Duration::ZERO);
    let h = pool.submit(&graph).unwrap();
    let c = rx.recv().unwrap();
    assert!(common::eventually(10, || returned.load(Ordering::SeqCst)));
    thread::spawn(move || finish(c)).join().unwrap();
    let e = h.wait().unwrap_err();
    assert_eq!(b_ran.load(Ordering::SeqCst), 0, "b never runs");
    assert_eq!(e.cancelled_nodes(), 1);
    e
}

#[test]
fn a_completer_dropped_uncalled_fails_its_node() {
    common::with_deadline(30, "dropped", || {
        let e = failed_by(drop);
        assert_eq!(e.kind(), ErrorKind::NodeFailed);
        assert_eq!(
            e.to_string(),
            "node 'a' (#0) of graph 'handed' failed: its Completer was dropped without \
             completing (1 node(s) cancelled)"
        );
    });
}

#[test]
fn a_completer_dropped_before_the_body_returned_fails_its_node() {
    common::with_deadline(30, "dropped-early", || {
        let pool = common::pool("dropped-early", 1);
        let mut g = GraphBuilder::new("early");
        let a = g.node("a", |ctx| {
            drop(ctx.complete_later());
            Ok(1u32)
        });
        let b = g.node("b", move |ctx| Ok(ctx.input(a)? + 1));
        g.edge(a, b);
        let e = pool.run(&g.build().unwrap()).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NodeFailed);
        assert!(
            e.to_string()
                .starts_with("node 'a' (#0) of graph 'early' failed: its Completer was dropped"),
            "{e}"
        );
    });
}

#[test]
fn a_completer_called_with_an_error_fails_its_node() {
    common::with_deadline(30, "error", || {
        let e = failed_by(|c| c.complete(Err("the peer went away".into())));
        assert_eq!(e.kind(), ErrorKind::NodeFailed);
        assert!(
            e.to_string()
                .starts_with("node 'a' (#0) of graph 'handed' failed: the peer went away"),
            "{e}"
        );
        assert_eq!(
            std::error::Error::source(&e).unwrap().to_string(),
            "the peer went away"
        );
    });
}

#[test]
fn a_failing_body_completes_its_node_at_once_and_the_call_does_nothing() {
    common::with_deadline(30, "body-fails", || {
        let pool = common::pool("body-fails", 2);
        for panics in [false, true] {
            let (tx, rx) = mpsc::channel::<Completer>();
            let tx = Mutex::new(tx);
            let mut g = GraphBuilder::new("bad body");
            let a = g.node("a", move |ctx| {
                tx.lock().unwrap().send(ctx.complete_later()).unwrap();
                if panics {
                    panic!("after complete_later");
                }
                Err::<u32, _>("the body failed".into())
            });
            let b = g.node("b", move |ctx| Ok(ctx.input(a)? + 1));
            g.edge(a, b);
            // The run ends without the completer: it is still held here.
            let e = pool.run(&g.build().unwrap()).unwrap_err();
            let c = rx.recv().unwrap();
            let kind = if panics {
                ErrorKind::NodePanicked
            } else {
                ErrorKind::NodeFailed
            };
            assert_eq!(e.kind(), kind, "{e}");
            assert_eq!(e.cancelled_nodes(), 1);
            c.complete(Ok(()));
        }
        // The pool is intact.
        let mut g = GraphBuilder::new("after");
        let x = g.node("x", |_| Ok(3u8));
        assert_eq!(pool.run(&g.build().unwrap()).unwrap().get(x), Some(&3));
    });
}

#[test]
fn a_failed_run_waits_for_an_outstanding_completer_then_cancels_its_successors() {
    common::with_deadline(30, "failed-run", || {
        let pool = common::pool("failed-run", 2);
        let (tx, rx) = mpsc::channel::<Completer>();
        let tx = Mutex::new(tx);
        let mut g = GraphBuilder::new("race");
        let a = g.node("a", move |ctx| {
            tx.lock().unwrap().send(ctx.complete_later()).unwrap();
            Ok(1u32)
        });
        let after = Arc::new(AtomicUsize::new(0));
        let af = after.clone();
        let b = g.node("b", move |ctx| {
            af.fetch_add(1, Ordering::SeqCst);
            Ok(ctx.input(a)? + 1)
        });
        g.edge(a, b);
        g.node("bad", |_| Err::<(), _>("boom".into()));
        let graph = g.build().unwrap();
        for call_ok in [true, false] {
            let h = pool.submit(&graph).unwrap();
            let c = rx.recv().unwrap();
            // `bad` failed the run, which cannot end while `a`'s completer is out.
            let h = match h.wait_timeout(Duration::from_millis(50)) {
                Ok(r) => panic!("the run ended with a completer outstanding: {r:?}"),
                Err(h) => h,
            };
            c.complete(if call_ok { Ok(()) } else { Err("late".into()) });
            let e = h.wait().unwrap_err();
            assert_eq!(e.kind(), ErrorKind::NodeFailed);
            assert!(e.to_string().starts_with("node 'bad' (#2)"), "{e}");
            assert_eq!(e.cancelled_nodes(), 1, "b is cancelled");
        }
        assert_eq!(after.load(Ordering::SeqCst), 0);
    });
}

#[test]
fn shutdown_waits_for_an_outstanding_completer() {
    common::with_deadline(30, "shutdown", || {
        for mode in [ShutdownMode::Finish, ShutdownMode::Cancel] {
            let pool = common::pool("shutdown", 2);
            let (tx, rx) = mpsc::channel();
            let (returned, b_ran) = (
                Arc::new(AtomicBool::new(false)),
                Arc::new(AtomicUsize::new(0)),
            );
            let (graph, b) = handed_pair(tx, returned.clone(), b_ran.clone(), Duration::ZERO);
            let h = pool.submit(&graph).unwrap();
            let c = rx.recv().unwrap();
            assert!(common::eventually(10, || returned.load(Ordering::SeqCst)));
            let called = Arc::new(AtomicBool::new(false));
            let cl = called.clone();
            let caller = thread::spawn(move || {
                thread::sleep(Duration::from_millis(50));
                cl.store(true, Ordering::SeqCst);
                c.complete(Ok(()));
            });
            pool.shutdown(mode);
            assert!(
                called.load(Ordering::SeqCst),
                "shutdown returned before the call"
            );
            caller.join().unwrap();
            let res = h.wait();
            match mode {
                ShutdownMode::Finish => assert_eq!(res.unwrap().get(b), Some(&42)),
                _ => {
                    let e = res.unwrap_err();
                    assert_eq!(e.kind(), ErrorKind::Cancelled, "{e}");
                    assert_eq!(b_ran.load(Ordering::SeqCst), 0);
                }
            }
            drop(graph);
        }
        // A pool dropped with a completer out waits for it, then finishes the graph.
        let pool = common::pool("drop", 1);
        let (tx, rx) = mpsc::channel();
        let (returned, b_ran) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicUsize::new(0)),
        );
        let (graph, _) = handed_pair(tx, returned.clone(), b_ran.clone(), Duration::ZERO);
        let h = pool.submit(&graph).unwrap();
        let c = rx.recv().unwrap();
        let caller = thread::spawn(move || {
            thread::sleep(Duration::from_millis(30));
            c.complete(Ok(()));
        });
        drop(pool);
        assert_eq!(
            b_ran.load(Ordering::SeqCst),
            1,
            "the pool's drop finished the graph"
        );
        caller.join().unwrap();
        assert!(h.wait().is_ok());
    });
}

#[test]
fn the_completion_runs_on_a_worker_of_the_nodes_group() {
    common::with_deadline(30, "group", || {
        let pool = PoolBuilder::new()
            .name("groups")
            .groups(vec![
                GroupSpec::new("left", 1).cores(Cores::Unpinned),
                GroupSpec::new("right", 1).cores(Cores::Unpinned),
            ])
            .build()
            .unwrap();
        let right = pool.group("right").unwrap();
        let (tx, rx) = mpsc::channel::<Completer>();
        let tx = Mutex::new(tx);
        let mut g = GraphBuilder::new("placed");
        let a = g.node("a", move |ctx| {
            tx.lock().unwrap().send(ctx.complete_later()).unwrap();
            Ok(ctx.worker_info().group_name.clone())
        });
        g.place(a, right);
        // `b` follows `a` as its chain continuation, on the worker that completes `a`.
        let b = g.node("b", move |ctx| {
            Ok((ctx.input(a)?.clone(), ctx.worker_info().group_name.clone()))
        });
        g.edge(a, b);
        g.place(b, right);
        let graph = g.build().unwrap();
        for _ in 0..10 {
            let h = pool.submit(&graph).unwrap();
            let c = rx.recv().unwrap();
            thread::spawn(move || c.complete(Ok(()))).join().unwrap();
            let out = h.wait().unwrap();
            assert_eq!(
                out.get(b),
                Some(&("right".to_string(), "right".to_string()))
            );
        }
    });
}

/// Completers taken and called by a pool's spin hook (as a network's arrivals would be, on a
/// worker that spins anyway): the hook runs on a spinning worker, a completion for the
/// hook's own group runs on that very worker (queued without a wake-up: nothing else would
/// take it), and one for the other group wakes that group's worker; every run ends.
#[test]
fn completers_called_in_the_spin_hook_complete_here_or_wake_the_nodes_group() {
    common::with_deadline(60, "spin hook", || {
        let slot: Arc<Mutex<Vec<Completer>>> = Arc::new(Mutex::new(Vec::new()));
        let hook_slot = slot.clone();
        let called_on: Arc<Mutex<Vec<(String, thread::ThreadId)>>> = Arc::default();
        let called = called_on.clone();
        let pool = PoolBuilder::new()
            .name("spinhook")
            .groups(vec![
                GroupSpec::new("net", 1).cores(Cores::Unpinned),
                GroupSpec::new("other", 1).cores(Cores::Unpinned),
            ])
            .idle_spin(Duration::from_millis(200))
            .spin_hook(move |info, _| {
                // Only the "net" group's worker makes progress (one network driver).
                if info.group_name != "net" {
                    return false;
                }
                let Some(c) = hook_slot.lock().unwrap().pop() else {
                    return false;
                };
                called
                    .lock()
                    .unwrap()
                    .push((info.group_name.clone(), thread::current().id()));
                c.complete(Ok(()));
                true
            })
            .build()
            .unwrap();
        for target in ["net", "other"] {
            let group = pool.group(target).unwrap();
            let tx = slot.clone();
            let mut g = GraphBuilder::new("spun");
            let a = g.node("a", move |ctx| {
                tx.lock().unwrap().push(ctx.complete_later());
                Ok(7u32)
            });
            g.place(a, group);
            let b = g.node("b", move |ctx| {
                Ok((
                    *ctx.input(a)?,
                    ctx.worker_info().group_name.clone(),
                    thread::current().id(),
                ))
            });
            g.edge(a, b);
            g.place(b, group);
            let graph = g.build().unwrap();
            for _ in 0..30 {
                called_on.lock().unwrap().clear();
                let out = pool.run(&graph).unwrap();
                let (v, ran_in, ran_on) = out.get(b).unwrap().clone();
                assert_eq!((v, ran_in.as_str()), (7, target));
                let calls = called_on.lock().unwrap().clone();
                assert_eq!(calls.len(), 1, "the hook called the completer once");
                if target == "net" {
                    assert_eq!(calls[0].1, ran_on, "the successor ran on the hook's worker");
                } else {
                    assert_ne!(calls[0].1, ran_on, "the other group's worker ran it");
                }
            }
        }
    });
}

#[test]
fn many_completions_from_another_thread_release_every_successor_once() {
    common::with_deadline(60, "many", || {
        let pool = common::pool("many", 2);
        let (tx, rx) = mpsc::channel::<Completer>();
        let tx = Mutex::new(tx);
        let n = if cfg!(miri) { 20 } else { 2000 };
        let ran = Arc::new(AtomicUsize::new(0));
        let mut g = GraphBuilder::new("many");
        let mut sinks = Vec::new();
        for i in 0..n {
            let tx = tx.lock().unwrap().clone();
            let a = g.node(format!("recv {i}"), move |ctx| {
                tx.send(ctx.complete_later()).unwrap();
                Ok(i as u64)
            });
            let r = ran.clone();
            let b = g.node(format!("use {i}"), move |ctx| {
                r.fetch_add(1, Ordering::SeqCst);
                Ok(ctx.input(a)? * 2)
            });
            g.edge(a, b);
            sinks.push(b);
        }
        drop(tx);
        let graph = g.build().unwrap();
        // The completing thread calls them in bursts of up to 64, each in reverse order of
        // arrival (a burst ends early when no completer comes for 2 ms).
        let caller = thread::spawn(move || {
            let mut held: Vec<Completer> = Vec::new();
            loop {
                let next = rx.recv_timeout(Duration::from_millis(2));
                let closed = matches!(next, Err(mpsc::RecvTimeoutError::Disconnected));
                if let Ok(c) = next {
                    held.push(c);
                    if held.len() < 64 {
                        continue;
                    }
                }
                while let Some(c) = held.pop() {
                    c.complete(Ok(()));
                }
                if closed {
                    break;
                }
            }
        });
        for run in 0..3 {
            let h = pool.submit(&graph).unwrap();
            if run == 2 {
                // Drop the graph's own copy of the senders: the caller ends after this run.
                drop(graph);
                let out = h.wait().unwrap();
                for (i, b) in sinks.iter().enumerate() {
                    assert_eq!(out.get(*b), Some(&(2 * i as u64)));
                }
                break;
            }
            let out = h.wait().unwrap();
            assert_eq!(out.get(sinks[n - 1]), Some(&(2 * (n as u64 - 1))));
        }
        caller.join().unwrap();
        assert_eq!(ran.load(Ordering::SeqCst), 3 * n);
    });
}

#[test]
fn a_nested_wait_keeps_the_bodys_completer_for_it() {
    common::with_deadline(30, "nested", || {
        let pool = Arc::new(common::pool("nested", 1));
        let (tx, rx) = mpsc::channel::<Completer>();
        let tx = Mutex::new(tx);
        let mut inner = GraphBuilder::new("inner");
        inner.node("x", |_| Ok(()));
        let inner = Arc::new(inner.build().unwrap());
        let mut g = GraphBuilder::new("outer");
        let a = g.node("a", move |ctx| {
            tx.lock().unwrap().send(ctx.complete_later()).unwrap();
            // The one worker runs `x` while this body waits.
            ctx.submit(&inner)?.wait()?;
            Ok(5u32)
        });
        let b = g.node("b", move |ctx| Ok(ctx.input(a)? + 1));
        g.edge(a, b);
        let graph = g.build().unwrap();
        let h = pool.submit(&graph).unwrap();
        rx.recv().unwrap().complete(Ok(()));
        assert_eq!(h.wait().unwrap().get(b), Some(&6));
    });
}

#[test]
fn deferring_twice_fails_the_node_naming_it() {
    common::with_deadline(30, "twice", || {
        let pool = common::pool("twice", 1);
        for mixed in [false, true] {
            let mut g = GraphBuilder::new("twice");
            g.node("a", move |ctx| {
                let c = ctx.complete_later();
                if mixed {
                    ctx.complete_when(|_| std::task::Poll::Ready(Ok(())));
                } else {
                    let _second = ctx.complete_later();
                }
                c.complete(Ok(()));
                Ok(())
            });
            let e = pool.run(&g.build().unwrap()).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::NodePanicked);
            let second = if mixed {
                "complete_when"
            } else {
                "complete_later"
            };
            assert!(
                e.to_string().starts_with(&format!(
                    "node 'a' (#0) of graph 'twice' panicked: node 'a' (#0) of graph 'twice' \
                     called {second} after complete_later"
                )),
                "{e}"
            );
        }
    });
}
