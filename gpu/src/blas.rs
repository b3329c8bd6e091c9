//! cuBLAS and cuSOLVER (dense) as node bodies see them: [`GpuCtx::blas`], [`GpuCtx::cublas`]
//! and [`GpuCtx::solver`] give a node its worker's handle (`libs.rs`), already set to the stream
//! the node enqueues on (its worker's own stream of the node's priority level, or one a
//! predecessor of the same level handed over to it) with the worker's workspace for it; the
//! stream is set only when it changed since the handle's last use. Also [`GpuCtx::state`], a
//! worker's user state (`state.rs`).

use std::cell::RefMut;
use std::ffi::c_int;
use std::fmt;

use cudarc::cublas::sys as cb;
use cudarc::cublas::CudaBlas;
use cudarc::cusolver::sys as cs;

use crate::error::{GpuError, GpuErrorKind, GpuResult};
use crate::libs::{blas_check, solver_check, status_error, BlasHandle, BLAS_WORKSPACE_BYTES};
use crate::node::GpuCtx;

fn dim(v: usize, name: &str, what: &dyn Fn() -> String) -> GpuResult<c_int> {
    c_int::try_from(v).map_err(|_| {
        GpuError::new(
            GpuErrorKind::InvalidArgument,
            format!(
                "{}: {name} = {v} does not fit the library's 32-bit int",
                what()
            ),
        )
    })
}

/// The error for a non-zero `info` of `potrf` on the tile or matrix node `node` factored:
/// `info > 0`: the leading minor of that order is not positive definite; `info < 0`: argument
/// `-info` was wrong.
pub fn potrf_info_error(node: &str, info: i32) -> GpuError {
    let why = if info > 0 {
        format!("the leading minor of order {info} is not positive definite")
    } else {
        format!("parameter {} had an illegal value", -info)
    };
    GpuError::new(
        GpuErrorKind::Library,
        format!("node '{node}': cusolverDnDpotrf: info = {info}: {why}"),
    )
}

/// Which triangle of a matrix a call reads or writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Uplo {
    /// The lower triangle.
    Lower,
    /// The upper triangle.
    Upper,
}

/// Whether a call uses a matrix as is or transposed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trans {
    /// As is.
    No,
    /// Transposed.
    T,
}

/// On which side a triangular matrix multiplies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// `op(A) X`.
    Left,
    /// `X op(A)`.
    Right,
}

/// Whether a triangular matrix has an implicit unit diagonal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Diag {
    /// The diagonal is read from the matrix.
    NonUnit,
    /// The diagonal is taken as ones.
    Unit,
}

impl Uplo {
    fn blas(self) -> cb::cublasFillMode_t {
        match self {
            Uplo::Lower => cb::cublasFillMode_t::CUBLAS_FILL_MODE_LOWER,
            Uplo::Upper => cb::cublasFillMode_t::CUBLAS_FILL_MODE_UPPER,
        }
    }
    fn solver(self) -> cs::cublasFillMode_t {
        match self {
            Uplo::Lower => cs::cublasFillMode_t::CUBLAS_FILL_MODE_LOWER,
            Uplo::Upper => cs::cublasFillMode_t::CUBLAS_FILL_MODE_UPPER,
        }
    }
}

impl Trans {
    fn blas(self) -> cb::cublasOperation_t {
        match self {
            Trans::No => cb::cublasOperation_t::CUBLAS_OP_N,
            Trans::T => cb::cublasOperation_t::CUBLAS_OP_T,
        }
    }
}

impl Side {
    fn blas(self) -> cb::cublasSideMode_t {
        match self {
            Side::Left => cb::cublasSideMode_t::CUBLAS_SIDE_LEFT,
            Side::Right => cb::cublasSideMode_t::CUBLAS_SIDE_RIGHT,
        }
    }
}

impl Diag {
    fn blas(self) -> cb::cublasDiagType_t {
        match self {
            Diag::NonUnit => cb::cublasDiagType_t::CUBLAS_DIAG_NON_UNIT,
            Diag::Unit => cb::cublasDiagType_t::CUBLAS_DIAG_UNIT,
        }
    }
}

// ----------------------------------------------------------------------------------------------
// What nodes see.

