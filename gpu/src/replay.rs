//! Replay: a reused graph's GPU work captured once into CUDA graphs and replayed.
//!
//! A [`ReplayBuilder`] describes a graph of three kinds of node: *captured* GPU nodes
//! ([`ReplayBuilder::gpu_node`]), *eager* GPU nodes ([`ReplayBuilder::eager_gpu_node`], run
//! every time like host nodes, for per-run uploads and downloads) and host nodes
//! ([`ReplayBuilder::host_node`]). [`ReplayBuilder::build`] makes a [`Replayable`]:
//!
//! * **Segments.** Captured nodes are split into segments by *cut level* (the most host nodes,
//!   eager nodes and device changes on a path from a source to the node) and device: a path
//!   between two nodes of a segment keeps the level, so it has no host node, eager node or other
//!   device on it, and every edge between segments raises the level, so segments and the other
//!   nodes form a DAG. Independent nodes of a level share a segment. Each segment becomes
//!   one CUDA graph per instance, launched by one GPU node of the scheduler graph; host and
//!   eager nodes stay scheduler nodes, so they run every time, in DAG order, between the
//!   segments, and a host node after a segment waits for it the way host successors of GPU
//!   nodes always do (its worker polls an event; no spin, no driver callback). Edges between
//!   segments, also across devices, are the ordinary GPU edges (stream hand-off or events).
//! * **Capture** (the first run of an instance, and the first after [`Replayable::update`]):
//!   the segment's node runs on a bound worker; it makes a capture stream, begins a capture in
//!   thread-local mode (other workers go on running eager graphs), and calls the members'
//!   bodies in a topological order, each with its own dependencies set on the capture
//!   (`cuStreamUpdateCaptureDependencies`: the union of its segment predecessors' last captured
//!   nodes), so the CUDA graph keeps the DAG's parallelism though one thread captured it.
//!   Allocations are hoisted out of the capture (made on the worker's own stream, relaxed mode:
//!   they live as long as the node outputs holding them); host-to-device copies are staged
//!   into a device buffer the segment keeps and captured as device-to-device copies; a
//!   download, a dropped buffer (a free) or anything that invalidates the capture fails it with
//!   [`GpuErrorKind::Capture`] naming the node and the reason. Then the graph is instantiated
//!   (or, after an update, the executable updated in place with `cuGraphExecUpdate`,
//!   re-instantiated only when the driver refuses) and launched.
//! * **Replay**: the segment's node launches the executable on its stream. GPU bodies are not
//!   called; GPU nodes' outputs are the values their bodies returned at the capture (the same
//!   buffers every run, new contents).
//! * **Instances.** CUDA runs one launch of an executable at a time, and outputs are shared, so
//!   a run holds one *instance* (its executables and outputs) from submission to completion.
//!   [`ReplayBuilder::instances`] (default 1) instances at most are made, each captured at its
//!   first run; a run that finds them all busy waits for one.
//! * **Lifetimes.** Executables are owned by [`ExecSlot`]s; dropping the last owner anywhere
//!   queues the executable on its device's release queue, destroyed by a bound worker; the
//!   device's teardown destroys what is left. Capture templates are destroyed on the capturing
//!   worker right after instantiation.

use std::any::Any;
use std::cell::RefCell;
use std::collections::HashSet;
use std::fmt;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use boundpool_scheduler::{BoxError, GraphBuilder, GraphOutput, NodeCtx, NodeRef};

use crate::buffer::{self, DeviceBuffer, DeviceCopy};
use crate::capture::Capture;
use crate::device::ExecSlot;
use crate::device::GpuDevice;
use crate::driver::{self, GraphExec, GraphNode, StreamRef};
use crate::error::{GpuError, GpuErrorKind, GpuResult};
use crate::node::{GpuCtx, GpuGraphExt};
use crate::pool::{GpuGraph, GpuPool};
use crate::worker::GpuWorker;
use cudarc::driver::CudaStream;

/// A node's output, type-erased (every node of a replay graph returns one).
type Out = Arc<dyn Any + Send + Sync>;
type Body = Arc<dyn Fn(&ReplayCtx<'_, '_>) -> Result<Out, BoxError> + Send + Sync>;

static NEXT_GRAPH: AtomicU64 = AtomicU64::new(1);

/// A node of a [`ReplayBuilder`] whose output is a `T`.
pub struct RNode<T> {
    idx: u32,
    graph: u64,
    _t: PhantomData<fn() -> T>,
}

impl<T> Clone for RNode<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for RNode<T> {}
impl<T> fmt::Debug for RNode<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RNode({})", self.idx)
    }
}

impl<T> RNode<T> {
    /// The node's index in its builder (the order nodes were added).
    pub fn index(&self) -> usize {
        self.idx as usize
    }
}

#[derive(Clone)]
enum Kind {
    Captured(GpuDevice),
    Eager(GpuDevice),
    Host,
}

/// The graph's description, shared by the eager graph and every instance.
struct Desc {
    name: String,
    names: Vec<String>,
    kinds: Vec<Kind>,
    bodies: Vec<Body>,
    preds: Vec<Vec<u32>>,
    /// Segment of each captured node.
    seg_of: Vec<Option<u32>>,
    /// Each segment's members, in a topological order.
    segments: Vec<Vec<u32>>,
    /// With [`ReplayBuilder::max_width`]: the member of its segment each captured node is
    /// also made to follow (the previous node of its lane), where its own predecessors do not
    /// already order it.
    after: Vec<Option<u32>>,
}

impl Desc {
    fn captured(&self, i: u32) -> bool {
        matches!(self.kinds[i as usize], Kind::Captured(_))
    }
}

/// Builds a [`Replayable`] graph (see the module docs).
pub struct ReplayBuilder {
    uid: u64,
    name: String,
    names: Vec<String>,
    kinds: Vec<Kind>,
    bodies: Vec<Body>,
    edges: Vec<(u32, u32)>,
    bad: Option<String>,
    instances: usize,
    max_width: Option<usize>,
}

impl fmt::Debug for ReplayBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReplayBuilder")
            .field("name", &self.name)
            .field("nodes", &self.names.len())
            .field("edges", &self.edges.len())
            .finish()
    }
}

fn erase<T, F>(body: F) -> Body
where
    T: Send + Sync + 'static,
    F: Fn(&ReplayCtx<'_, '_>) -> Result<T, BoxError> + Send + Sync + 'static,
{
    Arc::new(move |c: &ReplayCtx<'_, '_>| body(c).map(|v| Arc::new(v) as Out))
}

impl ReplayBuilder {
    /// An empty replay graph named `name`, one instance.
    pub fn new(name: &str) -> Self {
        Self {
            uid: NEXT_GRAPH.fetch_add(1, Ordering::Relaxed),
            name: name.to_owned(),
            names: Vec::new(),
            kinds: Vec::new(),
            bodies: Vec::new(),
            edges: Vec::new(),
            bad: None,
            instances: 1,
            max_width: None,
        }
    }

