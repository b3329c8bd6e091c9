//! The only module that touches raw CUDA driver handles.
//!
//! Everything here is a thin wrapper over `cudarc::driver::sys`, or over cudarc's own layers
//! where they do the call (modules, functions and the kernel launch: cudarc's `CudaModule`,
//! `CudaFunction` and `result::launch_kernel`, behind the context check). A handle that must be
//! destroyed is an *owner* ([`PrimaryCtx`], [`Event`], [`DeviceAlloc`],
//! [`CudaGraph`], [`GraphExec`]): not `Copy` nor `Clone`, its raw field private to this
//! module, destroyed by a method that consumes it, so destroy-once is the compiler's business.
//! What others need to name a handle they do not own is a `Copy` *view* ([`Ctx`],
//! [`StreamRef`], [`CudaGraphNode`]), made only here from its owner and unable to destroy
//! anything; the
//! crate keeps the owners views point to in its device tables until the device's last worker
//! stops. The device's context and its streams are cudarc's (`Arc<CudaContext>`,
//! `Arc<CudaStream>`, held by the device's table, its workers and the buffers allocated on
//! them) so that node bodies can use cudarc; [`Ctx::of`] and [`StreamRef::of`] make views of
//! them, valid while those `Arc`s live. So are its modules (`Arc<CudaModule>`, in the device's
//! table) and their functions (`CudaFunction`, in the device's and its workers' tables, each
//! holding its module), whose last `Arc` the device's last worker drops ([`module_release`]).
//! Functions that take handles are therefore safe to call from crate code; those that take
//! raw pointers to memory (launch arguments, copies) are `unsafe`.
//!
//! Two child modules hold calls of one concern under the same rules: `green`, those of SM
//! partitions (green contexts, their streams, the partition check); `graph`, CUDA graphs
//! (templates, their nodes and edges, a capture's dependencies, executables), also for the
//! public `CudaGraphTemplate` and `CaptureExt` (`cuda_graph.rs`), whose calls go unchecked.
//!
//! Every function that needs a current context takes the context the caller *expects* to be
//! current. When context checking is on ([`crate::context_check`]), each such call first reads
//! `cuCtxGetCurrent` and counts a mismatch; that is how the tests prove that no framework call is
//! made from an unbound thread or one bound to the wrong device.

use std::ffi::{c_char, c_int, c_void};
use std::fmt;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{result, sys, CudaContext, CudaFunction, CudaModule};
use cudarc::nvrtc::Ptx;

mod graph;
pub(crate) mod green;

pub(crate) use cudarc::driver::result::DriverError;
pub use graph::CudaGraphNode;
pub(crate) use graph::{
    capture_add_root, capture_dependencies, capture_mode_relaxed, capture_mode_restore,
    capture_root, capture_set_dependencies, capture_set_tail, capture_tail, end_capture,
    graph_edge_count, graph_edges, graph_exec_update, graph_instantiate, graph_launch,
    graph_node_count, graph_nodes, graph_remove_node, has_capture_v3, node_kind,
    stream_begin_capture, stream_capture_status, stream_end_capture, CudaGraph, GraphExec,
    NodeKind,
};

/// Result of a driver call.
pub(crate) type DResult<T> = Result<T, DriverError>;

// ----------------------------------------------------------------------------------------------
// Context checking (debug instrumentation).

static CHECK: AtomicBool = AtomicBool::new(cfg!(debug_assertions));
static CHECKED: AtomicU64 = AtomicU64::new(0);
static WRONG: AtomicU64 = AtomicU64::new(0);
static WRONG_SAMPLES: Mutex<Vec<String>> = Mutex::new(Vec::new());

pub(crate) fn set_checking(on: bool) {
    CHECK.store(on, Ordering::SeqCst);
}
pub(crate) fn checking() -> bool {
    CHECK.load(Ordering::Relaxed)
}
pub(crate) fn checked_calls() -> u64 {
    CHECKED.load(Ordering::SeqCst)
}
pub(crate) fn wrong_calls() -> u64 {
    WRONG.load(Ordering::SeqCst)
}
pub(crate) fn wrong_samples() -> Vec<String> {
    WRONG_SAMPLES.lock().map(|v| v.clone()).unwrap_or_default()
}

#[inline]
fn check(expect: Ctx, call: &'static str) {
    if !CHECK.load(Ordering::Relaxed) {
        return;
    }
    CHECKED.fetch_add(1, Ordering::Relaxed);
    let cur = current_raw();
    if cur != Ok(expect.0 as usize) {
        WRONG.fetch_add(1, Ordering::SeqCst);
        if let Ok(mut v) = WRONG_SAMPLES.lock() {
            if v.len() < 32 {
                let t = std::thread::current();
                v.push(format!(
                    "{call} on thread {:?} with current context {:?}, expected {:#x}",
                    t.name().unwrap_or("<unnamed>"),
                    cur.map(|c| format!("{c:#x}")),
                    expect.0 as usize
                ));
            }
        }
    }
}

