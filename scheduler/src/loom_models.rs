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
//!    the cancelled nodes), the ready-queue hand-off (the in-flight count is raised before a
//!    ready node is queued, so a thief finishing it cannot end the run early), and the output
//!    slots allocated by the first node that stores (racing writers, readers after release);
//! 2. the sleep protocol of `Sleep` (a worker that announces itself idle and re-checks, against a
//!    pusher that pushes and notifies: no lost wake-up);
//! 3. `Completion` (complete against a parked waiter or a registered waker: no lost wake-up, the
//!    result is there when the waiter sees `done`);
//! 4. the idle-hook request (`Sleep::request_hook`, what a `GroupWaker` does after a handle was
//!    queued for release) against a worker that drains the release queue in its idle hook and
//!    parks: the request is never lost, whether it comes before, during or after the drain; and
//!    a wake-up for a domain's work reaches an idle worker of any of its groups.
//!
//! 5. the per-worker in-flight credit (`Credit`: spare units of one run, given back a chunk at
//!    a time, all of them when the worker switches runs or runs dry): a fan-out finished by two
//!    workers is finished exactly once, after every node completed, by whichever gives the last
//!    units back; a worker that switches runs gives the old run's units back and finishes it.
//! 6. the leaf counters of a wide join (`WideJoins`, with a threshold of 3 under loom): three
//!    predecessors finishing at once make the join ready exactly once, with every predecessor's
//!    output visible to it; also when one worker batches its arrivals at a leaf
//!    (`Run::release_batched`, what a span does) and counts them in one increment later.
//! 7. the counters a run that succeeded leaves to its plan's next run (`CounterCache`): the
//!    next run counts on from the previous targets, and its joins are ready exactly once.
//! 8. a value taken by its node's only successor (`Inputs::take`) on another thread than its
//!    writer's: the taker sees it whole, the finisher finds it gone and the marker beside it
//!    still there.
//! 9. a node's completion handed to a `Completer` (`later.rs`, `run/later.rs`): the body's
//!    return on one thread against the completer's call (with success, an error, or dropped)
//!    on another, the completion task taken by a third: the node is completed exactly once,
//!    by the body's thread or the taker, never the caller; its successor sees its output; the
//!    run finishes once, after it; a failed body leaves the call nothing to do.
//! 10. the active-run table's shutdown (`ActiveRuns`, two shards): a run leaving while the pool
//!     closes, with a waiter for the end: the shutdown ends exactly once, and the waiter wakes;
//!     a run entering while it closes is either refused or seen by the close.
//!
//! A lost wake-up shows up as a loom deadlock (every thread parked).

use std::sync::Arc;

use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::thread;

use crate::ctx::Inputs;
use crate::error::{Error, ErrorKind};
use crate::graph::{Graph, GraphBuilder};
use crate::latch::Completion;
use crate::later::Completer;
use crate::run::{hand_off, Credit, Queue, Run, RunRef, Task, CREDIT_CHUNK, CREDIT_MAX};
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
    let n = run.release(node, ok, |t| ready.push(t.node()));
    assert_eq!(n, ready.len());
    let finished = RunRef::new(run).settle(n);
    (ready, finished)
}

