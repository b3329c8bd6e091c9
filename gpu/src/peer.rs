//! A node reading a buffer of another device: in place where the pair supports peer access (the
//! owner's memory pool grants it at the first read), else through a copy on the node's stream
//! (`cuMemcpyPeerAsync`, after the node's event waits); either way the buffer's release waits
//! for the reader ([`ReaderFence`]s, `device.rs`: recorded right after a copy, or after the
//! node's body for a read in place).
//!
//! A buffer of another pool's table of the same device (two pools on one GPU: one context) is
//! read in place, fenced the same way: that pool's release queue does not know this one's
//! streams. That is the case the one-GPU tests exercise.

use std::ops::Deref;
use std::sync::Arc;

use crate::buffer::{DeviceBuffer, DeviceCopy};
use crate::device::ReaderFence;
use crate::driver;
use crate::error::{GpuError, GpuErrorKind, GpuResult};
use crate::node::GpuCtx;

/// A buffer where a node's kernels can read it ([`GpuCtx::on_device`]): the buffer itself, or
/// a copy on the node's device. Dereferences to the [`DeviceBuffer`] to read.
#[derive(Debug)]
pub enum OnDevice<'b, T: DeviceCopy> {
    /// The buffer itself: of this device, or of one whose memory this device reads directly.
    Here(&'b DeviceBuffer<T>),
    /// A copy on this node's device, made on the node's stream.
    Copied(DeviceBuffer<T>),
}

impl<T: DeviceCopy> OnDevice<'_, T> {
    /// Whether the data was copied to this node's device.
    pub fn is_copy(&self) -> bool {
        matches!(self, OnDevice::Copied(_))
    }
}

impl<T: DeviceCopy> Deref for OnDevice<'_, T> {
    type Target = DeviceBuffer<T>;

    fn deref(&self) -> &DeviceBuffer<T> {
        match self {
            OnDevice::Here(b) => b,
            OnDevice::Copied(b) => b,
        }
    }
}

impl GpuCtx<'_, '_> {
    /// `src`, a node input, where this node's kernels and library calls can read it. A buffer
    /// of this node's device is itself; one of another device is itself too when this device
    /// can reach its memory directly (peer access, asked once per pair: NVLink or PCIe
    /// peer-to-peer), else a copy made on this node's stream (`cuMemcpyPeerAsync`, after the
    /// node's waits for its predecessors: the graph's edge orders it after `src`'s writer).
    /// Either way `src`'s release waits for this node's work on its device (read in place: a
    /// fence recorded after the body; dropped meanwhile, the buffer is freed only once the
    /// fence is in). Refused under a replay capture for a buffer of another device.
    pub fn on_device<'b, T: DeviceCopy>(
        &self,
        src: &'b DeviceBuffer<T>,
    ) -> GpuResult<OnDevice<'b, T>> {
        if Arc::ptr_eq(&src.device, &self.b.device) {
            return Ok(OnDevice::Here(src));
        }
        self.refuse_peer_under_capture()?;
        if self.b.device.reads_in_place(&src.device) {
            let readers = src.readers.get_or_init(Default::default);
            let mut v = self.peer_reads.borrow_mut();
            if !v.iter().any(|r| Arc::ptr_eq(r, readers)) {
                readers.begin_read();
                v.push(readers.clone());
            }
            return Ok(OnDevice::Here(src));
        }
        let mut copy = self.alloc::<T>(src.len())?;
        self.copy_peer(src, &mut copy)?;
        Ok(OnDevice::Copied(copy))
    }

    /// Enqueues a copy of `src` (a buffer of any device of the pool, or of another pool) into
    /// `dst` (same length, this node's device) on the node's stream, with `cuMemcpyPeerAsync`
    /// (direct where the devices reach each other, through host memory otherwise; on one device
    /// a plain device copy). A buffer of another device's table gets a fence right after the
    /// copy: its release waits for it, wherever and whenever it is dropped.
    pub fn copy_peer<T: DeviceCopy>(
        &self,
        src: &DeviceBuffer<T>,
        dst: &mut DeviceBuffer<T>,
    ) -> GpuResult<()> {
        let foreign = !Arc::ptr_eq(&src.device, &self.b.device);
        if foreign {
            self.refuse_peer_under_capture()?;
        }
        if !Arc::ptr_eq(&dst.device, &self.b.device) || src.len() != dst.len() {
            return Err(GpuError::new(
                GpuErrorKind::InvalidArgument,
                format!(
                    "{}: peer copy of {} elements of device {} into {} elements of device {} \
                     (the destination must be this node's device, of the same length)",
                    self.what(),
                    src.len(),
                    src.device.ordinal(),
                    dst.len(),
                    dst.device.ordinal()
                ),
            ));
        }
        // SAFETY: both are live allocations of `bytes()` bytes of their devices' contexts;
        // `src` stays allocated until the copy is done: its release waits for the fence
        // recorded below, right after the copy (a buffer of this device's table is freed
        // after the work already enqueued on the device's streams, this copy included); `dst`
        // is freed through this device's queue, after the work enqueued here.
        unsafe {
            driver::memcpy_peer_async(
                self.b.ctx,
                dst.device_ptr(),
                src.device.ctx(),
                src.device_ptr(),
                src.bytes(),
                self.stream,
            )
        }
        .map_err(|e| self.fail_call("cuMemcpyPeerAsync", e))?;
        if foreign {
            let event = self
                .b
                .record_event(self.stream)
                .map_err(|(call, e)| self.fail_call(call, e))?;
            src.readers.get_or_init(Default::default).push(ReaderFence {
                event,
                home: self.b.device.clone(),
            });
        }
        Ok(())
    }

    fn refuse_peer_under_capture(&self) -> GpuResult<()> {
        match self.capture {
            Some(c) => Err(c.refuse(
                self,
                "a buffer of another device (its release must wait for this node, which a \
                 replay would read at every launch)",
            )),
            None => Ok(()),
        }
    }
}
