//! Page-locked host buffers: [`PinnedBuffer`], and the GPU node's copies between them and
//! device buffers ([`GpuCtx::alloc_pinned`], [`GpuCtx::copy_from_pinned`],
//! [`GpuCtx::copy_to_pinned`], and parts of buffers: [`GpuCtx::copy_to_pinned_at`],
//! [`GpuCtx::copy_from_pinned_at`]); the memory is mapped too, for kernels that read or write it
//! directly ([`PinnedBuffer::device_ptr`]). Copies from and to pinned memory are truly asynchronous (no
//! staging, no host wait) and a CUDA graph can hold them, so a replayed segment can take its
//! input from, and leave its output in, host memory of its instance.
//!
//! Hand-written rather than cudarc's `PinnedHostSlice`: that one is write-combined by default
//! (slow for the host to read back) and orders host access with an event recorded at every
//! copy and waited on at every access, which a capture cannot hold; here the graph's edges order
//! the host's access (a host node after the segment that fills the buffer), and a drop frees on
//! a bound worker like a [`DeviceBuffer`].

use std::fmt;
use std::marker::PhantomData;
use std::ops::Range;
use std::sync::Arc;

use crate::buffer::{DeviceBuffer, DeviceCopy};
use crate::device::{DeviceShared, Release};
use crate::driver::{self, HostAlloc};
use crate::error::{GpuError, GpuErrorKind, GpuResult};
use crate::node::{GpuCtx, KernelArg};

/// Page-locked host memory for `len` elements of `T`, allocated by a GPU node
/// ([`GpuCtx::alloc_pinned`]) and freed by a bound worker of its device when dropped anywhere.
///
/// The host reaches its contents only through `unsafe` methods: the device may be copying into
/// or out of it, and only the graph's edges say when it is not (read it from a node that runs
/// after the GPU work that fills it, as a host successor of a GPU node does).
pub struct PinnedBuffer<T: DeviceCopy> {
    alloc: Option<HostAlloc>,
    len: usize,
    device: Arc<DeviceShared>,
    cuda: Arc<cudarc::driver::CudaContext>,
    _t: PhantomData<T>,
}

impl<T: DeviceCopy> fmt::Debug for PinnedBuffer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PinnedBuffer")
            .field("type", &std::any::type_name::<T>())
            .field("len", &self.len)
            .field("device", &self.device.ordinal())
            .finish()
    }
}

impl<T: DeviceCopy> PinnedBuffer<T> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The buffer's address in the device's address space: a kernel given it (it is a
    /// [`KernelArg`](crate::KernelArg) too) reads or writes the host memory directly over the
    /// bus, no copy engine involved ("zero-copy"; worth it for small transfers, which a CUDA
    /// graph then holds as a kernel like any other). Ordered like a copy: by the graph's edges.
    pub fn device_ptr(&self) -> u64 {
        self.alloc
            .as_ref()
            .expect("a live pinned buffer has its memory")
            .device_ptr()
    }

    fn ptr(&self) -> *mut T {
        self.alloc
            .as_ref()
            .expect("a live pinned buffer has its memory")
            .ptr() as *mut T
    }

    /// The buffer's host address, for code that moves its bytes without the device (a
    /// transport sending or receiving them: MPI reads and writes page-locked memory as it
    /// does any other). Reading or writing through it is `unsafe`, under the contract of
    /// [`to_vec`](Self::to_vec) and [`write`](Self::write): no copy of the device into (for a
    /// read, or out of, for a write) the buffer may be in flight.
    pub fn host_ptr(&self) -> *mut T {
        self.ptr()
    }

    fn bytes(&self) -> usize {
        self.len * std::mem::size_of::<T>()
    }

    /// Copies `src` (exactly [`len`](Self::len) elements) into the buffer.
    ///
    /// # Safety
    /// No copy of the device into or out of this buffer may be in flight, nor any other access
    /// from another thread: call it from a node that the graph orders after the GPU work that
    /// last used the buffer and before the next (in a replay graph, a host node between the
    /// segments; one run holds an instance at a time).
    pub unsafe fn write(&self, src: &[T]) -> GpuResult<()> {
        self.check_len(src.len())?;
        // SAFETY: `len` elements of live host memory of ours; exclusive access is the caller's
        // contract; `src` is a distinct Rust slice.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr(), self.len) };
        Ok(())
    }

    /// The buffer's contents.
    ///
    /// # Safety
    /// No copy of the device into this buffer may be in flight, nor a write from another
    /// thread: call it from a node the graph orders after the GPU work that fills it.
    pub unsafe fn to_vec(&self) -> Vec<T> {
        // SAFETY: `len` initialized-or-plain-data elements (`T` is plain data: every bit
        // pattern is valid); no concurrent writer, by the caller's contract.
        unsafe { std::slice::from_raw_parts(self.ptr(), self.len) }.to_vec()
    }

    fn check_len(&self, n: usize) -> GpuResult<()> {
        if n == self.len {
            return Ok(());
        }
        Err(GpuError::new(
            GpuErrorKind::InvalidArgument,
            format!(
                "pinned buffer of {} elements on device {}: {n} elements given",
                self.len,
                self.device.ordinal()
            ),
        ))
    }
}

