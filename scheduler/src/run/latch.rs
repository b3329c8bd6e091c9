//! The completion latch: the hand-off of a run's result between the thread that finishes it
//! and the one waiting for it (a blocked thread or an async task).

use std::task::Waker;
use std::time::Instant;

use super::GraphOutput;
use crate::error::Error;
use crate::sync::{self, current_thread, AtomicBool, Mutex, Ordering, Thread};

enum Waiter {
    None,
    Thread(Thread),
    Task(Waker),
}

/// The hand-off between the thread that finishes a run and the one waiting for it.
pub(crate) struct Completion {
    done: AtomicBool,
    result: Mutex<Option<Result<GraphOutput, Error>>>,
    waiter: Mutex<Waiter>,
}

impl Completion {
    pub(crate) fn new() -> Self {
        Completion {
            done: AtomicBool::new(false),
            result: Mutex::new(None),
            waiter: Mutex::new(Waiter::None),
        }
    }

    #[inline]
    pub(crate) fn is_done(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }

    /// Publishes the result, then wakes whoever waits. Called once.
    pub(crate) fn complete(&self, result: Result<GraphOutput, Error>) {
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

    /// Blocks the current (non-worker) thread until completion.
    #[cfg_attr(not(all(test, loom)), allow(dead_code))]
    pub(crate) fn block(&self) {
        self.block_until(None);
    }

    /// Blocks the current (non-worker) thread until completion or `deadline`; returns whether
    /// the run completed.
    pub(crate) fn block_until(&self, deadline: Option<Instant>) -> bool {
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
