//! GPU nodes: what a node's body sees ([`GpuCtx`]: its stream, allocations, copies, launches,
//! and under a capture what is hoisted, staged or refused), the marker it leaves its GPU
//! successors, and [`GpuGraphExt::gpu_node`]. `run.rs` holds the wrapper every body runs in
//! (ordered after its GPU predecessors on the device, its position published for its
//! successors, its completion deferred until the device has done its work when a host node or
//! the submitter depends on it); `launch.rs` the kernel launch builder.

use std::fmt;
use std::sync::Arc;

use boundpool_scheduler::backend::GraphBuilderExt;
use boundpool_scheduler::{BoxError, GraphBuilder, GroupId, NodeCtx, NodeRef, Priority};

use crate::buffer::{DeviceBuffer, DeviceCopy};
use crate::capture::Capture;
use crate::device::{DeviceInfo, DeviceShared, GpuDevice, PeerReaders};
use crate::driver::{self, Event, StreamRef};
use crate::error::{GpuError, GpuErrorKind, GpuResult};
use crate::module::Kernel;
use crate::worker::{Bound, EventReturn, GpuWorker};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream};

mod launch;
mod run;
mod stamp;

pub use launch::{KernelArg, Launch, LaunchConfig, MAX_KERNEL_ARGS};
pub use run::run_gpu_body;
use run::run_gpu_node;
pub(crate) use stamp::CompletionStamp;

/// What a GPU node leaves for its GPU successors (through the scheduler's node markers): the
/// stream its work went to, and either
///
/// * a *hand-off*: the node has one GPU successor, on the same device and of the same priority
///   level, which enqueues its work on this same stream (whichever worker runs it), so the
///   edge costs no event at all; or
/// * when a successor is placed on another group or device, or is of another priority level
///   (so surely on another stream: each level has streams of its own), an event recorded right
///   after the node's work, for successors to wait on (recorded now, not by the successor
///   later: a high successor of a low node must not wait for low work queued after it); or
/// * neither: a successor on the same stream needs nothing, one on another stream (a stolen
///   successor of the same group) records an event on this stream itself (everything this
///   node enqueued is already there) and waits on it.
pub(crate) struct GpuMarker {
    /// The recording worker's return list (its own reference count: no line shared with the
    /// device's other workers on the node path).
    events: Option<Arc<EventReturn>>,
    /// A view: the stream is owned by its device's table, which outlives every marker (the
    /// device's last worker destroys it after the pool's graphs are done).
    stream: StreamRef,
    event: Option<Event>,
    handoff: bool,
}

impl Drop for GpuMarker {
    fn drop(&mut self) {
        if let (Some(e), Some(back)) = (self.event.take(), &self.events) {
            // Back to the recording worker: no driver call, any thread.
            back.put(e);
        }
    }
}

/// The context a GPU node's body gets: its inputs, its device, and helpers that enqueue work on
/// its stream (allocations, copies, kernel launches): its worker's stream of the node's
/// priority level, or one a predecessor of the same level handed over. Everything it enqueues
/// is ordered after the node's GPU predecessors and before its GPU successors, on the device.
pub struct GpuCtx<'a, 'n> {
    pub(crate) node: &'a NodeCtx<'n, GpuWorker>,
    pub(crate) b: &'a Bound,
    /// Where this node's work goes: its worker's stream of the node's level, or the one its
    /// predecessor (same level) handed over; under a replay capture, the capturing stream.
    pub(crate) stream: StreamRef,
    /// Set while a replay captures this body (`capture.rs`): allocations are hoisted out of
    /// the capture, host copies staged, downloads refused.
    pub(crate) capture: Option<&'a Capture>,
    /// The node's name when it is not the scheduler node's (a replay node captured inside its
    /// segment's node).
    pub(crate) name: Option<&'a str>,
    /// `stream` as cudarc's type, looked up at the body's first [`GpuCtx::stream`] call.
    pub(crate) cuda_stream: std::cell::OnceCell<Arc<CudaStream>>,
    /// Set by a body that enqueued nothing (a replay segment whose capture recorded no work):
    /// the node then completes as a host node would, when nothing GPU precedes it.
    pub(crate) no_work: std::cell::Cell<bool>,
    /// Buffers of other devices (or pools) this node read (`peer.rs`): each gets a fence,
    /// recorded after the body on the stream its work went to.
    pub(crate) peer_reads: std::cell::RefCell<Vec<Arc<PeerReaders>>>,
    /// Set by a body whose work went to another stream of the device (an NCCL operation, on
    /// its communicator's stream: `nccl/ops.rs`): successors and the completion follow that
    /// stream, through an event recorded right after the work, never a hand-off (a successor
    /// enqueued there would queue behind later NCCL operations).
    pub(crate) moved_to: std::cell::Cell<Option<StreamRef>>,
    /// Set by a probed body (a replay's launch probe): its completion's polls are timed into
    /// it. Left here (never taken) when the node's completion is not deferred.
    pub(crate) completion_stamp: std::cell::Cell<Option<Arc<CompletionStamp>>>,
}

