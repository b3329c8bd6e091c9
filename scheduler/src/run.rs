//! One execution of a graph: its dependency counters, output slots and completion.
//!
//! The scheduler's raw-pointer code starts here (the crate docs, `lib.rs`, keep the one list of
//! the files with `unsafe`: `ctx.rs` and `backend.rs` read and write the output slots this file
//! hands out): a queued `Task` points at its `Run` without a reference count, so a node hand-off costs no shared refcount traffic.
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

use std::cell::{Cell, UnsafeCell};
use std::fmt;
use std::ptr::NonNull;
use std::task::Waker;
use std::time::Instant;

use crossbeam_utils::CachePadded;

use crate::error::{Error, ErrorKind};
use crate::graph::{AnyValue, Plan, CLASS_ONE, CLASS_RECORD};
use crate::ids::{NodeId, NodeRef};
use crate::sync::{
    self, current_thread, AtomicBool, AtomicPtr, AtomicU32, AtomicUsize, Mutex, Ordering, Thread,
};

/// What a finished node leaves for its successors and the submitter.
pub(crate) struct NodeOutput {
    pub(crate) value: Option<AnyValue>,
    pub(crate) marker: Option<AnyValue>,
}

/// A node's output slot: written once by the worker that ran the node, before it releases its
/// successors, and read only by those successors (after their dependency counter reached zero)
/// and by the run's finisher (after the in-flight count reached zero).
#[repr(transparent)]
pub(crate) struct Slot(UnsafeCell<Option<Box<NodeOutput>>>);

// SAFETY: access is ordered by the dependency counters as described on `Slot`: the single writer
// finishes before a Release decrement that every reader's Acquire observes, so no slot is ever
// written and read concurrently. The values are `Send + Sync`.
unsafe impl Sync for Slot {}

impl Slot {
    /// Stores the node's value.
    ///
    /// # Safety
    /// Only the worker running this slot's node may call this, before releasing successors.
    #[inline]
    pub(crate) unsafe fn set_value(&self, value: AnyValue) {
        // SAFETY: the caller is the node's only writer and no reader exists yet (see `Slot`).
        let slot = unsafe { &mut *self.0.get() };
        match slot {
            Some(out) => out.value = Some(value),
            None => {
                *slot = Some(Box::new(NodeOutput {
                    value: Some(value),
                    marker: None,
                }))
            }
        }
    }

    /// Stores the node's marker.
    ///
    /// # Safety
    /// As for [`set_value`](Self::set_value).
    pub(crate) unsafe fn set_marker(&self, marker: AnyValue) {
        // SAFETY: as in `set_value`.
        let slot = unsafe { &mut *self.0.get() };
        match slot {
            Some(out) => out.marker = Some(marker),
            None => {
                *slot = Some(Box::new(NodeOutput {
                    value: None,
                    marker: Some(marker),
                }))
            }
        }
    }

    /// # Safety
    /// The caller must be a successor whose dependency counter reached zero, or otherwise be
    /// ordered after this slot's node completed.
    pub(crate) unsafe fn get(&self) -> Option<&NodeOutput> {
        // SAFETY: the write happened-before this read (caller's contract); no writer remains.
        unsafe { (*self.0.get()).as_deref() }
    }

    /// # Safety
    /// The caller must have exclusive access to the run (its in-flight count reached zero).
    unsafe fn take(&self) -> Option<NodeOutput> {
        // SAFETY: exclusive access per the caller's contract.
        unsafe { (*self.0.get()).take().map(|b| *b) }
    }
}

/// A run's output slots, allocated when the first node stores a value or a marker: a graph
/// whose nodes leave nothing (most large host graphs) never allocates or frees them.
pub(crate) struct Slots {
    ptr: AtomicPtr<Slot>,
    len: usize,
}

impl Slots {
    fn new(len: usize) -> Self {
        Slots {
            ptr: AtomicPtr::new(std::ptr::null_mut()),
            len,
        }
    }

    fn layout(len: usize) -> std::alloc::Layout {
        std::alloc::Layout::array::<Slot>(len).expect("slot array size")
    }

