//! Finding work: the own deque, the group's, domains' and pool-wide injectors, stealing from
//! the group's other workers, level by level in a pool that has seen priorities; and the
//! re-check of every queue before parking.

use crossbeam_deque::{Injector, Steal, Stealer, Worker as Deque};

use super::WorkerThread;
use crate::priority::{poll_order, Priority};
use crate::run::Task;
use crate::sync::Ordering;

/// A worker's view of one level: (own deque, group injector, pool-wide injector, stealers).
type LevelRefs<'a, S> = (
    &'a Deque<Task<S>>,
    &'a Injector<Task<S>>,
    &'a Injector<Task<S>>,
    &'a [Stealer<Task<S>>],
);

impl<S: Send + 'static> WorkerThread<S> {
    pub(super) fn next_rand(&self) -> usize {
        // xorshift64*: cheap victim selection.
        let mut x = self.rng.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng.set(x);
        (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 32) as usize
    }

    pub(super) fn find_task(&self) -> Option<Task<S>> {
        if self.registry.prioritized.load(Ordering::Relaxed) {
            return self.find_task_prioritized();
        }
        // The normal level is the only one in a pool that never saw a priority.
        loop {
            match self.take_at(Priority::Normal) {
                Steal::Success(t) => return Some(t),
                Steal::Retry => {}
                Steal::Empty => return None,
            }
        }
    }

    /// `find_task` in a pool that has seen another level than normal: each take polls the
    /// levels in the order `poll_order` gives (high → normal → low but for the fixed shares).
    #[inline(never)]
    pub(super) fn find_task_prioritized(&self) -> Option<Task<S>> {
        let n = self.takes.get().wrapping_add(1);
        loop {
            let mut retry = false;
            for level in poll_order(n) {
                match self.take_at(level) {
                    Steal::Success(t) => {
                        self.takes.set(n);
                        return Some(t);
                    }
                    Steal::Retry => retry = true,
                    Steal::Empty => {}
                }
            }
            if !retry {
                return None;
            }
        }
    }

    /// This worker's deque and the queues it may take from, of level `p`.
    #[inline]
    pub(super) fn level_queues(&self, p: Priority) -> LevelRefs<'_, S> {
        let reg = &*self.registry;
        match p {
            Priority::Normal => (
                &self.local,
                &reg.groups[self.group].injector,
                &reg.any,
                &reg.stealers,
            ),
            Priority::High => (
                &self.high,
                &reg.high.groups[self.group],
                &reg.high.any,
                &reg.high.stealers,
            ),
            Priority::Low => (
                &self.low,
                &reg.low.groups[self.group],
                &reg.low.any,
                &reg.low.stealers,
            ),
        }
    }

    /// The domain injector `d` of level `p`.
    #[inline]
    pub(super) fn domain_injector(&self, p: Priority, d: u32) -> &Injector<Task<S>> {
        let reg = &*self.registry;
        match p {
            Priority::Normal => &reg.domains[d as usize].injector,
            p => &reg.level(p).domains[d as usize],
        }
    }

    /// One look at level `p`: own deque, the group's injector, those of its domains (none in
    /// most pools), the pool-wide one, then the group's other workers' deques.
    #[inline]
    pub(super) fn take_at(&self, p: Priority) -> Steal<Task<S>> {
        let (local, group_inj, any, stealers) = self.level_queues(p);
        if let Some(t) = local.pop() {
            return Steal::Success(t);
        }
        let reg = &*self.registry;
        let group = &reg.groups[self.group];
        let mut retry = false;
        // A domain's tasks are taken one at a time: a batch would land in this worker's deque,
        // where only its own group could steal them, while the domain's other groups find its
        // injector empty.
        let injectors = std::iter::once((group_inj, true))
            .chain(
                group
                    .domains
                    .iter()
                    .map(|&d| (self.domain_injector(p, d), false)),
            )
            .chain(std::iter::once((any, true)));
        for (injector, batch) in injectors {
            let stolen = if batch {
                injector.steal_batch_and_pop(local)
            } else {
                injector.steal()
            };
            match stolen {
                Steal::Success(t) => {
                    self.counters().injector_pops.add(1);
                    if batch {
                        self.share_surplus(local);
                    }
                    return Steal::Success(t);
                }
                Steal::Retry => retry = true,
                Steal::Empty => {}
            }
        }
        let members = &group.members;
        let n = members.len();
        if n > 1 {
            let start = self.next_rand() % n;
            for k in 0..n {
                let victim = members[(start + k) % n];
                if victim == self.index {
                    continue;
                }
                match stealers[victim].steal_batch_and_pop(local) {
                    Steal::Success(t) => {
                        self.counters().steals.add(1);
                        self.stolen.set(true);
                        self.share_surplus(local);
                        return Steal::Success(t);
                    }
                    Steal::Retry => retry = true,
                    Steal::Empty => {}
                }
            }
        }
        if retry {
            Steal::Retry
        } else {
            Steal::Empty
        }
    }

    /// Whether a queue of level `p` (high or low) that this worker may take from holds a task.
    pub(super) fn level_visible(&self, p: Priority) -> bool {
        let (local, group_inj, any, stealers) = self.level_queues(p);
        let group = &self.registry.groups[self.group];
        !local.is_empty()
            || !group_inj.is_empty()
            || group
                .domains
                .iter()
                .any(|&d| !self.domain_injector(p, d).is_empty())
            || !any.is_empty()
            || group.members.iter().any(|&w| !stealers[w].is_empty())
    }

    /// After taking a batch, wake a sleeping peer if there is more here than one task.
    pub(super) fn share_surplus(&self, local: &Deque<Task<S>>) {
        if !local.is_empty() {
            self.registry.sleep.notify_local(self.group);
        }
    }

    /// Whether any queue this worker may take from holds a task (the re-check before parking).
    pub(super) fn work_visible(&self) -> bool {
        let reg = &*self.registry;
        let group = &reg.groups[self.group];
        !self.local.is_empty()
            || !group.injector.is_empty()
            || group
                .domains
                .iter()
                .any(|&d| !reg.domains[d as usize].injector.is_empty())
            || !reg.any.is_empty()
            || group.members.iter().any(|&w| !reg.stealers[w].is_empty())
            || (reg.prioritized.load(Ordering::SeqCst)
                && (self.level_visible(Priority::High) || self.level_visible(Priority::Low)))
    }
}
