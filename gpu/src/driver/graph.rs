//! CUDA graphs on the driver: templates (captured from a stream, or built node by node), their
//! nodes and edges, the dependencies of a capture in progress, and executables.
//!
//! cudarc 0.19 has captured-and-instantiated graphs only (its `CudaStream::end_capture`
//! instantiates at once), and no call that reads or edits a template. Those calls are here,
//! once, for two users: the replay's capture (`replay/`), through the checked wrappers at the
//! end of this file, each first checking the context it expects like every wrapper of
//! `driver.rs`; and the public [`CudaGraphTemplate`](crate::CudaGraphTemplate) and
//! [`CaptureExt`](crate::CaptureExt) (`cuda_graph.rs`), whose calls are their caller's, not the
//! framework's, and so go unchecked. Where cudarc's `result` layer has the call (begin and end
//! of a capture, instantiate, launch, destroy), it makes it.
//!
//! A template ([`CudaGraph`]) and an executable ([`GraphExec`]) are owners: neither is `Copy`
//! or `Clone`, each destroyed by a method that consumes it, so that destroying one twice does
//! not compile; a template left undestroyed is destroyed by its drop (`cuGraphDestroy` needs
//! no current context). A node ([`CudaGraphNode`]) is a `Copy` view, valid while its graph
//! holds it.

use std::mem::{ManuallyDrop, MaybeUninit};
use std::sync::OnceLock;

use cudarc::driver::{result, sys};

use super::{check, driver_version, green, Ctx, DResult, DriverError, StreamRef};

/// A CUDA graph template (captured, or built node by node), owned. Destroy with
/// [`CudaGraph::destroy`]; dropped undestroyed, it is destroyed unchecked.
#[derive(Debug)]
pub(crate) struct CudaGraph(sys::CUgraph);
// SAFETY: a graph handle may be used from any thread; the driver asks that calls on one graph
// be serialised, which `&mut` and moves give (not `Sync`: reads through `&` are calls too).
unsafe impl Send for CudaGraph {}

/// An executable graph. Destroy with [`GraphExec::destroy`].
#[derive(Debug)]
pub(crate) struct GraphExec(sys::CUgraphExec);
// SAFETY: an executable may be launched from any thread with its context current; the driver
// asks that calls on one be made one at a time, which `&mut`, moves and the replay slot's lock
// give (not `Sync`: a launch through `&` is a call too).
unsafe impl Send for GraphExec {}

/// A node of a CUDA graph: a view (`Copy`, owns nothing), valid while its graph holds it, made
/// only by the calls that read or add nodes ([`CudaGraphTemplate::nodes`],
/// [`CaptureExt::capture_dependencies`], ...).
///
/// [`CudaGraphTemplate::nodes`]: crate::CudaGraphTemplate::nodes
/// [`CaptureExt::capture_dependencies`]: crate::CaptureExt::capture_dependencies
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CudaGraphNode(sys::CUgraphNode);
// SAFETY: a node handle is a plain identifier; what may be done with it is decided by the
// calls that take it (each with its graph's serialisation), and the view destroys nothing.
unsafe impl Send for CudaGraphNode {}
// SAFETY: as above; a shared reference only reads the handle value.
unsafe impl Sync for CudaGraphNode {}

#[cfg(test)]
impl CudaGraphNode {
    /// A stand-in handle for unit tests of code that only compares nodes (never passed to
    /// the driver).
    pub(crate) fn fake(i: usize) -> Self {
        CudaGraphNode((i + 1) as sys::CUgraphNode)
    }
}

/// The raw handles of `nodes`, for a call that takes an array of them.
fn raw_nodes(nodes: &[CudaGraphNode]) -> Vec<sys::CUgraphNode> {
    nodes.iter().map(|n| n.0).collect()
}

// ----------------------------------------------------------------------------------------------
// Templates: the calls, unchecked (the checked wrappers for the crate are below).

impl CudaGraph {
    /// An empty graph (`cuGraphCreate`).
    pub(crate) fn create() -> DResult<CudaGraph> {
        let mut g: sys::CUgraph = std::ptr::null_mut();
        // SAFETY: writes one graph handle, owned by the `CudaGraph` returned.
        unsafe { sys::cuGraphCreate(&mut g, 0).result()? };
        Ok(CudaGraph(g))
    }

    /// The raw handle (for cudarc's `result::graph` calls): valid while `self` lives.
    pub(crate) fn raw(&self) -> sys::CUgraph {
        self.0
    }