    /// The most instances (each with its own executables and outputs, captured at its first
    /// run) that concurrent runs may use; a run that finds all of them busy waits. Default 1:
    /// runs of the graph queue, and GPU outputs are the same buffers for every run.
    pub fn instances(&mut self, n: usize) -> &mut Self {
        self.instances = n.max(1);
        self
    }

    /// Captures each segment with at most `w` branches (`w` >= 1): captured nodes are spread
    /// over `w` lanes in a topological order, each node placed on the lane of one of its
    /// predecessors when that predecessor is the lane's last node, else on the lane used least
    /// recently, after that lane's last node. The CUDA graph then has the DAG's edges plus
    /// those lane edges, so no more than `w` of its nodes can run at once.
    ///
    /// Default: no limit, the CUDA graph has exactly the DAG's edges. A limit pays where nodes
    /// are short launches that do not fill the GPU: the driver launches a chain of kernel nodes
    /// faster than as many independent ones (1,000 empty kernels on an H200: 0.68 µs a node as
    /// a chain, 0.83 µs independent), and one stream's capture in PyTorch is a chain anyway.
    /// Never use it where nodes of one segment wait on each other through memory (a kernel
    /// spinning on a flag another independent node sets): a lane edge could order the waiter
    /// first.
    pub fn max_width(&mut self, w: usize) -> &mut Self {
        self.max_width = Some(w.max(1));
        self
    }

    fn push(&mut self, name: &str, kind: Kind, body: Body) -> u32 {
        self.names.push(name.to_owned());
        self.kinds.push(kind);
        self.bodies.push(body);
        (self.names.len() - 1) as u32
    }

    fn rnode<T>(&self, idx: u32) -> RNode<T> {
        RNode {
            idx,
            graph: self.uid,
            _t: PhantomData,
        }
    }

    /// A captured GPU node on `device`: its body runs at a capture only (its device work is
    /// recorded and replayed; its output is kept and given to every later run).
    pub fn gpu_node<T, F>(&mut self, device: &GpuDevice, name: &str, body: F) -> RNode<T>
    where
        T: Send + Sync + 'static,
        F: Fn(&ReplayCtx<'_, '_>) -> Result<T, BoxError> + Send + Sync + 'static,
    {
        let i = self.push(name, Kind::Captured(device.clone()), erase(body));
        self.rnode(i)
    }

    /// An eager GPU node on `device`: run every time (not captured), like a host node, with a
    /// full [`GpuCtx`] (uploads of per-run inputs into buffers captured nodes made, downloads
    /// of results). It splits segments like a host node.
    pub fn eager_gpu_node<T, F>(&mut self, device: &GpuDevice, name: &str, body: F) -> RNode<T>
    where
        T: Send + Sync + 'static,
        F: Fn(&ReplayCtx<'_, '_>) -> Result<T, BoxError> + Send + Sync + 'static,
    {
        let i = self.push(name, Kind::Eager(device.clone()), erase(body));
        self.rnode(i)
    }

    /// A host node: run every time, on any worker, after its predecessors have completed
    /// (GPU predecessors on the device too).
    pub fn host_node<T, F>(&mut self, name: &str, body: F) -> RNode<T>
    where
        T: Send + Sync + 'static,
        F: Fn(&ReplayCtx<'_, '_>) -> Result<T, BoxError> + Send + Sync + 'static,
    {
        let i = self.push(name, Kind::Host, erase(body));
        self.rnode(i)
    }

    /// `to` runs after `from` and may read its output.
    pub fn edge<A, B>(&mut self, from: RNode<A>, to: RNode<B>) -> &mut Self {
        if from.graph != self.uid || to.graph != self.uid {
            self.bad
                .get_or_insert_with(|| "an edge names a node of another replay graph".into());
        } else {
            self.edges.push((from.idx, to.idx));
        }
        self
    }

    /// Checks the graph (no cycle, no foreign node), splits it into segments and builds the
    /// eager graph. Nothing is captured yet: each instance captures at its first run.
    pub fn build(self) -> GpuResult<Replayable> {
        let invalid = |m: String| GpuError::new(GpuErrorKind::InvalidArgument, m);
        if let Some(b) = self.bad {
            return Err(invalid(format!("replay graph '{}': {b}", self.name)));
        }
        let n = self.names.len();
        let mut preds: Vec<Vec<u32>> = vec![Vec::new(); n];
        let mut succs: Vec<Vec<u32>> = vec![Vec::new(); n];
        let mut seen = HashSet::new();
        for &(a, b) in &self.edges {
            if a == b {
                return Err(invalid(format!(
                    "replay graph '{}': node '{}' after itself",
                    self.name, self.names[a as usize]
                )));
            }
            if seen.insert((a, b)) {
                preds[b as usize].push(a);
                succs[a as usize].push(b);
            }
        }
        // Kahn's order; a cycle leaves nodes out.
        let mut indeg: Vec<usize> = preds.iter().map(Vec::len).collect();
        let mut order: Vec<u32> = (0..n as u32).filter(|&i| indeg[i as usize] == 0).collect();
        let mut k = 0;
        while k < order.len() {
            let v = order[k];
            k += 1;
            for &s in &succs[v as usize] {
                indeg[s as usize] -= 1;
                if indeg[s as usize] == 0 {
                    order.push(s);
                }
            }
        }
        if order.len() != n {
            return Err(invalid(format!("replay graph '{}' has a cycle", self.name)));
        }
        let devices: Vec<Option<i32>> = self
            .kinds
            .iter()
            .map(|k| match k {
                Kind::Captured(d) => Some(d.ordinal()),
                _ => None,
            })
            .collect();
        let (seg_of, segments) = plan_segments(&devices, &preds, &order);
        let after = match self.max_width {
            Some(w) => plan_lanes(&segments, &seg_of, &preds, w),
            None => vec![None; n],
        };
        let desc = Arc::new(Desc {
            name: self.name,
            names: self.names,
            kinds: self.kinds,
            bodies: self.bodies,
            preds,
            seg_of,
            segments,
            after,
        });
        let (eager, eager_refs) = build_eager(&desc)?;
        Ok(Replayable {
            desc,
            eager,
            eager_refs,
            shared: Arc::new(Shared::default()),
            max: self.instances,
            pool: Mutex::new(InstancePool::default()),
            freed: Condvar::new(),
        })
    }
}

