//! The driver calls the raw-driver baselines ([`crate::baselines`]) and the probe
//! ([`crate::probe`]) make themselves, on cudarc's own layers. What must be destroyed is owned
//! by cudarc's safe types: the device's primary context (`CudaContext`), streams
//! (`CudaStream`), events (`CudaEvent`), modules and their functions (`CudaModule`,
//! `CudaFunction`), the probe's buffers (`CudaSlice`). The calls a baseline measures are
//! cudarc's `result` calls on their handles (`result::launch_kernel`, `result::event::record`,
//! ...), through the thin wrappers below: cudarc's safe methods would bind the context and
//! track events at each call, and a baseline measures the bare driver call.
//!
//! CUDA graphs: cudarc has captured-and-instantiated ones only (`CudaStream::end_capture`), so
//! a template (captured, or built node by node) is `boundpool-gpu`'s [`CudaGraphTemplate`],
//! read and edited through its methods and [`boundpool_gpu::CaptureExt`] (a capture's
//! dependencies, its end as a template): the same calls the replay's capture makes. A capture
//! begins with cudarc's `CudaStream::begin_capture`; instantiating and launching a template
//! are cudarc's `result::graph` calls, with [`GraphExec`] owning the executable.
//!
//! Every call here runs on a thread the caller has bound to the context it means (a baseline
//! binds its threads itself, [`bind`]).

use std::ffi::c_void;
use std::fmt;
use std::sync::Arc;

use boundpool_gpu::{CudaGraphNode, CudaGraphTemplate, GpuError};
use cudarc::driver::{result, sys, CudaContext, CudaEvent, CudaFunction, CudaModule, CudaStream};
use cudarc::nvrtc::Ptx;

pub use cudarc::driver::result::DriverError;

/// Result of one driver call.
pub type DResult<T> = std::result::Result<T, DriverError>;

/// Result of a baseline or the probe.
pub type Result<T> = std::result::Result<T, Error>;

/// Why a baseline or the probe failed: a message naming what failed (for a driver call, as
/// `boundpool-gpu` words it: who made it, the call and the driver's error name and string,
/// with the driver's error as the source).
#[derive(Debug)]
pub struct Error(Repr);

#[derive(Debug)]
enum Repr {
    /// Not a driver call's failure.
    Message(String),
    /// A driver call's, or `boundpool-gpu`'s.
    Gpu(GpuError),
}

impl Error {
    /// A failure that is not a driver call's.
    pub fn new(message: impl Into<String>) -> Self {
        Self(Repr::Message(message.into()))
    }

    /// The driver call `call`, made for `what`, failed with `e`.
    pub fn driver(call: &str, what: &str, e: DriverError) -> Self {
        Self(Repr::Gpu(GpuError::driver(call, what, e)))
    }

    /// Whether it is a driver error after which the context is unusable ("sticky": every later
    /// call in it fails), as `boundpool-gpu` sorts them.
    pub fn is_sticky(&self) -> bool {
        matches!(&self.0, Repr::Gpu(e) if e.is_sticky())
    }

    /// The message (same as `Display`).
    pub fn message(&self) -> &str {
        match &self.0 {
            Repr::Message(m) => m,
            Repr::Gpu(e) => e.message(),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message())
    }
}

impl std::error::Error for Error {
    /// The driver's error of a failed call (what `GpuError` holds beneath the same message).
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.0 {
            Repr::Message(_) => None,
            Repr::Gpu(e) => std::error::Error::source(e),
        }
    }
}

impl From<GpuError> for Error {
    fn from(e: GpuError) -> Self {
        Self(Repr::Gpu(e))
    }
}

/// `CUDA_ERROR_...` name of a driver error.
pub fn error_name(e: DriverError) -> String {
    e.error_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|_| format!("CUresult {}", e.0 as i32))
}

/// Out of device memory.
pub fn is_out_of_memory(e: DriverError) -> bool {
    e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY
}

// ----------------------------------------------------------------------------------------------
// Contexts.