    /// A copy of the graph (`cuGraphClone`), owned separately.
    pub(crate) fn try_clone(&self) -> DResult<CudaGraph> {
        let mut c: sys::CUgraph = std::ptr::null_mut();
        // SAFETY: `self` is live; writes one graph handle, owned by the `CudaGraph` returned.
        unsafe { sys::cuGraphClone(&mut c, self.0).result()? };
        Ok(CudaGraph(c))
    }

    /// Number of nodes.
    pub(crate) fn node_count(&self) -> DResult<usize> {
        let mut n: usize = 0;
        // SAFETY: with a null node array the driver only writes the count.
        unsafe { sys::cuGraphGetNodes(self.0, std::ptr::null_mut(), &mut n).result()? };
        Ok(n)
    }

    /// The nodes, in the driver's order (the order they were added).
    pub(crate) fn nodes(&self) -> DResult<Vec<CudaGraphNode>> {
        let mut n = self.node_count()?;
        if n == 0 {
            // An empty array is an invalid argument to the driver, even with a count of 0.
            return Ok(Vec::new());
        }
        let mut nodes: Vec<sys::CUgraphNode> = vec![std::ptr::null_mut(); n];
        // SAFETY: room for `n` handles; the driver writes at most `n` and the count it wrote.
        unsafe { sys::cuGraphGetNodes(self.0, nodes.as_mut_ptr(), &mut n).result()? };
        nodes.truncate(n);
        Ok(nodes.into_iter().map(CudaGraphNode).collect())
    }

    /// Number of edges.
    pub(crate) fn edge_count(&self) -> DResult<usize> {
        let mut n: usize = 0;
        // SAFETY: with null arrays the driver only writes the count.
        unsafe {
            sys::cuGraphGetEdges_v2(
                self.0,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                &mut n,
            )
            .result()?
        };
        Ok(n)
    }

