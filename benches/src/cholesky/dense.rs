//! The f64 BLAS and LAPACK calls of the tiled Cholesky and of its checks, on the handles a node
//! is lent (cudarc's `CudaBlas` and `DnHandle`, through [`GpuCtx::cublas`] and
//! [`GpuCtx::solver`], set to the node's stream) and on typed views of device memory: a
//! [`Mat`] or [`Vector`] is a shape inside a `CudaSlice<f64>`, checked against the slice when
//! made, and a call checks its operands' shapes against each other. cudarc's safe layer has
//! `Gemm` (used where the output is the node's own: the residual); for the rest (TRSM, SYRK,
//! TRMM, COPY, NRM2, DOT, a GEMM into a tile of the shared matrix, POTRF) the calls are
//! cuBLAS's and cuSOLVER's own (`cudarc::cublas::result` / `sys`, `cudarc::cusolver::sys`)
//! over the views' pointers.
//!
//! The routines are `unsafe`: a view is shared (the factorization's nodes all hold the one
//! matrix), so a routine writing through one must not race another node's work on the same
//! elements (the graph's edges order every two operations on one tile), and the memory must
//! live until the node's GPU work has finished (the graph's closures keep it).

use std::ffi::c_int;

use boundpool_gpu::cudarc::cublas::{result as cbr, sys as cb, Gemm, GemmConfig};
use boundpool_gpu::cudarc::cusolver::sys as cs;
use boundpool_gpu::cudarc::driver::{
    CudaSlice, CudaStream, CudaView, DevicePtr, DevicePtrMut, SyncOnDrop,
};
use boundpool_gpu::{CublasRef, DeviceBuffer, GpuCtx, GpuErrorKind};

use super::error::CholeskyError;

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

    /// The shape of `op(A)` for `A` of `rows` × `cols`.
    fn apply(self, rows: usize, cols: usize) -> (usize, usize) {
        match self {
            Trans::No => (rows, cols),
            Trans::T => (cols, rows),
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

/// The error for a non-zero `info` of `potrf` on the tile or matrix node `node` factored:
/// `info > 0`: the leading minor of that order is not positive definite; `info < 0`: argument
/// `-info` was wrong.
pub fn potrf_info_error(node: &str, info: i32) -> CholeskyError {
    let why = if info > 0 {
        format!("the leading minor of order {info} is not positive definite")
    } else {
        format!("parameter {} had an illegal value", -info)
    };
    CholeskyError::new(
        GpuErrorKind::Library,
        format!("node '{node}': cusolverDnDpotrf: info = {info}: {why}"),
    )
}

/// A column-major `rows` × `cols` matrix of leading dimension `ld` inside a device slice, its
/// first element at `offset`: a tile of the factored matrix, or a whole matrix.
#[derive(Clone, Copy, Debug)]
pub struct Mat<'a> {
    data: &'a CudaSlice<f64>,
    offset: usize,
    rows: usize,
    cols: usize,
    ld: usize,
}

impl<'a> Mat<'a> {
    /// The matrix at `offset` of `data`; an error unless `ld >= rows` and its last element lies
    /// inside `data`.
    pub fn new(
        data: &'a CudaSlice<f64>,
        offset: usize,
        rows: usize,
        cols: usize,
        ld: usize,
    ) -> Result<Self, CholeskyError> {
        let end = match (rows, cols) {
            (0, _) | (_, 0) => Some(offset),
            _ => (cols - 1)
                .checked_mul(ld)
                .and_then(|x| x.checked_add(rows))
                .and_then(|x| x.checked_add(offset)),
        };
        match end {
            Some(end) if ld >= rows.max(1) && end <= data.len() => Ok(Self {
                data,
                offset,
                rows,
                cols,
                ld,
            }),
            _ => Err(CholeskyError::new(
                GpuErrorKind::InvalidArgument,
                format!(
                    "a {rows}x{cols} matrix of leading dimension {ld} at element {offset} does not fit a slice of {}",
                    data.len()
                ),
            )),
        }
    }

    /// The whole of `buf` as an `n` × `n` matrix.
    pub fn square(buf: &'a DeviceBuffer<f64>, n: usize) -> Result<Self, CholeskyError> {
        Self::new(buf.as_cuda_slice(), 0, n, n, n)
    }

    /// Its elements, from the first to the last, as a typed view.
    fn view(&self) -> CudaView<'a, f64> {
        let extent = match (self.rows, self.cols) {
            (0, _) | (_, 0) => 0,
            _ => (self.cols - 1) * self.ld + self.rows,
        };
        self.data.slice(self.offset..self.offset + extent)
    }

    /// The view's device pointer, for a call on `stream` (and what to drop after the call).
    fn ptr<'s>(&'s self, stream: &'s CudaStream) -> (u64, SyncOnDrop<'s>) {
        self.view().view_ptr(stream)
    }
}

