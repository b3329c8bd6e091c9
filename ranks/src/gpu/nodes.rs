//! GPU nodes of a rank graph: [`RankGraphBuilder::gpu_node`] (an output that stays on its
//! rank) and [`RankGraphBuilder::device_node`] (a [`DeviceBuffer`] that crosses ranks, staged
//! through page-locked memory or over NCCL), their makers, and what their bodies see
//! ([`RankGpuCtx`]).

use std::any::Any;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::Arc;

use boundpool_gpu::{run_gpu_body, DeviceBuffer, DeviceCopy, GpuCtx, GpuDevice, GpuWorker};
use boundpool_scheduler::backend::GraphBuilderExt;
use boundpool_scheduler::{BoxError, GraphBuilder, NodeCtx, NodeId};

use crate::comm::wire::FailKind;
use crate::error::Error;
use crate::graph::{
    panic_message, NodeMaker, NodeRef, RankCtx, RankGraphBuilder, SendNodes, SlotEnv,
};
use crate::plan::{self, On, Wire};
use crate::value::LandFn;

/// What a GPU node's body sees: its inputs on any rank ([`input`](Self::input)), as a
/// [`RankCtx`] does, and the node's [`GpuCtx`] ([`gpu`](Self::gpu)): its device, stream,
/// libraries.
pub struct RankGpuCtx<'a, 'n> {
    rank: RankCtx<'a, GpuWorker>,
    gpu: &'a GpuCtx<'a, 'n>,
}

impl std::fmt::Debug for RankGpuCtx<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RankGpuCtx")
            .field("rank", &self.rank)
            .field("gpu", &self.gpu)
            .finish()
    }
}

impl<'a, 'n> RankGpuCtx<'a, 'n> {
    /// The output of `from`, a direct predecessor: computed on this rank, or received from the
    /// rank that computed it (a device value arrives as a buffer of this node's rank's device
    /// that its producer names: [`RankGraphBuilder::device_node`]).
    pub fn input<T: 'static>(&self, from: NodeRef<T>) -> Result<&'a T, Error> {
        self.rank.input(from)
    }

    /// The node's GPU context: enqueue work on its stream, allocate, use its libraries.
    pub fn gpu(&self) -> &'a GpuCtx<'a, 'n> {
        self.gpu
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.rank.rank()
    }

    /// The run's number among this graph's runs (the same on every rank).
    pub fn run_seq(&self) -> u64 {
        self.rank.run_seq()
    }
}

pub(crate) type GpuBody<T> = dyn Fn(&RankGpuCtx<'_, '_>) -> Result<T, BoxError> + Send + Sync;

/// Adds to `gb` a GPU node on `device` whose body is `body`, reporting its failure (of the body
/// or of the GPU node around it) as node `index`'s to the ranks.
pub(crate) fn add_gpu_node<T: Send + Sync + 'static>(
    gb: &mut GraphBuilder<GpuWorker>,
    env: &Arc<SlotEnv>,
    device: &GpuDevice,
    name: String,
    index: u32,
    body: impl Fn(&RankGpuCtx<'_, '_>) -> Result<T, BoxError> + Send + Sync + 'static,
) -> boundpool_scheduler::NodeRef<T> {
    let env = env.clone();
    let r = gb.node(name, move |node: &NodeCtx<'_, GpuWorker>| {
        let out = run_gpu_body(node, |gpu| {
            let ctx = RankGpuCtx {
                rank: RankCtx::new(node, &env),
                gpu,
            };
            match catch_unwind(AssertUnwindSafe(|| body(&ctx))) {
                Ok(r) => r,
                Err(p) => {
                    env.failed(index, FailKind::Panicked, panic_message(&*p));
                    resume_unwind(p)
                }
            }
        });
        if let Err(e) = &out {
            env.failed(index, FailKind::Failed, e.to_string());
        }
        out
    });
    gb.place(r.id(), device.placement())
        .mark_device_node(r.id());
    r
}

