//! A built replay graph: [`Replayable`] runs it replayed or eagerly, each run on an
//! *instance*: a scheduler graph of the replay's nodes (one node per segment where replayed)
//! with its own input [`Feeds`]; a replayed instance also holds its executables and captured
//! outputs.

use std::collections::HashSet;
use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock};

use boundpool_scheduler::{GraphBuilder, NodeCtx, NodeRef};

use crate::device::ExecSlot;
use crate::error::{GpuError, GpuErrorKind, GpuResult};
use crate::node::{GpuCtx, GpuGraphExt};
use crate::pool::{GpuGraph, GpuPool};
use crate::worker::GpuWorker;

use super::capture::run_segment;
use super::desc::{Desc, Kind, Out, Outputs, RNode, Refs, ReplayCtx, Source};
use super::instance::{Feeds, InstanceState, ReplayStats, SegState, Shared};
use super::run::{Lease, Mode, ReplayHandle, ReplayOutput, RunInputs};

pub(super) fn sched_error(e: boundpool_scheduler::Error) -> GpuError {
    GpuError::new(GpuErrorKind::Scheduler, e.to_string()).with_source(e)
}

/// One instance: its scheduler graph and what the graph's nodes share.
pub(super) struct Instance {
    /// A replayed instance's executables and captured outputs (None: an eager instance).
    pub(super) state: Option<Arc<InstanceState>>,
    pub(super) feeds: Arc<Feeds>,
    pub(super) graph: GpuGraph,
    pub(super) refs: Arc<[Option<NodeRef<Out>>]>,
}

/// A graph whose GPU work is captured once per instance and replayed (see the `replay` module
/// docs).
pub struct Replayable {
    pub(super) desc: Arc<Desc>,
    pub(super) shared: Arc<Shared>,
    pub(super) lease: Arc<Lease>,
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

impl Replayable {
    pub(super) fn new(desc: Arc<Desc>, shared: Arc<Shared>, max_instances: usize) -> Self {
        Self {
            desc,
            shared,
            lease: Arc::new(Lease::new(max_instances)),
        }
    }

    /// The graph's name.
    pub fn name(&self) -> &str {
        &self.desc.name
    }

    /// Number of segments (CUDA graphs per instance).
    pub fn segments(&self) -> usize {
        self.desc.segments.len()
    }

    /// The segment of captured node `r` (None for host, input and eager nodes).
    pub fn segment_of<T>(&self, r: RNode<T>) -> Option<usize> {
        self.desc
            .seg_of
            .get(r.idx as usize)
            .copied()
            .flatten()
            .map(|s| s as usize)
    }

    /// Replayed instances made so far (at most
    /// [`ReplayBuilder::instances`](super::ReplayBuilder::instances)).
    pub fn instances(&self) -> usize {
        self.lease.made()
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

    /// Submits a replayed run with `inputs` (a value for each input node) and returns at once.
    /// The run takes a free instance, or makes one (captured at this first run), or, when
    /// [`ReplayBuilder::instances`](super::ReplayBuilder::instances) are all busy, waits for
    /// one in submission order: the handle's [`wait`](ReplayHandle::wait) or `.await` waits.
    /// An instance is held from the start of its run's graph to its end, never longer. Its
    /// graph is submitted as [`GpuPool::submit`] does (waiting for admission there when the
    /// pool limits graphs in flight). A run missing an input, or naming a node that is not one
    /// of this graph's input nodes, is refused here.
    pub fn submit<'p>(
        &'p self,
        pool: &'p GpuPool,
        inputs: RunInputs,
    ) -> GpuResult<ReplayHandle<'p>> {
        ReplayHandle::submit(self, pool, inputs, Mode::Replay)
    }

