//! NCCL between the ranks' GPUs (feature `nccl`): device values sent with `ncclSend` /
//! `ncclRecv` (their length first, as a host message: the receiver allocates before it
//! receives), and collectives as GPU nodes, one member per rank. Every NCCL operation is issued
//! in the lowering's one order (`plan/order.rs`): the runtime chains each rank's operations
//! with edges, and the GPU crate runs them on the communicator's own stream.

use std::sync::Arc;

use boundpool_gpu::{DeviceBuffer, DeviceCopy, GpuDevice, GpuWorker, NcclElement, ReduceOp};
use boundpool_scheduler::backend::NodeCtxExt;
use boundpool_scheduler::{BoxError, GraphBuilder, NodeCtx};

use crate::comm::{Command, Payload};
use crate::error::{Error, ErrorKind};
use crate::gpu::nodes::{add_gpu_node, DeviceMaker, GpuMaker, RankGpuCtx, RecvWhat, SendWhat};
use crate::graph::{
    add_recv as add_recv_node, Mapped, NodeRef, RankGraphBuilder, Received, RecvNodes, SendNodes,
    SlotEnv,
};
use crate::plan::{self, On, Wire};

/// Adds the NCCL send of `what.from`'s buffer to rank `what.to`: its length as a host message,
/// and the `ncclSend` GPU node (the one in the NCCL chain).
pub(crate) fn add_send<E: DeviceCopy>(
    gb: &mut GraphBuilder<GpuWorker>,
    env: &Arc<SlotEnv>,
    what: SendWhat<'_, E>,
) -> SendNodes {
    let (from, k, to) = (what.from, what.k, what.to);
    let lenv = env.clone();
    let length = gb.node(
        format!("send the length of '{}' to rank {to}", what.name),
        move |ctx: &NodeCtx<'_, GpuWorker>| {
            let bytes = ctx.input(from)?.bytes() as u64;
            let run = lenv.current();
            run.sends[k as usize].complete_on(ctx.complete_later());
            lenv.comm.send(Command::Send {
                run,
                k,
                payload: Payload::Owned(bytes.to_ne_bytes().to_vec()),
            });
            Ok(())
        },
    );
    let send = add_gpu_node(
        gb,
        env,
        what.device,
        format!("ncclSend '{}' to rank {to}", what.name),
        what.producer,
        move |ctx| {
            let gpu = ctx.gpu();
            gpu.nccl_send_bytes(gpu.input(from)?, to)?;
            Ok(())
        },
    );
    // The length goes first: the receiver must post its ncclRecv for this ncclSend to finish,
    // and it can only once the length is there.
    gb.edge(length.id(), send.id());
    SendNodes {
        inputs: vec![length.id(), send.id()],
        nccl: Some(send.id()),
    }
}

/// Adds the NCCL receive of transfer `what.k`: the length's receive node, then the `ncclRecv`
/// GPU node on `what.device` (its output, a new buffer, is what consumers read).
pub(crate) fn add_recv<E: DeviceCopy>(
    gb: &mut GraphBuilder<GpuWorker>,
    env: &Arc<SlotEnv>,
    what: RecvWhat<'_>,
) -> RecvNodes {
    let length = add_recv_node(gb, env, what.k, format!("{} (length)", what.name));
    let from = what.from;
    let recv = add_gpu_node(
        gb,
        env,
        what.device,
        format!("ncclRecv {}", what.name),
        what.producer,
        move |ctx| {
            let gpu = ctx.gpu();
            let received: &Received = gpu.input(length)?;
            let bytes = *received
                .get::<u64>()
                .ok_or("the length of an NCCL value did not arrive")?
                as usize;
            let size = std::mem::size_of::<E>();
            if size == 0 || bytes % size != 0 {
                return Err(format!(
                    "{bytes} bytes are not a whole number of {}",
                    std::any::type_name::<E>()
                )
                .into());
            }
            let mut buf = gpu.alloc::<E>(bytes / size)?;
            gpu.nccl_recv_bytes(&mut buf, from)?;
            Ok(buf)
        },
    );
    gb.edge(length.id(), recv.id());
    RecvNodes {
        out: recv.id(),
        nccl: Some(recv.id()),
        mapped: Mapped::Local(Box::new(recv)),
    }
}

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
