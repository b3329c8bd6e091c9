//! The driver calls the raw-driver baselines ([`crate::baselines`]) and the probe
//! ([`crate::probe`]) make themselves, on cudarc's own layers: `cudarc::driver::result` where it
//! has the call (kernel launches included: `result::launch_kernel`, as `boundpool-gpu`'s),
//! `cudarc::driver::sys` where it does not (graphs built node by node, capture
//! dependencies). cudarc's safe
//! types (`CudaContext`, `CudaStream`) do not fit here: each of their calls binds the context
//! first and tracks events, and a baseline measures the bare driver call.
//!
//! Every call here runs on a thread the caller has bound to the context it means (a baseline
//! binds its threads itself). A handle that must be destroyed comes out as an *owner*
//! ([`PrimaryCtx`], [`Stream`], [`Event`], [`Module`], [`DeviceAlloc`], [`CudaGraph`],
//! [`GraphExec`]): not `Copy` nor `Clone`, destroyed by a method that consumes it; whoever only
//! names a handle gets a `Copy` *view* ([`Ctx`], [`StreamRef`], [`Func`], [`GraphNode`]).

use std::ffi::{c_void, CStr, CString};
use std::fmt;
use std::mem::MaybeUninit;

use cudarc::driver::{result, sys};

pub use cudarc::driver::result::DriverError;

/// Result of one driver call.
pub type DResult<T> = std::result::Result<T, DriverError>;

/// Result of a baseline or the probe.
pub type Result<T> = std::result::Result<T, Error>;

/// Why a baseline or the probe failed: a message naming what failed (for a driver call: who
/// made it, the call and the driver's error name and string, as `boundpool-gpu` words them).
#[derive(Debug)]
pub struct Error {
    message: String,
    driver: Option<DriverError>,
}

impl Error {
    /// A failure that is not a driver call's.
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            driver: None,
        }
    }

    /// The driver call `call`, made for `what`, failed with `e`.
    pub fn driver(call: &str, what: &str, e: DriverError) -> Self {
        let mut msg = String::new();
        if !what.is_empty() {
            msg.push_str(what);
            msg.push_str(": ");
        }
        msg.push_str(call);
        msg.push_str(" failed: ");
        msg.push_str(&error_name(e));
        let s = error_string(e);
        if !s.is_empty() {
            msg.push_str(" (");
            msg.push_str(&s);
            msg.push(')');
        }
        Self {
            message: msg,
            driver: Some(e),
        }
    }

    /// The message (same as `Display`).
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.driver
            .as_ref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

impl From<boundpool_gpu::GpuError> for Error {
    fn from(e: boundpool_gpu::GpuError) -> Self {
        Self::new(e.message())
    }
}

/// `CUDA_ERROR_...` name of a driver error.
pub fn error_name(e: DriverError) -> String {
    e.error_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|_| format!("CUresult {}", e.0 as i32))
}

