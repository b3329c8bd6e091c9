//! Device memory owned by a value that may be dropped on any thread: a cudarc `CudaSlice` whose
//! drop is routed to a bound worker of its device.

use std::cell::Cell;
use std::fmt;
use std::ops::{Deref, RangeBounds};
use std::sync::Arc;

use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::{
    CudaSlice, CudaStream, CudaViewMut, DevicePtr, DevicePtrMut, DeviceRepr, DeviceSlice,
    LaunchArgs, PushKernelArg, SyncOnDrop,
};

use crate::device::{DeviceShared, PeerReaders, Release};
use crate::driver::{self, StreamRef};

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
/// cudarc code takes it as it is: it is a [`DevicePtr`] and a [`DevicePtrMut`] (a `CudaBlas`
/// GEMM's operands and output, `memcpy_htod` / `memcpy_dtod` / `memset_zeros` on a stream, a
/// cuRAND fill) and a `launch_builder` argument (`&buf` read, `&mut buf` written); it
/// dereferences to its `CudaSlice` for reading (`buf.slice(..)`, `&*buf`), and lends it for
/// writing only as a view ([`as_view_mut`](Self::as_view_mut), [`slice_mut`](Self::slice_mut)),
/// never as `&mut CudaSlice`, so that the slice cannot be replaced or dropped behind the
/// buffer's back:
///
/// ```
/// # use std::sync::Arc;
/// # use boundpool_gpu::{cudarc::driver::{CudaStream, DriverError}, DeviceBuffer};
/// fn zero(buf: &mut DeviceBuffer<u32>, stream: &Arc<CudaStream>) -> Result<(), DriverError> {
///     stream.memset_zeros(buf) // cudarc writes through `DevicePtrMut`
/// }
/// ```
///
/// ```compile_fail,E0599
/// # use boundpool_gpu::{cudarc::driver::CudaSlice, DeviceBuffer};
/// fn swap_in(buf: &mut DeviceBuffer<u32>, other: CudaSlice<u32>) {
///     *buf.as_cuda_slice_mut() = other; // no `&mut CudaSlice` to assign through
/// }
/// ```
///
/// ```compile_fail,E0596
/// # use boundpool_gpu::{cudarc::driver::CudaSlice, DeviceBuffer};
/// fn replace(buf: &mut DeviceBuffer<u32>, other: CudaSlice<u32>) -> CudaSlice<u32> {
///     std::mem::replace(&mut **buf, other) // `DeviceBuffer` is not `DerefMut`
/// }
/// ```
///
/// (Replacing a whole `DeviceBuffer`, `*buf = other_buffer`, is fine: the old one is dropped,
/// through the release queue.)
///
/// It can be a node's output (successors receive it by reference; the submitter can take it
/// from the graph's output), and it may be dropped on any thread: the drop makes no driver
/// call; it queues the slice on its device's release queue and wakes a worker of the device,
/// which frees it after the work already enqueued on the device's streams (see the crate
/// docs). A plain `CudaSlice` follows cudarc's rule instead (freed, with a driver call, on the
/// thread that drops it): wrap one that leaves its node with
/// [`GpuCtx::adopt`](crate::GpuCtx::adopt), and take one out with
/// [`DeviceBuffer::into_cuda_slice`]; neither copies.
///
/// Held past its pool's shutdown, a buffer keeps its memory, the stream it was allocated on and
/// its device's context alive (cudarc's reference counts); dropping it then frees it on the
/// dropping thread, since no bound worker is left.
pub struct DeviceBuffer<T: DeviceCopy> {
    /// Taken out only by `into_cuda_slice` and `drop`: never replaced, since no `&mut` to it
    /// leaves this type (writers get a `CudaViewMut` or go through `DevicePtrMut`, which
    /// borrow the slice but cannot swap it).
    slice: Option<CudaSlice<T>>,
    /// The slice's address, read once: valid as long as the slice is this one, which the
    /// field above guarantees (and saves the launch path cudarc's per-call lookup).
    ptr: u64,
    pub(crate) device: Arc<DeviceShared>,
    /// Nodes of other devices (or pools) that read it: its free waits for them (made at the
    /// first such read; shared with the reading node until its fence is in).
    pub(crate) readers: std::sync::OnceLock<Arc<PeerReaders>>,
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
            readers: std::sync::OnceLock::new(),
        }
    }

    fn slice(&self) -> &CudaSlice<T> {
        self.slice.as_ref().expect("present until dropped")
    }

    fn slice_mut_ref(&mut self) -> &mut CudaSlice<T> {
        self.slice.as_mut().expect("present until dropped")
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.slice().len()
    }

    /// Whether the buffer has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Size in bytes.
    pub fn bytes(&self) -> usize {
        self.slice().num_bytes()
    }

    /// The CUDA ordinal of the device that holds it.
    pub fn device_ordinal(&self) -> i32 {
        self.device.ordinal()
    }

    /// How many reads by nodes of other devices (or pools) its release would wait for: their
    /// fences not yet known complete ([`GpuCtx::on_device`](crate::GpuCtx::on_device)).
    pub fn peer_reads_pending(&self) -> usize {
        self.readers.get().map_or(0, |r| r.len())
    }

    /// The raw device address (for kernel arguments built by hand and library calls by
    /// address). cudarc's [`DevicePtr::device_ptr`] gives the same address.
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }

    /// The cudarc slice, to pass to cudarc code that wants a `&CudaSlice` (kernel arguments,
    /// copies' sources; most cudarc calls take the buffer itself, a [`DevicePtr`]).
    pub fn as_cuda_slice(&self) -> &CudaSlice<T> {
        self.slice()
    }

    /// The whole buffer as cudarc's mutable view (an output of cudarc code that wants a
    /// `CudaViewMut`): it borrows the buffer, and cannot replace its memory.
    pub fn as_view_mut(&mut self) -> CudaViewMut<'_, T> {
        self.slice_mut_ref().as_view_mut()
    }

    /// Elements `bounds` as cudarc's mutable view (panics, as cudarc's `slice_mut`, when out
    /// of range).
    pub fn slice_mut(&mut self, bounds: impl RangeBounds<usize>) -> CudaViewMut<'_, T> {
        self.slice_mut_ref().slice_mut(bounds)
    }

    /// Hands the memory to cudarc's ownership without a copy: the returned `CudaSlice` frees it
    /// (stream-ordered, on the stream it was allocated on) on whichever thread drops it, as
    /// cudarc does. Drop it on a worker of the device (inside a node) to keep every driver call
    /// on a bound worker, or wrap it again with [`GpuCtx::adopt`](crate::GpuCtx::adopt).
    ///
    /// If nodes of other devices read the buffer ([`GpuCtx::on_device`](crate::GpuCtx::on_device),
    /// [`GpuCtx::copy_peer`](crate::GpuCtx::copy_peer)), the slice's stream first waits for
    /// the work of those whose bodies have ended (`cuStreamWaitEvent`, a driver call of the
    /// buffer's device: call this on one of its workers), so that its free follows their
    /// reads. (A body still running that reads it in place is not waited for: take the slice
    /// out after such readers, as the graph's edges order them.)
    pub fn into_cuda_slice(mut self) -> CudaSlice<T> {
        let s = self.slice.take().expect("present until dropped");
        let on = StreamRef::of(s.stream());
        for f in self.readers.get().map(|r| r.take()).unwrap_or_default() {
            let _ = driver::stream_wait_event(driver::Ctx::of(s.context()), on, &f.event);
            f.done();
        }
        self.device.buffer_freed(s.num_bytes());
        s
    }
}

