//! # boundpool-bench
//!
//! What boundpool is measured with, kept out of the libraries (not published): the built-in
//! graph shapes and the rayon-core / thread-per-node baselines ([`workloads`]), the raw-driver
//! GPU baselines ([`baselines`], on cudarc's own types and driver calls through [`raw`]), the driver
//! self-test behind the `gpu_probe` example ([`probe`]), the tiled Cholesky workload
//! ([`cholesky`]), the benches (`cargo bench -p boundpool-bench --bench
//! scheduler|gpu|observe|cholesky|replay|serve|partition`, their flags read with [`flags`]) and the profiling examples (`smoke`, `build_profile`,
//! `sweep`, `gpu_probe`). The `boundpool` command line (`boundpool-cli`) runs the same
//! workloads, so every figure compares like with like.
//!
//! # Where the unsafe code is
//!
//! Each block has a `// SAFETY:` comment and each unsafe fn a `# Safety` section.
//!
//! * `raw.rs`: the only file with raw driver calls (`cudarc::driver::result` on the handles of
//!   cudarc's safe types, which own them; `sys` for the CUDA-graph calls cudarc lacks, with
//!   owners of its own that destroy what they hold when dropped, and `Copy` views); the launch
//!   (cudarc's `result::launch_kernel`, given one pointer per kernel parameter) is an unsafe
//!   fn; turning cudarc's event tracking off on the baselines' context.
//! * `baselines.rs`: launches of the empty kernel through `raw::launch`, and through
//!   `boundpool_gpu::Launch::launch` inside a pool node (to read back the worker's function).
//! * `probe.rs`: launches of the built-in kernels and its poke kernel (their arguments, one
//!   8-byte slot each, given as one pointer per slot) through `raw.rs`, and turning cudarc's
//!   event tracking off on its context (its copies are cudarc's).
//! * `cholesky/dense.rs`: the tiled Cholesky's f64 routines (`TileBlas`, `potrf`), unsafe fns:
//!   cuBLAS and cuSOLVER calls (cudarc's `cublas::result` / `sys`, `cusolver::sys`, and its safe
//!   `Gemm`) over typed views' pointers, the views checked against their slices; a view is
//!   shared, so the caller orders what writes through it. `cholesky.rs`: its node bodies and
//!   checks calling them.
//! * `replay.rs`: its GPU node bodies launch the built-in kernels through
//!   `boundpool_gpu::Launch::launch` (an unsafe fn: the kernel's parameters are the caller's
//!   contract).
//!
//! Of the bench targets, `benches/gpu.rs` launches kernels the same way, `benches/partition.rs`
//! too and calls cudarc's `Gemm`, and `benches/cholesky.rs` calls the Cholesky's routines;
//! `benches/serve.rs` and `benches/partition.rs` include the served model
//! (`examples/serve/model.rs`: pinned buffers' host access, cuBLASLt matmuls, kernel launches).
//! No other file of this crate's library and bench targets has `unsafe`.

pub mod baselines;
pub mod cholesky;
pub mod flags;
pub mod probe;
pub mod raw;
pub mod replay;
pub mod workloads;
