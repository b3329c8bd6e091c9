//! # boundpool-bench
//!
//! What boundpool is measured with, kept out of the libraries (not published): the built-in
//! graph shapes and the rayon-core / thread-per-node baselines ([`workloads`]), the raw-driver
//! GPU baselines ([`baselines`], built in `boundpool-gpu` behind its `bench-internals` feature,
//! since they call its driver layer directly), the benches (`cargo bench -p boundpool-bench
//! --bench scheduler|gpu|observe`) and the profiling examples (`smoke`, `build_profile`,
//! `sweep`, `gpu_probe`). The `boundpool` command line (`boundpool-cli`) runs the same
//! workloads, so every figure compares like with like.

pub use boundpool_gpu::baselines;

pub mod replay;
pub mod workloads;