/// A context's range of CUDA stream priorities (lower numbers are more urgent).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamPriorityRange {
    /// The most urgent priority (high nodes' streams have it).
    pub greatest: i32,
    /// The least urgent priority (low nodes' streams have it; 0, the default, on current GPUs).
    pub least: i32,
}

impl fmt::Debug for GpuCtx<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GpuCtx")
            .field("node", &self.node.node_name())
            .field("device", &self.b.device.ordinal())
            .finish()
    }
}

impl<'a, 'n> GpuCtx<'a, 'n> {
    /// The context of a body of `node` on the bound worker `b`, enqueuing on `stream`; under
    /// a replay capture, `capture` and the replay node's `name`.
    pub(crate) fn new(
        node: &'a NodeCtx<'n, GpuWorker>,
        b: &'a Bound,
        stream: StreamRef,
        capture: Option<&'a Capture>,
        name: Option<&'a str>,
    ) -> Self {
        GpuCtx {
            node,
            b,
            stream,
            capture,
            name,
            cuda_stream: std::cell::OnceCell::new(),
            no_work: std::cell::Cell::new(false),
            peer_reads: std::cell::RefCell::new(Vec::new()),
            moved_to: std::cell::Cell::new(None),
            completion_stamp: std::cell::Cell::new(None),
        }
    }

    pub(crate) fn what(&self) -> String {
        format!(
            "node '{}' of graph '{}' on device {}",
            self.node_name(),
            self.node.graph_name(),
            self.b.device.ordinal()
        )
    }

    fn fail(&self, call: &str, e: driver::DriverError) -> GpuError {
        self.b.device.driver_error(call, &self.what(), e)
    }

    /// A driver error of `call` made for this node (`replay/`).
    pub(crate) fn fail_call(&self, call: &str, e: driver::DriverError) -> GpuError {
        self.fail(call, e)
    }

    /// The output of direct predecessor `from`.
    pub fn input<T: 'static>(&self, from: NodeRef<T>) -> GpuResult<&'n T> {
        self.node
            .input(from)
            .map_err(|e| GpuError::new(GpuErrorKind::Scheduler, e.to_string()).with_source(e))
    }