    /// The edges as `(from, to)` pairs. Fails (`CUDA_ERROR_LOSSY_QUERY`) where an edge carries
    /// non-default edge data, which this does not return.
    pub(crate) fn edges(&self) -> DResult<Vec<(CudaGraphNode, CudaGraphNode)>> {
        let mut n = self.edge_count()?;
        if n == 0 {
            return Ok(Vec::new());
        }
        let mut from: Vec<sys::CUgraphNode> = vec![std::ptr::null_mut(); n];
        let mut to: Vec<sys::CUgraphNode> = vec![std::ptr::null_mut(); n];
        // SAFETY: room for `n` edges in each array; the driver writes at most `n` and the count
        // it wrote (null edge data: the driver refuses rather than drop non-default data).
        unsafe {
            sys::cuGraphGetEdges_v2(
                self.0,
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
            .map(|(a, b)| (CudaGraphNode(a), CudaGraphNode(b)))
            .collect())
    }

    /// Adds an empty node (no work, only ordering) after `deps`, nodes of `self`.
    pub(crate) fn add_empty_node(&mut self, deps: &[CudaGraphNode]) -> DResult<CudaGraphNode> {
        add_empty_node(self.0, deps)
    }

    /// Adds a kernel node with the parameters `p` after `deps`, nodes of `self`; the driver
    /// copies the kernel's arguments at the call.
    pub(crate) fn add_kernel_node(
        &mut self,
        deps: &[CudaGraphNode],
        p: &sys::CUDA_KERNEL_NODE_PARAMS,
    ) -> DResult<CudaGraphNode> {
        let raw = raw_nodes(deps);
        let mut node: sys::CUgraphNode = std::ptr::null_mut();
        // SAFETY: `raw` holds `raw.len()` nodes of `self` (the caller's contract, checked by the
        // driver too); `p` is read for the call, its argument pointers valid for it (the
        // caller's contract); writes one node handle.
        unsafe {
            sys::cuGraphAddKernelNode_v2(&mut node, self.0, raw.as_ptr(), raw.len(), p).result()?
        };
        Ok(CudaGraphNode(node))
    }

    /// The parameters of `node`, a node of `self`, if it is a kernel node; their argument
    /// pointers point into the driver's copy held by the node, valid while it is.
    pub(crate) fn kernel_node_params(
        &self,
        node: CudaGraphNode,
    ) -> DResult<Option<sys::CUDA_KERNEL_NODE_PARAMS>> {
        kernel_params(node, node_type(node)?)
    }

    /// Removes `node`, a node of `self`, with its edges: its dependents lose that dependency.
    pub(crate) fn remove_node(&mut self, node: CudaGraphNode) -> DResult<()> {
        // SAFETY: `node` is a node of `self` (the caller's contract, checked by the driver
        // too), and `&mut self` says no other call on the graph runs meanwhile; `node` is not
        // valid after.
        unsafe { sys::cuGraphDestroyNode(node.0).result() }
    }

    /// One line for each of the first `max` nodes: its type and, for a kernel node, its
    /// function, grid, block, shared memory and every launch attribute the driver reports with
    /// a non-zero value (for comparing a captured graph with one built node by node).
    pub(crate) fn describe(&self, max: usize) -> DResult<Vec<String>> {
        let mut out = Vec::new();
        for node in self.nodes()?.into_iter().take(max) {
            let t = node_type(node)?;
            let mut line = node_type_name(t);
            if let Some(p) = kernel_params(node, t)? {
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
                line += &kernel_node_attributes(node);
            }
            out.push(line);
        }
        Ok(out)
    }

    /// Destroys the template (`cuGraphDestroy`).
    pub(crate) fn destroy(self, expect: Ctx) -> DResult<()> {
        check(expect, "cuGraphDestroy");
        let g = ManuallyDrop::new(self);
        // SAFETY: owned and consumed here (its drop does not run): destroyed once.
        unsafe { result::graph::destroy(g.0) }
    }
}

impl Drop for CudaGraph {
    fn drop(&mut self) {
        // SAFETY: owned, destroyed once (here: `destroy` skips this drop); the call needs no
        // current context.
        let _ = unsafe { result::graph::destroy(self.0) };
    }
}

/// Adds an empty node after `deps` to `g` (an owner's graph, or the one a capture is making).
fn add_empty_node(g: sys::CUgraph, deps: &[CudaGraphNode]) -> DResult<CudaGraphNode> {
    let raw = raw_nodes(deps);
    let mut node: sys::CUgraphNode = std::ptr::null_mut();
    // SAFETY: `g` is live and `raw` holds `raw.len()` nodes of it (the callers' contract,
    // checked by the driver too); writes one node handle.
    unsafe { sys::cuGraphAddEmptyNode(&mut node, g, raw.as_ptr(), raw.len()).result()? };
    Ok(CudaGraphNode(node))
}

/// `node`'s type, as the `u32` it is in C: a newer driver may know node types the bindings'
/// enum does not (a Rust enum read from a value it has no variant for would be undefined
/// behaviour).
fn node_type(node: CudaGraphNode) -> DResult<u32> {
    let mut t: u32 = u32::MAX;
    // SAFETY: `node` is a node of a live graph (the caller's); writes one type, into a `u32`.
    unsafe { sys::cuGraphNodeGetType(node.0, (&mut t as *mut u32).cast()).result()? };
    Ok(t)
}

/// The name of node type `t` (`CU_GRAPH_NODE_TYPE_...`), or its number for one the bindings
/// do not know.
fn node_type_name(t: u32) -> String {
    use sys::CUgraphNodeType as Ty;
    const KNOWN: [Ty; 14] = [
        Ty::CU_GRAPH_NODE_TYPE_KERNEL,
        Ty::CU_GRAPH_NODE_TYPE_MEMCPY,
        Ty::CU_GRAPH_NODE_TYPE_MEMSET,
        Ty::CU_GRAPH_NODE_TYPE_HOST,
        Ty::CU_GRAPH_NODE_TYPE_GRAPH,
        Ty::CU_GRAPH_NODE_TYPE_EMPTY,
        Ty::CU_GRAPH_NODE_TYPE_WAIT_EVENT,
        Ty::CU_GRAPH_NODE_TYPE_EVENT_RECORD,
        Ty::CU_GRAPH_NODE_TYPE_EXT_SEMAS_SIGNAL,
        Ty::CU_GRAPH_NODE_TYPE_EXT_SEMAS_WAIT,
        Ty::CU_GRAPH_NODE_TYPE_MEM_ALLOC,
        Ty::CU_GRAPH_NODE_TYPE_MEM_FREE,
        Ty::CU_GRAPH_NODE_TYPE_BATCH_MEM_OP,
        Ty::CU_GRAPH_NODE_TYPE_CONDITIONAL,
    ];
    KNOWN
        .iter()
        .find(|k| **k as u32 == t)
        .map_or_else(|| format!("CUgraphNodeType {t}"), |k| format!("{k:?}"))
}

/// The parameters of `node` if `t`, its type, is a kernel node's; their argument pointers
/// point into the driver's copy held by the node.
fn kernel_params(node: CudaGraphNode, t: u32) -> DResult<Option<sys::CUDA_KERNEL_NODE_PARAMS>> {
    if t != sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL as u32 {
        return Ok(None);
    }
    let mut p = MaybeUninit::<sys::CUDA_KERNEL_NODE_PARAMS>::zeroed();
    // SAFETY: `node` is a kernel node of a live graph; the driver writes one parameter block
    // (pointers and integers only: any value it writes is a valid one).
    let p = unsafe {
        sys::cuGraphKernelNodeGetParams_v2(node.0, p.as_mut_ptr()).result()?;
        p.assume_init()
    };
    Ok(Some(p))
}

/// ` NAME=HEX` for each launch attribute of kernel node `node` with a non-zero value (its
/// first 16 bytes), ` NAME=errN` for one the driver would not report.
fn kernel_node_attributes(node: CudaGraphNode) -> String {
    use sys::CUlaunchAttributeID_enum as A;
    // The kernel-node attributes every driver since CUDA 12.0 reports. Asking for a stream's or
    // a launch's only (synchronisation policy, programmatic serialisation and event, launch
    // completion event, shared memory carveout) is an invalid-value error, and so is one of
    // the two added later (preferred cluster dimension, device-updatable node) on an ordinary
    // node (one per kernel node on the 580 driver): errors compute-sanitizer reports.
    const ATTRS: [A; 7] = [
        A::CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW,
        A::CU_LAUNCH_ATTRIBUTE_COOPERATIVE,
        A::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION,
        A::CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE,
        A::CU_LAUNCH_ATTRIBUTE_PRIORITY,
        A::CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP,
        A::CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN,
    ];
    let mut line = String::new();
    for a in ATTRS {
        let mut v = MaybeUninit::<sys::CUkernelNodeAttrValue>::zeroed();
        // SAFETY: `node` is a kernel node of a live graph; writes one attribute value (a
        // 64-byte union).
        let r = unsafe { sys::cuGraphKernelNodeGetAttribute(node.0, a, v.as_mut_ptr()) };
        if r != sys::CUresult::CUDA_SUCCESS {
            line += &format!(" {a:?}=err{}", r as i32);
            continue;
        }
        // SAFETY: zeroed, then written by the driver: every byte is initialised, and `pad`
        // covers the whole union.
        let bytes = unsafe { v.assume_init().pad };
        if bytes.iter().any(|&b| b != 0) {
            let hex: String = bytes[..16]
                .iter()
                .map(|b| format!("{:02x}", *b as u8))
                .collect();
            line += &format!(" {a:?}={hex}");
        }
    }
    line
}

// ----------------------------------------------------------------------------------------------
// Captures: the calls, unchecked.

/// Whether this driver has the capture calls used here (`cuStreamGetCaptureInfo_v3` and
/// `cuStreamUpdateCaptureDependencies_v2` came with CUDA 12.3). Calling a missing entry point
/// through the dynamic loader would panic, so callers check this first.
pub(crate) fn has_capture_v3() -> bool {
    static V3: OnceLock<bool> = OnceLock::new();
    *V3.get_or_init(|| driver_version().is_ok_and(|v| v >= 12030))
}

/// Ends the capture on `s`. `Ok(None)`: the capture ended but made no graph.
pub(crate) fn end_capture(s: StreamRef) -> DResult<Option<CudaGraph>> {
    // SAFETY: `s` is live (crate invariant); the graph (null when none was made) is owned by
    // the `CudaGraph` returned.
    let g = unsafe { result::stream::end_capture(s.0)? };
    Ok((!g.is_null()).then_some(CudaGraph(g)))
}

/// The nodes the next operation captured on `s` would depend on (the capture's current tail).
pub(crate) fn capture_tail(s: StreamRef) -> DResult<Vec<CudaGraphNode>> {
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
            .map(|&d| CudaGraphNode(d))
            .collect())
    }
}

