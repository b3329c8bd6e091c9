//! Parking idle workers without losing a wake-up.
//!
//! A worker that finds no work announces itself idle (pushes its index on its group's idle list
//! and bumps the group's idle count, then a SeqCst fence), checks every queue once more, and only
//! then parks. A thread that makes work available pushes it, issues a SeqCst fence and reads the
//! idle count; if it is non-zero it pops one idle worker, sets that worker's `notified` flag and
//! unparks it. The two fences order the push before the count read and the count bump before the
//! re-check, so either the idle worker sees the work or the pusher sees the idle worker.

use std::time::Duration;

use crate::sync::{self, fence, AtomicBool, AtomicUsize, Mutex, Ordering, Thread};

struct GroupSleep {
    idle: Mutex<Vec<usize>>,
    count: AtomicUsize,
}

struct WorkerSleep {
    thread: Mutex<Option<Thread>>,
    notified: AtomicBool,
}

pub(crate) struct Sleep {
    groups: Box<[GroupSleep]>,
    workers: Box<[WorkerSleep]>,
}

/// Why `Sleep::sleep` returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Woke {
    /// A pusher chose this worker.
    Notified,
    /// The re-check after announcing found work, or the caller's condition became true.
    Condition,
    /// The timeout passed.
    Timeout,
}

impl Sleep {
    pub(crate) fn new(groups: usize, workers: usize) -> Self {
        Sleep {
            groups: (0..groups).map(|_| GroupSleep { idle: Mutex::new(Vec::new()), count: AtomicUsize::new(0) }).collect(),
            workers: (0..workers)
                .map(|_| WorkerSleep { thread: Mutex::new(None), notified: AtomicBool::new(false) })
                .collect(),
        }
    }

    /// Records the worker's thread; called on the worker before it can be woken.
    pub(crate) fn register(&self, worker: usize, thread: Thread) {
        *sync::lock(&self.workers[worker].thread) = Some(thread);
    }

    /// Parks `worker` of `group` until a pusher notifies it, `condition` holds, or `timeout`
    /// passes. `recheck` is called once after announcing (it must look at every queue the
    /// worker could take from); `condition` is checked before every park.
    pub(crate) fn sleep(
        &self,
        worker: usize,
        group: usize,
        timeout: Option<Duration>,
        recheck: impl Fn() -> bool,
        condition: impl Fn() -> bool,
    ) -> Woke {
        let g = &self.groups[group];
        let w = &self.workers[worker];
        sync::lock(&g.idle).push(worker);
        g.count.fetch_add(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        if recheck() || condition() {
            self.cancel(worker, group);
            return Woke::Condition;
        }
        let woke = loop {
            if w.notified.swap(false, Ordering::AcqRel) {
                break Woke::Notified;
            }
            if condition() {
                break Woke::Condition;
            }
            match timeout {
                None => sync::park(),
                Some(d) => {
                    sync::park_timeout(d);
                    if w.notified.swap(false, Ordering::AcqRel) {
                        break Woke::Notified;
                    }
                    break Woke::Timeout;
                }
            }
        };
        // A `notified` flag can be stale (set by a pusher that popped us while we were waking by
        // ourselves): make sure we never stay on the idle list while awake.
        self.cancel(worker, group);
        woke
    }

    /// Takes `worker` off its group's idle list after it woke by itself. If a pusher already took
    /// it off, that pusher will set `notified`; the flag then causes one spurious wake later.
    fn cancel(&self, worker: usize, group: usize) {
        let g = &self.groups[group];
        let mut idle = sync::lock(&g.idle);
        if let Some(pos) = idle.iter().position(|&i| i == worker) {
            idle.swap_remove(pos);
            g.count.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// The pusher's half: call after making work available to `group`. Wakes one idle worker of
    /// the group, if any. Returns whether one was woken.
    pub(crate) fn notify_group(&self, group: usize) -> bool {
        fence(Ordering::SeqCst);
        self.wake_one(group)
    }

    /// The pusher's half for a worker that pushed onto its own deque: no fence. A wake-up lost to
    /// the race is harmless, since the pushing worker itself will pop the task (rayon-core makes
    /// the same trade for local pushes); cross-queue pushes use `notify_group`.
    #[inline]
    pub(crate) fn notify_local(&self, group: usize) {
        if self.groups[group].count.load(Ordering::Relaxed) > 0 {
            self.wake_one(group);
        }
    }

    /// Like `notify_group`, for work any group may take: wakes one idle worker of any group.
    pub(crate) fn notify_any(&self) -> bool {
        fence(Ordering::SeqCst);
        (0..self.groups.len()).any(|g| self.wake_one(g))
    }

    fn wake_one(&self, group: usize) -> bool {
        let g = &self.groups[group];
        if g.count.load(Ordering::SeqCst) == 0 {
            return false;
        }
        let worker = {
            let mut idle = sync::lock(&g.idle);
            match idle.pop() {
                Some(w) => {
                    g.count.fetch_sub(1, Ordering::SeqCst);
                    w
                }
                None => return false,
            }
        };
        self.unpark(worker);
        true
    }

    /// Wakes `worker` whether or not it is idle (used at shutdown and by group wakers).
    pub(crate) fn unpark(&self, worker: usize) {
        let w = &self.workers[worker];
        w.notified.store(true, Ordering::Release);
        if let Some(t) = sync::lock(&w.thread).as_ref() {
            t.unpark();
        }
    }

    pub(crate) fn unpark_all(&self) {
        for i in 0..self.workers.len() {
            self.unpark(i);
        }
    }
}
