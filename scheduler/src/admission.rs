//! Admission control: a limit on the graphs in flight in a pool.
//!
//! One lock guards the count of admitted graphs and the queue of waiting async submissions, so
//! the count and the waiters can never disagree (no lock-free counter to model). A blocking
//! submitter waits on the condition variable on its own thread and an async one registers its
//! waker: no thread is ever added for waiting. A finished graph frees its slot and wakes one
//! waiter of each kind; a woken async submission that is dropped before it takes the slot passes
//! the wake-up on, and a queued one that is dropped removes its entry, so a cancelled
//! submission leaves nothing behind.

use std::collections::VecDeque;
use std::task::Waker;

use crate::sync::{self, Condvar, Mutex};

pub(crate) struct Admission {
    pub(crate) limit: usize,
    state: Mutex<State>,
    freed: Condvar,
}

struct State {
    /// Graphs admitted and not finished (nested submissions from a worker included).
    in_flight: usize,
    /// Threads blocked in `submit`.
    blocked: usize,
    /// Async submissions waiting, oldest first, by id.
    queue: VecDeque<(u64, Waker)>,
    next_id: u64,
}

/// Where an async submission stands with the admission queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ticket {
    /// Not in the queue, never woken.
    None,
    /// In the queue under this id (or woken and taken out of it: see `Admission::cancel`).
    Queued(u64),
}

impl Admission {
    pub(crate) fn new(limit: usize) -> Self {
        Admission {
            limit,
            state: Mutex::new(State {
                in_flight: 0,
                blocked: 0,
                queue: VecDeque::new(),
                next_id: 0,
            }),
            freed: Condvar::new(),
        }
    }

    /// Takes a slot if one is free.
    pub(crate) fn try_acquire(&self) -> bool {
        let mut s = sync::lock(&self.state);
        if s.in_flight < self.limit {
            s.in_flight += 1;
            true
        } else {
            false
        }
    }

    /// Takes a slot whether or not one is free (a nested submission from a worker of the pool,
    /// which must not wait for graphs that may be waiting for it).
    pub(crate) fn force_acquire(&self) {
        sync::lock(&self.state).in_flight += 1;
    }

    /// Blocks this thread until a slot is free and takes it. Returns whether it had to wait;
    /// `waiting` is told the number of waiting submissions when this one starts and stops
    /// waiting.
    pub(crate) fn acquire_blocking(&self, waiting: impl Fn(usize)) -> bool {
        let mut s = sync::lock(&self.state);
        if s.in_flight < self.limit {
            s.in_flight += 1;
            return false;
        }
        s.blocked += 1;
        waiting(s.blocked + s.queue.len());
        while s.in_flight >= self.limit {
            s = self.freed.wait(s).unwrap_or_else(|p| p.into_inner());
        }
        s.blocked -= 1;
        s.in_flight += 1;
        waiting(s.blocked + s.queue.len());
        true
    }

    /// An async submission's attempt: takes a slot (leaving the queue), or queues `waker`
    /// (replacing the one queued before under the same ticket).
    pub(crate) fn poll_acquire(&self, ticket: &mut Ticket, waker: &Waker) -> bool {
        let mut s = sync::lock(&self.state);
        if s.in_flight < self.limit {
            s.in_flight += 1;
            if let Ticket::Queued(id) = *ticket {
                s.queue.retain(|(i, _)| *i != id);
            }
            *ticket = Ticket::None;
            return true;
        }
        let id = match *ticket {
            Ticket::Queued(id) => id,
            Ticket::None => {
                let id = s.next_id;
                s.next_id += 1;
                *ticket = Ticket::Queued(id);
                id
            }
        };
        match s.queue.iter_mut().find(|(i, _)| *i == id) {
            Some((_, w)) => w.clone_from(waker),
            None => s.queue.push_back((id, waker.clone())),
        }
        false
    }

    /// A dropped async submission: removes its queue entry, or, if a release already took it
    /// out to wake it, hands that wake-up to the next waiter.
    pub(crate) fn cancel(&self, ticket: Ticket) {
        let Ticket::Queued(id) = ticket else { return };
        let mut s = sync::lock(&self.state);
        let before = s.queue.len();
        s.queue.retain(|(i, _)| *i != id);
        if s.queue.len() == before && s.in_flight < self.limit {
            self.wake_one(&mut s);
        }
    }

    /// A finished graph gives its slot back.
    pub(crate) fn release(&self) {
        let mut s = sync::lock(&self.state);
        s.in_flight -= 1;
        self.wake_one(&mut s);
    }

    fn wake_one(&self, s: &mut State) {
        if s.blocked > 0 {
            self.freed.notify_one();
        }
        if let Some((_, w)) = s.queue.pop_front() {
            // Waking under the lock is fine: a waker only schedules its task.
            w.wake();
        }
    }

    /// Submissions waiting now (blocked threads and queued futures).
    pub(crate) fn waiting(&self) -> usize {
        let s = sync::lock(&self.state);
        s.blocked + s.queue.len()
    }
}
