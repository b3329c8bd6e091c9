//! The library handles and workspaces of each bound worker (cuBLAS, cuBLASLt, cuSOLVER dense).
//!
//! The only file that makes library handles. Each bound worker owns at most one cuBLAS, one
//! cuBLASLt and one cuSOLVER handle (cudarc's `CudaBlas` and `DnHandle`; the cuBLASLt handle
//! raw, from cudarc's `cublaslt::result`), created on the worker (at start when the pool asks
//! for it, else at first use) and destroyed there when it stops, before its context is
//! released. Library workspaces are the worker's, one per stream it used, so a workspace is
//! only ever used in the order of one stream, whichever other stream the handle moves to
//! meanwhile (a worker running high, normal and low nodes moves its handle between three
//! streams of its own, with three workspaces). `blas.rs` sets the cuBLAS and cuSOLVER handles
//! to a node's stream and lends them to it (the cuSOLVER workspace with the handle: cuSOLVER's
//! calls take theirs as an argument); `blaslt.rs` passes the cuBLASLt handle, the stream and
//! the workspace to each matmul (a cuBLASLt handle has no stream of its own).

use std::cell::RefCell;
use std::fmt;
use std::sync::{Arc, OnceLock};

use cudarc::cublas::sys as cb;
use cudarc::cublas::CudaBlas;
use cudarc::cublaslt::result::{self as lt, CublasError as LtError};
use cudarc::cublaslt::sys as lts;
use cudarc::cusolver::sys as cs;
use cudarc::cusolver::DnHandle;
use cudarc::driver::{CudaSlice, CudaStream};

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

// ----------------------------------------------------------------------------------------------
// Owned handles (not Copy; destroyed by consuming them, on their worker).

/// A worker's cuBLAS or cuSOLVER handle: cudarc's `CudaBlas` or `DnHandle` (what a node is
/// lent), the stream a node last set it to, with that stream's workspace (`None`: set again at
/// the next use, as after a capture, whose stream is gone once it ends), and how many times a
/// node set it.
pub(crate) struct LibHandle<H> {
    pub(crate) lib: H,
    pub(crate) stream: Option<StreamRef>,
    pub(crate) stream_sets: u64,
}

impl<H> LibHandle<H> {
    fn new(lib: H) -> Self {
        Self {
            lib,
            stream: None,
            stream_sets: 0,
        }
    }

    /// Destroys the handle (cudarc's drop) on its worker. After a sticky error the library may
    /// fail to destroy it, and cudarc's drop panics then: the handle is leaked instead.
    fn destroy(self, device_failed: bool) {
        if device_failed {
            std::mem::forget(self.lib);
        }
    }
}

/// A worker's cuBLAS handle (its workspaces are the worker's, per stream: [`StreamSpace`]).
pub(crate) type BlasHandle = LibHandle<CudaBlas>;

impl BlasHandle {
    fn create(stream: &Arc<CudaStream>, what: &dyn Fn() -> String) -> GpuResult<Self> {
        let blas = CudaBlas::new(stream.clone())
            .map_err(|e| status_error("cublasCreate", format!("{:?}", e.0), &what()))?;
        Ok(Self::new(blas))
    }

