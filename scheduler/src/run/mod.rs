//! One execution of a graph, split along its protocols as rayon-core's job and latch are:
//!
//! * `mod.rs` (here): the [`Run`] (its counters, slots, failure state, result) and [`RunRef`],
//!   the pointer workers hold it by, with the in-flight count's protocol;
//! * `access.rs`: the run as its bodies see it (`ctx`'s `RunAccess`);
//! * `task.rs`: [`Task`], a queued node or span of a run (the job);
//! * `credit.rs`: a worker's spare in-flight units of one run ([`Credit`]);
//! * `later.rs`: a node's completion handed to a `Completer`, which holds the node's unit
//!   until it queues the completion ([`Pending`](later::Pending), [`Queue`]);
//! * `release.rs`: a completed node's release of its successors (the dependency counters);
//! * `wide.rs`: arrivals at wide joins, and a worker's batching of them ([`LeafBatcher`]);
//!
//! The scheduler's raw-pointer code starts here (the crate docs, `lib.rs`, keep the one list of
//! the files with `unsafe`: `ctx.rs` and `backend.rs` read and write the output slots this
//! module hands out): a queued `Task` points at its `Run` without a reference count, so a node
//! hand-off costs no shared refcount traffic.
//! The pointer stays valid because the registry keeps an `Arc<Run>` in its table of active
//! runs until the run's in-flight count reaches zero, and every task is counted in flight
//! from the moment it is created until its node has completed (a worker's spare units, see
//! [`Credit`], are counted too, and keep the run alive while the worker holds them).
//!
//! Workers hold a run as a [`RunRef`] (the pointer), never as a `&Run` function argument, across
//! a point where they give their in-flight unit away (queueing the task that carries it, a
//! decrement that does not reach zero, a hand-off to the CPU lane): from there another thread may
//! finish and free the run while the frame is still live, and a reference argument must stay
//! valid for its whole call (Stacked/Tree Borrows protectors), used again or not. A `&Run` made
//! by dereferencing a `RunRef` inside a body is not an argument and carries no such promise.

mod access;
mod credit;
mod later;
mod release;
mod task;
mod wide;

use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Instant;

use crossbeam_utils::CachePadded;

pub(crate) use self::credit::Credit;
#[cfg(all(test, loom))]
pub(crate) use self::credit::{CREDIT_CHUNK, CREDIT_MAX};
pub(crate) use self::later::{hand_off, Queue};
pub(crate) use self::task::{span_chunk, Task, SPAN_GRAIN, SPAN_MIN};
pub(crate) use self::wide::LeafBatcher;
use self::wide::LEAF_STRIDE;
use crate::error::{Error, ErrorKind};
use crate::graph::{too_large, AllocFailure, Counters, Plan, WideJoins};
use crate::latch::Completion;
use crate::output::{GraphOutput, Slots};
use crate::sync::{self, AtomicBool, AtomicU32, AtomicUsize, Mutex, Ordering};

pub(crate) struct Run<S> {
    pub(crate) id: u64,
    pub(crate) plan: Arc<Plan<S>>,
    /// Finished predecessors of each node with more than one, counting up from `epoch ×`
    /// its target (zeroed memory for a plan's first run; empty when the graph has no such
    /// node: one-predecessor nodes need no counter).
    pending: Box<[AtomicU32]>,
    /// The leaf counters of the wide joins ([`WideJoins`]), `LEAF_STRIDE` apart, counting as
    /// `pending` does (empty when the graph has none).
    leaves: Box<[AtomicU32]>,
    /// Runs of this plan that counted in these counters before (see `graph::CounterCache`).
    epoch: u32,
    /// The run succeeded: its counters go back to the plan's cache when it is dropped.
    recycle: AtomicBool,
    pub(crate) slots: Slots,
    /// One-predecessor nodes whose predecessor ended without releasing them (failures only).
    unreleased: Mutex<Vec<u32>>,
    /// Tasks of this run that are queued or running (deferred completions included).
    /// The run is over when it drops to zero.
    pub(crate) inflight: CachePadded<AtomicUsize>,
    failed: AtomicBool,
    error: Mutex<Option<Error>>,
    /// Nodes that became ready after the run failed and were skipped.
    skipped: AtomicUsize,
    pub(crate) completion: Arc<Completion>,
    pub(crate) submitted: Instant,
}

