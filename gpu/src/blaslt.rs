//! cuBLASLt as node bodies see it: [`GpuCtx::cublaslt`] gives a node its worker's cuBLASLt
//! handle (`libs.rs`) with a workspace for the stream the node enqueues on, and
//! [`CublasLt::matmul`] runs cudarc's `Matmul::matmul` on it, on the node's stream: eagerly
//! with the worker's workspace for that stream, under a replay capture with a workspace of the
//! call's own, allocated outside the graph and kept with it.
//!
//! cudarc's `CudaBlasLT` is not used: it fixes its stream when made and allocates its
//! workspace then, as a `CudaSlice` this crate can neither free through its release queue nor
//! hoist out of a capture. The matmul is rebuilt here on cudarc's `cublaslt::result` calls,
//! each descriptor held by a guard that destroys it, so that nothing leaks on an error.

use std::ffi::{c_int, c_void};
use std::fmt;
use std::mem;

use cudarc::cublaslt::result::{self as lt, CublasError as LtError};
use cudarc::cublaslt::sys;
use cudarc::cublaslt::{Activation, MatmulConfig};
use cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT;
use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{DevicePtr, DevicePtrMut, DeviceSlice};

use crate::error::{GpuError, GpuErrorKind, GpuResult};
use crate::libs::{lt_check, LT_WORKSPACE_BYTES};
use crate::lt_algos::LtProblem;
use crate::node::GpuCtx;

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::f16 {}
    impl Sealed for half::bf16 {}
}

/// An element type [`CublasLt::matmul`] takes: `f32`, [`half::f16`], [`half::bf16`] (sealed).
/// All three compute in `CUBLAS_COMPUTE_32F` with an `f32` scale type (`alpha`, `beta`): `f32`
/// is IEEE single precision, as `cublasSgemm` and PyTorch's default (cudarc's `CudaBlasLT`
/// computes `f32` in TF32, a tenth of the precision; a user who wants that has cudarc's).
pub trait LtElement: sealed::Sealed + Copy + 'static {
    /// The CUDA data type of the matrices.
    #[doc(hidden)]
    const DATA_TYPE: sys::cudaDataType;
    /// The compute type.
    #[doc(hidden)]
    const COMPUTE_TYPE: sys::cublasComputeType_t;
}

impl LtElement for f32 {
    const DATA_TYPE: sys::cudaDataType = sys::cudaDataType_t::CUDA_R_32F;
    const COMPUTE_TYPE: sys::cublasComputeType_t = sys::cublasComputeType_t::CUBLAS_COMPUTE_32F;
}

impl LtElement for half::f16 {
    const DATA_TYPE: sys::cudaDataType = sys::cudaDataType_t::CUDA_R_16F;
    const COMPUTE_TYPE: sys::cublasComputeType_t = sys::cublasComputeType_t::CUBLAS_COMPUTE_32F;
}

impl LtElement for half::bf16 {
    const DATA_TYPE: sys::cudaDataType = sys::cudaDataType_t::CUDA_R_16BF;
    const COMPUTE_TYPE: sys::cublasComputeType_t = sys::cublasComputeType_t::CUBLAS_COMPUTE_32F;
}

// ----------------------------------------------------------------------------------------------
// What nodes see.