/// `len` elements of a device slice, `inc` apart, the first at `offset`: a column, a row (`inc`
/// the leading dimension) or a diagonal (`inc` one more) of a matrix.
#[derive(Clone, Copy, Debug)]
pub struct Vector<'a> {
    data: &'a CudaSlice<f64>,
    offset: usize,
    len: usize,
    inc: usize,
}

impl<'a> Vector<'a> {
    /// The vector at `offset` of `data`; an error unless `inc > 0` and its last element lies
    /// inside `data`.
    pub fn new(
        data: &'a CudaSlice<f64>,
        offset: usize,
        len: usize,
        inc: usize,
    ) -> Result<Self, CholeskyError> {
        let end = match len {
            0 => Some(offset),
            _ => (len - 1)
                .checked_mul(inc)
                .and_then(|x| x.checked_add(offset + 1)),
        };
        match end {
            Some(end) if inc > 0 && end <= data.len() => Ok(Self {
                data,
                offset,
                len,
                inc,
            }),
            _ => Err(CholeskyError::new(
                GpuErrorKind::InvalidArgument,
                format!(
                    "{len} elements {inc} apart at element {offset} do not fit a slice of {}",
                    data.len()
                ),
            )),
        }
    }

    /// The whole of `buf`, element after element.
    pub fn all(buf: &'a DeviceBuffer<f64>) -> Self {
        let data = buf.as_cuda_slice();
        Self {
            data,
            offset: 0,
            len: data.len(),
            inc: 1,
        }
    }

    fn ptr<'s>(&'s self, stream: &'s CudaStream) -> (u64, SyncOnDrop<'s>) {
        let extent = match self.len {
            0 => 0,
            _ => (self.len - 1) * self.inc + 1,
        };
        let view: CudaView<'s, f64> = self.data.slice(self.offset..self.offset + extent);
        view.view_ptr(stream)
    }
}

/// What a node's library errors name: `node 'x' of graph 'g' on device d`.
fn what(ctx: &GpuCtx<'_, '_>) -> String {
    format!(
        "node '{}' of graph '{}' on device {}",
        ctx.node_name(),
        ctx.node().graph_name(),
        ctx.device().ordinal
    )
}

/// A library status other than success (`name`, its error `status`): an error naming the node,
/// the call and the status (kind `OutOfMemory` for an allocation failure, else `Library`), the
/// status as `source()`.
fn status_error(
    ctx: &GpuCtx<'_, '_>,
    call: &str,
    name: String,
    status: impl std::error::Error + Send + Sync + 'static,
) -> CholeskyError {
    let kind = if name.ends_with("ALLOC_FAILED") {
        GpuErrorKind::OutOfMemory
    } else {
        GpuErrorKind::Library
    };
    CholeskyError::new(kind, format!("{}: {call} returned {name}", what(ctx))).with_source(status)
}

/// The named values as the libraries' 32-bit ints, or an error naming the node and the first
/// that does not fit.
fn dims<const N: usize>(
    ctx: &GpuCtx<'_, '_>,
    vs: [(&str, usize); N],
) -> Result<[c_int; N], CholeskyError> {
    let mut out = [0; N];
    for (o, (name, v)) in out.iter_mut().zip(vs) {
        *o = c_int::try_from(v).map_err(|_| {
            CholeskyError::new(
                GpuErrorKind::InvalidArgument,
                format!(
                    "{}: {name} = {v} does not fit the library's 32-bit int",
                    what(ctx)
                ),
            )
        })?;
    }
    Ok(out)
}