impl<T: DeviceCopy> KernelArg for &PinnedBuffer<T> {
    fn to_bits(&self) -> u64 {
        self.device_ptr()
    }
}

impl<T: DeviceCopy> Drop for PinnedBuffer<T> {
    fn drop(&mut self) {
        if let Some(a) = self.alloc.take() {
            // No driver call here: a bound worker frees it after the work enqueued so far.
            self.device.release(Release::Pinned(a, self.cuda.clone()));
        }
    }
}

impl GpuCtx<'_, '_> {
    /// Allocates page-locked host memory for `len` elements (contents undefined), freed by a
    /// bound worker when the buffer is dropped. Under a replay capture it is made at once,
    /// outside the graph, and kept with the node's output like a device allocation.
    pub fn alloc_pinned<T: DeviceCopy>(&self, len: usize) -> GpuResult<PinnedBuffer<T>> {
        let bytes = len.checked_mul(std::mem::size_of::<T>()).ok_or_else(|| {
            GpuError::new(
                GpuErrorKind::InvalidArgument,
                format!(
                    "{}: pinned allocation of {len} elements overflows",
                    self.what()
                ),
            )
        })?;
        let relaxed = self.capture.map(|c| c.relax(self)).transpose()?;
        let a = driver::mem_host_alloc(self.b.ctx, bytes)
            .map_err(|e| self.fail_call("cuMemHostAlloc", e));
        if let (Some(c), Some(mode)) = (self.capture, relaxed) {
            c.unrelax(self, mode, false)?;
        }
        Ok(PinnedBuffer {
            alloc: Some(a?),
            len,
            device: self.b.device.clone(),
            cuda: self.b.cuda.clone(),
            _t: PhantomData,
        })
    }

    /// Enqueues a copy of `src` into `dst` (same length, this node's device) on the node's
    /// stream, without waiting; under a replay capture the graph holds the copy (from the same
    /// host memory at every replay).
    pub fn copy_from_pinned<T: DeviceCopy>(
        &self,
        src: &PinnedBuffer<T>,
        dst: &DeviceBuffer<T>,
    ) -> GpuResult<()> {
        self.check_pinned(src, dst.len())?;
        // SAFETY: lengths match; `src` is page-locked host memory that lives until a bound
        // worker frees it after the work enqueued before its drop; `dst` a live allocation.
        unsafe {
            driver::memcpy_htod_async(
                self.b.ctx,
                dst.device_ptr(),
                src.ptr() as *const u8,
                src.bytes(),
                self.stream,
            )
        }
        .map_err(|e| self.fail_call("cuMemcpyHtoDAsync", e))
    }

    /// Enqueues a copy of `src` into `dst` (same length, this node's device) on the node's
    /// stream, without waiting: `dst` holds the data once the node's GPU work is done (for a
    /// host successor, when it runs). A replay capture holds it.
    pub fn copy_to_pinned<T: DeviceCopy>(
        &self,
        src: &DeviceBuffer<T>,
        dst: &PinnedBuffer<T>,
    ) -> GpuResult<()> {
        self.check_pinned(dst, src.len())?;
        // SAFETY: as in `copy_from_pinned`, the other way; the host must not touch `dst` until
        // the copy is done (its unsafe accessors' contract).
        unsafe {
            driver::memcpy_dtoh_async(
                self.b.ctx,
                dst.ptr() as *mut u8,
                src.device_ptr(),
                dst.bytes(),
                self.stream,
            )
        }
        .map_err(|e| self.fail_call("cuMemcpyDtoHAsync", e))
    }