/// Device `ordinal`'s primary context (cudarc's `CudaContext::new`: a retain), made on a thread
/// of its own (cudarc binds the thread that makes it), so that the caller's stays unbound; its
/// event tracking off (every stream here is synchronised explicitly). Call only where
/// `boundpool_gpu::device_count` succeeded: cudarc panics when libcuda is missing.
pub fn open_primary(ordinal: i32) -> DResult<Arc<CudaContext>> {
    let made = std::thread::scope(|s| {
        s.spawn(|| {
            let ctx = CudaContext::new(ordinal.max(0) as usize);
            let _ = unbind();
            ctx
        })
        .join()
    });
    let ctx = made.unwrap_or(Err(DriverError(sys::CUresult::CUDA_ERROR_UNKNOWN)))?;
    // SAFETY: nothing here relies on cudarc ordering streams by events: the baselines and the
    // probe synchronise every stream they use before its results are read or its memory freed.
    unsafe { ctx.disable_event_tracking() };
    Ok(ctx)
}

/// Binds `ctx` to the calling thread (`cuCtxSetCurrent`).
pub fn bind(ctx: &CudaContext) -> DResult<()> {
    // SAFETY: `ctx` is a live context (the borrow keeps its retain).
    unsafe { result::ctx::set_current(ctx.cu_ctx()) }
}

/// Unbinds the calling thread.
pub fn unbind() -> DResult<()> {
    // SAFETY: binding null unbinds the calling thread.
    unsafe { result::ctx::set_current(std::ptr::null_mut()) }
}

/// The calling thread's current context, if any.
pub fn current() -> DResult<Option<sys::CUcontext>> {
    result::ctx::get_current()
}

/// `cuCtxSynchronize`.
pub fn ctx_synchronize() -> DResult<()> {
    result::ctx::synchronize()
}

/// Free and total device memory.
pub fn mem_get_info() -> DResult<(usize, usize)> {
    result::mem_get_info()
}

// ----------------------------------------------------------------------------------------------
// Streams and events: cudarc's, made by `CudaContext::new_stream` / `new_event`; the calls.

/// `cuStreamSynchronize`.
pub fn stream_synchronize(s: &CudaStream) -> DResult<()> {
    // SAFETY: `s` is live while borrowed.
    unsafe { result::stream::synchronize(s.cu_stream()) }
}

/// Makes `s` wait for `e`'s last record.
pub fn stream_wait_event(s: &CudaStream, e: &CudaEvent) -> DResult<()> {
    // SAFETY: both are live while borrowed.
    unsafe {
        result::stream::wait_event(
            s.cu_stream(),
            e.cu_event(),
            sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
        )
    }
}

/// Records `e` on `s`.
pub fn event_record(e: &CudaEvent, s: &CudaStream) -> DResult<()> {
    // SAFETY: both are live while borrowed, and of one context (the caller's).
    unsafe { result::event::record(e.cu_event(), s.cu_stream()) }
}

/// `Ok(true)` when the event's work is complete, `Ok(false)` when not yet.
pub fn event_query(e: &CudaEvent) -> DResult<bool> {
    // SAFETY: `e` is live while borrowed.
    match unsafe { result::event::query(e.cu_event()) } {
        Ok(()) => Ok(true),
        Err(DriverError(sys::CUresult::CUDA_ERROR_NOT_READY)) => Ok(false),
        Err(other) => Err(other),
    }
}

// ----------------------------------------------------------------------------------------------
// Modules and launches.

/// Loads the PTX text `ptx` into `ctx` (cudarc's `load_module`; unloaded when its last `Arc`,
/// its functions' included, is dropped: synchronise first).
pub fn load_ptx(ctx: &Arc<CudaContext>, ptx: &str) -> DResult<Arc<CudaModule>> {
    ctx.load_module(Ptx::from_src(ptx))
}

/// A kernel function's handle: a view, valid while the module it came from is loaded (a
/// `CudaFunction`'s, [`Func::of`], or a captured kernel node's, [`kernel_function`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Func(sys::CUfunction);

// SAFETY: a function handle is a plain identifier any thread may use (with its context
// current); the view destroys nothing.
unsafe impl Send for Func {}
// SAFETY: as above; a shared reference only reads the handle value.
unsafe impl Sync for Func {}