    pub(crate) fn raw(&self) -> cb::cublasHandle_t {
        *self.lib.handle()
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

/// A worker's cuSOLVER (dense) handle, and its workspaces, one per stream (grown as calls ask;
/// a cuSOLVER call takes its workspace as an argument, so the handle lends them with itself).
pub(crate) struct SolverHandle {
    pub(crate) h: LibHandle<DnHandle>,
    workspaces: Vec<(StreamRef, CudaSlice<u8>)>,
}

impl SolverHandle {
    /// Creates the handle on its worker (cudarc sets it to `stream`; the first node sets it to
    /// its own).
    fn create(stream: &Arc<CudaStream>, what: &dyn Fn() -> String) -> GpuResult<Self> {
        let dn = DnHandle::new(stream.clone())
            .map_err(|e| status_error("cusolverDnCreate", format!("{:?}", e.0), &what()))?;
        Ok(Self {
            h: LibHandle::new(dn),
            workspaces: Vec::new(),
        })
    }

    /// This handle's workspace for the stream it is set to (`ctx`'s), of at least `bytes` bytes:
    /// made at the stream's first use, and grown stream-ordered (the old one is freed after the
    /// work already enqueued on the stream), so it is only ever used in that stream's order.
    pub(crate) fn workspace(
        &mut self,
        ctx: Ctx,
        bytes: usize,
        what: &dyn Fn() -> String,
    ) -> GpuResult<&mut CudaSlice<u8>> {
        let stream = self.h.lib.stream().clone();
        let view = StreamRef::of(&stream);
        let i = match self.workspaces.iter().position(|(s, _)| *s == view) {
            Some(i) if self.workspaces[i].1.len() >= bytes => return Ok(&mut self.workspaces[i].1),
            Some(i) => {
                // Dropped (cudarc's `cuMemFreeAsync` on its stream, this one) before the new one
                // is made, so that a pool short of memory can reuse it.
                drop(self.workspaces.swap_remove(i));
                self.workspaces.len()
            }
            None => self.workspaces.len(),
        };
        let p = driver::mem_alloc_async(ctx, bytes, view)
            .map_err(|e| GpuError::driver("cuMemAllocAsync", &what(), e))?;
        // SAFETY: a live allocation of this context of `bytes.max(1)` bytes, handed to the
        // slice, which owns it from now on (and frees it stream-ordered on `stream`, where it
        // was made); its contents are undefined, as scratch for the library is.
        let ws = unsafe { stream.upgrade_device_ptr::<u8>(p.into_raw(), bytes) };
        self.workspaces.push((view, ws));
        Ok(&mut self.workspaces[i].1)
    }

    /// Frees the workspaces (each after its stream's work; leaked after a sticky error, as the
    /// handle is) and destroys the handle, on its worker.
    fn destroy(self, device_failed: bool) {
        for (_, ws) in self.workspaces {
            if device_failed {
                let _ = ws.leak();
            }
        }
        self.h.destroy(device_failed);
    }
}

/// A worker's cuBLAS and cuBLASLt workspaces for one stream, used only in that stream's order.
struct StreamSpace {
    stream: StreamRef,
    blas: Option<DeviceAlloc>,
    lt: Option<DeviceAlloc>,
}

/// A bound worker's library handles and workspaces.
#[derive(Default)]
pub(crate) struct WorkerLibs {
    pub(crate) blas: RefCell<Option<BlasHandle>>,
    lt: RefCell<Option<LtHandle>>,
    pub(crate) solver: RefCell<Option<SolverHandle>>,
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

    /// The cuSOLVER handle, set to `stream` (a stream of this worker's context); `held`: the
    /// error when a node this one is nested in holds it.
    pub(crate) fn solver_on(
        &self,
        stream: &Arc<CudaStream>,
        what: &dyn Fn() -> String,
        held: &dyn Fn() -> GpuError,
    ) -> GpuResult<std::cell::RefMut<'_, SolverHandle>> {
        if self.solver.try_borrow().map_err(|_| held())?.is_none() {
            self.ensure_solver(stream, what)?;
        }
        let mut h = self.solver.try_borrow_mut().map_err(|_| held())?;
        let sh = h.as_mut().expect("created above");
        let view = StreamRef::of(stream);
        if sh.h.stream != Some(view) {
            // SAFETY: `set_stream` is unsafe because work on two streams may race on memory:
            // this handle's work goes where the node's own work goes, ordered by its edges, and
            // its workspace is the handle's for this stream.
            unsafe { sh.h.lib.set_stream(stream.clone()) }
                .map_err(|e| status_error("cusolverDnSetStream", format!("{:?}", e.0), &what()))?;
            sh.h.stream = Some(view);
            sh.h.stream_sets += 1;
        }
        Ok(std::cell::RefMut::map(h, |h| {
            h.as_mut().expect("created above")
        }))
    }

    /// Frees the workspaces (each after its stream's work) and destroys the handles. On the
    /// worker, its context still current.
    pub(crate) fn shutdown(self, ctx: Ctx, device_failed: bool) {
        for sp in self.spaces.into_inner() {
            for a in [sp.blas, sp.lt].into_iter().flatten() {
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
        let e = status_error(
            "cusolverDnDpotrf",
            format!("{:?}", cs::cusolverStatus_t::CUSOLVER_STATUS_INVALID_VALUE),
            &what(),
        );
        assert!(
            e.message().ends_with("CUSOLVER_STATUS_INVALID_VALUE"),
            "{e}"
        );
        assert!(blas_check("x", cb::cublasStatus_t::CUBLAS_STATUS_SUCCESS, &what).is_ok());
    }
}
