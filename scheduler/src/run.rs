//! One execution of a graph: its dependency counters, output slots and completion.
//!
//! This file and `worker.rs` hold the scheduler's raw-pointer code: a queued `Task` points at
//! its `Run` without a reference count, so a node hand-off costs no shared refcount traffic.
//! The pointer stays valid because the registry keeps an `Arc<Run>` in its table of active
//! runs until the run's in-flight count reaches zero, and every task is counted in flight
//! from the moment it is created until its node has completed.
//!
//! Workers hold a run as a [`RunRef`] (the pointer), never as a `&Run` function argument, across
//! a point where they give their in-flight unit away (queueing the task that carries it, a
//! decrement that does not reach zero, a hand-off to the CPU lane): from there another thread may
//! finish and free the run while the frame is still live, and a reference argument must stay
//! valid for its whole call (Stacked/Tree Borrows protectors), used again or not. A `&Run` made
//! by dereferencing a `RunRef` inside a body is not an argument and carries no such promise.

use std::cell::UnsafeCell;
use std::fmt;
use std::ptr::NonNull;
use std::task::Waker;
use std::time::Instant;

use crossbeam_utils::CachePadded;

use crate::error::{Error, ErrorKind};
use crate::graph::{AnyValue, Plan};
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

/// A ready node of a run, as it sits in a deque or injector. Move-only: it stands for one
/// in-flight unit of its run, so it is completed exactly once, by whoever holds it last.
pub(crate) struct Task<S> {
    run: RunRef<S>,
    pub(crate) node: u32,
}

// SAFETY: a task is a (run, node) pair; `Run<S>` is shared between workers by design (its mutable
// parts are atomics, locks or slots ordered as documented on `Slot`), and the pointer's validity
// is guaranteed by the in-flight protocol described at the top of this file.
unsafe impl<S> Send for Task<S> {}

impl<S> Task<S> {
    #[inline]
    pub(crate) fn new(run: RunRef<S>, node: u32) -> Self {
        Task { run, node }
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
        write!(f, "Task(node #{})", self.node)
    }
}

pub(crate) struct Run<S> {
    pub(crate) id: u64,
    pub(crate) plan: std::sync::Arc<Plan<S>>,
    /// Finished predecessors of each node with more than one, counting up from 0 (zeroed
    /// memory; empty when the graph has no such node: one-predecessor nodes need no counter).
    pub(crate) pending: Box<[AtomicU32]>,
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
        let pending = sync::zeroed_counters(if plan.joins { n } else { 0 });
        let inflight = CachePadded::new(AtomicUsize::new(plan.sources.len()));
        Run {
            id,
            plan,
            pending,
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
    pub(crate) fn release(
        &self,
        node: u32,
        release: bool,
        mut ready: impl FnMut(Task<S>),
    ) -> usize {
        let mut n = 0;
        if !release || self.is_failed() {
            self.mark_unreleased(node);
        } else {
            for &s in self.plan.successors(node) {
                let d = self.plan.nodes[s as usize].indegree;
                // One predecessor (the common case): ready, no shared counter at all; our
                // output reaches the successor through the queue hand-off. Otherwise count
                // up: a count of d - 1 seen by a predecessor that has not yet counted means it
                // is the last one (each counts once), so the node is ready without a
                // read-modify-write. The Acquire load (or the AcqRel increment) pairs with the
                // other predecessors' Release increments, so their outputs are visible to
                // whoever runs the node. The store of d keeps "released" readable for
                // `take_result`.
                if d != 1 {
                    let pending = &self.pending[s as usize];
                    if pending.load(Ordering::Acquire) == d - 1 {
                        pending.store(d, Ordering::Relaxed);
                    } else if pending.fetch_add(1, Ordering::AcqRel) != d - 1 {
                        continue;
                    }
                }
                ready(Task::new(RunRef::new(self), s));
                n += 1;
            }
        }
        n
    }

    /// Adds one task to the in-flight count. Call it before queueing a task that a node made
    /// ready, while the node's own unit still keeps the run alive.
    #[inline]
    pub(crate) fn enter(&self) {
        self.inflight.fetch_add(1, Ordering::AcqRel);
    }

    /// Marks `node`'s one-predecessor successors as never released. Their counters are not
    /// otherwise touched (see `release`), so without the mark `take_result` could not tell them
    /// from released ones. Only on the failure path.
    #[cold]
    fn mark_unreleased(&self, node: u32) {
        let nodes = &self.plan.nodes;
        let mut list = sync::lock(&self.unreleased);
        list.extend(
            self.plan
                .successors(node)
                .iter()
                .filter(|&&s| nodes[s as usize].indegree == 1),
        );
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
                    d if self.pending[u].load(Ordering::Relaxed) == d => 1,
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

    /// The output of node `r`, if `r` is a node of this graph whose output was not taken.
    pub fn get<T: 'static>(&self, r: NodeRef<T>) -> Option<&T> {
        let p = self.position(r.id)?;
        (*self.values[p].1).downcast_ref::<T>()
    }

    /// Moves the output of node `r` out.
    pub fn take<T: 'static>(&mut self, r: NodeRef<T>) -> Option<T> {
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
