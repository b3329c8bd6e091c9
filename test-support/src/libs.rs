//! The stream a library handle is set to, as the library itself reports it: what the tests
//! compare with the node's stream ([`boundpool_gpu::GpuCtx::raw_stream`]).

use boundpool_gpu::cudarc::cublas::{result::CublasError, sys as cb, CudaBlas};
use boundpool_gpu::cudarc::cusolver::{result::CusolverError, sys as cs, DnHandle};

/// `cublasGetStream` of `blas`, as a raw `CUstream` value.
pub fn cublas_stream(blas: &CudaBlas) -> Result<u64, CublasError> {
    let mut s: cb::cudaStream_t = std::ptr::null_mut();
    // SAFETY: a live handle (borrowed); the call writes one stream handle.
    unsafe { cb::cublasGetStream_v2(*blas.handle(), &mut s) }.result()?;
    Ok(s as u64)
}

/// `cusolverDnGetStream` of `solver`, as a raw `CUstream` value.
pub fn solver_stream(solver: &DnHandle) -> Result<u64, CusolverError> {
    let mut s: cs::cudaStream_t = std::ptr::null_mut();
    // SAFETY: a live handle (borrowed); the call writes one stream handle.
    unsafe { cs::cusolverDnGetStream(solver.cu(), &mut s) }.result()?;
    Ok(s as u64)
}