/// Makes the next operation captured on `s` depend on exactly `deps`, nodes of the graph being
/// captured on `s` (none: a root of the graph).
pub(crate) fn capture_set_tail(s: StreamRef, deps: &[CudaGraphNode]) -> DResult<()> {
    let mut raw = raw_nodes(deps);
    let p = if raw.is_empty() {
        std::ptr::null_mut()
    } else {
        raw.as_mut_ptr()
    };
    // SAFETY: `raw` holds `raw.len()` nodes of the graph being captured on `s` (the callers'
    // contract: taken from `capture_tail` of this capture, checked by the driver too); null
    // edge data means default edges.
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
/// a root the next captured operations can depend on, where a driver refuses an empty
/// dependency set in [`capture_set_tail`].
pub(crate) fn capture_root(s: StreamRef) -> DResult<CudaGraphNode> {
    let mut status = MaybeUninit::<sys::CUstreamCaptureStatus>::uninit();
    let mut g: sys::CUgraph = std::ptr::null_mut();
    // SAFETY: writes the status and the capture's graph (owned by the capture, not by us: only
    // used for the one node added below); the other outputs are optional.
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
        .result()?
    };
    add_empty_node(g, &[])
}

// ----------------------------------------------------------------------------------------------
// The crate's wrappers (replay): each checks the context it expects first.

