//! # boundpool-test-support
//!
//! What the workspace's GPU and command-line tests share, in one place (a dev-dependency of
//! `boundpool-gpu`, `boundpool-bench` and `boundpool-cli`; not published):
//!
//! * the GPU test guard [`GpuTest`]: without a GPU a test is skipped visibly (a `SKIPPED` line
//!   on the real stderr) or fails under `BOUNDPOOL_REQUIRE_GPU=1`; a watchdog aborts a hung
//!   test; at the end, no framework driver call may have been made with the wrong context.
//!   It detects a GPU through [`boundpool_gpu::gpu_unavailable_reason`] (libcuda looked up,
//!   then the device count), never through cudarc's `CudaContext::new`, which panics without
//!   libcuda;
//! * test pools on device 0 ([`gpu_pool_builder`], [`gpu_pool`], [`gpu_pool_with_host`],
//!   [`replay_pool`]);
//! * the spin node's GPU work ([`set_add_spin`], [`spin_set_add`]);
//! * the stream a library handle is set to, as the library reports it ([`cublas_stream`],
//!   [`solver_stream`]);
//! * [`os_threads`] and [`chain`] (an error's whole chain as one line).
//!
//! # Where the unsafe code is
//!
//! `libs.rs` only: the two stream queries (`cublasGetStream`, `cusolverDnGetStream`) on a
//! live handle, each with a `// SAFETY:` comment.

mod guard;
mod libs;
mod nodes;

pub use guard::{uncaptured_notice, GpuTest};
pub use libs::{cublas_stream, solver_stream};
pub use nodes::{
    gpu_pool, gpu_pool_builder, gpu_pool_with_host, replay_pool, set_add_spin, spin_set_add,
};

/// OS threads of this process (Linux: the entries of `/proc/self/task`; 0 where it cannot be
/// read).
pub fn os_threads() -> usize {
    std::fs::read_dir("/proc/self/task").map_or(0, |d| d.count())
}

/// An error and every `source()` under it, as one line (`outer <- inner <- ...`).
pub fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(" <- ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}
