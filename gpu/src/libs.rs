//! The library handles and workspaces of each bound worker (cuBLAS, cuBLASLt, cuSOLVER dense).
//!
//! The only file that makes library handles. Each bound worker owns at most one cuBLAS, one
//! cuBLASLt and one cuSOLVER handle (cudarc's `CudaBlas` and `DnHandle`; the cuBLASLt handle
//! raw, from cudarc's `cublaslt::result`), created on the worker (at start when the pool asks
//! for it, else at first use) and destroyed there when it stops, before its context is
//! released. Library workspaces are the worker's, one per stream it used, so a workspace is
//! only ever used in the order of one stream, whichever other stream the handle moves to
//! meanwhile (a worker running high, normal and low nodes moves its handle between three
//! streams of its own, with three workspaces). `blas.rs` sets them to a node's stream and calls
//! the routines; `blaslt.rs` passes the cuBLASLt handle, the stream and the workspace to each
//! matmul (a cuBLASLt handle has no stream of its own).

use std::cell::RefCell;
use std::fmt;
use std::sync::{Arc, OnceLock};

use cudarc::cublas::sys as cb;
use cudarc::cublas::CudaBlas;
use cudarc::cublaslt::result::{self as lt, CublasError as LtError};
use cudarc::cublaslt::sys as lts;
use cudarc::cusolver::sys as cs;
use cudarc::cusolver::DnHandle;
use cudarc::driver::CudaStream;

use crate::driver::{self, Ctx, DeviceAlloc, StreamRef};
use crate::error::{GpuError, GpuErrorKind, GpuResult};

/// cuBLAS workspace per (worker, stream): the size NVIDIA recommends for Hopper.
pub(crate) const BLAS_WORKSPACE_BYTES: usize = 32 << 20;

/// cuBLASLt workspace per (worker, stream), and per call under a capture: 4 MiB, the size
/// NVIDIA recommends before Hopper and ample for the heuristic's GEMMs with epilogues.
pub const LT_WORKSPACE_BYTES: usize = 4 << 20;

/// A library this crate loads at run time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Library {
    Blas,
    BlasLt,
    Solver,
}

impl Library {
    fn name(self) -> &'static str {
        match self {
            Library::Blas => "cuBLAS (libcublas)",
            Library::BlasLt => "cuBLASLt (libcublasLt)",
            Library::Solver => "cuSOLVER (libcusolver)",
        }
    }

    /// Whether the shared library can be loaded (tried once per process). Checked before any
    /// call into it: cudarc's bindings panic when the library is missing.
    pub(crate) fn present(self) -> bool {
        static BLAS: OnceLock<bool> = OnceLock::new();
        static BLAS_LT: OnceLock<bool> = OnceLock::new();
        static SOLVER: OnceLock<bool> = OnceLock::new();
        match self {
            // SAFETY: only tries to dlopen the library by its usual names.
            Library::Blas => *BLAS.get_or_init(|| unsafe { cb::is_culib_present() }),
            // SAFETY: only tries to dlopen the library by its usual names.
            Library::BlasLt => *BLAS_LT.get_or_init(|| unsafe { lts::is_culib_present() }),
            // cuSOLVER needs cuBLAS too.
            Library::Solver => *SOLVER.get_or_init(|| {
                // SAFETY: only tries to dlopen the libraries by their usual names.
                unsafe { cs::is_culib_present() && cb::is_culib_present() }
            }),
        }
    }

    pub(crate) fn missing_error(self, what: &str) -> GpuError {
        let mut msg = String::new();
        if !what.is_empty() {
            msg.push_str(what);
            msg.push_str(": ");
        }
        msg.push_str(&format!(
            "{} could not be loaded (not found by the dynamic loader: install the CUDA \
             toolkit's libraries or add their folder to LD_LIBRARY_PATH)",
            self.name()
        ));
        GpuError::new(GpuErrorKind::LibraryMissing, msg)
    }
}