fn current_raw() -> DResult<usize> {
    let mut ctx = MaybeUninit::<sys::CUcontext>::uninit();
    // SAFETY: cuCtxGetCurrent writes one pointer into `ctx`; we only read it after success.
    unsafe {
        sys::cuCtxGetCurrent(ctx.as_mut_ptr()).result()?;
        Ok(ctx.assume_init() as usize)
    }
}

// ----------------------------------------------------------------------------------------------
// Handles.
//
// Two kinds. *Owners* ([`Event`], [`PrimaryCtx`], [`DeviceAlloc`], and in `graph`
// [`CudaGraph`], [`GraphExec`]) are neither `Copy` nor `Clone`, keep their raw field
// private to this module, and are destroyed by a method that consumes them, so that destroying
// one twice, or using one after destroying it, does not compile. *Views* ([`Ctx`],
// [`StreamRef`], [`CudaGraphNode`]) are `Copy`, own nothing and have no destroy: a view is
// made only here, from its owner (or, for `Ctx`, by the call that retained the
// context), and is valid while that owner lives. The
// crate keeps the owners of what views point to in its device tables until the device's last
// worker stops (see `device.rs`), after every node that can hold a view.
//
// That owners are not `Copy` (nor `Clone`), so that a second destroy does not compile, is
// checked at compile time by `tests::owners_are_not_copy_or_clone` (the module is private, so
// a doctest could not name its types).

/// Implements `Send` and `Sync` for a handle type.
macro_rules! send_sync {
    ($($name:ident),*) => { $(
        // SAFETY: driver handles are plain identifiers that the driver lets any thread use
        // (with the right context current); this crate uses them only from bound workers, and
        // an owner is mutated (destroyed) only by value.
        unsafe impl Send for $name {}
        // SAFETY: as above; a shared reference only reads the handle value.
        unsafe impl Sync for $name {}
    )* };
}

/// A CUDA context (here always a device's primary context): a view, the identity the
/// wrappers check against and bind. The context is owned by the [`PrimaryCtx`] that retained
/// it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Ctx(sys::CUcontext);

/// One retain of a device's primary context (`cuDevicePrimaryCtxRetain`), owned: released
/// once by [`PrimaryCtx::release`], which consumes it.
#[derive(Debug)]
pub(crate) struct PrimaryCtx {
    dev: Dev,
    ctx: Ctx,
}

/// A view of a stream cudarc owns (an `Arc<CudaStream>`: the crate's worker streams live in
/// their device's table until its last worker stops). Cannot destroy it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct StreamRef(sys::CUstream);

/// An event, owned (created with timing disabled, except the trace's timing events). Moved
/// between a worker's spares, the markers that carry it and the device's table; destroyed
/// once by [`Event::destroy`].
///
/// Not cudarc's `CudaEvent`: its drop binds the context and destroys the event on whichever
/// thread drops it (a marker is dropped on any thread: this event goes back to its worker
/// instead), its `record` and `CudaStream::wait` bind the context on every call (one more
/// driver call per GPU edge), and both take a `&CudaStream` where the node path names a
/// handed-over stream by its view. The calls themselves are cudarc's `result::event` ones.
#[derive(Debug)]
pub(crate) struct Event(sys::CUevent);

/// Device memory from `cuMemAllocAsync`, owned. Freed once by [`DeviceAlloc::free_async`] or
/// [`DeviceAlloc::free`]; [`DeviceAlloc::addr`] is the plain address kernels and copies take.
#[derive(Debug)]
pub(crate) struct DeviceAlloc(sys::CUdeviceptr);

send_sync!(Ctx, PrimaryCtx, StreamRef, Event);

impl Ctx {
    /// The view of the context a cudarc `CudaContext` holds (each device's is retained by the
    /// pool as an `Arc<CudaContext>`, see `device.rs`); valid while that `Arc` lives.
    pub(crate) fn of(c: &cudarc::driver::CudaContext) -> Self {
        Ctx(c.cu_ctx())
    }
}

impl PrimaryCtx {
    /// The retained context.
    pub(crate) fn ctx(&self) -> Ctx {
        self.ctx
    }

    /// Releases this retain (`cuDevicePrimaryCtxRelease`).
    pub(crate) fn release(self) -> DResult<()> {
        // SAFETY: paired with the one successful retain that made `self`, consumed here.
        unsafe { sys::cuDevicePrimaryCtxRelease_v2(self.dev.0).result() }
    }
}

impl StreamRef {
    /// A view of a stream cudarc owns (the device's worker streams and capture streams are
    /// `Arc<CudaStream>`s, so that a node can hand them to cudarc code); valid while that
    /// `Arc` lives.
    pub(crate) fn of(s: &cudarc::driver::CudaStream) -> Self {
        StreamRef(s.cu_stream())
    }

    /// The raw stream as an untyped pointer: for cuBLAS and cuSOLVER's `*SetStream`,
    /// cuBLASLt's matmul and NCCL's operations (which take the runtime API's `cudaStream_t`,
    /// the same handle) and their stream checks. The one
    /// way a raw driver handle leaves this file.
    pub(crate) fn raw_ptr(self) -> *mut c_void {
        self.0.cast()
    }
}