impl<T: DeviceCopy> Deref for DeviceBuffer<T> {
    type Target = CudaSlice<T>;

    fn deref(&self) -> &CudaSlice<T> {
        self.slice()
    }
}

// cudarc's traits by delegation to the slice: every cudarc call that reads or writes device
// memory takes the buffer itself, and none can reach the slice mutably except through these
// borrows (which cannot replace it).

impl<T: DeviceCopy> DeviceSlice<T> for DeviceBuffer<T> {
    fn len(&self) -> usize {
        self.slice().len()
    }

    fn stream(&self) -> &Arc<CudaStream> {
        self.slice().stream()
    }
}

impl<T: DeviceCopy> DevicePtr<T> for DeviceBuffer<T> {
    fn device_ptr<'a>(&'a self, stream: &'a CudaStream) -> (CUdeviceptr, SyncOnDrop<'a>) {
        self.slice().device_ptr(stream)
    }
}

impl<T: DeviceCopy> DevicePtrMut<T> for DeviceBuffer<T> {
    fn device_ptr_mut<'a>(&'a mut self, stream: &'a CudaStream) -> (CUdeviceptr, SyncOnDrop<'a>) {
        self.slice_mut_ref().device_ptr_mut(stream)
    }
}

// SAFETY: pushes exactly what cudarc's own impl for `&CudaSlice<T>` pushes (it is called): a
// pointer to the slice's address field, which lives for `'b` (the buffer is borrowed for 'b and
// its slice is never replaced while it lives).
unsafe impl<'a, 'b: 'a, T: DeviceCopy> PushKernelArg<&'b DeviceBuffer<T>> for LaunchArgs<'a> {
    #[inline(always)]
    fn arg(&mut self, arg: &'b DeviceBuffer<T>) -> &mut Self {
        self.arg(arg.slice())
    }
}

// SAFETY: as above, through cudarc's impl for `&mut CudaSlice<T>` (a written argument).
unsafe impl<'a, 'b: 'a, T: DeviceCopy> PushKernelArg<&'b mut DeviceBuffer<T>> for LaunchArgs<'a> {
    #[inline(always)]
    fn arg(&mut self, arg: &'b mut DeviceBuffer<T>) -> &mut Self {
        self.arg(arg.slice_mut_ref())
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
            let readers = self.readers.get().cloned();
            self.device.release(Release::Slice(Box::new(s), readers));
        }
    }
}
