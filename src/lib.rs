//! # boundpool
//!
//! Task graphs of GPU and host work on a bounded pool of pinned OS threads, each holding its
//! device's CUDA context bound for its whole life, stealing ready nodes from each other.
//!
//! This facade re-exports the scheduler core ([`boundpool_scheduler`]) and the CUDA backend
//! ([`boundpool_gpu`]), and holds the built-in workloads the `boundpool` command line and the
//! benches run.
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
pub use boundpool_scheduler::*;

pub mod bounded;
pub mod graph_file;
pub mod observe;
pub mod workloads;

/// The README's Rust examples, compiled and run as doctests so they stay true.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