impl Event {
    /// `cuEventDestroy` (cudarc's `result::event::destroy`).
    pub(crate) fn destroy(self, expect: Ctx) -> DResult<()> {
        check(expect, "cuEventDestroy");
        // SAFETY: `self` is a live event, consumed here: destroyed once.
        unsafe { result::event::destroy(self.0) }
    }
}

impl DeviceAlloc {
    /// Takes ownership of an allocation handed over by its former owner (a `CudaSlice` taken
    /// apart with `leak`).
    ///
    /// # Safety
    /// `p` must be a live allocation of the current context from `cuMemAllocAsync` or
    /// `cuMemAlloc` that nothing else frees.
    pub(crate) unsafe fn adopt(p: sys::CUdeviceptr) -> Self {
        DeviceAlloc(p)
    }

    /// The device address (for kernel arguments, copies, and the device's table key).
    pub(crate) fn addr(&self) -> u64 {
        self.0
    }

    /// Gives up ownership: the caller hands the address to its next owner (a `CudaSlice`).
    pub(crate) fn into_raw(self) -> sys::CUdeviceptr {
        self.0
    }

    /// `cuMemFreeAsync` on `s`: freed once every use ordered before this point on `s` is done.
    pub(crate) fn free_async(self, expect: Ctx, s: StreamRef) -> DResult<()> {
        check(expect, "cuMemFreeAsync");
        // SAFETY: `self` came from cuMemAllocAsync and is consumed here: freed once; the
        // caller orders every use of it before this point on `s` (the release fence).
        unsafe { sys::cuMemFreeAsync(self.0, s.0).result() }
    }

    /// `cuMemFree` (waits for outstanding work itself).
    pub(crate) fn free(self, expect: Ctx) -> DResult<()> {
        check(expect, "cuMemFree");
        // SAFETY: as for `free_async`; cuMemFree waits for outstanding work itself.
        unsafe { sys::cuMemFree_v2(self.0).result() }
    }
}

/// A device ordinal resolved by the driver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Dev(sys::CUdevice);

impl Dev {
    /// A device that no driver resolved, for unit tests of tables that make no driver call.
    #[cfg(test)]
    pub(crate) fn for_test() -> Self {
        Dev(0)
    }
}

// ----------------------------------------------------------------------------------------------
// Library, devices, contexts.

static PRESENT: OnceLock<bool> = OnceLock::new();
static INIT: OnceLock<Result<(), DriverError>> = OnceLock::new();

/// Whether libcuda can be loaded. Checked before any other driver call (cudarc panics otherwise).
pub(crate) fn library_present() -> bool {
    // SAFETY: is_culib_present only tries to dlopen the driver library by its usual names.
    *PRESENT.get_or_init(|| unsafe { sys::is_culib_present() })
}

/// `cuInit(0)`, once per process. Must only be called after [`library_present`] returned true.
pub(crate) fn init() -> DResult<()> {
    debug_assert!(library_present());
    // SAFETY: the library is present (checked by callers); cuInit has no other precondition.
    *INIT.get_or_init(|| unsafe { sys::cuInit(0).result() })
}

pub(crate) fn driver_version() -> DResult<i32> {
    let mut v: c_int = 0;
    // SAFETY: writes one int.
    unsafe { sys::cuDriverGetVersion(&mut v).result()? };
    Ok(v)
}

pub(crate) fn device_count() -> DResult<i32> {
    let mut n: c_int = 0;
    // SAFETY: writes one int; needs only cuInit.
    unsafe { sys::cuDeviceGetCount(&mut n).result()? };
    Ok(n)
}

pub(crate) fn device_get(ordinal: i32) -> DResult<Dev> {
    let mut d = MaybeUninit::<sys::CUdevice>::uninit();
    // SAFETY: writes one CUdevice.
    unsafe {
        sys::cuDeviceGet(d.as_mut_ptr(), ordinal).result()?;
        Ok(Dev(d.assume_init()))
    }
}

