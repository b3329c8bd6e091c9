//! Describing a replay graph: [`ReplayBuilder`] adds captured, eager and host nodes and
//! edges; [`ReplayBuilder::build`] checks it, plans its segments and builds its eager graph.

use std::collections::HashSet;
use std::fmt;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};

use boundpool_scheduler::{BoxError, GraphBuilder, NodeCtx, NodeRef};

use crate::device::GpuDevice;
use crate::error::{GpuError, GpuErrorKind, GpuResult};
use crate::node::{GpuCtx, GpuGraphExt};
use crate::pool::GpuGraph;
use crate::worker::GpuWorker;

use super::desc::{Body, Desc, Kind, Out, RNode, Refs, ReplayCtx, Source};
use super::instance::Shared;
use super::plan::{plan_lanes, plan_segments};
use super::replayable::{sched_error, InstancePool, Replayable};

static NEXT_GRAPH: AtomicU64 = AtomicU64::new(1);

/// Builds a [`Replayable`] graph (see the `replay` module docs).
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