/// The maker of a GPU node of the graph (its output stays on its rank).
pub(crate) struct GpuMaker<T> {
    pub(crate) name: String,
    /// The device it runs on when it runs here (each rank names its own).
    pub(crate) device: GpuDevice,
    pub(crate) body: Arc<GpuBody<T>>,
}

impl<T: Send + Sync + 'static> NodeMaker<GpuWorker> for GpuMaker<T> {
    fn compute(
        &self,
        gb: &mut GraphBuilder<GpuWorker>,
        env: &Arc<SlotEnv>,
        index: u32,
    ) -> (NodeId, Box<dyn Any + Send + Sync>) {
        let body = self.body.clone();
        let r = add_gpu_node(gb, env, &self.device, self.name.clone(), index, move |c| {
            body(c)
        });
        (r.id(), Box::new(r))
    }

    fn send(
        &self,
        _: &mut GraphBuilder<GpuWorker>,
        _: &Arc<SlotEnv>,
        _: &(dyn Any + Send + Sync),
        _: u32,
        _: usize,
    ) -> SendNodes {
        unreachable!("the lowering refuses an edge that takes a local output across ranks")
    }

    fn land(&self) -> Option<LandFn> {
        None
    }

    fn places_itself(&self) -> bool {
        true
    }
}

/// A send of a device value: the producer, which send, and to whom.
pub(crate) struct SendWhat<'m, E: DeviceCopy> {
    pub(crate) name: &'m str,
    pub(crate) device: &'m GpuDevice,
    pub(crate) from: boundpool_scheduler::NodeRef<DeviceBuffer<E>>,
    pub(crate) k: u32,
    pub(crate) to: usize,
    /// The producer's index in the graph (failures are reported as its).
    pub(crate) producer: u32,
}

/// A receive of a device value: which receive, from whom, and the device it lands on.
pub(crate) struct RecvWhat<'m> {
    pub(crate) name: String,
    pub(crate) device: &'m GpuDevice,
    pub(crate) k: u32,
    pub(crate) producer: u32,
    /// The sending rank (NCCL's peer).
    #[cfg_attr(not(feature = "nccl"), allow(dead_code))]
    pub(crate) from: usize,
}

impl RankGraphBuilder<GpuWorker> {
    /// Adds a GPU node: `body` runs on a worker of `device` (this rank's device, when the node
    /// runs here: every rank names its own) with a [`RankGpuCtx`], ordered on the device after
    /// its GPU predecessors as a [`GpuGraphExt::gpu_node`](boundpool_gpu::GpuGraphExt::gpu_node)
    /// is. Its output stays on its rank (an edge from it to another rank is an error at
    /// `build`); make it with [`device_node`](Self::device_node) to send a device buffer.
    pub fn gpu_node<T, F>(
        &mut self,
        on: impl Into<On>,
        device: &GpuDevice,
        name: impl Into<String>,
        body: F,
    ) -> NodeRef<T>
    where
        T: Send + Sync + 'static,
        F: Fn(&RankGpuCtx<'_, '_>) -> Result<T, BoxError> + Send + Sync + 'static,
    {
        let name = name.into();
        let desc = plan::NodeDesc {
            name: name.clone(),
            on: on.into(),
            wire: Wire::Local,
            type_name: std::any::type_name::<T>().to_string(),
        };
        let maker = GpuMaker {
            name,
            device: device.clone(),
            body: Arc::new(body),
        };
        self.add_node(desc, Arc::new(maker))
    }

    /// Bytes per chunk of the device values added after this call, staged one chunk at a time,
    /// each sent once its copy is done (4 MiB by default; at least 1). A message is at most
    /// 4 MiB and the runtime's `max_message_bytes`: a larger chunk goes as several.
    pub fn staging_chunk_bytes(&mut self, bytes: usize) -> &mut Self {
        self.staging_chunk = bytes.max(1);
        self
    }
}