/// Begins a capture on `s` in thread-local mode: only this thread's unsafe calls (an implicit
/// synchronise) invalidate it; other threads keep using the device freely.
pub(crate) fn stream_begin_capture(expect: Ctx, s: StreamRef) -> DResult<()> {
    check(expect, "cuStreamBeginCapture");
    green::check_partition(s, "cuStreamBeginCapture");
    // SAFETY: crate invariant: `s` is live.
    unsafe {
        result::stream::begin_capture(
            s.0,
            sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
        )
    }
}

/// Ends the capture on `s`. `Ok(None)`: the capture ended but made no graph.
pub(crate) fn stream_end_capture(expect: Ctx, s: StreamRef) -> DResult<Option<CudaGraph>> {
    check(expect, "cuStreamEndCapture");
    end_capture(s)
}

/// Whether `s` is capturing: `Ok(Some(true))` active, `Ok(Some(false))` invalidated,
/// `Ok(None)` not capturing.
pub(crate) fn stream_capture_status(expect: Ctx, s: StreamRef) -> DResult<Option<bool>> {
    check(expect, "cuStreamIsCapturing");
    // SAFETY: crate invariant: `s` is live.
    let st = unsafe { result::stream::is_capturing(s.0)? };
    Ok(match st {
        sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE => Some(true),
        sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_INVALIDATED => Some(false),
        _ => None,
    })
}

/// [`capture_tail`], checked.
pub(crate) fn capture_dependencies(expect: Ctx, s: StreamRef) -> DResult<Vec<CudaGraphNode>> {
    check(expect, "cuStreamGetCaptureInfo");
    capture_tail(s)
}

/// [`capture_set_tail`], checked: how a capture on one stream keeps a DAG's parallelism.
pub(crate) fn capture_set_dependencies(
    expect: Ctx,
    s: StreamRef,
    deps: &[CudaGraphNode],
) -> DResult<()> {
    check(expect, "cuStreamUpdateCaptureDependencies");
    capture_set_tail(s, deps)
}

/// [`capture_root`], checked.
pub(crate) fn capture_add_root(expect: Ctx, s: StreamRef) -> DResult<CudaGraphNode> {
    check(expect, "cuGraphAddEmptyNode");
    capture_root(s)
}

/// Switches this thread's capture mode to relaxed and returns the previous one, for calls a
/// capture must not see (hoisted allocations, staging copies on another stream).
pub(crate) fn capture_mode_relaxed() -> DResult<u32> {
    let mut m = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
    // SAFETY: exchanges one value for the calling thread.
    unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut m).result()? };
    Ok(m as u32)
}

/// Restores a capture mode returned by [`capture_mode_relaxed`].
pub(crate) fn capture_mode_restore(mode: u32) -> DResult<()> {
    let mut m = match mode {
        0 => sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL,
        1 => sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
        _ => sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
    };
    // SAFETY: exchanges one value for the calling thread.
    unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut m).result() }
}

/// Removes `node`, a node of `g`, with its edges: its dependents lose that dependency.
pub(crate) fn graph_remove_node(
    expect: Ctx,
    g: &mut CudaGraph,
    node: CudaGraphNode,
) -> DResult<()> {
    check(expect, "cuGraphDestroyNode");
    g.remove_node(node)
}