impl<'a, 'n> GpuCtx<'a, 'n> {
    /// This worker's cuBLAS handle, set to the stream this node enqueues on (the worker's
    /// stream of the node's priority level, or one handed over; created on the worker at its
    /// first use; a missing libcublas is an error naming the node).
    ///
    /// Under a replay capture the calls are captured too: the handle is set to the capturing
    /// stream with a workspace of its own, allocated outside the graph and kept as long as the
    /// replay (as PyTorch sets one per handle and stream, so that cuBLAS allocates nothing while
    /// capturing).
    pub fn blas(&self) -> GpuResult<Blas<'_, 'a, 'n>> {
        let h = self.blas_handle()?;
        let (raw, stream_sets) = (h.raw(), h.stream_sets);
        drop(h);
        Ok(Blas {
            ctx: self,
            raw,
            stream_sets,
        })
    }

    /// This worker's cuBLAS handle as cudarc's [`CudaBlas`], set to the stream this node
    /// enqueues on ([`GpuCtx::stream`]) with the worker's workspace for it: cudarc's typed
    /// GEMMs (`Gemm` for `f16`, `bf16`, `f32`, `f64`, strided-batched too, and `Gemv`) on
    /// [`DeviceBuffer`](crate::DeviceBuffer)s or `CudaSlice`s run in the node's order, and under
    /// a replay capture are captured ([`GpuCtx::blas`] says how). Hold it only for the calls:
    /// while held, a node nested on this worker (run while this body waits on a subgraph) gets
    /// an error from `cublas()`.
    pub fn cublas(&self) -> GpuResult<CublasRef<'a>> {
        Ok(CublasRef {
            h: self.blas_handle()?,
        })
    }

    /// The worker's cuBLAS handle, created at its first use and set to this node's stream.
    fn blas_handle(&self) -> GpuResult<RefMut<'a, BlasHandle>> {
        let what = || self.what();
        let libs = &self.b.libs;
        // A capture's workspace: allocated (hoisted) before the handle is borrowed.
        let capture_ws = match self.capture {
            Some(c) => {
                let ws = self.alloc::<u8>(BLAS_WORKSPACE_BYTES)?;
                let p = ws.device_ptr();
                c.keep(ws);
                Some(p)
            }
            None => None,
        };
        let held = || {
            GpuError::new(
                GpuErrorKind::InvalidArgument,
                format!("{}: this worker's cuBLAS handle is held by a node this one is nested in (drop the CublasRef before waiting on a subgraph)", what()),
            )
        };
        if libs.blas.try_borrow().map_err(|_| held())?.is_none() {
            // cublasCreate makes calls a capture refuses: under one, outside it (relaxed mode).
            let relaxed = self.capture.map(|c| c.relax(self)).transpose()?;
            let made = libs.ensure_blas(self.stream(), &what);
            if let (Some(c), Some(mode)) = (self.capture, relaxed) {
                c.unrelax(self, mode, false)?;
            }
            made?;
        }
        let mut h = libs.blas.try_borrow_mut().map_err(|_| held())?;
        let hb = h.as_mut().expect("created above");
        if capture_ws.is_some() || hb.stream != Some(self.stream) {
            let ws = match capture_ws {
                Some(p) => p,
                None => libs.blas_workspace(self.b.ctx, self.stream, &what)?,
            };
            // SAFETY: `set_stream` is unsafe because work on two streams may race on memory:
            // this handle's work goes where the node's own work goes, ordered by its edges.
            unsafe { hb.blas.set_stream(self.stream().clone()) }
                .map_err(|e| status_error("cublasSetStream", format!("{:?}", e.0), &what()))?;
            // SAFETY: a live handle of this worker; the workspace is this worker's for this
            // stream (or this capture's), so it is only used in that stream's order. (Setting
            // the stream resets the workspace to the library's default: set it after.)
            unsafe {
                blas_check(
                    "cublasSetWorkspace",
                    cb::cublasSetWorkspace_v2(hb.raw(), ws as *mut _, BLAS_WORKSPACE_BYTES),
                    &what,
                )?;
            }
            hb.stream = capture_ws.is_none().then_some(self.stream);
            hb.stream_sets += 1;
        }
        Ok(RefMut::map(h, |h| h.as_mut().expect("created above")))
    }

    /// This worker's cuSOLVER (dense) handle, set to the stream this node enqueues on.
    pub fn solver(&self) -> GpuResult<Solver<'_, 'a, 'n>> {
        if let Some(c) = self.capture {
            return Err(c.refuse(self, "cuSOLVER under a replay capture is not supported (its workspace is grown stream-ordered; not examined)"));
        }
        let what = || self.what();
        let (raw, stream_sets) = self.b.libs.solver_on(self.stream(), &what)?;
        Ok(Solver {
            ctx: self,
            raw,
            stream_sets,
        })
    }

    /// The state of type `T` this worker made at start
    /// ([`GpuPoolBuilder::worker_state`](crate::GpuPoolBuilder::worker_state)).
    pub fn state<T: 'static>(&self) -> GpuResult<&T> {
        self.b.states.get::<T>().ok_or_else(|| {
            GpuError::new(
                GpuErrorKind::InvalidArgument,
                format!(
                    "{}: no worker state of type {} (register it with GpuPoolBuilder::worker_state)",
                    self.what(),
                    std::any::type_name::<T>()
                ),
            )
        })
    }

    /// The raw `CUstream` this node enqueues on (to compare, or to hand to another library).
    pub fn raw_stream(&self) -> u64 {
        self.stream.raw_ptr() as u64
    }
}

