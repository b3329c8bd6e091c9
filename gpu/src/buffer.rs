//! Device memory owned by a value that may be dropped on any thread.

use std::fmt;
use std::marker::PhantomData;

use crate::device::{DeviceShared, Release};
use crate::driver::DeviceAlloc;
use std::sync::Arc;

/// Plain data that may be copied to and from the device bit for bit.
///
/// # Safety
/// Every bit pattern of the type's size must be a valid value (no references, no `bool`, no
/// enums with niches, no padding that matters), since device memory is read back as-is.
pub unsafe trait DeviceCopy: Copy + Send + Sync + 'static {}

macro_rules! device_copy {
    ($($t:ty),*) => { $(
        // SAFETY: every bit pattern is a valid value of this primitive.
        unsafe impl DeviceCopy for $t {}
    )* };
}
device_copy!(u8, i8, u16, i16, u32, i32, u64, i64, u128, i128, usize, isize, f32, f64);
// SAFETY: arrays of plain data are plain data.
unsafe impl<T: DeviceCopy, const N: usize> DeviceCopy for [T; N] {}

/// `len` elements of `T` in one device's memory, allocated stream-ordered by a GPU node.
///
/// It can be a node's output (successors receive it by reference; the submitter can take it
/// from the graph's output), and it may be dropped on any thread: the drop makes no driver
/// call; it queues the pointer on its device's release queue and wakes a worker of the device,
/// which frees it after the work already enqueued on the device's streams (see the crate docs).
pub struct DeviceBuffer<T: DeviceCopy> {
    pub(crate) ptr: u64,
    pub(crate) len: usize,
    pub(crate) device: Arc<DeviceShared>,
    _t: PhantomData<T>,
}

impl<T: DeviceCopy> DeviceBuffer<T> {
    /// A buffer over `alloc`, which the device's allocation table owns from now on (the buffer
    /// keeps its address and queues it for release when dropped).
    pub(crate) fn from_alloc(alloc: DeviceAlloc, len: usize, device: Arc<DeviceShared>) -> Self {
        let ptr = device.track_allocation(alloc);
        Self {
            ptr,
            len,
            device,
            _t: PhantomData,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Size in bytes.
    pub fn bytes(&self) -> usize {
        self.len * std::mem::size_of::<T>()
    }

    /// The CUDA ordinal of the device that holds it.
    pub fn device_ordinal(&self) -> i32 {
        self.device.ordinal()
    }

    /// The raw device address (for kernel arguments built by hand).
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }
}

impl<T: DeviceCopy> fmt::Debug for DeviceBuffer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("type", &std::any::type_name::<T>())
            .field("len", &self.len)
            .field("device", &self.device.ordinal())
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .finish()
    }
}

impl<T: DeviceCopy> Drop for DeviceBuffer<T> {
    fn drop(&mut self) {
        // No driver call here: a bound worker of the device frees it. (A drop during a replay
        // capture fails the capture: the graph would replay on freed memory.)
        crate::replay::note_free();
        self.device.release(Release::Mem(self.ptr));
    }
}