    /// Takes the output of direct predecessor `from` by value, when this node is its only
    /// successor ([`Inputs::take`](boundpool_scheduler::Inputs::take)): to write into a
    /// predecessor's buffer in place (a cuBLAS GEMM's `c`, a memset) without a lock or a copy.
    /// The predecessor's event stays with it, so this node's work is still ordered after the
    /// predecessor's on the device.
    pub fn take<T: 'static>(&self, from: NodeRef<T>) -> GpuResult<T> {
        self.node
            .take(from)
            .map_err(|e| GpuError::new(GpuErrorKind::Scheduler, e.to_string()).with_source(e))
    }

    /// The scheduler's context of this node (worker identity, graph, nested submission).
    pub fn node(&self) -> &'a NodeCtx<'n, GpuWorker> {
        self.node
    }

    /// This node's name.
    pub fn node_name(&self) -> &'a str {
        self.name.unwrap_or_else(|| self.node.node_name())
    }

    /// Whether this body is running under a replay capture (its work is recorded into a CUDA
    /// graph, not run; see the crate's `replay` docs).
    pub fn is_capturing(&self) -> bool {
        self.capture.is_some()
    }

    /// Runs `f` while no replay capture of this node's device is under way in this process
    /// (any pool's), and keeps new captures from beginning until it returns. For cudarc calls
    /// in a body that synchronise the device or its context: making or dropping a `CudaBlas`,
    /// `CudaBlasLT` or `CudaRng` (and a generator's first draw, which sets its state up),
    /// `load_module` (and a module's unload), `synchronize` on the context, a synchronous
    /// free. The driver invalidates every capture of the context such a
    /// call meets, whichever thread makes it (thread-local capture mode does not protect
    /// against another thread's synchronise), so without this a node of one graph can break
    /// the capture of another, and the call itself may fail. boundpool's own calls of the kind
    /// (a worker's start and stop, library handles, module loads, pinned allocations and host
    /// frees) hold the same gate. In a body under a capture `f` runs at once (such a call is
    /// refused there, naming the node); `f` must not wait for a replay's capture.
    ///
    /// ```no_run
    /// # use boundpool_gpu::{BoxError, GpuCtx};
    /// # use boundpool_gpu::cudarc::curand::CudaRng;
    /// fn fill(ctx: &GpuCtx<'_, '_>) -> Result<(), BoxError> {
    ///     let mut v = ctx.stream().alloc_zeros::<f32>(1024)?;
    ///     // Made and first drawn (cuRAND sets the generator's state up then) inside.
    ///     let rng = ctx.outside_captures(|| -> Result<_, BoxError> {
    ///         let rng = CudaRng::new(42, ctx.stream().clone())?;
    ///         rng.fill_with_uniform(&mut v)?;
    ///         Ok(rng)
    ///     })?;
    ///     // A later draw is a kernel on the stream.
    ///     rng.fill_with_uniform(&mut v)?;
    ///     // The generator's destroy frees with a synchronise.
    ///     ctx.outside_captures(|| drop(rng));
    ///     Ok(())
    /// }
    /// ```
    pub fn outside_captures<R>(&self, f: impl FnOnce() -> R) -> R {
        let _gate = self.b.device.gate.sync();
        f()
    }

    /// The device this node runs on.
    pub fn device(&self) -> &DeviceInfo {
        &self.b.device.info
    }

    /// The stream this node enqueues on, as cudarc's type: its worker's stream of the node's
    /// priority level, one a predecessor handed over, or, under a replay capture, the
    /// capturing stream. cudarc code given it (`launch_builder`, `CudaBlas`, copies,
    /// `alloc_zeros`) is ordered by the node's edges like the node's own work.
    ///
    /// Keep the work of one node on this stream: boundpool orders streams, not cudarc's
    /// per-buffer events, which are off on the pool's context. A clone kept past the pool's
    /// shutdown keeps the stream (and the context) alive; work enqueued on it then is the
    /// caller's to order.
    pub fn stream(&self) -> &Arc<CudaStream> {
        self.cuda_stream.get_or_init(|| self.find_stream())
    }

    #[cold]
    fn find_stream(&self) -> Arc<CudaStream> {
        if let Some(c) = self.capture {
            return c.stream().clone();
        }
        if let Some(l) = [Priority::Normal, Priority::High, Priority::Low]
            .into_iter()
            .filter_map(|p| self.b.lane_if_made(p))
            .find(|l| l.stream == self.stream)
        {
            return l.cuda.clone();
        }
        self.b
            .device
            .cuda_stream(self.stream)
            .expect("a node's stream is one of its device's worker streams")
    }

    /// The device's context, as cudarc's type (the primary context, bound to this worker for
    /// its whole life; its event tracking is off, see [`GpuCtx::stream`]).
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.b.cuda
    }

    /// Takes a cudarc slice of this device into a [`DeviceBuffer`] without a copy, so that it
    /// may leave the node and be dropped on any thread (a plain `CudaSlice` frees on the
    /// dropping thread). An error if the slice belongs to another device's context.
    pub fn adopt<T: DeviceCopy>(&self, slice: CudaSlice<T>) -> GpuResult<DeviceBuffer<T>> {
        if slice.context().cu_ctx() != self.b.cuda.cu_ctx() {
            return Err(GpuError::new(
                GpuErrorKind::InvalidArgument,
                format!(
                    "{}: adopt: the slice belongs to device {}'s context, not this node's",
                    self.what(),
                    slice.context().ordinal()
                ),
            ));
        }
        Ok(DeviceBuffer::from_slice(slice, self.b.device.clone()))
    }

    /// Enqueues an allocation of `len` elements (contents undefined).
    pub fn alloc<T: DeviceCopy>(&self, len: usize) -> GpuResult<DeviceBuffer<T>> {
        let bytes = len.checked_mul(std::mem::size_of::<T>()).ok_or_else(|| {
            GpuError::new(
                GpuErrorKind::InvalidArgument,
                format!("{}: allocation of {len} elements overflows", self.what()),
            )
        })?;
        // Under a capture the allocation is hoisted: made now, outside the graph, on the
        // worker's own (not capturing) stream, so it lives as long as the replay's outputs.
        let on = match self.capture {
            Some(_) => self.b.normal_stream(),
            None => self.stream(),
        };
        let hoisted = self.capture.map(|c| c.relax(self)).transpose()?;
        let p = driver::mem_alloc_async(self.b.ctx, bytes, StreamRef::of(on)).map_err(|e| {
            let mut err = self.fail("cuMemAllocAsync", e);
            if err.kind() == GpuErrorKind::OutOfMemory {
                err = GpuError::new(
                    GpuErrorKind::OutOfMemory,
                    format!("{} ({bytes} bytes)", err.message()),
                )
                .with_source(e);
            }
            err
        });
        if let (Some(c), Some(mode)) = (self.capture, hoisted) {
            c.unrelax(self, mode, p.is_ok())?;
        }
        // SAFETY: a live allocation of this context of `bytes.max(1)` bytes, room for `len`
        // elements, handed to the slice (which owns it from now on); its contents are
        // undefined until written, as this method's docs say, and `T` is plain data.
        let s = unsafe { on.upgrade_device_ptr::<T>(p?.into_raw(), len) };
        Ok(DeviceBuffer::from_slice(s, self.b.device.clone()))
    }

    /// Enqueues an allocation of `len` zeroed elements.
    pub fn alloc_zeros<T: DeviceCopy>(&self, len: usize) -> GpuResult<DeviceBuffer<T>> {
        let mut buf = self.alloc::<T>(len)?;
        self.memset_zero(&mut buf)?;
        Ok(buf)
    }

    /// Enqueues setting every byte of `buf` to zero.
    pub fn memset_zero<T: DeviceCopy>(&self, buf: &mut DeviceBuffer<T>) -> GpuResult<()> {
        self.check_device(&buf.device)?;
        // SAFETY: `buf` is a live allocation of `buf.bytes()` bytes on this device.
        unsafe {
            driver::memset_d8_async(self.b.ctx, buf.device_ptr(), 0, buf.bytes(), self.stream)
        }
        .map_err(|e| self.fail("cuMemsetD8Async", e))
    }

    /// Allocates a buffer and enqueues a copy of `src` into it. `src` may be dropped as soon as
    /// this returns (pageable memory is staged by the driver before the call returns).
    pub fn upload<T: DeviceCopy>(&self, src: &[T]) -> GpuResult<DeviceBuffer<T>> {
        let mut buf = self.alloc::<T>(src.len())?;
        self.copy_to_device(src, &mut buf)?;
        Ok(buf)
    }

    /// Enqueues a copy of `src` into `dst` (same length).
    pub fn copy_to_device<T: DeviceCopy>(
        &self,
        src: &[T],
        dst: &mut DeviceBuffer<T>,
    ) -> GpuResult<()> {
        self.copy_into(src, dst)
    }

    /// `copy_to_device` into a buffer held by reference (a shared node output: a replay's
    /// static input, `ReplayCtx::copy_into`). Device memory is not Rust memory: ordering the
    /// writes against other work is the stream's business, as for kernels given `&buf`.
    pub(crate) fn copy_into<T: DeviceCopy>(
        &self,
        src: &[T],
        dst: &DeviceBuffer<T>,
    ) -> GpuResult<()> {
        self.check_device(&dst.device)?;
        if src.len() != dst.len() {
            return Err(GpuError::new(
                GpuErrorKind::InvalidArgument,
                format!(
                    "{}: copy of {} elements into a buffer of {}",
                    self.what(),
                    src.len(),
                    dst.len()
                ),
            ));
        }
        if let Some(c) = self.capture {
            // Staged: copied now into a device buffer the replay keeps, and the capture
            // records a device-to-device copy from it (the host slice is gone by the replay).
            return c.staged_upload(self, src, dst);
        }
        // SAFETY: lengths match; the source is pageable host memory, staged before return.
        unsafe {
            driver::memcpy_htod_async(
                self.b.ctx,
                dst.device_ptr(),
                src.as_ptr() as *const u8,
                dst.bytes(),
                self.stream,
            )
        }
        .map_err(|e| self.fail("cuMemcpyHtoDAsync", e))
    }

    /// Copies `src` to a new host vector. This waits (on this worker) until the node's earlier
    /// work on the stream and the copy are done: the driver returns from a copy into pageable
    /// memory only once it has completed.
    pub fn download<T: DeviceCopy>(&self, src: &DeviceBuffer<T>) -> GpuResult<Vec<T>> {
        self.check_device(&src.device)?;
        self.download_raw(src.device_ptr(), src.len())
    }

    /// `download` of a live allocation of this device given by address and length.
    pub(crate) fn download_raw<T: DeviceCopy>(&self, ptr: u64, len: usize) -> GpuResult<Vec<T>> {
        if let Some(c) = self.capture {
            return Err(c.refuse(
                self,
                "a download to the host waits for the device (a synchronise), which a CUDA graph cannot capture",
            ));
        }
        let bytes = len * std::mem::size_of::<T>();
        let mut v: Vec<T> = Vec::with_capacity(len);
        // SAFETY: the vector has capacity for `len` elements; the copy writes all of them
        // before returning (pageable destination, then a stream synchronise), and every bit
        // pattern is a valid `T`. Callers pass a live allocation of `bytes` bytes.
        unsafe {
            driver::memcpy_dtoh_async(
                self.b.ctx,
                v.as_mut_ptr() as *mut u8,
                ptr,
                bytes,
                self.stream,
            )
            .map_err(|e| self.fail("cuMemcpyDtoHAsync", e))?;
            driver::stream_synchronize(self.b.ctx, self.stream)
                .map_err(|e| self.fail("cuStreamSynchronize", e))?;
            v.set_len(len);
        }
        Ok(v)
    }

    /// Enqueues a device-to-device copy of `src` into `dst` (same length, same device).
    pub fn copy_device<T: DeviceCopy>(
        &self,
        src: &DeviceBuffer<T>,
        dst: &mut DeviceBuffer<T>,
    ) -> GpuResult<()> {
        self.check_device(&src.device)?;
        self.check_device(&dst.device)?;
        if src.len() != dst.len() {
            return Err(GpuError::new(
                GpuErrorKind::InvalidArgument,
                format!(
                    "{}: copy of {} elements into {}",
                    self.what(),
                    src.len(),
                    dst.len()
                ),
            ));
        }
        // SAFETY: both are live allocations of `bytes()` bytes on this device.
        unsafe {
            driver::memcpy_dtod_async(
                self.b.ctx,
                dst.device_ptr(),
                src.device_ptr(),
                src.bytes(),
                self.stream,
            )
        }
        .map_err(|e| self.fail("cuMemcpyDtoDAsync", e))
    }

    /// Starts a launch of `kernel` with `cfg` on this node's stream.
    ///
    /// # Examples
    ///
    /// See [`GpuGraphExt`] for a whole graph; inside a node body:
    ///
    /// ```no_run
    /// # use boundpool_gpu::{builtin, BoxError, GpuCtx, LaunchConfig, Module};
    /// fn double(gpu: &GpuCtx<'_, '_>, data: &[f32]) -> Result<Vec<f32>, BoxError> {
    ///     let kernel = Module::builtin().kernel(builtin::SCALE_F32)?;
    ///     let mut x = gpu.upload(data)?;
    ///     // SAFETY: `bp_scale_f32(f32* x, f32 a, u32 n)`, and `x` outlives the launch (it is
    ///     // freed after the node's GPU work).
    ///     unsafe {
    ///         gpu.launch(&kernel, LaunchConfig::for_elements(data.len()))
    ///             .arg(&mut x)
    ///             .arg(2.0f32)
    ///             .arg(data.len() as u32)
    ///             .launch()?;
    ///     }
    ///     Ok(gpu.download(&x)?)
    /// }
    /// ```
    pub fn launch<'c>(&'c self, kernel: &'c Kernel, cfg: LaunchConfig) -> Launch<'c, 'a, 'n> {
        Launch::new(self, kernel, cfg)
    }

    /// The CUDA priority of the stream this node enqueues on, as the driver reports it
    /// (`cuStreamGetPriority`).
    pub fn stream_priority(&self) -> GpuResult<i32> {
        driver::stream_get_priority(self.b.ctx, self.stream)
            .map_err(|e| self.fail("cuStreamGetPriority", e))
    }

    /// The device's range of stream priorities (`cuCtxGetStreamPriorityRange`).
    pub fn stream_priority_range(&self) -> GpuResult<StreamPriorityRange> {
        let (least, greatest) = driver::stream_priority_range(self.b.ctx)
            .map_err(|e| self.fail("cuCtxGetStreamPriorityRange", e))?;
        Ok(StreamPriorityRange { greatest, least })
    }

    /// Free and total memory of the device, in bytes.
    pub fn memory_info(&self) -> GpuResult<(usize, usize)> {
        driver::mem_get_info(self.b.ctx).map_err(|e| self.fail("cuMemGetInfo", e))
    }

    fn check_device(&self, d: &Arc<DeviceShared>) -> GpuResult<()> {
        if Arc::ptr_eq(d, &self.b.device) {
            Ok(())
        } else {
            Err(GpuError::new(
                GpuErrorKind::InvalidArgument,
                format!(
                    "{}: buffer lives on device {}, not this node's",
                    self.what(),
                    d.ordinal()
                ),
            ))
        }
    }
}

