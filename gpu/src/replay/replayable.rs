//! A built replay graph: [`Replayable`] runs it eagerly or on one of its instances (made on
//! demand, each a scheduler graph of one node per segment plus the host and eager nodes), and
//! [`ReplayOutput`], one run's outputs.

use std::collections::HashSet;
use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex, OnceLock};

use boundpool_scheduler::{GraphBuilder, GraphOutput, NodeCtx, NodeRef};

use crate::device::ExecSlot;
use crate::error::{GpuError, GpuErrorKind, GpuResult};
use crate::node::{GpuCtx, GpuGraphExt};
use crate::pool::{GpuGraph, GpuPool};
use crate::worker::GpuWorker;

use super::capture::run_segment;
use super::desc::{Desc, Kind, Out, Outputs, RNode, Refs, ReplayCtx, Source};
use super::instance::{InstanceState, ReplayStats, SegState, Shared};

pub(super) fn sched_error(e: boundpool_scheduler::Error) -> GpuError {
    GpuError::new(GpuErrorKind::Scheduler, e.to_string()).with_source(e)
}

pub(super) struct Instance {
    state: Arc<InstanceState>,
    graph: GpuGraph,
    refs: Arc<[NodeRef<Out>]>,
}

#[derive(Default)]
pub(super) struct InstancePool {
    free: Vec<Instance>,
    made: usize,
}

/// A graph whose GPU work is captured once per instance and replayed (see the `replay` module docs).
pub struct Replayable {
    pub(super) desc: Arc<Desc>,
    pub(super) eager: GpuGraph,
    pub(super) eager_refs: Arc<[NodeRef<Out>]>,
    pub(super) shared: Arc<Shared>,
    pub(super) max: usize,
    pub(super) pool: Mutex<InstancePool>,
    pub(super) freed: Condvar,
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
            Some(s) if self.desc.captured(r.idx) => s.outputs.get(r.idx)?,
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

    /// Instances made so far (at most [`ReplayBuilder::instances`](super::ReplayBuilder::instances)).
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
            outputs: Outputs::new(desc.names.len()),
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
                                outputs: &st.outputs,
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
                                outputs: &st.outputs,
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