/// Splits the captured nodes (`devices[i]`: Some(ordinal)) into segments: returns each node's
/// segment and each segment's members in `order` (a topological order).
///
/// Cut levels: an edge adds 1 unless both ends are captured nodes of one device. A segment is
/// the captured nodes of one level and one device: a path between two of them keeps the level,
/// so it passes only through captured nodes of that device (the segment is convex); an edge
/// between segments raises the level (they form a DAG with the other nodes). Independent nodes
/// of a level share one CUDA graph.
fn plan_segments(
    devices: &[Option<i32>],
    preds: &[Vec<u32>],
    order: &[u32],
) -> (Vec<Option<u32>>, Vec<Vec<u32>>) {
    let n = devices.len();
    let mut level = vec![0u64; n];
    for &v in order {
        let dv = devices[v as usize];
        for &p in &preds[v as usize] {
            let inc = u64::from(!(dv.is_some() && devices[p as usize] == dv));
            level[v as usize] = level[v as usize].max(level[p as usize] + inc);
        }
    }
    let mut seg_key: std::collections::HashMap<(u64, i32), u32> = Default::default();
    let mut seg_of: Vec<Option<u32>> = vec![None; n];
    let mut segments: Vec<Vec<u32>> = Vec::new();
    for &v in order {
        let Some(d) = devices[v as usize] else {
            continue;
        };
        let s = *seg_key.entry((level[v as usize], d)).or_insert_with(|| {
            segments.push(Vec::new());
            (segments.len() - 1) as u32
        });
        seg_of[v as usize] = Some(s);
        segments[s as usize].push(v);
    }
    (seg_of, segments)
}

/// [`ReplayBuilder::max_width`]: spreads each segment's members (in their topological order)
/// over `w` lanes and returns, for each node, the member it must also follow (its lane's
/// previous node) where none of its own predecessors is that node. Every lane is a chain, so
/// at most `w` members of a segment are ever unordered with each other.
fn plan_lanes(
    segments: &[Vec<u32>],
    seg_of: &[Option<u32>],
    preds: &[Vec<u32>],
    w: usize,
) -> Vec<Option<u32>> {
    let mut after = vec![None; seg_of.len()];
    let mut lane_of: Vec<usize> = vec![usize::MAX; seg_of.len()];
    for (k, members) in segments.iter().enumerate() {
        // Each lane's last node and when it was last extended.
        let mut tail: Vec<Option<u32>> = vec![None; w];
        let mut used: Vec<usize> = vec![0; w];
        for (step, &m) in members.iter().enumerate() {
            let own = preds[m as usize].iter().copied().filter(|&p| {
                seg_of[p as usize] == Some(k as u32) && tail[lane_of[p as usize]] == Some(p)
            });
            let lane = match own.min_by_key(|&p| lane_of[p as usize]) {
                Some(p) => lane_of[p as usize],
                None => {
                    let l = (0..w)
                        .min_by_key(|&l| (tail[l].is_some(), used[l]))
                        .expect("w >= 1");
                    after[m as usize] = tail[l];
                    l
                }
            };
            tail[lane] = Some(m);
            used[lane] = step + 1;
            lane_of[m as usize] = lane;
        }
    }
    after
}

fn sched_error(e: boundpool_scheduler::Error) -> GpuError {
    GpuError::new(GpuErrorKind::Scheduler, e.to_string()).with_source(e)
}

type Refs = Arc<OnceLock<Vec<NodeRef<Out>>>>;

/// The eager graph: every node a scheduler node, GPU bodies run every time.
fn build_eager(desc: &Arc<Desc>) -> GpuResult<(GpuGraph, Arc<[NodeRef<Out>]>)> {
    let refs: Refs = Arc::new(OnceLock::new());
    let mut g: GraphBuilder<GpuWorker> = GraphBuilder::new(format!("{} (eager)", desc.name));
    let mut out = Vec::with_capacity(desc.names.len());
    for i in 0..desc.names.len() {
        let (d2, r2) = (desc.clone(), refs.clone());
        let me = i as u32;
        let r = match &desc.kinds[i] {
            Kind::Captured(dev) | Kind::Eager(dev) => {
                g.gpu_node(dev, &desc.names[i], move |gctx: &GpuCtx<'_, '_>| {
                    let refs = r2.get().map(Vec::as_slice).unwrap_or(&[]);
                    let c = ReplayCtx {
                        gpu: Some(gctx),
                        node: gctx.node(),
                        me,
                        desc: &d2,
                        src: Source::Eager(refs),
                    };
                    (d2.bodies[me as usize])(&c)
                })
            }
            Kind::Host => g.node(
                desc.names[i].clone(),
                move |node: &NodeCtx<'_, GpuWorker>| {
                    let refs = r2.get().map(Vec::as_slice).unwrap_or(&[]);
                    let c = ReplayCtx {
                        gpu: None,
                        node,
                        me,
                        desc: &d2,
                        src: Source::Eager(refs),
                    };
                    (d2.bodies[me as usize])(&c)
                },
            ),
        };
        out.push(r);
    }
    for (v, ps) in desc.preds.iter().enumerate() {
        for &p in ps {
            g.edge(out[p as usize], out[v]);
        }
    }
    let _ = refs.set(out.clone());
    let graph = g.build().map_err(sched_error)?;
    Ok((graph, out.into()))
}

/// Where a body's inputs come from.
enum Source<'c> {
    /// The eager graph: every node is a scheduler node.
    Eager(&'c [NodeRef<Out>]),
    /// An instance's graph: host and eager nodes are scheduler nodes (`refs`); captured
    /// nodes' outputs are the instance's, or, while segment `seg` captures, `local`'s.
    Replay {
        refs: &'c [NodeRef<Out>],
        state: &'c InstanceState,
        capture: Option<(u32, &'c RefCell<Vec<Option<Out>>>)>,
    },
}

/// What a replay graph's body gets: its inputs, its node's name, and for GPU nodes the
/// [`GpuCtx`] to enqueue work with (under a capture, work is recorded, not run).
pub struct ReplayCtx<'c, 'n> {
    gpu: Option<&'c GpuCtx<'c, 'n>>,
    node: &'c NodeCtx<'n, GpuWorker>,
    me: u32,
    desc: &'c Desc,
    src: Source<'c>,
}

impl fmt::Debug for ReplayCtx<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReplayCtx")
            .field("node", &self.node_name())
            .field("gpu", &self.gpu.is_some())
            .finish()
    }
}

impl<'c, 'n> ReplayCtx<'c, 'n> {
    /// This node's name.
    pub fn node_name(&self) -> &str {
        &self.desc.names[self.me as usize]
    }

    /// Whether this body is being captured (else it runs eagerly: an eager run, an eager GPU
    /// node, a host node).
    pub fn is_capturing(&self) -> bool {
        self.gpu.is_some_and(GpuCtx::is_capturing)
    }