/// The node's worker's cuBLAS handle, set to the node's stream. Matrices are column-major and
/// given by device address (see [`DeviceBuffer::device_ptr`](crate::DeviceBuffer::device_ptr))
/// and leading dimension, in elements.
pub struct Blas<'c, 'a, 'n> {
    ctx: &'c GpuCtx<'a, 'n>,
    raw: cb::cublasHandle_t,
    stream_sets: u64,
}

impl fmt::Debug for Blas<'_, '_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Blas")
            .field("node", &self.ctx.node_name())
            .field("handle", &self.raw)
            .finish()
    }
}

macro_rules! dims {
    ($what:expr; $($v:ident),*) => { $( let $v = dim($v, stringify!($v), $what)?; )* };
}

/// The node's worker's cuBLAS handle as cudarc's [`CudaBlas`], set to the node's stream
/// ([`GpuCtx::cublas`]). Dereferences to the `CudaBlas`.
pub struct CublasRef<'a> {
    h: RefMut<'a, BlasHandle>,
}

impl std::ops::Deref for CublasRef<'_> {
    type Target = CudaBlas;

    fn deref(&self) -> &CudaBlas {
        &self.h.blas
    }
}

impl fmt::Debug for CublasRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CublasRef")
            .field("handle", &self.h.raw())
            .field("stream_sets", &self.h.stream_sets)
            .finish()
    }
}

