//! Node bodies, type-erased behind one pointer.
//!
//! A node record holds its body as a [`ThinBody`]: a single pointer to a block that starts with
//! the body's vtable, followed by the body itself. A `Box<dyn NodeBody<S>>` would take two words
//! of the 24-byte record (a third of it); running a large chain of nodes is mostly reading these
//! records, so the saved word is time saved per node. A zero-sized body (a closure that
//! captures nothing) allocates nothing: its pointer is to a static holding only the vtable.
//!
//! This file holds the crate's only type-erased body code. It knows the bodies it erases only
//! as [`NodeBody`]s: the graph side asks a body whether it is of a given type
//! ([`ThinBody::downcast_ref`], for its inlined subgraphs' bodies).

use std::any::TypeId;
use std::marker::PhantomData;
use std::mem::size_of;
use std::ptr::NonNull;

use crate::ctx::{Inputs, NodeCtx};
use crate::error::BoxError;
use crate::ids::is_unit;

/// What a node runs. Implementations store their own output, so the call returns two words in
/// registers instead of a value through memory.
pub(crate) trait NodeBody<S>: Send + Sync + 'static {
    /// Runs the body on a pool worker: a worker node, or a CPU-heavy node of a pool without a
    /// host-work lane.
    fn run(&self, ctx: &NodeCtx<'_, S>) -> Result<(), BoxError>;
    /// Runs a CPU-heavy node's body with its inputs only (on the host-work lane).
    fn run_inputs(&self, inputs: &Inputs<'_>) -> Result<(), BoxError>;
}

/// A worker node's closure returning `T`.
pub(crate) struct WorkerFn<F, T>(pub(crate) F, pub(crate) PhantomData<fn() -> T>);

impl<S, T, F> NodeBody<S> for WorkerFn<F, T>
where
    S: Send + 'static,
    T: Send + Sync + 'static,
    F: Fn(&NodeCtx<'_, S>) -> Result<T, BoxError> + Send + Sync + 'static,
{
    #[inline]
    fn run(&self, ctx: &NodeCtx<'_, S>) -> Result<(), BoxError> {
        let v = (self.0)(ctx)?;
        if !is_unit::<T>() {
            // SAFETY: a body runs only as its node, on the thread that runs the node.
            unsafe { ctx.inputs.store_output(Box::new(v)) }?;
        }
        Ok(())
    }

    fn run_inputs(&self, _inputs: &Inputs<'_>) -> Result<(), BoxError> {
        unreachable!("a worker node is never sent to the host-work lane")
    }
}

/// A CPU-heavy node's closure returning `T`: it sees its inputs, no worker state.
pub(crate) struct CpuFn<F, T>(pub(crate) F, pub(crate) PhantomData<fn() -> T>);

impl<S, T, F> NodeBody<S> for CpuFn<F, T>
where
    S: Send + 'static,
    T: Send + Sync + 'static,
    F: Fn(&Inputs<'_>) -> Result<T, BoxError> + Send + Sync + 'static,
{
    fn run(&self, ctx: &NodeCtx<'_, S>) -> Result<(), BoxError> {
        <Self as NodeBody<S>>::run_inputs(self, &ctx.inputs)
    }

    fn run_inputs(&self, inputs: &Inputs<'_>) -> Result<(), BoxError> {
        let v = (self.0)(inputs)?;
        if !is_unit::<T>() {
            // SAFETY: a body runs only as its node, on the thread that runs the node.
            unsafe { inputs.store_output(Box::new(v)) }?;
        }
        Ok(())
    }
}

/// The operations of one body type `B`, reached through the block's first word.
struct VTable<S> {
    run: unsafe fn(Header<S>, &NodeCtx<'_, S>) -> Result<(), BoxError>,
    run_inputs: unsafe fn(Header<S>, &Inputs<'_>) -> Result<(), BoxError>,
    /// The body type's id, for [`ThinBody::downcast_ref`].
    type_id: fn() -> TypeId,
    drop: unsafe fn(Header<S>),
}

/// A pointer to a block's first word: a pointer to a static vtable.
type Header<S> = NonNull<*const VTable<S>>;

/// A heap block: the vtable pointer, then the body (`repr(C)`: the pointer comes first).
#[repr(C)]
struct Block<S, B> {
    vtable: *const VTable<S>,
    body: B,
}

/// The vtable of body type `B`, and the static first word of its zero-sized bodies.
struct Erased<S, B>(PhantomData<fn(S, B)>);

impl<S: 'static, B: NodeBody<S>> Erased<S, B> {
    const VTABLE: VTable<S> = VTable {
        run: Self::run,
        run_inputs: Self::run_inputs,
        type_id: TypeId::of::<B>,
        drop: Self::drop,
    };
    const VTABLE_PTR: *const VTable<S> = &Self::VTABLE;
    /// What a zero-sized body's pointer points to: a first word and no body.
    const ZST_HEADER: &'static *const VTable<S> = &Self::VTABLE_PTR;

    const IS_ZST: bool = size_of::<B>() == 0;

    /// The body behind `h`.
    ///
    /// # Safety
    /// `h` must come from [`ThinBody::new`] for body type `B`, and the `ThinBody` must be alive
    /// for the returned lifetime.
    #[inline(always)]
    unsafe fn body<'a>(h: Header<S>) -> &'a B {
        if Self::IS_ZST {
            // SAFETY: any aligned non-null pointer is a valid reference to a zero-sized value,
            // and `ThinBody::new` kept the value (forgot it instead of dropping it).
            unsafe { NonNull::<B>::dangling().as_ref() }
        } else {
            // SAFETY: per the contract, `h` points to a live `Block<S, B>`.
            unsafe { &(*h.cast::<Block<S, B>>().as_ptr()).body }
        }
    }

    /// # Safety
    /// As for [`body`](Self::body).
    unsafe fn run(h: Header<S>, ctx: &NodeCtx<'_, S>) -> Result<(), BoxError> {
        // SAFETY: forwarded contract.
        unsafe { Self::body(h) }.run(ctx)
    }

    /// # Safety
    /// As for [`body`](Self::body).
    unsafe fn run_inputs(h: Header<S>, inputs: &Inputs<'_>) -> Result<(), BoxError> {
        // SAFETY: forwarded contract.
        unsafe { Self::body(h) }.run_inputs(inputs)
    }

    /// Drops the body and frees its block.
    ///
    /// # Safety
    /// As for [`body`](Self::body), and called once, by the owning `ThinBody`'s drop.
    unsafe fn drop(h: Header<S>) {
        if Self::IS_ZST {
            // SAFETY: the zero-sized value `new` forgot is dropped here, once.
            unsafe { std::ptr::drop_in_place(NonNull::<B>::dangling().as_ptr()) }
        } else {
            // SAFETY: the block came from `Box::new(Block<S, B>)` in `ThinBody::new`.
            drop(unsafe { Box::from_raw(h.cast::<Block<S, B>>().as_ptr()) });
        }
    }
}

/// A node body behind one pointer: a thin `Box<dyn NodeBody<S>>`.
pub(crate) struct ThinBody<S> {
    header: Header<S>,
    /// Owns a body of some type implementing `NodeBody<S>`.
    _owns: PhantomData<fn(S) -> S>,
}

// SAFETY: the pointee is a `NodeBody<S>`, which is `Send + Sync`, or a static vtable pointer.
unsafe impl<S> Send for ThinBody<S> {}
// SAFETY: as above; every operation takes `&self` and the body is `Sync`.
unsafe impl<S> Sync for ThinBody<S> {}

impl<S: 'static> ThinBody<S> {
    pub(crate) fn new<B: NodeBody<S>>(body: B) -> Self {
        let header = if Erased::<S, B>::IS_ZST {
            std::mem::forget(body);
            NonNull::from(Erased::<S, B>::ZST_HEADER)
        } else {
            let block = Box::new(Block {
                vtable: Erased::<S, B>::VTABLE_PTR,
                body,
            });
            NonNull::from(Box::leak(block)).cast::<*const VTable<S>>()
        };
        ThinBody {
            header,
            _owns: PhantomData,
        }
    }
}

impl<S> ThinBody<S> {
    #[inline(always)]
    fn vtable(&self) -> &VTable<S> {
        // SAFETY: `header` points to a pointer to a static vtable (a block's first word or a
        // static of its own).
        unsafe { &**self.header.as_ptr() }
    }

    /// [`NodeBody::run`] of the body.
    #[inline(always)]
    pub(crate) fn run(&self, ctx: &NodeCtx<'_, S>) -> Result<(), BoxError> {
        // SAFETY: `header` came from `new` with the body type whose vtable it holds, and
        // `self` keeps the body alive for the call.
        unsafe { (self.vtable().run)(self.header, ctx) }
    }

    /// [`NodeBody::run_inputs`] of the body.
    pub(crate) fn run_inputs(&self, inputs: &Inputs<'_>) -> Result<(), BoxError> {
        // SAFETY: as in `run`.
        unsafe { (self.vtable().run_inputs)(self.header, inputs) }
    }

    /// The body, if it is a `B`.
    #[inline]
    pub(crate) fn downcast_ref<B: NodeBody<S>>(&self) -> Option<&B>
    where
        S: 'static,
    {
        if (self.vtable().type_id)() != TypeId::of::<B>() {
            return None;
        }
        // SAFETY: the vtable is `Erased::<S, B>`'s (its type id is `B`'s), so `header` came from
        // `new` with body type `B`; the body lives as long as `self`.
        Some(unsafe { Erased::<S, B>::body(self.header) })
    }
}

impl<S> Drop for ThinBody<S> {
    fn drop(&mut self) {
        // SAFETY: `header` came from `new`; this is the one drop of the body.
        unsafe { (self.vtable().drop)(self.header) }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    struct Counting(Arc<AtomicUsize>);
    impl NodeBody<()> for Counting {
        fn run(&self, _: &NodeCtx<'_, ()>) -> Result<(), BoxError> {
            Ok(())
        }
        fn run_inputs(&self, _: &Inputs<'_>) -> Result<(), BoxError> {
            Ok(())
        }
    }
    impl Drop for Counting {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// A zero-sized body with drop glue: dropped exactly once too.
    struct ZstDrop;
    static ZST_DROPS: AtomicUsize = AtomicUsize::new(0);
    impl NodeBody<()> for ZstDrop {
        fn run(&self, _: &NodeCtx<'_, ()>) -> Result<(), BoxError> {
            Ok(())
        }
        fn run_inputs(&self, _: &Inputs<'_>) -> Result<(), BoxError> {
            Ok(())
        }
    }
    impl Drop for ZstDrop {
        fn drop(&mut self) {
            ZST_DROPS.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn thin_bodies_are_one_word_and_drop_once() {
        assert_eq!(size_of::<ThinBody<()>>(), size_of::<usize>());
        let drops = Arc::new(AtomicUsize::new(0));
        let bodies: Vec<ThinBody<()>> = (0..3)
            .map(|_| ThinBody::new(Counting(drops.clone())))
            .collect();
        assert!(bodies[0].downcast_ref::<Counting>().is_some());
        assert!(bodies[0].downcast_ref::<ZstDrop>().is_none());
        drop(bodies);
        assert_eq!(drops.load(Ordering::SeqCst), 3);

        let z: Vec<ThinBody<()>> = (0..4).map(|_| ThinBody::new(ZstDrop)).collect();
        // Zero-sized bodies share the static header: nothing was allocated per body.
        assert_eq!(z[0].header, z[3].header);
        drop(z);
        assert_eq!(ZST_DROPS.load(Ordering::SeqCst), 4);
    }
}
