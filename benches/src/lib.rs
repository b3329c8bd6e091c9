//! # boundpool-bench
//!
//! What boundpool is measured with beyond what the command line runs, kept out of the
//! libraries (not published): the benches (`cargo bench -p boundpool-bench --bench
//! scheduler|gpu|observe|cholesky|replay|serve|partition`; the flags of `gpu`, `replay`, `serve`
//! and `partition` are clap parsers read with [`flags`], `-- --help` lists them),
//! the tiled Cholesky workload ([`cholesky`]), the profiling examples (`smoke`,
//! `build_profile`, `sweep`, `gpu_probe`) and the device scripts (`device/`). The graph shapes,
//! the baselines and the replay bench live in `boundpool-workloads`, which the `boundpool`
//! command line runs too, so every figure compares like with like.
//!
//! # Where the unsafe code is
//!
//! Each block has a `// SAFETY:` comment and each unsafe fn a `# Safety` section.
//!
//! * `cholesky.rs`: the tiled factorization's node bodies calling cuBLAS / cuSOLVER routines
//!   (`boundpool_gpu::Blas`, `Solver`: unsafe fns on device addresses) on its tiles.
//!
//! Of the bench targets, `benches/gpu.rs` launches kernels (`boundpool_gpu::Launch::launch`),
//! `benches/cholesky.rs` calls cuBLAS / cuSOLVER routines on device addresses, and
//! `benches/partition.rs` launches the spin kernel and calls cuBLAS GEMMs (cudarc's `Gemm`).
//! No other file has `unsafe`.

pub mod cholesky;
pub mod flags;
