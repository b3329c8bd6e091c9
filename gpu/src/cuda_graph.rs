//! CUDA graph templates for code on cudarc: [`CudaGraphTemplate`] and [`CaptureExt`], the
//! public face of `driver/graph.rs` (the calls the replay's capture makes, checked, there).

use std::fmt;

use cudarc::driver::{sys, CudaStream};

use crate::detect::detect;
use crate::driver::{self, CudaGraph, CudaGraphNode, DriverError, StreamRef};
use crate::error::{GpuError, GpuErrorKind, GpuResult};

/// What a failed call's error names.
const WHAT: &str = "CUDA graph template";

fn failed(call: &'static str) -> impl Fn(DriverError) -> GpuError {
    move |e| GpuError::driver(call, WHAT, e)
}

/// A CUDA graph *template*, owned: what a stream capture records, or a graph built node by
/// node, before it is instantiated. cudarc's `CudaStream::end_capture` instantiates at once and
/// has no call that reads or edits a template; this type has them: its nodes and edges, a
/// node's kernel parameters, adding and removing nodes, a copy, a description of each node.
/// Instantiate it with cudarc's `result::graph::instantiate` on [`cu_graph`](Self::cu_graph).
///
/// Made by [`CudaGraphTemplate::new`] (empty) or [`CaptureExt::end_capture_template`] (what a
/// capture recorded); destroyed (`cuGraphDestroy`, which needs no current context) when
/// dropped. Adding a kernel node, and instantiating, use the calling thread's current context.
/// `Send`, not `Sync`: the driver asks that the calls on one graph, reads included, be made
/// one at a time. The calls that take nodes are `unsafe`: a [`CudaGraphNode`] is a plain
/// handle, valid only while its graph holds it.
pub struct CudaGraphTemplate {
    graph: CudaGraph,
}

impl fmt::Debug for CudaGraphTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("CudaGraphTemplate")
            .field(&self.graph.raw())
            .finish()
    }
}

impl CudaGraphTemplate {
    /// An empty template (`cuGraphCreate`). Fails, without a panic, where there is no driver.
    pub fn new() -> GpuResult<Self> {
        detect()?;
        let graph = CudaGraph::create().map_err(failed("cuGraphCreate"))?;
        Ok(Self { graph })
    }

    /// The raw handle, for cudarc's `result::graph` calls (`instantiate`): valid while `self`
    /// lives; destroying it is `self`'s drop's business.
    pub fn cu_graph(&self) -> sys::CUgraph {
        self.graph.raw()
    }

    /// A copy (`cuGraphClone`), owned separately; its nodes are its own.
    pub fn try_clone(&self) -> GpuResult<Self> {
        let graph = self.graph.try_clone().map_err(failed("cuGraphClone"))?;
        Ok(Self { graph })
    }

    /// Number of nodes (`cuGraphGetNodes`).
    pub fn node_count(&self) -> GpuResult<usize> {
        self.graph.node_count().map_err(failed("cuGraphGetNodes"))
    }

    /// The nodes, in the driver's order (the order they were added).
    pub fn nodes(&self) -> GpuResult<Vec<CudaGraphNode>> {
        self.graph.nodes().map_err(failed("cuGraphGetNodes"))
    }

    /// Number of edges (`cuGraphGetEdges`).
    pub fn edge_count(&self) -> GpuResult<usize> {
        self.graph.edge_count().map_err(failed("cuGraphGetEdges"))
    }

    /// The edges as `(from, to)` pairs. Fails (`CUDA_ERROR_LOSSY_QUERY`) where an edge carries
    /// non-default edge data, which this does not return.
    pub fn edges(&self) -> GpuResult<Vec<(CudaGraphNode, CudaGraphNode)>> {
        self.graph.edges().map_err(failed("cuGraphGetEdges"))
    }

    /// One line for each of the first `max` nodes: its type and, for a kernel node, its
    /// function, grid, block, shared memory and each launch attribute the driver reports with
    /// a non-zero value (to compare what a capture recorded with a graph built node by node).
    pub fn describe(&self, max: usize) -> GpuResult<Vec<String>> {
        self.graph
            .describe(max)
            .map_err(failed("cuGraphGetNodes and its nodes' parameters"))
    }

    /// Adds an empty node (ordering only) after `deps`.
    ///
    /// # Safety
    /// Every node of `deps` must be a node of `self` (from its [`nodes`](Self::nodes),
    /// [`edges`](Self::edges) or an `add_*` on it) that `self` still holds.
    pub unsafe fn add_empty_node(&mut self, deps: &[CudaGraphNode]) -> GpuResult<CudaGraphNode> {
        self.graph
            .add_empty_node(deps)
            .map_err(failed("cuGraphAddEmptyNode"))
    }