fn c_buf_to_string(buf: &[c_char]) -> String {
    let bytes: Vec<u8> = buf
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

pub(crate) fn device_name(dev: Dev) -> DResult<String> {
    let mut buf = [0 as c_char; 256];
    // SAFETY: the driver writes at most `len` bytes, NUL-terminated.
    unsafe { sys::cuDeviceGetName(buf.as_mut_ptr(), buf.len() as c_int, dev.0).result()? };
    Ok(c_buf_to_string(&buf))
}

pub(crate) fn device_pci_bus_id(dev: Dev) -> DResult<String> {
    let mut buf = [0 as c_char; 64];
    // SAFETY: the driver writes at most `len` bytes, NUL-terminated.
    unsafe { sys::cuDeviceGetPCIBusId(buf.as_mut_ptr(), buf.len() as c_int, dev.0).result()? };
    Ok(c_buf_to_string(&buf))
}

pub(crate) fn device_total_mem(dev: Dev) -> DResult<usize> {
    let mut b: usize = 0;
    // SAFETY: writes one usize.
    unsafe { sys::cuDeviceTotalMem_v2(&mut b, dev.0).result()? };
    Ok(b)
}

/// The device's multiprocessor count (needs only `cuInit`).
pub(crate) fn device_sm_count(dev: Dev) -> DResult<u32> {
    let mut n: c_int = 0;
    // SAFETY: writes one int.
    unsafe {
        sys::cuDeviceGetAttribute(
            &mut n,
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            dev.0,
        )
        .result()?
    };
    Ok(n.max(0) as u32)
}

/// Retains `dev`'s primary context; the retain is released by [`PrimaryCtx::release`].
pub(crate) fn primary_ctx_retain(dev: Dev) -> DResult<PrimaryCtx> {
    let mut c = MaybeUninit::<sys::CUcontext>::uninit();
    // SAFETY: `dev` came from cuDeviceGet; writes one context handle.
    unsafe {
        sys::cuDevicePrimaryCtxRetain(c.as_mut_ptr(), dev.0).result()?;
        Ok(PrimaryCtx {
            dev,
            ctx: Ctx(c.assume_init()),
        })
    }
}

pub(crate) fn ctx_set_current(ctx: Ctx) -> DResult<()> {
    // SAFETY: `ctx` is a retained primary context (or null, which unbinds).
    unsafe { sys::cuCtxSetCurrent(ctx.0).result() }
}

pub(crate) fn ctx_unbind() -> DResult<()> {
    // SAFETY: binding null unbinds the calling thread.
    unsafe { sys::cuCtxSetCurrent(std::ptr::null_mut()).result() }
}

pub(crate) fn ctx_current() -> DResult<Option<Ctx>> {
    let c = current_raw()?;
    Ok(if c == 0 {
        None
    } else {
        Some(Ctx(c as sys::CUcontext))
    })
}

pub(crate) fn ctx_synchronize(expect: Ctx) -> DResult<()> {
    check(expect, "cuCtxSynchronize");
    // SAFETY: no arguments.
    unsafe { sys::cuCtxSynchronize().result() }
}

pub(crate) fn mem_get_info(expect: Ctx) -> DResult<(usize, usize)> {
    check(expect, "cuMemGetInfo");
    let (mut f, mut t) = (0usize, 0usize);
    // SAFETY: writes two usizes.
    unsafe { sys::cuMemGetInfo_v2(&mut f, &mut t).result()? };
    Ok((f, t))
}

// ----------------------------------------------------------------------------------------------
// Streams and events.

/// The context's stream priority range as `(least, greatest)` (`cuCtxGetStreamPriorityRange`:
/// lower numbers are more urgent, so `greatest <= least`; both 0 where priorities are not
/// supported).
pub(crate) fn stream_priority_range(expect: Ctx) -> DResult<(i32, i32)> {
    check(expect, "cuCtxGetStreamPriorityRange");
    let (mut least, mut greatest) = (0i32, 0i32);
    // SAFETY: writes two integers.
    unsafe { sys::cuCtxGetStreamPriorityRange(&mut least, &mut greatest).result()? };
    Ok((least, greatest))
}

/// The priority `s` was created with, as the driver reports it (`cuStreamGetPriority`).
pub(crate) fn stream_get_priority(expect: Ctx, s: StreamRef) -> DResult<i32> {
    check(expect, "cuStreamGetPriority");
    let mut p = 0i32;
    // SAFETY: crate invariant: `s` is live; writes one integer.
    unsafe { sys::cuStreamGetPriority(s.0, &mut p).result()? };
    Ok(p)
}

pub(crate) fn stream_synchronize(expect: Ctx, s: StreamRef) -> DResult<()> {
    check(expect, "cuStreamSynchronize");
    // SAFETY: crate invariant: `s` is live.
    unsafe { sys::cuStreamSynchronize(s.0).result() }
}

/// `Ok(true)` when all work enqueued on `s` is complete, `Ok(false)` when not yet.
pub(crate) fn stream_query(expect: Ctx, s: StreamRef) -> DResult<bool> {
    check(expect, "cuStreamQuery");
    // SAFETY: crate invariant: `s` is live.
    match unsafe { sys::cuStreamQuery(s.0) } {
        sys::CUresult::CUDA_SUCCESS => Ok(true),
        sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
        other => Err(DriverError(other)),
    }
}

/// Writes `value` to the 4 bytes at device address `addr` once the work enqueued on `s` before
/// it has completed, after a memory fence (`cuStreamWriteValue32`): with `addr` a mapped host
/// word, a completion the host sees with a load instead of a driver call.
///
/// # Safety
/// `addr` must be a live, 4-byte aligned allocation the device can write (a mapped
/// [`HostAlloc`]'s address), alive until the write has happened.
pub(crate) unsafe fn stream_write_value32(
    expect: Ctx,
    s: StreamRef,
    addr: u64,
    value: u32,
) -> DResult<()> {
    check(expect, "cuStreamWriteValue32");
    // SAFETY: `s` is live (crate invariant); the address is the caller's contract; flags 0: the
    // default, a fence before the write.
    unsafe { sys::cuStreamWriteValue32_v2(s.0, addr, value, 0).result() }
}

// Events: boundpool's own owner ([`Event`], see the crate docs for why not cudarc's
// `CudaEvent`), over cudarc's `result::event` calls.

pub(crate) fn stream_wait_event(expect: Ctx, s: StreamRef, e: &Event) -> DResult<()> {
    check(expect, "cuStreamWaitEvent");
    // SAFETY: crate invariant: both handles are live.
    unsafe { result::stream::wait_event(s.0, e.0, sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT) }
}

pub(crate) fn event_create(expect: Ctx) -> DResult<Event> {
    check(expect, "cuEventCreate");
    result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING).map(Event)
}