/// A status other than success from a cuBLAS or cuSOLVER call: the error's `source()`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LibraryStatus {
    call: &'static str,
    status: String,
}

impl fmt::Display for LibraryStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} returned {}", self.call, self.status)
    }
}

impl std::error::Error for LibraryStatus {}

pub(crate) fn status_error(call: &'static str, status: String, what: &str) -> GpuError {
    let kind = if status.ends_with("ALLOC_FAILED") {
        GpuErrorKind::OutOfMemory
    } else {
        GpuErrorKind::Library
    };
    let src = LibraryStatus { call, status };
    GpuError::new(kind, format!("{what}: {src}")).with_source(src)
}

pub(crate) fn blas_check(
    call: &'static str,
    s: cb::cublasStatus_t,
    what: &dyn Fn() -> String,
) -> GpuResult<()> {
    if s == cb::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(status_error(call, format!("{s:?}"), &what()))
    }
}

/// A cuBLASLt call's result (cudarc's `cublaslt::result` functions return its status as the
/// error): an error naming `call`, the node (`what`) and the status.
pub(crate) fn lt_check<T>(
    call: &'static str,
    r: Result<T, LtError>,
    what: &dyn Fn() -> String,
) -> GpuResult<T> {
    r.map_err(|e| status_error(call, format!("{:?}", e.0), &what()))
}

pub(crate) fn solver_check(
    call: &'static str,
    s: cs::cusolverStatus_t,
    what: &dyn Fn() -> String,
) -> GpuResult<()> {
    if s == cs::cusolverStatus_t::CUSOLVER_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(status_error(call, format!("{s:?}"), &what()))
    }
}

// ----------------------------------------------------------------------------------------------
// Owned handles (not Copy; destroyed by consuming them, on their worker).

/// A worker's cuBLAS handle: cudarc's `CudaBlas` (so a node can use its typed GEMMs), and
/// the stream it was last set to with that stream's workspace (`None`: set again at the next
/// use, as after a capture, whose stream is gone once it ends).
pub(crate) struct BlasHandle {
    pub(crate) blas: CudaBlas,
    pub(crate) stream: Option<StreamRef>,
    pub(crate) stream_sets: u64,
}

impl BlasHandle {
    fn create(stream: &Arc<CudaStream>, what: &dyn Fn() -> String) -> GpuResult<Self> {
        let blas = CudaBlas::new(stream.clone())
            .map_err(|e| status_error("cublasCreate", format!("{:?}", e.0), &what()))?;
        Ok(Self {
            blas,
            stream: None,
            stream_sets: 0,
        })
    }

    pub(crate) fn raw(&self) -> cb::cublasHandle_t {
        *self.blas.handle()
    }

    /// Destroys the handle (cudarc's drop) on its worker. After a sticky error the library may
    /// fail to destroy it, and cudarc's drop panics then: the handle is leaked instead.
    fn destroy(self, device_failed: bool) {
        if device_failed {
            std::mem::forget(self.blas);
        }
    }
}

/// A worker's cuBLASLt handle (cudarc's `CudaBlasLT` cannot serve: it fixes its stream when
/// made and allocates a workspace this crate cannot free through its release queue nor hoist
/// out of a capture). A cuBLASLt handle holds no stream: each matmul names its stream and
/// workspace (`blaslt.rs`).
pub(crate) struct LtHandle {
    raw: lts::cublasLtHandle_t,
}

// SAFETY: the handle is a pointer to the library's state, made, used and destroyed on its
// worker's thread only; `Send` because the worker's scheduler state must be (`Pool<S: Send>`),
// not because it moves.
unsafe impl Send for LtHandle {}

impl LtHandle {
    fn create(what: &dyn Fn() -> String) -> GpuResult<Self> {
        let raw = lt_check("cublasLtCreate", lt::create_handle(), what)?;
        Ok(Self { raw })
    }

    pub(crate) fn raw(&self) -> lts::cublasLtHandle_t {
        self.raw
    }

