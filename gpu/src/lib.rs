//! # boundpool-gpu
//!
//! The CUDA backend of boundpool (work in progress).

pub mod baselines;
mod detect;
mod device;
mod diag;
mod driver;
mod error;
mod module;

pub use detect::{device_count, device_info, driver_version, gpu_unavailable_reason};
pub use device::DeviceInfo;
pub use diag::{context_check, probe, MemoryProbe};
pub use error::{GpuError, GpuErrorKind, GpuResult};
pub use module::{builtin, Kernel, Module};
