//! The driver calls the raw-driver baselines ([`crate::baselines`]) and the probe
//! ([`crate::probe`]) make themselves, on cudarc's own layers. What must be destroyed is owned
//! by cudarc's safe types: the device's primary context (`CudaContext`), streams
//! (`CudaStream`), events (`CudaEvent`), modules and their functions (`CudaModule`,
//! `CudaFunction`), the probe's buffers (`CudaSlice`). The calls a baseline measures are
//! cudarc's `result` calls on their handles (`result::launch_kernel`, `result::event::record`,
//! ...), through the thin wrappers below: cudarc's safe methods would bind the context and
//! track events at each call, and a baseline measures the bare driver call. Where cudarc has no
//! call (CUDA graphs built node by node, capture dependencies) they are `sys` calls, with
//! [`Graph`] and [`GraphExec`] owning what they make and [`GraphNode`] and [`Func`] naming
//! what others own.
//!
//! Every call here runs on a thread the caller has bound to the context it means (a baseline
//! binds its threads itself, [`bind`]).

use std::ffi::c_void;
use std::fmt;
use std::mem::MaybeUninit;
use std::sync::Arc;

use cudarc::driver::{result, sys, CudaContext, CudaEvent, CudaFunction, CudaModule, CudaStream};
use cudarc::nvrtc::Ptx;

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
/// `CudaFunction`'s, [`Func::of`], or a captured kernel node's, [`graph_kernel_function`]).
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
// CUDA graphs (cudarc's safe layer has only captured-and-instantiated ones).

/// A CUDA graph (a template), owned: destroyed when dropped.
#[derive(Debug)]
pub struct Graph(sys::CUgraph);

/// An executable graph, owned: destroyed when dropped (an in-flight launch finishes first).
#[derive(Debug)]
pub struct GraphExec(sys::CUgraphExec);

/// A node of a CUDA graph: a view, valid while its graph lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GraphNode(sys::CUgraphNode);

// SAFETY: graph handles are plain identifiers the driver lets any thread use; an owner is
// destroyed only by its drop, a view destroys nothing.
unsafe impl Send for Graph {}
// SAFETY: as above.
unsafe impl Send for GraphExec {}
// SAFETY: as above; a shared reference only reads the handle value.
unsafe impl Sync for GraphExec {}

impl Drop for Graph {
    fn drop(&mut self) {
        // SAFETY: owned, destroyed once (here).
        let _ = unsafe { result::graph::destroy(self.0) };
    }
}

impl Drop for GraphExec {
    fn drop(&mut self) {
        // SAFETY: owned, destroyed once (here).
        let _ = unsafe { result::graph::exec_destroy(self.0) };
    }
}

/// An empty graph (for graphs built node by node).
pub fn graph_create() -> DResult<Graph> {
    let mut g: sys::CUgraph = std::ptr::null_mut();
    // SAFETY: writes one graph handle.
    unsafe { sys::cuGraphCreate(&mut g, 0).result()? };
    Ok(Graph(g))
}

/// Removes `node`, a node of `g`, with its edges.
pub fn graph_remove_node(g: &mut Graph, node: GraphNode) -> DResult<()> {
    let _ = g;
    // SAFETY: `node` is a node of `g` (the caller's contract, checked by the driver too), and
    // `&mut g` says no launch or instantiation of `g` runs meanwhile.
    unsafe { sys::cuGraphDestroyNode(node.0).result() }
}

/// Number of nodes of `g`.
pub fn graph_node_count(g: &Graph) -> DResult<usize> {
    let mut n: usize = 0;
    // SAFETY: with a null node array the driver only writes the count.
    unsafe { sys::cuGraphGetNodes(g.0, std::ptr::null_mut(), &mut n).result()? };
    Ok(n)
}

