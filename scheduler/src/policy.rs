//! The order in which a worker takes ready nodes, apart from the queues it takes them from:
//! its own deque (LIFO), its group's injector, its domains' injectors, the pool-wide one, then
//! its group's other workers from a random one on; level by level in a pool that has seen
//! priorities, in [`poll_order`]'s order (high → normal → low, but low first every
//! [`SHARE_EVERY`]-th take and normal first half a period later).
//!
//! The workers call [`find_task`] on their crossbeam deques and injectors
//! (`worker/find.rs`); the simulator (`boundpool-sim`) calls the same function on queues of
//! its own in virtual time. Only the decision lives here: batching, counters and wake-ups are
//! each [`WorkerQueues`] implementation's.

use crate::ids::Priority;

/// A worker's takes between two low-first looks (and, offset by half of it, normal-first ones).
pub const SHARE_EVERY: u32 = 16;

/// The poll order of a worker's `n`-th take in prioritized mode.
#[inline]
pub fn poll_order(n: u32) -> [Priority; 3] {
    match n % SHARE_EVERY {
        0 => [Priority::Low, Priority::Normal, Priority::High],
        r if r == SHARE_EVERY / 2 => [Priority::Normal, Priority::High, Priority::Low],
        _ => [Priority::High, Priority::Normal, Priority::Low],
    }
}

/// What one look at a queue gave (crossbeam's `Steal`).
#[derive(Debug, PartialEq, Eq)]
pub enum Take<T> {
    /// A task.
    Task(T),
    /// The queue was empty.
    Empty,
    /// The queue was contended: look again.
    Retry,
}

/// The queues one worker may take from, of each level. Implementations take a batch where the
/// scheduler does (the group's and the pool-wide injectors, a peer's deque) and count their
/// takes; the order of the looks is [`take_at`]'s.
pub trait WorkerQueues {
    /// What the queues hold.
    type Task;
    /// Pops the worker's own deque of `level` (LIFO).
    fn pop_own(&mut self, level: Priority) -> Option<Self::Task>;
    /// Takes from its group's injector of `level` (a batch into its deque, one returned).
    fn take_group_injector(&mut self, level: Priority) -> Take<Self::Task>;
    /// How many domains its group belongs to.
    fn domains(&self) -> usize;
    /// Takes one task from the `d`-th domain's injector of `level`.
    fn take_domain_injector(&mut self, level: Priority, d: usize) -> Take<Self::Task>;
    /// Takes from the pool-wide injector of `level` (a batch, one returned).
    fn take_any_injector(&mut self, level: Priority) -> Take<Self::Task>;
    /// Workers in its group (itself included).
    fn peers(&self) -> usize;
    /// The `k`-th worker of its group (a worker index).
    fn peer(&self, k: usize) -> usize;
    /// Its own worker index.
    fn me(&self) -> usize;
    /// A pseudo-random number (where to start looking among the peers).
    fn next_rand(&mut self) -> usize;
    /// Steals from worker `victim`'s deque of `level` (a batch into its deque, one returned).
    fn steal_from(&mut self, level: Priority, victim: usize) -> Take<Self::Task>;
}

/// One look at level `p`: own deque, the group's injector, those of its domains (none in most
/// pools), the pool-wide one, then the group's other workers' deques from a random one on.
#[inline]
pub fn take_at<Q: WorkerQueues>(q: &mut Q, p: Priority) -> Take<Q::Task> {
    if let Some(t) = q.pop_own(p) {
        return Take::Task(t);
    }
    let mut retry = false;
    match q.take_group_injector(p) {
        Take::Task(t) => return Take::Task(t),
        Take::Retry => retry = true,
        Take::Empty => {}
    }
    for d in 0..q.domains() {
        match q.take_domain_injector(p, d) {
            Take::Task(t) => return Take::Task(t),
            Take::Retry => retry = true,
            Take::Empty => {}
        }
    }
    match q.take_any_injector(p) {
        Take::Task(t) => return Take::Task(t),
        Take::Retry => retry = true,
        Take::Empty => {}
    }
    let n = q.peers();
    if n > 1 {
        let start = q.next_rand() % n;
        for k in 0..n {
            let victim = q.peer((start + k) % n);
            if victim == q.me() {
                continue;
            }
            match q.steal_from(p, victim) {
                Take::Task(t) => return Take::Task(t),
                Take::Retry => retry = true,
                Take::Empty => {}
            }
        }
    }
    if retry {
        Take::Retry
    } else {
        Take::Empty
    }
}

/// The next task for the worker: the normal level only until the pool has seen another
/// (`prioritized`), then [`find_task_prioritized`]'s; `takes` counts the takes that found a
/// task in prioritized mode.
#[inline]
pub fn find_task<Q: WorkerQueues>(
    q: &mut Q,
    prioritized: bool,
    takes: &mut u32,
) -> Option<Q::Task> {
    if prioritized {
        return find_task_prioritized(q, takes);
    }
    find_task_normal(q)
}