pub(crate) fn event_record(expect: Ctx, e: &Event, s: StreamRef) -> DResult<()> {
    check(expect, "cuEventRecord");
    // SAFETY: crate invariant: both handles are live and of the same context.
    unsafe { result::event::record(e.0, s.0) }
}

/// An event that records a timestamp (for the trace's GPU stream tracks and a replay's launch
/// probe only: timing events cost more to record than the crate's usual ones).
pub(crate) fn event_create_timed(expect: Ctx) -> DResult<Event> {
    check(expect, "cuEventCreate");
    result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT).map(Event)
}

/// Milliseconds from `start` to `end`, two completed timing events of the same context.
pub(crate) fn event_elapsed_ms(expect: Ctx, start: &Event, end: &Event) -> DResult<f32> {
    check(expect, "cuEventElapsedTime");
    // SAFETY: both are live timing events of this context (crate invariant).
    unsafe { result::event::elapsed(start.0, end.0) }
}

/// Blocks until the event's work is complete.
pub(crate) fn event_synchronize(expect: Ctx, e: &Event) -> DResult<()> {
    check(expect, "cuEventSynchronize");
    // SAFETY: crate invariant: `e` is live.
    unsafe { result::event::synchronize(e.0) }
}

/// `Ok(true)` when the event's work is complete, `Ok(false)` when not yet.
pub(crate) fn event_query(expect: Ctx, e: &Event) -> DResult<bool> {
    check(expect, "cuEventQuery");
    // SAFETY: crate invariant: `e` is live.
    match unsafe { result::event::query(e.0) } {
        Ok(()) => Ok(true),
        Err(DriverError(sys::CUresult::CUDA_ERROR_NOT_READY)) => Ok(false),
        Err(other) => Err(other),
    }
}

// ----------------------------------------------------------------------------------------------
// Modules and launches: cudarc's `CudaModule`, `CudaFunction` and `result::launch_kernel`,
// behind the context check.

/// Loads `ptx` into `cuda`'s context (`cuModuleLoadData`, through cudarc's `load_module`, which
/// finds the context already bound). The module is unloaded when its last `Arc` drops (cudarc's
/// drop, on the dropping thread): the crate keeps every `Arc` in its device's and workers'
/// tables and drops the last one with [`module_release`] on the device's last worker.
pub(crate) fn module_load(
    expect: Ctx,
    cuda: &Arc<CudaContext>,
    ptx: Ptx,
) -> DResult<Arc<CudaModule>> {
    check(expect, "cuModuleLoadData");
    cuda.load_module(ptx)
}

/// The function `name` (no NUL byte: cudarc panics on one) of `m` (`cuModuleGetFunction`).
pub(crate) fn module_function(
    expect: Ctx,
    m: &Arc<CudaModule>,
    name: &str,
) -> DResult<CudaFunction> {
    check(expect, "cuModuleGetFunction");
    m.load_function(name)
}

/// Drops the device table's `Arc` of a module, the last one once every worker has dropped its
/// functions (which hold one each): cudarc's drop then unloads it (`cuModuleUnload`) here, on a
/// bound worker of its device.
pub(crate) fn module_release(expect: Ctx, m: Arc<CudaModule>) {
    if Arc::strong_count(&m) == 1 {
        check(expect, "cuModuleUnload");
    }
    drop(m);
}

/// Launches `f` on `s` (`cuLaunchKernel` through cudarc's `result::launch_kernel`, without the
/// launch builder's per-launch `Vec` and context bind: the worker's context is bound for life,
/// and checked here when checking is on). `params` holds one pointer per kernel parameter, to a
/// value of the parameter's type; the driver copies the values at the call.
///
/// # Safety
/// `params` must hold one pointer per kernel parameter, in order, each valid for reads of the
/// parameter's size for the call; device memory the kernel accesses must stay valid until it
/// ends.
pub(crate) unsafe fn launch_kernel(
    expect: Ctx,
    f: &CudaFunction,
    grid: (u32, u32, u32),
    block: (u32, u32, u32),
    shared_mem: u32,
    s: StreamRef,
    params: &mut [*mut c_void],
) -> DResult<()> {
    check(expect, "cuLaunchKernel");
    green::check_partition(s, "cuLaunchKernel");
    // SAFETY: forwarded from the caller's contract; `f` is a loaded function (its module lives
    // while `f` does) and `s` a live stream of the same context (crate invariant).
    unsafe { result::launch_kernel(f.cu_function(), grid, block, shared_mem, s.0, params) }
}

// ----------------------------------------------------------------------------------------------
// Memory.

