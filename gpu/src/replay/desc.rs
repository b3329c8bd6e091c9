//! A replay graph as its bodies see it: the description shared by every instance ([`Desc`]),
//! node handles ([`RNode`]), and [`ReplayCtx`], what a body gets (its inputs come from the
//! scheduler, from an instance's captured [`Outputs`], or from the run's [`Feeds`]).

use std::any::Any;
use std::cell::RefCell;
use std::fmt;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex, OnceLock};

use boundpool_scheduler::{BoxError, NodeCtx, NodeRef, Priority};

use crate::buffer::{DeviceBuffer, DeviceCopy};
use crate::device::GpuDevice;
use crate::error::{GpuError, GpuErrorKind, GpuResult};
use crate::node::GpuCtx;
use crate::worker::GpuWorker;

/// A node's output, type-erased (every node of a replay graph returns one).
pub(super) type Out = Arc<dyn Any + Send + Sync>;
pub(super) type Body = Arc<dyn Fn(&ReplayCtx<'_, '_>) -> Result<Out, BoxError> + Send + Sync>;

/// A node of a [`ReplayBuilder`](super::ReplayBuilder) whose output is a `T`.
pub struct RNode<T> {
    pub(super) idx: u32,
    pub(super) graph: u64,
    pub(super) _t: PhantomData<fn() -> T>,
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
pub(super) enum Kind {
    Captured(GpuDevice),
    Eager(GpuDevice),
    Host,
    /// A host node whose value each run brings (its ordinal among the input nodes).
    Input(u32),
}

/// The graph's description, shared by the eager graph and every instance.
pub(super) struct Desc {
    /// The builder's id, that [`RNode`]s and run inputs carry.
    pub(super) uid: u64,
    pub(super) name: String,
    pub(super) names: Vec<String>,
    pub(super) kinds: Vec<Kind>,
    pub(super) bodies: Vec<Body>,
    /// The device whose workers run each host node, if one was given.
    pub(super) host_on: Vec<Option<GpuDevice>>,
    pub(super) preds: Vec<Vec<u32>>,
    /// Each node's direct successors (no repeats): a node takes an output only as its only
    /// successor (`take.rs`).
    pub(super) succs: Vec<Vec<u32>>,
    /// Segment of each captured node.
    pub(super) seg_of: Vec<Option<u32>>,
    /// Each segment's members, in a topological order.
    pub(super) segments: Vec<Vec<u32>>,
    /// With [`ReplayBuilder::max_width`](super::ReplayBuilder::max_width): the member of its segment each captured node is
    /// also made to follow (the previous node of its lane), where its own predecessors do not
    /// already order it.
    pub(super) after: Vec<Option<u32>>,
    /// The input nodes, by ordinal.
    pub(super) inputs: Vec<u32>,
    /// The level of every run's nodes.
    pub(super) priority: Priority,
}

impl Desc {
    pub(super) fn captured(&self, i: u32) -> bool {
        matches!(self.kinds[i as usize], Kind::Captured(_))
    }
}

/// Each node's scheduler node in an instance's graph (None: an input node, which has none: its
/// successors read the run's feeds).
pub(super) type Refs = Arc<OnceLock<Vec<Option<NodeRef<Out>>>>>;

/// Where a body's inputs come from.
pub(super) enum Source<'c> {
    /// An eager instance: every node but the input nodes is a scheduler node.
    Eager(&'c [Option<NodeRef<Out>>]),
    /// An instance's graph: host and eager nodes are scheduler nodes (`refs`); captured
    /// nodes' outputs are the instance's, or, while segment `seg` captures, `local`'s.
    Replay {
        refs: &'c [Option<NodeRef<Out>>],
        outputs: &'c Outputs,
        capture: Option<(u32, &'c RefCell<Vec<Option<Out>>>)>,
    },
}

/// What a replay graph's body gets: its inputs, its node's name, and for GPU nodes the
/// [`GpuCtx`] to enqueue work with (under a capture, work is recorded, not run).
pub struct ReplayCtx<'c, 'n> {
    pub(super) gpu: Option<&'c GpuCtx<'c, 'n>>,
    pub(super) node: &'c NodeCtx<'n, GpuWorker>,
    pub(super) me: u32,
    pub(super) desc: &'c Desc,
    pub(super) src: Source<'c>,
    /// The run's input values.
    pub(super) feeds: &'c Feeds,
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
        if let Kind::Input(ordinal) = self.desc.kinds[from.idx as usize] {
            let v = self.feeds.get(ordinal).map_err(|e| bad(&e.to_string()))?;
            self.hold_if_captured(&v);
            return v.downcast::<T>().map_err(|_| bad("of another type"));
        }
        let sched = |refs: &[Option<NodeRef<Out>>]| -> GpuResult<Out> {
            let r = refs
                .get(from.idx as usize)
                .copied()
                .flatten()
                .ok_or_else(|| bad("unknown node"))?;
            self.node.input(r).cloned().map_err(|e| bad(&e.to_string()))
        };
        let out: Out = match &self.src {
            Source::Eager(refs) => sched(refs)?,
            Source::Replay {
                refs,
                outputs,
                capture,
            } => {
                if self.desc.captured(from.idx) {
                    let local = capture.and_then(|(seg, local)| {
                        (self.desc.seg_of[from.idx as usize] == Some(seg))
                            .then(|| local.borrow()[from.idx as usize].clone())
                    });
                    match local {
                        // A member's output is in `local` once it ran (members run in a
                        // topological order, and a failed one ends the capture): gone only if
                        // taken, by this node (the only one that may, `take.rs`).
                        Some(v) => v.ok_or_else(|| bad("this node took it (ReplayCtx::take)"))?,
                        None => {
                            let v = outputs
                                .get(from.idx)
                                .ok_or_else(|| bad("its output is missing (its capture failed)"))?;
                            self.hold_if_captured(&v);
                            v
                        }
                    }
                } else {
                    let v = sched(refs)?;
                    self.hold_if_captured(&v);
                    v
                }
            }
        };
        out.downcast::<T>().map_err(|_| bad("of another type"))
    }

    /// Under a capture, keeps a value read from outside the segment (a run's input, a host
    /// or eager node's output, another segment's) as long as the executable: the graph may
    /// hold device addresses of buffers in it, which must not be freed while it replays.
    fn hold_if_captured(&self, v: &Out) {
        if let Some(c) = self.gpu.and_then(|g| g.capture) {
            c.hold(v.clone());
        }
    }

    /// Enqueues a copy of `src` into `dst` (same length, this node's device), a buffer held by
    /// reference: typically a captured node's output written by an eager GPU node every run
    /// (new inputs into a replay's static input buffer). Under a capture the data is staged
    /// (see the `replay` module docs). An error for a host node.
    pub fn copy_into<T: DeviceCopy>(&self, src: &[T], dst: &DeviceBuffer<T>) -> GpuResult<()> {
        self.gpu()?.copy_into(src, dst)
    }

    /// The scheduler's context of the node running this body (under a capture, the segment's
    /// node).
    pub fn node(&self) -> &'c NodeCtx<'n, GpuWorker> {
        self.node
    }
}

/// An instance's captured nodes' outputs (by node index): what their bodies returned at the
/// instance's last capture of their segment.
pub(super) struct Outputs(Mutex<Vec<Option<Out>>>);

impl Outputs {
    pub(super) fn new(n: usize) -> Self {
        Self(Mutex::new(vec![None; n]))
    }

