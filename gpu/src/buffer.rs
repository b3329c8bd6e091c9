//! Device memory owned by a value that may be dropped on any thread: a cudarc `CudaSlice` whose
//! drop is routed to a bound worker of its device.

use std::cell::Cell;
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use cudarc::driver::{CudaSlice, DevicePtr, DeviceRepr};

use crate::device::{DeviceShared, Release};

thread_local! {
    /// Set on a worker while it captures (a buffer dropped then is a free the capture cannot
    /// hold: the graph would replay on freed memory).
    static CAPTURING: Cell<bool> = const { Cell::new(false) };
    static FREED: Cell<bool> = const { Cell::new(false) };
}

/// Called by `DeviceBuffer::drop`: notes a free made during a capture on this thread.
#[inline]
fn note_free() {
    if CAPTURING.with(Cell::get) {
        FREED.with(|f| f.set(true));
    }
}

/// A replay capture begins (`true`) or ends on this thread: while one is on, a buffer dropped
/// here is noted (and the note cleared as it begins).
pub(crate) fn watch_frees(on: bool) {
    CAPTURING.with(|c| c.set(on));
    if on {
        FREED.with(|f| f.set(false));
    }
}

/// Whether a buffer was dropped on this thread during the capture since the last call.
pub(crate) fn take_freed() -> bool {
    FREED.with(|f| f.replace(false))
}

/// Plain data that may be copied to and from the device bit for bit: cudarc's
/// [`DeviceRepr`] types (the primitives, `half::f16`, `half::bf16`, arrays of them, and any
/// `#[repr(C)]` type a user implements `DeviceRepr` for) that are `Copy`, `Send` and `Sync`.
pub trait DeviceCopy: DeviceRepr + Copy + Send + Sync + 'static {}

impl<T: DeviceRepr + Copy + Send + Sync + 'static> DeviceCopy for T {}

/// `len` elements of `T` in one device's memory: a cudarc [`CudaSlice<T>`] that may be dropped
/// on any thread.
///
/// It dereferences to its `CudaSlice`, so cudarc code takes it as it is (`&*buf` or
/// `buf.as_cuda_slice()` as a `launch_builder` argument, a `CudaBlas` GEMM operand, a copy's
/// source). It can be a node's output (successors receive it by reference; the submitter can
/// take it from the graph's output), and it may be dropped on any thread: the drop makes no
/// driver call; it queues the slice on its device's release queue and wakes a worker of the
/// device, which frees it after the work already enqueued on the device's streams (see the
/// crate docs). A plain `CudaSlice` follows cudarc's rule instead (freed, with a driver call,
/// on the thread that drops it): wrap one that leaves its node with
/// [`GpuCtx::adopt`](crate::GpuCtx::adopt), and take one out with
/// [`DeviceBuffer::into_cuda_slice`]; neither copies.
///
/// Held past its pool's shutdown, a buffer keeps its memory, the stream it was allocated on and
/// its device's context alive (cudarc's reference counts); dropping it then frees it on the
/// dropping thread, since no bound worker is left.
pub struct DeviceBuffer<T: DeviceCopy> {
    /// Taken out only by `into_cuda_slice` and `drop`.
    slice: Option<CudaSlice<T>>,
    ptr: u64,
    pub(crate) device: Arc<DeviceShared>,
}

impl<T: DeviceCopy> DeviceBuffer<T> {
    /// A buffer over `slice`, an allocation of `device`'s context, counted as live.
    pub(crate) fn from_slice(slice: CudaSlice<T>, device: Arc<DeviceShared>) -> Self {
        // With the pool's context (event tracking off) this records nothing.
        let ptr = {
            let (p, _sync) = slice.device_ptr(slice.stream());
            p
        };
        device.buffer_made(slice.num_bytes());
        Self {
            slice: Some(slice),
            ptr,
            device,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.as_cuda_slice().len()
    }

    /// Whether the buffer has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Size in bytes.
    pub fn bytes(&self) -> usize {
        self.as_cuda_slice().num_bytes()
    }

    /// The CUDA ordinal of the device that holds it.
    pub fn device_ordinal(&self) -> i32 {
        self.device.ordinal()
    }

    /// The raw device address (for kernel arguments built by hand and library calls by
    /// address).
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }

    /// The cudarc slice, to pass to cudarc code (kernel arguments, `CudaBlas`, copies).
    pub fn as_cuda_slice(&self) -> &CudaSlice<T> {
        self.slice.as_ref().expect("present until dropped")
    }

    /// The cudarc slice, mutably (an output of cudarc code).
    pub fn as_cuda_slice_mut(&mut self) -> &mut CudaSlice<T> {
        self.slice.as_mut().expect("present until dropped")
    }

    /// Hands the memory to cudarc's ownership without a copy: the returned `CudaSlice` frees it
    /// (stream-ordered, on the stream it was allocated on) on whichever thread drops it, as
    /// cudarc does. Drop it on a worker of the device (inside a node) to keep every driver call
    /// on a bound worker, or wrap it again with [`GpuCtx::adopt`](crate::GpuCtx::adopt).
    pub fn into_cuda_slice(mut self) -> CudaSlice<T> {
        let s = self.slice.take().expect("present until dropped");
        self.device.buffer_freed(s.num_bytes());
        s
    }
}

impl<T: DeviceCopy> Deref for DeviceBuffer<T> {
    type Target = CudaSlice<T>;

    fn deref(&self) -> &CudaSlice<T> {
        self.as_cuda_slice()
    }
}

impl<T: DeviceCopy> DerefMut for DeviceBuffer<T> {
    fn deref_mut(&mut self) -> &mut CudaSlice<T> {
        self.as_cuda_slice_mut()
    }
}

impl<T: DeviceCopy> fmt::Debug for DeviceBuffer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("type", &std::any::type_name::<T>())
            .field("len", &self.slice.as_ref().map_or(0, |s| s.len()))
            .field("device", &self.device.ordinal())
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .finish()
    }
}

impl<T: DeviceCopy> Drop for DeviceBuffer<T> {
    fn drop(&mut self) {
        if let Some(s) = self.slice.take() {
            // No driver call here: a bound worker of the device frees it. (A drop during a
            // replay capture fails the capture: the graph would replay on freed memory.)
            note_free();
            self.device.release(Release::Slice(Box::new(s)));
        }
    }
}