    /// Slot `i`, if any slot was ever allocated (readers: a node that stored something
    /// allocated them before its completion, which happened-before the read).
    #[inline]
    pub(crate) fn get(&self, i: u32) -> Option<&Slot> {
        let p = self.ptr.load(Ordering::Acquire);
        if p.is_null() {
            return None;
        }
        assert!((i as usize) < self.len, "slot index out of range");
        // SAFETY: `p` points to `len` initialised slots that live until the run is dropped.
        Some(unsafe { &*p.add(i as usize) })
    }

    /// Slot `i`, allocating the slots on first use (several writers may race to allocate:
    /// one wins, the others free theirs).
    pub(crate) fn get_or_alloc(&self, i: u32) -> &Slot {
        assert!((i as usize) < self.len, "slot index out of range");
        let mut p = self.ptr.load(Ordering::Acquire);
        if p.is_null() {
            let layout = Self::layout(self.len);
            // SAFETY: `layout` has a non-zero size (`len > 0`, since node `i` exists).
            let fresh = unsafe { std::alloc::alloc_zeroed(layout) } as *mut Slot;
            if fresh.is_null() {
                std::alloc::handle_alloc_error(layout);
            }
            // All-zero bits are `None` in every slot (the null niche of `Box`).
            match self.ptr.compare_exchange(
                std::ptr::null_mut(),
                fresh,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => p = fresh,
                Err(won) => {
                    // SAFETY: `fresh` came from `alloc_zeroed(layout)` and was never shared.
                    unsafe { std::alloc::dealloc(fresh as *mut u8, layout) };
                    p = won;
                }
            }
        }
        // SAFETY: as in `get`.
        unsafe { &*p.add(i as usize) }
    }
}

impl Drop for Slots {
    fn drop(&mut self) {
        // `&mut self`: no other thread can be writing (a Relaxed load is exact).
        let p = self.ptr.load(Ordering::Relaxed);
        if p.is_null() {
            return;
        }
        for i in 0..self.len {
            // SAFETY: `&mut self`: no other reference to the slots exists; each slot is
            // initialised and dropped exactly once here.
            unsafe { std::ptr::drop_in_place(p.add(i)) };
        }
        // SAFETY: the memory came from `alloc_zeroed` with this layout.
        unsafe { std::alloc::dealloc(p as *mut u8, Self::layout(self.len)) };
    }
}

/// A pointer to a run that a worker holds while it has one of the run's in-flight units (see the
/// top of this file). It dereferences to the run only while the unit is held; the unit is given
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

impl<S> std::ops::Deref for RunRef<S> {
    type Target = Run<S>;

    #[inline]
    fn deref(&self) -> &Run<S> {
        // SAFETY: the run outlives every in-flight unit (top of this file), and a `RunRef` is
        // dereferenced only while its holder has one, or has the run to itself (count at zero,
        // before its `Finished` is settled). The `&Run` lives no longer than the borrow of the
        // `RunRef`, which its holder ends before it gives the unit away.
        unsafe { self.0.as_ref() }
    }
}

/// A ready node of a run, as it sits in a deque or injector, or a part of a large node's
/// successor list still to be released (a *span*, see [`Task::span`]). Move-only: it stands for
/// one in-flight unit of its run, so it is completed exactly once, by whoever holds it last.
pub(crate) struct Task<S> {
    run: RunRef<S>,
    /// The node (low 32 bits) and the span (high 32 bits): 0 to run the node, otherwise the
    /// chunks `[span >> 16, span & 0xFFFF)` of the node's successor list (see [`span_chunk`]),
    /// which the node completed without releasing them yet. One word, so that a task is a
    /// pair of scalars, passed in two registers: as (pointer, u32, u32) it went to
    /// `Worker::push` through the stack, and the callee's 16-byte load of the three smaller
    /// stores could not be forwarded from them (three quarters of `push`'s time on a tree).
    word: u64,
}

