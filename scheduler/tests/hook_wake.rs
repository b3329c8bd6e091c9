//! A `GroupWaker` request is never lost, whatever the workers are doing when it comes: busy,
//! spinning before they park, running the idle hook, or parked. The idle hook here drains a
//! queue filled from foreign threads the way the GPU backend's release queue is (push, then
//! wake only when the queue's "pending" flag goes up), so one lost wake-up leaves items queued
//! for good and the hang guard fails the test.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use boundpool_scheduler::backend::{FromIndex, GroupWaker, PoolBuilderExt, PoolExt};
use boundpool_scheduler::{Cores, DomainId, GraphBuilder, GroupId, GroupSpec, PoolBuilder};

/// A release queue like the GPU device's: items pushed from any thread, drained by the idle
/// hook; the waker is called only by the push that raises `pending`.
#[derive(Default)]
struct ReleaseQueue {
    items: Mutex<Vec<u64>>,
    pending: AtomicBool,
    drained: AtomicUsize,
    waker: Mutex<Option<GroupWaker>>,
}

impl ReleaseQueue {
    fn push(&self, v: u64) {
        self.items.lock().unwrap().push(v);
        if !self.pending.swap(true, Ordering::AcqRel) {
            if let Some(w) = &*self.waker.lock().unwrap() {
                w.wake();
            }
        }
    }

    /// The idle hook's part.
    fn drain(&self) {
        if !self.pending.swap(false, Ordering::AcqRel) {
            return;
        }
        let batch = std::mem::take(&mut *self.items.lock().unwrap());
        self.drained.fetch_add(batch.len(), Ordering::SeqCst);
    }

    fn queued(&self) -> usize {
        self.items.lock().unwrap().len()
    }
}

/// Pushes land while the workers are in every state: each round runs a short graph (so the
/// workers are busy, then spin, then park) and the foreign threads push after staggered
/// delays from 0 to 40 µs after it returned (a worker spins for 20 µs before it parks). Every round must be drained by the idle hook
/// alone (no later submission helps), within a generous hang guard.
fn drops_into_idle_pool(domain: bool) {
    const FOREIGN: usize = 4;
    const ROUNDS: usize = 3000;
    const PER_THREAD: usize = 4;
    let queue = Arc::new(ReleaseQueue::default());
    let q = queue.clone();
    let mut builder = PoolBuilder::new().name("hookwake").groups(vec![
        GroupSpec::new("dev.0", 1).cores(Cores::Unpinned),
        GroupSpec::new("dev.1", 1).cores(Cores::Unpinned),
        GroupSpec::new("other", 1).cores(Cores::Unpinned),
    ]);
    if domain {
        builder = builder.domain("dev", [GroupId::from_index(0), GroupId::from_index(1)]);
    }
    let pool = builder
        .idle_hook(move |info, _| {
            // Only the device's workers may release (as only they are bound).
            if info.group.index() < 2 {
                q.drain();
                // A hook takes time (the GPU one makes driver calls): pushes land while it
                // runs, after it looked.
                let t0 = Instant::now();
                while t0.elapsed() < Duration::from_micros(5) {
                    std::hint::spin_loop();
                }
            }
        })
        .build()
        .unwrap();
    let waker = if domain {
        pool.domain_waker(DomainId::from_index(0))
    } else {
        pool.group_waker(GroupId::from_index(0))
    };
    *queue.waker.lock().unwrap() = Some(waker);

    let mut g = GraphBuilder::<()>::new("burst");
    let src = g.node("src", |_| Ok(()));
    g.place(src, GroupId::from_index(0));
    for i in 0..8 {
        let n = g.node(format!("n{i}"), |_| Ok(()));
        g.place(n, GroupId::from_index(i % 2));
        g.edge(src, n);
    }
    let graph = g.build().unwrap();

    let start = Arc::new(Barrier::new(FOREIGN + 1));
    let done = Arc::new(Barrier::new(FOREIGN + 1));
    let stop = Arc::new(AtomicBool::new(false));
    let round = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..FOREIGN)
        .map(|t| {
            let (queue, start, done, stop, round) = (
                queue.clone(),
                start.clone(),
                done.clone(),
                stop.clone(),
                round.clone(),
            );
            std::thread::spawn(move || loop {
                start.wait();
                if stop.load(Ordering::SeqCst) {
                    return;
                }
                let r = round.load(Ordering::SeqCst);
                // Staggered: some pushes land while the workers still spin, some as they
                // park, some after.
                let delay = Duration::from_nanos(((r * 7 + t * 131) % 400) as u64 * 100);
                let t0 = Instant::now();
                while t0.elapsed() < delay {
                    std::hint::spin_loop();
                }
                for k in 0..PER_THREAD {
                    queue.push((r * 1000 + t * 10 + k) as u64);
                }
                done.wait();
            })
        })
        .collect();

    let guard = Duration::from_secs(10);
    let mut expected = 0;
    for r in 0..ROUNDS {
        pool.run(&graph).unwrap();
        round.store(r, Ordering::SeqCst);
        start.wait();
        done.wait();
        expected += FOREIGN * PER_THREAD;
        let t0 = Instant::now();
        while queue.drained.load(Ordering::SeqCst) < expected {
            assert!(
                t0.elapsed() < guard,
                "round {r}: {} item(s) still queued {guard:?} after the drops into an idle pool \
                 (a lost wake-up)",
                queue.queued()
            );
            std::thread::sleep(Duration::from_micros(50));
        }
    }
    stop.store(true, Ordering::SeqCst);
    start.wait();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(queue.queued(), 0);
}

