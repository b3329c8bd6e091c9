//! A kernel launch from a GPU node: its shape (`LaunchConfig`), its arguments (`KernelArg`),
//! and the builder that enqueues it on the node's stream (`Launch`, from `GpuCtx::launch`).

use std::cell::Ref;
use std::fmt;

use cudarc::driver::CudaFunction;

use super::GpuCtx;
use crate::buffer::{DeviceBuffer, DeviceCopy};
use crate::driver;
use crate::error::{GpuError, GpuErrorKind, GpuResult};
use crate::module::Kernel;

/// Grid and block shape and dynamic shared memory of a launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchConfig {
    /// Blocks in the grid.
    pub grid: (u32, u32, u32),
    /// Threads per block.
    pub block: (u32, u32, u32),
    /// Dynamic shared memory per block, in bytes.
    pub shared_mem_bytes: u32,
}

impl LaunchConfig {
    /// One block of one thread.
    pub fn single() -> Self {
        Self {
            grid: (1, 1, 1),
            block: (1, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// Enough 256-thread blocks for one thread per element of `n`.
    pub fn for_elements(n: usize) -> Self {
        let blocks = n.div_ceil(256).max(1) as u32;
        Self {
            grid: (blocks, 1, 1),
            block: (256, 1, 1),
            shared_mem_bytes: 0,
        }
    }
}

/// A value that can be passed to a kernel by value (scalars, and device buffers as pointers).
pub trait KernelArg {
    /// The argument's bytes, little-endian, in the low bytes of a `u64` (at most 8 bytes).
    fn to_bits(&self) -> u64;
}

macro_rules! kernel_arg_int {
    ($($t:ty),*) => { $(
        impl KernelArg for $t {
            fn to_bits(&self) -> u64 {
                let mut out = [0u8; 8];
                let b = self.to_le_bytes();
                out[..b.len()].copy_from_slice(&b);
                u64::from_le_bytes(out)
            }
        }
    )* };
}
kernel_arg_int!(u8, i8, u16, i16, u32, i32, u64, i64, usize, isize, f32, f64);

impl<T: DeviceCopy> KernelArg for &DeviceBuffer<T> {
    fn to_bits(&self) -> u64 {
        self.device_ptr()
    }
}

impl<T: DeviceCopy> KernelArg for &mut DeviceBuffer<T> {
    fn to_bits(&self) -> u64 {
        self.device_ptr()
    }
}

/// Most kernel arguments a [`Launch`] takes.
pub const MAX_KERNEL_ARGS: usize = 16;

/// A kernel launch being assembled: add arguments in order with [`arg`](Self::arg), then
/// [`launch`](Self::launch).
pub struct Launch<'c, 'a, 'n> {
    ctx: &'c GpuCtx<'a, 'n>,
    kernel: &'c Kernel,
    cfg: LaunchConfig,
    args: [u64; MAX_KERNEL_ARGS],
    n: usize,
    too_many: bool,
}

impl<'c, 'a, 'n> Launch<'c, 'a, 'n> {
    /// A launch of `kernel` with `cfg` from the node of `ctx`, without arguments yet.
    pub(super) fn new(ctx: &'c GpuCtx<'a, 'n>, kernel: &'c Kernel, cfg: LaunchConfig) -> Self {
        Launch {
            ctx,
            kernel,
            cfg,
            args: [0; MAX_KERNEL_ARGS],
            n: 0,
            too_many: false,
        }
    }
}

impl fmt::Debug for Launch<'_, '_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Launch")
            .field("kernel", &self.kernel.name())
            .field("cfg", &self.cfg)
            .field("args", &self.n)
            .finish()
    }
}

impl<'a> Launch<'_, 'a, '_> {
    /// Appends one argument.
    pub fn arg(mut self, a: impl KernelArg) -> Self {
        if self.n < MAX_KERNEL_ARGS {
            self.args[self.n] = a.to_bits();
            self.n += 1;
        } else {
            self.too_many = true;
        }
        self
    }

    /// Enqueues the launch on the node's stream.
    ///
    /// # Safety
    /// The arguments must match the kernel's parameters in number, order and size, and the
    /// kernel must only access memory that stays valid until it ends (buffers owned by this
    /// node's inputs or outputs, which outlive the graph's GPU work).
    pub unsafe fn launch(mut self) -> GpuResult<()> {
        if self.too_many {
            return Err(GpuError::new(
                GpuErrorKind::InvalidArgument,
                format!(
                    "{}: kernel '{}' given more than {MAX_KERNEL_ARGS} arguments",
                    self.ctx.what(),
                    self.kernel.name()
                ),
            ));
        }
        let b = self.ctx.b;
        let f = match b.cached_function(self.kernel) {
            Some(f) => f,
            None => self.load_function()?,
        };
        // One pointer per argument, to its slot: the driver reads the parameter's size from
        // there (a slot holds the value's little-endian bytes in its low bytes, `KernelArg`).
        let mut params = [std::ptr::null_mut::<std::ffi::c_void>(); MAX_KERNEL_ARGS];
        for (p, a) in params.iter_mut().zip(self.args[..self.n].iter_mut()) {
            *p = (a as *mut u64).cast();
        }
        // SAFETY: one pointer per argument, each to its 8-byte slot, alive for the call (the
        // driver copies the values at the launch); that they match the kernel's parameters, and
        // the validity of its accesses, is the caller's contract.
        let r = unsafe {
            driver::launch_kernel(
                b.ctx,
                &f,
                self.cfg.grid,
                self.cfg.block,
                self.cfg.shared_mem_bytes,
                self.ctx.stream,
                &mut params[..self.n],
            )
        };
        r.map_err(|e| self.ctx.fail("cuLaunchKernel", e))
    }

    /// A kernel's first launch on this worker: looks its function up (loading the module on
    /// the device's first use), outside the capture's view (relaxed mode) under a capture.
    #[cold]
    fn load_function(&self) -> GpuResult<Ref<'a, CudaFunction>> {
        let b = self.ctx.b;
        match self.ctx.capture {
            Some(c) => {
                let mode = c.relax(self.ctx)?;
                let r = b.load_function(self.kernel);
                c.unrelax(self.ctx, mode, false)?;
                r
            }
            None => b.load_function(self.kernel),
        }
        .map_err(|e| e.prefixed(&self.ctx.what()))
    }
}