/// Two threads complete the middle nodes of a diamond at once: the join node becomes ready in
/// exactly one of them, and the run's in-flight count reaches zero exactly once (after the join
/// node ran), never before.
#[test]
fn dependency_counter_and_inflight() {
    loom::model(|| {
        let graph = diamond();
        let run = Arc::new(Run::new(1, graph.plan.clone()).expect("counters"));
        // The submitter queued the source; a worker ran it: b and c become ready.
        let (ready, fin) = complete(&run, 0, true);
        assert_eq!(ready, vec![1, 2]);
        assert!(!fin);

        let joins = Arc::new(AtomicUsize::new(0));
        let finishes = Arc::new(AtomicUsize::new(0));
        // Set (Relaxed: ordered by the in-flight count only) when the join node has run.
        let join_ran = Arc::new(AtomicUsize::new(0));
        let handles: Vec<_> = [1u32, 2]
            .into_iter()
            .map(|node| {
                let (run, joins, finishes, join_ran) = (
                    run.clone(),
                    joins.clone(),
                    finishes.clone(),
                    join_ran.clone(),
                );
                thread::spawn(move || {
                    let (ready, fin) = complete(&run, node, true);
                    if fin {
                        // The other thread made the join node ready and ran it; the in-flight
                        // count must order that before our reaching zero.
                        assert_eq!(
                            join_ran.load(Ordering::Relaxed),
                            1,
                            "the run finished before its join node ran"
                        );
                        finishes.fetch_add(1, Ordering::SeqCst);
                    }
                    for d in ready {
                        assert_eq!(d, 3);
                        joins.fetch_add(1, Ordering::SeqCst);
                        // Run the join node here, like a continuation.
                        join_ran.store(1, Ordering::Relaxed);
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
        let run = Arc::new(Run::new(1, graph.plan.clone()).expect("counters"));
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

/// The ready-queue hand-off: a worker completes `a`, raises the in-flight count for the two
/// successors it made ready (`settle`) *before* queueing one of them, and runs the other as its
/// continuation; a thief takes the queued one. However the two interleave, the run finishes
/// exactly once, and only after both successors completed.
#[test]
fn ready_handoff_keeps_the_run_alive() {
    loom::model(|| {
        // a -> b, a -> c; b and c are sinks.
        let mut g = GraphBuilder::<()>::new("fork");
        let a = g.node("a", |_| Ok(()));
        let b = g.node("b", |_| Ok(()));
        let c = g.node("c", |_| Ok(()));
        g.edge(a, b).edge(a, c);
        let graph = g.build().expect("fork builds");
        let run = Arc::new(Run::new(1, graph.plan.clone()).expect("counters"));
        let queue: Arc<loom::sync::Mutex<Vec<u32>>> = Arc::new(loom::sync::Mutex::new(Vec::new()));
        let completed = Arc::new(AtomicUsize::new(0));
        let finishes = Arc::new(AtomicUsize::new(0));

        let thief = {
            let (run, queue, completed, finishes) = (
                run.clone(),
                queue.clone(),
                completed.clone(),
                finishes.clone(),
            );
            thread::spawn(move || loop {
                let task = queue.lock().unwrap().pop();
                match task {
                    Some(node) => {
                        completed.fetch_add(1, Ordering::Relaxed);
                        let (more, fin) = complete(&run, node, true);
                        assert!(more.is_empty());
                        if fin {
                            assert_eq!(
                                completed.load(Ordering::Relaxed),
                                2,
                                "finished before every node completed"
                            );
                            finishes.fetch_add(1, Ordering::SeqCst);
                        }
                        break;
                    }
                    None => thread::yield_now(),
                }
            })
        };
        // The worker: complete `a`, settle, queue all but the continuation, run the continuation.
        let mut ready = Vec::new();
        let n = run.release(0, true, |t| ready.push(t.node()));
        assert!(!RunRef::new(&run).settle(n));
        let cont = ready.remove(0);
        for t in ready {
            queue.lock().unwrap().push(t);
        }
        completed.fetch_add(1, Ordering::Relaxed);
        let (more, fin) = complete(&run, cont, true);
        assert!(more.is_empty());
        if fin {
            assert_eq!(
                completed.load(Ordering::Relaxed),
                2,
                "finished before every node completed"
            );
            finishes.fetch_add(1, Ordering::SeqCst);
        }
        thief.join().unwrap();
        assert_eq!(finishes.load(Ordering::SeqCst), 1);
        assert_eq!(run.inflight.load(Ordering::SeqCst), 0);
    });
}

/// Two workers finish a fan-out a -> {b, c, d, e} with their own `Credit`s, as `complete_general`
/// does: worker A completes `a`, keeps `b` as its continuation, takes a unit for each of the
/// others from its credit (raising the shared count a chunk at a time) and queues them; worker
/// B takes one from the queue. Completed nodes leave their unit in their worker's credit; A's
/// passes the keep-a-chunk limit (a partial give-back, which never finishes the run). Each
/// gives everything back when it runs dry. B first holds a spare unit of another, one-node run,
/// which its switch to the fan-out gives back, finishing that run. Whatever the interleaving,
/// the fan-out is finished exactly once, after all five nodes completed.
#[test]
fn credit_finishes_a_run_once() {
    const { assert!(CREDIT_CHUNK == 2 && CREDIT_MAX == 3) };
    loom::model(|| {
        let mut g = GraphBuilder::<()>::new("fan");
        let a = g.node("a", |_| Ok(()));
        for name in ["b", "c", "d", "e"] {
            let x = g.node(name, |_| Ok(()));
            g.edge(a, x);
        }
        let graph = g.build().expect("fan builds");
        let mut g = GraphBuilder::<()>::new("one");
        g.node("x", |_| Ok(()));
        let one = g.build().expect("one builds");
        let run = Arc::new(Run::new(1, graph.plan.clone()).expect("counters"));
        let other = Arc::new(Run::new(2, one.plan.clone()).expect("counters"));
        let queue: Arc<loom::sync::Mutex<Vec<u32>>> = Arc::new(loom::sync::Mutex::new(Vec::new()));
        let completed = Arc::new(AtomicUsize::new(0));
        let finishes = Arc::new(AtomicUsize::new(0));
        let finished = {
            let (run, completed, finishes) = (run.clone(), completed.clone(), finishes.clone());
            move |r: Option<RunRef<()>>| {
                if let Some(r) = r {
                    assert_eq!(r.id, run.id, "only the fan-out can finish here");
                    assert_eq!(
                        completed.load(Ordering::Relaxed),
                        5,
                        "finished before every node completed"
                    );
                    finishes.fetch_add(1, Ordering::SeqCst);
                }
            }
        };

        let thief = {
            let (run, other, queue, completed, finished) = (
                run.clone(),
                other.clone(),
                queue.clone(),
                completed.clone(),
                finished.clone(),
            );
            thread::spawn(move || {
                let credit = Credit::new();
                // B ran the other run's only node: its unit is a spare one here.
                assert!(credit.leave(RunRef::new(&other)).is_none());
                assert_eq!(credit.units(), 1);
                loop {
                    let task = queue.lock().unwrap().pop();
                    if let Some(node) = task {
                        completed.fetch_add(1, Ordering::Relaxed);
                        let mut more = 0;
                        run.release(node, true, |_| more += 1);
                        assert_eq!(more, 0);
                        // The switch gives the other run's unit back: that finishes it.
                        let switched = credit.leave(RunRef::new(&run));
                        assert!(switched.is_some_and(|r| r.id == other.id));
                        assert_eq!(other.inflight.load(Ordering::SeqCst), 0);
                        finished(credit.flush());
                        break;
                    }
                    thread::yield_now();
                }
            })
        };
        let credit = Credit::new();
        let me = RunRef::new(&run);
        completed.fetch_add(1, Ordering::Relaxed);
        let mut ready = Vec::new();
        run.release(0, true, |t| ready.push(t.node()));
        assert_eq!(ready, vec![1, 2, 3, 4]);
        let cont = ready.remove(0);
        let mut mine = Vec::new();
        for (k, t) in ready.into_iter().enumerate() {
            finished(credit.enter(me));
            if k == 0 {
                queue.lock().unwrap().push(t);
            } else {
                mine.push(t);
            }
        }
        // Three tasks entered: a chunk (2) raised twice, one unit left over.
        assert_eq!(credit.units(), 1);
        for node in std::iter::once(cont).chain(mine) {
            completed.fetch_add(1, Ordering::Relaxed);
            let mut more = 0;
            run.release(node, true, |_| more += 1);
            assert_eq!(more, 0);
            finished(credit.leave(me));
        }
        // 1 + 3 leaves: the third reached the limit and gave all but a chunk back.
        assert_eq!(credit.units(), CREDIT_CHUNK);
        finished(credit.flush());
        assert_eq!(credit.units(), 0);
        thief.join().unwrap();
        assert_eq!(finishes.load(Ordering::SeqCst), 1);
        assert_eq!(run.inflight.load(Ordering::SeqCst), 0);
    });
}

/// Completes nodes 0, 1 and 2 of `run` on three threads (node 0 on this one), each storing
/// its index as its output before it releases its successors; `on_ready` gets the successors
/// each release made ready.
fn complete_three_on_three_threads<F>(run: &Arc<Run<()>>, on_ready: F)
where
    F: Fn(&Run<()>, Vec<u32>) + Clone + Send + Sync + 'static,
{
    let finish = {
        let run = run.clone();
        move |node: u32| {
            // SAFETY: this thread is node's only runner, before it releases successors.
            unsafe {
                run.slots
                    .get_or_alloc(node)
                    .expect("slots")
                    .set_value(Box::new(node))
            };
            let mut ready = Vec::new();
            run.release(node, true, |t| ready.push(t.node()));
            on_ready(&run, ready);
        }
    };
    let hs: Vec<_> = [1u32, 2]
        .into_iter()
        .map(|node| {
            let finish = finish.clone();
            thread::spawn(move || finish(node))
        })
        .collect();
    finish(0);
    for h in hs {
        h.join().unwrap();
    }
}

/// Asserts that every predecessor in `preds` of a node made ready stored its index as its
/// output ([`complete_three_on_three_threads`]).
fn assert_inputs(run: &Run<()>, preds: &[u32]) {
    for &p in preds {
        // SAFETY: the node's counter reached its target: every predecessor stored its value
        // before its release, which happened-before this.
        // (the one reader of each predecessor: nothing takes it).
        let out = unsafe {
            run.slots
                .get(p)
                .and_then(|s| s.get())
                .and_then(|o| o.lend())
        };
        assert_eq!(out.and_then(|v| v.downcast_ref::<u32>()), Some(&p));
    }
}

/// Three predecessors of a wide join (two leaves under loom: {p0, p1} and {p2}) complete on three
/// threads: exactly one of them makes the join ready, and it sees every predecessor's value.
#[test]
fn wide_join_leaves() {
    loom::model(|| {
        let mut g = GraphBuilder::<()>::new("wide");
        let preds: Vec<_> = (0..3u32)
            .map(|i| g.node(format!("p{i}"), move |_| Ok(i)))
            .collect();
        let j = g.node("j", |_| Ok(()));
        for &p in &preds {
            g.edge(p, j);
        }
        let graph = g.build().expect("wide builds");
        let run = Arc::new(Run::new(1, graph.plan.clone()).expect("counters"));
        let readies = Arc::new(AtomicUsize::new(0));
        let r = readies.clone();
        complete_three_on_three_threads(&run, move |run, ready| {
            if ready == [3] {
                assert_inputs(run, &[0, 1, 2]);
                r.fetch_add(1, Ordering::SeqCst);
            } else {
                assert!(ready.is_empty());
            }
        });
        assert_eq!(readies.load(Ordering::SeqCst), 1);
    });
}

/// The counters a run that succeeded leaves behind are counted on by the plan's next run
/// (`CounterCache`: each counter starts at its target times the runs before). A first run of
/// three predecessors feeding a wide join `j` (two leaves under loom) and a two-predecessor
/// join `k` (after p0 and p1) completes on this thread; in the second run the predecessors
/// complete on three threads: each join becomes ready exactly once, seeing its inputs.
#[test]
fn counters_counted_on_by_the_next_run() {
    loom::model(|| {
        let mut g = GraphBuilder::<()>::new("rerun");
        let preds: Vec<_> = (0..3u32)
            .map(|i| g.node(format!("p{i}"), move |_| Ok(i)))
            .collect();
        let j = g.node("j", |_| Ok(()));
        let k = g.node("k", |_| Ok(()));
        for &p in &preds {
            g.edge(p, j);
        }
        g.edge(preds[0], k).edge(preds[1], k);
        let graph = g.build().expect("rerun builds");
        {
            let first = Run::new(1, graph.plan.clone()).expect("counters");
            let mut ready = Vec::new();
            for node in 0..3u32 {
                first.release(node, true, |t| ready.push(t.node()));
            }
            ready.sort_unstable();
            assert_eq!(ready, [3, 4], "the first run releases both joins");
            assert!(first.take_result().is_ok());
            // Dropped here: its counters go back to the plan.
        }
        let run = Arc::new(Run::new(2, graph.plan.clone()).expect("counters"));
        let readies = Arc::new([AtomicUsize::new(0), AtomicUsize::new(0)]);
        let r = readies.clone();
        complete_three_on_three_threads(&run, move |run, ready| {
            for s in ready {
                assert_inputs(run, if s == 3 { &[0, 1, 2] } else { &[0, 1] });
                r[s as usize - 3].fetch_add(1, Ordering::SeqCst);
            }
        });
        assert_eq!(readies[0].load(Ordering::SeqCst), 1, "j ready once");
        assert_eq!(readies[1].load(Ordering::SeqCst), 1, "k ready once");
    });
}

/// Two predecessors of a wide join that share a leaf (nodes 0 and 1) complete on one thread,
/// which batches their arrivals (`release_batched`, as a worker running a span does) and counts
/// the batch in the leaf only after both, while node 4 (the same leaf: `(4 / 2) % 2`) and
/// node 3 (the other leaf) complete on two other threads with single arrivals: the join becomes
/// ready exactly once, seeing every predecessor's value, whether the batch's flush or a single
/// arrival is last.
#[test]
fn wide_join_batched_leaf() {
    use crate::run::LeafBatcher;
    loom::model(|| {
        // Nodes 0..5 (node 2 is no predecessor), the join is node 5. Two leaves under loom:
        // leaf 0 = {0, 1, 4}, leaf 1 = {3}.
        let mut g = GraphBuilder::<()>::new("wide");
        let nodes: Vec<_> = (0..5u32)
            .map(|i| g.node(format!("p{i}"), move |_| Ok(i)))
            .collect();
        let j = g.node("j", |_| Ok(()));
        for p in [0usize, 1, 3, 4] {
            g.edge(nodes[p], j);
        }
        const PREDS: [u32; 4] = [0, 1, 3, 4];
        let graph = g.build().expect("wide builds");
        let run = Arc::new(Run::new(1, graph.plan.clone()).expect("counters"));
        let readies = Arc::new(AtomicUsize::new(0));
        let check = {
            let (run, readies) = (run.clone(), readies.clone());
            move |ready: Vec<u32>| {
                if ready == [5] {
                    for p in PREDS {
                        // SAFETY: the join's counter reached its target: every predecessor
                        // stored its value before its (batched) arrival was counted, which
                        // happened-before this.
                        // Nothing takes it.
                        let out = unsafe {
                            run.slots
                                .get(p)
                                .and_then(|s| s.get())
                                .and_then(|o| o.lend())
                        };
                        assert_eq!(out.and_then(|v| v.downcast_ref::<u32>()), Some(&p));
                    }
                    readies.fetch_add(1, Ordering::SeqCst);
                } else {
                    assert!(ready.is_empty(), "{ready:?}");
                }
            }
        };
        let store = {
            let run = run.clone();
            move |node: u32| {
                // SAFETY: this thread is node's only runner, before it releases successors.
                unsafe {
                    run.slots
                        .get_or_alloc(node)
                        .expect("slots")
                        .set_value(Box::new(node))
                };
            }
        };
        let hs: Vec<_> = [3u32, 4]
            .into_iter()
            .map(|node| {
                let (run, check, store) = (run.clone(), check.clone(), store.clone());
                thread::spawn(move || {
                    store(node);
                    let mut ready = Vec::new();
                    run.release(node, true, |t| ready.push(t.node()));
                    check(ready);
                })
            })
            .collect();
        let batcher = LeafBatcher::new();
        batcher.run.set(Some(RunRef::new(&run)));
        let mut ready = Vec::new();
        for node in [0u32, 1] {
            store(node);
            run.release_batched(node, true, Some(&batcher), |t| ready.push(t.node()));
        }
        assert!(
            ready.is_empty(),
            "a batch counts nothing until it is flushed"
        );
        let b = batcher.batch.take().expect("p0 and p1 batched");
        assert_eq!(b.join, 5);
        if run.flush_leaf(b) {
            ready.push(b.join);
        }
        check(ready);
        for h in hs {
            h.join().unwrap();
        }
        assert_eq!(readies.load(Ordering::SeqCst), 1);
    });
}

/// The output slots are allocated by the first node that stores a value: the two middle nodes
/// of a diamond store theirs at once (racing to allocate; one allocation wins, the other is
/// freed), then release the join node, which reads both values.
#[test]
fn lazily_allocated_slots() {
    loom::model(|| {
        let graph = diamond();
        let run = Arc::new(Run::new(1, graph.plan.clone()).expect("counters"));
        let (ready, _) = complete(&run, 0, true);
        assert_eq!(ready, vec![1, 2]);
        let finishes = Arc::new(AtomicUsize::new(0));
        let handles: Vec<_> = [1u32, 2]
            .into_iter()
            .map(|node| {
                let (run, finishes) = (run.clone(), finishes.clone());
                thread::spawn(move || {
                    // SAFETY: this thread runs `node`: the slot's only writer, before release.
                    unsafe {
                        run.slots
                            .get_or_alloc(node)
                            .expect("slots")
                            .set_value(Box::new(node as u64 * 10))
                    };
                    let (ready, fin) = complete(&run, node, true);
                    if fin {
                        finishes.fetch_add(1, Ordering::SeqCst);
                    }
                    if ready == [3] {
                        // The join node reads both predecessors' values.
                        for (p, want) in [(1u32, 10u64), (2, 20)] {
                            let slot = run.slots.get(p).expect("the slots were allocated");
                            // SAFETY: `p` completed before the join node became ready, and
                            // nothing takes its value.
                            let out = unsafe { slot.get() }.expect("the value was stored");
                            let v = unsafe { out.lend() }.unwrap();
                            assert_eq!(v.downcast_ref::<u64>(), Some(&want));
                        }
                        let (_, fin) = complete(&run, 3, true);
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
        assert_eq!(finishes.load(Ordering::SeqCst), 1);
        assert_eq!(run.inflight.load(Ordering::SeqCst), 0);
    });
}

/// A node takes a predecessor's value (`Inputs::take`) on another thread than the one that
/// wrote it: `a` and `c` complete at once on two threads (each storing a value, `a` a marker
/// too); whichever makes the join `b` ready runs it, taking `a`'s value (whose only successor
/// it is) and reading `c`'s. The taker sees `a`'s value whole; the finisher, whoever it is,
/// finds it gone and `a`'s marker still there, and `b`'s sum; the run finishes once.
#[test]
fn taken_value_moves_to_the_only_successor() {
    loom::model(|| {
        let mut g = GraphBuilder::<()>::new("take");
        let a = g.node("a", |_| Ok(10u64));
        let c = g.node("c", |_| Ok(20u64));
        let b = g.node("b", |_| Ok(0u64));
        g.hand_on(a, b).edge(c, b);
        let graph = g.build().expect("builds");
        let run = Arc::new(Run::new(1, graph.plan.clone()).expect("counters"));
        let finishes = Arc::new(AtomicUsize::new(0));
        let handles: Vec<_> = [(a.id().index() as u32, 10u64), (c.id().index() as u32, 20)]
            .into_iter()
            .map(|(node, value)| {
                let (run, finishes) = (run.clone(), finishes.clone());
                thread::spawn(move || {
                    // SAFETY: this thread runs `node`: the slot's only writer, before release.
                    unsafe {
                        let slot = run.slots.get_or_alloc(node).expect("slots");
                        slot.set_value(Box::new(value));
                        if value == 10 {
                            slot.set_marker(Box::new("event"));
                        }
                    }
                    let (ready, fin) = complete(&run, node, true);
                    // A source whose arrival came first may leave after `b` ran: it then
                    // finishes the run.
                    if fin {
                        finishes.fetch_add(1, Ordering::SeqCst);
                    }
                    if ready == [2] {
                        let inputs = Inputs::of(&*run, 2);
                        let taken = inputs.take(a).expect("b is a's only successor");
                        let read = *inputs.input(c).expect("c left a value");
                        assert_eq!((taken, read), (10, 20));
                        // SAFETY: this thread runs `b`, before its release.
                        unsafe {
                            run.slots
                                .get_or_alloc(2)
                                .expect("slots")
                                .set_value(Box::new(taken + read))
                        };
                        let (_, fin) = complete(&run, 2, true);
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
        assert_eq!(finishes.load(Ordering::SeqCst), 1);
        // The run is over: this thread has it to itself.
        let out_a = run.slots.get(0).expect("allocated");
        // SAFETY: every node completed (in-flight count at zero, joined threads).
        let out_a = unsafe { out_a.get() }.expect("a stored");
        assert!(out_a.is_taken());
        assert!(out_a.marker.is_some(), "a's marker stays");
        let out = run.take_result().expect("the run succeeded");
        assert_eq!(out.get(a), None);
        assert_eq!(out.get(c), Some(&20));
        assert_eq!(out.get(b), Some(&30));
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
        // Not joined: the finisher may still be unparking this thread, and loom lets an unpark
        // end any block, a join's included (std keeps it as a token for the next park).
        drop(finisher);
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
        // Not joined: the finisher may still be unparking this thread, and loom lets an unpark
        // end any block, a join's included (std keeps it as a token for the next park).
        drop(finisher);
    });
}

/// A done hook registered while the run finishes (`GraphHandle::on_done` against `complete`):
/// it runs exactly once, either on the finisher before the result is published or at once on
/// the registering thread; never lost, never twice.
#[test]
fn done_hook_vs_completion() {
    loom::model(|| {
        let c = Arc::new(Completion::new());
        let ran = Arc::new(AtomicUsize::new(0));
        let finisher = {
            let c = c.clone();
            thread::spawn(move || c.complete(Err(Error::new(ErrorKind::Cancelled, "done"))))
        };
        let r = ran.clone();
        let c2 = c.clone();
        let registrar = thread::current().id();
        c.on_done(Box::new(move || {
            // On the finisher it runs before the result is published (on the registering
            // thread, the finisher may be publishing it meanwhile).
            if thread::current().id() != registrar {
                assert!(!c2.is_done(), "a hook runs before the result is published");
            }
            r.fetch_add(1, Ordering::SeqCst);
        }));
        finisher.join().unwrap();
        assert_eq!(ran.load(Ordering::SeqCst), 1, "the hook runs exactly once");
        assert!(c.take_result().is_some());
    });
}

/// The release queue's hand-off: a foreign thread queues a handle and asks for the idle hook
/// (`request_hook`); the worker takes the request, runs its hook (drains the queue), and parks
/// when nothing is left. The queue is invisible to the worker's re-check of its task queues,
/// so only the request flag, read after the worker announced itself idle, keeps a request made
/// between the drain and the park from being lost (without that read the model deadlocks).
#[test]
fn hook_request_vs_drain_and_park() {
    hook_requests(1);
}

/// Two requesters: one request may come while the worker runs the hook for the other (after
/// it took the flag), and must still be served. Bounded preemptions keep the model small.
#[test]
fn hook_requests_from_two_threads() {
    hook_requests(2);
}

fn hook_requests(requesters: usize) {
    let mut builder = loom::model::Builder::new();
    if requesters > 1 {
        builder.preemption_bound = Some(2);
    }
    builder.check(move || {
        let sleep = Arc::new(Sleep::new(1, 1));
        let released = Arc::new(AtomicUsize::new(0));
        let queued = Arc::new(AtomicUsize::new(0));
        let worker = {
            let (sleep, released, queued) = (sleep.clone(), released.clone(), queued.clone());
            thread::spawn(move || {
                sleep.register(0, crate::sync::current_thread());
                loop {
                    // `run_idle_hook`: take the request, then run the hook.
                    sleep.take_hook_request(0);
                    let n = queued.swap(0, Ordering::SeqCst);
                    if released.fetch_add(n, Ordering::SeqCst) + n == requesters {
                        break;
                    }
                    sleep.sleep(0, 0, None, || false, || false);
                }
            })
        };
        let droppers: Vec<_> = (1..requesters)
            .map(|_| {
                let (sleep, queued) = (sleep.clone(), queued.clone());
                thread::spawn(move || {
                    queued.fetch_add(1, Ordering::SeqCst);
                    sleep.request_hook(&[0]);
                })
            })
            .collect();
        queued.fetch_add(1, Ordering::SeqCst);
        sleep.request_hook(&[0]);
        for d in droppers {
            d.join().unwrap();
        }
        worker.join().unwrap();
        assert_eq!(released.load(Ordering::SeqCst), requesters);
    });
}

/// Work for a domain of groups 0 and 1, whose only worker is in group 1: `notify_groups`
/// reaches it however the push and its announce-and-re-check interleave.
#[test]
fn domain_push_wakes_a_worker_of_another_group() {
    loom::model(|| {
        let sleep = Arc::new(Sleep::new(2, 1));
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
                    sleep.sleep(0, 1, None, || queue.load(Ordering::SeqCst) > 0, || false);
                }
            })
        };
        queue.fetch_add(1, Ordering::SeqCst);
        sleep.notify_groups(&[0, 1]);
        worker.join().unwrap();
    });
}

/// The trace ring's seqlock: a worker appends records to a ring of two slots (a window of one)
/// while a reader copies it. Whatever the interleaving, every record the reader keeps is whole
/// (all its fields from one write) and is the one its index names, never an overwritten one;
/// after the worker is done, the window holds exactly the newest record.
#[test]
fn trace_ring_reader_keeps_only_whole_records() {
    use crate::trace::{Record, WorkerRing};

    fn record(i: u64) -> Record {
        Record {
            start: i,
            end: i,
            plan: i,
            word: i,
        }
    }

    loom::model(|| {
        let ring = Arc::new(WorkerRing::new(1));
        let writer = {
            let ring = ring.clone();
            thread::spawn(move || {
                for i in 1..=3 {
                    ring.push(record(i));
                }
            })
        };
        let reader = {
            let ring = ring.clone();
            thread::spawn(move || {
                let (kept, head) = ring.read_records(0);
                assert!(kept.len() <= 1);
                for (k, r) in kept.iter().enumerate() {
                    // Record index `head - kept.len() + k` was written with value index + 1.
                    let index = head - kept.len() as u64 + k as u64;
                    assert_eq!(*r, record(index + 1), "a torn or overwritten record");
                }
            })
        };
        writer.join().unwrap();
        reader.join().unwrap();
        assert_eq!(ring.read_records(0), (vec![record(3)], 3));
    });
}

/// 5. The switch to prioritized mode: a submitter sets `Registry::prioritized` (SeqCst), queues
///    a task on a level queue and notifies, while a worker that has looked at the normal queue
///    (empty) re-checks before parking with the flag read SeqCst, as `work_visible` does. The
///    worker must find the task (no lost wake-up: it would deadlock here).
#[test]
fn prioritized_switch_no_lost_wakeup() {
    use crate::sync::AtomicBool;
    loom::model(|| {
        let sleep = Arc::new(Sleep::new(1, 1));
        let flag = Arc::new(AtomicBool::new(false));
        let normal = Arc::new(AtomicUsize::new(0));
        let high = Arc::new(AtomicUsize::new(0));
        let worker = {
            let (sleep, flag, normal, high) =
                (sleep.clone(), flag.clone(), normal.clone(), high.clone());
            thread::spawn(move || {
                sleep.register(0, crate::sync::current_thread());
                let take = |q: &AtomicUsize| {
                    q.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                        .is_ok()
                };
                loop {
                    // find_task: the flag read Relaxed, then the levels.
                    if flag.load(Ordering::Relaxed) && take(&high) {
                        break;
                    }
                    if take(&normal) {
                        break;
                    }
                    sleep.sleep(
                        0,
                        0,
                        None,
                        || {
                            normal.load(Ordering::SeqCst) > 0
                                || (flag.load(Ordering::SeqCst) && high.load(Ordering::SeqCst) > 0)
                        },
                        || false,
                    );
                }
            })
        };
        // Registry::note_prioritized, inject, notify.
        flag.store(true, Ordering::SeqCst);
        high.fetch_add(1, Ordering::SeqCst);
        sleep.notify_any();
        worker.join().unwrap();
        assert_eq!(high.load(Ordering::SeqCst), 0);
    });
}

/// 6. Admission: with the one slot taken, a blocked submitter and an async one wait; the slot is
///    released while the async one withdraws (its drop). Whatever the interleaving, the blocked
///    one is admitted (no lost wake-up, also when the release's wake-up went to the withdrawn
///    one), the withdrawn one holds nothing, and its queue entry is gone.
#[test]
fn admission_release_vs_withdraw() {
    use crate::admission::{Admission, Ticket};
    use std::task::{Wake, Waker};
    struct Nop;
    impl Wake for Nop {
        fn wake(self: std::sync::Arc<Self>) {}
    }
    loom::model(|| {
        let adm = Arc::new(Admission::new(1));
        assert!(adm.try_acquire());
        let waker = Waker::from(std::sync::Arc::new(Nop));
        let mut ticket = Ticket::None;
        assert!(!adm.poll_acquire(&mut ticket, &waker));
        let blocked = {
            let adm = adm.clone();
            thread::spawn(move || {
                adm.acquire_blocking(|_| {});
            })
        };
        let withdraw = {
            let adm = adm.clone();
            thread::spawn(move || adm.cancel(ticket))
        };
        adm.release();
        withdraw.join().unwrap();
        blocked.join().unwrap();
        assert_eq!(adm.waiting(), 0);
        // The blocked submitter holds the slot: nothing else is admitted until it releases.
        assert!(!adm.try_acquire());
        adm.release();
        assert!(adm.try_acquire());
    });
}

/// The queue a `Completer`'s completion task goes to, in the models (the pool's injectors).
struct CompletionQueue(loom::sync::Mutex<Vec<Task<()>>>);

impl Queue<()> for CompletionQueue {
    fn push_completion(&self, t: Task<()>) {
        self.0.lock().unwrap().push(t);
    }
}

/// How the completer thread of [`completer_model`] ends its completer.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Call {
    Ok,
    Err,
    Dropped,
}

/// `a -> b`, `a`'s completion handed to a completer. Thread W runs `a`'s body (stores its
/// output, returns `Ok`) and completes `a` if the call came first; thread C calls (or drops)
/// the completer; this thread takes the completion task if C queued one and completes `a`.
/// Whoever completes `a` runs `b` when `a` succeeded, reading `a`'s output.
fn completer_model(how: Call) {
    loom::model(move || {
        let mut g = GraphBuilder::<()>::new("later");
        let a = g.node("a", |_| Ok(()));
        let b = g.node("b", |_| Ok(()));
        g.edge(a, b);
        let graph = g.build().expect("builds");
        let run = Arc::new(Run::new(1, graph.plan.clone()).expect("counters"));
        let queue = Arc::new(CompletionQueue(loom::sync::Mutex::new(Vec::new())));
        let (completer, handed) =
            hand_off(queue.clone() as Arc<dyn Queue<()>>, RunRef::new(&run), 0);
        // a's output (Relaxed: it reaches b only through the completion's hand-offs).
        let output = Arc::new(AtomicUsize::new(0));
        let completions = Arc::new(AtomicUsize::new(0));
        let finishes = Arc::new(AtomicUsize::new(0));
        let done_inline = Arc::new(AtomicUsize::new(0));
        // Completes `a` (`ok`) as a worker does, and runs `b` if that made it ready.
        let complete_a = {
            let (run, output, completions, finishes) = (
                run.clone(),
                output.clone(),
                completions.clone(),
                finishes.clone(),
            );
            move |ok: bool| {
                completions.fetch_add(1, Ordering::SeqCst);
                let (ready, fin) = complete(&run, 0, ok);
                if fin {
                    assert!(!ok, "a run whose b is ready is not over");
                    finishes.fetch_add(1, Ordering::SeqCst);
                }
                if ready == [1] {
                    assert_eq!(output.load(Ordering::Relaxed), 7, "b saw a's output");
                    let (more, fin) = complete(&run, 1, true);
                    assert!(more.is_empty() && fin);
                    finishes.fetch_add(1, Ordering::SeqCst);
                }
            }
        };
        let body = {
            let (run, output, done_inline, complete_a) = (
                run.clone(),
                output.clone(),
                done_inline.clone(),
                complete_a.clone(),
            );
            thread::spawn(move || {
                output.store(7, Ordering::Relaxed);
                match handed.body_returned() {
                    None => {}
                    Some(res) => {
                        if let Err(e) = &res {
                            run.fail(Error::new(ErrorKind::NodeFailed, e.to_string()));
                        }
                        complete_a(res.is_ok());
                        done_inline.store(1, Ordering::SeqCst);
                    }
                }
            })
        };
        let caller = thread::spawn(move || {
            let c: Completer = completer;
            match how {
                Call::Ok => c.complete(Ok(())),
                Call::Err => c.complete(Err("lost".into())),
                Call::Dropped => drop(c),
            }
        });
        // The worker that takes a queued completion.
        loop {
            if done_inline.load(Ordering::SeqCst) == 1 {
                break;
            }
            let task = queue.0.lock().unwrap().pop();
            if let Some(t) = task {
                assert_eq!(t.node(), 0);
                let ok = t.completed().expect("a completion task");
                assert_eq!(ok, how == Call::Ok);
                complete_a(ok);
                break;
            }
            thread::yield_now();
        }
        body.join().unwrap();
        caller.join().unwrap();
        assert_eq!(completions.load(Ordering::SeqCst), 1, "a completed once");
        assert_eq!(finishes.load(Ordering::SeqCst), 1, "the run finished once");
        assert!(queue.0.lock().unwrap().is_empty());
        assert_eq!(run.inflight.load(Ordering::SeqCst), 0);
        match run.take_result() {
            Ok(_) => assert_eq!(how, Call::Ok),
            Err(e) => {
                assert_ne!(how, Call::Ok);
                assert_eq!(e.kind(), ErrorKind::NodeFailed);
                assert_eq!(e.cancelled_nodes(), 1, "b never ran");
            }
        }
    });
}

/// The body returns `Ok` against a completer called with success (model 9).
#[test]
fn completer_rendezvous() {
    completer_model(Call::Ok);
}

/// The body returns `Ok` against a completer called with an error, or dropped (model 9).
#[test]
fn completer_rendezvous_with_an_error() {
    completer_model(Call::Err);
    completer_model(Call::Dropped);
}

/// A body that fails (its worker completes the node as failed and drops its side of the
/// rendezvous) against the completer's call, with success or an error: the call queues
/// nothing and the run finishes once, failed (model 9).
#[test]
fn completer_after_a_failed_body() {
    for how in [Call::Ok, Call::Err] {
        loom::model(move || {
            let mut g = GraphBuilder::<()>::new("later");
            let a = g.node("a", |_| Ok(()));
            let b = g.node("b", |_| Ok(()));
            g.edge(a, b);
            let graph = g.build().expect("builds");
            let run = Arc::new(Run::new(1, graph.plan.clone()).expect("counters"));
            let queue = Arc::new(CompletionQueue(loom::sync::Mutex::new(Vec::new())));
            let (completer, handed) =
                hand_off(queue.clone() as Arc<dyn Queue<()>>, RunRef::new(&run), 0);
            let caller = thread::spawn(move || match how {
                Call::Ok => completer.complete(Ok(())),
                _ => completer.complete(Err("late".into())),
            });
            run.fail(Error::new(ErrorKind::NodeFailed, "node 'a' failed"));
            let (ready, fin) = complete(&run, 0, false);
            drop(handed);
            assert!(ready.is_empty() && fin);
            caller.join().unwrap();
            assert!(
                queue.0.lock().unwrap().is_empty(),
                "the call queued nothing"
            );
            let e = run.take_result().unwrap_err();
            assert_eq!(e.to_string(), "node 'a' failed (1 node(s) cancelled)");
        });
    }
}

/// 10. The active-run table: a run leaves its shard while another thread closes the table and
///     then waits for the end; a third run tries to enter meanwhile. The end comes exactly once,
///     the waiter wakes (no lost wake-up), and an entered run is one the close saw.
#[test]
fn active_runs_close_vs_leave_and_enter() {
    use crate::active::ActiveRuns;
    loom::model(|| {
        let t = Arc::new(ActiveRuns::<u32>::new(2));
        assert!(t.enter(0, &Arc::new(0)));
        let ended = Arc::new(AtomicUsize::new(0));
        let leaver = {
            let (t, ended) = (t.clone(), ended.clone());
            thread::spawn(move || {
                assert!(t
                    .leave(0, || {
                        ended.fetch_add(1, Ordering::SeqCst);
                    })
                    .is_some());
            })
        };
        let entrant = {
            let t = t.clone();
            thread::spawn(move || t.enter(1, &Arc::new(1)))
        };
        let seen = AtomicUsize::new(0);
        t.close(
            |r| {
                if *r == 1 {
                    seen.fetch_add(1, Ordering::SeqCst);
                }
            },
            || {
                ended.fetch_add(1, Ordering::SeqCst);
            },
        );
        let entered = entrant.join().unwrap();
        assert_eq!(entered, seen.load(Ordering::SeqCst) == 1);
        if entered {
            assert!(!t.is_terminated(), "the entered run is still active");
            assert!(t
                .leave(1, || {
                    ended.fetch_add(1, Ordering::SeqCst);
                })
                .is_some());
        }
        // Waits while the leaver may still be ending the shutdown.
        t.wait_terminated();
        leaver.join().unwrap();
        assert_eq!(ended.load(Ordering::SeqCst), 1);
    });
}

/// 11. The active-run table's count: one client's run leaves its shard and its next run enters
///     another while a third thread counts. The count is a snapshot: never both runs.
#[test]
fn active_runs_count_is_a_snapshot() {
    use crate::active::ActiveRuns;
    loom::model(|| {
        let t = Arc::new(ActiveRuns::<u32>::new(2));
        assert!(t.enter(0, &Arc::new(0)));
        let client = {
            let t = t.clone();
            thread::spawn(move || {
                assert!(t.leave(0, || {}).is_some());
                assert!(t.enter(1, &Arc::new(1)));
            })
        };
        assert!(t.len() <= 1, "one run at a time, counted once");
        client.join().unwrap();
        assert_eq!(t.len(), 1);
    });
}