impl<'a, 'n> GpuCtx<'a, 'n> {
    /// This worker's cuBLASLt handle, with a workspace for the stream this node enqueues on
    /// ([`GpuCtx::stream`]): [`CublasLt::matmul`] runs cudarc's `Matmul::matmul` (f32, f16,
    /// bf16; bias and ReLU / GELU epilogues; strided batches) in the node's order. The handle
    /// is made on the worker at its first use (a missing libcublasLt is an error naming the
    /// node) and destroyed when the worker stops.
    ///
    /// Eagerly the workspace is the worker's for the node's stream ([`LT_WORKSPACE_BYTES`],
    /// made at the stream's first use); under a replay capture the matmuls are captured, with
    /// a workspace of this call's own, allocated outside the graph and kept as long as the
    /// replay (captured branches may run concurrently: they must not share one). Under a
    /// capture, call it once per node, not per matmul.
    pub fn cublaslt(&self) -> GpuResult<CublasLt<'_>> {
        let what = || self.what();
        let libs = &self.b.libs;
        let held = || {
            GpuError::new(
                GpuErrorKind::InvalidArgument,
                format!(
                    "{}: this worker's cuBLASLt handle is in use by a node this one is nested in",
                    what()
                ),
            )
        };
        if !libs.has_lt(&held)? {
            // cublasLtCreate may make calls a capture refuses: under one, outside it (relaxed).
            let relaxed = self.capture.map(|c| c.relax(self)).transpose()?;
            let made = libs.ensure_lt(&what, &held);
            if let (Some(c), Some(mode)) = (self.capture, relaxed) {
                c.unrelax(self, mode, false)?;
            }
            made?;
        }
        let handle = libs.lt_raw(&held)?.expect("created above");
        let workspace = match self.capture {
            Some(c) => {
                let ws = self.alloc::<u8>(LT_WORKSPACE_BYTES)?;
                let p = ws.device_ptr();
                c.keep(ws);
                p
            }
            None => libs.lt_workspace(self.b.ctx, self.stream, &what)?,
        };
        Ok(CublasLt {
            ctx: self,
            handle,
            workspace,
        })
    }
}

/// The node's worker's cuBLASLt handle with a workspace for the node's stream
/// ([`GpuCtx::cublaslt`]). Use it only inside this node's body.
pub struct CublasLt<'c> {
    ctx: &'c GpuCtx<'c, 'c>,
    handle: sys::cublasLtHandle_t,
    /// [`LT_WORKSPACE_BYTES`] at this device address, used only in the node's stream's order.
    workspace: u64,
}

impl fmt::Debug for CublasLt<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CublasLt")
            .field("node", &self.ctx.node_name())
            .field("handle", &self.handle)
            .field("workspace", &format_args!("{:#x}", self.workspace))
            .finish()
    }
}

/// A matrix layout descriptor, destroyed when dropped.
struct Layout(sys::cublasLtMatrixLayout_t);

impl Layout {
    fn new(ty: sys::cudaDataType, rows: u64, cols: u64, ld: i64, what: &Wt) -> GpuResult<Self> {
        let raw = lt_check(
            "cublasLtMatrixLayoutCreate",
            lt::create_matrix_layout(ty, rows, cols, ld),
            what,
        )?;
        Ok(Self(raw))
    }

    /// Sets the batch count and stride (both or neither, as cudarc does).
    fn batch(&self, count: Option<c_int>, stride: Option<i64>, what: &Wt) -> GpuResult<()> {
        let (Some(count), Some(stride)) = (count, stride) else {
            return Ok(());
        };
        use sys::cublasLtMatrixLayoutAttribute_t as A;
        for (attr, v, size) in [
            (
                A::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                &count as *const c_int as *const c_void,
                mem::size_of::<c_int>(),
            ),
            (
                A::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                &stride as *const i64 as *const c_void,
                mem::size_of::<i64>(),
            ),
        ] {
            // SAFETY: a live layout; each attribute gets a value of its type (int32 count,
            // int64 stride), read before the call returns.
            let r = unsafe { lt::set_matrix_layout_attribute(self.0, attr, v, size) };
            lt_check("cublasLtMatrixLayoutSetAttribute", r, what)?;
        }
        Ok(())
    }
}

impl Drop for Layout {
    fn drop(&mut self) {
        // SAFETY: made by `cublasLtMatrixLayoutCreate`, destroyed once, here. A host-only
        // call; its failure leaves nothing to undo.
        let _ = unsafe { lt::destroy_matrix_layout(self.0) };
    }
}

/// A matmul descriptor, destroyed when dropped.
struct Desc(sys::cublasLtMatmulDesc_t);

impl Desc {
    fn new(compute: sys::cublasComputeType_t, what: &Wt) -> GpuResult<Self> {
        let raw = lt_check(
            "cublasLtMatmulDescCreate",
            lt::create_matmul_desc(compute, sys::cudaDataType_t::CUDA_R_32F),
            what,
        )?;
        Ok(Self(raw))
    }

