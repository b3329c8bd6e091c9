//! # boundpool-bench
//!
//! What boundpool is measured with, kept out of the libraries (not published): the built-in
//! graph shapes and the rayon-core / thread-per-node baselines ([`workloads`]), the raw-driver
//! GPU baselines ([`baselines`], built in `boundpool-gpu` behind its `bench-internals` feature,
//! since they call its driver layer directly), the benches (`cargo bench -p boundpool-bench
//! --bench scheduler|gpu|observe`) and the profiling examples (`smoke`, `build_profile`,
//! `sweep`, `gpu_probe`). The `boundpool` command line (`boundpool-cli`) runs the same
//! workloads, so every figure compares like with like.
//!
//! # Where the unsafe code is
//!
//! In this library only `replay.rs`: its GPU node bodies launch the built-in kernels through
//! `boundpool_gpu::Launch::launch` (an unsafe fn: the kernel's parameters are the caller's
//! contract). Of the bench targets, `benches/gpu.rs` does the same and `benches/cholesky.rs`
//! calls cuBLAS / cuSOLVER routines on device addresses. Each block has a `// SAFETY:` comment.
//! (The raw-driver baselines re-exported here live in `boundpool-gpu`'s `baselines.rs`, listed
//! in that crate's docs.) No other file has `unsafe`.

pub use boundpool_gpu::baselines;

pub mod replay;
pub mod workloads;
