//! Describing a replay graph: [`ReplayBuilder`] adds captured, eager, host and input nodes
//! and edges; [`ReplayBuilder::build`] checks it and plans its segments.

use std::collections::HashSet;
use std::fmt;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use boundpool_scheduler::{BoxError, Priority};

use crate::device::GpuDevice;
use crate::error::{GpuError, GpuErrorKind, GpuResult};

use super::desc::{Body, Desc, Kind, Out, RNode, ReplayCtx};
use super::instance::Shared;
use super::plan::{plan_lanes, plan_segments};
use super::replayable::Replayable;

static NEXT_GRAPH: AtomicU64 = AtomicU64::new(1);

/// Builds a [`Replayable`] graph (see the `replay` module docs). Its GPU nodes' bodies run
/// under a capture at a run that captures: what they and other threads must not do meanwhile
/// is in [`Replayable`]'s docs ("Captures beside other threads").
pub struct ReplayBuilder {
    uid: u64,
    name: String,
    names: Vec<String>,
    kinds: Vec<Kind>,
    bodies: Vec<Body>,
    /// The device whose workers run each host node, where one was given (`host_node_on`).
    host_on: Vec<Option<GpuDevice>>,
    edges: Vec<(u32, u32)>,
    /// Edges declared with `hand_on`: `build` checks that the target may take the source's
    /// output (`take.rs`).
    handoffs: Vec<(u32, u32)>,
    bad: Option<String>,
    instances: usize,
    max_width: Option<usize>,
    inputs: Vec<u32>,
    priority: Priority,
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
            host_on: Vec::new(),
            edges: Vec::new(),
            handoffs: Vec::new(),
            bad: None,
            instances: 1,
            max_width: None,
            inputs: Vec::new(),
            priority: Priority::Normal,
        }
    }

    /// The most instances (each with its own executables and outputs, captured at its first
    /// run) that concurrent replayed runs may use; a run that finds all of them busy waits for
    /// one, in submission order. Default 1: replayed runs of the graph queue, and captured
    /// nodes' outputs are the same buffers for every run. (Eager runs make instances of their
    /// own as needed.)
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
    /// faster than as many independent ones (docs/benchmarks.md, replay bench), and one
    /// stream's capture in PyTorch is a chain anyway.
    /// Never use it where nodes of one segment wait on each other through memory (a kernel
    /// spinning on a flag another independent node sets): a lane edge could order the waiter
    /// first.
    pub fn max_width(&mut self, w: usize) -> &mut Self {
        self.max_width = Some(w.max(1));
        self
    }

    /// The priority level of every run's nodes (default [`Priority::Normal`]): replayed and
    /// eager runs of the graph are scheduled, and their GPU work enqueued, at this level like
    /// any graph of it. A latency-critical client serves from a graph built at
    /// [`Priority::High`] beside batch clients' graphs.
    pub fn priority(&mut self, priority: Priority) -> &mut Self {
        self.priority = priority;
        self
    }

    fn push(&mut self, name: &str, kind: Kind, body: Body) -> u32 {
        self.names.push(name.to_owned());
        self.kinds.push(kind);
        self.bodies.push(body);
        self.host_on.push(None);
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
    /// full [`GpuCtx`](crate::GpuCtx) (uploads of per-run inputs into buffers captured nodes made, downloads
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

    /// A host node run only by the workers of `device` (of its SM partition, for a device of
    /// one), as its GPU nodes are: a graph's host work (staging an input, reading an output)
    /// stays on the workers that serve its device. On a partitioned device this keeps a batch
    /// graph's host nodes off the workers of a latency-critical partition, which would
    /// otherwise take them while idle and be busy when a latency-critical request comes.
    pub fn host_node_on<T, F>(&mut self, device: &GpuDevice, name: &str, body: F) -> RNode<T>
    where
        T: Send + Sync + 'static,
        F: Fn(&ReplayCtx<'_, '_>) -> Result<T, BoxError> + Send + Sync + 'static,
    {
        let i = self.push(name, Kind::Host, erase(body));
        self.host_on[i as usize] = Some(device.clone());
        self.rnode(i)
    }

    /// An input node: a value each run brings ([`RunInputs::set`](super::RunInputs::set)),
    /// so that concurrent runs never share a feed. Its successors read it with
    /// [`ReplayCtx::input`] like any predecessor's output; an eager GPU node typically copies
    /// it into a captured node's static buffer ([`ReplayCtx::copy_into`]). It has no scheduler
    /// node of its own (it costs a run nothing); it cuts segments like a host node. A run
    /// without a value for every input node is refused before it starts.
    pub fn input<T: Send + Sync + 'static>(&mut self, name: &str) -> RNode<T> {
        let ordinal = self.inputs.len() as u32;
        let body: Body = Arc::new(|c: &ReplayCtx<'_, '_>| {
            Err(format!(
                "input node '{}' has no body: its value comes with the run",
                c.node_name()
            )
            .into())
        });
        let i = self.push(name, Kind::Input(ordinal), body);
        self.inputs.push(i);
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

    /// An edge `from -> to` along which `to` takes `from`'s output by value
    /// ([`ReplayCtx::take`]), to write into it in place: [`build`](Self::build) checks that
    /// `to` is `from`'s only successor and that the two run at the same rate (both captured,
    /// in one segment, or both host or eager nodes; not from an input node), and fails with
    /// [`GpuErrorKind::InvalidArgument`] naming both nodes and why otherwise. (`take` checks
    /// the same along any edge when it happens: declaring the edge reports a mistake before
    /// anything runs.)
    ///
    /// ```no_run
    /// # use boundpool_gpu::{GpuPoolBuilder, ReplayBuilder, ReplayCtx};
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let pool = GpuPoolBuilder::new().build()?;
    /// let d = &pool.devices()[0];
    /// let mut b = ReplayBuilder::new("in place");
    /// let a = b.gpu_node(d, "zeros", |c: &ReplayCtx<'_, '_>| Ok(c.gpu()?.alloc_zeros::<f32>(1024)?));
    /// let twice = b.gpu_node(d, "memset again", move |c: &ReplayCtx<'_, '_>| {
    ///     let mut buf = c.take(a)?; // the buffer `a` made: no copy, no lock
    ///     c.gpu()?.memset_zero(&mut buf)?;
    ///     Ok(buf) // the instance keeps it; every replay writes it in place
    /// });
    /// b.hand_on(a, twice);
    /// let r = b.build()?;
    /// let out = r.run(&pool)?;
    /// assert!(out.get(a).is_none() && out.get(twice).is_some());
    /// # Ok(())
    /// # }
    /// ```
    pub fn hand_on<A, B>(&mut self, from: RNode<A>, to: RNode<B>) -> &mut Self {
        let edges = self.edges.len();
        self.edge(from, to);
        if self.edges.len() > edges {
            self.handoffs.push((from.idx, to.idx));
        }
        self
    }

    /// Checks the graph (no cycle, no foreign node, every `hand_on` edge one along which a
    /// take may happen) and splits it into segments. Nothing is captured yet: each instance
    /// captures at its first run.
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
            uid: self.uid,
            name: self.name,
            names: self.names,
            kinds: self.kinds,
            bodies: self.bodies,
            host_on: self.host_on,
            preds,
            succs,
            seg_of,
            segments,
            after,
            inputs: self.inputs,
            priority: self.priority,
        });
        for &(f, t) in &self.handoffs {
            if let Some(why) = desc.take_refusal(f, t) {
                return Err(invalid(format!(
                    "replay graph '{}': {} takes the output of {} (`hand_on`), {why}",
                    desc.name,
                    desc.label(t),
                    desc.label(f)
                )));
            }
        }
        Ok(Replayable::new(
            desc,
            Arc::new(Shared::default()),
            self.instances,
        ))
    }
}
