//! The GPU backend's hooks into the scheduler: deferred completions (`NodeCtx::complete_when`)
//! and completion markers (`NodeCtx::set_marker`, `Inputs::predecessor_markers`).

#[allow(dead_code)]
mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use boundpool_scheduler::backend::{InputsExt, NodeCtxExt};
use boundpool_scheduler::{
    BoxError, Cores, ErrorKind, GraphBuilder, NodeRef, PoolBuilder, Priority,
};

#[test]
fn deferred_completion_holds_successors_back() {
    common::with_deadline(30, "deferred", || {
        let pool = PoolBuilder::new()
            .name("defer")
            .workers(1)
            .cores(Cores::Unpinned)
            .build()
            .unwrap();
        let gate = Arc::new(AtomicBool::new(false));
        let polls = Arc::new(AtomicUsize::new(0));
        let after_ran_early = Arc::new(AtomicBool::new(false));
        let mut g = GraphBuilder::<()>::new("deferred");
        let (gt, pl) = (gate.clone(), polls.clone());
        let a = g.node("waits-for-device", move |ctx| {
            let (gt, pl) = (gt.clone(), pl.clone());
            ctx.complete_when(move |_state| {
                pl.fetch_add(1, Ordering::SeqCst);
                if gt.load(Ordering::SeqCst) {
                    Poll::Ready(Ok(()))
                } else {
                    Poll::Pending
                }
            });
            Ok(41u32)
        });
        let (gt, early) = (gate.clone(), after_ran_early.clone());
        let b = g.node("after", move |ctx| {
            if !gt.load(Ordering::SeqCst) {
                early.store(true, Ordering::SeqCst);
            }
            Ok(ctx.input(a)? + 1)
        });
        g.edge(a, b);
        // An independent node: the one worker runs it while `a` is pending.
        let other_ran = Arc::new(AtomicBool::new(false));
        let o = other_ran.clone();
        g.node("independent", move |_| {
            o.store(true, Ordering::SeqCst);
            Ok(())
        });
        let graph = g.build().unwrap();
        let h = pool.submit(&graph).unwrap();
        assert!(
            common::eventually(10, || polls.load(Ordering::SeqCst) >= 3),
            "the worker polls the deferred completion"
        );
        assert!(
            common::eventually(10, || other_ran.load(Ordering::SeqCst)),
            "the worker runs other nodes meanwhile"
        );
        assert!(!h.is_done());
        gate.store(true, Ordering::SeqCst);
        let out = h.wait().unwrap();
        assert_eq!(out.get(b), Some(&42));
        assert!(
            !after_ran_early.load(Ordering::SeqCst),
            "a successor ran before the deferred completion"
        );
        // The pool stays usable and stops cleanly with nothing deferred.
        drop(pool);
    });
}

#[test]
fn deferred_completion_error_fails_the_graph() {
    common::with_deadline(30, "deferred_error", || {
        let pool = PoolBuilder::new()
            .name("deferr")
            .workers(2)
            .cores(Cores::Unpinned)
            .build()
            .unwrap();
        let ran_after = Arc::new(AtomicUsize::new(0));
        let mut g = GraphBuilder::<()>::new("deferred-fails");
        let a = g.node("device-op", |ctx| {
            let mut n = 0;
            ctx.complete_when(move |_| -> Poll<Result<(), BoxError>> {
                n += 1;
                if n < 5 {
                    Poll::Pending
                } else {
                    Poll::Ready(Err("sticky device error".into()))
                }
            });
            Ok(())
        });
        let r = ran_after.clone();
        let b = g.node("after", move |_| {
            r.fetch_add(1, Ordering::SeqCst);
            Ok(())
        });
        g.edge(a, b);
        let err = pool.run(&g.build().unwrap()).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NodeFailed);
        let msg = err.to_string();
        assert!(
            msg.contains("device-op") && msg.contains("sticky device error"),
            "{msg}"
        );
        assert_eq!(err.cancelled_nodes(), 1);
        assert_eq!(ran_after.load(Ordering::SeqCst), 0);

        // A panicking poll fails the graph too.
        common::quiet_worker_panics();
        let mut g = GraphBuilder::<()>::new("deferred-panics");
        g.node("panicky-poll", |ctx| {
            ctx.complete_when(|_| -> Poll<Result<(), BoxError>> { panic!("poll exploded") });
            Ok(())
        });
        let err = pool.run(&g.build().unwrap()).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NodePanicked);
        assert!(err.to_string().contains("poll exploded"), "{err}");
    });
}

#[test]
fn many_deferred_nodes_across_workers() {
    common::with_deadline(60, "many_deferred", || {
        let pool = PoolBuilder::new()
            .name("manydef")
            .workers(2)
            .cores(Cores::Unpinned)
            .build()
            .unwrap();
        let mut g = GraphBuilder::<()>::new("fan");
        // Under Miri (an interpreter) the same shape, smaller.
        let (fan, runs) = if cfg!(miri) { (8u64, 1) } else { (100, 5) };
        let leaves: Vec<NodeRef<u64>> = (0..fan)
            .map(|k| {
                g.node(format!("d{k}"), move |ctx| {
                    let deadline = std::time::Instant::now() + Duration::from_micros(200 + 10 * k);
                    ctx.complete_when(move |_| {
                        if std::time::Instant::now() >= deadline {
                            Poll::Ready(Ok(()))
                        } else {
                            Poll::Pending
                        }
                    });
                    Ok(k)
                })
            })
            .collect();
        let ls = leaves.clone();
        let sum = g.node("sum", move |ctx| {
            ls.iter()
                .try_fold(0u64, |s, &l| Ok::<_, BoxError>(s + ctx.input(l)?))
        });
        for &l in &leaves {
            g.edge(l, sum);
        }
        let graph = g.build().unwrap();
        for _ in 0..runs {
            assert_eq!(
                pool.run(&graph).unwrap().get(sum),
                Some(&(0..fan).sum::<u64>())
            );
        }
    });
}

