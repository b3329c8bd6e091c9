//! Parking idle workers without losing a wake-up.
//!
//! A worker that finds no work announces itself idle (pushes its index on its group's idle list
//! and bumps the group's idle count, then a SeqCst fence), checks every queue once more, and only
//! then parks. A thread that makes work available pushes it, issues a SeqCst fence and reads the
//! idle count; if it is non-zero it pops one idle worker, sets that worker's `notified` flag and
//! unparks it. The two fences order the push before the count read and the count bump before the
//! re-check, so either the idle worker sees the work or the pusher sees the idle worker.
//!
//! A request to run the idle hook (`request_hook`, what a `GroupWaker` sends after queueing a
//! handle for release) is work of the same kind: the requester sets its group's `hook` flag
//! (SeqCst) before the fence and the idle-count read, and a worker reads the flag after it
//! announced itself, before it parks. A worker that is busy or still spinning when the request
//! comes finds the flag the next time it goes idle; one that announced itself is woken.

use std::time::Duration;

use crossbeam_utils::CachePadded;

use crate::sync::{self, fence, AtomicBool, AtomicUsize, Mutex, Ordering, Thread};

/// One group's sleepers. `count` is read by `notify_local` after every push onto a worker's own
/// deque, by every busy worker of the group, so it has a cache line of its own: written only when
/// a worker announces itself idle, cancels, or is popped by a waker (the idle-list lock is taken
/// on those same transitions), not by the hook flag's requests and takes, nor by another group's
/// or a worker's sleep state that a heap allocation next to it would hold.
struct GroupSleep {
    idle: Mutex<Vec<usize>>,
    count: CachePadded<AtomicUsize>,
    /// Someone asked a worker of the group to run its idle hook (`request_hook`); cleared by the
    /// worker that takes the request, right before it runs the hook.
    hook: AtomicBool,
}

struct WorkerSleep {
    thread: Mutex<Option<Thread>>,
    notified: AtomicBool,
}