    /// Destroys the handle on its worker. After a sticky error the library may fail to destroy
    /// it: the handle is leaked then, as the other handles are.
    fn destroy(self, device_failed: bool) {
        if !device_failed {
            // SAFETY: made by `cublasLtCreate` and destroyed once: `self` is consumed. A
            // failure leaves nothing to do at shutdown.
            let _ = unsafe { lt::destroy_handle(self.raw) };
        }
    }
}

/// A worker's cuSOLVER (dense) handle: cudarc's `DnHandle`, and the stream it was last set to
/// by a node (`None`: set at the next use).
struct SolverHandle {
    dn: DnHandle,
    stream: Option<StreamRef>,
    stream_sets: u64,
}

impl SolverHandle {
    /// Creates the handle on its worker (cudarc sets it to `stream`; the first node sets it to
    /// its own).
    fn create(stream: &Arc<CudaStream>, what: &dyn Fn() -> String) -> GpuResult<Self> {
        let dn = DnHandle::new(stream.clone())
            .map_err(|e| status_error("cusolverDnCreate", format!("{:?}", e.0), &what()))?;
        Ok(Self {
            dn,
            stream: None,
            stream_sets: 0,
        })
    }

    /// Destroys the handle (cudarc's drop) on its worker. After a sticky error the library may
    /// fail to destroy it, and cudarc's drop panics then: the handle is leaked instead.
    fn destroy(self, device_failed: bool) {
        if device_failed {
            std::mem::forget(self.dn);
        }
    }
}

/// A worker's library workspaces for one stream, used only in that stream's order.
struct StreamSpace {
    stream: StreamRef,
    blas: Option<DeviceAlloc>,
    lt: Option<DeviceAlloc>,
    solver: Option<DeviceAlloc>,
    solver_bytes: usize,
}

/// A bound worker's library handles and workspaces.
#[derive(Default)]
pub(crate) struct WorkerLibs {
    pub(crate) blas: RefCell<Option<BlasHandle>>,
    lt: RefCell<Option<LtHandle>>,
    solver: RefCell<Option<SolverHandle>>,
    spaces: RefCell<Vec<StreamSpace>>,
}

impl WorkerLibs {
    fn space<R>(&self, stream: StreamRef, f: impl FnOnce(&mut StreamSpace) -> R) -> R {
        let mut spaces = self.spaces.borrow_mut();
        let i = match spaces.iter().position(|s| s.stream == stream) {
            Some(i) => i,
            None => {
                spaces.push(StreamSpace {
                    stream,
                    blas: None,
                    lt: None,
                    solver: None,
                    solver_bytes: 0,
                });
                spaces.len() - 1
            }
        };
        f(&mut spaces[i])
    }

    /// Creates the cuBLAS handle (on `stream`) unless it exists.
    pub(crate) fn ensure_blas(
        &self,
        stream: &Arc<CudaStream>,
        what: &dyn Fn() -> String,
    ) -> GpuResult<()> {
        if self.blas.borrow().is_none() {
            if !Library::Blas.present() {
                return Err(Library::Blas.missing_error(&what()));
            }
            *self.blas.borrow_mut() = Some(BlasHandle::create(stream, what)?);
        }
        Ok(())
    }

    /// Whether this worker's cuBLASLt handle exists (`held`: the error when its cell is
    /// borrowed, which a nested node could only meet through a bug).
    pub(crate) fn has_lt(&self, held: &dyn Fn() -> GpuError) -> GpuResult<bool> {
        Ok(self.lt.try_borrow().map_err(|_| held())?.is_some())
    }

    /// Creates the cuBLASLt handle unless it exists (a missing libcublasLt is an error naming
    /// `what`, never a panic).
    pub(crate) fn ensure_lt(
        &self,
        what: &dyn Fn() -> String,
        held: &dyn Fn() -> GpuError,
    ) -> GpuResult<()> {
        let mut h = self.lt.try_borrow_mut().map_err(|_| held())?;
        if h.is_none() {
            if !Library::BlasLt.present() {
                return Err(Library::BlasLt.missing_error(&what()));
            }
            *h = Some(LtHandle::create(what)?);
        }
        Ok(())
    }

