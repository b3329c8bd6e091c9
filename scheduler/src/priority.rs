//! Priority levels and the queues of the levels other than [`Priority::Normal`].
//!
//! The normal level uses the pool's original queues (each worker's deque, the group, domain and
//! pool-wide injectors), so a pool that never sees another level runs exactly the code it ran
//! before priorities existed. The first graph with a high or low node switches the pool to
//! prioritized mode (`Registry::prioritized`, never switched back): from then on a worker looking
//! for work polls high → normal → low, except that every `SHARE_EVERY`-th task it takes is
//! looked for low-first, and the one half a period later normal-first, so neither of the lower
//! levels is ever starved (a fixed share of at least one take in `SHARE_EVERY` while it has
//! work). The order itself is `policy.rs`'s, which the simulator shares.

use crossbeam_deque::{Injector, Stealer, Worker as Deque};

// `Priority` itself is a leaf type (`ids.rs`); the run side's modules name it through here.
pub(crate) use crate::ids::Priority;

// The poll order and its period are the shared work-taking policy's (`policy.rs`).
#[cfg(test)]
use crate::policy::{poll_order, SHARE_EVERY};

/// The queues of one non-default level, shaped like the normal level's, of tasks `T` (the
/// registry's `run::Task`s: this module knows nothing of them).
pub(crate) struct LevelQueues<T> {
    /// Per group, in `GroupId` order.
    pub(crate) groups: Box<[Injector<T>]>,
    /// Per domain, in `DomainId` order.
    pub(crate) domains: Box<[Injector<T>]>,
    /// Ready nodes with no placement, from threads that are not workers of this pool.
    pub(crate) any: Injector<T>,
    /// Each worker's deque of this level.
    pub(crate) stealers: Box<[Stealer<T>]>,
}

impl<T> LevelQueues<T> {
    /// The level's queues and each worker's deque of it.
    pub(crate) fn new(groups: usize, domains: usize, workers: usize) -> (Self, Vec<Deque<T>>) {
        let deques: Vec<Deque<T>> = (0..workers).map(|_| Deque::new_lifo()).collect();
        let level = LevelQueues {
            groups: (0..groups).map(|_| Injector::new()).collect(),
            domains: (0..domains).map(|_| Injector::new()).collect(),
            any: Injector::new(),
            stealers: deques.iter().map(|d| d.stealer()).collect(),
        };
        (level, deques)
    }

    pub(crate) fn len(&self) -> usize {
        self.groups.iter().map(|i| i.len()).sum::<usize>()
            + self.domains.iter().map(|i| i.len()).sum::<usize>()
            + self.any.len()
            + self.stealers.iter().map(|s| s.len()).sum::<usize>()
    }
}

/// A worker's deques: the normal level's (the original one) and those of high and low.
pub(crate) struct WorkerDeques<T> {
    pub(crate) normal: Deque<T>,
    pub(crate) high: Deque<T>,
    pub(crate) low: Deque<T>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bits_round_trip() {
        for p in [Priority::High, Priority::Normal, Priority::Low] {
            assert_eq!(Priority::from_bits(p.bits()), p);
        }
        assert_eq!(Priority::Normal.bits(), 0);
    }

    #[test]
    fn every_level_is_first_at_least_once_per_period() {
        let firsts: Vec<Priority> = (1..=SHARE_EVERY).map(|n| poll_order(n)[0]).collect();
        for p in [Priority::High, Priority::Normal, Priority::Low] {
            assert!(firsts.contains(&p), "{p:?} never first");
        }
        assert_eq!(
            firsts.iter().filter(|&&p| p == Priority::High).count() as u32,
            SHARE_EVERY - 2
        );
    }
}
