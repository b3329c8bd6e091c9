//! Kernel sources and handles: a [`Module`] is PTX text (given, or compiled with NVRTC); a
//! [`Kernel`] names one of its entry points. Both are plain values with no driver handle: each
//! device loads a module once, on first use, as cudarc's `CudaModule` (`device.rs`), and each
//! worker caches the kernel's `CudaFunction` (`worker.rs`), so a launch costs one hash lookup.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use cudarc::nvrtc::Ptx;

use crate::error::{GpuError, GpuErrorKind, GpuResult};

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

pub(crate) struct ModuleInner {
    pub(crate) id: u64,
    pub(crate) name: String,
    /// The PTX as cudarc loads it (`CudaContext::load_module`): text without a NUL byte, or
    /// NVRTC's image.
    pub(crate) ptx: Ptx,
}

/// A module's PTX, loaded lazily (once per device) by the workers that first launch one of its
/// kernels. Cheap to clone.
#[derive(Clone)]
pub struct Module {
    pub(crate) inner: Arc<ModuleInner>,
}

impl fmt::Debug for Module {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Module")
            .field("name", &self.inner.name)
            .field("id", &self.inner.id)
            .finish()
    }
}

impl Module {
    /// A module from PTX text.
    pub fn from_ptx(name: &str, ptx: &str) -> GpuResult<Self> {
        // cudarc's load makes a C string of it and panics on a NUL byte: refused here.
        if ptx.contains('\0') {
            return Err(GpuError::new(
                GpuErrorKind::InvalidArgument,
                format!("module '{name}': PTX contains a NUL byte"),
            ));
        }
        Ok(Self::new(name, Ptx::from_src(ptx)))
    }

    fn new(name: &str, ptx: Ptx) -> Self {
        Self {
            inner: Arc::new(ModuleInner {
                id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
                name: name.to_owned(),
                ptx,
            }),
        }
    }

    /// Compiles CUDA C++ source with NVRTC (needs libnvrtc on the machine) into a module.
    pub fn from_cuda_source(name: &str, source: &str) -> GpuResult<Self> {
        if !crate::driver::library_present() {
            return Err(GpuError::new(
                GpuErrorKind::NoDriver,
                format!("module '{name}': no CUDA driver on this machine"),
            ));
        }
        if !nvrtc_present() {
            return Err(GpuError::new(
                GpuErrorKind::Compile,
                format!("module '{name}': libnvrtc could not be loaded"),
            ));
        }
        let ptx = cudarc::nvrtc::compile_ptx(source).map_err(|e| {
            GpuError::new(
                GpuErrorKind::Compile,
                format!("module '{name}': NVRTC compile failed: {e:?}"),
            )
        })?;
        Ok(Self::new(name, ptx))
    }

    /// The built-in kernels of this crate (see [`builtin`](crate::builtin)).
    pub fn builtin() -> Self {
        static B: std::sync::OnceLock<Module> = std::sync::OnceLock::new();
        B.get_or_init(|| {
            Module::from_ptx("boundpool-builtin", builtin::PTX).expect("built-in PTX has no NUL")
        })
        .clone()
    }

    /// A kernel (entry point) of this module. The name is checked when a device loads it.
    pub fn kernel(&self, entry: &str) -> GpuResult<Kernel> {
        // cudarc's lookup makes a C string of it and panics on a NUL byte: refused here.
        if entry.contains('\0') {
            return Err(GpuError::new(
                GpuErrorKind::InvalidArgument,
                format!("kernel name {entry:?} contains a NUL byte"),
            ));
        }
        Ok(Kernel {
            inner: Arc::new(KernelInner {
                id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
                module: self.clone(),
                name: entry.to_owned(),
            }),
        })
    }

    /// The module's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }
}

fn nvrtc_present() -> bool {
    // SAFETY: only tries to dlopen libnvrtc by its usual names.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

pub(crate) struct KernelInner {
    pub(crate) id: u64,
    pub(crate) module: Module,
    /// The entry point's name (no NUL byte).
    pub(crate) name: String,
}

/// One kernel of a [`Module`]. Cheap to clone; launch it with
/// [`GpuCtx::launch`](crate::GpuCtx::launch).
#[derive(Clone)]
pub struct Kernel {
    pub(crate) inner: Arc<KernelInner>,
}

impl fmt::Debug for Kernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Kernel")
            .field("module", &self.inner.module.inner.name)
            .field("name", &self.inner.name)
            .finish()
    }
}

impl Kernel {
    /// The entry point's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }
}

/// Names of the built-in kernels ([`Module::builtin`]), for tests, examples and benchmarks.
pub mod builtin {
    /// The PTX text of the built-in kernels (to load them through cudarc:
    /// `ctx.load_module(Ptx::from_src(builtin::PTX))`).
    pub const PTX: &str = include_str!("kernels.ptx");
    /// `bp_empty()`: does nothing (the per-node launch cost).
    pub const EMPTY: &str = "bp_empty";
    /// `bp_count(u32* counter)`: atomically adds 1 to `*counter`.
    pub const COUNT: &str = "bp_count";
    /// `bp_set_i64(i64* dst, i64 v)`: `*dst = v`.
    pub const SET_I64: &str = "bp_set_i64";
    /// `bp_add_i64(i64* dst, const i64* src)`: `*dst += *src` (wrapping).
    pub const ADD_I64: &str = "bp_add_i64";
    /// `bp_spin(i64 cycles)`: busy-waits about `cycles` clock cycles.
    pub const SPIN: &str = "bp_spin";
    /// `bp_scale_f32(f32* x, f32 a, u32 n)`: `x[i] *= a` for `i < n`, one thread per element.
    pub const SCALE_F32: &str = "bp_scale_f32";
    /// `bp_sum_f32(const f32* x, f32* out, u32 n)`: `*out += x[i]` for `i < n` (atomic).
    pub const SUM_F32: &str = "bp_sum_f32";
}