impl Blas<'_, '_, '_> {
    /// The raw `cublasHandle_t`, for calls this type does not wrap. Use it only inside this
    /// node's body: it belongs to the worker and is set to this node's stream.
    pub fn raw(&self) -> *mut std::ffi::c_void {
        self.raw as *mut std::ffi::c_void
    }

    /// How many times this worker has set its cuBLAS handle's stream so far (once per change
    /// of stream between consecutive uses).
    pub fn stream_sets(&self) -> u64 {
        self.stream_sets
    }

    /// The stream the handle is set to, as the library reports it (`cublasGetStream`).
    pub fn current_stream(&self) -> GpuResult<u64> {
        let mut s: cb::cudaStream_t = std::ptr::null_mut();
        // SAFETY: a live handle; writes one stream handle.
        let st = unsafe { cb::cublasGetStream_v2(self.raw, &mut s) };
        blas_check("cublasGetStream", st, &|| self.ctx.what())?;
        Ok(s as u64)
    }

    /// `C = alpha op(A) op(B) + beta C` (`m`×`n`, inner dimension `k`).
    ///
    /// # Safety
    /// `a`, `b`, `c` must be addresses on this node's device of matrices of the given shapes
    /// and leading dimensions, alive until the node's GPU work has finished.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn dgemm(
        &self,
        ta: Trans,
        tb: Trans,
        m: usize,
        n: usize,
        k: usize,
        alpha: f64,
        a: u64,
        lda: usize,
        b: u64,
        ldb: usize,
        beta: f64,
        c: u64,
        ldc: usize,
    ) -> GpuResult<()> {
        let what = || self.ctx.what();
        dims!(&what; m, n, k, lda, ldb, ldc);
        // SAFETY: the caller's contract; scalars are read from the host before return.
        let s = unsafe {
            cb::cublasDgemm_v2(
                self.raw,
                ta.blas(),
                tb.blas(),
                m,
                n,
                k,
                &alpha,
                a as *const f64,
                lda,
                b as *const f64,
                ldb,
                &beta,
                c as *mut f64,
                ldc,
            )
        };
        blas_check("cublasDgemm", s, &what)
    }

    /// Solves `op(A) X = alpha B` (`side` left) or `X op(A) = alpha B` (right) for triangular
    /// `A`; `X` overwrites `B` (`m`×`n`).
    ///
    /// # Safety
    /// As [`dgemm`](Self::dgemm).
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn dtrsm(
        &self,
        side: Side,
        uplo: Uplo,
        trans: Trans,
        diag: Diag,
        m: usize,
        n: usize,
        alpha: f64,
        a: u64,
        lda: usize,
        b: u64,
        ldb: usize,
    ) -> GpuResult<()> {
        let what = || self.ctx.what();
        dims!(&what; m, n, lda, ldb);
        // SAFETY: the caller's contract.
        let s = unsafe {
            cb::cublasDtrsm_v2(
                self.raw,
                side.blas(),
                uplo.blas(),
                trans.blas(),
                diag.blas(),
                m,
                n,
                &alpha,
                a as *const f64,
                lda,
                b as *mut f64,
                ldb,
            )
        };
        blas_check("cublasDtrsm", s, &what)
    }

    /// `C = alpha op(A) op(A)^T + beta C` on the `uplo` triangle of `n`×`n` `C` (`op(A)` is
    /// `n`×`k`).
    ///
    /// # Safety
    /// As [`dgemm`](Self::dgemm).
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn dsyrk(
        &self,
        uplo: Uplo,
        trans: Trans,
        n: usize,
        k: usize,
        alpha: f64,
        a: u64,
        lda: usize,
        beta: f64,
        c: u64,
        ldc: usize,
    ) -> GpuResult<()> {
        let what = || self.ctx.what();
        dims!(&what; n, k, lda, ldc);
        // SAFETY: the caller's contract.
        let s = unsafe {
            cb::cublasDsyrk_v2(
                self.raw,
                uplo.blas(),
                trans.blas(),
                n,
                k,
                &alpha,
                a as *const f64,
                lda,
                &beta,
                c as *mut f64,
                ldc,
            )
        };
        blas_check("cublasDsyrk", s, &what)
    }

    /// `C = alpha op(A) B` (left) or `alpha B op(A)` (right), `A` triangular (only its `uplo`
    /// triangle is read), `B` and `C` `m`×`n`.
    ///
    /// # Safety
    /// As [`dgemm`](Self::dgemm).
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn dtrmm(
        &self,
        side: Side,
        uplo: Uplo,
        trans: Trans,
        diag: Diag,
        m: usize,
        n: usize,
        alpha: f64,
        a: u64,
        lda: usize,
        b: u64,
        ldb: usize,
        c: u64,
        ldc: usize,
    ) -> GpuResult<()> {
        let what = || self.ctx.what();
        dims!(&what; m, n, lda, ldb, ldc);
        // SAFETY: the caller's contract.
        let s = unsafe {
            cb::cublasDtrmm_v2(
                self.raw,
                side.blas(),
                uplo.blas(),
                trans.blas(),
                diag.blas(),
                m,
                n,
                &alpha,
                a as *const f64,
                lda,
                b as *const f64,
                ldb,
                c as *mut f64,
                ldc,
            )
        };
        blas_check("cublasDtrmm", s, &what)
    }

    /// `y = x` for `n` elements with strides `incx`, `incy`.
    ///
    /// # Safety
    /// As [`dgemm`](Self::dgemm), for vectors.
    pub unsafe fn dcopy(
        &self,
        n: usize,
        x: u64,
        incx: usize,
        y: u64,
        incy: usize,
    ) -> GpuResult<()> {
        let what = || self.ctx.what();
        dims!(&what; n, incx, incy);
        // SAFETY: the caller's contract.
        let s =
            unsafe { cb::cublasDcopy_v2(self.raw, n, x as *const f64, incx, y as *mut f64, incy) };
        blas_check("cublasDcopy", s, &what)
    }

    /// The Euclidean norm of `n` elements of `x` (stride `incx`). Returns the value, so it
    /// waits on this worker until the node's work so far on the stream is done.
    ///
    /// # Safety
    /// As [`dcopy`](Self::dcopy).
    pub unsafe fn dnrm2(&self, n: usize, x: u64, incx: usize) -> GpuResult<f64> {
        let what = || self.ctx.what();
        dims!(&what; n, incx);
        let mut r = 0.0f64;
        // SAFETY: the caller's contract; host pointer mode (the default): the result is
        // written to `r` before the call returns.
        let s = unsafe { cb::cublasDnrm2_v2(self.raw, n, x as *const f64, incx, &mut r) };
        blas_check("cublasDnrm2", s, &what)?;
        Ok(r)
    }

    /// The dot product of `n` elements of `x` and `y`. Waits like [`dnrm2`](Self::dnrm2).
    ///
    /// # Safety
    /// As [`dcopy`](Self::dcopy).
    pub unsafe fn ddot(
        &self,
        n: usize,
        x: u64,
        incx: usize,
        y: u64,
        incy: usize,
    ) -> GpuResult<f64> {
        let what = || self.ctx.what();
        dims!(&what; n, incx, incy);
        let mut r = 0.0f64;
        // SAFETY: as for dnrm2.
        let s = unsafe {
            cb::cublasDdot_v2(
                self.raw,
                n,
                x as *const f64,
                incx,
                y as *const f64,
                incy,
                &mut r,
            )
        };
        blas_check("cublasDdot", s, &what)?;
        Ok(r)
    }
}

