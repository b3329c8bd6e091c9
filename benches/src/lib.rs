//! # boundpool-bench
//!
//! What boundpool is measured with beyond what the command line runs, kept out of the
//! libraries (not published): the benches (`cargo bench -p boundpool-bench --bench
//! scheduler|gpu|observe|cholesky|replay|serve|partition|isolation`; the flags of `gpu`,
//! `replay`, `serve`, `partition` and `isolation` are clap parsers read with [`flags`],
//! `-- --help` lists them), the tiled Cholesky workload ([`cholesky`]), the stall injector of
//! the serve and isolation benches ([`stalls`]), the profiling examples (`smoke`,
//! `build_profile`, `sweep`, `gpu_probe`) and the device scripts (`device/`). The graph shapes,
//! the baselines and the replay bench live in `boundpool-workloads`, which the `boundpool`
//! command line runs too, so every figure compares like with like.
//!
//! # Where the unsafe code is
//!
//! Each block has a `// SAFETY:` comment and each unsafe fn a `# Safety` section.
//!
//! * `cholesky/dense.rs`: the tiled Cholesky's f64 routines (`TileBlas`, `potrf`), unsafe fns:
//!   cuBLAS and cuSOLVER calls (cudarc's `cublas::result` / `sys`, `cusolver::sys`, and its safe
//!   `Gemm`) over typed views' pointers, the views checked against their slices; a view is
//!   shared, so the caller orders what writes through it. `cholesky.rs`: its node bodies and
//!   checks calling them.
//! * `stalls.rs`: `sched_setscheduler` on the calling stall thread (`libc`), to put it at
//!   `SCHED_FIFO`.
//!
//! Of the bench targets, `benches/gpu.rs` launches kernels (`boundpool_gpu::Launch::launch`),
//! `benches/partition.rs` too and calls cudarc's `Gemm`, and `benches/cholesky.rs` calls the
//! Cholesky's routines; `benches/serve.rs` and `benches/partition.rs` include the served model
//! (`examples/serve/model.rs`: pinned buffers' host access, cuBLASLt matmuls, kernel launches).
//! No other file of this crate's library and bench targets has `unsafe`.

pub mod cholesky;
pub mod flags;
pub mod stalls;