    /// The GPU context of a GPU node (an error for a host node).
    pub fn gpu(&self) -> GpuResult<&'c GpuCtx<'c, 'n>> {
        self.gpu.ok_or_else(|| {
            GpuError::new(
                GpuErrorKind::InvalidArgument,
                format!(
                    "node '{}' of replay graph '{}' is a host node: it has no GPU context",
                    self.node_name(),
                    self.desc.name
                ),
            )
        })
    }

    /// The output of direct predecessor `from` (shared: a captured node's output is the one
    /// its body returned at the capture).
    pub fn input<T: Send + Sync + 'static>(&self, from: RNode<T>) -> GpuResult<Arc<T>> {
        let bad = |why: &str| {
            GpuError::new(
                GpuErrorKind::InvalidArgument,
                format!(
                    "node '{}' of replay graph '{}': input {}: {why}",
                    self.node_name(),
                    self.desc.name,
                    from.idx
                ),
            )
        };
        if !self.desc.preds[self.me as usize].contains(&from.idx) {
            return Err(bad("not a direct predecessor"));
        }
        let sched = |refs: &[NodeRef<Out>]| -> GpuResult<Out> {
            let r = refs
                .get(from.idx as usize)
                .ok_or_else(|| bad("unknown node"))?;
            self.node
                .input(*r)
                .cloned()
                .map_err(|e| bad(&e.to_string()))
        };
        let out: Out = match &self.src {
            Source::Eager(refs) => sched(refs)?,
            Source::Replay {
                refs,
                state,
                capture,
            } => {
                if self.desc.captured(from.idx) {
                    let local = capture.and_then(|(seg, local)| {
                        (self.desc.seg_of[from.idx as usize] == Some(seg))
                            .then(|| local.borrow()[from.idx as usize].clone())
                    });
                    match local {
                        Some(v) => v,
                        None => state.output(from.idx),
                    }
                    .ok_or_else(|| bad("its output is missing (its capture failed)"))?
                } else {
                    sched(refs)?
                }
            }
        };
        out.downcast::<T>().map_err(|_| bad("of another type"))
    }

    /// Enqueues a copy of `src` into `dst` (same length, this node's device), a buffer held by
    /// reference: typically a captured node's output written by an eager GPU node every run
    /// (new inputs into a replay's static input buffer). Under a capture the data is staged
    /// (see the module docs). An error for a host node.
    pub fn copy_into<T: DeviceCopy>(&self, src: &[T], dst: &DeviceBuffer<T>) -> GpuResult<()> {
        self.gpu()?.copy_into(src, dst)
    }

    /// The scheduler's context of the node running this body (under a capture, the segment's
    /// node).
    pub fn node(&self) -> &'c NodeCtx<'n, GpuWorker> {
        self.node
    }
}

// ----------------------------------------------------------------------------------------------
// Executables, instances.

struct SegState {
    slot: Arc<ExecSlot>,
    /// The generation captured (None: never, or the last capture failed).
    generation: Option<u64>,
    /// Staging buffers of captured host copies.
    _staged: Vec<DeviceBuffer<u8>>,
}

struct InstanceState {
    desc: Arc<Desc>,
    shared: Arc<Shared>,
    outputs: Mutex<Vec<Option<Out>>>,
    segs: Vec<Mutex<SegState>>,
}

impl InstanceState {
    fn output(&self, i: u32) -> Option<Out> {
        self.outputs.lock().unwrap_or_else(|e| e.into_inner())[i as usize].clone()
    }
}

struct Instance {
    state: Arc<InstanceState>,
    graph: GpuGraph,
    refs: Arc<[NodeRef<Out>]>,
}

#[derive(Default)]
struct InstancePool {
    free: Vec<Instance>,
    made: usize,
}

#[derive(Default)]
struct Shared {
    generation: AtomicU64,
    execs: Arc<AtomicUsize>,
    stats: Mutex<ReplayStats>,
}

/// What captures have cost so far (totals over every segment and instance).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ReplayStats {
    /// Segment captures that succeeded (first captures and updates).
    pub captures: u64,
    /// Captures that failed.
    pub failed_captures: u64,
    /// Time in captures: bodies called under capture, capture begin/end.
    pub capture_time: Duration,
    /// Executables instantiated (first captures, and updates the driver refused).
    pub instantiations: u64,
    /// Time instantiating.
    pub instantiate_time: Duration,
    /// Executables updated in place (`cuGraphExecUpdate`).
    pub updates: u64,
    /// Updates the driver refused (topology changed): re-instantiated instead.
    pub update_fallbacks: u64,
    /// Time in `cuGraphExecUpdate` (successful or not).
    pub update_time: Duration,
    /// CUDA graph nodes captured, summed over captures.
    pub captured_nodes: u64,
    /// CUDA graph edges captured, summed over captures (an independent segment has none: the
    /// capture keeps the DAG's parallelism).
    pub captured_edges: u64,
    /// Captures during which the driver refused an empty dependency set, so that an empty
    /// node stood in for it (removed before instantiation).
    pub stand_in_roots: u64,
}

/// A graph whose GPU work is captured once per instance and replayed (see the module docs).
pub struct Replayable {
    desc: Arc<Desc>,
    eager: GpuGraph,
    eager_refs: Arc<[NodeRef<Out>]>,
    shared: Arc<Shared>,
    max: usize,
    pool: Mutex<InstancePool>,
    freed: Condvar,
}

impl fmt::Debug for Replayable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Replayable")
            .field("name", &self.desc.name)
            .field("nodes", &self.desc.names.len())
            .field("segments", &self.desc.segments.len())
            .field("instances", &self.instances())
            .finish()
    }
}

/// The outputs of one run: host and eager nodes' values of this run, captured nodes' values
/// from their capture (shared with later runs of the same instance: same buffers).
pub struct ReplayOutput {
    out: GraphOutput,
    refs: Arc<[NodeRef<Out>]>,
    state: Option<Arc<InstanceState>>,
    desc: Arc<Desc>,
}

impl fmt::Debug for ReplayOutput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReplayOutput")
            .field("graph", &self.desc.name)
            .field("replayed", &self.state.is_some())
            .finish()
    }
}

impl ReplayOutput {
    /// The output of node `r`.
    pub fn get<T: Send + Sync + 'static>(&self, r: RNode<T>) -> Option<Arc<T>> {
        let v: Out = match &self.state {
            Some(s) if self.desc.captured(r.idx) => s.output(r.idx)?,
            _ => self.out.get(*self.refs.get(r.idx as usize)?)?.clone(),
        };
        v.downcast::<T>().ok()
    }
}

impl Replayable {
    /// The graph's name.
    pub fn name(&self) -> &str {
        &self.desc.name
    }

    /// Number of segments (CUDA graphs per instance).
    pub fn segments(&self) -> usize {
        self.desc.segments.len()
    }