/// Allocates `bytes` (at least 1) stream-ordered on `s`.
pub(crate) fn mem_alloc_async(expect: Ctx, bytes: usize, s: StreamRef) -> DResult<DeviceAlloc> {
    check(expect, "cuMemAllocAsync");
    green::check_partition(s, "cuMemAllocAsync");
    let mut p = MaybeUninit::<sys::CUdeviceptr>::uninit();
    // SAFETY: writes one device pointer; `s` is live.
    unsafe {
        sys::cuMemAllocAsync(p.as_mut_ptr(), bytes.max(1), s.0).result()?;
        Ok(DeviceAlloc(p.assume_init()))
    }
}

/// Trims the device's default memory pool to zero unused bytes.
pub(crate) fn mempool_trim(expect: Ctx, dev: Dev) -> DResult<()> {
    check(expect, "cuMemPoolTrimTo");
    let mut pool = MaybeUninit::<sys::CUmemoryPool>::uninit();
    // SAFETY: writes one pool handle, then trims it; the pool is owned by the device.
    unsafe {
        sys::cuDeviceGetDefaultMemPool(pool.as_mut_ptr(), dev.0).result()?;
        sys::cuMemPoolTrimTo(pool.assume_init(), 0).result()
    }
}

// Peers: copies between devices (or pools) and direct access to another device's memory.

/// Whether a kernel on `dev` can read and write memory of `peer` directly
/// (`cuDeviceCanAccessPeer`; false for a device and itself).
pub(crate) fn device_can_access_peer(dev: Dev, peer: Dev) -> DResult<bool> {
    if dev == peer {
        return Ok(false);
    }
    let mut can: c_int = 0;
    // SAFETY: writes one int; both devices were resolved by the driver.
    unsafe { sys::cuDeviceCanAccessPeer(&mut can, dev.0, peer.0).result()? };
    Ok(can != 0)
}

/// Lets `reader` read and write the allocations of `owner`'s default memory pool (where
/// `cuMemAllocAsync` allocates: peer access to pool memory is the pool's setting, not
/// `cuCtxEnablePeerAccess`'s), `cuMemPoolSetAccess`.
pub(crate) fn mempool_grant_access(expect: Ctx, owner: Dev, reader: Dev) -> DResult<()> {
    check(expect, "cuMemPoolSetAccess");
    let mut pool = MaybeUninit::<sys::CUmemoryPool>::uninit();
    let desc = sys::CUmemAccessDesc {
        location: sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: reader.0,
        },
        flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    };
    // SAFETY: writes one pool handle (the device's own), then sets one access descriptor
    // read from `desc`, which lives for the call.
    unsafe {
        sys::cuDeviceGetDefaultMemPool(pool.as_mut_ptr(), owner.0).result()?;
        sys::cuMemPoolSetAccess(pool.assume_init(), &desc, 1).result()
    }
}

/// Copies `bytes` from `src` (an allocation of context `src_ctx`) to `dst` (of `dst_ctx`, the
/// current one), ordered on `s`, a stream of `dst_ctx` (`cuMemcpyPeerAsync`: direct between
/// the devices where they can reach each other, else through host memory by the driver).
///
/// # Safety
/// Both ranges must be live allocations of at least `bytes`, of their contexts, until the copy
/// completes.
pub(crate) unsafe fn memcpy_peer_async(
    dst_ctx: Ctx,
    dst: u64,
    src_ctx: Ctx,
    src: u64,
    bytes: usize,
    s: StreamRef,
) -> DResult<()> {
    check(dst_ctx, "cuMemcpyPeerAsync");
    green::check_partition(s, "cuMemcpyPeerAsync");
    // SAFETY: forwarded from the caller's contract; both contexts are live views.
    unsafe { sys::cuMemcpyPeerAsync(dst, dst_ctx.0, src, src_ctx.0, bytes, s.0).result() }
}

/// Copies `bytes` from host `src` to device `dst`, ordered on `s`.
///
/// # Safety
/// `src` must be valid for `bytes` reads until the call returns (pageable memory is staged
/// before return; pinned memory must live until the copy completes). `dst` must be a live
/// allocation of at least `bytes`.
pub(crate) unsafe fn memcpy_htod_async(
    expect: Ctx,
    dst: u64,
    src: *const u8,
    bytes: usize,
    s: StreamRef,
) -> DResult<()> {
    check(expect, "cuMemcpyHtoDAsync");
    green::check_partition(s, "cuMemcpyHtoDAsync");
    // SAFETY: forwarded from the caller's contract.
    unsafe { sys::cuMemcpyHtoDAsync_v2(dst, src as *const c_void, bytes, s.0).result() }
}

/// Copies `bytes` from device `src` to host `dst`, ordered on `s`.
///
/// # Safety
/// `dst` must be valid for `bytes` writes until the copy completes (for pageable memory the
/// driver returns only once it has). `src` must be a live allocation of at least `bytes`.
pub(crate) unsafe fn memcpy_dtoh_async(
    expect: Ctx,
    dst: *mut u8,
    src: u64,
    bytes: usize,
    s: StreamRef,
) -> DResult<()> {
    check(expect, "cuMemcpyDtoHAsync");
    green::check_partition(s, "cuMemcpyDtoHAsync");
    // SAFETY: forwarded from the caller's contract.
    unsafe { sys::cuMemcpyDtoHAsync_v2(dst as *mut c_void, src, bytes, s.0).result() }
}