    /// The raw cuBLASLt handle (made by [`ensure_lt`](Self::ensure_lt)).
    pub(crate) fn lt_raw(
        &self,
        held: &dyn Fn() -> GpuError,
    ) -> GpuResult<Option<lts::cublasLtHandle_t>> {
        Ok(self
            .lt
            .try_borrow()
            .map_err(|_| held())?
            .as_ref()
            .map(LtHandle::raw))
    }

    /// This worker's cuBLASLt workspace for `stream` ([`LT_WORKSPACE_BYTES`], made at the
    /// stream's first use, in its order).
    pub(crate) fn lt_workspace(
        &self,
        ctx: Ctx,
        stream: StreamRef,
        what: &dyn Fn() -> String,
    ) -> GpuResult<u64> {
        self.workspace(ctx, stream, LT_WORKSPACE_BYTES, |sp| &mut sp.lt, what)
    }

    /// Creates the cuSOLVER handle (on `stream`) unless it exists.
    pub(crate) fn ensure_solver(
        &self,
        stream: &Arc<CudaStream>,
        what: &dyn Fn() -> String,
    ) -> GpuResult<()> {
        if self.solver.borrow().is_none() {
            if !Library::Solver.present() {
                return Err(Library::Solver.missing_error(&what()));
            }
            *self.solver.borrow_mut() = Some(SolverHandle::create(stream, what)?);
        }
        Ok(())
    }

    /// The workspace of `stream` in the slot `slot` picks (`bytes`, made at the stream's first
    /// use, in its order); its address.
    fn workspace(
        &self,
        ctx: Ctx,
        stream: StreamRef,
        bytes: usize,
        slot: fn(&mut StreamSpace) -> &mut Option<DeviceAlloc>,
        what: &dyn Fn() -> String,
    ) -> GpuResult<u64> {
        self.space(stream, |sp| {
            let ws = match slot(sp) {
                Some(a) => a,
                s @ None => s.insert(
                    driver::mem_alloc_async(ctx, bytes, stream)
                        .map_err(|e| GpuError::driver("cuMemAllocAsync", &what(), e))?,
                ),
            };
            Ok::<u64, GpuError>(ws.addr())
        })
    }

    /// This worker's workspace for `stream` (made at the stream's first use, in its order).
    pub(crate) fn blas_workspace(
        &self,
        ctx: Ctx,
        stream: StreamRef,
        what: &dyn Fn() -> String,
    ) -> GpuResult<u64> {
        self.workspace(ctx, stream, BLAS_WORKSPACE_BYTES, |sp| &mut sp.blas, what)
    }

    /// The cuSOLVER handle, set to `stream` (a stream of this worker's context).
    pub(crate) fn solver_on(
        &self,
        stream: &Arc<CudaStream>,
        what: &dyn Fn() -> String,
    ) -> GpuResult<(cs::cusolverDnHandle_t, u64)> {
        self.ensure_solver(stream, what)?;
        let mut h = self.solver.borrow_mut();
        let h = h.as_mut().expect("created above");
        let view = StreamRef::of(stream);
        if h.stream != Some(view) {
            // SAFETY: `set_stream` is unsafe because work on two streams may race on memory:
            // this handle's work goes where the node's own work goes, ordered by its edges, and
            // its workspace is the worker's for this stream.
            unsafe { h.dn.set_stream(stream.clone()) }
                .map_err(|e| status_error("cusolverDnSetStream", format!("{:?}", e.0), &what()))?;
            h.stream = Some(view);
            h.stream_sets += 1;
        }
        Ok((h.dn.cu(), h.stream_sets))
    }