    /// The segment of captured node `r` (None for host and eager nodes).
    pub fn segment_of<T>(&self, r: RNode<T>) -> Option<usize> {
        self.desc
            .seg_of
            .get(r.idx as usize)
            .copied()
            .flatten()
            .map(|s| s as usize)
    }

    /// Instances made so far (at most [`ReplayBuilder::instances`]).
    pub fn instances(&self) -> usize {
        self.pool.lock().unwrap_or_else(|e| e.into_inner()).made
    }

    /// Executables this graph holds now (at most one per segment and instance; none for a
    /// segment whose capture recorded no work).
    pub fn executables(&self) -> usize {
        self.shared.execs.load(Ordering::Relaxed)
    }

    /// Capture, instantiation and update costs so far.
    pub fn stats(&self) -> ReplayStats {
        *self.shared.stats.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Marks every instance's capture stale: the next run of each instance calls the GPU
    /// bodies again under capture and updates its executables in place (`cuGraphExecUpdate`;
    /// re-instantiated only where the driver refuses, the topology having changed). Outputs
    /// are then the values the bodies return at that capture.
    pub fn update(&self) {
        self.shared.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// Runs the graph with every body called, as an ordinary graph (no capture).
    pub fn run_eager(&self, pool: &GpuPool) -> GpuResult<ReplayOutput> {
        let out = pool.submit(&self.eager)?.wait().map_err(sched_error)?;
        Ok(ReplayOutput {
            out,
            refs: self.eager_refs.clone(),
            state: None,
            desc: self.desc.clone(),
        })
    }

    /// Runs the graph on an instance: captures at the instance's first run (and after
    /// [`update`](Self::update)), replays otherwise. Blocks until an instance is free and the
    /// run has completed. A failed capture fails the run with [`GpuErrorKind::Capture`] (the
    /// segment is captured again at the next run); [`run_eager`](Self::run_eager) still works.
    pub fn run(&self, pool: &GpuPool) -> GpuResult<ReplayOutput> {
        let inst = self.acquire()?;
        let r = pool
            .submit(&inst.graph)
            .and_then(|h| h.wait().map_err(sched_error));
        let out = r.map(|out| ReplayOutput {
            out,
            refs: inst.refs.clone(),
            state: Some(inst.state.clone()),
            desc: self.desc.clone(),
        });
        let mut p = self.pool.lock().unwrap_or_else(|e| e.into_inner());
        p.free.push(inst);
        drop(p);
        self.freed.notify_one();
        out
    }

    fn acquire(&self) -> GpuResult<Instance> {
        let mut p = self.pool.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(i) = p.free.pop() {
                return Ok(i);
            }
            if p.made < self.max {
                p.made += 1;
                drop(p);
                let made = self.make_instance();
                if made.is_err() {
                    self.pool.lock().unwrap_or_else(|e| e.into_inner()).made -= 1;
                    // A waiter may make it instead.
                    self.freed.notify_all();
                }
                return made;
            }
            p = self.freed.wait(p).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// An instance's scheduler graph: one GPU node per segment, host and eager nodes as they
    /// are, edges between them.
    fn make_instance(&self) -> GpuResult<Instance> {
        let desc = &self.desc;
        let segs = desc
            .segments
            .iter()
            .map(|m| {
                let Kind::Captured(dev) = &desc.kinds[m[0] as usize] else {
                    unreachable!("segments hold captured nodes only")
                };
                let slot = Arc::new(ExecSlot::new(dev.shared.clone(), self.shared.execs.clone()));
                dev.shared.register_exec_slot(&slot);
                Mutex::new(SegState {
                    slot,
                    generation: None,
                    _staged: Vec::new(),
                })
            })
            .collect();
        let state = Arc::new(InstanceState {
            desc: desc.clone(),
            shared: self.shared.clone(),
            outputs: Mutex::new(vec![None; desc.names.len()]),
            segs,
        });
        let refs: Refs = Arc::new(OnceLock::new());
        let mut g: GraphBuilder<GpuWorker> = GraphBuilder::new(desc.name.clone());
        let mut seg_nodes = Vec::with_capacity(desc.segments.len());
        for (k, members) in desc.segments.iter().enumerate() {
            let Kind::Captured(dev) = &desc.kinds[members[0] as usize] else {
                unreachable!("segments hold captured nodes only")
            };
            let (st, r2) = (state.clone(), refs.clone());
            let name = format!("{} segment {k}", desc.name);
            seg_nodes.push(g.gpu_node(dev, &name, move |gctx: &GpuCtx<'_, '_>| {
                let refs = r2.get().map(Vec::as_slice).unwrap_or(&[]);
                run_segment(&st, k as u32, gctx, refs).map(|()| Arc::new(()) as Out)
            }));
        }
        let mut node_ref: Vec<NodeRef<Out>> = Vec::with_capacity(desc.names.len());
        for i in 0..desc.names.len() {
            let me = i as u32;
            let (st, r2) = (state.clone(), refs.clone());
            let r = match &desc.kinds[i] {
                Kind::Captured(_) => seg_nodes[desc.seg_of[i].expect("captured") as usize],
                Kind::Eager(dev) => {
                    g.gpu_node(dev, &desc.names[i], move |gctx: &GpuCtx<'_, '_>| {
                        let refs = r2.get().map(Vec::as_slice).unwrap_or(&[]);
                        let c = ReplayCtx {
                            gpu: Some(gctx),
                            node: gctx.node(),
                            me,
                            desc: &st.desc,
                            src: Source::Replay {
                                refs,
                                state: &st,
                                capture: None,
                            },
                        };
                        (st.desc.bodies[i])(&c)
                    })
                }
                Kind::Host => g.node(
                    desc.names[i].clone(),
                    move |node: &NodeCtx<'_, GpuWorker>| {
                        let refs = r2.get().map(Vec::as_slice).unwrap_or(&[]);
                        let c = ReplayCtx {
                            gpu: None,
                            node,
                            me,
                            desc: &st.desc,
                            src: Source::Replay {
                                refs,
                                state: &st,
                                capture: None,
                            },
                        };
                        (st.desc.bodies[i])(&c)
                    },
                ),
            };
            node_ref.push(r);
        }
        let mut edges = HashSet::new();
        for (v, ps) in desc.preds.iter().enumerate() {
            for &p in ps {
                let (a, b) = (node_ref[p as usize], node_ref[v]);
                if a.id() != b.id() && edges.insert((a.id().index(), b.id().index())) {
                    g.edge(a, b);
                }
            }
        }
        let _ = refs.set(node_ref.clone());
        let graph = g.build().map_err(sched_error)?;
        Ok(Instance {
            state,
            graph,
            refs: node_ref.into(),
        })
    }
}

/// Body of a segment's node: capture when the instance's segment is not captured for the
/// current generation, then launch the executable on the node's stream.
fn run_segment(
    st: &InstanceState,
    k: u32,
    gctx: &GpuCtx<'_, '_>,
    refs: &[NodeRef<Out>],
) -> Result<(), BoxError> {
    let mut seg = st.segs[k as usize]
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let generation = st.shared.generation.load(Ordering::Acquire);
    if seg.generation != Some(generation) {
        seg.generation = None;
        match capture_segment(st, k, gctx, refs, &mut seg) {
            Ok(()) => seg.generation = Some(generation),
            Err(e) => {
                st.shared
                    .stats
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .failed_captures += 1;
                return Err(Box::new(e));
            }
        }
    }
    let exec = seg.slot.exec.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(e) = exec.as_ref() {
        driver::graph_launch(gctx.b.ctx, e, gctx.stream)
            .map_err(|e| Box::new(gctx.fail_call("cuGraphLaunch", e)) as BoxError)?;
        gctx.b.device.metrics().replays.increment(1);
    }
    Ok(())
}

/// Ends a capture however the capturing code leaves (error or panic): the stream stops
/// capturing, the partial graph and the stream are destroyed, the thread's flag is cleared.
struct CaptureGuard {
    ctx: driver::Ctx,
    /// Dropped (destroyed, unless a body kept a clone) when the capture ends.
    stream: Option<Arc<CudaStream>>,
}

impl CaptureGuard {
    fn finish(mut self) -> driver::DResult<Option<driver::CudaGraph>> {
        let s = self.stream.take().expect("finished once");
        buffer::watch_frees(false);
        driver::stream_end_capture(self.ctx, StreamRef::of(&s))
    }
}

impl Drop for CaptureGuard {
    fn drop(&mut self) {
        if let Some(s) = self.stream.take() {
            buffer::watch_frees(false);
            if let Ok(Some(g)) = driver::stream_end_capture(self.ctx, StreamRef::of(&s)) {
                let _ = g.destroy(self.ctx);
            }
        }
    }
}

fn capture_error(st: &InstanceState, node: Option<u32>, why: String) -> GpuError {
    let at = match node {
        Some(i) => format!(" at node '{}'", st.desc.names[i as usize]),
        None => String::new(),
    };
    GpuError::new(
        GpuErrorKind::Capture,
        format!(
            "replay capture of graph '{}' failed{at}: {why} (the graph still runs eagerly: Replayable::run_eager)",
            st.desc.name
        ),
    )
}

fn capture_segment(
    st: &InstanceState,
    k: u32,
    gctx: &GpuCtx<'_, '_>,
    refs: &[NodeRef<Out>],
    seg: &mut SegState,
) -> GpuResult<()> {
    let b = gctx.b;
    let ctx = b.ctx;
    let desc = &*st.desc;
    if !driver::has_capture_v3() {
        return Err(capture_error(
            st,
            None,
            format!(
                "replay needs a CUDA 12.3 driver or newer (this one reports {})",
                driver::driver_version().unwrap_or(0)
            ),
        ));
    }
    let drv = |call: &str, e| capture_error(st, None, gctx.fail_call(call, e).to_string());
    let t0 = Instant::now();
    let owned = b.cuda.new_stream().map_err(|e| drv("cuStreamCreate", e))?;
    // The capturing stream: a view of `owned`, which the guard drops when the capture ends
    // (`finish` consumes the guard, after the last use of `cs` below).
    let cs = StreamRef::of(&owned);
    driver::stream_begin_capture(ctx, cs).map_err(|e| drv("cuStreamBeginCapture", e))?;
    let guard = CaptureGuard {
        ctx,
        stream: Some(owned.clone()),
    };
    buffer::watch_frees(true);
    let cap = Capture::new(b.stream, owned);
    let local: RefCell<Vec<Option<Out>>> = RefCell::new(vec![None; desc.names.len()]);
    let mut tails: Vec<Vec<GraphNode>> = vec![Vec::new(); desc.names.len()];
    // The capture's current dependency set (empty at the start; None: not read back).
    let mut current: Option<Vec<GraphNode>> = Some(Vec::new());
    // Members some later member of this segment depends on (lane edges included): only their
    // tails are read back (one driver call less per node for the others, e.g. independent
    // nodes; the replay bench's `captured_graph` baseline shows the graph is the same).
    let mut needed = vec![false; desc.names.len()];
    for &m in &desc.segments[k as usize] {
        for &p in desc.preds[m as usize].iter().chain(&desc.after[m as usize]) {
            if desc.seg_of[p as usize] == Some(k) {
                needed[p as usize] = true;
            }
        }
    }
    let mut empty_root: Option<GraphNode> = None;
    for &m in &desc.segments[k as usize] {
        let mut deps: Vec<GraphNode> = Vec::new();
        for &p in desc.preds[m as usize].iter().chain(&desc.after[m as usize]) {
            if desc.seg_of[p as usize] == Some(k) {
                for d in &tails[p as usize] {
                    if !deps.contains(d) {
                        deps.push(*d);
                    }
                }
            }
        }
        // The capture's tail is the last member's: a chain needs no update at all.
        if let (true, Some(root)) = (deps.is_empty(), empty_root) {
            // The driver refused an empty set before: don't ask again.
            deps.push(root);
        }
        if current.as_ref() != Some(&deps) {
            let set = driver::capture_set_dependencies(ctx, cs, &deps);
            match set {
                Ok(()) => {}
                // A driver that refuses an empty dependency set: the roots depend on one empty
                // node instead (made once per capture).
                Err(_) if deps.is_empty() => {
                    let root = match empty_root {
                        Some(r) => r,
                        None => {
                            let r = driver::capture_add_root(ctx, cs)
                                .map_err(|e| drv("cuGraphAddEmptyNode", e))?;
                            empty_root = Some(r);
                            r
                        }
                    };
                    driver::capture_set_dependencies(ctx, cs, &[root])
                        .map_err(|e| drv("cuStreamUpdateCaptureDependencies", e))?;
                }
                Err(e) => return Err(drv("cuStreamUpdateCaptureDependencies", e)),
            }
        }
        let mctx = GpuCtx {
            node: gctx.node(),
            b,
            stream: cs,
            capture: Some(&cap),
            name: Some(&desc.names[m as usize]),
            cuda_stream: std::cell::OnceCell::new(),
        };
        let rctx = ReplayCtx {
            gpu: Some(&mctx),
            node: gctx.node(),
            me: m,
            desc,
            src: Source::Replay {
                refs,
                state: st,
                capture: Some((k, &local)),
            },
        };
        let r = (desc.bodies[m as usize])(&rctx);
        if let Some(why) = cap.take_refused() {
            return Err(capture_error(st, Some(m), why));
        }
        match r {
            Ok(v) => local.borrow_mut()[m as usize] = Some(v),
            // The body's own error first: it names the call that failed (a free noted below
            // may only be its clean-up).
            Err(e) => {
                return Err(capture_error(st, Some(m), format!("its body failed: {e}")));
            }
        }
        if buffer::take_freed() {
            return Err(capture_error(
                st,
                Some(m),
                "a free (a DeviceBuffer dropped during the body) cannot be captured: the graph would replay on freed memory (return the buffer as an output instead)".into(),
            ));
        }
        match driver::stream_capture_status(ctx, cs) {
            Ok(Some(true)) => {}
            Ok(_) => {
                return Err(capture_error(
                    st,
                    Some(m),
                    "the driver invalidated the capture during this body (an operation a CUDA graph cannot capture: a synchronise, an event query, a host copy or allocation on the capturing stream)".into(),
                ))
            }
            Err(e) => return Err(drv("cuStreamIsCapturing", e)),
        }
        if needed[m as usize] {
            tails[m as usize] = driver::capture_dependencies(ctx, cs)
                .map_err(|e| drv("cuStreamGetCaptureInfo", e))?;
            current = Some(tails[m as usize].clone());
        } else {
            current = None;
        }
    }
    let mut graph = guard
        .finish()
        .map_err(|e| drv("cuStreamEndCapture", e))?
        .ok_or_else(|| capture_error(st, None, "cuStreamEndCapture returned no graph".into()))?;
    // The empty root stood in for an empty dependency set only during the capture: without it
    // the roots are roots again, and the executable has the DAG's topology exactly (a fan-out
    // from one node instantiated several times slower per node than the same roots).
    if let Some(root) = empty_root {
        if let Err(e) = driver::graph_remove_node(ctx, &mut graph, root) {
            let _ = graph.destroy(ctx);
            return Err(drv("cuGraphDestroyNode", e));
        }
    }
    let capture_time = t0.elapsed();
    let counted = driver::graph_node_count(ctx, &graph);
    let nodes = match counted {
        Ok(n) => n,
        Err(e) => {
            let _ = graph.destroy(ctx);
            return Err(drv("cuGraphGetNodes", e));
        }
    };
    let edges = match driver::graph_edge_count(ctx, &graph) {
        Ok(n) => n,
        Err(e) => {
            let _ = graph.destroy(ctx);
            return Err(drv("cuGraphGetEdges", e));
        }
    };
    let mut stats = ReplayStats::default();
    let device = &seg.slot.device;
    let old = seg.slot.take();
    let made: GpuResult<Option<GraphExec>> = if nodes == 0 {
        if let Some(e) = old {
            device.destroy_exec(ctx, e);
        }
        Ok(None)
    } else {
        let updated = match old {
            Some(mut e) => {
                let t = Instant::now();
                let r = driver::graph_exec_update(ctx, &mut e, &graph);
                stats.update_time = t.elapsed();
                match r {
                    Ok(true) => {
                        stats.updates = 1;
                        Some(e)
                    }
                    Ok(false) | Err(_) => {
                        stats.update_fallbacks = 1;
                        device.destroy_exec(ctx, e);
                        None
                    }
                }
            }
            None => None,
        };
        match updated {
            Some(e) => Ok(Some(e)),
            None => {
                let t = Instant::now();
                let r = driver::graph_instantiate(ctx, &graph);
                stats.instantiate_time = t.elapsed();
                stats.instantiations = 1;
                r.map(|e| {
                    device.exec_created();
                    Some(e)
                })
                .map_err(|e| drv("cuGraphInstantiateWithFlags", e))
            }
        }
    };
    let _ = graph.destroy(ctx);
    let exec = made?;
    if let Some(e) = exec {
        *seg.slot.exec.lock().unwrap_or_else(|e| e.into_inner()) = Some(e);
        st.shared.execs.fetch_add(1, Ordering::Relaxed);
    }
    // The new outputs replace the old ones (whose buffers go to the release queue, freed after
    // the work already enqueued on the device).
    {
        let mut outs = st.outputs.lock().unwrap_or_else(|e| e.into_inner());
        let mut local = local.into_inner();
        for &m in &desc.segments[k as usize] {
            outs[m as usize] = local[m as usize].take();
        }
    }
    seg._staged = cap.into_staged();
    let m = b.device.metrics();
    m.captures.increment(1);
    m.exec_instantiations.increment(stats.instantiations);
    m.exec_updates.increment(stats.updates);
    let mut s = st.shared.stats.lock().unwrap_or_else(|e| e.into_inner());
    s.captures += 1;
    s.capture_time += capture_time;
    s.instantiations += stats.instantiations;
    s.instantiate_time += stats.instantiate_time;
    s.updates += stats.updates;
    s.update_fallbacks += stats.update_fallbacks;
    s.update_time += stats.update_time;
    s.captured_nodes += nodes as u64;
    s.captured_edges += edges as u64;
    s.stand_in_roots += u64::from(empty_root.is_some());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{plan_lanes, plan_segments};

    /// A xorshift64 stream from `seed` (non-zero).
    fn xorshift(mut x: u64) -> impl FnMut() -> u64 {
        move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        }
    }

    /// `n` nodes in topological order, each with fewer than `most` distinct predecessors
    /// below it.
    fn random_preds(n: usize, most: u64, next: &mut impl FnMut() -> u64) -> Vec<Vec<u32>> {
        (0..n)
            .map(|i| {
                let mut ps: Vec<u32> = (0..next() % most)
                    .filter(|_| i > 0)
                    .map(|_| (next() % i as u64) as u32)
                    .collect();
                ps.sort_unstable();
                ps.dedup();
                ps
            })
            .collect()
    }

    /// `plan_lanes` on independent nodes: round robin over the lanes, each node after the one
    /// `w` before it.
    #[test]
    fn independent_nodes_fill_lanes_round_robin() {
        let preds = vec![Vec::new(); 7];
        let of = vec![Some(0); 7];
        let after = plan_lanes(&[(0..7).collect()], &of, &preds, 3);
        assert_eq!(
            after,
            vec![None, None, None, Some(0), Some(1), Some(2), Some(3)]
        );
        // A chain stays on one lane whatever the width: no lane edge.
        let chain: Vec<Vec<u32>> = (0..7u32)
            .map(|i| if i == 0 { vec![] } else { vec![i - 1] })
            .collect();
        assert_eq!(
            plan_lanes(&[(0..7).collect()], &of, &chain, 3),
            vec![None; 7]
        );
    }

    /// Random DAGs and segments: lane edges point backwards within one segment, and with them
    /// no `w + 1` members of a segment are pairwise unordered (checked by brute force).
    #[test]
    #[allow(clippy::needless_range_loop)] // index loops read clearer for a reachability matrix
    fn lanes_bound_the_width_of_every_segment() {
        let mut next = xorshift(0x2545_F491_4F6C_DD1D);
        for round in 0..200 {
            let n = 2 + (next() % 11) as usize;
            let w = 1 + (next() % 3) as usize;
            let devices: Vec<Option<i32>> = (0..n)
                .map(|_| if next() % 5 == 0 { None } else { Some(0) })
                .collect();
            let preds = random_preds(n, 3, &mut next);
            let order: Vec<u32> = (0..n as u32).collect();
            let (of, segs) = plan_segments(&devices, &preds, &order);
            let after = plan_lanes(&segs, &of, &preds, w);
            // Reachability over the DAG's edges plus the lane edges (nodes are in order).
            let mut reach = vec![vec![false; n]; n];
            for v in 0..n {
                let ps = preds[v].iter().chain(&after[v]);
                for &p in ps {
                    let p = p as usize;
                    assert!(p < v, "round {round}: an edge {p} -> {v} backwards");
                    reach[p][v] = true;
                    for u in 0..n {
                        if reach[u][p] {
                            reach[u][v] = true;
                        }
                    }
                }
                if let Some(a) = after[v] {
                    assert_eq!(
                        of[a as usize], of[v],
                        "round {round}: lane edge across segments"
                    );
                    assert!(of[v].is_some());
                }
            }
            for seg in &segs {
                // Every (w + 1)-subset of the members has an ordered pair.
                let m = seg.len();
                for mask in 0u32..(1 << m) {
                    if mask.count_ones() as usize != w + 1 {
                        continue;
                    }
                    let pick: Vec<usize> = (0..m)
                        .filter(|&i| mask & (1 << i) != 0)
                        .map(|i| seg[i] as usize)
                        .collect();
                    let ordered = pick
                        .iter()
                        .any(|&a| pick.iter().any(|&b| a != b && reach[a][b]));
                    assert!(ordered, "round {round}: {pick:?} unordered with {w} lanes");
                }
            }
        }
    }

    /// Segments of a graph given as (device or None for host/eager, predecessors), nodes in
    /// topological order.
    fn plan(nodes: &[(Option<i32>, &[u32])]) -> (Vec<Option<u32>>, Vec<Vec<u32>>) {
        let devices: Vec<Option<i32>> = nodes.iter().map(|n| n.0).collect();
        let preds: Vec<Vec<u32>> = nodes.iter().map(|n| n.1.to_vec()).collect();
        let order: Vec<u32> = (0..nodes.len() as u32).collect();
        plan_segments(&devices, &preds, &order)
    }

    #[test]
    fn a_chain_of_gpu_nodes_is_one_segment() {
        let (of, segs) = plan(&[(Some(0), &[]), (Some(0), &[0]), (Some(0), &[1])]);
        assert_eq!(segs, vec![vec![0, 1, 2]]);
        assert_eq!(of, vec![Some(0); 3]);
    }

    #[test]
    fn independent_nodes_share_a_segment() {
        let (_, segs) = plan(&[(Some(0), &[]), (Some(0), &[]), (Some(0), &[])]);
        assert_eq!(segs, vec![vec![0, 1, 2]]);
    }

    #[test]
    fn a_host_node_splits_and_a_bypass_edge_does_not_join() {
        // a -> h -> b, and a -> b directly: a and b must be separate (b waits for h).
        let (of, segs) = plan(&[(Some(0), &[]), (None, &[0]), (Some(0), &[0, 1])]);
        assert_eq!(segs.len(), 2, "{segs:?}");
        assert_eq!(of[1], None);
        assert_ne!(of[0], of[2]);
    }

    #[test]
    fn a_node_beside_the_host_node_stays_in_the_first_segment() {
        // a -> h -> c; a -> b (b does not depend on h): a and b together, c apart.
        let (of, segs) = plan(&[
            (Some(0), &[]),
            (None, &[0]),
            (Some(0), &[0]),
            (Some(0), &[1]),
        ]);
        assert_eq!(segs.len(), 2, "{segs:?}");
        assert_eq!(of[0], of[2]);
        assert_ne!(of[0], of[3]);
    }

    #[test]
    fn devices_alternating_make_a_segment_each() {
        // a(0) -> b(1) -> c(0): c must not share a's graph (it waits for b on device 1).
        let (of, segs) = plan(&[(Some(0), &[]), (Some(1), &[0]), (Some(0), &[1])]);
        assert_eq!(segs.len(), 3, "{segs:?}");
        assert_ne!(of[0], of[2]);
    }

    /// Random DAGs: every segment is convex (no path between two members leaves it) and the
    /// segments with the other nodes form a DAG.
    #[test]
    #[allow(clippy::needless_range_loop)] // index loops read clearer for a reachability matrix
    fn random_graphs_give_convex_acyclic_segments() {
        let mut next = xorshift(0x9E37_79B9_7F4A_7C15);
        for round in 0..300 {
            let n = 2 + (next() % 40) as usize;
            let devices: Vec<Option<i32>> = (0..n)
                .map(|_| match next() % 6 {
                    0 => None,
                    1 => Some(1),
                    _ => Some(0),
                })
                .collect();
            let preds = random_preds(n, 4, &mut next);
            let order: Vec<u32> = (0..n as u32).collect();
            let (of, segs) = plan_segments(&devices, &preds, &order);
            // Every captured node in exactly one segment of its device.
            for i in 0..n {
                assert_eq!(of[i].is_some(), devices[i].is_some(), "round {round}");
                if let Some(s) = of[i] {
                    assert!(segs[s as usize].contains(&(i as u32)));
                    assert!(segs[s as usize]
                        .iter()
                        .all(|&m| devices[m as usize] == devices[i]));
                }
            }
            // Unit of the condensed graph: its segment, or the node itself.
            let unit = |i: usize| of[i].map_or(1000 + i, |s| s as usize);
            // reach[i]: nodes reachable from i (nodes are in topological order).
            let mut reach = vec![vec![false; n]; n];
            for i in (0..n).rev() {
                for j in i + 1..n {
                    if preds[j].contains(&(i as u32)) {
                        reach[i][j] = true;
                        for k in 0..n {
                            if reach[j][k] {
                                reach[i][k] = true;
                            }
                        }
                    }
                }
            }
            for a in 0..n {
                for b in 0..n {
                    for m in 0..n {
                        // Convex: a path a -> m -> b between members of one segment stays in it.
                        if of[a].is_some() && of[a] == of[b] && reach[a][m] && reach[m][b] {
                            assert_eq!(of[m], of[a], "round {round}: segment not convex");
                        }
                    }
                    // Acyclic: no two units reach each other.
                    if unit(a) != unit(b) && reach[a][b] {
                        for c in 0..n {
                            for d in 0..n {
                                if unit(c) == unit(b) && unit(d) == unit(a) {
                                    assert!(!reach[c][d], "round {round}: segments form a cycle");
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}
