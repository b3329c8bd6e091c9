//! Diagnostics: the context-check counters and the free-memory probe.

use crate::driver;
use crate::error::{GpuError, GpuResult};

/// Context checking: when on, every driver call the framework makes that needs a context first
/// reads `cuCtxGetCurrent` and counts the calls made with no or the wrong context current.
/// On by default in debug builds; tests turn it on explicitly in release builds too. Costs one
/// relaxed atomic load per driver call when off.
pub mod context_check {
    /// Turns checking on or off for the whole process.
    pub fn set_enabled(on: bool) {
        crate::driver::set_checking(on)
    }
    /// Whether checking is on.
    pub fn enabled() -> bool {
        crate::driver::checking()
    }
    /// Driver calls checked so far.
    pub fn checked_calls() -> u64 {
        crate::driver::checked_calls()
    }
    /// Driver calls made with no context or the wrong one current (must stay zero).
    pub fn wrong_context_calls() -> u64 {
        crate::driver::wrong_calls()
    }
    /// Descriptions of the first wrong calls (call, thread, contexts).
    pub fn wrong_context_samples() -> Vec<String> {
        crate::driver::wrong_samples()
    }
}

/// Measures device `ordinal`'s free memory in bytes from a short-lived helper thread that binds
/// the primary context (which must be retained by someone, e.g. a [`MemoryProbe`]).
#[derive(Debug)]
pub struct MemoryProbe {
    ctx: driver::Ctx,
    /// The retain, released on drop (`None` only during the drop).
    primary: Option<driver::PrimaryCtx>,
}

impl MemoryProbe {
    /// Retains device `ordinal`'s primary context for as long as the probe lives, so that free
    /// memory can be compared across pools (a pool's own retain/release then does not create
    /// and destroy the context).
    pub fn new(ordinal: i32) -> GpuResult<Self> {
        crate::detect::detect()?;
        let what = format!("memory probe, device {ordinal}");
        let dev =
            driver::device_get(ordinal).map_err(|e| GpuError::driver("cuDeviceGet", &what, e))?;
        let ctx = driver::primary_ctx_retain(dev)
            .map_err(|e| GpuError::driver("cuDevicePrimaryCtxRetain", &what, e))?;
        Ok(Self {
            ctx: ctx.ctx(),
            primary: Some(ctx),
        })
    }

    /// Free device memory in bytes (`cuMemGetInfo` on a helper thread bound to the context).
    pub fn free_memory(&self) -> GpuResult<usize> {
        let ctx = self.ctx;
        std::thread::scope(|s| {
            s.spawn(move || {
                driver::ctx_set_current(ctx)
                    .map_err(|e| GpuError::driver("cuCtxSetCurrent", "memory probe", e))?;
                let r = driver::mem_get_info(ctx)
                    .map_err(|e| GpuError::driver("cuMemGetInfo", "memory probe", e));
                let _ = driver::ctx_unbind();
                r.map(|(f, _)| f)
            })
            .join()
            .unwrap_or_else(|_| {
                Err(GpuError::new(
                    crate::GpuErrorKind::Driver,
                    "probe thread panicked",
                ))
            })
        })
    }
}

impl Drop for MemoryProbe {
    fn drop(&mut self) {
        if let Some(p) = self.primary.take() {
            let _ = p.release();
        }
    }
}