/// The error for operands whose shapes do not fit the call.
fn shape_error(ctx: &GpuCtx<'_, '_>, call: &str, why: String) -> CholeskyError {
    CholeskyError::new(
        GpuErrorKind::InvalidArgument,
        format!("{}: {call}: {why}", what(ctx)),
    )
}

/// The cuBLAS f64 routines of the factorization and its checks, on the node's cuBLAS handle
/// (cudarc's `CudaBlas`, set to the node's stream). Hold it only for the calls (see
/// [`GpuCtx::cublas`]).
pub struct TileBlas<'c, 'a, 'n> {
    ctx: &'c GpuCtx<'a, 'n>,
    blas: CublasRef<'a>,
}

impl std::fmt::Debug for TileBlas<'_, '_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TileBlas")
            .field("node", &self.ctx.node_name())
            .field("blas", &self.blas)
            .finish()
    }
}

impl<'c, 'a, 'n> TileBlas<'c, 'a, 'n> {
    /// The node's cuBLAS handle.
    pub fn new(ctx: &'c GpuCtx<'a, 'n>) -> Result<Self, CholeskyError> {
        Ok(Self {
            ctx,
            blas: ctx.cublas()?,
        })
    }

    fn handle(&self) -> cb::cublasHandle_t {
        *self.blas.handle()
    }

