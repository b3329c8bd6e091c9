//! NCCL between the ranks' GPUs (feature `nccl`): device values sent with `ncclSend` /
//! `ncclRecv` (their length first, as a host message: the receiver allocates before it
//! receives); the collectives are in `collective.rs`. Every NCCL operation is issued
//! in the lowering's one order (`plan/order.rs`): the runtime chains each rank's operations
//! with edges, and the GPU crate runs them on the communicator's own stream.

use std::sync::Arc;

use boundpool_gpu::{DeviceCopy, GpuWorker};
use boundpool_scheduler::backend::NodeCtxExt;
use boundpool_scheduler::{GraphBuilder, NodeCtx};

use crate::comm::{Command, Payload};
use crate::gpu::nodes::{add_gpu_node, RecvWhat, SendWhat};
use crate::graph::{add_recv as add_recv_node, Mapped, Received, RecvNodes, SendNodes, SlotEnv};

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