/// The node's worker's cuSOLVER (dense) handle, set to the node's stream.
pub struct Solver<'c, 'a, 'n> {
    ctx: &'c GpuCtx<'a, 'n>,
    raw: cs::cusolverDnHandle_t,
    stream_sets: u64,
}

impl fmt::Debug for Solver<'_, '_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Solver")
            .field("node", &self.ctx.node_name())
            .field("handle", &self.raw)
            .finish()
    }
}

impl Solver<'_, '_, '_> {
    /// The raw `cusolverDnHandle_t` (use it only inside this node's body).
    pub fn raw(&self) -> *mut std::ffi::c_void {
        self.raw as *mut std::ffi::c_void
    }

    /// How many times this worker has set its cuSOLVER handle's stream so far.
    pub fn stream_sets(&self) -> u64 {
        self.stream_sets
    }

    /// The stream the handle is set to, as the library reports it.
    pub fn current_stream(&self) -> GpuResult<u64> {
        let mut s: cs::cudaStream_t = std::ptr::null_mut();
        // SAFETY: a live handle; writes one stream handle.
        let st = unsafe { cs::cusolverDnGetStream(self.raw, &mut s) };
        solver_check("cusolverDnGetStream", st, &|| self.ctx.what())?;
        Ok(s as u64)
    }

    /// Enqueues the Cholesky factorization of the `n`×`n` matrix at `a` (its `uplo` triangle
    /// is overwritten by the factor), with this worker's workspace for the stream. The
    /// library's `info` goes to the `i32` at device address `info`, without a host wait: 0 on
    /// success, `k > 0` when the leading minor of order `k` is not positive definite (see
    /// [`potrf_info_error`]); read it after the node's work (for example in a later node).
    ///
    /// # Safety
    /// `a` must address an `n`×`n` matrix of leading dimension `lda`, and `info` one `i32`, on
    /// this node's device, alive until the node's GPU work has finished.
    pub unsafe fn dpotrf(
        &self,
        uplo: Uplo,
        n: usize,
        a: u64,
        lda: usize,
        info: u64,
    ) -> GpuResult<()> {
        let what = || self.ctx.what();
        dims!(&what; n, lda);
        let mut lwork: c_int = 0;
        // SAFETY: the caller's contract; the query writes one int and reads no matrix data.
        let s = unsafe {
            cs::cusolverDnDpotrf_bufferSize(
                self.raw,
                uplo.solver(),
                n,
                a as *mut f64,
                lda,
                &mut lwork,
            )
        };
        solver_check("cusolverDnDpotrf_bufferSize", s, &what)?;
        let lwork = lwork.max(1);
        let bytes = lwork as usize * std::mem::size_of::<f64>();
        let ws = self
            .ctx
            .b
            .libs
            .solver_workspace(self.ctx.b.ctx, self.ctx.stream, bytes, &what)?;
        // SAFETY: the caller's contract; the workspace holds `lwork` doubles and is used only
        // in this stream's order.
        let s = unsafe {
            cs::cusolverDnDpotrf(
                self.raw,
                uplo.solver(),
                n,
                a as *mut f64,
                lda,
                ws as *mut f64,
                lwork,
                info as *mut c_int,
            )
        };
        solver_check("cusolverDnDpotrf", s, &what)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn potrf_info_error_says_which_minor() {
        let e = potrf_info_error("potrf(3)", 17);
        assert_eq!(e.kind(), GpuErrorKind::Library);
        assert_eq!(
            e.message(),
            "node 'potrf(3)': cusolverDnDpotrf: info = 17: the leading minor of order 17 is not positive definite"
        );
        assert!(potrf_info_error("p", -4).message().contains("parameter 4"));
    }
}