/// The next task of the normal level, the only one in a pool that never saw a priority.
#[inline]
pub fn find_task_normal<Q: WorkerQueues>(q: &mut Q) -> Option<Q::Task> {
    loop {
        match take_at(q, Priority::Normal) {
            Take::Task(t) => return Some(t),
            Take::Retry => {}
            Take::Empty => return None,
        }
    }
}

/// The next task in a pool that has seen another level than normal: the levels in
/// [`poll_order`]`(takes + 1)`'s order; `takes` counts the takes that found a task. (The
/// worker calls it from a function of its own kept out of line: the normal level's path stays
/// short.)
#[inline]
pub fn find_task_prioritized<Q: WorkerQueues>(q: &mut Q, takes: &mut u32) -> Option<Q::Task> {
    let n = takes.wrapping_add(1);
    loop {
        let mut retry = false;
        for level in poll_order(n) {
            match take_at(q, level) {
                Take::Task(t) => {
                    *takes = n;
                    return Some(t);
                }
                Take::Retry => retry = true,
                Take::Empty => {}
            }
        }
        if !retry {
            return None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;

    /// One worker's queues: its deque, a group injector, peers' deques (by index).
    struct Toy {
        me: usize,
        deques: Vec<[VecDeque<u32>; 3]>,
        group: [VecDeque<u32>; 3],
        any: [VecDeque<u32>; 3],
        looks: Vec<String>,
    }

    fn idx(p: Priority) -> usize {
        match p {
            Priority::High => 0,
            Priority::Normal => 1,
            Priority::Low => 2,
        }
    }

    impl WorkerQueues for Toy {
        type Task = u32;
        fn pop_own(&mut self, p: Priority) -> Option<u32> {
            self.looks.push(format!("own {p:?}"));
            self.deques[self.me][idx(p)].pop_back()
        }
        fn take_group_injector(&mut self, p: Priority) -> Take<u32> {
            self.looks.push(format!("group {p:?}"));
            self.group[idx(p)]
                .pop_front()
                .map_or(Take::Empty, Take::Task)
        }
        fn domains(&self) -> usize {
            0
        }
        fn take_domain_injector(&mut self, _: Priority, _: usize) -> Take<u32> {
            Take::Empty
        }
        fn take_any_injector(&mut self, p: Priority) -> Take<u32> {
            self.looks.push(format!("any {p:?}"));
            self.any[idx(p)].pop_front().map_or(Take::Empty, Take::Task)
        }
        fn peers(&self) -> usize {
            self.deques.len()
        }
        fn peer(&self, k: usize) -> usize {
            k
        }
        fn me(&self) -> usize {
            self.me
        }
        fn next_rand(&mut self) -> usize {
            1
        }
        fn steal_from(&mut self, p: Priority, v: usize) -> Take<u32> {
            self.looks.push(format!("steal {v} {p:?}"));
            self.deques[v][idx(p)]
                .pop_front()
                .map_or(Take::Empty, Take::Task)
        }
    }

    fn toy() -> Toy {
        Toy {
            me: 0,
            deques: vec![Default::default(), Default::default(), Default::default()],
            group: Default::default(),
            any: Default::default(),
            looks: Vec::new(),
        }
    }

    #[test]
    fn own_deque_then_injectors_then_peers_from_a_random_one() {
        let mut q = toy();
        q.deques[2][1].extend([7, 8]);
        q.deques[1][1].push_back(9);
        let mut takes = 0;
        assert_eq!(find_task(&mut q, false, &mut takes), Some(9));
        // Start at peer 1 (next_rand % 3), skip itself.
        assert_eq!(
            q.looks,
            ["own Normal", "group Normal", "any Normal", "steal 1 Normal"]
        );
        q.looks.clear();
        assert_eq!(find_task(&mut q, false, &mut takes), Some(7));
        assert_eq!(q.looks.last().unwrap(), "steal 2 Normal");
        q.deques[0][1].extend([1, 2]);
        assert_eq!(find_task(&mut q, false, &mut takes), Some(2));
        assert_eq!(takes, 0, "takes count only in prioritized mode");
    }

    #[test]
    fn levels_in_poll_order_with_fixed_shares() {
        let mut q = toy();
        for k in 0..40 {
            q.group[0].push_back(100 + k);
        }
        q.group[2].extend([1, 2]);
        let mut takes = 0;
        let got: Vec<u32> = (0..42)
            .map(|_| find_task(&mut q, true, &mut takes).unwrap())
            .collect();
        // Every 16th take looks at low first.
        assert_eq!(got[15], 1);
        assert_eq!(got[31], 2);
        assert!(got.iter().filter(|&&t| t >= 100).count() == 40);
        assert_eq!(takes, 42);
        assert_eq!(find_task(&mut q, true, &mut takes), None);
        assert_eq!(takes, 42);
    }
}
