//! The ranks' NCCL communicator (feature `nccl`), made at build by a graph of its own: rank 0
//! makes the id (`ncclGetUniqueId`), which goes to every other rank over the ranks' transport
//! as a plain value; then each rank joins on its NCCL device, on a bound worker of it
//! (`ncclCommInitRank`, which waits for every rank) and connects it to its peers for every kind
//! of operation (`GpuCtx::nccl_connect`). Every rank builds and submits this graph first, so
//! the usual check (rank 0 compares the graphs) covers it too.

use boundpool_gpu::{GpuDevice, GpuWorker, NcclId};

use crate::error::Error;
use crate::graph::RankGraphBuilder;
use crate::ranks::Ranks;

/// Makes `ranks`' communicator on `device`, its NCCL device.
pub(crate) fn make_communicator(ranks: &Ranks<GpuWorker>, device: &GpuDevice) -> Result<(), Error> {
    let device = device.clone();
    let size = ranks.size();
    let mut g = RankGraphBuilder::<GpuWorker>::new("nccl communicator");
    let id = g.plain_node(0, "nccl id", |_| Ok(NcclId::new()?.as_bytes().to_vec()));
    for r in 0..size {
        let join = g.gpu_node(r, &device, format!("nccl join rank {r}"), move |ctx| {
            let id = NcclId::from_bytes(ctx.input(id)?)?;
            ctx.gpu().nccl_init(&id, r, size)?;
            // Connected now, by every rank together: later operations never wait, inside a
            // worker, for a peer's handshake.
            ctx.gpu().nccl_connect()?;
            Ok(())
        });
        g.edge(id, join);
    }
    ranks.run(&g.build(ranks)?)?;
    Ok(())
}
