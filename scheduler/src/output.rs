//! A run's outputs: each node's slot while the run goes on (written once by the node's worker,
//! read by its successors and by the finisher), and the [`GraphOutput`] the submitter gets.
//! It knows no `Run`: a run owns its [`Slots`], and a body reaches them through its context.

use std::any::Any;
use std::cell::UnsafeCell;
use std::fmt;
use std::sync::Arc;

use crate::ids::{is_unit, NodeId, NodeRef};
use crate::sync::{AtomicPtr, AtomicU8, Ordering};

/// A node's output, type-erased.
pub(crate) type AnyValue = Box<dyn Any + Send + Sync>;

/// What a finished node leaves for its successors and the submitter.
pub(crate) struct NodeOutput {
    /// The node's value: lent to successors as `&T`, or taken by the node's only successor
    /// (`Inputs::take`); what is left goes to the submitter. A cell of its own, so that taking
    /// it needs no `&mut` to the marker beside it, which a successor may be holding.
    value: UnsafeCell<Option<AnyValue>>,
    pub(crate) marker: Option<AnyValue>,
    /// What the successors did with the value: [`UNREAD`], [`LENT`] or [`TAKEN`].
    used: AtomicU8,
}

/// No successor read or took the value yet.
const UNREAD: u8 = 0;
/// A successor read the value as `&T` (`Inputs::input`), which may live for the rest of its
/// body: the value can no longer be taken.
const LENT: u8 = 1;
/// The node's only successor took the value.
const TAKEN: u8 = 2;

/// Why a value could not be taken ([`NodeOutput::take_value`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TakeError {
    /// The taker read it with `input` before.
    Lent,
    /// The taker took it before.
    Taken,
    /// The node stored no value.
    Missing,
    /// The value is not a `T` (it stays where it was).
    OtherType,
}

impl NodeOutput {
    fn new(value: Option<AnyValue>, marker: Option<AnyValue>) -> Self {
        NodeOutput {
            value: UnsafeCell::new(value),
            marker,
            used: AtomicU8::new(UNREAD),
        }
    }

    /// Whether the node's only successor took the value.
    pub(crate) fn is_taken(&self) -> bool {
        self.used.load(Ordering::Relaxed) == TAKEN
    }

    /// Lends the value to a successor as `&`, for as long as this output lives; from then on
    /// it cannot be taken. `None` when there is none, or it was taken.
    ///
    /// # Safety
    /// The caller is a successor of the node, ordered after the node's completion (as for
    /// [`Slot::get`]), and no other thread takes the value meanwhile: only the node's only
    /// successor may take it (`Inputs::take` checks it), and then the caller is that one.
    #[inline]
    pub(crate) unsafe fn lend(&self) -> Option<&(dyn Any + Send + Sync)> {
        // Relaxed: the marks are read back by the same thread (the only successor, which may
        // take), or stored by several readers (of a node no one may take from) alike.
        match self.used.load(Ordering::Relaxed) {
            TAKEN => return None,
            UNREAD => self.used.store(LENT, Ordering::Relaxed),
            _ => {}
        }
        // SAFETY: the value was written before the node's completion, which happened-before
        // this read (caller's contract); it is taken only by this thread (caller's contract),
        // which now finds it lent and will not.
        unsafe { (*self.value.get()).as_deref() }
    }

    /// Moves the value out, if it is a `T` that no successor was lent.
    ///
    /// # Safety
    /// The caller is the node's only successor, ordered after the node's completion: no other
    /// thread reads or writes this output until the caller's node completes (successors are
    /// the only readers while the run goes on; the finisher reads after every node completed).
    pub(crate) unsafe fn take_value<T: 'static>(&self) -> Result<T, TakeError> {
        match self.used.load(Ordering::Relaxed) {
            LENT => return Err(TakeError::Lent),
            TAKEN => return Err(TakeError::Taken),
            _ => {}
        }
        // SAFETY: the caller is the only thread using this output now (contract), and no `&`
        // to the value was lent (`used` is not `LENT`), so this `&mut` is unique.
        let value = unsafe { &mut *self.value.get() };
        match value {
            None => Err(TakeError::Missing),
            Some(v) if !(**v).is::<T>() => Err(TakeError::OtherType),
            Some(_) => {
                self.used.store(TAKEN, Ordering::Relaxed);
                let v = value.take().expect("checked above");
                Ok(*v.downcast::<T>().expect("checked above"))
            }
        }
    }

    /// The value left for the submitter.
    pub(crate) fn into_value(self) -> Option<AnyValue> {
        self.value.into_inner()
    }
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
            Some(out) => *out.value.get_mut() = Some(value),
            None => *slot = Some(Box::new(NodeOutput::new(Some(value), None))),
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
            None => *slot = Some(Box::new(NodeOutput::new(None, Some(marker)))),
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
    pub(crate) unsafe fn take(&self) -> Option<NodeOutput> {
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
    pub(crate) fn new(len: usize) -> Self {
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
    /// one wins, the others free theirs). `None`: they could not be allocated.
    #[inline]
    pub(crate) fn get_or_alloc(&self, i: u32) -> Option<&Slot> {
        assert!((i as usize) < self.len, "slot index out of range");
        let mut p = self.ptr.load(Ordering::Acquire);
        if p.is_null() {
            p = self.alloc()?;
        }
        // SAFETY: as in `get`.
        Some(unsafe { &*p.add(i as usize) })
    }

    /// Allocates the slots, or finds those another writer allocated first.
    #[cold]
    fn alloc(&self) -> Option<*mut Slot> {
        let layout = Self::layout(self.len);
        // SAFETY: `layout` has a non-zero size (`len > 0`: the caller's node exists).
        let fresh = unsafe { std::alloc::alloc_zeroed(layout) } as *mut Slot;
        if fresh.is_null() {
            return None;
        }
        // All-zero bits are `None` in every slot (the null niche of `Box`).
        match self.ptr.compare_exchange(
            std::ptr::null_mut(),
            fresh,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => Some(fresh),
            Err(won) => {
                // SAFETY: `fresh` came from `alloc_zeroed(layout)` and was never shared.
                unsafe { std::alloc::dealloc(fresh as *mut u8, layout) };
                Some(won)
            }
        }
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

/// Node outputs of a finished graph.
pub struct GraphOutput {
    pub(crate) graph: u32,
    pub(crate) name: Arc<str>,
    /// (node index, value), sorted by index.
    pub(crate) values: Vec<(u32, AnyValue)>,
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

    /// The output of node `r`, if `r` is a node of this graph whose output was not taken (by
    /// [`take`](Self::take), or during the run by its only successor, with
    /// [`Inputs::take`](crate::ctx::Inputs::take)). A node returning `()` stores nothing (no slot, no
    /// allocation): its output is `Some(&())` for any node of this graph.
    pub fn get<T: 'static>(&self, r: NodeRef<T>) -> Option<&T> {
        if is_unit::<T>() {
            return (r.id.graph == self.graph)
                .then(|| (&() as &dyn std::any::Any).downcast_ref::<T>())?;
        }
        let p = self.position(r.id)?;
        (*self.values[p].1).downcast_ref::<T>()
    }

    /// Moves the output of node `r` out (`Some(())` for any node of this graph returning `()`,
    /// every time: see [`get`](Self::get)).
    pub fn take<T: 'static>(&mut self, r: NodeRef<T>) -> Option<T> {
        if is_unit::<T>() {
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