impl<S> Run<S> {
    /// A run of `plan`; its counters that cannot be allocated are an
    /// [`ErrorKind::TooLarge`] error.
    pub(crate) fn new(id: u64, plan: Arc<Plan<S>>) -> Result<Self, Error> {
        let n = plan.nodes.len();
        let cached = if plan.joins {
            plan.counters.take()
        } else {
            None
        };
        let Counters {
            pending,
            leaves,
            epoch,
        } = match cached {
            Some(c) => c,
            None => Self::fresh_counters(&plan)
                .map_err(|f| too_large(&plan.name, plan.nodes.len(), plan.edges, f))?,
        };
        let inflight = CachePadded::new(AtomicUsize::new(plan.sources.len()));
        Ok(Run {
            id,
            plan,
            pending,
            leaves,
            epoch,
            recycle: AtomicBool::new(false),
            slots: Slots::new(n),
            unreleased: Mutex::new(Vec::new()),
            inflight,
            failed: AtomicBool::new(false),
            error: Mutex::new(None),
            skipped: AtomicUsize::new(0),
            completion: Arc::new(Completion::new()),
            submitted: Instant::now(),
        })
    }

    /// Counters at zero for a plan's first run (none for a graph without joins).
    fn fresh_counters(plan: &Plan<S>) -> Result<Counters, AllocFailure> {
        if !plan.joins {
            let none = sync::zeroed_counters(0).expect("an empty array allocates nothing");
            return Ok(Counters {
                pending: none,
                leaves: sync::zeroed_counters(0).expect("an empty array allocates nothing"),
                epoch: 0,
            });
        }
        let n = plan.nodes.len();
        let pending = sync::zeroed_counters(n)
            .ok_or_else(|| AllocFailure::of::<u32>("dependency counters", n))?;
        let leaves = WideJoins::try_of(plan)?.leaves() * LEAF_STRIDE;
        let leaves = sync::zeroed_counters(leaves)
            .ok_or_else(|| AllocFailure::of::<u32>("wide joins' leaf counters", leaves))?;
        Ok(Counters {
            pending,
            leaves,
            epoch: 0,
        })
    }

    #[inline]
    pub(crate) fn is_failed(&self) -> bool {
        self.failed.load(Ordering::Relaxed)
    }

    /// Marks the run failed with `error`; the first failure wins.
    pub(crate) fn fail(&self, error: Error) {
        let mut slot = sync::lock(&self.error);
        if slot.is_none() {
            *slot = Some(error);
        }
        self.failed.store(true, Ordering::Release);
    }

    pub(crate) fn note_skipped(&self) {
        self.skipped.fetch_add(1, Ordering::Relaxed);
    }

    /// Builds the run's result. Called once, by the thread that brought `inflight` to zero.
    pub(crate) fn take_result(&self) -> Result<GraphOutput, Error> {
        if self.failed.load(Ordering::Acquire) {
            // Nodes never released (counter below the in-degree) plus released-but-skipped ones
            // (without the former if counting them needs memory that cannot be allocated).
            let unreleased = self.count_unreleased().unwrap_or(0);
            let cancelled = unreleased + self.skipped.load(Ordering::Relaxed);
            let err = sync::lock(&self.error).take().unwrap_or_else(|| {
                Error::new(
                    ErrorKind::Cancelled,
                    format!("graph '{}' failed", crate::error::bounded(&self.plan.name)),
                )
            });
            return Err(err.with_cancelled(cancelled));
        }
        // Every arrival at every join was counted: the counters stand at their targets.
        self.recycle.store(true, Ordering::Relaxed);
        let mut values = Vec::new();
        let valued = self.plan.valued.len();
        if values.try_reserve_exact(valued).is_err() {
            let f = AllocFailure::of::<(u32, crate::output::AnyValue)>("outputs", valued);
            return Err(too_large(
                &self.plan.name,
                self.plan.nodes.len(),
                self.plan.edges,
                f,
            ));
        }
        for &i in self.plan.valued.iter() {
            // SAFETY: in-flight reached zero, so no other thread touches this run's slots.
            let out = self.slots.get(i).and_then(|s| unsafe { s.take() });
            if let Some(v) = out.and_then(|o| o.into_value()) {
                values.push((i, v));
            }
        }
        Ok(GraphOutput {
            graph: self.plan.uid,
            name: self.plan.name.clone(),
            values,
        })
    }
}

