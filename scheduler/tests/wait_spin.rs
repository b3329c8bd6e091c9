//! Waiters that spin (`PoolBuilder::wait_spin`) within the pool's budget
//! (`PoolBuilder::spinning_waiters`): every wait still returns its graph's output, whatever the
//! budget and the levels of the graphs waited on; a waiter outside the budget parks (its thread
//! uses no CPU while it waits), and one of a high-level graph spins even with no budget.

#[allow(dead_code)] // each test binary uses a subset of the helpers
mod common;

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use boundpool_scheduler::{GraphBuilder, Pool, Priority};
use common::{pool_builder, with_deadline};

/// A graph of one node that sleeps `ms` (on its worker) and returns `v`.
fn sleeper(
    level: Priority,
    ms: u64,
    v: u64,
) -> (
    boundpool_scheduler::Graph,
    boundpool_scheduler::NodeRef<u64>,
) {
    let mut g = GraphBuilder::new("sleeper");
    g.priority(level);
    let n = g.node("sleep", move |_| {
        std::thread::sleep(Duration::from_millis(ms));
        Ok(v)
    });
    (g.build().expect("build"), n)
}

/// This thread's time on a core so far (`/proc/thread-self/schedstat`), if the OS says.
fn cpu_time() -> Option<Duration> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let ns: u64 = s.split_whitespace().next()?.parse().ok()?;
    Some(Duration::from_nanos(ns))
}

/// The CPU time of this thread during a wait on a graph that sleeps `ms`, and the wall time.
fn wait_cost(pool: &Pool, level: Priority, ms: u64) -> Option<(Duration, Duration)> {
    let (g, n) = sleeper(level, ms, 7);
    let c0 = cpu_time()?;
    let t0 = Instant::now();
    let out = pool.submit(&g).expect("submit").wait().expect("wait");
    let wall = t0.elapsed();
    assert_eq!(out.get(n), Some(&7));
    Some((cpu_time()? - c0, wall))
}

#[test]
fn every_wait_returns_its_output_whatever_the_budget_and_levels() {
    with_deadline(60, "mixed waits", || {
        for budget in [0, 1, 64] {
            let pool = Arc::new(
                pool_builder("wait-spin", 2)
                    .wait_spin(Duration::from_millis(2))
                    .spinning_waiters(budget)
                    .build()
                    .expect("pool"),
            );
            let start = Arc::new(Barrier::new(8));
            let waiters: Vec<_> = (0..8u64)
                .map(|t| {
                    let (pool, start) = (pool.clone(), start.clone());
                    std::thread::spawn(move || {
                        let level = match t % 3 {
                            0 => Priority::High,
                            1 => Priority::Normal,
                            _ => Priority::Low,
                        };
                        start.wait();
                        for r in 0..20 {
                            let (g, n) = sleeper(level, r % 2, t * 100 + r);
                            let out = pool.submit(&g).expect("submit").wait().expect("wait");
                            assert_eq!(out.get(n), Some(&(t * 100 + r)));
                        }
                    })
                })
                .collect();
            for w in waiters {
                w.join().expect("waiter");
            }
        }
    });
}

#[test]
fn a_waiter_outside_the_budget_parks_and_a_high_one_spins() {
    with_deadline(60, "spin or park", || {
        let pool = pool_builder("wait-park", 1)
            .wait_spin(Duration::from_secs(10))
            .spinning_waiters(0)
            .build()
            .expect("pool");
        let Some((parked_cpu, parked_wall)) = wait_cost(&pool, Priority::Normal, 200) else {
            eprintln!("SKIPPED: no /proc/thread-self/schedstat on this OS");
            return;
        };
        // Parked at once: a few wake-ups' worth of CPU, not the 200 ms it waited.
        assert!(
            parked_cpu < parked_wall / 4,
            "a normal waiter with no budget used {parked_cpu:?} of CPU in a {parked_wall:?} wait"
        );
        // A high waiter spins (yielding between looks) through the whole wait.
        let (spun_cpu, spun_wall) = wait_cost(&pool, Priority::High, 200).expect("schedstat");
        assert!(
            spun_cpu > parked_cpu * 4 && spun_cpu > spun_wall / 10,
            "a high waiter used {spun_cpu:?} of CPU in a {spun_wall:?} wait (the parked one {parked_cpu:?})"
        );
    });
}