/// Number of nodes of `g`.
pub(crate) fn graph_node_count(expect: Ctx, g: &CudaGraph) -> DResult<usize> {
    check(expect, "cuGraphGetNodes");
    g.node_count()
}

/// The nodes of `g`, in the driver's order (the order they were added to it).
pub(crate) fn graph_nodes(expect: Ctx, g: &CudaGraph) -> DResult<Vec<CudaGraphNode>> {
    check(expect, "cuGraphGetNodes");
    g.nodes()
}

/// Number of edges of `g`.
pub(crate) fn graph_edge_count(expect: Ctx, g: &CudaGraph) -> DResult<usize> {
    check(expect, "cuGraphGetEdges");
    g.edge_count()
}

/// The edges of `g`, as `(from, to)` pairs.
pub(crate) fn graph_edges(
    expect: Ctx,
    g: &CudaGraph,
) -> DResult<Vec<(CudaGraphNode, CudaGraphNode)>> {
    check(expect, "cuGraphGetEdges");
    g.edges()
}

/// What a node of a captured graph is, as far as the replay's checks need.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NodeKind {
    /// An allocation the graph makes when it runs (a stream-ordered allocation captured).
    MemAlloc { ptr: u64, bytes: usize },
    /// A free of a graph allocation.
    MemFree { ptr: u64 },
    /// A copy between the device and pageable (not page-locked) host memory, to the host or
    /// from it.
    PageableCopy { to_host: bool, bytes: usize },
    /// Anything else (kernels, other copies, memsets, event and empty nodes).
    Other,
}

/// The kind of `node` (of a graph this thread captured).
pub(crate) fn node_kind(expect: Ctx, node: CudaGraphNode) -> DResult<NodeKind> {
    check(expect, "cuGraphNodeGetType");
    use sys::CUgraphNodeType as Ty;
    Ok(match node_type(node)? {
        t if t == Ty::CU_GRAPH_NODE_TYPE_MEM_ALLOC as u32 => {
            let mut p = MaybeUninit::<sys::CUDA_MEM_ALLOC_NODE_PARAMS>::zeroed();
            // SAFETY: a memory-allocation node; the driver writes its parameters. Only the two
            // plain integer fields are read, in place (the struct holds enums, which are not
            // read as Rust values: no value the driver writes can be an invalid one).
            unsafe {
                sys::cuGraphMemAllocNodeGetParams(node.0, p.as_mut_ptr()).result()?;
                let q = p.as_ptr();
                NodeKind::MemAlloc {
                    ptr: std::ptr::addr_of!((*q).dptr).read(),
                    bytes: std::ptr::addr_of!((*q).bytesize).read(),
                }
            }
        }
        t if t == Ty::CU_GRAPH_NODE_TYPE_MEM_FREE as u32 => {
            let mut ptr: sys::CUdeviceptr = 0;
            // SAFETY: a memory-free node; writes the address it frees.
            unsafe { sys::cuGraphMemFreeNodeGetParams(node.0, &mut ptr).result()? };
            NodeKind::MemFree { ptr }
        }
        t if t == Ty::CU_GRAPH_NODE_TYPE_MEMCPY as u32 => copy_kind(node)?,
        _ => NodeKind::Other,
    })
}

/// The kind of `node`, a copy node: a copy between the device and pageable host memory, or
/// another.
fn copy_kind(node: CudaGraphNode) -> DResult<NodeKind> {
    let mut p = MaybeUninit::<sys::CUDA_MEMCPY3D>::zeroed();
    // SAFETY: a copy node; the driver writes its parameters. Fields are read in place, the
    // memory types as the `u32`s they are in C (a Rust enum read from a value it has no
    // variant for would be undefined behaviour).
    let (src_type, src_host, dst_type, dst_host, width, height, depth) = unsafe {
        sys::cuGraphMemcpyNodeGetParams(node.0, p.as_mut_ptr()).result()?;
        let q = p.as_ptr();
        (
            std::ptr::addr_of!((*q).srcMemoryType).cast::<u32>().read(),
            std::ptr::addr_of!((*q).srcHost).read() as u64,
            std::ptr::addr_of!((*q).dstMemoryType).cast::<u32>().read(),
            std::ptr::addr_of!((*q).dstHost).read() as u64,
            std::ptr::addr_of!((*q).WidthInBytes).read(),
            std::ptr::addr_of!((*q).Height).read(),
            std::ptr::addr_of!((*q).Depth).read(),
        )
    };
    let host = sys::CUmemorytype::CU_MEMORYTYPE_HOST as u32;
    let bytes = width * height.max(1) * depth.max(1);
    Ok(if dst_type == host && !is_page_locked(dst_host) {
        NodeKind::PageableCopy {
            to_host: true,
            bytes,
        }
    } else if src_type == host && !is_page_locked(src_host) {
        NodeKind::PageableCopy {
            to_host: false,
            bytes,
        }
    } else {
        NodeKind::Other
    })
}

