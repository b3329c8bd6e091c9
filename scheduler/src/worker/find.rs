//! Finding work: the worker's queues (own deque, the group's, domains' and pool-wide
//! injectors, the group's other workers' deques) as the shared policy sees them
//! ([`crate::policy`]: its order, which the simulator runs too), with the batches, counters
//! and wake-ups that taking from them costs here; and the re-check of every queue before
//! parking.

use crossbeam_deque::{Injector, Steal, Stealer, Worker as Deque};

use super::WorkerThread;
use crate::policy::{self, Take, WorkerQueues};
use crate::priority::Priority;
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

    /// The next task for this worker, in the shared policy's order over its queues
    /// ([`policy::find_task`](crate::policy::find_task)'s two halves: the normal level's
    /// path touches no take counter).
    #[inline]
    pub(super) fn find_task(&self) -> Option<Task<S>> {
        if self.registry.prioritized.load(Ordering::Relaxed) {
            return self.find_task_prioritized();
        }
        policy::find_task_normal(&mut Looker(self))
    }

    /// `find_task` in a pool that has seen another level than normal (out of line: the normal
    /// level's path stays short).
    #[inline(never)]
    fn find_task_prioritized(&self) -> Option<Task<S>> {
        let mut takes = self.takes.get();
        let found = policy::find_task_prioritized(&mut Looker(self), &mut takes);
        self.takes.set(takes);
        found
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

    /// A batch from `injector` into `local` (one returned), counted; a peer woken when more
    /// than one task came.
    #[inline]
    fn take_batch(&self, injector: &Injector<Task<S>>, local: &Deque<Task<S>>) -> Take<Task<S>> {
        match injector.steal_batch_and_pop(local) {
            Steal::Success(t) => {
                self.counters().injector_pops.add(1);
                self.share_surplus(local);
                Take::Task(t)
            }
            Steal::Retry => Take::Retry,
            Steal::Empty => Take::Empty,
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

/// A worker's queues for the shared policy.
struct Looker<'a, S>(&'a WorkerThread<S>);

impl<S: Send + 'static> WorkerQueues for Looker<'_, S> {
    type Task = Task<S>;

    #[inline]
    fn pop_own(&mut self, p: Priority) -> Option<Task<S>> {
        self.0.level_queues(p).0.pop()
    }

    #[inline]
    fn take_group_injector(&mut self, p: Priority) -> Take<Task<S>> {
        let (local, group_inj, _, _) = self.0.level_queues(p);
        self.0.take_batch(group_inj, local)
    }

    #[inline]
    fn domains(&self) -> usize {
        self.0.registry.groups[self.0.group].domains.len()
    }

    /// A domain's tasks are taken one at a time: a batch would land in this worker's deque,
    /// where only its own group could steal them, while the domain's other groups find its
    /// injector empty.
    fn take_domain_injector(&mut self, p: Priority, k: usize) -> Take<Task<S>> {
        let d = self.0.registry.groups[self.0.group].domains[k];
        match self.0.domain_injector(p, d).steal() {
            Steal::Success(t) => {
                self.0.counters().injector_pops.add(1);
                Take::Task(t)
            }
            Steal::Retry => Take::Retry,
            Steal::Empty => Take::Empty,
        }
    }

    #[inline]
    fn take_any_injector(&mut self, p: Priority) -> Take<Task<S>> {
        let (local, _, any, _) = self.0.level_queues(p);
        self.0.take_batch(any, local)
    }

    #[inline]
    fn peers(&self) -> usize {
        self.0.registry.groups[self.0.group].members.len()
    }

    #[inline]
    fn peer(&self, k: usize) -> usize {
        self.0.registry.groups[self.0.group].members[k]
    }

    #[inline]
    fn me(&self) -> usize {
        self.0.index
    }

    #[inline]
    fn next_rand(&mut self) -> usize {
        self.0.next_rand()
    }

    #[inline]
    fn steal_from(&mut self, p: Priority, victim: usize) -> Take<Task<S>> {
        let (local, _, _, stealers) = self.0.level_queues(p);
        match stealers[victim].steal_batch_and_pop(local) {
            Steal::Success(t) => {
                self.0.counters().steals.add(1);
                self.0.stolen.set(true);
                self.0.share_surplus(local);
                Take::Task(t)
            }
            Steal::Retry => Take::Retry,
            Steal::Empty => Take::Empty,
        }
    }
}
