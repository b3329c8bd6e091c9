//! Running dry: the spin before parking, parking (with a timeout while deferred completions
//! wait), the idle hook and the metrics flush (also every `SERVICE_EVERY` nodes of a busy
//! worker), polling deferred completions, and the help loop of a body waiting on a nested
//! graph.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::task::Poll;
use std::time::{Duration, Instant};

use super::execute::{node_failed, node_panicked};
use super::life::abort_on_hook_panic;
use super::WorkerThread;
use crate::latch::Completion;
use crate::metrics::FLUSH_EVERY;
use crate::run::Task;
use crate::sync;

/// How long a worker with deferred completions and nothing else to do polls them between
/// yields before it parks with a timeout: long enough that a GPU graph of a couple of
/// milliseconds (a replayed segment) is seen done within a yield, not at the end of a timed
/// park. The yield leaves the core to any other thread that wants it.
const DEFERRED_SPIN: Duration = Duration::from_millis(2);
/// The timed park of a worker that waits for deferred completions and has nothing else to do.
const DEFERRED_PARK: Duration = Duration::from_micros(50);
/// How long a worker that just ran dry watches the queues before it parks, by default
/// (`PoolBuilder::idle_spin`). Work often follows within microseconds (a chain of GPU nodes
/// hopping between workers, a burst of submissions), and a futex wake-up costs several; an
/// idle pool still parks after this, so it burns nothing.
pub(crate) const SPIN_BEFORE_PARK: Duration = Duration::from_micros(20);
/// How long one worker of a group may watch past the idle spin when its work comes back at a
/// steady pace, by default, in a pool that leaves the process two cores or more
/// (`PoolBuilder::paced_spin`): pauses up to two thirds of this are watched through.
pub(crate) const PACED_SPIN_MAX: Duration = Duration::from_millis(1);

/// The paced spin's default for a pool of `workers` in a process that may use `cores`: on
/// where the pool leaves at least two cores to other threads (a server's clients), off where
/// its watching worker would share a core with them. On the H100 host (8 workers, 16 cores) it
/// took the high client's slowest 1% from 240-290 µs of waiting before the launch to 22-56; on
/// the 2-core machine (2 workers) it made the latency bench's chain twice as slow
/// (docs/benchmarks.md, stops 43 and 44).
pub(crate) fn default_paced_spin(cores: usize, workers: usize) -> Duration {
    if cores >= workers + 2 {
        PACED_SPIN_MAX
    } else {
        Duration::ZERO
    }
}

/// A worker's pace after a pause of `pause` between running dry and finding work: an average
/// of its recent pauses (a quarter of the new one, so one late request does not stretch it),
/// forgotten when a pause is longer than `max` (work that comes that seldom pays a wake-up).
pub(crate) fn next_pace(
    pace: Option<Duration>,
    pause: Duration,
    max: Duration,
) -> Option<Duration> {
    if pause > max {
        return None;
    }
    Some(match pace {
        None => pause,
        Some(p) => (p * 3 + pause) / 4,
    })
}

/// How long a worker at `pace` watches before it parks: one and a half pauses (a pause a
/// little longer than usual still finds it awake), at least the idle spin, at most `max`.
pub(crate) fn paced_limit(pace: Duration, idle: Duration, max: Duration) -> Duration {
    (pace + pace / 2).min(max).max(idle)
}

/// The group's paced spinner slot, held while a worker watches at its pace; freed on drop.
#[cfg(not(loom))]
struct PacedSlot<'a>(&'a std::sync::atomic::AtomicBool);

#[cfg(not(loom))]
impl Drop for PacedSlot<'_> {
    fn drop(&mut self) {
        self.0.store(false, std::sync::atomic::Ordering::Release);
    }
}

