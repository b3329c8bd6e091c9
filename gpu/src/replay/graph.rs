//! An instance's scheduler graph ([`make_instance`]): replayed (one GPU node per segment, the
//! host and eager nodes as they are) or eager (every node a scheduler node), with the
//! instance's [`Feeds`] and, replayed, its [`InstanceState`].

use std::collections::HashSet;
use std::sync::{Arc, Mutex, OnceLock};

use boundpool_scheduler::{GraphBuilder, NodeCtx, NodeRef};

use crate::capture::Kept;
use crate::device::ExecSlot;
use crate::error::{GpuError, GpuErrorKind, GpuResult};
use crate::node::{GpuCtx, GpuGraphExt};
use crate::pool::GpuGraph;
use crate::worker::GpuWorker;

use super::capture::run_segment;
use super::desc::{Desc, Feeds, Kind, Out, Outputs, Refs, ReplayCtx, Source};
use super::instance::{InstanceState, SegState, Shared};

/// Whether a run replays its instance's executables or calls every body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Mode {
    Replay,
    Eager,
}

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

/// A replayed instance's segment states: one executable slot per segment.
fn instance_state(
    desc: &Arc<Desc>,
    shared: &Arc<Shared>,
    feeds: &Arc<Feeds>,
) -> Arc<InstanceState> {
    let segs = desc
        .segments
        .iter()
        .map(|m| {
            let Kind::Captured(dev) = &desc.kinds[m[0] as usize] else {
                unreachable!("segments hold captured nodes only")
            };
            let slot = Arc::new(ExecSlot::new(dev.shared.clone(), shared.execs.clone()));
            dev.shared.register_exec_slot(&slot);
            Mutex::new(SegState {
                slot,
                generation: None,
                kept: Kept::default(),
            })
        })
        .collect();
    Arc::new(InstanceState {
        desc: desc.clone(),
        shared: shared.clone(),
        outputs: Outputs::new(desc.names.len()),
        feeds: feeds.clone(),
        segs,
    })
}

/// An instance's scheduler graph. Replayed: one GPU node per segment, the host and eager
/// nodes as they are, edges between them. Eager: every node a scheduler node. Input nodes have
/// none (their successors read the run's feeds).
pub(super) fn make_instance(
    desc: &Arc<Desc>,
    shared: &Arc<Shared>,
    mode: Mode,
) -> GpuResult<Instance> {
    let feeds = Arc::new(Feeds::new(desc.inputs.len()));
    let state = (mode == Mode::Replay).then(|| instance_state(desc, shared, &feeds));
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
                let n = g.node(
                    desc.names[i].clone(),
                    move |node: &NodeCtx<'_, GpuWorker>| body.call(None, node),
                );
                if let Some(dev) = &desc.host_on[i] {
                    g.place(n, dev.placement());
                }
                n
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
