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
//!   (cycles, unknown or foreign nodes) into a reusable [`Graph`].
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

mod admission;
mod body;
mod ctx;
mod error;
mod graph;
mod handle;
mod metrics;
mod pool;
mod priority;
mod registry;
mod run;
mod sleep;
mod sync;
mod trace;
mod worker;

#[cfg(all(test, loom))]
mod loom_models;

pub use crate::ctx::{Inputs, NodeCtx};
pub use crate::error::{BoxError, Error, ErrorKind};
pub use crate::graph::{Graph, GraphBuilder, NodeId, NodeRef, Placement, Subgraph};
pub use crate::handle::{GraphHandle, SubmitFuture};
pub use crate::metrics::{PoolStats, WorkerStats, METRICS};
pub use crate::pool::{
    default_workers, Cores, DomainId, GroupId, GroupSpec, GroupWaker, Pool, PoolBuilder,
    ShutdownMode, WorkerInfo,
};
pub use crate::priority::Priority;
pub use crate::run::GraphOutput;
pub use crate::trace::{SliceKind, SpanRecorder, Trace, TraceSlice, TraceTrack};