/// Whether host address `p` is page-locked memory the driver knows (`cuMemHostAlloc`,
/// `cuMemHostRegister`): the driver reports a host memory type only for such memory.
fn is_page_locked(p: u64) -> bool {
    let mut t: u32 = 0;
    // SAFETY: writes one `CUmemorytype` (a `u32`) for the attribute asked.
    let r = unsafe {
        sys::cuPointerGetAttribute(
            (&mut t as *mut u32).cast(),
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
            p,
        )
    };
    r == sys::CUresult::CUDA_SUCCESS && t == sys::CUmemorytype::CU_MEMORYTYPE_HOST as u32
}

/// Instantiates `g` (which stays the caller's: it may be destroyed at once).
pub(crate) fn graph_instantiate(expect: Ctx, g: &CudaGraph) -> DResult<GraphExec> {
    check(expect, "cuGraphInstantiateWithFlags");
    // SAFETY: `g` is live; the executable is owned by the `GraphExec` returned.
    unsafe { result::graph::instantiate(g.0, sys::CUgraphInstantiate_flags(0)).map(GraphExec) }
}

/// Updates `exec` in place to `g`'s parameters. `Ok(true)`: updated; `Ok(false)`: the
/// topology (or a node's kind) differs and the driver refused, `exec` unchanged and still
/// usable for the old graph; re-instantiate.
pub(crate) fn graph_exec_update(expect: Ctx, exec: &mut GraphExec, g: &CudaGraph) -> DResult<bool> {
    check(expect, "cuGraphExecUpdate");
    let mut info = MaybeUninit::<sys::CUgraphExecUpdateResultInfo>::zeroed();
    // SAFETY: both handles are live; the driver writes one result info.
    match unsafe { sys::cuGraphExecUpdate_v2(exec.0, g.0, info.as_mut_ptr()) } {
        sys::CUresult::CUDA_SUCCESS => Ok(true),
        sys::CUresult::CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE => Ok(false),
        other => Err(DriverError(other)),
    }
}

/// Launches `exec` on `s` (ordered after earlier launches of `exec` by the driver).
pub(crate) fn graph_launch(expect: Ctx, exec: &GraphExec, s: StreamRef) -> DResult<()> {
    check(expect, "cuGraphLaunch");
    green::check_partition(s, "cuGraphLaunch");
    // SAFETY: both handles are live.
    unsafe { result::graph::launch(exec.0, s.0) }
}

impl GraphExec {
    /// Destroys the executable (an in-flight launch finishes first: the driver frees it then).
    pub(crate) fn destroy(self, expect: Ctx) -> DResult<()> {
        check(expect, "cuGraphExecDestroy");
        // SAFETY: `self` is owned and consumed here: destroyed once.
        unsafe { result::graph::exec_destroy(self.0) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A known node type reads as its name, one the bindings do not know as its number (no
    /// driver needed: nothing here calls it).
    #[test]
    fn node_types_are_named_or_numbered() {
        use sys::CUgraphNodeType as Ty;
        assert_eq!(
            node_type_name(Ty::CU_GRAPH_NODE_TYPE_KERNEL as u32),
            "CU_GRAPH_NODE_TYPE_KERNEL"
        );
        assert_eq!(
            node_type_name(Ty::CU_GRAPH_NODE_TYPE_EMPTY as u32),
            "CU_GRAPH_NODE_TYPE_EMPTY"
        );
        assert_eq!(
            node_type_name(Ty::CU_GRAPH_NODE_TYPE_CONDITIONAL as u32),
            "CU_GRAPH_NODE_TYPE_CONDITIONAL"
        );
        assert_eq!(node_type_name(14), "CUgraphNodeType 14");
        assert_eq!(
            node_type_name(u32::MAX),
            format!("CUgraphNodeType {}", u32::MAX)
        );
    }
}
