//! The order in which a worker looks for work (own deque, its group's injector, its domains',
//! the pool-wide one, then its group's other workers from a random one on; level by level in
//! a prioritized pool, in `poll_order`'s order). Placeholder until the scheduler exports its
//! own, generic over the queue type: the simulator then calls that one.

use boundpool_scheduler::Priority;

/// What one look at a queue gave.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Take<T> {
    Task(T),
    Empty,
    Retry,
}

/// A worker's queues as the policy sees them.
pub(crate) trait WorkerQueues {
    type Task;
    fn pop_own(&mut self, level: Priority) -> Option<Self::Task>;
    fn take_group_injector(&mut self, level: Priority) -> Take<Self::Task>;
    fn domains(&self) -> usize;
    fn take_domain_injector(&mut self, level: Priority, d: usize) -> Take<Self::Task>;
    fn take_any_injector(&mut self, level: Priority) -> Take<Self::Task>;
    fn peers(&self) -> usize;
    fn peer(&self, k: usize) -> usize;
    fn me(&self) -> usize;
    fn next_rand(&mut self) -> usize;
    fn steal_from(&mut self, level: Priority, victim: usize) -> Take<Self::Task>;
}

const SHARE_EVERY: u32 = 16;

pub(crate) fn poll_order(n: u32) -> [Priority; 3] {
    match n % SHARE_EVERY {
        0 => [Priority::Low, Priority::Normal, Priority::High],
        r if r == SHARE_EVERY / 2 => [Priority::Normal, Priority::High, Priority::Low],
        _ => [Priority::High, Priority::Normal, Priority::Low],
    }
}

pub(crate) fn take_at<Q: WorkerQueues>(q: &mut Q, p: Priority) -> Take<Q::Task> {
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

pub(crate) fn find_task<Q: WorkerQueues>(
    q: &mut Q,
    prioritized: bool,
    takes: &mut u32,
) -> Option<Q::Task> {
    if !prioritized {
        loop {
            match take_at(q, Priority::Normal) {
                Take::Task(t) => return Some(t),
                Take::Retry => {}
                Take::Empty => return None,
            }
        }
    }
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