    /// Sets `attr` to `v`.
    ///
    /// # Safety
    /// `V` must be the attribute's type as cuBLASLt documents it.
    unsafe fn set<V>(
        &self,
        attr: sys::cublasLtMatmulDescAttributes_t,
        v: &V,
        what: &Wt,
    ) -> GpuResult<()> {
        // SAFETY: a live descriptor; `v` is a value of the attribute's type (the caller's
        // contract), read before the call returns.
        let r = unsafe {
            lt::set_matmul_desc_attribute(
                self.0,
                attr,
                v as *const V as *const c_void,
                mem::size_of::<V>(),
            )
        };
        lt_check("cublasLtMatmulDescSetAttribute", r, what)
    }
}

impl Drop for Desc {
    fn drop(&mut self) {
        // SAFETY: made by `cublasLtMatmulDescCreate`, destroyed once, here.
        let _ = unsafe { lt::destroy_matmul_desc(self.0) };
    }
}

/// A heuristic preference descriptor, destroyed when dropped.
struct Pref(sys::cublasLtMatmulPreference_t);

impl Drop for Pref {
    fn drop(&mut self) {
        // SAFETY: made by `cublasLtMatmulPreferenceCreate`, destroyed once, here.
        let _ = unsafe { lt::destroy_matmul_pref(self.0) };
    }
}

type Wt<'w> = dyn Fn() -> String + 'w;

/// The epilogue cudarc picks for a bias and an activation.
fn epilogue(bias: bool, act: Option<&Activation>) -> sys::cublasLtEpilogue_t {
    use sys::cublasLtEpilogue_t as E;
    match (bias, act) {
        (true, None) => E::CUBLASLT_EPILOGUE_BIAS,
        (true, Some(Activation::Relu)) => E::CUBLASLT_EPILOGUE_RELU_BIAS,
        (true, Some(Activation::Gelu)) => E::CUBLASLT_EPILOGUE_GELU_BIAS,
        (false, None) => E::CUBLASLT_EPILOGUE_DEFAULT,
        (false, Some(Activation::Relu)) => E::CUBLASLT_EPILOGUE_RELU,
        (false, Some(Activation::Gelu)) => E::CUBLASLT_EPILOGUE_GELU,
    }
}

/// The elements a column-major `rows`×`cols` matrix of leading dimension `ld` spans, over
/// `batch` matrices `stride` apart (`None`: not representable).
fn span(rows: u64, cols: u64, ld: i64, batch: u64, stride: i64) -> Option<u128> {
    if rows == 0 || cols == 0 || batch == 0 {
        return Some(0);
    }
    let one = u128::from(u64::try_from(ld).ok()?) * u128::from(cols - 1) + u128::from(rows);
    let step = u128::from(u64::try_from(stride).ok()?) * u128::from(batch - 1);
    Some(one + step)
}

/// How many of the heuristic's algorithms [`CublasLt::tune`] asks for and times.
pub const TUNE_CANDIDATES: usize = 16;

/// One matmul's checked descriptors and its cache key ([`CublasLt::matmul`], [`CublasLt::tune`]).
struct Prepared {
    desc: Desc,
    al: Layout,
    bl: Layout,
    cl: Layout,
    problem: LtProblem,
}

/// What [`CublasLt::tune`] measured: each candidate's time (the heuristic's order; `None`:
/// it failed to run) and which it chose.
#[derive(Clone, Debug, PartialEq)]
pub struct LtTuning {
    /// Microseconds per matmul of each candidate, in the heuristic's order.
    pub micros: Vec<Option<f64>>,
    /// The index of the fastest, now the device's algorithm for the problem.
    pub chosen: usize,
}

impl LtTuning {
    /// The heuristic's first's time over the chosen one's (1.0: the heuristic was right).
    pub fn speedup(&self) -> f64 {
        match (
            self.micros.first().copied().flatten(),
            self.micros[self.chosen],
        ) {
            (Some(first), Some(best)) if best > 0.0 => first / best,
            _ => 1.0,
        }
    }
}

