//! # boundpool-scheduler
//!
//! The CUDA-free core of boundpool: a fixed pool of pinned worker threads that runs task graphs
//! by work stealing.
//!
//! * [`PoolBuilder`] creates the OS threads once, pins each to a core, and runs a per-worker
//!   start hook whose result is that worker's state (the GPU backend binds its CUDA context
//!   there). The number of threads never changes afterwards.
//! * [`GraphBuilder`] describes a graph: named nodes whose bodies return typed outputs, edges,
//!   placements on worker groups, inlined subgraphs. [`GraphBuilder::build`] validates it
//!   (cycles, unknown or foreign nodes) into a reusable [`Graph`]. A node reads its
//!   predecessors' outputs ([`Inputs::input`]), or takes one by value when it is its only
//!   successor ([`Inputs::take`]: a buffer written in place, without a lock).
//! * [`Pool::submit`] runs a graph from any thread and returns a [`GraphHandle`] that can be
//!   waited on or awaited. A node may submit and wait on a nested graph; its worker runs other
//!   nodes meanwhile, so nesting never deadlocks the pool.
//! * A node's error or panic fails its graph with the node's name; nodes not yet started are
//!   cancelled; the worker and other graphs go on.
//! * Statistics are live in [`Pool::stats`] and exported through the [`metrics`](::metrics) facade
//!   (see [`METRICS`]).
//!
//! ```
//! use boundpool_scheduler::{GraphBuilder, PoolBuilder};
//!
//! let pool = PoolBuilder::new().workers(2).build()?;
//! let mut g = GraphBuilder::new("diamond");
//! let a = g.node("a", |_| Ok(1u32));
//! let b = g.node("b", move |ctx| Ok(ctx.input(a)? * 10));
//! let c = g.node("c", move |ctx| Ok(ctx.input(a)? * 100));
//! let d = g.node("d", move |ctx| Ok(ctx.input(b)? + ctx.input(c)?));
//! g.edge(a, b).edge(a, c).edge(b, d).edge(c, d);
//! let graph = g.build()?;
//! for _ in 0..3 {
//!     let out = pool.submit(&graph)?.wait()?;
//!     assert_eq!(out.get(d), Some(&110));
//! }
//! # Ok::<(), boundpool_scheduler::Error>(())
//! ```
//!
//! The worker loop, memory orderings and shutdown steps are described in the crate's README.
//! [`policy`] is the order in which a worker takes ready nodes, generic over its queues: the
//! workers and the simulator (`boundpool-sim`) run the same decision.
//!
//! # Where the unsafe code is
//!
//! The one list (the README points here). Every block has a `// SAFETY:` comment and every
//! unsafe fn a `# Safety` section; `clippy::undocumented_unsafe_blocks` is on.
//!
//! * `run/mod.rs`: `RunRef`, the pointer a task and a worker hold their run by, without a
//!   reference count (never as a `&Run` argument across a point where they give their in-flight
//!   unit away, as another worker may then free the run while that frame is live; the unit is
//!   given up by a decrement through the raw pointer), and the read of a finished run's slots.
//! * `run/task.rs`: a `Task` (a `RunRef` and a node) is `Send`.
//! * `output.rs`: output slots, `UnsafeCell`s ordered by the dependency counters, allocated
//!   by the first node that stores (`alloc_zeroed`) and freed with the run; a value lent to
//!   successors as `&T`, or moved out by the node's only successor (`NodeOutput::take_value`).
//! * `body.rs`: node bodies behind one thin pointer (a vtable-prefixed block, or a static vtable
//!   for a closure that captures nothing): the crate's type-erased code.
//! * `backend.rs`: a node's marker, written into its own output slot, and its successors' reads
//!   of their predecessors' markers (ordered by the same dependency counters, `run/release.rs`).
//! * `ctx.rs`: a node's reads of its predecessors' output slots and markers, its take of a
//!   value it is the only successor of (`Inputs::take`), and its worker's writes of its own slot
//!   (ordered by the same dependency counters, `run/release.rs`).
//! * `handle.rs`: the thread-local pointer from a thread to its worker (for nested waits), set
//!   and cleared by an RAII guard (`CurrentGuard`, an unsafe constructor), and its reads.
//! * `worker/life.rs`: that pointer's lifetime erased for the guard, and the `prctl` that
//!   tightens a worker thread's timer slack (Linux).
//! * `sync.rs`: the zeroed allocations of the dependency counters and of a graph's build-time
//!   lists (`alloc_zeroed`, then `Box::from_raw` / `Vec::from_raw_parts`), and the cache prefetch
//!   hint (`_mm_prefetch`).
//! * `trace.rs`: the zeroed allocation of a worker's trace ring, and the time-stamp counter read
//!   (`_rdtsc`, after an `_mm_lfence` for a node's start).
//! * `spin.rs`: `sched_getcpu` (Linux), the core a spinning waiter runs on.
//! * `affinity.rs`: `sched_setaffinity` (Linux): a thread pinned to a set of cores
//!   ([`pin_current_thread`], [`Pool::keep_off_workers`]).
//! * `loom_models.rs` (only under `--cfg loom`, test builds): the models of the output slots.
//!
//! No other file has `unsafe`.

mod active;
mod admission;
mod affinity;
pub mod backend;
mod body;
mod config;
mod ctx;
mod error;
mod graph;
mod handle;
mod hooked;
mod ids;
mod latch;
mod later;
mod metrics;
mod output;
pub mod policy;
mod pool;
mod priority;
mod registry;
mod run;
mod sleep;
mod spin;
mod submit;
mod sync;
mod trace;
mod worker;

#[cfg(all(test, loom))]
mod loom_models;

pub use crate::affinity::pin_current_thread;
pub use crate::config::{Cores, GroupSpec, ShutdownMode, WorkerInfo};
pub use crate::ctx::{Inputs, NodeCtx};
pub use crate::error::{BoxError, Error, ErrorKind};
pub use crate::graph::{estimate_graph_bytes, Graph, GraphBuilder, Subgraph};
pub use crate::handle::GraphHandle;
pub use crate::ids::{DomainId, GroupId, NodeId, NodeRef, Placement, Priority};
pub use crate::metrics::{PoolStats, WorkerStats, METRICS};
pub use crate::output::GraphOutput;
pub use crate::pool::{default_workers, Pool, PoolBuilder};
pub use crate::submit::SubmitFuture;
pub use crate::trace::{SliceKind, Trace, TraceSlice, TraceTrack};