#[test]
fn group_waker_request_is_never_lost() {
    drops_into_idle_pool(false);
}

#[test]
fn domain_waker_request_is_never_lost() {
    drops_into_idle_pool(true);
}

/// A request that comes while every worker is busy is served by the busy worker within 64
/// nodes: a long chain on the one worker of the group, a push from outside at its start, and
/// the queue is drained before the chain ends.
#[test]
fn busy_worker_serves_a_request_within_64_nodes() {
    let queue = Arc::new(ReleaseQueue::default());
    let q = queue.clone();
    let pool = PoolBuilder::new()
        .name("busyhook")
        .workers(1)
        .cores(Cores::Unpinned)
        .idle_hook(move |_, _| q.drain())
        .build()
        .unwrap();
    *queue.waker.lock().unwrap() = Some(pool.group_waker(GroupId::from_index(0)));
    let pushed_at = Arc::new(AtomicUsize::new(usize::MAX));
    let drained_by = Arc::new(AtomicUsize::new(usize::MAX));
    let mut g = GraphBuilder::<()>::new("chain");
    let mut prev = None;
    for i in 0..1000usize {
        let (queue, pushed_at, drained_by) = (queue.clone(), pushed_at.clone(), drained_by.clone());
        let n = g.node(format!("n{i}"), move |_| {
            if i == 10 {
                // From a foreign thread, while this worker is busy.
                let q = queue.clone();
                std::thread::spawn(move || q.push(1)).join().unwrap();
                pushed_at.store(i, Ordering::SeqCst);
            }
            if queue.drained.load(Ordering::SeqCst) == 1
                && drained_by.load(Ordering::SeqCst) == usize::MAX
            {
                drained_by.store(i, Ordering::SeqCst);
            }
            Ok(())
        });
        if let Some(p) = prev {
            g.edge(p, n);
        }
        prev = Some(n);
    }
    pool.run(&g.build().unwrap()).unwrap();
    let (p, d) = (
        pushed_at.load(Ordering::SeqCst),
        drained_by.load(Ordering::SeqCst),
    );
    assert_eq!(p, 10);
    assert!(
        d != usize::MAX && d - p <= 64 + 1,
        "pushed at node {p}, drained by node {d}"
    );
}
