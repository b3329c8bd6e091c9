//! NCCL collectives as GPU nodes (feature `nccl`): one member per rank, each a device value,
//! issued in the lowering's one order of NCCL operations.

use std::sync::Arc;

use boundpool_gpu::{DeviceBuffer, DeviceCopy, GpuDevice, GpuWorker, NcclElement, ReduceOp};
use boundpool_scheduler::BoxError;

use crate::error::{Error, ErrorKind};
use crate::gpu::device_value::DeviceMaker;
use crate::gpu::nodes::{GpuMaker, RankGpuCtx};
use crate::graph::{NodeRef, RankGraphBuilder};
use crate::plan::{self, On, Wire};

/// The members of an NCCL collective, one per rank ([`RankGraphBuilder::all_reduce`] and the
/// others): member `r`, on rank `r`, outputs that rank's result, a new [`DeviceBuffer`] (a
/// device value: it may cross ranks like any other).
#[derive(Debug)]
pub struct Collective<E: DeviceCopy> {
    /// (rank, member), by rank.
    members: Vec<(usize, NodeRef<DeviceBuffer<E>>)>,
}

impl<E: DeviceCopy> Collective<E> {
    /// The member on rank `rank` (panics if there is none: the graph's `build` then failed).
    pub fn on(&self, rank: usize) -> NodeRef<DeviceBuffer<E>> {
        self.members
            .iter()
            .find(|(r, _)| *r == rank)
            .map(|(_, m)| *m)
            .unwrap_or_else(|| panic!("the collective has no member on rank {rank}"))
    }

    /// Every member, by rank.
    pub fn members(&self) -> impl Iterator<Item = NodeRef<DeviceBuffer<E>>> + '_ {
        self.members.iter().map(|(_, m)| *m)
    }
}

/// A collective's operation, kept by value in its members' bodies (cudarc's `ReduceOp` is not
/// `Clone`).
#[derive(Clone, Copy, Debug)]
enum Op {
    AllReduce(Reduce),
    Broadcast(usize),
    ReduceScatter(Reduce),
    AllGather,
}

#[derive(Clone, Copy, Debug)]
enum Reduce {
    Sum,
    Prod,
    Max,
    Min,
    Avg,
}

impl Reduce {
    fn of(op: &ReduceOp) -> Self {
        match op {
            ReduceOp::Sum => Reduce::Sum,
            ReduceOp::Prod => Reduce::Prod,
            ReduceOp::Max => Reduce::Max,
            ReduceOp::Min => Reduce::Min,
            ReduceOp::Avg => Reduce::Avg,
        }
    }

    fn op(self) -> ReduceOp {
        match self {
            Reduce::Sum => ReduceOp::Sum,
            Reduce::Prod => ReduceOp::Prod,
            Reduce::Max => ReduceOp::Max,
            Reduce::Min => ReduceOp::Min,
            Reduce::Avg => ReduceOp::Avg,
        }
    }
}

/// Runs member `rank` of collective `op` on `input`, a buffer of any device (copied to the
/// node's, the communicator's, when it is not there).
fn run_member<E: NcclElement>(
    ctx: &RankGpuCtx<'_, '_>,
    op: Op,
    input: &DeviceBuffer<E>,
) -> Result<DeviceBuffer<E>, BoxError> {
    let gpu = ctx.gpu();
    let x = gpu.on_device(input)?;
    let world = gpu
        .nccl()
        .ok_or_else(|| format!("device {} has no NCCL communicator", x.device_ordinal()))?
        .world;
    let out = match op {
        Op::AllReduce(r) => {
            let mut out = gpu.alloc::<E>(x.len())?;
            gpu.nccl_all_reduce(&x, &mut out, &r.op())?;
            out
        }
        Op::Broadcast(root) => {
            let mut out = gpu.alloc::<E>(x.len())?;
            let send = (ctx.rank() == root).then_some(&*x);
            gpu.nccl_broadcast(send, &mut out, root)?;
            out
        }
        Op::ReduceScatter(r) => {
            if x.len() % world != 0 {
                return Err(format!(
                    "reduce-scatter of {} elements over {world} ranks (not a whole block each)",
                    x.len()
                )
                .into());
            }
            let mut out = gpu.alloc::<E>(x.len() / world)?;
            gpu.nccl_reduce_scatter(&x, &mut out, &r.op())?;
            out
        }
        Op::AllGather => {
            let mut out = gpu.alloc::<E>(x.len() * world)?;
            gpu.nccl_all_gather(&x, &mut out)?;
            out
        }
    };
    Ok(out)
}

