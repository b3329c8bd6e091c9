//! # boundpool-sim
//!
//! A boundpool graph's run on a machine this project does not have (P ranks × G GPUs, the
//! links between them), in virtual time: StarPU's SimGrid mode in boundpool's terms. Costs
//! come from real runs' traces ([`CostModel`]); the machine is a description of hosts, cores,
//! GPUs and links as latency + bandwidth ([`Machine`]); the run is decided by the same code as
//! the real runs where that code can run without threads; the result says how long, how busy
//! each worker, GPU and link was, and what the critical path was made of ([`SimReport`]),
//! with a trace that `boundpool trace` and Perfetto open like a real one.
//!
//! ```
//! use boundpool_sim::workload::{cholesky, cholesky_costs, h100_rates, CholeskySpec};
//! use boundpool_sim::{simulate, GpuTransfer, Machine, Network, SimOptions};
//!
//! // A 32768² tiled Cholesky on 16 H100s (two hosts), costs from the measured tile kernels.
//! let costs = cholesky_costs(2048, &h100_rates(2048).unwrap());
//! let graph = cholesky(&CholeskySpec::new(32768, 2048, 16))?;
//! let machine = Machine::h100_cluster(16, Network::InfiniBand4x200, GpuTransfer::Direct);
//! let report = simulate(&graph, &machine, &costs, &SimOptions::default())?;
//! assert!(report.makespan_s > 0.0 && report.transfers > 0);
//! println!("{}", report.summary());
//! # Ok::<(), boundpool_sim::SimError>(())
//! ```
//!
//! # The same code as the real runs
//!
//! * **Placement and cross-rank lowering**: [`simulate`] lowers the graph's
//!   [`GraphDesc`](boundpool_ranks::GraphDesc) with `boundpool_ranks::plan::lower`, the
//!   function `RankGraphBuilder::build` calls: the same ranks, the same transfers (one per
//!   value and consuming rank), the same local edges, and the transfers' `priority`.
//! * **The order a worker takes ready nodes in**: `boundpool_scheduler::policy::find_task`,
//!   the function the workers call (own deque LIFO, the group's injector, the pool-wide one,
//!   stealing from a random peer on; levels in `poll_order`'s order with the fixed shares),
//!   here over queues of the simulator's own that take batches as crossbeam's do.
//! * **The tiled Cholesky's tasks**: `boundpool_workloads::tile_tasks`, from which the GPU
//!   factorization (`boundpool-bench`'s `CholeskyPlan`) builds its graph.
//!
//! The rest of a worker's life is modelled after the scheduler's code, not shared with it
//! (it is welded to atomics and threads): releasing successors (the first that may run here
//! runs next, the others go to the own deque, or the placement's injector, each push waking
//! an idle peer of the group), watching the queues for 20 µs before parking, deferred
//! completions (`complete_when`: seen when the worker that registered them runs dry), a GPU
//! node's stream and the stream hand-off, the communication thread's jobs. Where the real
//! code waits on a clock or a thread, the simulator advances a virtual clock.
//!
//! # The model, in short (the design note is `sim/README.md`)
//!
//! * **Costs** per node kind ([`kind_of`] of its name by default): a host time (the body on
//!   its worker) and, for a GPU node, a device time, each an empirical distribution
//!   ([`Dist`]), sampled with a seeded generator in task order: the same seed gives the same
//!   run, event for event.
//! * **Hosts** share their cores among the workers' bodies, the communication threads' work
//!   and idle workers' 20 µs watching spins (processor sharing); threads yielding take
//!   nothing (measured on this machine's scheduler).
//! * **GPUs**: each worker enqueues on its own stream (one per level; a GPU predecessor's
//!   stream with the hand-off); a kernel starts after the launch latency, the kernels before it
//!   on its stream and its GPU predecessors' (event waits). Kernels of all streams share the
//!   SMs: each holds its kind's occupancy of the GPU; where the running kernels' occupancies
//!   sum past 1, all of them slow by the same factor, whatever their stream's priority (a
//!   priority orders which blocks start, never what runs; a machine may turn levels on). A
//!   kind's occupancy follows from its rate alone ([`SmShare`]: the part of its time its
//!   arithmetic at peak explains fills the GPU; of the rest it holds a share calibrated once
//!   on a recorded run); a kind whose kernels slow each other beyond their share has an
//!   interference above 1 ([`KindCost::interference`]).
//! * **Links**: a message crosses its path's stages (a GPU value staged through the host:
//!   device-to-host copy, the host link, host-to-device copy, pipelined in chunks); each
//!   stage holds its out-port for `bytes / bandwidth` (one message at a time, in arrival
//!   order, or by the lowering's priority) and is written into the in-port after what came
//!   before it there; latency on top. Host values between ranks of one host are copied by
//!   the communication threads (their cores' time).
//!
//! # Where the unsafe code is
//!
//! Nowhere: the crate has no `unsafe`.

mod cost;
mod dist;
mod engine;
mod error;
mod graph;
mod json_file;
mod machine;
mod report;
mod sharing;
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
pub use crate::sharing::SmShare;

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
