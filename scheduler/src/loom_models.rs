//! Loom models of the scheduler's concurrency protocols, run with
//!
//! ```text
//! RUSTFLAGS="--cfg loom" cargo test -p boundpool-scheduler --release --target-dir /work/target-loom --lib loom_models
//! ```
//!
//! Under `--cfg loom`, `crate::sync` hands out loom's atomics, locks and parking, so these models
//! explore every interleaving (and every weak-memory outcome loom models) of:
//!
//! 1. the dependency counters and the in-flight count of a `Run` (a join node becomes ready
//!    exactly once; the run is finished exactly once; failures still finish it once and count
//!    the cancelled nodes);
//! 2. the sleep protocol of `Sleep` (a worker that announces itself idle and re-checks, against a
//!    pusher that pushes and notifies: no lost wake-up);
//! 3. `Completion` (complete against a parked waiter or a registered waker: no lost wake-up, the
//!    result is there when the waiter sees `done`).
//!
//! A lost wake-up shows up as a loom deadlock (every thread parked).

use std::sync::Arc;

use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::thread;

use crate::error::{Error, ErrorKind};
use crate::graph::{Graph, GraphBuilder};
use crate::run::{Completion, Run};
use crate::sleep::Sleep;

/// a -> {b, c} -> d; node indices 0, 1, 2, 3.
fn diamond() -> Graph<()> {
    let mut g = GraphBuilder::<()>::new("diamond");
    let a = g.node("a", |_| Ok(()));
    let b = g.node("b", |_| Ok(()));
    let c = g.node("c", |_| Ok(()));
    let d = g.node("d", |_| Ok(()));
    g.edge(a, b).edge(a, c).edge(b, d).edge(c, d);
    g.build().expect("diamond builds")
}

/// Completes `node` of `run` the way a worker does (release, then settle); returns the nodes it
/// made ready and whether it brought the in-flight count to zero.
fn complete(run: &Run<()>, node: u32, ok: bool) -> (Vec<u32>, bool) {
    let mut ready = Vec::new();
    let n = run.release(node, ok, |t| ready.push(t.node));
    assert_eq!(n, ready.len());
    let finished = run.settle(n);
    (ready, finished)
}

