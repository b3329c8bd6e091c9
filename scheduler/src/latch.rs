//! The completion latch: the hand-off of a run's result between the thread that finishes it
//! and the one waiting for it (a blocked thread or an async task).

use std::sync::Arc;
use std::task::Waker;
use std::time::Instant;

use crate::error::Error;
use crate::output::GraphOutput;
use crate::spin::Spinners;
use crate::sync::{self, current_thread, AtomicBool, Mutex, Ordering, Thread};

enum Waiter {
    None,
    Thread(Thread),
    Task(Waker),
}

/// Runs a done hook; a panic in it is caught and dropped, so that the run's result is still
/// published and the finishing worker goes on.
fn run_hook(hook: DoneHook) {
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(hook));
}

/// A callback for the end of the run ([`GraphHandle::on_done`](crate::GraphHandle::on_done)).
pub(crate) type DoneHook = Box<dyn FnOnce() + Send>;

enum DoneHooks {
    Open(Vec<DoneHook>),
    /// The run has finished: a hook registered now runs at once.
    Closed,
}

/// The hand-off between the thread that finishes a run and the one waiting for it.
pub(crate) struct Completion {
    done: AtomicBool,
    result: Mutex<Option<Result<GraphOutput, Error>>>,
    waiter: Mutex<Waiter>,
    hooks: Mutex<DoneHooks>,
    /// How a blocking waiter watches before it parks; set once, before the handle is out.
    spin: std::sync::OnceLock<WaitSpin>,
}

/// A blocking waiter's spin: how long (`PoolBuilder::wait_spin`), and whether the pool's
/// [`Spinners`] let it.
#[cfg_attr(loom, allow(dead_code))]
struct WaitSpin {
    spin: std::time::Duration,
    spinners: Arc<Spinners>,
    /// The run is of the high level: its waiter may always spin.
    high: bool,
}

impl Completion {
    pub(crate) fn new() -> Self {
        Completion {
            done: AtomicBool::new(false),
            result: Mutex::new(None),
            waiter: Mutex::new(Waiter::None),
            hooks: Mutex::new(DoneHooks::Open(Vec::new())),
            spin: std::sync::OnceLock::new(),
        }
    }

    #[inline]
    pub(crate) fn is_done(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }

    /// Runs the done hooks, publishes the result, then wakes whoever waits. Called once.
    pub(crate) fn complete(&self, result: Result<GraphOutput, Error>) {
        // Hooks run before the result is published: a waiter that returns sees their effects.
        let hooks = std::mem::replace(&mut *sync::lock(&self.hooks), DoneHooks::Closed);
        if let DoneHooks::Open(hooks) = hooks {
            for hook in hooks {
                run_hook(hook);
            }
        }
        *sync::lock(&self.result) = Some(result);
        self.done.store(true, Ordering::Release);
        // Taking the waiter after `done` is set: a waiter registers before checking `done`,
        // so either it sees `done` or we see it here.
        let waiter = std::mem::replace(&mut *sync::lock(&self.waiter), Waiter::None);
        match waiter {
            Waiter::None => {}
            Waiter::Thread(t) => t.unpark(),
            Waiter::Task(w) => w.wake(),
        }
    }

    /// Registers the current thread to be unparked on completion.
    pub(crate) fn register_thread(&self) {
        *sync::lock(&self.waiter) = Waiter::Thread(current_thread());
    }

    /// Set once, before the run's handle is handed out: a blocking waiter may watch for
    /// `spin` when `spinners` let it (always for a `high` run).
    pub(crate) fn set_spin(&self, spin: std::time::Duration, spinners: &Arc<Spinners>, high: bool) {
        if !spin.is_zero() {
            let _ = self.spin.set(WaitSpin {
                spin,
                spinners: spinners.clone(),
                high,
            });
        }
    }

    /// Runs `hook` when the run finishes, or now if it has.
    pub(crate) fn on_done(&self, hook: DoneHook) {
        let mut hooks = sync::lock(&self.hooks);
        match &mut *hooks {
            DoneHooks::Open(v) => v.push(hook),
            DoneHooks::Closed => {
                drop(hooks);
                run_hook(hook);
            }
        }
    }

    pub(crate) fn register_waker(&self, waker: &Waker) {
        let mut w = sync::lock(&self.waiter);
        match &*w {
            Waiter::Task(old) if old.will_wake(waker) => {}
            _ => *w = Waiter::Task(waker.clone()),
        }
    }

    pub(crate) fn take_result(&self) -> Option<Result<GraphOutput, Error>> {
        sync::lock(&self.result).take()
    }

    /// Watches for completion for the run's spin time (not past `deadline`), when the pool's
    /// spinners let it (a waiter of another level than high stops once a high one watches);
    /// whether it completed. Between looks it yields its core, except a waiter of a high-level
    /// run off the workers' cores: a yield hands the core to any thread queued on it for that
    /// thread's whole slice, the waiting time of a latency-critical request. On a worker's
    /// core, or in a pool of unpinned workers, it yields: the worker may be the one its graph
    /// needs. (Not under loom: a model parks at once.)
    fn watch(&self, deadline: Option<Instant>) -> bool {
        #[cfg(not(loom))]
        if let Some(w) = self.spin.get() {
            let _spinning = if w.high {
                w.spinners.high()
            } else {
                match w.spinners.other() {
                    Some(s) => s,
                    None => return false,
                }
            };
            let mut until = Instant::now() + w.spin;
            if let Some(d) = deadline {
                until = until.min(d);
            }
            while !self.is_done() {
                if Instant::now() >= until || (!w.high && w.spinners.high_watching()) {
                    return false;
                }
                if w.high && !w.spinners.on_worker_core() {
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
            }
            return true;
        }
        let _ = deadline;
        false
    }

    /// Blocks the current (non-worker) thread until completion.
    #[cfg_attr(not(all(test, loom)), allow(dead_code))]
    pub(crate) fn block(&self) {
        self.block_until(None);
    }

    /// Blocks the current (non-worker) thread until completion or `deadline`; returns whether
    /// the run completed.
    pub(crate) fn block_until(&self, deadline: Option<Instant>) -> bool {
        if self.watch(deadline) {
            return true;
        }
        self.register_thread();
        while !self.is_done() {
            match deadline {
                None => sync::park(),
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return false;
                    }
                    sync::park_timeout(left);
                }
            }
        }
        true
    }
}
