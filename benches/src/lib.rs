//! # boundpool-bench
//!
//! What boundpool is measured with, kept out of the libraries (not published): the built-in
//! graph shapes and the rayon-core / thread-per-node baselines ([`workloads`]), the raw-driver
//! GPU baselines ([`baselines`], on cudarc's own driver layers through [`raw`]), the driver
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
//! * `raw.rs`: the only file with raw driver handles and calls (`cudarc::driver::result` and
//!   `sys`): owners destroyed by consuming them, `Copy` views, the launch (cudarc's
//!   `result::launch_kernel`, given one pointer per kernel parameter) and the copies and memset,
//!   unsafe fns on device addresses.
//! * `baselines.rs`: launches of the empty kernel through `raw::launch`, and through
//!   `boundpool_gpu::Launch::launch` inside a pool node (to read back the worker's function).
//! * `probe.rs`: launches of the built-in kernels and its poke kernel (their arguments, one
//!   8-byte slot each, given as one pointer per slot), and copies, through `raw.rs`.
//! * `cholesky.rs`: the tiled factorization's node bodies calling cuBLAS / cuSOLVER routines
//!   (`boundpool_gpu::Blas`, `Solver`: unsafe fns on device addresses) on its tiles.
//! * `replay.rs`: its GPU node bodies launch the built-in kernels through
//!   `boundpool_gpu::Launch::launch` (an unsafe fn: the kernel's parameters are the caller's
//!   contract).
//!
//! Of the bench targets, `benches/gpu.rs` launches kernels the same way and `benches/cholesky.rs`
//! calls cuBLAS / cuSOLVER routines on device addresses. No other file has `unsafe`.

pub mod baselines;
pub mod cholesky;
pub mod flags;
pub mod probe;
pub mod raw;
pub mod replay;
pub mod workloads;