#[test]
fn markers_reach_direct_successors_only() {
    let pool = PoolBuilder::new()
        .name("mark")
        .workers(2)
        .cores(Cores::Unpinned)
        .build()
        .unwrap();
    let mut g = GraphBuilder::<()>::new("markers");
    let a = g.node("a", |ctx| {
        ctx.set_marker(Box::new(format!("event-of-{}", ctx.node_name())));
        Ok(1u8)
    });
    let unit = g.node("unit-with-marker", |ctx| {
        ctx.set_marker(Box::new(7u32));
        Ok(())
    });
    let plain = g.node("plain", |_| Ok(()));
    let b = g.node("b", move |ctx| {
        let mut seen: Vec<String> = ctx
            .predecessor_markers()
            .map(|(id, m)| {
                if let Some(s) = m.downcast_ref::<String>() {
                    assert_eq!(id, a.id());
                    s.clone()
                } else {
                    format!("u32:{}", m.downcast_ref::<u32>().unwrap())
                }
            })
            .collect();
        seen.sort();
        assert_eq!(*ctx.input(a)?, 1, "a marker does not replace the output");
        Ok(seen)
    });
    let c = g.node("c", |ctx| Ok(ctx.predecessor_markers().count()));
    g.edge(a, b).edge(unit, b).edge(plain, b).edge(b, c);
    let graph = g.build().unwrap();
    for _ in 0..20 {
        let out = pool.run(&graph).unwrap();
        assert_eq!(
            out.get(b).unwrap(),
            &vec!["event-of-a".to_string(), "u32:7".to_string()]
        );
        assert_eq!(
            out.get(c),
            Some(&0),
            "b set no marker; a's is not passed on"
        );
    }
}

#[test]
fn a_body_that_defers_then_panics_leaves_no_deferral_behind() {
    common::with_deadline(30, "defer_then_panic", || {
        let pool = PoolBuilder::new()
            .name("deferpanic")
            .workers(1)
            .cores(Cores::Unpinned)
            .build()
            .unwrap();
        common::quiet_worker_panics();
        let mut g = GraphBuilder::<()>::new("defers-then-panics");
        g.node("defers-then-panics", |ctx| -> Result<(), BoxError> {
            ctx.complete_when(|_| -> Poll<Result<(), BoxError>> { Poll::Pending });
            panic!("after complete_when");
        });
        let err = pool.run(&g.build().unwrap()).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NodePanicked);
        // The next node on the one worker completes by itself: the panicking body's deferred
        // completion (which never finishes) died with it, and is not taken for this node's.
        let ran = Arc::new(AtomicBool::new(false));
        let r = ran.clone();
        let mut g = GraphBuilder::<()>::new("next");
        g.node("next", move |_| {
            r.store(true, Ordering::SeqCst);
            Ok(())
        });
        let h = pool.submit(&g.build().unwrap()).unwrap();
        let res = h.wait_timeout(Duration::from_secs(5));
        assert!(ran.load(Ordering::SeqCst), "the next graph's node ran");
        assert!(
            res.is_ok(),
            "the next graph completed (its node was not held by a stale deferral)"
        );
    });
}

/// A high-level node's deferred completion is polled between the other nodes a busy worker
/// runs, not only once it runs dry: a latency-critical request's GPU work ends while its
/// worker runs batch nodes.
#[test]
fn high_deferred_completion_is_seen_while_the_worker_is_busy() {
    common::with_deadline(30, "urgent", || {
        let pool = PoolBuilder::new()
            .name("urgent")
            .workers(1)
            .cores(Cores::Unpinned)
            .build()
            .unwrap();
        const BATCH: usize = 400;
        let ready = Arc::new(AtomicBool::new(false));
        let deferred = Arc::new(AtomicBool::new(false));
        let batch_ran = Arc::new(AtomicUsize::new(0));
        let mut hg = GraphBuilder::<()>::new("high");
        hg.priority(Priority::High);
        let (r, d) = (ready.clone(), deferred.clone());
        let h = hg.node("device-work", move |ctx| {
            let r = r.clone();
            ctx.complete_when(move |_| {
                if r.load(Ordering::SeqCst) {
                    Poll::Ready(Ok(()))
                } else {
                    Poll::Pending
                }
            });
            d.store(true, Ordering::SeqCst);
            Ok(())
        });
        let seen = batch_ran.clone();
        let after = hg.node("read-output", move |_| Ok(seen.load(Ordering::SeqCst)));
        hg.edge(h, after);
        let high = pool.submit(&hg.build().unwrap()).unwrap();
        assert!(common::eventually(10, || deferred.load(Ordering::SeqCst)));

        // Independent batch nodes keep the one worker busy; the tenth makes the device work
        // "end".
        let mut bg = GraphBuilder::<()>::new("batch");
        for k in 0..BATCH {
            let (n, r) = (batch_ran.clone(), ready.clone());
            bg.node(format!("batch-{k}"), move |_| {
                if n.fetch_add(1, Ordering::SeqCst) + 1 == 10 {
                    r.store(true, Ordering::SeqCst);
                }
                std::thread::sleep(Duration::from_micros(20));
                Ok(())
            });
        }
        let batch = pool.submit(&bg.build().unwrap()).unwrap();
        let out = high.wait().unwrap();
        let ran_before = *out.get(after).unwrap();
        batch.wait().unwrap();
        assert!(
            ran_before < BATCH / 2,
            "the high node's completion waited for {ran_before} of {BATCH} batch nodes"
        );
    });
}
