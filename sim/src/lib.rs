//! # boundpool-sim
//!
//! A boundpool graph's run on a machine the project does not have, in virtual time.
//! (Work in progress: the crate docs are completed with the design note.)

mod broadcast;
mod cost;
mod dist;
mod engine;
mod error;
mod graph;
mod machine;
mod report;
pub mod workload;

pub use crate::cost::{kind_of, CostModel, KindCost};
pub use crate::dist::{Dist, QUANTILES};
pub use crate::engine::{Broadcast, SimOptions};
pub use crate::error::{SimError, SimErrorKind, SimResult};
pub use crate::graph::{NodeSpec, SimGraph};
pub use crate::machine::{
    CommDesc, Completion, GpuDesc, GpuTransfer, GroupDesc, Link, LinksDesc, Machine, Network,
    SchedDesc,
};
pub use crate::report::{Bounds, Busy, PathStep, SimReport};

/// Simulates one run of `graph` on `machine`, every node's costs sampled from `costs`.
pub fn simulate(
    graph: &SimGraph,
    machine: &Machine,
    costs: &CostModel,
    opts: &SimOptions,
) -> SimResult<SimReport> {
    engine::simulate(graph, machine, costs, opts, &mut |_, _| {})
}

/// [`simulate`], calling `progress(tasks done, tasks)` as the run goes (about every 1%).
pub fn simulate_with_progress(
    graph: &SimGraph,
    machine: &Machine,
    costs: &CostModel,
    opts: &SimOptions,
    progress: &mut dyn FnMut(usize, usize),
) -> SimResult<SimReport> {
    engine::simulate(graph, machine, costs, opts, progress)
}