// ----------------------------------------------------------------------------------------------
// Under a replay capture: what `GpuCtx` enqueues for its `Capture` (state in `capture.rs`).

impl Capture {
    /// Switches the thread to relaxed capture mode for a call the capture must not see.
    pub(crate) fn relax(&self, ctx: &GpuCtx<'_, '_>) -> GpuResult<u32> {
        driver::capture_mode_relaxed()
            .map_err(|e| ctx.fail_call("cuThreadExchangeStreamCaptureMode", e))
    }

    /// After a hoisted call: waits for it on the side stream (`ok`: it enqueued something),
    /// then restores the capture mode.
    pub(crate) fn unrelax(&self, ctx: &GpuCtx<'_, '_>, mode: u32, ok: bool) -> GpuResult<()> {
        let synced = if ok {
            driver::stream_synchronize(ctx.b.ctx, self.side())
                .map_err(|e| ctx.fail_call("cuStreamSynchronize", e))
        } else {
            Ok(())
        };
        driver::capture_mode_restore(mode)
            .map_err(|e| ctx.fail_call("cuThreadExchangeStreamCaptureMode", e))?;
        synced
    }

    /// `copy_to_device` under a capture: the host data goes now into a staging buffer the
    /// segment keeps; the capture records a device-to-device copy from it.
    pub(crate) fn staged_upload<T: DeviceCopy>(
        &self,
        ctx: &GpuCtx<'_, '_>,
        src: &[T],
        dst: &DeviceBuffer<T>,
    ) -> GpuResult<()> {
        let bytes = dst.bytes();
        let stage = ctx.alloc::<u8>(bytes)?;
        let mode = self.relax(ctx)?;
        // SAFETY: `stage` is a live allocation of `bytes` bytes; `src` holds exactly `bytes`
        // bytes (the caller checked the lengths) and is pageable: staged before return.
        let copied = unsafe {
            driver::memcpy_htod_async(
                ctx.b.ctx,
                stage.device_ptr(),
                src.as_ptr() as *const u8,
                bytes,
                self.side(),
            )
        }
        .map_err(|e| ctx.fail_call("cuMemcpyHtoDAsync", e));
        self.unrelax(ctx, mode, copied.is_ok())?;
        copied?;
        // SAFETY: both are live allocations of `bytes` bytes on this device.
        unsafe {
            driver::memcpy_dtod_async(
                ctx.b.ctx,
                dst.device_ptr(),
                stage.device_ptr(),
                bytes,
                ctx.stream,
            )
        }
        .map_err(|e| ctx.fail_call("cuMemcpyDtoDAsync", e))?;
        self.keep(stage);
        Ok(())
    }