    /// Adds a kernel node with the parameters `params` after `deps` (`cuGraphAddKernelNode`;
    /// null `kern` and `ctx` mean `func` in the current context). The driver copies the
    /// kernel's arguments at the call.
    ///
    /// # Safety
    /// As for [`add_empty_node`](Self::add_empty_node); and `params.func` must be a function
    /// of a module loaded in the current context that stays loaded while the graph or an
    /// executable of it may run, with `params.kernelParams` (or `extra`) holding one pointer
    /// per kernel parameter, in order, each valid for reads of the parameter's size for the
    /// call, and every device address the kernel uses valid whenever it runs.
    pub unsafe fn add_kernel_node(
        &mut self,
        deps: &[CudaGraphNode],
        params: &sys::CUDA_KERNEL_NODE_PARAMS,
    ) -> GpuResult<CudaGraphNode> {
        self.graph
            .add_kernel_node(deps, params)
            .map_err(failed("cuGraphAddKernelNode"))
    }

    /// The parameters of `node` if it is a kernel node (`cuGraphKernelNodeGetParams`), else
    /// `None`. Their argument pointers point into the driver's copy held by the node: valid
    /// while the node is, so they may be passed to [`add_kernel_node`](Self::add_kernel_node)
    /// meanwhile.
    ///
    /// # Safety
    /// `node` must be a node of `self` that `self` still holds.
    pub unsafe fn kernel_node_params(
        &self,
        node: CudaGraphNode,
    ) -> GpuResult<Option<sys::CUDA_KERNEL_NODE_PARAMS>> {
        self.graph
            .kernel_node_params(node)
            .map_err(failed("cuGraphKernelNodeGetParams"))
    }

    /// Removes `node` with its edges (`cuGraphDestroyNode`): its dependents lose that
    /// dependency, and `node` is no longer valid.
    ///
    /// # Safety
    /// `node` must be a node of `self` that `self` still holds.
    pub unsafe fn remove_node(&mut self, node: CudaGraphNode) -> GpuResult<()> {
        self.graph
            .remove_node(node)
            .map_err(failed("cuGraphDestroyNode"))
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for cudarc::driver::CudaStream {}
}

/// What cudarc's `CudaStream` lacks to capture a DAG from one stream, as the replay does: the
/// capture's current dependencies read and set (`cuStreamGetCaptureInfo`,
/// `cuStreamUpdateCaptureDependencies`, CUDA 12.3 drivers and later: an older one is an
/// error), a root, and the end of a capture as a template ([`CudaGraphTemplate`]) rather than
/// cudarc's instantiated `CudaGraph`. Begin the capture with cudarc's `begin_capture`. Sealed:
/// implemented for cudarc's `CudaStream` only.
pub trait CaptureExt: sealed::Sealed {
    /// The nodes the next operation captured on this stream will depend on (the capture's
    /// tail), valid while the capture's graph holds them.
    fn capture_dependencies(&self) -> GpuResult<Vec<CudaGraphNode>>;

    /// Makes the next operation captured on this stream depend on exactly `deps` (none: a
    /// root of the graph, where the driver allows an empty set; else see
    /// [`add_capture_root`](Self::add_capture_root)).
    ///
    /// # Safety
    /// Every node of `deps` must be a node of the graph being captured on this stream (from
    /// [`capture_dependencies`](Self::capture_dependencies) or
    /// [`add_capture_root`](Self::add_capture_root) of this capture).
    unsafe fn set_capture_dependencies(&self, deps: &[CudaGraphNode]) -> GpuResult<()>;

    /// Adds an empty node with no dependencies to the graph being captured on this stream:
    /// a root the next captured operations can depend on (some drivers refuse an empty
    /// dependency set); remove it from the template once captured, if it must not stay.
    fn add_capture_root(&self) -> GpuResult<CudaGraphNode>;

    /// Ends the capture on this stream and returns what it recorded, not instantiated
    /// (`cuStreamEndCapture`); `None` where the capture made no graph.
    fn end_capture_template(&self) -> GpuResult<Option<CudaGraphTemplate>>;
}

/// Fails unless the driver has the capture calls [`CaptureExt`] makes (through the dynamic
/// loader, a missing one would panic).
fn capture_v3(call: &str) -> GpuResult<()> {
    if driver::has_capture_v3() {
        return Ok(());
    }
    Err(GpuError::new(
        GpuErrorKind::Driver,
        format!("{WHAT}: {call} needs a CUDA 12.3 driver or later"),
    ))
}

impl CaptureExt for CudaStream {
    fn capture_dependencies(&self) -> GpuResult<Vec<CudaGraphNode>> {
        capture_v3("cuStreamGetCaptureInfo")?;
        driver::capture_tail(StreamRef::of(self)).map_err(failed("cuStreamGetCaptureInfo"))
    }

    unsafe fn set_capture_dependencies(&self, deps: &[CudaGraphNode]) -> GpuResult<()> {
        capture_v3("cuStreamUpdateCaptureDependencies")?;
        driver::capture_set_tail(StreamRef::of(self), deps)
            .map_err(failed("cuStreamUpdateCaptureDependencies"))
    }

    fn add_capture_root(&self) -> GpuResult<CudaGraphNode> {
        capture_v3("cuStreamGetCaptureInfo")?;
        driver::capture_root(StreamRef::of(self)).map_err(failed("cuGraphAddEmptyNode"))
    }

    fn end_capture_template(&self) -> GpuResult<Option<CudaGraphTemplate>> {
        let graph =
            driver::end_capture(StreamRef::of(self)).map_err(failed("cuStreamEndCapture"))?;
        Ok(graph.map(|graph| CudaGraphTemplate { graph }))
    }
}