impl<S: Send + 'static> WorkerThread<S> {
    pub(super) fn help_loop(&self, c: &Completion, deadline: Option<Instant>) -> bool {
        c.register_thread();
        let mut idle_rounds = 0;
        while !c.is_done() {
            if deadline.is_some_and(|d| Instant::now() >= d) {
                self.flush_credit();
                return false;
            }
            if let Some(t) = self.find_task() {
                self.note_work_found();
                self.execute(t);
                self.poll_urgent();
                idle_rounds = 0;
            } else if self.poll_deferred() {
                idle_rounds = 0;
            } else {
                self.go_idle(&mut idle_rounds, &|| c.is_done(), deadline);
                if c.is_done() || deadline.is_some_and(|d| Instant::now() >= d) {
                    self.pass_on_wakeup();
                }
            }
        }
        // The waiting body goes on, maybe for long: runs helped along here must not wait for it.
        self.flush_credit();
        // Nor is its time a pause of this worker's work.
        self.went_dry.set(None);
        true
    }

    /// A nested wait that ends as it parks (the awaited graph finished, or its deadline passed)
    /// may have been chosen by a pusher in that instant: the body then goes on, and the task or
    /// idle-hook request it was woken for would wait behind parked peers. Pass the wake-up on
    /// when something is waiting. A spare wake-up costs one peer a look at the queues.
    #[cold]
    pub(super) fn pass_on_wakeup(&self) {
        let reg = &*self.registry;
        let group = &reg.groups[self.group];
        if reg.sleep.hook_requested(self.group) || self.work_visible() {
            reg.sleep.notify_group(self.group);
        }
        for &d in group.domains.iter() {
            let domain = &reg.domains[d as usize];
            if !domain.injector.is_empty() {
                reg.sleep.notify_groups(&domain.groups);
            }
        }
        if !reg.any.is_empty() {
            reg.sleep.notify_any();
        }
    }

    /// Spins, then parks until work, `condition`, termination or `deadline` (a nested
    /// `wait_timeout`).
    pub(super) fn go_idle(
        &self,
        idle_rounds: &mut u32,
        condition: &dyn Fn() -> bool,
        deadline: Option<Instant>,
    ) {
        // Before anything else: a run whose last task ended here finishes now, not when this
        // worker next finds work.
        self.flush_credit();
        if *idle_rounds == 0 && self.deferred.borrow().is_empty() {
            // The pace is kept only where it can lengthen a spin: off, no clock read here.
            let paced = self.registry.paced_spin > self.registry.idle_spin;
            if paced && self.went_dry.get().is_none() {
                self.went_dry.set(Some(Instant::now()));
            }
            if self.spin(condition) {
                return;
            }
        }
        // The idle hook runs on every idle round (a `GroupWaker` wakes a parked worker exactly
        // so that it runs); the metrics flush only when the worker first runs dry.
        self.run_idle_hook();
        if *idle_rounds == 0 {
            self.flush();
        }
        let timeout = if self.deferred.borrow().is_empty() {
            None
        } else {
            if *idle_rounds == 0 {
                self.dry_since.set(Some(Instant::now()));
            }
            *idle_rounds += 1;
            // Under loom, a few rounds: the models check the protocol, not the timing.
            let polling = if cfg!(loom) {
                *idle_rounds < 4
            } else {
                self.dry_since
                    .get()
                    .is_some_and(|t| t.elapsed() < DEFERRED_SPIN)
            };
            if polling {
                sync::yield_now();
                return;
            }
            Some(DEFERRED_PARK)
        };
        let timeout = match deadline {
            None => timeout,
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return;
                }
                Some(timeout.map_or(left, |t| t.min(left)))
            }
        };
        *idle_rounds = idle_rounds.saturating_add(1);
        self.counters().parks.add(1);
        let reg = &*self.registry;
        let start = reg.trace.as_ref().map(|t| t.now());
        reg.sleep.sleep(
            self.index,
            self.group,
            timeout,
            || self.work_visible(),
            || condition() || reg.is_terminated(),
        );
        if let (Some(sink), Some(start)) = (&reg.trace, start) {
            sink.park(self.index, start, sink.now());
        }
    }

    /// Watches the queues (and `condition`) for up to the pool's idle spin
    /// ([`SPIN_BEFORE_PARK`] by default); returns whether
    /// something turned up. Under loom, never: the models check the parking protocol itself.
    #[cfg(not(loom))]
    fn spin(&self, condition: &dyn Fn() -> bool) -> bool {
        // Look often (a hand-off between two workers waits for exactly this look), read the
        // clock seldom.
        let mut start = Instant::now();
        let (limit, _slot) = self.spin_limit();
        let mut looks = 0u32;
        loop {
            std::hint::spin_loop();
            if self.work_visible() || condition() {
                return true;
            }
            if self.run_spin_hook() {
                // Progress outside the pool (an arrival) is often followed by more: the
                // spin starts over.
                start = Instant::now();
                continue;
            }
            looks = looks.wrapping_add(1);
            if looks % 64 == 0 {
                let spun = start.elapsed();
                // A paced spin is long: a pool shutting down does not wait for it.
                if spun >= limit || self.registry.is_terminated() {
                    return false;
                }
                // Past the default spin, a thread queued on this pinned worker's core (a client
                // that cannot move) runs at once instead of at the next tick.
                if spun >= SPIN_BEFORE_PARK {
                    std::thread::yield_now();
                }
            }
        }
    }

    #[cfg(loom)]
    fn spin(&self, _condition: &dyn Fn() -> bool) -> bool {
        false
    }

    /// How long this spin watches: the idle spin, or longer at this worker's pace while it
    /// holds its group's paced spinner slot (one worker of a group at a time).
    #[cfg(not(loom))]
    fn spin_limit(&self) -> (Duration, Option<PacedSlot<'_>>) {
        let reg = &*self.registry;
        let idle = reg.idle_spin;
        let Some(pace) = self.pace.get() else {
            return (idle, None);
        };
        let limit = paced_limit(pace, idle, reg.paced_spin);
        if limit <= idle {
            return (idle, None);
        }
        let slot = &*reg.groups[self.group].paced_spinner;
        use std::sync::atomic::Ordering::{Acquire, Relaxed};
        match slot.compare_exchange(false, true, Acquire, Relaxed) {
            Ok(_) => (limit, Some(PacedSlot(slot))),
            Err(_) => (idle, None),
        }
    }

    /// Work found after running dry: the pause joins this worker's pace.
    #[inline]
    pub(super) fn note_work_found(&self) {
        if let Some(t) = self.went_dry.take() {
            let max = self.registry.paced_spin;
            self.pace.set(next_pace(self.pace.get(), t.elapsed(), max));
        }
    }

    /// Polls deferred completions; returns whether any completed. Called when nothing was
    /// queued: a run whose last node ended here is finished first (its spare units given back),
    /// not after the polls.
    pub(super) fn poll_deferred(&self) -> bool {
        self.flush_credit();
        if self.deferred.borrow().is_empty() {
            return false;
        }
        self.poll_deferred_of(false)
    }

    /// Between two tasks of a busy worker: polls the deferred completions of high-level nodes,
    /// if it holds any (one cell read otherwise).
    #[inline]
    pub(super) fn poll_urgent(&self) {
        if self.urgent.get() > 0 {
            self.poll_urgent_slow();
        }
    }

    #[cold]
    #[inline(never)]
    fn poll_urgent_slow(&self) {
        self.flush_credit();
        self.poll_deferred_of(true);
    }

    /// Polls the deferred completions (only the urgent ones with `urgent_only`); whether any
    /// completed.
    fn poll_deferred_of(&self, urgent_only: bool) -> bool {
        let mut list = std::mem::take(&mut *self.deferred.borrow_mut());
        let mut progressed = false;
        let mut i = 0;
        while i < list.len() {
            let d = &mut list[i];
            if urgent_only && !d.urgent {
                i += 1;
                continue;
            }
            let outcome = catch_unwind(AssertUnwindSafe(|| (d.poll)(&self.host.state)));
            let ok = match outcome {
                Ok(Poll::Pending) => {
                    i += 1;
                    continue;
                }
                Ok(Poll::Ready(Ok(()))) => true,
                Ok(Poll::Ready(Err(e))) => {
                    let run = d.task.run();
                    run.fail(node_failed(&run, d.task.node(), e));
                    false
                }
                Err(p) => {
                    let run = d.task.run();
                    run.fail(node_panicked(&run, d.task.node(), &*p));
                    false
                }
            };
            let d = list.swap_remove(i);
            if d.urgent {
                self.urgent.set(self.urgent.get() - 1);
            }
            progressed = true;
            let run = d.task.run();
            if let Some(c) = self.complete(run, d.task.node(), ok) {
                self.execute(Task::new(run, c));
            }
            self.settle_finished();
        }
        let mut cur = self.deferred.borrow_mut();
        list.append(&mut cur);
        *cur = list;
        progressed
    }

    /// Every [`SERVICE_EVERY`] nodes: the idle hook (a busy worker still frees what its
    /// device's drops queued) and, less often, the metrics flush.
    #[cold]
    pub(super) fn service(&self, n: u64) {
        if n == 0 {
            return;
        }
        self.run_idle_hook();
        if n % FLUSH_EVERY == 0 {
            self.flush();
        }
    }

    pub(super) fn run_idle_hook(&self) {
        // Take a waker's request before the hook runs, so that one made while it runs (for a
        // handle queued after the hook looked) sets the flag again and is served next time.
        self.registry.sleep.take_hook_request(self.group);
        if let Some(h) = &self.registry.hooks.idle {
            let info = &self.registry.infos[self.index];
            if let Err(p) = catch_unwind(AssertUnwindSafe(|| h(info, &self.host.state))) {
                abort_on_hook_panic(&self.registry.name, &info.name, "idle hook", &*p);
            }
        }
    }

    /// The spin hook, if the pool has one: whether it did anything. Completers it calls for
    /// nodes this worker takes queue their completions without waking a peer (`hooked.rs`).
    #[inline]
    fn run_spin_hook(&self) -> bool {
        let Some(h) = &self.registry.hooks.spin else {
            return false;
        };
        let reg = &*self.registry as *const crate::registry::Registry<S> as usize;
        let _mark = crate::hooked::SpinHookGuard::enter(reg, self.group);
        let info = &self.registry.infos[self.index];
        match catch_unwind(AssertUnwindSafe(|| h(info, &self.host.state))) {
            Ok(progressed) => progressed,
            Err(p) => abort_on_hook_panic(&self.registry.name, &info.name, "spin hook", &*p),
        }
    }

    pub(super) fn flush(&self) {
        if !self.registry.export_metrics {
            return;
        }
        self.flusher
            .borrow_mut()
            .flush(self.counters(), self.local.len());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn the_paced_spin_is_on_only_where_the_pool_leaves_two_cores() {
        assert_eq!(default_paced_spin(16, 8), PACED_SPIN_MAX);
        assert_eq!(default_paced_spin(4, 2), PACED_SPIN_MAX);
        assert_eq!(default_paced_spin(3, 2), Duration::ZERO);
        assert_eq!(default_paced_spin(2, 2), Duration::ZERO);
        assert_eq!(default_paced_spin(2, 1), Duration::ZERO);
        assert_eq!(default_paced_spin(8, 8), Duration::ZERO);
    }

    #[test]
    fn the_pace_averages_pauses_and_forgets_a_long_one() {
        let us = Duration::from_micros;
        assert_eq!(next_pace(None, us(400), MS), Some(us(400)));
        assert_eq!(next_pace(Some(us(400)), us(800), MS), Some(us(500)));
        assert_eq!(next_pace(Some(us(400)), us(1001), MS), None);
        assert_eq!(next_pace(None, us(1), Duration::ZERO), None);
    }

    #[test]
    fn a_paced_spin_covers_a_pause_and_a_half_within_its_bounds() {
        let us = Duration::from_micros;
        assert_eq!(paced_limit(us(300), us(20), MS), us(450));
        assert_eq!(paced_limit(us(900), us(20), MS), MS);
        assert_eq!(paced_limit(us(10), us(200), MS), us(200));
        assert_eq!(paced_limit(us(300), us(20), Duration::ZERO), us(20));
    }
}