/// Number of edges of `g`.
pub fn graph_edge_count(g: &Graph) -> DResult<usize> {
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
pub fn graph_add_empty_kernel(g: &mut Graph, deps: &[GraphNode], f: Func) -> DResult<GraphNode> {
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
pub fn graph_add_empty_node(g: &mut Graph, deps: &[GraphNode]) -> DResult<GraphNode> {
    let raw: Vec<sys::CUgraphNode> = deps.iter().map(|d| d.0).collect();
    let mut node: sys::CUgraphNode = std::ptr::null_mut();
    // SAFETY: `raw` holds `raw.len()` nodes of `g` (the caller's contract, checked by the
    // driver too); writes one node handle.
    unsafe { sys::cuGraphAddEmptyNode(&mut node, g.0, raw.as_ptr(), raw.len()).result()? };
    Ok(GraphNode(node))
}

/// A copy of `g` (`cuGraphClone`), owned separately.
pub fn graph_clone(g: &Graph) -> DResult<Graph> {
    let mut c: sys::CUgraph = std::ptr::null_mut();
    // SAFETY: `g` is live; writes one graph handle, owned by the `Graph` returned.
    unsafe { sys::cuGraphClone(&mut c, g.0).result()? };
    Ok(Graph(c))
}

/// The nodes of `g`, in the driver's order; views valid while `g` lives.
pub fn graph_nodes(g: &Graph) -> DResult<Vec<GraphNode>> {
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
pub fn graph_edges(g: &Graph) -> DResult<Vec<(GraphNode, GraphNode)>> {
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
pub fn graph_kernel_function(g: &Graph, node: GraphNode) -> DResult<Option<Func>> {
    let _ = g;
    Ok(node_kernel_params(node.0)?.1.map(|p| Func(p.func)))
}

/// Adds to `dst`, after `deps` (nodes of `dst`), a kernel node with the parameters of `src`, a
/// kernel node of `src_graph`: function, dimensions, shared memory and arguments, but none of
/// `src`'s launch attributes. `Ok(None)`: `src` is not a kernel node (nothing added).
pub fn graph_copy_kernel_node(
    dst: &mut Graph,
    deps: &[GraphNode],
    src_graph: &Graph,
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
pub fn graph_describe(g: &Graph, max: usize) -> DResult<Vec<String>> {
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
pub fn graph_instantiate(g: &Graph) -> DResult<GraphExec> {
    // SAFETY: `g` is live; the executable is owned by the `GraphExec` returned.
    unsafe { result::graph::instantiate(g.0, sys::CUgraphInstantiate_flags(0)).map(GraphExec) }
}

/// Launches `exec` on `s`.
pub fn graph_launch(exec: &GraphExec, s: &CudaStream) -> DResult<()> {
    // SAFETY: both handles are live.
    unsafe { result::graph::launch(exec.0, s.cu_stream()) }
}

/// Begins a capture on `s` in thread-local mode.
pub fn stream_begin_capture(s: &CudaStream) -> DResult<()> {
    // SAFETY: `s` is live.
    unsafe {
        result::stream::begin_capture(
            s.cu_stream(),
            sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
        )
    }
}

/// Ends the capture on `s`. `Ok(None)`: the capture ended but made no graph.
pub fn stream_end_capture(s: &CudaStream) -> DResult<Option<Graph>> {
    // SAFETY: `s` is live; the graph (null when none was made) is owned by the caller.
    let g = unsafe { result::stream::end_capture(s.cu_stream())? };
    Ok((!g.is_null()).then_some(Graph(g)))
}

/// The nodes the next operation captured on `s` would depend on (the capture's current tail).
pub fn capture_dependencies(s: &CudaStream) -> DResult<Vec<GraphNode>> {
    let mut status = MaybeUninit::<sys::CUstreamCaptureStatus>::uninit();
    let mut deps: *const sys::CUgraphNode = std::ptr::null();
    let mut n: usize = 0;
    // SAFETY: the driver writes the status, a pointer to its own array of `n` node handles
    // (valid until the next call on the stream: copied out at once) and `n`; the id, graph and
    // edge-data outputs are optional and passed as null (the edges are all default ones).
    unsafe {
        sys::cuStreamGetCaptureInfo_v3(
            s.cu_stream(),
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
pub fn capture_set_dependencies(s: &CudaStream, deps: &[GraphNode]) -> DResult<()> {
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
            s.cu_stream(),
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
pub fn capture_add_root(s: &CudaStream) -> DResult<GraphNode> {
    let mut status = MaybeUninit::<sys::CUstreamCaptureStatus>::uninit();
    let mut g: sys::CUgraph = std::ptr::null_mut();
    let mut node: sys::CUgraphNode = std::ptr::null_mut();
    // SAFETY: the first call writes the status and the capture's graph (owned by the capture,
    // only used for the one node added here); the other outputs are optional. The second adds
    // a node with no dependencies to that graph.
    unsafe {
        sys::cuStreamGetCaptureInfo_v3(
            s.cu_stream(),
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