/// Page-locked host memory (`cuMemHostAlloc`): an owner, freed by consuming it.
pub(crate) struct HostAlloc {
    ptr: *mut c_void,
    bytes: usize,
    /// Its address for kernels (mapped into the device's address space).
    device_ptr: u64,
}

// SAFETY: an address of host memory no one else frees; access is ordered by its users.
unsafe impl Send for HostAlloc {}
// SAFETY: as for `Send`: the owner only hands out the address.
unsafe impl Sync for HostAlloc {}

impl fmt::Debug for HostAlloc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HostAlloc({:p}, {} bytes)", self.ptr, self.bytes)
    }
}

impl HostAlloc {
    pub(crate) fn ptr(&self) -> *mut u8 {
        self.ptr as *mut u8
    }

    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// The address a kernel reads and writes it through (zero-copy, over the bus).
    pub(crate) fn device_ptr(&self) -> u64 {
        self.device_ptr
    }

    /// Frees it. No copy into or out of it may still be in flight.
    pub(crate) fn free(self, expect: Ctx) -> DResult<()> {
        check(expect, "cuMemFreeHost");
        // SAFETY: allocated by `mem_host_alloc`, freed once (consumed).
        unsafe { sys::cuMemFreeHost(self.ptr).result() }
    }
}

/// `bytes` (at least 1) of page-locked host memory, contents undefined.
pub(crate) fn mem_host_alloc(expect: Ctx, bytes: usize) -> DResult<HostAlloc> {
    check(expect, "cuMemHostAlloc");
    let mut ptr: *mut c_void = std::ptr::null_mut();
    // Portable: page-locked for every context of the device (the green contexts of SM
    // partitions too, whose copies would otherwise stage it as pageable memory); mapped: a
    // kernel can read and write it directly.
    let flags = sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP;
    // SAFETY: an out-pointer for the address; cached memory (no write-combining).
    unsafe { sys::cuMemHostAlloc(&mut ptr, bytes.max(1), flags).result()? };
    let mut device_ptr: sys::CUdeviceptr = 0;
    // SAFETY: `ptr` was just allocated mapped; writes one device address.
    let mapped = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device_ptr, ptr, 0).result() };
    if let Err(e) = mapped {
        // SAFETY: allocated above, freed once here.
        let _ = unsafe { sys::cuMemFreeHost(ptr).result() };
        return Err(e);
    }
    Ok(HostAlloc {
        ptr,
        bytes,
        device_ptr,
    })
}

/// Device-to-device copy ordered on `s`.
///
/// # Safety
/// Both ranges must be live allocations of at least `bytes`.
pub(crate) unsafe fn memcpy_dtod_async(
    expect: Ctx,
    dst: u64,
    src: u64,
    bytes: usize,
    s: StreamRef,
) -> DResult<()> {
    check(expect, "cuMemcpyDtoDAsync");
    green::check_partition(s, "cuMemcpyDtoDAsync");
    // SAFETY: forwarded from the caller's contract.
    unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, bytes, s.0).result() }
}

/// Sets `bytes` bytes at `dst` to `value`, ordered on `s`.
///
/// # Safety
/// `dst` must be a live allocation of at least `bytes`.
pub(crate) unsafe fn memset_d8_async(
    expect: Ctx,
    dst: u64,
    value: u8,
    bytes: usize,
    s: StreamRef,
) -> DResult<()> {
    check(expect, "cuMemsetD8Async");
    green::check_partition(s, "cuMemsetD8Async");
    // SAFETY: forwarded from the caller's contract.
    unsafe { sys::cuMemsetD8Async(dst, value, bytes, s.0).result() }
}

// ----------------------------------------------------------------------------------------------
// Errors.

/// `CUDA_ERROR_...` name of a driver error (the enum's name where there is no driver to ask:
/// cudarc would panic).
pub(crate) fn error_name(e: DriverError) -> String {
    if !library_present() {
        return format!("{:?}", e.0);
    }
    e.error_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|_| format!("CUresult {}", e.0 as i32))
}