impl<S> Drop for Run<S> {
    fn drop(&mut self) {
        // Only a run that succeeded left every counter at its target; a failed one (or one
        // never started) leaves them where they stopped, and they are freed.
        if !self.plan.joins || !self.recycle.load(Ordering::Relaxed) {
            return;
        }
        self.plan.counters.keep(|| Counters {
            pending: std::mem::take(&mut self.pending),
            leaves: std::mem::take(&mut self.leaves),
            epoch: self.epoch.wrapping_add(1),
        });
    }
}

/// A pointer to a run that a worker holds while it has one of the run's in-flight units (see the
/// module docs). It dereferences to the run only while the unit is held; the unit is given
/// up by [`leave`](Self::leave) or [`settle`](Self::settle) (or by handing a task that carries it
/// to another thread), after which it must not be dereferenced again unless the count reached
/// zero (then the caller has the run to itself until it settles the `Finished` it gets from
/// `Registry::finish`).
pub(crate) struct RunRef<S>(NonNull<Run<S>>);

impl<S> Clone for RunRef<S> {
    #[inline]
    fn clone(&self) -> Self {
        *self
    }
}
impl<S> Copy for RunRef<S> {}

impl<S> RunRef<S> {
    #[inline]
    pub(crate) fn new(run: &Run<S>) -> Self {
        RunRef(NonNull::from(run))
    }

    /// Removes one task from the in-flight count. Returns `true` when it reached zero: the
    /// caller must then call `Registry::finish` and not touch the run after settling what it
    /// returns. When it returns `false` the run may already be freed: do not dereference `self`.
    #[inline]
    pub(crate) fn leave(self) -> bool {
        // SAFETY: the caller holds an in-flight unit, so the run is alive at the decrement. The
        // decrement goes through the raw pointer, as `Arc::drop` does: no `&Run` argument spans
        // it, so another thread freeing the run right after it (once it brought the count to
        // zero) frees nothing a live reference argument points to. Nothing here touches the run
        // after the decrement.
        unsafe { (*self.0.as_ptr()).inflight.fetch_sub(1, Ordering::AcqRel) == 1 }
    }

    /// Adjusts the in-flight count for a completed node that made `newly_ready` tasks ready
    /// (this node leaves, they enter). Returns `true` when the count reached zero: the caller
    /// must then call `Registry::finish` and not touch the run again.
    ///
    /// The count is raised before the caller queues the ready tasks, so no task of the run can
    /// bring it to zero while another is still to be queued. After it returns `false`, the unit
    /// has passed to the ready tasks: the run may be freed once they are queued.
    #[inline]
    pub(crate) fn settle(self, newly_ready: usize) -> bool {
        match newly_ready {
            0 => self.leave(),
            1 => false,
            k => {
                // The node's unit is still held here (it passes to the ready tasks only once
                // they are queued), so the run is alive.
                self.inflight.fetch_add(k - 1, Ordering::AcqRel);
                false
            }
        }
    }
}

impl<S> RunRef<S> {
    /// Raises the in-flight count by `k` (the caller holds a unit of the run, or spare units).
    #[inline]
    fn raise(self, k: usize) {
        // SAFETY: the caller holds a unit, so the run is alive; see `leave` for the raw pointer.
        unsafe { (*self.0.as_ptr()).inflight.fetch_add(k, Ordering::AcqRel) };
    }

    /// Lowers the in-flight count by `k` units the caller holds. Returns `true` when it reached
    /// zero (as [`leave`](Self::leave)).
    #[inline]
    fn lower(self, k: usize) -> bool {
        // SAFETY: as in `leave`: the caller's `k` units keep the run alive up to the decrement,
        // and nothing here touches it after.
        unsafe { (*self.0.as_ptr()).inflight.fetch_sub(k, Ordering::AcqRel) == k }
    }

    /// Whether both point at the same run.
    #[inline]
    pub(crate) fn same(self, other: RunRef<S>) -> bool {
        self.0 == other.0
    }
}

impl<S> std::ops::Deref for RunRef<S> {
    type Target = Run<S>;

    #[inline]
    fn deref(&self) -> &Run<S> {
        // SAFETY: the run outlives every in-flight unit (the module docs), and a `RunRef` is
        // dereferenced only while its holder has one, or has the run to itself (count at zero,
        // before its `Finished` is settled). The `&Run` lives no longer than the borrow of the
        // `RunRef`, which its holder ends before it gives the unit away.
        unsafe { self.0.as_ref() }
    }
}