/// Two threads complete the middle nodes of a diamond at once: the join node becomes ready in
/// exactly one of them, and the run's in-flight count reaches zero exactly once (after the join
/// node ran), never before.
#[test]
fn dependency_counter_and_inflight() {
    loom::model(|| {
        let graph = diamond();
        let run = Arc::new(Run::new(1, graph.plan.clone()));
        // The submitter queued the source; a worker ran it: b and c become ready.
        let (ready, fin) = complete(&run, 0, true);
        assert_eq!(ready, vec![1, 2]);
        assert!(!fin);

        let joins = Arc::new(AtomicUsize::new(0));
        let finishes = Arc::new(AtomicUsize::new(0));
        let handles: Vec<_> = [1u32, 2]
            .into_iter()
            .map(|node| {
                let (run, joins, finishes) = (run.clone(), joins.clone(), finishes.clone());
                thread::spawn(move || {
                    let (ready, fin) = complete(&run, node, true);
                    assert!(!fin, "the run cannot finish before its join node ran");
                    for d in ready {
                        assert_eq!(d, 3);
                        joins.fetch_add(1, Ordering::SeqCst);
                        // Run the join node here, like a continuation.
                        let (more, fin) = complete(&run, d, true);
                        assert!(more.is_empty());
                        if fin {
                            finishes.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(
            joins.load(Ordering::SeqCst),
            1,
            "the join node became ready exactly once"
        );
        assert_eq!(
            finishes.load(Ordering::SeqCst),
            1,
            "the run finished exactly once"
        );
        assert_eq!(run.inflight.load(Ordering::SeqCst), 0);
        let out = run.take_result().expect("the run succeeded");
        assert_eq!(out.graph_name(), "diamond");
    });
}

/// One middle node fails while the other completes: the join node never becomes ready, the run
/// still finishes exactly once, fails with the node's error, and counts the join node (and only
/// it) as cancelled.
#[test]
fn dependency_counter_with_a_failure() {
    loom::model(|| {
        let graph = diamond();
        let run = Arc::new(Run::new(1, graph.plan.clone()));
        let (ready, _) = complete(&run, 0, true);
        assert_eq!(ready.len(), 2);
        let finishes = Arc::new(AtomicUsize::new(0));
        let handles: Vec<_> = [(1u32, false), (2, true)]
            .into_iter()
            .map(|(node, ok)| {
                let (run, finishes) = (run.clone(), finishes.clone());
                thread::spawn(move || {
                    if !ok {
                        run.fail(Error::new(ErrorKind::NodeFailed, "node 'b' failed"));
                    }
                    let (ready, fin) = complete(&run, node, ok);
                    assert!(
                        ready.is_empty(),
                        "the join node must not run after a failure"
                    );
                    if fin {
                        finishes.fetch_add(1, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(finishes.load(Ordering::SeqCst), 1);
        let err = run.take_result().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NodeFailed);
        assert_eq!(err.cancelled_nodes(), 1, "only the join node never ran");
    });
}

/// A worker announces itself idle and re-checks the queue; a pusher pushes and notifies.
/// Whatever the interleaving, the worker takes the item (a lost wake-up deadlocks the model).
#[test]
fn sleep_no_lost_wakeup() {
    loom::model(|| {
        let sleep = Arc::new(Sleep::new(1, 1));
        let queue = Arc::new(AtomicUsize::new(0));
        let worker = {
            let (sleep, queue) = (sleep.clone(), queue.clone());
            thread::spawn(move || {
                sleep.register(0, crate::sync::current_thread());
                loop {
                    if queue
                        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |q| q.checked_sub(1))
                        .is_ok()
                    {
                        break;
                    }
                    sleep.sleep(0, 0, None, || queue.load(Ordering::SeqCst) > 0, || false);
                }
            })
        };
        queue.fetch_add(1, Ordering::SeqCst);
        sleep.notify_group(0);
        worker.join().unwrap();
        assert_eq!(queue.load(Ordering::SeqCst), 0);
    });
}

/// Two pushers, one worker that must take both items: concurrent notifies and a stale
/// `notified` flag must not leave it asleep with work queued.
#[test]
fn sleep_two_pushers() {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(3);
    builder.check(|| {
        let sleep = Arc::new(Sleep::new(1, 1));
        let queue = Arc::new(AtomicUsize::new(0));
        let worker = {
            let (sleep, queue) = (sleep.clone(), queue.clone());
            thread::spawn(move || {
                sleep.register(0, crate::sync::current_thread());
                let mut taken = 0;
                while taken < 2 {
                    if queue
                        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |q| q.checked_sub(1))
                        .is_ok()
                    {
                        taken += 1;
                        continue;
                    }
                    sleep.sleep(0, 0, None, || queue.load(Ordering::SeqCst) > 0, || false);
                }
            })
        };
        let pusher = {
            let (sleep, queue) = (sleep.clone(), queue.clone());
            thread::spawn(move || {
                queue.fetch_add(1, Ordering::SeqCst);
                sleep.notify_group(0);
            })
        };
        queue.fetch_add(1, Ordering::SeqCst);
        sleep.notify_any();
        pusher.join().unwrap();
        worker.join().unwrap();
    });
}

/// `complete` against a thread that blocks on the completion (register, check, park).
#[test]
fn completion_vs_blocking_waiter() {
    loom::model(|| {
        let c = Arc::new(Completion::new());
        let finisher = {
            let c = c.clone();
            thread::spawn(move || c.complete(Err(Error::new(ErrorKind::Cancelled, "done"))))
        };
        c.block();
        assert!(c.is_done());
        let res = c
            .take_result()
            .expect("the result is published before `done`");
        assert_eq!(res.unwrap_err().kind(), ErrorKind::Cancelled);
        finisher.join().unwrap();
    });
}

/// `complete` against a future-style waiter: poll (register the waker, re-check), park until
/// woken, poll again.
#[test]
fn completion_vs_waker() {
    use std::task::{Wake, Waker};

    struct Unparker(loom::thread::Thread);
    impl Wake for Unparker {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }

    loom::model(|| {
        let c = Arc::new(Completion::new());
        let finisher = {
            let c = c.clone();
            thread::spawn(move || c.complete(Err(Error::new(ErrorKind::Cancelled, "done"))))
        };
        let waker = Waker::from(Arc::new(Unparker(loom::thread::current())));
        // GraphHandle::poll: done? else register the waker and check again.
        loop {
            if c.is_done() {
                break;
            }
            c.register_waker(&waker);
            if c.is_done() {
                break;
            }
            loom::thread::park();
        }
        assert!(c.take_result().is_some());
        finisher.join().unwrap();
    });
}

#[test]
fn zz_dekker_probe() {
    loom::model(|| {
        let x = Arc::new(AtomicUsize::new(0));
        let y = Arc::new(AtomicUsize::new(0));
        let t = {
            let (x, y) = (x.clone(), y.clone());
            thread::spawn(move || {
                x.fetch_add(1, Ordering::SeqCst);
                loom::sync::atomic::fence(Ordering::SeqCst);
                y.load(Ordering::SeqCst)
            })
        };
        y.fetch_add(1, Ordering::SeqCst);
        loom::sync::atomic::fence(Ordering::SeqCst);
        let r2 = x.load(Ordering::SeqCst);
        let r1 = t.join().unwrap();
        assert!(r1 == 1 || r2 == 1, "both missed");
    });
}

#[test]
fn zz_replica_probe() {
    use loom::sync::atomic::{fence, AtomicBool};
    use loom::sync::Mutex;
    static LOG: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    fn log(s: String) {
        eprintln!("{s}");
    }
    loom::model(|| {
        eprintln!("=== iteration");
        let idle = Arc::new(Mutex::new(Vec::<usize>::new()));
        let count = Arc::new(AtomicUsize::new(0));
        let notified = Arc::new(AtomicBool::new(false));
        let thread_slot: Arc<Mutex<Option<loom::thread::Thread>>> = Arc::new(Mutex::new(None));
        let queue = Arc::new(AtomicUsize::new(0));
        let worker = {
            let (idle, count, notified, thread_slot, queue) = (idle.clone(), count.clone(), notified.clone(), thread_slot.clone(), queue.clone());
            thread::spawn(move || {
                *thread_slot.lock().unwrap() = Some(loom::thread::current());
                loop {
                    let q = queue.load(Ordering::SeqCst);
                    log(format!("w: first load {q}"));
                    if q > 0 {
                        break;
                    }
                    idle.lock().unwrap().push(0);
                    count.fetch_add(1, Ordering::SeqCst);
                    fence(Ordering::SeqCst);
                    let q = queue.load(Ordering::SeqCst);
                    log(format!("w: recheck {q}"));
                    if q > 0 {
                        let mut i = idle.lock().unwrap();
                        if let Some(p) = i.iter().position(|&x| x == 0) {
                            i.swap_remove(p);
                            count.fetch_sub(1, Ordering::SeqCst);
                        }
                        continue;
                    }
                    loop {
                        if notified.swap(false, Ordering::AcqRel) {
                            log("w: notified".into());
                            break;
                        }
                        eprintln!("w: park");
                        loom::thread::park();
                        log("w: unparked".into());
                    }
                    let mut i = idle.lock().unwrap();
                    if let Some(p) = i.iter().position(|&x| x == 0) {
                        i.swap_remove(p);
                        count.fetch_sub(1, Ordering::SeqCst);
                    }
                }
            })
        };
        queue.fetch_add(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        let c = count.load(Ordering::SeqCst);
        log(format!("p: count {c}"));
        if c > 0 {
            let w = idle.lock().unwrap().pop();
            log(format!("p: popped {w:?}"));
            if w.is_some() {
                count.fetch_sub(1, Ordering::SeqCst);
                notified.store(true, Ordering::Release);
                if let Some(t) = thread_slot.lock().unwrap().as_ref() {
                    log("p: unpark".into());
                    t.unpark();
                }
            }
        }
        worker.join().unwrap();
    });
}

#[test]
fn zz_rmw_probe() {
    use loom::sync::atomic::AtomicBool;
    loom::model(|| {
        let a = Arc::new(AtomicBool::new(false));
        let flag = Arc::new(AtomicUsize::new(0));
        let t = {
            let (a, flag) = (a.clone(), flag.clone());
            thread::spawn(move || {
                a.store(true, Ordering::Release);
                flag.store(1, Ordering::Release);
            })
        };
        let r1 = a.swap(false, Ordering::AcqRel);
        while flag.load(Ordering::Acquire) == 0 {
            loom::thread::yield_now();
        }
        let r2 = a.swap(false, Ordering::AcqRel);
        assert!(r1 || r2, "the store of true was lost between two swaps");
        t.join().unwrap();
    });
}