/// The driver's description of an error (empty where there is no driver to ask).
pub(crate) fn error_string(e: DriverError) -> String {
    if !library_present() {
        return String::new();
    }
    e.error_string()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Numeric code of a driver error.
pub(crate) fn error_code(e: DriverError) -> i32 {
    e.0 as i32
}

pub(crate) fn is_out_of_memory(e: DriverError) -> bool {
    e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY
}

/// `cuInit` found a driver but no device.
pub(crate) fn is_no_device(e: DriverError) -> bool {
    e.0 == sys::CUresult::CUDA_ERROR_NO_DEVICE
}

/// Errors after which the context is unusable ("sticky"): every later call in it fails.
pub(crate) fn is_sticky(e: DriverError) -> bool {
    use sys::CUresult::*;
    matches!(
        e.0,
        CUDA_ERROR_ILLEGAL_ADDRESS
            | CUDA_ERROR_LAUNCH_FAILED
            | CUDA_ERROR_HARDWARE_STACK_ERROR
            | CUDA_ERROR_ILLEGAL_INSTRUCTION
            | CUDA_ERROR_MISALIGNED_ADDRESS
            | CUDA_ERROR_INVALID_ADDRESS_SPACE
            | CUDA_ERROR_INVALID_PC
            | CUDA_ERROR_ECC_UNCORRECTABLE
            | CUDA_ERROR_ASSERT
            | CUDA_ERROR_CONTEXT_IS_DESTROYED
            | CUDA_ERROR_LAUNCH_TIMEOUT
    )
}

/// Errors by which the driver refuses a call made while a stream captures (a call that would
/// synchronise, or one a CUDA graph cannot hold), or reports the capture broken by one.
pub(crate) fn is_capture_refusal(e: DriverError) -> bool {
    use sys::CUresult::*;
    matches!(
        e.0,
        CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
            | CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
            | CUDA_ERROR_STREAM_CAPTURE_MERGE
            | CUDA_ERROR_STREAM_CAPTURE_UNMATCHED
            | CUDA_ERROR_STREAM_CAPTURE_UNJOINED
            | CUDA_ERROR_STREAM_CAPTURE_ISOLATION
            | CUDA_ERROR_STREAM_CAPTURE_IMPLICIT
            | CUDA_ERROR_CAPTURED_EVENT
            | CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD
    )
}

/// The first sticky driver error in `e`'s source chain, `e` itself first: what a node body
/// returns when a cudarc call in it hit one (a `DriverError`, bare or wrapped: in a
/// [`GpuError`](crate::GpuError), or in any error whose `source()` leads to it).
pub(crate) fn sticky_in(e: &(dyn std::error::Error + 'static)) -> Option<DriverError> {
    // Bounded: a chain is short, and a cyclic one must not hang a worker.
    std::iter::successors(Some(e), |x| x.source())
        .take(32)
        .filter_map(|x| x.downcast_ref::<DriverError>())
        .copied()
        .find(|d| is_sticky(*d))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fails to compile if `T` is `Copy` or `Clone`: with both impls below applicable, the
    /// type parameter of `AmbiguousIfImpl` cannot be inferred (the `static_assertions`
    /// `assert_not_impl_any!` trick).
    macro_rules! assert_not_copy_or_clone {
        ($($t:ty),*) => { $({
            trait AmbiguousIfImpl<A> {
                fn some_item() {}
            }
            impl<T: ?Sized> AmbiguousIfImpl<()> for T {}
            #[allow(dead_code)]
            struct Invalid;
            impl<T: ?Sized + Clone> AmbiguousIfImpl<Invalid> for T {}
            let _ = <$t as AmbiguousIfImpl<_>>::some_item;
        })* };
    }

    /// Owners of driver handles are neither `Copy` nor `Clone` (`Copy` implies `Clone`), so
    /// every destroy, which takes `self`, happens at most once per handle: a second
    /// `s.destroy(ctx)` is a use of a moved value. Checked at compile time: this test exists
    /// to build.
    #[test]
    fn owners_are_not_copy_or_clone() {
        assert_not_copy_or_clone!(
            PrimaryCtx,
            Event,
            DeviceAlloc,
            HostAlloc,
            CudaGraph,
            GraphExec
        );
    }

    /// A sticky error is found bare, inside a `GpuError`, or deeper in a source chain; others
    /// are not sticky (no driver needed: nothing here calls it).
    #[test]
    fn sticky_errors_are_found_in_source_chains() {
        use sys::CUresult::*;
        #[derive(Debug)]
        struct Wrap(Box<dyn std::error::Error + Send + Sync>);
        impl std::fmt::Display for Wrap {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("wrapped")
            }
        }
        impl std::error::Error for Wrap {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&*self.0)
            }
        }
        let illegal = DriverError(CUDA_ERROR_ILLEGAL_ADDRESS);
        assert_eq!(sticky_in(&illegal), Some(illegal));
        let launch = crate::GpuError::driver("x", "y", DriverError(CUDA_ERROR_LAUNCH_FAILED));
        assert_eq!(
            sticky_in(&launch),
            Some(DriverError(CUDA_ERROR_LAUNCH_FAILED))
        );
        let deep = Wrap(Box::new(Wrap(Box::new(illegal))));
        assert_eq!(sticky_in(&deep), Some(illegal));
        let oom = Wrap(Box::new(DriverError(CUDA_ERROR_OUT_OF_MEMORY)));
        assert_eq!(sticky_in(&oom), None);
        assert_eq!(sticky_in(&std::fmt::Error), None);
    }

    /// Views are `Copy` and carry no destroy; they are only made here, from an owner.
    #[test]
    fn views_are_copy() {
        fn copy<T: Copy>() {}
        copy::<Ctx>();
        copy::<StreamRef>();
        copy::<CudaGraphNode>();
    }
}