    /// This worker's cuSOLVER workspace for `stream`, of at least `bytes` (grown
    /// stream-ordered: the old one is freed after the work already enqueued on the stream).
    pub(crate) fn solver_workspace(
        &self,
        ctx: Ctx,
        stream: StreamRef,
        bytes: usize,
        what: &dyn Fn() -> String,
    ) -> GpuResult<u64> {
        self.space(stream, |sp| {
            if sp.solver_bytes < bytes {
                sp.solver_bytes = 0;
                if let Some(old) = sp.solver.take() {
                    old.free_async(ctx, stream)
                        .map_err(|e| GpuError::driver("cuMemFreeAsync", &what(), e))?;
                }
                sp.solver = Some(
                    driver::mem_alloc_async(ctx, bytes, stream)
                        .map_err(|e| GpuError::driver("cuMemAllocAsync", &what(), e))?,
                );
                sp.solver_bytes = bytes;
            }
            Ok(sp.solver.as_ref().map_or(0, DeviceAlloc::addr))
        })
    }

    /// Frees the workspaces (each after its stream's work) and destroys the handles. On the
    /// worker, its context still current.
    pub(crate) fn shutdown(self, ctx: Ctx, device_failed: bool) {
        for sp in self.spaces.into_inner() {
            for a in [sp.blas, sp.lt, sp.solver].into_iter().flatten() {
                let _ = a.free_async(ctx, sp.stream);
            }
        }
        if let Some(h) = self.blas.into_inner() {
            h.destroy(device_failed);
        }
        if let Some(h) = self.lt.into_inner() {
            h.destroy(device_failed);
        }
        if let Some(h) = self.solver.into_inner() {
            h.destroy(device_failed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_library_error_names_it() {
        let e = Library::Solver.missing_error("node 'potrf(0)' of graph 'g' on device 0");
        assert_eq!(e.kind(), GpuErrorKind::LibraryMissing);
        assert!(e.message().starts_with("node 'potrf(0)'"), "{e}");
        assert!(e.message().contains("cuSOLVER (libcusolver)"), "{e}");
        let e = Library::BlasLt.missing_error("node 'lt' of graph 'g' on device 0");
        assert_eq!(e.kind(), GpuErrorKind::LibraryMissing);
        assert!(e.message().contains("cuBLASLt (libcublasLt)"), "{e}");
        let e = Library::Blas.missing_error("");
        assert!(
            e.message()
                .starts_with("cuBLAS (libcublas) could not be loaded"),
            "{e}"
        );
    }

    #[test]
    fn library_status_errors_name_node_and_status() {
        let what = || "node 'gemm(2,1,0)' of graph 'c' on device 0".to_owned();
        let e = blas_check(
            "cublasDgemm",
            cb::cublasStatus_t::CUBLAS_STATUS_INVALID_VALUE,
            &what,
        )
        .unwrap_err();
        assert_eq!(e.kind(), GpuErrorKind::Library);
        assert_eq!(
            e.message(),
            "node 'gemm(2,1,0)' of graph 'c' on device 0: cublasDgemm returned CUBLAS_STATUS_INVALID_VALUE"
        );
        let src = std::error::Error::source(&e).expect("the status as source");
        assert_eq!(
            src.to_string(),
            "cublasDgemm returned CUBLAS_STATUS_INVALID_VALUE"
        );
        let e = blas_check(
            "cublasCreate",
            cb::cublasStatus_t::CUBLAS_STATUS_ALLOC_FAILED,
            &what,
        )
        .unwrap_err();
        assert_eq!(e.kind(), GpuErrorKind::OutOfMemory);
        let e = solver_check(
            "cusolverDnDpotrf",
            cs::cusolverStatus_t::CUSOLVER_STATUS_INVALID_VALUE,
            &what,
        )
        .unwrap_err();
        assert!(
            e.message().ends_with("CUSOLVER_STATUS_INVALID_VALUE"),
            "{e}"
        );
        assert!(blas_check("x", cb::cublasStatus_t::CUBLAS_STATUS_SUCCESS, &what).is_ok());
    }
}