/// The driver's description of an error.
pub fn error_string(e: DriverError) -> String {
    e.error_string()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Out of device memory.
pub fn is_out_of_memory(e: DriverError) -> bool {
    e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY
}

/// Errors after which the context is unusable ("sticky"): every later call in it fails. The
/// same list as `boundpool-gpu`'s.
pub fn is_sticky(e: DriverError) -> bool {
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

// ----------------------------------------------------------------------------------------------
// Handles.

/// Implements `Send` and `Sync` for a handle type.
macro_rules! send_sync {
    ($($name:ident),*) => { $(
        // SAFETY: driver handles are plain identifiers that the driver lets any thread use
        // (with the right context current); an owner is destroyed only by value.
        unsafe impl Send for $name {}
        // SAFETY: as above; a shared reference only reads the handle value.
        unsafe impl Sync for $name {}
    )* };
}

/// A device's primary context: a view, owned by the [`PrimaryCtx`] that retained it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ctx(sys::CUcontext);

/// One retain of a device's primary context, released once by [`PrimaryCtx::release`].
#[derive(Debug)]
pub struct PrimaryCtx {
    dev: sys::CUdevice,
    ctx: Ctx,
}

/// A stream, owned; [`Stream::view`] is what launches take.
#[derive(Debug)]
pub struct Stream(sys::CUstream);

/// A view of a [`Stream`] (or of a stream someone else owns), valid while it lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamRef(sys::CUstream);

/// An event (timing disabled), owned.
#[derive(Debug)]
pub struct Event(sys::CUevent);

/// A loaded module, owned.
#[derive(Debug)]
pub struct Module(sys::CUmodule);

/// A kernel function of a loaded module: a view, valid while the module is loaded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Func(sys::CUfunction);

/// Device memory from `cuMemAllocAsync`, owned.
#[derive(Debug)]
pub struct DeviceAlloc(sys::CUdeviceptr);

/// A CUDA graph (a template), owned.
#[derive(Debug)]
pub struct CudaGraph(sys::CUgraph);

/// An executable graph, owned.
#[derive(Debug)]
pub struct GraphExec(sys::CUgraphExec);

/// A node of a CUDA graph: a view, valid while its graph lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GraphNode(sys::CUgraphNode);

send_sync!(
    Ctx, PrimaryCtx, Stream, StreamRef, Event, Module, Func, CudaGraph, GraphExec, GraphNode
);

impl PrimaryCtx {
    /// The retained context.
    pub fn ctx(&self) -> Ctx {
        self.ctx
    }

    /// Releases this retain.
    pub fn release(self) -> DResult<()> {
        // SAFETY: paired with the one successful retain that made `self`, consumed here.
        unsafe { result::primary_ctx::release(self.dev) }
    }
}

impl Stream {
    /// A view to enqueue on; valid while `self` lives.
    pub fn view(&self) -> StreamRef {
        StreamRef(self.0)
    }

    /// `cuStreamDestroy` (work already enqueued still completes).
    pub fn destroy(self) -> DResult<()> {
        // SAFETY: `self` is a live stream, consumed here: destroyed once.
        unsafe { result::stream::destroy(self.0) }
    }
}

impl StreamRef {
    /// A view of a stream the caller does not own (a pool node's, from
    /// `GpuCtx::raw_stream`), valid while its owner keeps it.
    pub fn from_raw(raw: u64) -> Self {
        StreamRef(raw as sys::CUstream)
    }
}

impl Event {
    /// `cuEventDestroy`.
    pub fn destroy(self) -> DResult<()> {
        // SAFETY: `self` is a live event, consumed here: destroyed once.
        unsafe { result::event::destroy(self.0) }
    }
}

impl Module {
    /// `cuModuleUnload`; its [`Func`]s must not be used after.
    pub fn unload(self) -> DResult<()> {
        // SAFETY: `self` is a live module, consumed here: unloaded once.
        unsafe { result::module::unload(self.0) }
    }
}

impl DeviceAlloc {
    /// The device address.
    pub fn addr(&self) -> u64 {
        self.0
    }

    /// `cuMemFreeAsync` on `s`.
    pub fn free_async(self, s: StreamRef) -> DResult<()> {
        // SAFETY: `self` came from cuMemAllocAsync and is consumed here: freed once; callers
        // order every use of it before this point on `s`.
        unsafe { result::free_async(self.0, s.0) }
    }
}

impl CudaGraph {
    /// `cuGraphDestroy`.
    pub fn destroy(self) -> DResult<()> {
        // SAFETY: `self` is owned and consumed here: destroyed once.
        unsafe { result::graph::destroy(self.0) }
    }
}

impl GraphExec {
    /// `cuGraphExecDestroy` (an in-flight launch finishes first).
    pub fn destroy(self) -> DResult<()> {
        // SAFETY: `self` is owned and consumed here: destroyed once.
        unsafe { result::graph::exec_destroy(self.0) }
    }
}

// ----------------------------------------------------------------------------------------------
// Devices and contexts.

/// Retains device `ordinal`'s primary context (after `cuInit`). Call only where
/// `boundpool_gpu::device_count` succeeded: cudarc panics when libcuda is missing.
pub fn primary_ctx_retain(ordinal: i32) -> DResult<PrimaryCtx> {
    result::init()?;
    let dev = result::device::get(ordinal)?;
    // SAFETY: `dev` came from cuDeviceGet; the retain is released by `PrimaryCtx::release`.
    let ctx = unsafe { result::primary_ctx::retain(dev)? };
    Ok(PrimaryCtx { dev, ctx: Ctx(ctx) })
}

/// Binds `ctx` to the calling thread.
pub fn ctx_set_current(ctx: Ctx) -> DResult<()> {
    // SAFETY: `ctx` is a retained primary context.
    unsafe { result::ctx::set_current(ctx.0) }
}

/// Unbinds the calling thread.
pub fn ctx_unbind() -> DResult<()> {
    // SAFETY: binding null unbinds the calling thread.
    unsafe { result::ctx::set_current(std::ptr::null_mut()) }
}

/// The calling thread's current context.
pub fn ctx_current() -> DResult<Option<Ctx>> {
    Ok(result::ctx::get_current()?.map(Ctx))
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
// Streams and events.

/// A non-blocking stream.
pub fn stream_create() -> DResult<Stream> {
    result::stream::create(result::stream::StreamKind::NonBlocking).map(Stream)
}

/// `cuStreamSynchronize`.
pub fn stream_synchronize(s: StreamRef) -> DResult<()> {
    // SAFETY: `s` is a view of a live stream (the views' contract).
    unsafe { result::stream::synchronize(s.0) }
}

/// Makes `s` wait for `e`'s last record.
pub fn stream_wait_event(s: StreamRef, e: &Event) -> DResult<()> {
    // SAFETY: both handles are live.
    unsafe { result::stream::wait_event(s.0, e.0, sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT) }
}

/// An event with timing disabled.
pub fn event_create() -> DResult<Event> {
    result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING).map(Event)
}

/// Records `e` on `s`.
pub fn event_record(e: &Event, s: StreamRef) -> DResult<()> {
    // SAFETY: both handles are live and of the same context.
    unsafe { result::event::record(e.0, s.0) }
}

/// `Ok(true)` when the event's work is complete, `Ok(false)` when not yet.
pub fn event_query(e: &Event) -> DResult<bool> {
    // SAFETY: `e` is live.
    match unsafe { result::event::query(e.0) } {
        Ok(()) => Ok(true),
        Err(DriverError(sys::CUresult::CUDA_ERROR_NOT_READY)) => Ok(false),
        Err(other) => Err(other),
    }
}

// ----------------------------------------------------------------------------------------------
// Modules and launches.

/// Loads the PTX text `ptx`.
pub fn module_load(ptx: &str) -> DResult<Module> {
    let image =
        CString::new(ptx).map_err(|_| DriverError(sys::CUresult::CUDA_ERROR_INVALID_IMAGE))?;
    // SAFETY: `image` is a NUL-terminated PTX text that outlives the call.
    unsafe { result::module::load_data(image.as_ptr() as *const c_void).map(Module) }
}

/// The function `name` of `m`.
pub fn module_function(m: &Module, name: &CStr) -> DResult<Func> {
    // SAFETY: `m` is live; the function is a view valid while `m` is loaded.
    unsafe { result::module::get_function(m.0, name.to_owned()).map(Func) }
}

/// Launches `f` on `s` through cudarc's `result::launch_kernel` (the call `boundpool-gpu`'s
/// launches make, without its context check): `params` holds one pointer per kernel parameter,
/// to a value of the parameter's type.
///
/// # Safety
/// `params` must hold one pointer per kernel parameter, in order, each valid for reads of the
/// parameter's size for the call; device pointers the kernel uses must stay valid until it
/// ends.
pub unsafe fn launch(
    f: Func,
    grid: (u32, u32, u32),
    block: (u32, u32, u32),
    shared_mem: u32,
    s: StreamRef,
    params: &mut [*mut c_void],
) -> DResult<()> {
    // SAFETY: forwarded from the caller's contract; `f` and `s` are live views.
    unsafe { result::launch_kernel(f.0, grid, block, shared_mem, s.0, params) }
}

// ----------------------------------------------------------------------------------------------
// Memory.

/// Allocates `bytes` (at least 1) stream-ordered on `s`.
pub fn mem_alloc_async(bytes: usize, s: StreamRef) -> DResult<DeviceAlloc> {
    // SAFETY: `s` is live; the allocation is owned by the `DeviceAlloc` returned.
    unsafe { result::malloc_async(s.0, bytes.max(1)).map(DeviceAlloc) }
}

/// Copies `src` to device `dst`, ordered on `s` (pageable memory: staged before return).
///
/// # Safety
/// `dst` must be a live allocation of at least `size_of_val(src)` bytes.
pub unsafe fn memcpy_htod_async<T>(dst: u64, src: &[T], s: StreamRef) -> DResult<()> {
    // SAFETY: forwarded from the caller's contract; `src` is valid for its length.
    unsafe { result::memcpy_htod_async(dst, src, s.0) }
}

/// Copies device `src` into `dst`, ordered on `s`.
///
/// # Safety
/// `src` must be a live allocation of at least `size_of_val(dst)` bytes, and `dst` must not be
/// read before the copy completes (a stream synchronise).
pub unsafe fn memcpy_dtoh_async<T>(dst: &mut [T], src: u64, s: StreamRef) -> DResult<()> {
    // SAFETY: forwarded from the caller's contract.
    unsafe { result::memcpy_dtoh_async(dst, src, s.0) }
}

/// Sets `bytes` bytes at `dst` to `value`, ordered on `s`.
///
/// # Safety
/// `dst` must be a live allocation of at least `bytes`.
pub unsafe fn memset_d8_async(dst: u64, value: u8, bytes: usize, s: StreamRef) -> DResult<()> {
    // SAFETY: forwarded from the caller's contract.
    unsafe { result::memset_d8_async(dst, value, bytes, s.0) }
}

// ----------------------------------------------------------------------------------------------
// CUDA graphs.

/// An empty graph (for graphs built node by node).
pub fn graph_create() -> DResult<CudaGraph> {
    let mut g: sys::CUgraph = std::ptr::null_mut();
    // SAFETY: writes one graph handle.
    unsafe { sys::cuGraphCreate(&mut g, 0).result()? };
    Ok(CudaGraph(g))
}

/// Removes `node`, a node of `g`, with its edges.
pub fn graph_remove_node(g: &mut CudaGraph, node: GraphNode) -> DResult<()> {
    let _ = g;
    // SAFETY: `node` is a node of `g` (the caller's contract, checked by the driver too), and
    // `&mut g` says no launch or instantiation of `g` runs meanwhile.
    unsafe { sys::cuGraphDestroyNode(node.0).result() }
}

/// Number of nodes of `g`.
pub fn graph_node_count(g: &CudaGraph) -> DResult<usize> {
    let mut n: usize = 0;
    // SAFETY: with a null node array the driver only writes the count.
    unsafe { sys::cuGraphGetNodes(g.0, std::ptr::null_mut(), &mut n).result()? };
    Ok(n)
}

/// Number of edges of `g`.
pub fn graph_edge_count(g: &CudaGraph) -> DResult<usize> {
    let mut n: usize = 0;
    // SAFETY: with null arrays the driver only writes the count.
    unsafe {
        sys::cuGraphGetEdges_v2(
            g.0,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            &mut n,
        )
        .result()?
    };
    Ok(n)
}

/// Adds a kernel node of `f` (no parameters, `<<<1,1>>>`) after `deps`.
pub fn graph_add_empty_kernel(
    g: &mut CudaGraph,
    deps: &[GraphNode],
    f: Func,
) -> DResult<GraphNode> {
    let raw: Vec<sys::CUgraphNode> = deps.iter().map(|d| d.0).collect();
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
    let mut node: sys::CUgraphNode = std::ptr::null_mut();
    // SAFETY: `raw` holds nodes of `g`; the kernel takes no parameters; `kern` and `ctx` null
    // mean "use `func`" and "the current context".
    unsafe {
        sys::cuGraphAddKernelNode_v2(&mut node, g.0, raw.as_ptr(), raw.len(), &params).result()?
    };
    Ok(GraphNode(node))
}

/// Adds an empty node (no work, only ordering) after `deps`.
pub fn graph_add_empty_node(g: &mut CudaGraph, deps: &[GraphNode]) -> DResult<GraphNode> {
    let raw: Vec<sys::CUgraphNode> = deps.iter().map(|d| d.0).collect();
    let mut node: sys::CUgraphNode = std::ptr::null_mut();
    // SAFETY: `raw` holds `raw.len()` nodes of `g` (the caller's contract, checked by the
    // driver too); writes one node handle.
    unsafe { sys::cuGraphAddEmptyNode(&mut node, g.0, raw.as_ptr(), raw.len()).result()? };
    Ok(GraphNode(node))
}

/// A copy of `g` (`cuGraphClone`), owned separately.
pub fn graph_clone(g: &CudaGraph) -> DResult<CudaGraph> {
    let mut c: sys::CUgraph = std::ptr::null_mut();
    // SAFETY: `g` is live; writes one graph handle, owned by the `CudaGraph` returned.
    unsafe { sys::cuGraphClone(&mut c, g.0).result()? };
    Ok(CudaGraph(c))
}

/// The nodes of `g`, in the driver's order; views valid while `g` lives.
pub fn graph_nodes(g: &CudaGraph) -> DResult<Vec<GraphNode>> {
    let mut n = graph_node_count(g)?;
    let mut nodes: Vec<sys::CUgraphNode> = vec![std::ptr::null_mut(); n];
    // SAFETY: `nodes` has room for `n` handles; the driver writes at most `n` and sets `n` to
    // the number written.
    unsafe { sys::cuGraphGetNodes(g.0, nodes.as_mut_ptr(), &mut n).result()? };
    nodes.truncate(n);
    Ok(nodes.into_iter().map(GraphNode).collect())
}

/// The edges of `g` as `(from, to)` pairs; views valid while `g` lives. Fails
/// (`CUDA_ERROR_LOSSY_QUERY`) if an edge carries non-default edge data, which this drops.
pub fn graph_edges(g: &CudaGraph) -> DResult<Vec<(GraphNode, GraphNode)>> {
    let mut n = graph_edge_count(g)?;
    let mut from: Vec<sys::CUgraphNode> = vec![std::ptr::null_mut(); n];
    let mut to: Vec<sys::CUgraphNode> = vec![std::ptr::null_mut(); n];
    // SAFETY: `from` and `to` have room for `n` handles each; the driver writes at most `n`
    // pairs and sets `n` to the number written; null edge data: not returned (the driver
    // refuses rather than drop non-default data).
    unsafe {
        sys::cuGraphGetEdges_v2(
            g.0,
            from.as_mut_ptr(),
            to.as_mut_ptr(),
            std::ptr::null_mut(),
            &mut n,
        )
        .result()?
    };
    Ok(from
        .into_iter()
        .zip(to)
        .take(n)
        .map(|(a, b)| (GraphNode(a), GraphNode(b)))
        .collect())
}

/// `node`'s type and, for a kernel node, its parameters, whose argument pointers point into
/// the driver's copy held by the node.
fn node_kernel_params(
    node: sys::CUgraphNode,
) -> DResult<(sys::CUgraphNodeType, Option<sys::CUDA_KERNEL_NODE_PARAMS>)> {
    let mut t = MaybeUninit::<sys::CUgraphNodeType>::uninit();
    // SAFETY: the caller's `node` is a node of a live graph; writes one type.
    let t = unsafe {
        sys::cuGraphNodeGetType(node, t.as_mut_ptr()).result()?;
        t.assume_init()
    };
    if t != sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL {
        return Ok((t, None));
    }
    let mut p = MaybeUninit::<sys::CUDA_KERNEL_NODE_PARAMS>::zeroed();
    // SAFETY: `node` is a kernel node of a live graph; writes one parameter block.
    let p = unsafe {
        sys::cuGraphKernelNodeGetParams_v2(node, p.as_mut_ptr()).result()?;
        p.assume_init()
    };
    Ok((t, Some(p)))
}

/// The function of `node`, a node of `g`, if it is a kernel node.
pub fn graph_kernel_function(g: &CudaGraph, node: GraphNode) -> DResult<Option<Func>> {
    let _ = g;
    Ok(node_kernel_params(node.0)?.1.map(|p| Func(p.func)))
}

/// Adds to `dst`, after `deps` (nodes of `dst`), a kernel node with the parameters of `src`, a
/// kernel node of `src_graph`: function, dimensions, shared memory and arguments, but none of
/// `src`'s launch attributes. `Ok(None)`: `src` is not a kernel node (nothing added).
pub fn graph_copy_kernel_node(
    dst: &mut CudaGraph,
    deps: &[GraphNode],
    src_graph: &CudaGraph,
    src: GraphNode,
) -> DResult<Option<GraphNode>> {
    let _ = src_graph;
    // Its argument pointers point into the driver's copy held by `src`, valid while
    // `src_graph` lives, which outlasts this function.
    let Some(p) = node_kernel_params(src.0)?.1 else {
        return Ok(None);
    };
    let raw: Vec<sys::CUgraphNode> = deps.iter().map(|d| d.0).collect();
    let mut node: sys::CUgraphNode = std::ptr::null_mut();
    // SAFETY: `raw` holds nodes of `dst`; `p` is the parameter block the driver just gave for
    // a kernel node, its argument pointers still valid (`src_graph` is borrowed), and the
    // driver copies the arguments into the new node.
    unsafe {
        sys::cuGraphAddKernelNode_v2(&mut node, dst.0, raw.as_ptr(), raw.len(), &p).result()?
    };
    Ok(Some(GraphNode(node)))
}

/// One line for each of the first `max` nodes of `g`: its type and, for a kernel node, its
/// function, grid, block, shared memory and every launch attribute the driver reports with a
/// non-zero value (for comparing a captured graph with one built node by node).
pub fn graph_describe(g: &CudaGraph, max: usize) -> DResult<Vec<String>> {
    use sys::CUlaunchAttributeID_enum as A;
    let nodes: Vec<sys::CUgraphNode> = graph_nodes(g)?.into_iter().map(|n| n.0).collect();
    let attrs = [
        A::CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW,
        A::CU_LAUNCH_ATTRIBUTE_COOPERATIVE,
        A::CU_LAUNCH_ATTRIBUTE_SYNCHRONIZATION_POLICY,
        A::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION,
        A::CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE,
        A::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
        A::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_EVENT,
        A::CU_LAUNCH_ATTRIBUTE_PRIORITY,
        A::CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP,
        A::CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN,
        A::CU_LAUNCH_ATTRIBUTE_PREFERRED_CLUSTER_DIMENSION,
        A::CU_LAUNCH_ATTRIBUTE_LAUNCH_COMPLETION_EVENT,
        A::CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE,
        A::CU_LAUNCH_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
    ];
    let mut out = Vec::new();
    for &node in nodes.iter().take(max) {
        let (t, params) = node_kernel_params(node)?;
        let mut line = format!("{t:?}");
        if let Some(p) = params {
            line += &format!(
                " func={:?} kern={:?} ctx={:?} grid={}x{}x{} block={}x{}x{} smem={}",
                p.func,
                p.kern,
                p.ctx,
                p.gridDimX,
                p.gridDimY,
                p.gridDimZ,
                p.blockDimX,
                p.blockDimY,
                p.blockDimZ,
                p.sharedMemBytes
            );
            for a in attrs {
                let mut v = MaybeUninit::<sys::CUkernelNodeAttrValue>::zeroed();
                // SAFETY: writes one attribute value (a 64-byte union) for a kernel node.
                let r = unsafe { sys::cuGraphKernelNodeGetAttribute(node, a, v.as_mut_ptr()) };
                if r != sys::CUresult::CUDA_SUCCESS {
                    line += &format!(" {a:?}=err{}", r as i32);
                    continue;
                }
                // SAFETY: zeroed, then written by the driver: every byte is initialised, and
                // `pad` covers the whole union.
                let bytes = unsafe { v.assume_init().pad };
                if bytes.iter().any(|&b| b != 0) {
                    let hex: String = bytes[..16]
                        .iter()
                        .map(|b| format!("{:02x}", *b as u8))
                        .collect();
                    line += &format!(" {a:?}={hex}");
                }
            }
        }
        out.push(line);
    }
    Ok(out)
}

/// Instantiates `g` (which stays the caller's).
pub fn graph_instantiate(g: &CudaGraph) -> DResult<GraphExec> {
    // SAFETY: `g` is live; the executable is owned by the `GraphExec` returned.
    unsafe { result::graph::instantiate(g.0, sys::CUgraphInstantiate_flags(0)).map(GraphExec) }
}

/// Launches `exec` on `s`.
pub fn graph_launch(exec: &GraphExec, s: StreamRef) -> DResult<()> {
    // SAFETY: both handles are live.
    unsafe { result::graph::launch(exec.0, s.0) }
}

/// Begins a capture on `s` in thread-local mode.
pub fn stream_begin_capture(s: StreamRef) -> DResult<()> {
    // SAFETY: `s` is live.
    unsafe {
        result::stream::begin_capture(
            s.0,
            sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
        )
    }
}

/// Ends the capture on `s`. `Ok(None)`: the capture ended but made no graph.
pub fn stream_end_capture(s: StreamRef) -> DResult<Option<CudaGraph>> {
    // SAFETY: `s` is live; the graph (null when none was made) is owned by the caller.
    let g = unsafe { result::stream::end_capture(s.0)? };
    Ok((!g.is_null()).then_some(CudaGraph(g)))
}

/// The nodes the next operation captured on `s` would depend on (the capture's current tail).
pub fn capture_dependencies(s: StreamRef) -> DResult<Vec<GraphNode>> {
    let mut status = MaybeUninit::<sys::CUstreamCaptureStatus>::uninit();
    let mut deps: *const sys::CUgraphNode = std::ptr::null();
    let mut n: usize = 0;
    // SAFETY: the driver writes the status, a pointer to its own array of `n` node handles
    // (valid until the next call on the stream: copied out at once) and `n`; the id, graph and
    // edge-data outputs are optional and passed as null (the edges are all default ones).
    unsafe {
        sys::cuStreamGetCaptureInfo_v3(
            s.0,
            status.as_mut_ptr(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            &mut deps,
            std::ptr::null_mut(),
            &mut n,
        )
        .result()?;
        if n == 0 || deps.is_null() {
            return Ok(Vec::new());
        }
        Ok(std::slice::from_raw_parts(deps, n)
            .iter()
            .map(|&d| GraphNode(d))
            .collect())
    }
}

/// Makes the next operation captured on `s` depend on exactly `deps` (none: a root).
pub fn capture_set_dependencies(s: StreamRef, deps: &[GraphNode]) -> DResult<()> {
    let mut raw: Vec<sys::CUgraphNode> = deps.iter().map(|d| d.0).collect();
    let p = if raw.is_empty() {
        std::ptr::null_mut()
    } else {
        raw.as_mut_ptr()
    };
    // SAFETY: `raw` holds `raw.len()` nodes of the graph being captured on `s` (taken from
    // `capture_dependencies` of this capture); null edge data means default edges.
    unsafe {
        sys::cuStreamUpdateCaptureDependencies_v2(
            s.0,
            p,
            std::ptr::null(),
            raw.len(),
            sys::CUstreamUpdateCaptureDependencies_flags::CU_STREAM_SET_CAPTURE_DEPENDENCIES as u32,
        )
        .result()
    }
}

/// Adds an empty node with no dependencies to the graph being captured on `s` and returns it:
/// a root where a driver refuses an empty dependency set in [`capture_set_dependencies`].
pub fn capture_add_root(s: StreamRef) -> DResult<GraphNode> {
    let mut status = MaybeUninit::<sys::CUstreamCaptureStatus>::uninit();
    let mut g: sys::CUgraph = std::ptr::null_mut();
    let mut node: sys::CUgraphNode = std::ptr::null_mut();
    // SAFETY: the first call writes the status and the capture's graph (owned by the capture,
    // only used for the one node added here); the other outputs are optional. The second adds
    // a node with no dependencies to that graph.
    unsafe {
        sys::cuStreamGetCaptureInfo_v3(
            s.0,
            status.as_mut_ptr(),
            std::ptr::null_mut(),
            &mut g,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
        .result()?;
        sys::cuGraphAddEmptyNode(&mut node, g, std::ptr::null(), 0).result()?;
    }
    Ok(GraphNode(node))
}