/// Nodes with at least this many successors hand them on as spans (`Task::span`) that workers
/// split in halves, instead of queueing every ready successor one by one (issue 14: a million
/// tasks pushed on one deque and stolen one CAS at a time from its one end).
pub(crate) const SPAN_MIN: usize = if cfg!(loom) { 3 } else { 64 };
/// A span of at most this many successors is released by the worker that holds it.
pub(crate) const SPAN_GRAIN: usize = if cfg!(loom) { 1 } else { 32 };

/// The chunk size of a successor list of `len` nodes: at most 65,535 chunks, so that a span's
/// two ends fit in a `u32`.
#[inline]
pub(crate) fn span_chunk(len: usize) -> usize {
    len.div_ceil(0xFFFF).max(1)
}

// SAFETY: a task is a (run, node) pair; `Run<S>` is shared between workers by design (its mutable
// parts are atomics, locks or slots ordered as documented on `Slot`), and the pointer's validity
// is guaranteed by the in-flight protocol described at the top of this file.
unsafe impl<S> Send for Task<S> {}

impl<S> Task<S> {
    #[inline]
    pub(crate) fn new(run: RunRef<S>, node: u32) -> Self {
        Task {
            run,
            word: node as u64,
        }
    }

    /// A span: chunks `lo..hi` of `node`'s successor list, to be released (`lo < hi <= 0xFFFF`).
    #[inline]
    pub(crate) fn span(run: RunRef<S>, node: u32, lo: usize, hi: usize) -> Self {
        debug_assert!(lo < hi && hi <= 0xFFFF);
        let span = ((lo as u64) << 16) | hi as u64;
        Task {
            run,
            word: (span << 32) | node as u64,
        }
    }

    /// The chunks of a span task, `None` for a node task.
    #[inline]
    pub(crate) fn chunks(&self) -> Option<(usize, usize)> {
        let span = (self.word >> 32) as u32;
        (span != 0).then_some(((span >> 16) as usize, (span & 0xFFFF) as usize))
    }

    /// The node to run, or whose successors the span releases.
    #[inline]
    pub(crate) fn node(&self) -> u32 {
        self.word as u32
    }

    /// The run this task belongs to: valid to dereference while this task's unit is held (it is
    /// counted in flight until its node completes).
    #[inline]
    pub(crate) fn run(&self) -> RunRef<S> {
        self.run
    }
}

impl<S> fmt::Debug for Task<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Task(node #{})", self.node())
    }
}

/// Arrivals of one worker's predecessors at one leaf of a wide join, not yet counted in the
/// leaf (see `Run::release_batched`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct LeafBatch {
    /// The join node.
    pub(crate) join: u32,
    /// The leaf's index among all the plan's leaves.
    leaf: u32,
    /// Arrivals counted in this batch (at least 1).
    count: u32,
}

/// A worker's batching of wide-join arrivals (see `Run::release_batched`).
pub(crate) struct LeafBatcher<S> {
    /// The run whose arrivals are batched, if any (the caller keeps it alive while set).
    pub(crate) run: Cell<Option<RunRef<S>>>,
    /// Arrivals at one leaf of a wide join of `run`, not yet counted.
    pub(crate) batch: Cell<Option<LeafBatch>>,
}

impl<S> LeafBatcher<S> {
    pub(crate) fn new() -> Self {
        LeafBatcher {
            run: Cell::new(None),
            batch: Cell::new(None),
        }
    }
}

impl<S> fmt::Debug for LeafBatcher<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LeafBatcher({:?})", self.batch.get())
    }
}

/// In-degree from which a join counts its predecessors in leaf counters first (see
/// [`WideJoins`]).
pub(crate) const WIDE_JOIN: u32 = if cfg!(loom) { 3 } else { 256 };
/// Predecessors, by consecutive node index, that share a leaf counter.
const LEAF_SPAN: u32 = if cfg!(loom) { 2 } else { 128 };
/// Counters per leaf slot in `Run::leaves`: one leaf per 128-byte line, so workers finishing
/// neighbouring ranges of predecessors do not share a line.
const LEAF_STRIDE: usize = if cfg!(loom) { 1 } else { 32 };