impl fmt::Display for LtTuning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let us = |t: Option<f64>| t.map_or("failed".to_owned(), |t| format!("{t:.1} µs"));
        write!(
            f,
            "{} candidates; the heuristic's first {}, chosen #{} {} ({:.2}x)",
            self.micros.len(),
            us(self.micros.first().copied().flatten()),
            self.chosen,
            us(self.micros[self.chosen]),
            self.speedup()
        )
    }
}

impl CublasLt<'_> {
    /// The raw `cublasLtHandle_t`, for calls this type does not wrap (the handle has no stream:
    /// pass [`GpuCtx::raw_stream`] and [`workspace`](Self::workspace) to `cublasLtMatmul`).
    pub fn raw(&self) -> *mut c_void {
        self.handle as *mut c_void
    }

    /// The device address of this call's workspace ([`LT_WORKSPACE_BYTES`]), used in the
    /// node's stream's order.
    pub fn workspace(&self) -> u64 {
        self.workspace
    }

    /// `C = alpha op(A) op(B) + beta C`, then the epilogue, on the node's stream: cudarc's
    /// `Matmul::matmul` (the same config, layouts, transposes, batch strides and epilogues:
    /// `bias` alone is `EPILOGUE_BIAS`, with `act` `RELU_BIAS` / `GELU_BIAS`, `act` alone
    /// `RELU` / `GELU`), with this handle's workspace. Column-major: `C` is `m`×`n`; `bias`
    /// holds `m` elements (per batch, `stride_bias` apart). The algorithm is the device's for
    /// this problem: the one [`tune`](Self::tune) chose, else the heuristic's first for a
    /// workspace of [`LT_WORKSPACE_BYTES`] (asked once per problem and device, then kept).
    /// Under a replay capture the matmul is captured (the descriptor and heuristic calls are
    /// host-only).
    ///
    /// Checks that every buffer belongs to this node's device and is long enough for the
    /// config; a cuBLASLt status other than success is a [`GpuErrorKind::Library`] error
    /// naming the node and the status. Pass `None::<&CudaSlice<T>>` for no bias.
    ///
    /// # Safety
    /// The buffers must stay alive until the node's GPU work has finished, and `c` must not
    /// overlap `a`, `b` or `bias`; `lda`, `ldb`, `ldc` and the strides are the caller's to get
    /// right (cuBLASLt rejects most wrong ones, the length checks catch the rest).
    pub unsafe fn matmul<T: LtElement>(
        &self,
        cfg: MatmulConfig,
        a: &impl DevicePtr<T>,
        b: &impl DevicePtr<T>,
        c: &mut impl DevicePtrMut<T>,
        bias: Option<&impl DevicePtr<T>>,
        act: Option<&Activation>,
    ) -> GpuResult<()> {
        let call = self.prepare(&cfg, a, b, &*c, bias, act)?;
        let algos = &self.ctx.b.device.lt_algos;
        let algo = match algos.get(&call.problem) {
            Some(algo) => algo,
            None => {
                let first = self.heuristic(&call, 1)?[0].algo;
                algos.keep_heuristic(call.problem, first);
                first
            }
        };
        // SAFETY: the caller's contract for the buffers, checked by `prepare` to be this
        // device's and long enough; the algorithm is one the heuristic gave for this problem.
        let r = unsafe { self.run(&call, &cfg, a, b, c, &algo) };
        lt_check("cublasLtMatmul", r, &|| self.ctx.what())
    }

    /// Times the algorithms cuBLASLt's heuristic offers for this matmul (up to
    /// [`TUNE_CANDIDATES`], in the heuristic's order) on the node's stream, and makes the
    /// fastest this device's algorithm for the problem: every later [`matmul`](Self::matmul)
    /// of the same types, shapes, transposes, leading dimensions, strides and epilogue on this
    /// device, on any worker, eager or captured, runs it. Each candidate runs 3 times untimed,
    /// then 10 times in a CUDA graph launched 4 times between events (its time: the best
    /// launch's mean, the first aside), so that small matmuls are timed on the device, not at
    /// the host's launch rate. Blocks the worker until the timing is done. Eager only: under a
    /// replay capture it is an error (tune in a node before the replay's first run, as
    /// PyTorch's TunableOp tunes before capture).
    ///
    /// `c` is written by every trial, so with `beta` ≠ 0 its contents afterwards are not
    /// `alpha op(A) op(B) + beta C`: tune on scratch buffers of the real shapes.
    ///
    /// # Safety
    /// As [`matmul`](Self::matmul).
    pub unsafe fn tune<T: LtElement>(
        &self,
        cfg: MatmulConfig,
        a: &impl DevicePtr<T>,
        b: &impl DevicePtr<T>,
        c: &mut impl DevicePtrMut<T>,
        bias: Option<&impl DevicePtr<T>>,
        act: Option<&Activation>,
    ) -> GpuResult<LtTuning> {
        let what = || self.ctx.what();
        if self.ctx.capture.is_some() {
            return Err(GpuError::new(
                GpuErrorKind::InvalidArgument,
                format!(
                    "{}: CublasLt::tune times its candidates, which a replay capture cannot: \
                     tune in an eager node before the replay's first run",
                    what()
                ),
            ));
        }
        let call = self.prepare(&cfg, a, b, &*c, bias, act)?;
        let offered = self.heuristic(&call, TUNE_CANDIDATES)?;
        let mut micros = Vec::with_capacity(offered.len());
        for h in &offered {
            // SAFETY: as in `matmul`, for each of the heuristic's algorithms for this problem.
            let mut run = || unsafe { self.run(&call, &cfg, a, b, &mut *c, &h.algo) };
            micros.push(self.time_matmuls(&mut run)?);
        }
        let chosen = micros
            .iter()
            .enumerate()
            .filter_map(|(i, t)| t.map(|t| (i, t)))
            .min_by(|x, y| x.1.total_cmp(&y.1))
            .map(|(i, _)| i)
            .ok_or_else(|| {
                GpuError::new(
                    GpuErrorKind::Library,
                    format!(
                        "{}: CublasLt::tune: none of the heuristic's {} algorithms ran",
                        what(),
                        offered.len()
                    ),
                )
            })?;
        self.ctx
            .b
            .device
            .lt_algos
            .keep_tuned(call.problem, offered[chosen].algo);
        Ok(LtTuning { micros, chosen })
    }

    /// One matmul's time in µs (`None`: it failed): after 3 untimed runs, 10 of them captured
    /// into a CUDA graph on the node's stream (so that the host's launch cost, larger than a
    /// small matmul's, is not what is measured), the graph launched 4 times between events,
    /// the best of the last 3 taken.
    fn time_matmuls(&self, run: &mut dyn FnMut() -> Result<(), LtError>) -> GpuResult<Option<f64>> {
        const IN_GRAPH: usize = 10;
        if (0..3).any(|_| run().is_err()) {
            return Ok(None);
        }
        let stream = self.ctx.stream();
        let fail = |call: &str, e| self.ctx.fail_call(&format!("{call} (CublasLt::tune)"), e);
        // The timing capture holds the device's capture gate, as a replay's does (`gate.rs`).
        let gate = self.ctx.b.device.gate.capture();
        stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(|e| fail("cuStreamBeginCapture", e))?;
        let ran = (0..IN_GRAPH).all(|_| run().is_ok());
        let graph = stream
            .end_capture(CUgraphInstantiate_flags(0))
            .map_err(|e| fail("cuStreamEndCapture", e));
        drop(gate);
        let graph = graph?;
        let Some(graph) = graph.filter(|_| ran) else {
            return Ok(None);
        };
        let mut best = f64::INFINITY;
        for round in 0..4 {
            let start = stream
                .record_event(Some(CU_EVENT_DEFAULT))
                .map_err(|e| fail("cuEventRecord", e))?;
            graph.launch().map_err(|e| fail("cuGraphLaunch", e))?;
            let end = stream
                .record_event(Some(CU_EVENT_DEFAULT))
                .map_err(|e| fail("cuEventRecord", e))?;
            let ms = start
                .elapsed_ms(&end)
                .map_err(|e| fail("cuEventElapsedTime", e))?;
            if round > 0 {
                best = best.min(f64::from(ms) * 1e3 / IN_GRAPH as f64);
            }
        }
        Ok(Some(best))
    }

    /// The checks, descriptors and cache key of one matmul.
    fn prepare<T: LtElement>(
        &self,
        cfg: &MatmulConfig,
        a: &impl DeviceSlice<T>,
        b: &impl DeviceSlice<T>,
        c: &impl DeviceSlice<T>,
        bias: Option<&impl DevicePtr<T>>,
        act: Option<&Activation>,
    ) -> GpuResult<Prepared> {
        let what = || self.ctx.what();
        let what: &Wt = &what;
        let (a_rows, a_cols) = if cfg.transa {
            (cfg.k, cfg.m)
        } else {
            (cfg.m, cfg.k)
        };
        let (b_rows, b_cols) = if cfg.transb {
            (cfg.n, cfg.k)
        } else {
            (cfg.k, cfg.n)
        };
        let batch = match cfg.batch_size {
            Some(n) => u64::try_from(n).map_err(|_| {
                GpuError::new(
                    GpuErrorKind::InvalidArgument,
                    format!("{}: cublasLtMatmul: batch_size {n} < 0", what()),
                )
            })?,
            None => 1,
        };
        // Each stride counts only with a batch size, as in cudarc.
        let stride = |s: Option<i64>| cfg.batch_size.and(s).unwrap_or(0);
        let bias_stride = cfg.stride_bias.unwrap_or(0);
        self.check(
            "A",
            a,
            span(a_rows, a_cols, cfg.lda, batch, stride(cfg.stride_a)),
        )?;
        self.check(
            "B",
            b,
            span(b_rows, b_cols, cfg.ldb, batch, stride(cfg.stride_b)),
        )?;
        self.check(
            "C",
            c,
            span(cfg.m, cfg.n, cfg.ldc, batch, stride(cfg.stride_c)),
        )?;
        if let Some(bias) = bias {
            self.check("bias", bias, span(cfg.m, 1, 0, batch, bias_stride))?;
        }

        let al = Layout::new(T::DATA_TYPE, a_rows, a_cols, cfg.lda, what)?;
        al.batch(cfg.batch_size, cfg.stride_a, what)?;
        let bl = Layout::new(T::DATA_TYPE, b_rows, b_cols, cfg.ldb, what)?;
        bl.batch(cfg.batch_size, cfg.stride_b, what)?;
        let cl = Layout::new(T::DATA_TYPE, cfg.m, cfg.n, cfg.ldc, what)?;
        cl.batch(cfg.batch_size, cfg.stride_c, what)?;

        let stream = self.ctx.stream();
        let desc = Desc::new(T::COMPUTE_TYPE, what)?;
        use sys::cublasLtMatmulDescAttributes_t as D;
        // SAFETY: each value set has the attribute's type: `cublasOperation_t` (an int32: 0
        // as is, 1 transposed) here; below, a device pointer, an int64, `cublasLtEpilogue_t`.
        unsafe {
            desc.set(D::CUBLASLT_MATMUL_DESC_TRANSA, &(cfg.transa as i32), what)?;
            desc.set(D::CUBLASLT_MATMUL_DESC_TRANSB, &(cfg.transb as i32), what)?;
            desc.set(D::CUBLASLT_MATMUL_DESC_TRANSC, &(cfg.transc as i32), what)?;
        }
        let (bias_ptr, _bias_sync) = bias.map(|b| b.device_ptr(stream)).unzip();
        if let Some(p) = &bias_ptr {
            // SAFETY: as above.
            unsafe {
                desc.set(D::CUBLASLT_MATMUL_DESC_BIAS_POINTER, p, what)?;
                if let Some(s) = cfg.stride_bias {
                    desc.set(D::CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, &s, what)?;
                }
            }
        }
        let epi = epilogue(bias_ptr.is_some(), act);
        // SAFETY: as above.
        unsafe { desc.set(D::CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, what)? };
        let problem = LtProblem {
            types: (T::DATA_TYPE as i32, T::COMPUTE_TYPE as i32),
            trans: [cfg.transa, cfg.transb, cfg.transc],
            mnk: [cfg.m, cfg.n, cfg.k],
            ld: [cfg.lda, cfg.ldb, cfg.ldc],
            batch: batch as i64,
            strides: [
                stride(cfg.stride_a),
                stride(cfg.stride_b),
                stride(cfg.stride_c),
                bias_stride,
            ],
            epilogue: epi as i32,
        };
        Ok(Prepared {
            desc,
            al,
            bl,
            cl,
            problem,
        })
    }

    /// Up to `n` of the heuristic's algorithms for `call`, best first (at least one: none is
    /// a [`GpuErrorKind::Library`] error), for a workspace of [`LT_WORKSPACE_BYTES`].
    fn heuristic(
        &self,
        call: &Prepared,
        n: usize,
    ) -> GpuResult<Vec<sys::cublasLtMatmulHeuristicResult_t>> {
        let what = || self.ctx.what();
        let pref = Pref(lt_check(
            "cublasLtMatmulPreferenceCreate",
            lt::create_matmul_pref(),
            &what,
        )?);
        let ws_bytes = LT_WORKSPACE_BYTES as u64;
        // SAFETY: a live preference; the attribute is a uint64, read before return.
        let r = unsafe {
            lt::set_matmul_pref_attribute(
                pref.0,
                sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                &ws_bytes as *const u64 as *const c_void,
                mem::size_of::<u64>(),
            )
        };
        lt_check("cublasLtMatmulPreferenceSetAttribute", r, &what)?;
        let n = c_int::try_from(n).unwrap_or(c_int::MAX);
        // SAFETY: `cublasLtMatmulHeuristicResult_t` is plain data (an algorithm's bytes, sizes
        // and a status), for which all zeros is a valid value.
        let mut found =
            vec![unsafe { mem::zeroed::<sys::cublasLtMatmulHeuristicResult_t>() }; n as usize];
        let mut count: c_int = 0;
        // SAFETY: the worker's live handle and live descriptors (C is also D, as in cudarc);
        // host-only, it writes at most `n` results into `found` and their count into `count`.
        let status = unsafe {
            sys::cublasLtMatmulAlgoGetHeuristic(
                self.handle,
                call.desc.0,
                call.al.0,
                call.bl.0,
                call.cl.0,
                call.cl.0,
                pref.0,
                n,
                found.as_mut_ptr(),
                &mut count,
            )
        };
        lt_check("cublasLtMatmulAlgoGetHeuristic", status.result(), &what)?;
        found.truncate(usize::try_from(count).unwrap_or(0).min(n as usize));
        found.retain(|h| h.state == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS);
        if found.is_empty() {
            return Err(GpuError::new(
                GpuErrorKind::Library,
                format!(
                    "{}: cublasLtMatmulAlgoGetHeuristic found no algorithm for this matmul",
                    what()
                ),
            ));
        }
        Ok(found)
    }

    /// One `cublasLtMatmul` of a prepared call with `algo`.
    ///
    /// # Safety
    /// As [`matmul`](Self::matmul); `call` was prepared from these buffers and `cfg`.
    unsafe fn run<T: LtElement>(
        &self,
        call: &Prepared,
        cfg: &MatmulConfig,
        a: &impl DevicePtr<T>,
        b: &impl DevicePtr<T>,
        c: &mut impl DevicePtrMut<T>,
        algo: &sys::cublasLtMatmulAlgo_t,
    ) -> Result<(), LtError> {
        let stream = self.ctx.stream();
        let (ap, _a_sync) = a.device_ptr(stream);
        let (bp, _b_sync) = b.device_ptr(stream);
        let (cp, _c_sync) = c.device_ptr_mut(stream);
        // SAFETY: the caller's contract for the buffers (checked to be this device's and long
        // enough); the descriptors and the algorithm are live; the stream is the node's
        // (`GpuCtx::stream`'s raw handle, the capturing stream under a capture); the scalars are f32 (the
        // scale type) read before return; the workspace holds LT_WORKSPACE_BYTES and is used
        // only in this stream's order (eagerly the worker's for this stream, under a capture
        // this call's own).
        unsafe {
            lt::matmul(
                self.handle,
                call.desc.0,
                &cfg.alpha as *const f32 as *const c_void,
                &cfg.beta as *const f32 as *const c_void,
                ap as *const c_void,
                call.al.0,
                bp as *const c_void,
                call.bl.0,
                cp as *const c_void,
                call.cl.0,
                cp as *mut c_void,
                call.cl.0,
                algo,
                self.workspace as *mut c_void,
                LT_WORKSPACE_BYTES,
                self.ctx.stream.raw_ptr() as sys::cudaStream_t,
            )
        }
    }

    /// Checks that `buf` is on this node's device and spans `need` elements.
    fn check<T>(&self, name: &str, buf: &impl DeviceSlice<T>, need: Option<u128>) -> GpuResult<()> {
        let bad = |why: String| {
            Err(GpuError::new(
                GpuErrorKind::InvalidArgument,
                format!("{}: cublasLtMatmul: {name} {why}", self.ctx.what()),
            ))
        };
        if buf.stream().context().cu_ctx() != self.ctx.context().cu_ctx() {
            return bad(format!(
                "belongs to device {}'s context, not this node's",
                buf.stream().context().ordinal()
            ));
        }
        match need {
            Some(n) if n <= buf.len() as u128 => Ok(()),
            Some(n) => bad(format!(
                "holds {} elements, the config needs {n}",
                buf.len()
            )),
            None => bad("has a negative leading dimension or stride".to_owned()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epilogues_are_cudarcs() {
        use sys::cublasLtEpilogue_t as E;
        assert_eq!(epilogue(false, None), E::CUBLASLT_EPILOGUE_DEFAULT);
        assert_eq!(epilogue(true, None), E::CUBLASLT_EPILOGUE_BIAS);
        assert_eq!(
            epilogue(true, Some(&Activation::Relu)),
            E::CUBLASLT_EPILOGUE_RELU_BIAS
        );
        assert_eq!(
            epilogue(true, Some(&Activation::Gelu)),
            E::CUBLASLT_EPILOGUE_GELU_BIAS
        );
        assert_eq!(
            epilogue(false, Some(&Activation::Relu)),
            E::CUBLASLT_EPILOGUE_RELU
        );
        assert_eq!(
            epilogue(false, Some(&Activation::Gelu)),
            E::CUBLASLT_EPILOGUE_GELU
        );
    }

    #[test]
    fn spans_count_leading_dimension_and_batches() {
        // 3×2, ld 5: the last column starts at 5.
        assert_eq!(span(3, 2, 5, 1, 0), Some(8));
        // Four of them, 10 apart.
        assert_eq!(span(3, 2, 5, 4, 10), Some(38));
        assert_eq!(span(0, 2, 5, 4, 10), Some(0));
        assert_eq!(span(3, 2, -1, 1, 0), None);
        assert_eq!(span(3, 2, 5, 2, -1), None);
    }

    #[test]
    fn element_types_compute_in_f32() {
        assert_eq!(f32::DATA_TYPE, sys::cudaDataType_t::CUDA_R_32F);
        assert_eq!(
            f32::COMPUTE_TYPE,
            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F
        );
        assert_eq!(half::f16::DATA_TYPE, sys::cudaDataType_t::CUDA_R_16F);
        assert_eq!(half::bf16::DATA_TYPE, sys::cudaDataType_t::CUDA_R_16BF);
        assert_eq!(
            half::bf16::COMPUTE_TYPE,
            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F
        );
    }

    #[test]
    fn library_statuses_name_the_call() {
        let what = || "node 'lt' of graph 'g' on device 0".to_owned();
        let e = lt_check::<()>(
            "cublasLtMatmul",
            Err(lt::CublasError(
                sys::cublasStatus_t::CUBLAS_STATUS_NOT_SUPPORTED,
            )),
            &what,
        )
        .unwrap_err();
        assert_eq!(e.kind(), GpuErrorKind::Library);
        assert_eq!(
            e.message(),
            "node 'lt' of graph 'g' on device 0: cublasLtMatmul returned CUBLAS_STATUS_NOT_SUPPORTED"
        );
    }
}
