//! Built-in workloads as [`SimGraph`](crate::SimGraph)s: the tiled Cholesky over a 2D
//! block-cyclic grid of ranks (the same tile tasks as the GPU factorization), the random host
//! DAG the simulator is checked against on this machine, and the served model at C clients.

mod cholesky;
mod random;
mod serve;

pub use cholesky::{
    cholesky, cholesky_costs, grid, h100_rates, tile_flops, CholeskySpec, KernelRates,
};
pub use random::{RandomDag, RandomNode};
pub use serve::{serve, RequestStep, ServeSpec};