/// The leaf of a wide join with `leaves` leaves that predecessor `p` counts in:
/// `(p / LEAF_SPAN) % leaves`, without the division when no wrap is needed (a join's
/// predecessors are mostly numbered below `leaves * LEAF_SPAN`; the division cost a mapped node
/// of a map-reduce more than its batched count).
#[inline]
fn leaf_of(p: u32, leaves: u32) -> u32 {
    let q = p / LEAF_SPAN;
    if q < leaves {
        q
    } else {
        q % leaves
    }
}

/// Two-level dependency counters for the joins with at least [`WIDE_JOIN`] predecessors (issue
/// 14: a million predecessors finishing on every worker all incremented one counter). A
/// predecessor `p` of such a join counts in leaf `(p / LEAF_SPAN) % leaves` of the join; the one
/// that completes a leaf (its quota, fixed here from the edges) counts once in the join's own
/// counter, whose target is the number of non-empty leaves. Predecessors are mostly numbered in
/// ranges and stolen in ranges, so a leaf is shared by a few workers at most. A worker running
/// a span batches its nodes' arrivals at one leaf (`Run::release_batched`) and counts them with
/// one increment when the span ends or the leaf changes, so the join is ready at most one
/// span's part after its last predecessor completes.
#[derive(Debug, Default)]
pub(crate) struct WideJoins {
    /// (join node, first leaf, leaves, non-empty leaves), sorted by node.
    joins: Box<[(u32, u32, u32, u32)]>,
    /// The quota of each leaf, every join's leaves in a row.
    quota: Box<[u32]>,
}

impl WideJoins {
    /// The plan's wide joins (built once per plan, by its first run).
    pub(crate) fn of<S>(plan: &Plan<S>) -> &WideJoins {
        plan.wide_joins.get_or_init(|| Self::build(plan))
    }

    fn build<S>(plan: &Plan<S>) -> WideJoins {
        let mut joins = Vec::new();
        let mut first = 0u32;
        for (i, spec) in plan.nodes.iter().enumerate() {
            if spec.indegree >= WIDE_JOIN {
                let leaves = spec.indegree.div_ceil(LEAF_SPAN);
                joins.push((i as u32, first, leaves, 0));
                first += leaves;
            }
        }
        if joins.is_empty() {
            return WideJoins::default();
        }
        let mut quota = vec![0u32; first as usize];
        for p in 0..plan.nodes.len() as u32 {
            for &s in plan.successors(p) {
                if plan.nodes[s as usize].indegree >= WIDE_JOIN {
                    let k = joins.partition_point(|j| j.0 < s);
                    let (_, first, leaves, _) = joins[k];
                    quota[(first + leaf_of(p, leaves)) as usize] += 1;
                }
            }
        }
        for j in joins.iter_mut() {
            j.3 = quota[j.1 as usize..(j.1 + j.2) as usize]
                .iter()
                .filter(|&&q| q > 0)
                .count() as u32;
        }
        WideJoins {
            joins: joins.into(),
            quota: quota.into(),
        }
    }

    /// Leaf slots a run needs.
    fn leaves(&self) -> usize {
        self.quota.len()
    }

    #[inline]
    fn join(&self, node: u32) -> (u32, u32, u32, u32) {
        let k = self.joins.partition_point(|j| j.0 < node);
        self.joins[k]
    }

    /// What `node`'s counter counts up to: its in-degree, or its non-empty leaves when wide.
    fn target(&self, node: u32, indegree: u32) -> u32 {
        if indegree >= WIDE_JOIN {
            self.join(node).3
        } else {
            indegree
        }
    }
}

/// The dependency counters of one run: `pending` (one a node) and the wide joins' `leaves`.
/// A counter whose target is `t` starts at `epoch × t` (wrapping) and counts up to `(epoch +
/// 1) × t`.
pub(crate) struct Counters {
    pending: Box<[AtomicU32]>,
    leaves: Box<[AtomicU32]>,
    epoch: u32,
}

/// How many counter sets a plan keeps for its next runs (more runs of one graph at once
/// allocate their own).
const CACHED_COUNTERS: usize = 2;

