//! GPU work in rank graphs: a rank's runtime over a GPU pool ([`GpuRanks`]), GPU nodes and
//! device values that cross ranks (`nodes.rs`), staged through page-locked host memory
//! (`staged.rs`) or, with the `nccl` feature, sent over NCCL (`nccl.rs`, with the collectives;
//! the communicator is made at build by `bootstrap.rs`). Above `graph.rs` and `ranks.rs`: it
//! adds node makers and uses the communication thread through its commands, as the host
//! values do.

#[cfg(feature = "nccl")]
mod bootstrap;
#[cfg(feature = "nccl")]
mod collective;
mod device_value;
#[cfg(feature = "nccl")]
mod nccl;
mod nodes;
mod runtime;
mod staged;

#[cfg(feature = "nccl")]
pub use collective::Collective;
pub use nodes::RankGpuCtx;
pub use runtime::{GpuRanks, GpuRanksBuilder};
