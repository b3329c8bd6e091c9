//! # boundpool
//!
//! Task graphs of GPU and host work on a bounded pool of pinned OS threads, each holding its
//! device's CUDA context bound for its whole life, stealing ready nodes from each other.
//!
//! This facade re-exports the scheduler core ([`boundpool_scheduler`], by name) and the CUDA
//! backend ([`boundpool_gpu`]), and adds the graph-file reader ([`graph_file`]) and observability
//! ([`observe`]: Chrome traces, and with the `prometheus` feature the Prometheus exporter). The
//! `boundpool` command line is its own crate (`boundpool-cli`, in `cli/`, with the SVG timelines
//! and the metric table), the workloads and baselines it runs another (`boundpool-workloads`,
//! in `workloads/`), and the benches a third (`boundpool-bench`, in `benches/`, not published),
//! so that a library user compiles neither clap, indicatif nor the exporter.
//!
//! ```
//! use boundpool::{GraphBuilder, PoolBuilder};
//!
//! let pool = PoolBuilder::new().workers(2).build()?;
//! let mut g = GraphBuilder::new("hello");
//! let a = g.node("a", |_| Ok(2u64));
//! let b = g.node("b", move |ctx| Ok(ctx.input(a)? * 21));
//! g.edge(a, b);
//! assert_eq!(pool.run(&g.build()?)?.get(b), Some(&42));
//! # Ok::<(), boundpool::Error>(())
//! ```

pub use boundpool_gpu as gpu;
/// One graph over many processes (`mpi` feature): [`boundpool_ranks`].
#[cfg(feature = "mpi")]
pub use boundpool_ranks as ranks;
pub use boundpool_scheduler::{
    backend, default_workers, estimate_graph_bytes, pin_current_thread, BoxError, Cores, DomainId,
    Error, ErrorKind, Graph, GraphBuilder, GraphHandle, GraphOutput, GroupId, GroupSpec, Inputs,
    NodeCtx, NodeId, NodeRef, Placement, Pool, PoolBuilder, PoolStats, Priority, ShutdownMode,
    SliceKind, Subgraph, SubmitFuture, Trace, TraceSlice, TraceTrack, WorkerInfo, WorkerStats,
    METRICS,
};

pub mod bounded;
pub mod graph_file;
pub mod observe;

/// The README's Rust examples, compiled and run as doctests so they stay true.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