/// A plan's dependency counters left by its runs that succeeded, for its next runs (see
/// `Run::epoch`). A run that succeeded counted every arrival at every join, so each counter
/// stands at its target above where it started: the next run counts on from there instead of
/// allocating `4 × nodes` bytes that the allocator zeroes on the submitting thread before the
/// first node runs (a million-cell wavefront's 4 MB: 0.15 ms here, and its whole run takes
/// 2-3 ms on 16 workers), and its workers find the counters where the last run left them
/// rather than in the submitting core's cache. The cost is the set kept while the graph
/// lives.
pub(crate) struct CounterCache(Mutex<Vec<Counters>>);

impl CounterCache {
    pub(crate) fn new() -> Self {
        CounterCache(Mutex::new(Vec::new()))
    }
}

pub(crate) struct Run<S> {
    pub(crate) id: u64,
    pub(crate) plan: std::sync::Arc<Plan<S>>,
    /// Finished predecessors of each node with more than one, counting up from `epoch ×`
    /// its target (zeroed memory for a plan's first run; empty when the graph has no such
    /// node: one-predecessor nodes need no counter).
    pending: Box<[AtomicU32]>,
    /// The leaf counters of the wide joins ([`WideJoins`]), `LEAF_STRIDE` apart, counting as
    /// `pending` does (empty when the graph has none).
    leaves: Box<[AtomicU32]>,
    /// Runs of this plan that counted in these counters before (see [`CounterCache`]).
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
    pub(crate) completion: std::sync::Arc<Completion>,
    pub(crate) submitted: Instant,
}