pub(crate) struct Sleep {
    /// Padded apart: each group's count line stays clean of the others' writes (see
    /// `GroupSleep`).
    groups: Box<[CachePadded<GroupSleep>]>,
    /// Padded apart: a waker's swap of one worker's `notified` does not invalidate the line
    /// another worker reads when it parks or wakes.
    workers: Box<[CachePadded<WorkerSleep>]>,
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
            groups: (0..groups)
                .map(|_| {
                    CachePadded::new(GroupSleep {
                        idle: Mutex::new(Vec::new()),
                        count: CachePadded::new(AtomicUsize::new(0)),
                        hook: AtomicBool::new(false),
                    })
                })
                .collect(),
            workers: (0..workers)
                .map(|_| {
                    CachePadded::new(WorkerSleep {
                        thread: Mutex::new(None),
                        notified: AtomicBool::new(false),
                    })
                })
                .collect(),
        }
    }

    /// Records the worker's thread; called on the worker before it can be woken.
    pub(crate) fn register(&self, worker: usize, thread: Thread) {
        *sync::lock(&self.workers[worker].thread) = Some(thread);
    }

    /// Parks `worker` of `group` until a pusher notifies it, `condition` holds, or `timeout`
    /// passes. `recheck` is called once after announcing (it must look at every queue the
    /// worker could take from); `condition` is checked before every park. A pending idle-hook
    /// request for the group counts as work: the worker returns (`Woke::Condition`) to run it.
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
        if g.hook.load(Ordering::SeqCst) || recheck() || condition() {
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
    /// the same trade for local pushes); cross-queue pushes use `notify_group`. Inlined always:
    /// every push of a busy worker pays for it, and a call cost a tree ~5 instructions a node.
    #[inline(always)]
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

    /// Like `notify_group`, for work of a domain: wakes one idle worker of any of `groups`.
    pub(crate) fn notify_groups(&self, groups: &[usize]) -> bool {
        fence(Ordering::SeqCst);
        groups.iter().any(|&g| self.wake_one(g))
    }

    /// Asks a worker of one of `groups` to run its idle hook: sets each group's request flag,
    /// then wakes one idle worker of them, if any. A worker that is not parked yet sees the flag
    /// before it parks (see the module docs); a busy one runs its hook within 64 nodes anyway.
    pub(crate) fn request_hook(&self, groups: &[usize]) {
        for &g in groups {
            // A swap rather than a store, for loom (see `unpark`).
            self.groups[g].hook.swap(true, Ordering::SeqCst);
        }
        self.notify_groups(groups);
    }

    /// Takes `group`'s idle-hook request, if there is one; the caller then runs the hook, so a
    /// request made while the hook runs sets the flag again and is not lost.
    #[inline]
    pub(crate) fn take_hook_request(&self, group: usize) -> bool {
        let flag = &self.groups[group].hook;
        flag.load(Ordering::Relaxed) && flag.swap(false, Ordering::AcqRel)
    }

    /// Whether `group` has an idle-hook request not yet taken (a hint: `take_hook_request` is
    /// what claims it).
    pub(crate) fn hook_requested(&self, group: usize) -> bool {
        self.groups[group].hook.load(Ordering::SeqCst)
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
        // A swap rather than a store: the same on hardware (this path takes a lock and makes a
        // syscall anyway), and it keeps the loom model sound, since loom lets an RMW read around a
        // concurrent plain store (tokio-rs/loom#254).
        w.notified.swap(true, Ordering::AcqRel);
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

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize as StdAtomicUsize;
    use std::sync::mpsc;
    use std::sync::Arc;
    use std::time::Instant;

    fn idle_count(s: &Sleep, group: usize) -> usize {
        s.groups[group].count.load(Ordering::SeqCst)
    }

    fn wait_until(what: &str, f: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !f() {
            assert!(Instant::now() < deadline, "timed out waiting: {what}");
            std::thread::yield_now();
        }
    }

    /// Starts worker `w` of `group` sleeping once with no timeout; returns why it woke.
    fn sleeper(s: &Arc<Sleep>, w: usize, group: usize) -> mpsc::Receiver<Woke> {
        let (tx, rx) = mpsc::channel();
        let s = s.clone();
        std::thread::spawn(move || {
            s.register(w, std::thread::current());
            let woke = s.sleep(w, group, None, || false, || false);
            tx.send(woke).unwrap();
        });
        rx
    }

    #[test]
    fn notify_without_idle_workers_wakes_nobody() {
        let s = Sleep::new(2, 2);
        assert!(!s.notify_group(0));
        assert!(!s.notify_any());
    }

    #[test]
    fn notify_group_wakes_an_idle_worker() {
        let s = Arc::new(Sleep::new(1, 1));
        let rx = sleeper(&s, 0, 0);
        wait_until("worker announced idle", || idle_count(&s, 0) == 1);
        assert!(s.notify_group(0));
        assert_eq!(
            rx.recv_timeout(Duration::from_secs(10)).unwrap(),
            Woke::Notified
        );
        assert_eq!(idle_count(&s, 0), 0);
        assert!(s.groups[0].idle.lock().unwrap().is_empty());
        assert!(!s.notify_group(0), "nobody is idle any more");
    }

    #[test]
    fn notify_any_reaches_another_group_and_groups_are_separate() {
        let s = Arc::new(Sleep::new(2, 2));
        let rx = sleeper(&s, 1, 1);
        wait_until("worker 1 announced idle", || idle_count(&s, 1) == 1);
        assert!(!s.notify_group(0), "group 0 has nobody idle");
        assert!(
            rx.recv_timeout(Duration::from_millis(50)).is_err(),
            "worker of group 1 stays asleep"
        );
        assert!(s.notify_any());
        assert_eq!(
            rx.recv_timeout(Duration::from_secs(10)).unwrap(),
            Woke::Notified
        );
    }

    #[test]
    fn recheck_that_finds_work_does_not_park() {
        let s = Sleep::new(1, 1);
        s.register(0, std::thread::current());
        let woke = s.sleep(0, 0, None, || true, || false);
        assert_eq!(woke, Woke::Condition);
        assert_eq!(idle_count(&s, 0), 0);
        assert!(
            s.groups[0].idle.lock().unwrap().is_empty(),
            "cancelled announcement leaves the idle list"
        );
        let woke = s.sleep(0, 0, None, || false, || true);
        assert_eq!(woke, Woke::Condition);
        assert_eq!(idle_count(&s, 0), 0);
    }

    #[test]
    fn pending_hook_request_stops_a_park_until_taken() {
        let s = Sleep::new(2, 1);
        s.register(0, std::thread::current());
        // Nobody is idle: the request only leaves its flag.
        s.request_hook(&[0]);
        assert_eq!(s.sleep(0, 0, None, || false, || false), Woke::Condition);
        assert_eq!(idle_count(&s, 0), 0);
        // Another group's request is not this worker's.
        assert!(!s.take_hook_request(1));
        assert!(s.take_hook_request(0));
        assert!(!s.take_hook_request(0), "taken once");
        assert_eq!(
            s.sleep(0, 0, Some(Duration::from_millis(1)), || false, || false),
            Woke::Timeout
        );
    }

    #[test]
    fn hook_request_wakes_a_parked_worker_of_any_of_its_groups() {
        let s = Arc::new(Sleep::new(2, 1));
        let rx = sleeper(&s, 0, 1);
        wait_until("worker of group 1 announced idle", || {
            idle_count(&s, 1) == 1
        });
        s.request_hook(&[0, 1]);
        // Announced idle is not yet parked: a request that lands before the sleeper's last
        // re-check is seen there (it returns `Condition`, as miri's scheduler once interleaved
        // it); one that lands after wakes it (`Notified`). Either way it must return, and the
        // request stays pending for both groups until taken.
        rx.recv_timeout(Duration::from_secs(10))
            .expect("the worker of group 1 returns from its park");
        assert!(s.take_hook_request(1));
        assert!(s.take_hook_request(0));
    }

    #[test]
    fn timeout_returns_and_leaves_the_idle_list() {
        let s = Sleep::new(1, 1);
        s.register(0, std::thread::current());
        let t0 = Instant::now();
        let woke = s.sleep(0, 0, Some(Duration::from_millis(5)), || false, || false);
        // A spurious unpark may end a timed park early; either way it reports a timeout.
        assert_eq!(woke, Woke::Timeout);
        assert!(t0.elapsed() < Duration::from_secs(5));
        assert_eq!(idle_count(&s, 0), 0);
        assert!(s.groups[0].idle.lock().unwrap().is_empty());
    }

    #[test]
    fn stale_notification_gives_one_spurious_wake() {
        let s = Sleep::new(1, 1);
        s.register(0, std::thread::current());
        s.unpark(0);
        assert_eq!(s.sleep(0, 0, None, || false, || false), Woke::Notified);
        assert_eq!(idle_count(&s, 0), 0);
        // Consumed: the next sleep times out.
        assert_eq!(
            s.sleep(0, 0, Some(Duration::from_millis(1)), || false, || false),
            Woke::Timeout
        );
    }

    #[test]
    fn condition_and_unpark_all_end_a_sleep() {
        let s = Arc::new(Sleep::new(1, 2));
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::channel();
        for w in 0..2 {
            let (s, stop, tx) = (s.clone(), stop.clone(), tx.clone());
            std::thread::spawn(move || {
                s.register(w, std::thread::current());
                let woke = s.sleep(w, 0, None, || false, || stop.load(Ordering::SeqCst));
                tx.send(woke).unwrap();
            });
        }
        wait_until("both idle", || idle_count(&s, 0) == 2);
        stop.store(true, Ordering::SeqCst);
        s.unpark_all();
        for _ in 0..2 {
            let woke = rx.recv_timeout(Duration::from_secs(10)).unwrap();
            assert!(matches!(woke, Woke::Notified | Woke::Condition), "{woke:?}");
        }
        assert_eq!(idle_count(&s, 0), 0);
    }

    /// Pushers and workers hammer the protocol; a lost wake-up leaves an item unconsumed and
    /// the watchdog fails the test.
    #[test]
    fn no_lost_wakeups_under_stress() {
        const WORKERS: usize = 3;
        const ITEMS: usize = 20_000;
        let s = Arc::new(Sleep::new(1, WORKERS));
        let queue = Arc::new(StdAtomicUsize::new(0));
        let consumed = Arc::new(StdAtomicUsize::new(0));
        let (tx, rx) = mpsc::channel();
        let mut handles = Vec::new();
        for w in 0..WORKERS {
            let (s, queue, consumed, tx) = (s.clone(), queue.clone(), consumed.clone(), tx.clone());
            handles.push(std::thread::spawn(move || {
                s.register(w, std::thread::current());
                let take = || {
                    queue
                        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |q| q.checked_sub(1))
                        .is_ok()
                };
                while consumed.load(Ordering::SeqCst) < ITEMS {
                    if take() {
                        // Like a worker that found a batch: pass the surplus on.
                        if queue.load(Ordering::SeqCst) > 0 {
                            s.notify_group(0);
                        }
                        if consumed.fetch_add(1, Ordering::SeqCst) + 1 == ITEMS {
                            s.unpark_all();
                        }
                        continue;
                    }
                    s.sleep(
                        w,
                        0,
                        None,
                        || queue.load(Ordering::SeqCst) > 0,
                        || consumed.load(Ordering::SeqCst) >= ITEMS,
                    );
                }
                tx.send(()).unwrap();
            }));
        }
        let pushers: Vec<_> = (0..2)
            .map(|_| {
                let (s, queue) = (s.clone(), queue.clone());
                std::thread::spawn(move || {
                    for i in 0..ITEMS / 2 {
                        queue.fetch_add(1, Ordering::SeqCst);
                        s.notify_group(0);
                        if i % 64 == 0 {
                            std::thread::yield_now();
                        }
                    }
                })
            })
            .collect();
        for p in pushers {
            p.join().unwrap();
        }
        for _ in 0..WORKERS {
            rx.recv_timeout(Duration::from_secs(30))
                .expect("a worker slept through available work (lost wake-up)");
        }
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(consumed.load(Ordering::SeqCst), ITEMS);
    }
}