impl RankGraphBuilder<GpuWorker> {
    /// An NCCL all-reduce (`op`) of `inputs`, device values one per rank: each rank's member
    /// (a GPU node on `device`, this rank's NCCL device) outputs the reduction. Its members are
    /// NCCL operations: every rank issues them in the lowering's one order.
    pub fn all_reduce<E: NcclElement + bytemuck::Pod>(
        &mut self,
        name: impl Into<String>,
        device: &GpuDevice,
        inputs: &[NodeRef<DeviceBuffer<E>>],
        op: ReduceOp,
    ) -> Collective<E> {
        self.collective(name.into(), device, inputs, Op::AllReduce(Reduce::of(&op)))
    }

    /// An NCCL broadcast of rank `root`'s input: every member outputs a copy of it. The other
    /// ranks' inputs give the length (and are not read otherwise).
    pub fn broadcast<E: NcclElement + bytemuck::Pod>(
        &mut self,
        name: impl Into<String>,
        device: &GpuDevice,
        inputs: &[NodeRef<DeviceBuffer<E>>],
        root: usize,
    ) -> Collective<E> {
        self.collective(name.into(), device, inputs, Op::Broadcast(root))
    }

    /// An NCCL reduce-scatter (`op`): each input holds one block per rank; member `r` outputs
    /// the reduction of block `r`.
    pub fn reduce_scatter<E: NcclElement + bytemuck::Pod>(
        &mut self,
        name: impl Into<String>,
        device: &GpuDevice,
        inputs: &[NodeRef<DeviceBuffer<E>>],
        op: ReduceOp,
    ) -> Collective<E> {
        self.collective(
            name.into(),
            device,
            inputs,
            Op::ReduceScatter(Reduce::of(&op)),
        )
    }

    /// An NCCL all-gather: every member outputs all inputs, in rank order.
    pub fn all_gather<E: NcclElement + bytemuck::Pod>(
        &mut self,
        name: impl Into<String>,
        device: &GpuDevice,
        inputs: &[NodeRef<DeviceBuffer<E>>],
    ) -> Collective<E> {
        self.collective(name.into(), device, inputs, Op::AllGather)
    }

    fn collective<E: NcclElement + bytemuck::Pod>(
        &mut self,
        name: String,
        device: &GpuDevice,
        inputs: &[NodeRef<DeviceBuffer<E>>],
        op: Op,
    ) -> Collective<E> {
        let mut members = Vec::with_capacity(inputs.len());
        for &input in inputs {
            let Some(rank) = self.rank_of_node(input.into()) else {
                self.set_error(Error::new(
                    ErrorKind::InvalidGraph,
                    format!(
                        "collective '{}': input #{} is not a node of this graph",
                        crate::error::bounded(&name),
                        input.index()
                    ),
                ));
                continue;
            };
            let member_name = format!("{name} on rank {rank}");
            let desc = plan::NodeDesc {
                name: member_name.clone(),
                on: On::Rank(rank),
                wire: Wire::Device,
                type_name: std::any::type_name::<DeviceBuffer<E>>().to_string(),
            };
            let body = move |ctx: &RankGpuCtx<'_, '_>| run_member(ctx, op, ctx.input(input)?);
            let maker = DeviceMaker::new(
                GpuMaker {
                    name: member_name,
                    device: device.clone(),
                    body: Arc::new(body),
                },
                self.staging_chunk,
            );
            let member: NodeRef<DeviceBuffer<E>> = self.add_node(desc, Arc::new(maker));
            self.edge(input, member);
            members.push((rank, member));
        }
        members.sort_by_key(|(r, _)| *r);
        self.add_collective(name, members.iter().map(|(_, m)| m.index()).collect());
        Collective { members }
    }
}