    /// Refuses an operation a CUDA graph cannot capture: remembers why (the capture fails
    /// with it even if the body swallows the error) and returns the error.
    pub(crate) fn refuse(&self, ctx: &GpuCtx<'_, '_>, why: &str) -> GpuError {
        let msg = format!("{}: {why}", ctx.what());
        self.note_refused(&msg);
        GpuError::new(GpuErrorKind::Capture, msg)
    }
}

/// Adds GPU nodes to a graph of a [`GpuPool`](crate::GpuPool).
///
/// # Examples
///
/// Scales a vector on the first device and reads it back (needs a GPU, so it is compiled but
/// not run here; `tests/gpu_*.rs` run the same calls and skip without a GPU).
///
/// ```no_run
/// use boundpool_gpu::{builtin, GpuGraphBuilder, GpuGraphExt, GpuPoolBuilder, LaunchConfig, Module};
///
/// let pool = GpuPoolBuilder::new().workers_per_device(2).build()?;
/// let device = &pool.devices()[0];
/// let kernel = Module::builtin().kernel(builtin::SCALE_F32)?;
/// let mut g = GpuGraphBuilder::new("scale");
/// let scaled = g.gpu_node(device, "scale", move |gpu| {
///     let host: Vec<f32> = (0..1024).map(|i| i as f32).collect();
///     let mut x = gpu.upload(&host)?;
///     // SAFETY: `bp_scale_f32(f32* x, f32 a, u32 n)`, and `x` outlives the node's GPU work.
///     unsafe {
///         gpu.launch(&kernel, LaunchConfig::for_elements(host.len()))
///             .arg(&mut x)
///             .arg(2.0f32)
///             .arg(host.len() as u32)
///             .launch()?;
///     }
///     Ok(gpu.download(&x)?)
/// });
/// let out = pool.submit(&g.build()?)?.wait()?;
/// assert_eq!(out.get(scaled).unwrap()[3], 6.0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait GpuGraphExt {
    /// Adds a node that runs `body` on a worker of `device` (placed on
    /// [`GpuDevice::placement`]: any of the device's workers, whatever its number of groups).
    /// The body's GPU work is ordered after its GPU predecessors' on the device, and
    /// its successors and the graph's completion wait for that work to finish where they need
    /// to (host successors, sinks), without a host synchronise between GPU nodes.
    fn gpu_node<T, F>(&mut self, device: &GpuDevice, name: &str, body: F) -> NodeRef<T>
    where
        T: Send + Sync + 'static,
        F: Fn(&GpuCtx<'_, '_>) -> Result<T, BoxError> + Send + Sync + 'static;

    /// Like [`gpu_node`](Self::gpu_node), placed on a given device group (see
    /// [`GpuDevice::groups`]).
    fn gpu_node_in<T, F>(&mut self, group: GroupId, name: &str, body: F) -> NodeRef<T>
    where
        T: Send + Sync + 'static,
        F: Fn(&GpuCtx<'_, '_>) -> Result<T, BoxError> + Send + Sync + 'static;
}

impl GpuGraphExt for GraphBuilder<GpuWorker> {
    fn gpu_node<T, F>(&mut self, device: &GpuDevice, name: &str, body: F) -> NodeRef<T>
    where
        T: Send + Sync + 'static,
        F: Fn(&GpuCtx<'_, '_>) -> Result<T, BoxError> + Send + Sync + 'static,
    {
        let r = self.node(name.to_owned(), move |node: &NodeCtx<'_, GpuWorker>| {
            run_gpu_node(node, &body)
        });
        self.place(r, device.placement()).mark_device_node(r);
        r
    }

    fn gpu_node_in<T, F>(&mut self, group: GroupId, name: &str, body: F) -> NodeRef<T>
    where
        T: Send + Sync + 'static,
        F: Fn(&GpuCtx<'_, '_>) -> Result<T, BoxError> + Send + Sync + 'static,
    {
        let r = self.node(name.to_owned(), move |node: &NodeCtx<'_, GpuWorker>| {
            run_gpu_node(node, &body)
        });
        self.place(r, group).mark_device_node(r);
        r
    }
}