    /// Enqueues a copy of `src[range]` into `dst[at..at + range.len()]` on the node's stream
    /// (this node's device): a part of a buffer, for a transfer staged in chunks, each chunk's
    /// copy followed by a [`signal`](Self::signal) that a transport waits for.
    pub fn copy_to_pinned_at<T: DeviceCopy>(
        &self,
        src: &DeviceBuffer<T>,
        range: Range<usize>,
        dst: &PinnedBuffer<T>,
        at: usize,
    ) -> GpuResult<()> {
        self.check_device_of(src)?;
        self.check_pinned_range(dst, src.len(), &range, at)?;
        let size = std::mem::size_of::<T>();
        // SAFETY: both ranges were checked to lie inside their allocations; `dst` is
        // page-locked host memory that lives until a bound worker frees it after the work
        // enqueued before its drop; the host must not touch that part of `dst` until the copy
        // is done (its unsafe accessors' contract).
        unsafe {
            driver::memcpy_dtoh_async(
                self.b.ctx,
                (dst.ptr() as *mut u8).add(at * size),
                src.device_ptr() + (range.start * size) as u64,
                range.len() * size,
                self.stream,
            )
        }
        .map_err(|e| self.fail_call("cuMemcpyDtoHAsync", e))
    }

    /// Enqueues a copy of `src[range]` into `dst[at..at + range.len()]` on the node's stream
    /// (this node's device): the counterpart of [`copy_to_pinned_at`](Self::copy_to_pinned_at)
    /// for a buffer that arrived in page-locked memory longer than the value.
    pub fn copy_from_pinned_at<T: DeviceCopy>(
        &self,
        src: &PinnedBuffer<T>,
        range: Range<usize>,
        dst: &DeviceBuffer<T>,
        at: usize,
    ) -> GpuResult<()> {
        self.check_device_of(dst)?;
        if range.start > range.end || range.end > src.len() {
            return Err(GpuError::new(
                GpuErrorKind::InvalidArgument,
                format!(
                    "{}: elements {range:?} of a pinned buffer of {}",
                    self.what(),
                    src.len()
                ),
            ));
        }
        self.check_pinned_range(src, dst.len(), &(at..at + range.len()), range.start)?;
        let size = std::mem::size_of::<T>();
        // SAFETY: both ranges were checked to lie inside their allocations; `src` is
        // page-locked host memory that lives until a bound worker frees it after the work
        // enqueued before its drop; `dst` a live allocation of this device.
        unsafe {
            driver::memcpy_htod_async(
                self.b.ctx,
                dst.device_ptr() + (at * size) as u64,
                (src.ptr() as *const u8).add(range.start * size),
                range.len() * size,
                self.stream,
            )
        }
        .map_err(|e| self.fail_call("cuMemcpyHtoDAsync", e))
    }

    fn check_device_of<T: DeviceCopy>(&self, buf: &DeviceBuffer<T>) -> GpuResult<()> {
        if Arc::ptr_eq(&buf.device, &self.b.device) {
            return Ok(());
        }
        Err(GpuError::new(
            GpuErrorKind::InvalidArgument,
            format!(
                "{}: a device buffer of device {}",
                self.what(),
                buf.device.ordinal()
            ),
        ))
    }

    /// Elements `range` of a device buffer of `device_len` and `range.len()` elements of `p`
    /// from `at` are in bounds, and `p` is of this node's device.
    fn check_pinned_range<T: DeviceCopy>(
        &self,
        p: &PinnedBuffer<T>,
        device_len: usize,
        range: &Range<usize>,
        at: usize,
    ) -> GpuResult<()> {
        self.check_pinned(p, p.len())?;
        let fits = range.start <= range.end
            && range.end <= device_len
            && at
                .checked_add(range.len())
                .is_some_and(|end| end <= p.len());
        if fits {
            return Ok(());
        }
        Err(GpuError::new(
            GpuErrorKind::InvalidArgument,
            format!(
                "{}: elements {range:?} of a device buffer of {device_len} at {at} of a pinned \
                 buffer of {}",
                self.what(),
                p.len()
            ),
        ))
    }

    /// `p` is of this node's device.
    pub(crate) fn check_pinned_device<T: DeviceCopy>(&self, p: &PinnedBuffer<T>) -> GpuResult<()> {
        self.check_pinned(p, p.len())
    }

    fn check_pinned<T: DeviceCopy>(&self, p: &PinnedBuffer<T>, len: usize) -> GpuResult<()> {
        if !Arc::ptr_eq(&p.device, &self.b.device) {
            return Err(GpuError::new(
                GpuErrorKind::InvalidArgument,
                format!(
                    "{}: a pinned buffer of device {}",
                    self.what(),
                    p.device.ordinal()
                ),
            ));
        }
        p.check_len(len).map_err(|e| {
            GpuError::new(
                GpuErrorKind::InvalidArgument,
                format!("{}: {}", self.what(), e.message()),
            )
        })
    }
}