impl<S> Run<S> {
    pub(crate) fn new(id: u64, plan: std::sync::Arc<Plan<S>>) -> Self {
        let n = plan.nodes.len();
        let cached = if plan.joins {
            sync::lock(&plan.counters.0).pop()
        } else {
            None
        };
        let Counters {
            pending,
            leaves,
            epoch,
        } = cached.unwrap_or_else(|| Counters {
            pending: sync::zeroed_counters(if plan.joins { n } else { 0 }),
            leaves: if plan.joins {
                sync::zeroed_counters(WideJoins::of(&plan).leaves() * LEAF_STRIDE)
            } else {
                sync::zeroed_counters(0)
            },
            epoch: 0,
        });
        let inflight = CachePadded::new(AtomicUsize::new(plan.sources.len()));
        Run {
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
            completion: std::sync::Arc::new(Completion::new()),
            submitted: Instant::now(),
        }
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

    /// Completes node `node`'s dependency bookkeeping: when `release` (it succeeded and the run
    /// has not failed) its successors' counters are decremented and each one that reaches zero is
    /// handed to `ready`. Returns how many were. The caller must then call [`RunRef::settle`]
    /// with that number *before* queueing any of them.
    #[inline]
    pub(crate) fn release(&self, node: u32, release: bool, ready: impl FnMut(Task<S>)) -> usize {
        self.release_batched(node, release, None, ready)
    }

    /// Counts `node`'s completion in its successor `s`; returns whether `s` is now ready.
    #[inline]
    pub(crate) fn release_one(&self, node: u32, s: u32) -> bool {
        let d = self.plan.nodes[s as usize].indegree;
        // One predecessor (the common case): ready, no shared counter at all; our output
        // reaches the successor through the queue hand-off. Otherwise count up: a count of
        // d - 1 seen by a predecessor that has not yet counted means it is the last one (each
        // counts once), so the node is ready without a read-modify-write. The Acquire load (or
        // the AcqRel increment) pairs with the other predecessors' Release increments, so their
        // outputs are visible to whoever runs the node. The store of d keeps "released"
        // readable for `take_result`.
        if d != 1 {
            // A wide join counts the leaf first; the leaf's last counts in the root, whose
            // target is the join's non-empty leaves.
            let target = if d >= WIDE_JOIN {
                match self.leaf_arrive(node, s) {
                    Some(roots) => roots,
                    None => return false,
                }
            } else {
                d
            };
            return self.count_in(s, target);
        }
        true
    }

    /// Where a counter with target `target` stands when this run has counted `k` arrivals in
    /// it (see [`CounterCache`]).
    #[inline(always)]
    fn mark(&self, target: u32, k: u32) -> u32 {
        self.epoch.wrapping_mul(target).wrapping_add(k)
    }

    /// Counts one arrival in node `s`'s own counter, whose target is `target`; returns whether
    /// `s` is now ready.
    #[inline]
    fn count_in(&self, s: u32, target: u32) -> bool {
        let pending = &self.pending[s as usize];
        let last = self.mark(target, target - 1);
        if pending.load(Ordering::Acquire) == last {
            pending.store(last.wrapping_add(1), Ordering::Relaxed);
            true
        } else {
            pending.fetch_add(1, Ordering::AcqRel) == last
        }
    }

    /// A predecessor's arrival at `s`, of release class `class` ([`CLASS_ONE`] or
    /// [`CLASS_TWO`]): whether `s` is now ready, decided without its record (see
    /// `Plan::classes`). Counted as in [`release_one`](Self::release_one).
    #[inline(always)]
    pub(crate) fn arrive_by_class(&self, s: u32, class: u8) -> bool {
        // Its runner reads the record soon, here or elsewhere: ask for it now, without waiting
        // for it.
        sync::prefetch(self.plan.nodes.as_ptr().wrapping_add(s as usize));
        class == CLASS_ONE || self.count_in(s, 2)
    }

    /// [`release`](Self::release), for a worker that may batch its arrivals at wide joins
    /// (`batcher`, when it batches for this run): a wide join's leaf arrival joins the batch
    /// when it is for the same leaf, and
    /// otherwise replaces it, the old batch being counted in its leaf
    /// ([`flush_leaf`](Self::flush_leaf)), which may make the old batch's join ready (handed to
    /// `ready` like a successor, and counted in the result). The caller flushes what is left in
    /// `batch` before it gives away the unit that keeps the run alive.
    #[inline]
    pub(crate) fn release_batched(
        &self,
        node: u32,
        release: bool,
        batcher: Option<&LeafBatcher<S>>,
        mut ready: impl FnMut(Task<S>),
    ) -> usize {
        let mut n = 0;
        if !release || self.is_failed() {
            self.mark_unreleased(node);
        } else {
            for &s in self.plan.successors(node) {
                let class = self.plan.class(s);
                let r = match batcher {
                    // Decided from the class byte, without the successor's record (see
                    // `Plan::classes`).
                    _ if class != CLASS_RECORD => self.arrive_by_class(s, class).then_some(s),
                    Some(b)
                        if self.plan.nodes[s as usize].indegree >= WIDE_JOIN
                            && b.run.get().is_some_and(|r| r.same(RunRef::new(self))) =>
                    {
                        self.batch_arrive(node, s, &b.batch)
                    }
                    _ => self.release_one(node, s).then_some(s),
                };
                if let Some(r) = r {
                    ready(Task::new(RunRef::new(self), r));
                    n += 1;
                }
            }
        }
        n
    }

    /// Node `node`'s arrival at wide join `s` counted in `batcher`'s batch, when the batcher
    /// batches for this run, as [`release_batched`](Self::release_batched) counts it: `None`
    /// when it does not (or `s` is not a wide join, or the run failed), else the join that an
    /// older batch's flush made ready, if any.
    #[inline]
    pub(crate) fn arrive_batched(
        &self,
        node: u32,
        s: u32,
        batcher: &LeafBatcher<S>,
    ) -> Option<Option<u32>> {
        if self.plan.nodes[s as usize].indegree < WIDE_JOIN
            || !batcher.run.get().is_some_and(|r| r.same(RunRef::new(self)))
            || self.is_failed()
        {
            return None;
        }
        Some(self.batch_arrive(node, s, &batcher.batch))
    }

    /// Predecessor `p`'s arrival at wide join `s`, batched (see `release_batched`). Returns a
    /// join that the flush of an older batch made ready.
    #[inline(never)]
    fn batch_arrive(&self, p: u32, s: u32, batch: &Cell<Option<LeafBatch>>) -> Option<u32> {
        let wide = WideJoins::of(&self.plan);
        let (_, first, leaves, _) = wide.join(s);
        let leaf = first + leaf_of(p, leaves);
        match batch.get() {
            Some(b) if b.leaf == leaf => {
                batch.set(Some(LeafBatch {
                    count: b.count + 1,
                    ..b
                }));
                None
            }
            old => {
                batch.set(Some(LeafBatch {
                    join: s,
                    leaf,
                    count: 1,
                }));
                old.and_then(|b| self.flush_leaf(b).then_some(b.join))
            }
        }
    }

    /// Counts a batch of arrivals in its leaf (one read-modify-write for all of them); returns
    /// whether that made its join ready. Orderings as for one arrival (`leaf_arrive`): the
    /// batch's predecessors ran on this thread before the Release half of the increment.
    pub(crate) fn flush_leaf(&self, b: LeafBatch) -> bool {
        let wide = WideJoins::of(&self.plan);
        let quota = wide.quota[b.leaf as usize];
        let counter = &self.leaves[b.leaf as usize * LEAF_STRIDE];
        let before = self.mark(quota, quota - b.count);
        // The leaf's last arrivals leave it at its target, as `count_in` does, so that the
        // next run of the plan counts on from there.
        let last = if counter.load(Ordering::Acquire) == before {
            counter.store(self.mark(quota, quota), Ordering::Relaxed);
            true
        } else {
            counter.fetch_add(b.count, Ordering::AcqRel) == before
        };
        last && self.count_in(b.join, wide.join(b.join).3)
    }

    /// Counts predecessor `p`'s completion in its leaf of wide join `s`. Returns the join's root
    /// target when `p` completed the leaf (it then counts in the root), else `None`. Orderings
    /// as for the root: the leaf's last predecessor acquires the others' Release increments and
    /// passes them on with its own increment of the root.
    #[inline(never)]
    fn leaf_arrive(&self, p: u32, s: u32) -> Option<u32> {
        let wide = WideJoins::of(&self.plan);
        let (_, first, leaves, roots) = wide.join(s);
        let leaf = (first + leaf_of(p, leaves)) as usize;
        let quota = wide.quota[leaf];
        let counter = &self.leaves[leaf * LEAF_STRIDE];
        let before = self.mark(quota, quota - 1);
        let last = if counter.load(Ordering::Acquire) == before {
            // Left at its target for the next run, as in `count_in`.
            counter.store(self.mark(quota, quota), Ordering::Relaxed);
            true
        } else {
            counter.fetch_add(1, Ordering::AcqRel) == before
        };
        last.then_some(roots)
    }

    /// Marks `node`'s one-predecessor successors as never released. Their counters are not
    /// otherwise touched (see `release`), so without the mark `take_result` could not tell them
    /// from released ones. Only on the failure path.
    #[cold]
    fn mark_unreleased(&self, node: u32) {
        self.mark_unreleased_of(self.plan.successors(node));
    }

    /// Marks the one-predecessor nodes of `succ` (successors of one node) as never released;
    /// a span that finds its run failed marks the part it did not release.
    #[cold]
    pub(crate) fn mark_unreleased_of(&self, succ: &[u32]) {
        let nodes = &self.plan.nodes;
        let mut list = sync::lock(&self.unreleased);
        list.extend(succ.iter().filter(|&&s| nodes[s as usize].indegree == 1));
    }

    /// Nodes that were never released: a counter below the in-degree for several predecessors;
    /// for one predecessor, a mark or a predecessor that was itself never released.
    fn count_unreleased(&self) -> usize {
        let n = self.plan.nodes.len();
        // 0 unknown, 1 released, 2 not released.
        let mut state = vec![0u8; n];
        for &u in sync::lock(&self.unreleased).iter() {
            state[u as usize] = 2;
        }
        let mut path = Vec::new();
        let mut count = 0;
        for v in 0..n {
            // Walk up the one-predecessor chain until a node whose state is known.
            let mut u = v;
            let known = loop {
                if state[u] != 0 {
                    break state[u];
                }
                let s = match self.plan.nodes[u].indegree {
                    0 => 1,
                    1 => {
                        path.push(u);
                        u = self.plan.predecessors(u as u32)[0] as usize;
                        continue;
                    }
                    d if {
                        let t = WideJoins::of(&self.plan).target(u as u32, d);
                        self.pending[u].load(Ordering::Relaxed) == self.mark(t, t)
                    } =>
                    {
                        1
                    }
                    _ => 2,
                };
                state[u] = s;
                break s;
            };
            for w in path.drain(..) {
                state[w] = known;
            }
            if state[v] == 2 {
                count += 1;
            }
        }
        count
    }

    pub(crate) fn note_skipped(&self) {
        self.skipped.fetch_add(1, Ordering::Relaxed);
    }

    /// Builds the run's result. Called once, by the thread that brought `inflight` to zero.
    pub(crate) fn take_result(&self) -> Result<GraphOutput, Error> {
        if self.failed.load(Ordering::Acquire) {
            // Nodes never released (counter below the in-degree) plus released-but-skipped ones.
            let cancelled = self.count_unreleased() + self.skipped.load(Ordering::Relaxed);
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
        let mut values = Vec::with_capacity(self.plan.valued.len());
        for &i in self.plan.valued.iter() {
            // SAFETY: in-flight reached zero, so no other thread touches this run's slots.
            let out = self.slots.get(i).and_then(|s| unsafe { s.take() });
            if let Some(v) = out.and_then(|o| o.value) {
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
        let mut cache = sync::lock(&self.plan.counters.0);
        if cache.len() < CACHED_COUNTERS {
            cache.push(Counters {
                pending: std::mem::take(&mut self.pending),
                leaves: std::mem::take(&mut self.leaves),
                epoch: self.epoch.wrapping_add(1),
            });
        }
    }
}

/// Node outputs of a finished graph.
pub struct GraphOutput {
    graph: u32,
    name: std::sync::Arc<str>,
    /// (node index, value), sorted by index.
    values: Vec<(u32, AnyValue)>,
}

impl fmt::Debug for GraphOutput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GraphOutput")
            .field("graph", &self.name)
            .field("values", &self.values.len())
            .finish()
    }
}

impl GraphOutput {
    fn position(&self, id: NodeId) -> Option<usize> {
        if id.graph != self.graph {
            return None;
        }
        self.values
            .binary_search_by_key(&id.index, |(i, _)| *i)
            .ok()
    }

    /// The output of node `r`, if `r` is a node of this graph whose output was not taken. A
    /// node returning `()` stores nothing (no slot, no allocation): its output is `Some(&())`
    /// for any node of this graph.
    pub fn get<T: 'static>(&self, r: NodeRef<T>) -> Option<&T> {
        if crate::body::is_unit::<T>() {
            return (r.id.graph == self.graph)
                .then(|| (&() as &dyn std::any::Any).downcast_ref::<T>())?;
        }
        let p = self.position(r.id)?;
        (*self.values[p].1).downcast_ref::<T>()
    }

    /// Moves the output of node `r` out (`Some(())` for any node of this graph returning `()`,
    /// every time: see [`get`](Self::get)).
    pub fn take<T: 'static>(&mut self, r: NodeRef<T>) -> Option<T> {
        if crate::body::is_unit::<T>() {
            let unit: Box<dyn std::any::Any> = Box::new(());
            return (r.id.graph == self.graph).then(|| unit.downcast::<T>().ok().map(|b| *b))?;
        }
        let p = self.position(r.id)?;
        if !(*self.values[p].1).is::<T>() {
            return None;
        }
        let (_, v) = self.values.remove(p);
        v.downcast::<T>().ok().map(|b| *b)
    }

    /// The graph's name.
    pub fn graph_name(&self) -> &str {
        &self.name
    }
}

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
    #[cfg_attr(not(loom), allow(dead_code))]
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
