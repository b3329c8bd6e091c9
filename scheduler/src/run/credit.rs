//! A worker's spare in-flight units of one run ([`Credit`]), so that node completions and
//! hand-offs on one worker touch the run's shared count once per chunk, not once per node.

use std::cell::Cell;
use std::fmt;

use super::RunRef;

/// Units a worker moves between a run's shared in-flight count and its [`Credit`] at a time
/// (small under loom, so that the models reach every path with a few nodes).
pub(crate) const CREDIT_CHUNK: usize = if cfg!(loom) { 2 } else { 64 };
/// Spare units a worker keeps before it gives all but [`CREDIT_CHUNK`] back.
pub(crate) const CREDIT_MAX: usize = if cfg!(loom) { 3 } else { 4 * CREDIT_CHUNK };

/// A worker's private share of one run's in-flight count: spare units that are counted in the
/// run's `inflight` but belong to no task. A task that completes on the worker leaves its unit
/// here instead of decrementing the shared count, and a task the worker queues takes its unit
/// from here instead of incrementing it; the shared count is touched once per
/// [`CREDIT_CHUNK`] units or so, not once per node (issue 14: with every worker of a tree or a
/// wide graph decrementing the one counter, that cache line was the bottleneck).
///
/// Safety of the scheme: the spare units are always counted in `inflight`, so the shared count
/// is never below the true number of queued and running tasks, and it reaches zero only when
/// that number is zero and no worker holds spare units (whoever gives the last units back
/// finishes the run). While a worker holds spare units of a run, the run is alive (the count is
/// above zero), so its `RunRef` may be dereferenced; with no spare units the stored pointer means
/// nothing and is only compared. Liveness: a worker gives its units back ([`flush`](Self::flush))
/// before it goes idle, before it runs a task of another run, and when a nested wait ends, so a
/// run finishes no later than the moment its last unit's worker looks for other work.
pub(crate) struct Credit<S> {
    run: Cell<Option<RunRef<S>>>,
    units: Cell<usize>,
}

impl<S> Credit<S> {
    pub(crate) fn new() -> Self {
        Credit {
            run: Cell::new(None),
            units: Cell::new(0),
        }
    }

    #[inline]
    fn holds(&self, run: RunRef<S>) -> bool {
        self.run.get().is_some_and(|r| r.same(run))
    }

    /// Whether spare units of a run other than `run` are held (the caller flushes them before
    /// it works for `run`).
    #[inline]
    pub(crate) fn holds_other(&self, run: RunRef<S>) -> bool {
        self.units.get() != 0 && !self.holds(run)
    }

    /// Spare units held (tests and assertions).
    #[cfg_attr(not(loom), allow(dead_code))]
    pub(crate) fn units(&self) -> usize {
        self.units.get()
    }

    /// A task of `run` is about to be queued: it takes a spare unit, or the shared count is
    /// raised by a chunk. The caller holds a unit of `run` (the node that made the task ready).
    /// Returns a run whose count reached zero when this worker switched runs and gave its old
    /// units back: the caller must finish it (`Registry::finish`).
    #[inline]
    pub(crate) fn enter(&self, run: RunRef<S>) -> Option<RunRef<S>> {
        let u = self.units.get();
        if u != 0 && self.holds(run) {
            self.units.set(u - 1);
            return None;
        }
        self.enter_slow(run)
    }

    #[cold]
    #[inline(never)]
    fn enter_slow(&self, run: RunRef<S>) -> Option<RunRef<S>> {
        let done = if self.holds(run) { None } else { self.flush() };
        run.raise(CREDIT_CHUNK);
        self.run.set(Some(run));
        self.units.set(CREDIT_CHUNK - 1);
        done
    }

    /// A task of `run` completed here and made nothing ready that takes over its unit: the unit
    /// becomes a spare one. The run is not finished here (that happens when the units are
    /// given back), but a run whose units were held before may be: see [`enter`](Self::enter).
    #[inline]
    pub(crate) fn leave(&self, run: RunRef<S>) -> Option<RunRef<S>> {
        let u = self.units.get();
        if self.holds(run) || u == 0 {
            if u < CREDIT_MAX {
                self.run.set(Some(run));
                self.units.set(u + 1);
            } else {
                // Keep a chunk: the count stays above zero, so this cannot finish the run.
                run.lower(u + 1 - CREDIT_CHUNK);
                self.units.set(CREDIT_CHUNK);
            }
            return None;
        }
        let done = self.flush();
        self.run.set(Some(run));
        self.units.set(1);
        done
    }

    /// Gives every spare unit back. Returns the run when that brought its count to zero: the
    /// caller must then finish it (`Registry::finish`) and not touch it after settling that.
    #[inline]
    pub(crate) fn flush(&self) -> Option<RunRef<S>> {
        let u = self.units.replace(0);
        if u == 0 {
            return None;
        }
        let run = self.run.get().expect("spare units belong to a run");
        run.lower(u).then_some(run)
    }
}

impl<S> fmt::Debug for Credit<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Credit({} units)", self.units.get())
    }
}
