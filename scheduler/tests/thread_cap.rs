//! The thread cap (its own test binary, one test, so nothing else changes the thread count):
//! 64 submitter threads submit 10,000 graphs in all; the process's OS threads, sampled throughout,
//! never exceed baseline + pool size + 64 submitters, and the pool's threads stay at its size.

#[allow(dead_code)]
mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use boundpool_scheduler::{BoxError, Cores, GraphBuilder, NodeRef, PoolBuilder};

#[cfg(not(miri))]
const SUBMITTERS: usize = 64;
#[cfg(not(miri))]
const GRAPHS: usize = 10_000;
// Under Miri (an interpreter) the same pattern, smaller.
#[cfg(miri)]
const SUBMITTERS: usize = 4;
#[cfg(miri)]
const GRAPHS: usize = 40;
const WORKERS: usize = 4;

#[test]
#[cfg_attr(
    miri,
    ignore = "thread counts come from /proc, which under Miri describes the interpreter"
)]
fn os_threads_stay_bounded_under_many_submitters() {
    common::with_deadline(120, "thread_cap", || {
        // The sampler runs before the baseline is taken, so it is part of it.
        let stop = Arc::new(AtomicBool::new(false));
        let peak = Arc::new(AtomicUsize::new(0));
        let peak_pool = Arc::new(AtomicUsize::new(0));
        let samples = Arc::new(AtomicUsize::new(0));
        let sampler = {
            let (stop, peak, peak_pool, samples) = (
                stop.clone(),
                peak.clone(),
                peak_pool.clone(),
                samples.clone(),
            );
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    peak.fetch_max(common::os_threads(), Ordering::SeqCst);
                    peak_pool.fetch_max(common::threads_named("cap-"), Ordering::SeqCst);
                    samples.fetch_add(1, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_micros(500));
                }
            })
        };
        std::thread::sleep(Duration::from_millis(5));
        let baseline = common::os_threads();

        let pool = PoolBuilder::new()
            .name("cap")
            .workers(WORKERS)
            .cores(Cores::Unpinned)
            .build()
            .unwrap();
        assert_eq!(common::threads_named("cap-"), WORKERS);
        assert_eq!(common::os_threads(), baseline + WORKERS);

        // A diamond, and a graph with a nested submission, so workers also wait on graphs.
        let mut g = GraphBuilder::<()>::new("diamond");
        let a = g.node("a", |_| Ok(1u64));
        let mids: Vec<NodeRef<u64>> = (0..8u64)
            .map(|k| g.node(format!("m{k}"), move |ctx| Ok(ctx.input(a)? + k)))
            .collect();
        let ms = mids.clone();
        let sink = g.node("sink", move |ctx| {
            ms.iter()
                .try_fold(0u64, |s, &m| Ok::<_, BoxError>(s + ctx.input(m)?))
        });
        for &m in &mids {
            g.edge(a, m).edge(m, sink);
        }
        let diamond = g.build().unwrap();
        let mut g = GraphBuilder::<()>::new("nesting");
        let inner = diamond.clone();
        let outer = g.node("outer", move |ctx| -> Result<u64, BoxError> {
            Ok(*ctx.submit(&inner)?.wait()?.get(sink).unwrap())
        });
        let nesting = g.build().unwrap();

        let done = AtomicUsize::new(0);
        // The sampler thread competes with 68 busy threads for 2 cores, so the submitters sample
        // too: the thread count after every wait, the pool's threads by name now and then.
        let pool_threads_mid = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for t in 0..SUBMITTERS {
                let (pool, diamond, nesting, done, peak, pool_threads_mid) =
                    (&pool, &diamond, &nesting, &done, &peak, &pool_threads_mid);
                s.spawn(move || {
                    let mine = GRAPHS / SUBMITTERS + usize::from(t < GRAPHS % SUBMITTERS);
                    let mut pending = Vec::new();
                    for i in 0..mine {
                        if i % 10 == 0 {
                            pending.push((true, pool.submit(nesting).unwrap()));
                        } else {
                            pending.push((false, pool.submit(diamond).unwrap()));
                        }
                        // Keep a few graphs in flight per submitter.
                        if pending.len() >= 4 || i + 1 == mine {
                            for (nested, h) in pending.drain(..) {
                                let out = h.wait().unwrap();
                                if nested {
                                    assert_eq!(out.get(outer), Some(&36));
                                } else {
                                    assert_eq!(out.get(sink), Some(&36));
                                }
                                done.fetch_add(1, Ordering::SeqCst);
                            }
                            peak.fetch_max(common::os_threads(), Ordering::SeqCst);
                        }
                        if i == mine / 2 {
                            pool_threads_mid
                                .fetch_max(common::threads_named("cap-"), Ordering::SeqCst);
                        }
                    }
                });
            }
        });
        assert_eq!(done.load(Ordering::SeqCst), GRAPHS);
        // Scoped threads are waited for, not joined: let them leave /proc first.
        let settled = common::eventually(10, || common::os_threads() == baseline + WORKERS);
        let after = common::os_threads();
        stop.store(true, Ordering::SeqCst);
        sampler.join().unwrap();

        let stats = pool.stats();
        let nested = (0..SUBMITTERS)
            .map(|t| (GRAPHS / SUBMITTERS + usize::from(t < GRAPHS % SUBMITTERS)).div_ceil(10))
            .sum::<usize>();
        assert_eq!(stats.graphs_submitted as usize, GRAPHS + nested);
        assert_eq!(stats.graphs_completed as usize, GRAPHS + nested);
        let peak = peak.load(Ordering::SeqCst);
        assert!(
            samples.load(Ordering::SeqCst) > 10,
            "the sampler ran throughout"
        );
        assert!(
            peak <= baseline + WORKERS + SUBMITTERS,
            "peak OS threads {peak} > baseline {baseline} + pool {WORKERS} + submitters {SUBMITTERS}"
        );
        assert!(
            peak_pool.load(Ordering::SeqCst) <= WORKERS,
            "the pool never had more threads than its size"
        );
        assert_eq!(
            pool_threads_mid.load(Ordering::SeqCst),
            WORKERS,
            "the pool's threads while graphs ran"
        );
        assert_eq!(common::threads_named("cap-"), WORKERS);
        assert!(
            settled,
            "submitters are gone, the pool's threads remain: {after} threads, baseline {baseline}"
        );
        drop(pool);
        // The sampler was joined too: back to the baseline less the sampler.
        assert!(
            common::eventually(5, || common::os_threads() == baseline - 1),
            "{} threads after drop",
            common::os_threads()
        );
    });
}