    fn stream(&self) -> &'c CudaStream {
        self.ctx.stream()
    }

    fn check(&self, call: &str, r: Result<(), cbr::CublasError>) -> Result<(), CholeskyError> {
        r.map_err(|e| status_error(self.ctx, call, format!("{:?}", e.0), e))
    }

    /// `C = alpha op(A) op(B) + beta C` (`cublasDgemm`), `C` written through its view.
    ///
    /// # Safety
    /// No other work may read or write `c`'s elements, nor write `a`'s or `b`'s, until this
    /// call's work is done (the graph's edges order the nodes that do); the memory must live
    /// until the node's GPU work has finished.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn gemm(
        &self,
        ta: Trans,
        tb: Trans,
        alpha: f64,
        a: &Mat<'_>,
        b: &Mat<'_>,
        beta: f64,
        c: &Mat<'_>,
    ) -> Result<(), CholeskyError> {
        let (m, n) = (c.rows, c.cols);
        let (am, k) = ta.apply(a.rows, a.cols);
        if am != m || tb.apply(b.rows, b.cols) != (k, n) {
            return Err(shape_error(
                self.ctx,
                "cublasDgemm",
                format!(
                    "op(A) {am}x{k} and op(B) {:?} do not make C {m}x{n}",
                    tb.apply(b.rows, b.cols)
                ),
            ));
        }
        let [mi, ni, ki, lda, ldb, ldc] = dims(
            self.ctx,
            [
                ("m", m),
                ("n", n),
                ("k", k),
                ("lda", a.ld),
                ("ldb", b.ld),
                ("ldc", c.ld),
            ],
        )?;
        let s = self.stream();
        let ((pa, _ra), (pb, _rb), (pc, _rc)) = (a.ptr(s), b.ptr(s), c.ptr(s));
        // SAFETY: the three views hold the shapes checked above (their extents lie inside
        // their slices); `c`'s exclusivity and the memory's life are the caller's contract;
        // the scalars are read from the host before the call returns.
        let r = unsafe {
            cbr::dgemm(
                self.handle(),
                ta.blas(),
                tb.blas(),
                mi,
                ni,
                ki,
                &alpha,
                pa as *const f64,
                lda,
                pb as *const f64,
                ldb,
                &beta,
                pc as *mut f64,
                ldc,
            )
        };
        self.check("cublasDgemm", r)
    }

    /// `C = alpha op(A) op(B) + beta C` through cudarc's `Gemm`, into a buffer of the node's
    /// own (`a`, `b`, `c` whole `m`×`k`, `k`×`n`, `m`×`n` matrices as `op` makes them; their
    /// lengths checked).
    ///
    /// # Safety
    /// The three buffers must be on the node's device, and no other work may write `a` or `b`
    /// until this call's work is done.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn gemm_into(
        &self,
        ta: Trans,
        tb: Trans,
        (m, n, k): (usize, usize, usize),
        alpha: f64,
        a: &DeviceBuffer<f64>,
        b: &DeviceBuffer<f64>,
        beta: f64,
        c: &mut DeviceBuffer<f64>,
    ) -> Result<(), CholeskyError> {
        let ctx = self.ctx;
        let (ar, _) = ta.apply(m, k);
        let (br, _) = tb.apply(k, n);
        if a.len() < m * k || b.len() < k * n || c.len() < m * n {
            return Err(shape_error(
                ctx,
                "cublasDgemm",
                format!(
                    "buffers of {}, {} and {} elements for {m}x{k} by {k}x{n}",
                    a.len(),
                    b.len(),
                    c.len()
                ),
            ));
        }
        let [mi, ni, ki, lda, ldb, ldc] = dims(
            ctx,
            [
                ("m", m),
                ("n", n),
                ("k", k),
                ("lda", ar),
                ("ldb", br),
                ("ldc", m),
            ],
        )?;
        let cfg = GemmConfig {
            transa: ta.blas(),
            transb: tb.blas(),
            m: mi,
            n: ni,
            k: ki,
            alpha,
            lda,
            ldb,
            beta,
            ldc,
        };
        // SAFETY: each buffer holds its matrix (checked above) at the leading dimension given;
        // `c` is borrowed mutably, so nothing else in this process writes it meanwhile; a
        // dropped buffer is freed after the device's work enqueued before (the release
        // queue); the device and `a`'s and `b`'s writers are the caller's contract.
        let r = unsafe { self.blas.gemm(cfg, a.as_cuda_slice(), b.as_cuda_slice(), c) };
        self.check("cublasDgemm", r)
    }

    /// Solves `op(A) X = alpha B` (`side` left) or `X op(A) = alpha B` (right) for triangular
    /// `A` (`cublasDtrsm`); `X` overwrites `B`.
    ///
    /// # Safety
    /// As [`gemm`](Self::gemm), `b` written.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn trsm(
        &self,
        side: Side,
        uplo: Uplo,
        trans: Trans,
        diag: Diag,
        alpha: f64,
        a: &Mat<'_>,
        b: &Mat<'_>,
    ) -> Result<(), CholeskyError> {
        let (m, n) = (b.rows, b.cols);
        let order = if side == Side::Left { m } else { n };
        if (a.rows, a.cols) != (order, order) {
            return Err(shape_error(
                self.ctx,
                "cublasDtrsm",
                format!("A {}x{} is not {order}x{order}", a.rows, a.cols),
            ));
        }
        let [mi, ni, lda, ldb] =
            dims(self.ctx, [("m", m), ("n", n), ("lda", a.ld), ("ldb", b.ld)])?;
        let s = self.stream();
        let ((pa, _ra), (pb, _rb)) = (a.ptr(s), b.ptr(s));
        // SAFETY: as in `gemm`.
        let st = unsafe {
            cb::cublasDtrsm_v2(
                self.handle(),
                side.blas(),
                uplo.blas(),
                trans.blas(),
                diag.blas(),
                mi,
                ni,
                &alpha,
                pa as *const f64,
                lda,
                pb as *mut f64,
                ldb,
            )
        };
        self.check("cublasDtrsm", st.result())
    }

    /// `C = alpha op(A) op(A)^T + beta C` on the `uplo` triangle of square `C`
    /// (`cublasDsyrk`).
    ///
    /// # Safety
    /// As [`gemm`](Self::gemm).
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn syrk(
        &self,
        uplo: Uplo,
        trans: Trans,
        alpha: f64,
        a: &Mat<'_>,
        beta: f64,
        c: &Mat<'_>,
    ) -> Result<(), CholeskyError> {
        let n = c.rows;
        let (an, k) = trans.apply(a.rows, a.cols);
        if c.cols != n || an != n {
            return Err(shape_error(
                self.ctx,
                "cublasDsyrk",
                format!("op(A) {an}x{k} does not make C {}x{}", c.rows, c.cols),
            ));
        }
        let [ni, ki, lda, ldc] =
            dims(self.ctx, [("n", n), ("k", k), ("lda", a.ld), ("ldc", c.ld)])?;
        let s = self.stream();
        let ((pa, _ra), (pc, _rc)) = (a.ptr(s), c.ptr(s));
        // SAFETY: as in `gemm`.
        let st = unsafe {
            cb::cublasDsyrk_v2(
                self.handle(),
                uplo.blas(),
                trans.blas(),
                ni,
                ki,
                &alpha,
                pa as *const f64,
                lda,
                &beta,
                pc as *mut f64,
                ldc,
            )
        };
        self.check("cublasDsyrk", st.result())
    }

    /// `C = alpha op(A) B` (left) or `alpha B op(A)` (right), `A` triangular (only its `uplo`
    /// triangle is read), `B` and `C` of one shape (`cublasDtrmm`; `C` may be `B`).
    ///
    /// # Safety
    /// As [`gemm`](Self::gemm).
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn trmm(
        &self,
        side: Side,
        uplo: Uplo,
        trans: Trans,
        diag: Diag,
        alpha: f64,
        a: &Mat<'_>,
        b: &Mat<'_>,
        c: &Mat<'_>,
    ) -> Result<(), CholeskyError> {
        let (m, n) = (c.rows, c.cols);
        let order = if side == Side::Left { m } else { n };
        if (a.rows, a.cols) != (order, order) || (b.rows, b.cols) != (m, n) {
            return Err(shape_error(
                self.ctx,
                "cublasDtrmm",
                format!(
                    "A {}x{} and B {}x{} do not make C {m}x{n}",
                    a.rows, a.cols, b.rows, b.cols
                ),
            ));
        }
        let [mi, ni, lda, ldb, ldc] = dims(
            self.ctx,
            [
                ("m", m),
                ("n", n),
                ("lda", a.ld),
                ("ldb", b.ld),
                ("ldc", c.ld),
            ],
        )?;
        let s = self.stream();
        let ((pa, _ra), (pb, _rb), (pc, _rc)) = (a.ptr(s), b.ptr(s), c.ptr(s));
        // SAFETY: as in `gemm`.
        let st = unsafe {
            cb::cublasDtrmm_v2(
                self.handle(),
                side.blas(),
                uplo.blas(),
                trans.blas(),
                diag.blas(),
                mi,
                ni,
                &alpha,
                pa as *const f64,
                lda,
                pb as *const f64,
                ldb,
                pc as *mut f64,
                ldc,
            )
        };
        self.check("cublasDtrmm", st.result())
    }

    /// `y = x` (`cublasDcopy`; the two of one length).
    ///
    /// # Safety
    /// As [`gemm`](Self::gemm), `y` written.
    pub unsafe fn copy(&self, x: &Vector<'_>, y: &Vector<'_>) -> Result<(), CholeskyError> {
        if x.len != y.len {
            return Err(shape_error(
                self.ctx,
                "cublasDcopy",
                format!("x has {} elements, y {}", x.len, y.len),
            ));
        }
        let [n, incx, incy] = dims(self.ctx, [("n", x.len), ("incx", x.inc), ("incy", y.inc)])?;
        let s = self.stream();
        let ((px, _rx), (py, _ry)) = (x.ptr(s), y.ptr(s));
        // SAFETY: as in `gemm`.
        let st = unsafe {
            cb::cublasDcopy_v2(
                self.handle(),
                n,
                px as *const f64,
                incx,
                py as *mut f64,
                incy,
            )
        };
        self.check("cublasDcopy", st.result())
    }

    /// The Euclidean norm of `x` (`cublasDnrm2`). Returns the value, so it waits on this worker
    /// until the node's work so far on the stream is done.
    ///
    /// # Safety
    /// No other work may write `x` until the call returns; its memory must live as long.
    pub unsafe fn nrm2(&self, x: &Vector<'_>) -> Result<f64, CholeskyError> {
        let [n, incx] = dims(self.ctx, [("n", x.len), ("incx", x.inc)])?;
        let (px, _rx) = x.ptr(self.stream());
        let mut r = 0.0f64;
        // SAFETY: the view holds `n` elements `incx` apart; host pointer mode (the default):
        // the result is written to `r` before the call returns.
        let st = unsafe { cb::cublasDnrm2_v2(self.handle(), n, px as *const f64, incx, &mut r) };
        self.check("cublasDnrm2", st.result())?;
        Ok(r)
    }

    /// The dot product of `x` and `y` (`cublasDdot`; the two of one length). Waits like
    /// [`nrm2`](Self::nrm2).
    ///
    /// # Safety
    /// As [`nrm2`](Self::nrm2), for both.
    pub unsafe fn dot(&self, x: &Vector<'_>, y: &Vector<'_>) -> Result<f64, CholeskyError> {
        if x.len != y.len {
            return Err(shape_error(
                self.ctx,
                "cublasDdot",
                format!("x has {} elements, y {}", x.len, y.len),
            ));
        }
        let [n, incx, incy] = dims(self.ctx, [("n", x.len), ("incx", x.inc), ("incy", y.inc)])?;
        let s = self.stream();
        let ((px, _rx), (py, _ry)) = (x.ptr(s), y.ptr(s));
        let mut r = 0.0f64;
        // SAFETY: as in `nrm2`.
        let st = unsafe {
            cb::cublasDdot_v2(
                self.handle(),
                n,
                px as *const f64,
                incx,
                py as *const f64,
                incy,
                &mut r,
            )
        };
        self.check("cublasDdot", st.result())?;
        Ok(r)
    }
}