    /// Node `i`'s output.
    pub(super) fn get(&self, i: u32) -> Option<Out> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())[i as usize].clone()
    }

    /// The outputs of `members` become those of a capture (`local`); the old ones are dropped
    /// (their buffers go to the release queue, freed after the work already enqueued).
    pub(super) fn replace(&self, members: &[u32], mut local: Vec<Option<Out>>) {
        let mut outs = self.0.lock().unwrap_or_else(|e| e.into_inner());
        for &m in members {
            outs[m as usize] = local[m as usize].take();
        }
    }
}

/// The input nodes' values of the run an instance is serving (by input ordinal), set before
/// its graph is submitted and cleared when the run ends.
pub(super) struct Feeds(Mutex<Vec<Option<Out>>>);

impl Feeds {
    pub(super) fn new(n: usize) -> Self {
        Self(Mutex::new(vec![None; n]))
    }

    pub(super) fn set(&self, values: Vec<Out>) {
        let mut f = self.0.lock().unwrap_or_else(|e| e.into_inner());
        *f = values.into_iter().map(Some).collect();
    }

    /// The current values (for the run's output).
    pub(super) fn values(&self) -> Vec<Option<Out>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub(super) fn clear(&self) {
        let mut f = self.0.lock().unwrap_or_else(|e| e.into_inner());
        f.iter_mut().for_each(|v| *v = None);
    }

    /// Input `ordinal`'s value for this run.
    pub(super) fn get(&self, ordinal: u32) -> Result<Out, BoxError> {
        let f = self.0.lock().unwrap_or_else(|e| e.into_inner());
        f.get(ordinal as usize)
            .cloned()
            .flatten()
            .ok_or_else(|| "the run brought no value for this input node".into())
    }
}