    /// [`submit`](Self::submit) of an eager run: every body is called, no capture, on an
    /// eager instance of its own (made when none is free; eager runs never wait for one).
    pub fn submit_eager<'p>(
        &'p self,
        pool: &'p GpuPool,
        inputs: RunInputs,
    ) -> GpuResult<ReplayHandle<'p>> {
        ReplayHandle::submit(self, pool, inputs, Mode::Eager)
    }

    /// A replayed run with `inputs`, waited for: captures at the instance's first run (and
    /// after [`update`](Self::update)), replays otherwise. A failed capture fails the run with
    /// [`GpuErrorKind::Capture`] (the segment is captured again at the next run);
    /// [`run_eager`](Self::run_eager) still works.
    pub fn run_with(&self, pool: &GpuPool, inputs: RunInputs) -> GpuResult<ReplayOutput> {
        self.submit(pool, inputs)?.wait()
    }

    /// [`run_with`](Self::run_with) for a graph without input nodes.
    pub fn run(&self, pool: &GpuPool) -> GpuResult<ReplayOutput> {
        self.run_with(pool, RunInputs::new())
    }

    /// An eager run with `inputs`, waited for (every body called, as an ordinary graph).
    pub fn run_eager_with(&self, pool: &GpuPool, inputs: RunInputs) -> GpuResult<ReplayOutput> {
        self.submit_eager(pool, inputs)?.wait()
    }

    /// [`run_eager_with`](Self::run_eager_with) for a graph without input nodes.
    pub fn run_eager(&self, pool: &GpuPool) -> GpuResult<ReplayOutput> {
        self.run_eager_with(pool, RunInputs::new())
    }

    /// A replayed instance's segment states: one executable slot per segment.
    fn instance_state(&self, feeds: &Arc<Feeds>) -> Arc<InstanceState> {
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
        Arc::new(InstanceState {
            desc: desc.clone(),
            shared: self.shared.clone(),
            outputs: Outputs::new(desc.names.len()),
            feeds: feeds.clone(),
            segs,
        })
    }

    /// An instance's scheduler graph. Replayed: one GPU node per segment, the host, input and
    /// eager nodes as they are, edges between them. Eager: every node a scheduler node.
    pub(super) fn make_instance(&self, mode: Mode) -> GpuResult<Instance> {
        let desc = &self.desc;
        let feeds = Arc::new(Feeds::new(desc.inputs.len()));
        let state = (mode == Mode::Replay).then(|| self.instance_state(&feeds));
        let refs: Refs = Arc::new(OnceLock::new());
        let name = match mode {
            Mode::Replay => desc.name.clone(),
            Mode::Eager => format!("{} (eager)", desc.name),
        };
        let mut g: GraphBuilder<GpuWorker> = GraphBuilder::new(name);
        g.priority(desc.priority);
        let mut seg_nodes = Vec::new();
        if let Some(st) = &state {
            for (k, members) in desc.segments.iter().enumerate() {
                let Kind::Captured(dev) = &desc.kinds[members[0] as usize] else {
                    unreachable!("segments hold captured nodes only")
                };
                let (st, r2) = (st.clone(), refs.clone());
                let name = format!("{} segment {k}", desc.name);
                seg_nodes.push(g.gpu_node(dev, &name, move |gctx: &GpuCtx<'_, '_>| {
                    let refs = r2.get().map(Vec::as_slice).unwrap_or(&[]);
                    run_segment(&st, k as u32, gctx, refs).map(|()| Arc::new(()) as Out)
                }));
            }
        }
        // Input nodes have no scheduler node: their successors read the run's feeds.
        let mut node_ref: Vec<Option<NodeRef<Out>>> = Vec::with_capacity(desc.names.len());
        for i in 0..desc.names.len() {
            let r = match &desc.kinds[i] {
                Kind::Captured(_) if state.is_some() => {
                    seg_nodes[desc.seg_of[i].expect("captured") as usize]
                }
                Kind::Input(_) => {
                    node_ref.push(None);
                    continue;
                }
                Kind::Captured(dev) | Kind::Eager(dev) => {
                    let body = NodeBody::new(desc, &state, &feeds, &refs, i);
                    g.gpu_node(dev, &desc.names[i], move |gctx: &GpuCtx<'_, '_>| {
                        body.call(Some(gctx), gctx.node())
                    })
                }
                Kind::Host => {
                    let body = NodeBody::new(desc, &state, &feeds, &refs, i);
                    g.node(
                        desc.names[i].clone(),
                        move |node: &NodeCtx<'_, GpuWorker>| body.call(None, node),
                    )
                }
            };
            node_ref.push(Some(r));
        }
        let mut edges = HashSet::new();
        for (v, ps) in desc.preds.iter().enumerate() {
            for &p in ps {
                let (Some(a), Some(b)) = (node_ref[p as usize], node_ref[v]) else {
                    continue;
                };
                if a.id() != b.id() && edges.insert((a.id().index(), b.id().index())) {
                    g.edge(a, b);
                }
            }
        }
        let _ = refs.set(node_ref.clone());
        let graph = g.build().map_err(sched_error)?;
        Ok(Instance {
            state,
            feeds,
            graph,
            refs: node_ref.into(),
        })
    }
}

/// A user body as an instance's scheduler node calls it: with the instance's captured outputs
/// (replayed) or the scheduler's only (eager).
struct NodeBody {
    desc: Arc<Desc>,
    state: Option<Arc<InstanceState>>,
    feeds: Arc<Feeds>,
    refs: Refs,
    me: u32,
}

impl NodeBody {
    fn new(
        desc: &Arc<Desc>,
        state: &Option<Arc<InstanceState>>,
        feeds: &Arc<Feeds>,
        refs: &Refs,
        i: usize,
    ) -> Self {
        Self {
            desc: desc.clone(),
            state: state.clone(),
            feeds: feeds.clone(),
            refs: refs.clone(),
            me: i as u32,
        }
    }

    fn call(
        &self,
        gpu: Option<&GpuCtx<'_, '_>>,
        node: &NodeCtx<'_, GpuWorker>,
    ) -> Result<Out, boundpool_scheduler::BoxError> {
        let refs = self.refs.get().map(Vec::as_slice).unwrap_or(&[]);
        let src = match &self.state {
            Some(st) => Source::Replay {
                refs,
                outputs: &st.outputs,
                capture: None,
            },
            None => Source::Eager(refs),
        };
        let c = ReplayCtx {
            gpu,
            node,
            me: self.me,
            desc: &self.desc,
            src,
            feeds: &self.feeds,
        };
        (self.desc.bodies[self.me as usize])(&c)
    }
}