/// Enqueues the Cholesky factorization of the square matrix `a` on the node's cuSOLVER handle
/// (`cusolverDnDpotrf`; its `uplo` triangle is overwritten by the factor), with the worker's
/// workspace for the stream. The library's `info` goes to `info` (one `i32`), without a host
/// wait: 0 on success, `k > 0` when the leading minor of order `k` is not positive definite
/// (see [`potrf_info_error`]); read it after the node's work (for example in a later node).
///
/// # Safety
/// No other work may read or write `a`'s elements or `info` until this call's work is done;
/// their memory must live until the node's GPU work has finished.
pub unsafe fn potrf(
    ctx: &GpuCtx<'_, '_>,
    uplo: Uplo,
    a: &Mat<'_>,
    info: &CudaView<'_, i32>,
) -> Result<(), CholeskyError> {
    if a.rows != a.cols || info.len() != 1 {
        return Err(shape_error(
            ctx,
            "cusolverDnDpotrf",
            format!(
                "A {}x{} is not square, or info has {} elements, not 1",
                a.rows,
                a.cols,
                info.len()
            ),
        ));
    }
    let [n, lda] = dims(ctx, [("n", a.rows), ("lda", a.ld)])?;
    let mut solver = ctx.solver()?;
    let s = ctx.stream();
    let (pa, _ra) = a.ptr(s);
    let handle = solver.cu();
    let mut lwork: c_int = 0;
    // SAFETY: a live handle; the query writes one int and reads no matrix data.
    let st = unsafe {
        cs::cusolverDnDpotrf_bufferSize(handle, uplo.solver(), n, pa as *mut f64, lda, &mut lwork)
    };
    st.result()
        .map_err(|e| status_error(ctx, "cusolverDnDpotrf_bufferSize", format!("{:?}", e.0), e))?;
    let lwork = lwork.max(1);
    let ws = solver.workspace(lwork as usize * std::mem::size_of::<f64>())?;
    let (pw, _rw) = ws.device_ptr_mut(s);
    let (pi, _ri) = info.device_ptr(s);
    // SAFETY: `a` is the square matrix checked above, `info` one i32; the workspace holds
    // `lwork` doubles and is used only in this stream's order; the rest is the caller's
    // contract.
    let st = unsafe {
        cs::cusolverDnDpotrf(
            handle,
            uplo.solver(),
            n,
            pa as *mut f64,
            lda,
            pw as *mut f64,
            lwork,
            pi as *mut c_int,
        )
    };
    st.result()
        .map_err(|e| status_error(ctx, "cusolverDnDpotrf", format!("{:?}", e.0), e))
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
