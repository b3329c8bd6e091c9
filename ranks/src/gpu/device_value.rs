//! Device values: GPU nodes whose [`DeviceBuffer`] output crosses ranks, and the maker that
//! sends and receives them on the wire the lowering chose (staged through page-locked memory,
//! `staged.rs`, or over NCCL, `nccl.rs`). Above both, which see only `nodes.rs`.

use std::any::Any;
use std::sync::{Arc, OnceLock};

use boundpool_gpu::{DeviceBuffer, DeviceCopy, GpuDevice, GpuWorker};
use boundpool_scheduler::{BoxError, GraphBuilder, NodeId};

use crate::gpu::nodes::{GpuMaker, RankGpuCtx, RecvWhat, SendWhat};
use crate::graph::{NodeMaker, NodeRef, RankGraphBuilder, RecvNodes, SendNodes, SlotEnv};
use crate::plan::{self, On, Wire};
use crate::value::LandFn;

/// The maker of a device value: a GPU node whose [`DeviceBuffer`] output crosses ranks, staged
/// through page-locked host memory, or over NCCL when its device has a communicator.
pub(crate) struct DeviceMaker<E: DeviceCopy> {
    pub(crate) node: GpuMaker<DeviceBuffer<E>>,
    /// Bytes per staged chunk (and per message).
    pub(crate) chunk: usize,
    /// The wire decided at build.
    wire: OnceLock<Wire>,
    /// The page-locked memory its value is staged in and lands in on this rank (staged).
    pool: Arc<crate::gpu::staged::StagingPool<E>>,
}

impl<E: DeviceCopy + bytemuck::Pod> DeviceMaker<E> {
    pub(crate) fn new(node: GpuMaker<DeviceBuffer<E>>, chunk: usize) -> Self {
        DeviceMaker {
            node,
            chunk,
            wire: OnceLock::new(),
            pool: Arc::default(),
        }
    }

    fn wire(&self) -> Wire {
        *self.wire.get_or_init(|| {
            if cfg!(feature = "nccl") && self.node.device.nccl().is_some() {
                Wire::Nccl
            } else {
                Wire::Device
            }
        })
    }
}

impl<E: DeviceCopy + bytemuck::Pod> NodeMaker<GpuWorker> for DeviceMaker<E> {
    fn compute(
        &self,
        gb: &mut GraphBuilder<GpuWorker>,
        env: &Arc<SlotEnv>,
        index: u32,
    ) -> (NodeId, Box<dyn Any + Send + Sync>) {
        self.node.compute(gb, env, index)
    }

    fn send(
        &self,
        gb: &mut GraphBuilder<GpuWorker>,
        env: &Arc<SlotEnv>,
        producer: &(dyn Any + Send + Sync),
        k: u32,
        to: usize,
    ) -> SendNodes {
        let from = *producer
            .downcast_ref::<boundpool_scheduler::NodeRef<DeviceBuffer<E>>>()
            .expect("the producer's own type");
        let what = SendWhat {
            name: &self.node.name,
            device: &self.node.device,
            from,
            k,
            to,
            producer: env.graph.sends[k as usize].producer,
        };
        match self.wire() {
            #[cfg(feature = "nccl")]
            Wire::Nccl => crate::gpu::nccl::add_send(gb, env, what),
            _ => crate::gpu::staged::add_send(gb, env, what, &self.pool, self.chunk),
        }
    }

    fn land(&self) -> Option<LandFn> {
        Some(match self.wire() {
            Wire::Nccl => crate::value::land_fn(crate::value::plain_landing::<u64>),
            _ => crate::gpu::staged::landing::<E>(&self.pool),
        })
    }

    fn recv(
        &self,
        gb: &mut GraphBuilder<GpuWorker>,
        env: &Arc<SlotEnv>,
        k: u32,
        name: String,
    ) -> RecvNodes {
        let what = RecvWhat {
            name,
            device: &self.node.device,
            k,
            producer: env.graph.recvs[k as usize].producer,
            from: env.graph.recvs[k as usize].from,
        };
        match self.wire() {
            #[cfg(feature = "nccl")]
            Wire::Nccl => crate::gpu::nccl::add_recv::<E>(gb, env, what),
            _ => crate::gpu::staged::add_recv::<E>(gb, env, what),
        }
    }

    fn wire_at_build(&self) -> Option<Wire> {
        Some(self.wire())
    }

    fn places_itself(&self) -> bool {
        true
    }
}

impl RankGraphBuilder<GpuWorker> {
    /// Adds a GPU node whose output, a [`DeviceBuffer`], crosses ranks: to a consuming rank
    /// it goes staged through page-locked host memory (copied out in chunks on `device`, each
    /// chunk sent as soon as its copy is done, so copies overlap the transfer; received into
    /// page-locked memory and uploaded by a GPU node on the consumer's rank, to the device its
    /// program names for this node there), or, when `device` has an NCCL communicator
    /// (`GpuRanksBuilder::nccl`, feature `nccl`), with `ncclSend`/`ncclRecv`
    /// in the lowering's one order of NCCL operations. No driver call is made off a bound
    /// worker: the communication thread only reads host memory.
    pub fn device_node<E, F>(
        &mut self,
        on: impl Into<On>,
        device: &GpuDevice,
        name: impl Into<String>,
        body: F,
    ) -> NodeRef<DeviceBuffer<E>>
    where
        E: DeviceCopy + bytemuck::Pod,
        F: Fn(&RankGpuCtx<'_, '_>) -> Result<DeviceBuffer<E>, BoxError> + Send + Sync + 'static,
    {
        let name = name.into();
        let desc = plan::NodeDesc {
            name: name.clone(),
            on: on.into(),
            wire: Wire::Device,
            type_name: std::any::type_name::<DeviceBuffer<E>>().to_string(),
        };
        let maker = DeviceMaker::new(
            GpuMaker {
                name,
                device: device.clone(),
                body: Arc::new(body),
            },
            self.staging_chunk,
        );
        self.add_node(desc, Arc::new(maker))
    }
}
