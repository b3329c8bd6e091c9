//! [`HostSignal`]: a word of page-locked, mapped host memory that a GPU node's stream writes
//! once the work enqueued before it has completed (`cuStreamWriteValue32`, after a fence), and
//! that any thread reads with a load: a completion a thread that must not call the driver (a
//! communication thread) can watch. The workers' own completion words (`worker.rs`) are the
//! same mechanism, kept per lane.

use std::fmt;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::driver;
use crate::error::GpuResult;
use crate::node::GpuCtx;
use crate::pinned::PinnedBuffer;

/// A 32-bit word of host memory that a node's stream writes after its earlier work
/// ([`GpuCtx::signal`]) and any thread reads without a driver call ([`value`](Self::value)).
/// Made by a GPU node ([`GpuCtx::host_signal`]), starting at 0; freed by a bound worker of its
/// device when dropped anywhere, like a [`PinnedBuffer`].
///
/// A value seen means every copy and kernel enqueued on that stream before the write has
/// completed, and its results in host memory are visible to the reading thread (the write is
/// preceded by a memory fence; the load has acquire order).
pub struct HostSignal {
    word: PinnedBuffer<u32>,
}

impl fmt::Debug for HostSignal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostSignal")
            .field("value", &self.value())
            .finish()
    }
}

impl HostSignal {
    /// The last value a stream wrote (0 before any write).
    pub fn value(&self) -> u32 {
        // SAFETY: the word is page-locked host memory of this signal, 4-byte aligned (an
        // allocation's start), alive while `self` is; the device writes it whole, so an atomic
        // load reads one of the values written.
        unsafe { (*(self.word.host_ptr() as *const AtomicU32)).load(Ordering::Acquire) }
    }
}

impl GpuCtx<'_, '_> {
    /// A new [`HostSignal`] of this node's device, at 0. Refused under a replay capture (a
    /// signal is written at every run, by a node that runs eagerly).
    pub fn host_signal(&self) -> GpuResult<HostSignal> {
        if let Some(c) = self.capture {
            return Err(c.refuse(self, "a host signal belongs to an eager node"));
        }
        let word = self.alloc_pinned::<u32>(1)?;
        // SAFETY: just allocated, no copy of the device can involve it yet.
        unsafe { word.write(&[0])? };
        Ok(HostSignal { word })
    }

    /// Enqueues a write of `value` to `signal` on this node's stream, after everything the node
    /// enqueued there so far (and a memory fence): a thread reading `signal` sees `value` once
    /// that work is done. `signal` must be of this node's device.
    pub fn signal(&self, signal: &HostSignal, value: u32) -> GpuResult<()> {
        if let Some(c) = self.capture {
            return Err(c.refuse(self, "a host signal belongs to an eager node"));
        }
        self.check_pinned_device(&signal.word)?;
        // SAFETY: the word is a live, mapped, 4-byte aligned allocation of this device's
        // context, freed only by a bound worker after the work enqueued before its drop
        // (this write included).
        unsafe {
            driver::stream_write_value32(self.b.ctx, self.stream, signal.word.device_ptr(), value)
        }
        .map_err(|e| self.fail_call("cuStreamWriteValue32", e))
    }
}