impl Func {
    /// The handle of `f`, valid while `f`'s module is loaded (while `f` or a clone lives).
    pub fn of(f: &CudaFunction) -> Self {
        Func(f.cu_function())
    }
}

/// Launches `f` on `s` through cudarc's `result::launch_kernel` (the call `boundpool-gpu`'s
/// launches make, without its context check): `params` holds one pointer per kernel parameter,
/// to a value of the parameter's type.
///
/// # Safety
/// `f`'s module must be loaded; `params` must hold one pointer per kernel parameter, in order,
/// each valid for reads of the parameter's size for the call; device pointers the kernel uses
/// must stay valid until it ends.
pub unsafe fn launch(
    f: Func,
    grid: (u32, u32, u32),
    block: (u32, u32, u32),
    shared_mem: u32,
    s: &CudaStream,
    params: &mut [*mut c_void],
) -> DResult<()> {
    // SAFETY: forwarded from the caller's contract; `s` is live while borrowed.
    unsafe { result::launch_kernel(f.0, grid, block, shared_mem, s.cu_stream(), params) }
}

// ----------------------------------------------------------------------------------------------
// CUDA graphs: templates are `boundpool-gpu`'s `CudaGraphTemplate`; the executable is cudarc's
// `result::graph` calls' (cudarc's safe layer has only captured-and-instantiated graphs).

/// An executable graph, owned: destroyed when dropped (an in-flight launch finishes first).
#[derive(Debug)]
pub struct GraphExec(sys::CUgraphExec);

// SAFETY: an executable may be launched from any thread with its context current, one call
// at a time (not `Sync`); it is destroyed only by its drop.
unsafe impl Send for GraphExec {}

impl GraphExec {
    /// Instantiates `g` (which stays the caller's), in the current context.
    pub fn instantiate(g: &CudaGraphTemplate) -> DResult<Self> {
        // SAFETY: `g` is live while borrowed; the executable is owned by the `GraphExec`
        // returned.
        unsafe { result::graph::instantiate(g.cu_graph(), sys::CUgraphInstantiate_flags(0)) }
            .map(GraphExec)
    }

    /// Launches the executable on `s`.
    pub fn launch(&self, s: &CudaStream) -> DResult<()> {
        // SAFETY: both handles are live while borrowed.
        unsafe { result::graph::launch(self.0, s.cu_stream()) }
    }
}

impl Drop for GraphExec {
    fn drop(&mut self) {
        // SAFETY: owned, destroyed once (here).
        let _ = unsafe { result::graph::exec_destroy(self.0) };
    }
}

/// Adds a kernel node of `f` (no parameters, `<<<1,1>>>`) after `deps`, nodes of `g`.
///
/// # Safety
/// Every node of `deps` must be a node of `g`; `f` must be a function of a module loaded in
/// the current context while `g` or an executable of it may run, with no parameters.
pub unsafe fn add_empty_kernel(
    g: &mut CudaGraphTemplate,
    deps: &[CudaGraphNode],
    f: Func,
) -> boundpool_gpu::GpuResult<CudaGraphNode> {
    let params = sys::CUDA_KERNEL_NODE_PARAMS {
        func: f.0,
        gridDimX: 1,
        gridDimY: 1,
        gridDimZ: 1,
        blockDimX: 1,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: 0,
        kernelParams: std::ptr::null_mut(),
        extra: std::ptr::null_mut(),
        kern: std::ptr::null_mut(),
        ctx: std::ptr::null_mut(),
    };
    // SAFETY: forwarded from the caller's contract; the kernel takes no parameters, and null
    // `kern` and `ctx` mean "use `func`" in the current context.
    unsafe { g.add_kernel_node(deps, &params) }
}

/// The function of `node`, a kernel node of `g`; `None` for another node.
///
/// # Safety
/// `node` must be a node of `g`.
pub unsafe fn kernel_function(
    g: &CudaGraphTemplate,
    node: CudaGraphNode,
) -> boundpool_gpu::GpuResult<Option<Func>> {
    // SAFETY: forwarded from the caller's contract.
    Ok(unsafe { g.kernel_node_params(node)? }.map(|p| Func(p.func)))
}
