//! # boundpool-workloads
//!
//! The workloads boundpool is measured with and the baselines it is measured against, as a
//! library: the `boundpool` command line (`boundpool-cli`) runs them, and so do the benches
//! (`boundpool-bench`, not published), so that every figure compares like with like.
//!
//! * Graph shapes ([`Shape`], [`Dag`]): chain, binary tree, wide, wavefront and a seeded random
//!   DAG, or a graph file's nodes and edges; [`Dag::to_graph`] builds a boundpool graph of one,
//!   [`busy_work`] spins a node's `work_ns`.
//! * The host bench ([`bench_shapes`], [`bench_scaling`], [`bench_build`]): the standard shapes
//!   on boundpool and, in the same process, on rayon-core ([`rayon_spawn`], [`rayon_inline`])
//!   and an OS thread per node ([`thread_per_node`]).
//! * The replay bench ([`bench_replay`], [`bench_replay_on`]): graphs of empty-kernel GPU nodes
//!   run eagerly, replayed as CUDA graphs, and as a raw CUDA graph of the same topology built
//!   with the driver API ([`raw_graph`], [`captured_graph`]).
//! * The raw-driver GPU baselines ([`raw_launches`], [`thread_per_task`], [`server_thread`],
//!   [`event_edge_chain`], ...) and a GPU machine's self-test ([`probe`]).
//! * The tiled Cholesky factorization's task graph ([`tile_tasks`], [`TileOp`], [`TileTask`]),
//!   device-free: the GPU factorization and the simulator make their graphs from it.
//! * One percentile helper ([`percentile`], [`median`], [`Sorted`]) for every figure.
//!
//! The GPU parts load libcuda at run time (through `boundpool-gpu` and cudarc's dynamic
//! loading): without a driver they return an error instead of failing to link.
//!
//! # Where the unsafe code is
//!
//! Each block has a `// SAFETY:` comment and each unsafe fn a `# Safety` section.
//!
//! * `raw.rs`: the only file with raw driver calls (`cudarc::driver::result` on the handles of
//!   cudarc's safe types, which own them, and on `boundpool_gpu::CudaGraphTemplate`'s: the
//!   executable of one, owned by `GraphExec`, destroyed when dropped); the launch (cudarc's
//!   `result::launch_kernel`, given one pointer per kernel parameter) and the empty kernel's
//!   node added to a template (`add_empty_kernel`) and read back (`kernel_function`) are
//!   unsafe fns; turning cudarc's event tracking off on the baselines' context.
//! * `baselines.rs`: launches of the empty kernel through `raw::launch`, and through
//!   `boundpool_gpu::Launch::launch` inside a pool node (to read back the worker's function);
//!   the template and capture calls that take nodes (`CudaGraphTemplate`'s `add_*`,
//!   `remove_node`, `kernel_node_params`, `CaptureExt::set_capture_dependencies`), given
//!   nodes of the graph at hand.
//! * `probe.rs`: launches of the built-in kernels and its poke kernel (their arguments, one
//!   8-byte slot each, given as one pointer per slot) through `raw.rs`, and turning cudarc's
//!   event tracking off on its context (its copies are cudarc's).
//! * `replay.rs`: its GPU node bodies launch the built-in kernels through
//!   `boundpool_gpu::Launch::launch` (an unsafe fn: the kernel's parameters are the caller's
//!   contract).
//!
//! No other file has `unsafe`.

mod baselines;
mod cholesky;
mod host;
mod probe;
// The baselines' and the probe's driver layer: its items are `pub` for every file of this
// crate and never re-exported.
#[allow(unreachable_pub)]
mod raw;
mod replay;
mod shapes;
mod stats;

pub use baselines::{
    call_costs, captured_graph, captured_graph_on_worker, event_edge_chain,
    event_edge_chain_two_threads, graph_variants, host_sync_edge_chain, raw_graph, raw_launches,
    server_thread, shared_stream_chain_two_threads, thread_per_task, CapturedGraph, GraphVariant,
    GraphVariants, Measurement, RawGraph, GRAPH_VARIANTS,
};
pub use cholesky::{tile_tasks, TileOp, TileTask};
pub use host::{
    bench_build, bench_scaling, bench_shapes, evict_caches, rayon_inline, rayon_spawn,
    run_boundpool, scaling_workers, standard_shapes, thread_per_node, BenchConfig, BenchRow,
    ScalingRow, EVICT_BYTES,
};
pub use probe::probe;
pub use raw::Error as BaselineError;
pub use replay::{
    bench_replay, bench_replay_on, bench_variants, eager_graph, gpu_pool, gpu_pool_with,
    replay_graph, replay_graph_with, replay_table, variants_table, GpuShape, ReplayBenchConfig,
    ReplayRow, UpdateRow, VariantRow,
};
pub use shapes::{busy_work, empty_graph, Adjacency, Dag, Shape};
pub use stats::{median, percentile, Sorted};
