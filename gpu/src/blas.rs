//! cuBLAS and cuSOLVER (dense) as node bodies see them: [`GpuCtx::cublas`] and
//! [`GpuCtx::solver`] lend a node its worker's handle (`libs.rs`), cudarc's `CudaBlas` or
//! `DnHandle`, already set to the stream the node enqueues on (its worker's own stream of the
//! node's priority level, or one a predecessor of the same level handed over to it) with the
//! worker's workspace for it; the stream is set only when it changed since the handle's last
//! use. The routines are cudarc's (its typed GEMMs) or the libraries' own, called on the
//! handle. Also [`GpuCtx::state`], a worker's user state (`state.rs`).

use std::cell::RefMut;
use std::fmt;

use cudarc::cublas::sys as cb;
use cudarc::cublas::CudaBlas;
use cudarc::cusolver::DnHandle;
use cudarc::driver::CudaSlice;

use crate::error::{GpuError, GpuErrorKind, GpuResult};
use crate::libs::{blas_check, status_error, BlasHandle, SolverHandle, BLAS_WORKSPACE_BYTES};
use crate::node::GpuCtx;

impl<'a, 'n> GpuCtx<'a, 'n> {
    /// This worker's cuBLAS handle as cudarc's [`CudaBlas`], set to the stream this node
    /// enqueues on ([`GpuCtx::stream`]: the worker's stream of the node's priority level, or one
    /// handed over) with the worker's workspace for it; created on the worker at its first use
    /// (a missing libcublas is an error naming the node). cudarc's typed GEMMs (`Gemm` for
    /// `f16`, `bf16`, `f32`, `f64`, strided-batched too, and `Gemv`) on
    /// [`DeviceBuffer`](crate::DeviceBuffer)s or `CudaSlice`s, and the library's other routines
    /// called on [`CudaBlas::handle`], run in the node's order.
    ///
    /// Under a replay capture the calls are captured too: the handle is set to the capturing
    /// stream with a workspace of its own, allocated outside the graph and kept as long as the
    /// replay (as PyTorch sets one per handle and stream, so that cuBLAS allocates nothing while
    /// capturing). Hold it only for the calls: while held, a node nested on this worker (run
    /// while this body waits on a subgraph) gets an error from `cublas()`.
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
        let held = || self.held("cuBLAS", "CublasRef");
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
            unsafe { hb.lib.set_stream(self.stream().clone()) }
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

    /// The error for a library handle held by a node this one is nested in.
    fn held(&self, lib: &str, guard: &str) -> GpuError {
        GpuError::new(
            GpuErrorKind::InvalidArgument,
            format!(
                "{}: this worker's {lib} handle is held by a node this one is nested in (drop the {guard} before waiting on a subgraph)",
                self.what()
            ),
        )
    }

    /// This worker's cuSOLVER (dense) handle as cudarc's [`DnHandle`], set to the stream this
    /// node enqueues on, with the worker's workspace for that stream
    /// ([`SolverRef::workspace`]); created on the worker at its first use (a missing
    /// libcusolver is an error naming the node). Refused under a replay capture. Hold it only
    /// for the calls, as [`cublas`](Self::cublas).
    pub fn solver(&self) -> GpuResult<SolverRef<'_, 'a, 'n>> {
        if let Some(c) = self.capture {
            return Err(c.refuse(self, "cuSOLVER under a replay capture is not supported (its workspace is grown stream-ordered; not examined)"));
        }
        let what = || self.what();
        let held = || self.held("cuSOLVER", "SolverRef");
        Ok(SolverRef {
            ctx: self,
            h: self.b.libs.solver_on(self.stream(), &what, &held)?,
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

/// The node's worker's cuBLAS handle as cudarc's [`CudaBlas`], set to the node's stream
/// ([`GpuCtx::cublas`]). Dereferences to the `CudaBlas`.
pub struct CublasRef<'a> {
    h: RefMut<'a, BlasHandle>,
}

impl CublasRef<'_> {
    /// How many times this worker has set its cuBLAS handle's stream so far (once per change
    /// of stream between consecutive uses).
    pub fn stream_sets(&self) -> u64 {
        self.h.stream_sets
    }
}

impl std::ops::Deref for CublasRef<'_> {
    type Target = CudaBlas;

    fn deref(&self) -> &CudaBlas {
        &self.h.lib
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

/// The node's worker's cuSOLVER (dense) handle as cudarc's [`DnHandle`], set to the node's
/// stream ([`GpuCtx::solver`]), and the worker's workspace for that stream. Dereferences to the
/// `DnHandle` (`DnHandle::cu` for the library's routines).
pub struct SolverRef<'c, 'a, 'n> {
    ctx: &'c GpuCtx<'a, 'n>,
    h: RefMut<'a, SolverHandle>,
}

impl SolverRef<'_, '_, '_> {
    /// How many times this worker has set its cuSOLVER handle's stream so far.
    pub fn stream_sets(&self) -> u64 {
        self.h.h.stream_sets
    }

    /// The worker's cuSOLVER workspace for the node's stream, at least `bytes` long (grown
    /// stream-ordered when a call needs more: the old one is freed after the work already
    /// enqueued on the stream), for the routines that take one (`potrf`'s `Workspace`, ...).
    /// It is used only in that stream's order; its contents are whatever the last call left.
    pub fn workspace(&mut self, bytes: usize) -> GpuResult<&mut CudaSlice<u8>> {
        let ctx = self.ctx;
        self.h.workspace(ctx.b.ctx, bytes, &|| ctx.what())
    }
}

impl std::ops::Deref for SolverRef<'_, '_, '_> {
    type Target = DnHandle;

    fn deref(&self) -> &DnHandle {
        &self.h.h.lib
    }
}

impl fmt::Debug for SolverRef<'_, '_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SolverRef")
            .field("node", &self.ctx.node_name())
            .field("handle", &self.h.h.lib.cu())
            .field("stream_sets", &self.h.h.stream_sets)
            .finish()
    }
}
