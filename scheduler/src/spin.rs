//! Which waiters may spin (`PoolBuilder::wait_spin`). A spinning waiter holds a core; where the
//! pool's workers and its clients already fill the machine's cores, it takes one that a
//! latency-critical waiter or a worker needs, which then waits for a core while its work is
//! done (docs/benchmarks.md, "where the high client's tail comes from"). So a waiter of a
//! high-level run may always spin; a waiter of another level only while no high one watches
//! and fewer than the pool's budget of others spin, and stops as soon as a high one starts.
//! The rest park at once, and their wake-up places them on a free core. A high waiter yields
//! between looks only on a core a worker of the pool is pinned to, or in a pool of unpinned
//! workers (`on_worker_core`).

use std::sync::atomic::{AtomicUsize, Ordering};

/// A pool's spinning waiters.
#[derive(Debug)]
#[cfg_attr(loom, allow(dead_code))]
pub(crate) struct Spinners {
    /// Waiters of high-level runs watching now.
    high: AtomicUsize,
    /// Other waiters spinning now.
    others: AtomicUsize,
    /// The most other waiters that may spin at once.
    budget: usize,
    /// The cores the pool's workers are pinned to, one bit each.
    worker_cores: Vec<u64>,
}

/// One waiter counted as spinning until dropped.
#[cfg_attr(loom, allow(dead_code))]
pub(crate) struct Spinning<'a>(&'a AtomicUsize);

impl Drop for Spinning<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg_attr(loom, allow(dead_code))]
impl Spinners {
    /// `budget` other spinning waiters at most; `worker_cores`: where the pool's workers are
    /// pinned.
    pub(crate) fn new(budget: usize, worker_cores: impl IntoIterator<Item = usize>) -> Self {
        let mut bits = Vec::new();
        for c in worker_cores {
            if bits.len() <= c / 64 {
                bits.resize(c / 64 + 1, 0u64);
            }
            bits[c / 64] |= 1 << (c % 64);
        }
        Spinners {
            high: AtomicUsize::new(0),
            others: AtomicUsize::new(0),
            budget,
            worker_cores: bits,
        }
    }

    /// Whether core `c` is one a worker of the pool is pinned to.
    fn is_worker_core(&self, c: usize) -> bool {
        self.worker_cores
            .get(c / 64)
            .is_some_and(|w| w & (1 << (c % 64)) != 0)
    }

    /// Whether the calling thread runs on a core a worker of the pool is pinned to. Where the
    /// core is unknown, or no worker is pinned (unpinned workers run anywhere): yes, the
    /// cautious answer.
    pub(crate) fn on_worker_core(&self) -> bool {
        self.worker_cores.is_empty() || current_core().is_none_or(|c| self.is_worker_core(c))
    }

    /// A waiter of a high-level run starts watching.
    pub(crate) fn high(&self) -> Spinning<'_> {
        self.high.fetch_add(1, Ordering::Relaxed);
        Spinning(&self.high)
    }

    /// A waiter of another level asks to spin: `None` (park) while a high one watches or the
    /// budget is taken.
    pub(crate) fn other(&self) -> Option<Spinning<'_>> {
        if self.high_watching() {
            return None;
        }
        if self.others.fetch_add(1, Ordering::Relaxed) >= self.budget {
            self.others.fetch_sub(1, Ordering::Relaxed);
            return None;
        }
        Some(Spinning(&self.others))
    }

    /// Whether a waiter of a high-level run watches (a spinning other then stops).
    #[inline]
    pub(crate) fn high_watching(&self) -> bool {
        self.high.load(Ordering::Relaxed) > 0
    }
}

/// The core the calling thread runs on now (`sched_getcpu`: a vDSO read, no system call).
#[cfg(target_os = "linux")]
fn current_core() -> Option<usize> {
    // SAFETY: sched_getcpu takes no arguments and only reads the calling thread's CPU.
    let c = unsafe { libc::sched_getcpu() };
    usize::try_from(c).ok()
}

#[cfg(not(target_os = "linux"))]
fn current_core() -> Option<usize> {
    None
}

/// The default budget of other spinning waiters: the cores this process may use (`cores`),
/// less the pool's `workers`, less one for the rest of the process.
pub(crate) fn default_budget(cores: usize, workers: usize) -> usize {
    cores.saturating_sub(workers).saturating_sub(1)
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn others_spin_within_the_budget_and_give_way_to_a_high_waiter() {
        let s = Spinners::new(2, []);
        let a = s.other().expect("first within the budget");
        let b = s.other().expect("second within the budget");
        assert!(s.other().is_none(), "a third is over the budget");
        drop(a);
        let c = s.other().expect("a slot was given back");
        let h = s.high();
        assert!(s.high_watching());
        assert!(s.other().is_none(), "none while a high waiter watches");
        let h2 = s.high();
        drop(h);
        assert!(s.high_watching(), "a second high waiter still watches");
        drop(h2);
        assert!(!s.high_watching());
        drop((b, c));
        assert!(
            s.other().is_some(),
            "slots come back when high waiters leave"
        );
    }

    #[test]
    fn a_zero_budget_parks_every_other_waiter() {
        let s = Spinners::new(0, []);
        assert!(s.other().is_none());
        let _h = s.high();
        assert!(s.high_watching());
    }

    #[test]
    fn worker_cores_are_known_by_number() {
        let s = Spinners::new(1, [0, 3, 70]);
        assert!(s.is_worker_core(0) && s.is_worker_core(3) && s.is_worker_core(70));
        assert!(!s.is_worker_core(1) && !s.is_worker_core(64) && !s.is_worker_core(200));
        let none = Spinners::new(1, []);
        assert!(!none.is_worker_core(0));
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn the_current_core_is_known_on_linux() {
        assert!(current_core().is_some(), "sched_getcpu answers");
        let every = Spinners::new(0, 0..4096);
        assert!(every.on_worker_core(), "every core is a worker's here");
        let elsewhere = Spinners::new(0, [4096]);
        assert!(
            !elsewhere.on_worker_core(),
            "the one worker is on no core of this machine"
        );
        let unpinned = Spinners::new(0, []);
        assert!(
            unpinned.on_worker_core(),
            "unpinned workers may be on any core"
        );
    }

    #[test]
    fn the_default_budget_leaves_the_workers_and_one_core() {
        assert_eq!(default_budget(16, 8), 7);
        assert_eq!(default_budget(2, 2), 0);
        assert_eq!(default_budget(2, 1), 0);
        assert_eq!(default_budget(4, 1), 2);
    }
}
