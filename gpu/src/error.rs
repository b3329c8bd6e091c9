//! The crate's error type.

use std::fmt;

use crate::driver::{self, DriverError};

/// What went wrong, broadly.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum GpuErrorKind {
    /// The CUDA driver library (libcuda) could not be loaded: no NVIDIA driver on this machine.
    NoDriver,
    /// The driver loaded but reports no device, or an asked-for ordinal does not exist.
    NoDevice,
    /// A driver call failed; the error names the call and the driver's error string.
    Driver,
    /// The device hit a sticky error earlier (for example an illegal address) and is unusable.
    DeviceFailed,
    /// A device allocation failed for lack of memory (the node fails, the pool goes on).
    OutOfMemory,
    /// A kernel source could not be compiled (NVRTC) or a module/function could not be loaded.
    Compile,
    /// The scheduler reported an error (build, submit, a node's failure).
    Scheduler,
    /// A call was given an argument it cannot use (a wrong length, a foreign device, ...).
    InvalidArgument,
    /// The device's pool has shut down.
    Closed,
    /// A cuBLAS or cuSOLVER call returned an error status (named in the message, e.g.
    /// `CUBLAS_STATUS_INVALID_VALUE`), or `potrf` found a matrix not positive definite.
    Library,
    /// cuBLAS or cuSOLVER could not be loaded (the message names the library).
    LibraryMissing,
    /// A worker state factory (`GpuPoolBuilder::worker_state`) failed on a worker.
    WorkerState,
    /// A replay capture failed (`Replayable`): a node's body did something a CUDA graph cannot
    /// capture (the message names the graph, the node and the operation), or the driver
    /// invalidated the capture. The graph's later runs go eager until `Replayable::update`.
    Capture,
    /// SM partitions could not be made as asked (`GpuPoolBuilder::sm_partitions`): a size the
    /// device cannot give exactly, more SMs than it has, a bad name, or a driver or card
    /// without green contexts (the message names the partition, the device and the limit).
    Partition,
}

/// The error type of `boundpool-gpu`: a kind, a message that names what failed (node, device,
/// driver call), and the driver or scheduler error underneath as [`std::error::Error::source`].
pub struct GpuError {
    kind: GpuErrorKind,
    message: String,
    driver_code: Option<i32>,
    source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
}

impl GpuError {
    pub(crate) fn new(kind: GpuErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            driver_code: None,
            source: None,
        }
    }

    pub(crate) fn with_source(
        mut self,
        source: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
    ) -> Self {
        self.source = Some(source.into());
        self
    }

    /// A failed driver call `call`, made for `what` (e.g. "device 0" or "node 'scale'"; may be
    /// empty), worded as the crate words its own: `what: call failed: NAME (description)`,
    /// of kind [`GpuErrorKind::OutOfMemory`] or [`GpuErrorKind::Driver`], `e` its source. For
    /// code that makes cudarc calls of its own (a node's body) and reports them as this crate
    /// does.
    pub fn driver(call: &str, what: &str, e: DriverError) -> Self {
        let kind = if driver::is_out_of_memory(e) {
            GpuErrorKind::OutOfMemory
        } else {
            GpuErrorKind::Driver
        };
        let mut msg = String::new();
        if !what.is_empty() {
            msg.push_str(what);
            msg.push_str(": ");
        }
        msg.push_str(call);
        msg.push_str(" failed: ");
        msg.push_str(&driver::error_name(e));
        let s = driver::error_string(e);
        if !s.is_empty() {
            msg.push_str(" (");
            msg.push_str(&s);
            msg.push(')');
        }
        Self {
            kind,
            message: msg,
            driver_code: Some(driver::error_code(e)),
            source: Some(Box::new(e)),
        }
    }

    /// The kind of failure.
    pub fn kind(&self) -> GpuErrorKind {
        self.kind
    }

    /// The driver's `CUresult` code, when a driver call failed.
    pub fn driver_code(&self) -> Option<i32> {
        self.driver_code
    }

    /// The full message (same as `Display`).
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Whether the driver error underneath (this error's source, or deeper in the chain) is
    /// a sticky one, after which its context is unusable and every later call in it fails:
    /// what makes boundpool mark a device failed.
    pub fn is_sticky(&self) -> bool {
        driver::sticky_in(self).is_some()
    }

    pub(crate) fn prefixed(mut self, prefix: &str) -> Self {
        self.message = format!("{prefix}: {}", self.message);
        self
    }
}

impl fmt::Display for GpuError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl fmt::Debug for GpuError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GpuError")
            .field("kind", &self.kind)
            .field("message", &self.message)
            .field("driver_code", &self.driver_code)
            .finish()
    }
}

impl std::error::Error for GpuError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// Result alias of this crate.
pub type GpuResult<T> = Result<T, GpuError>;

#[cfg(test)]
mod tests {
    use super::*;
    use cudarc::driver::sys::CUresult::*;

    /// A failed call's error names who made it and the call, has the driver's error as its
    /// source and the kind its code says; sticky codes are sticky (no driver needed: without
    /// one the code's name stands in for the driver's).
    #[test]
    fn driver_errors_name_the_call_and_say_if_sticky() {
        let e = GpuError::driver(
            "cuEventQuery",
            "probe",
            DriverError(CUDA_ERROR_ILLEGAL_ADDRESS),
        );
        assert!(
            e.message().starts_with("probe: cuEventQuery failed: "),
            "{e}"
        );
        assert!(e.message().contains("CUDA_ERROR_ILLEGAL_ADDRESS"), "{e}");
        assert_eq!(e.kind(), GpuErrorKind::Driver);
        assert_eq!(e.driver_code(), Some(CUDA_ERROR_ILLEGAL_ADDRESS as i32));
        assert!(e.is_sticky());
        let source = std::error::Error::source(&e).expect("the driver's error");
        assert_eq!(
            source.downcast_ref::<DriverError>(),
            Some(&DriverError(CUDA_ERROR_ILLEGAL_ADDRESS))
        );
        let oom = GpuError::driver("cuMemAllocAsync", "", DriverError(CUDA_ERROR_OUT_OF_MEMORY));
        assert!(
            oom.message().starts_with("cuMemAllocAsync failed: "),
            "{oom}"
        );
        assert_eq!(oom.kind(), GpuErrorKind::OutOfMemory);
        assert!(!oom.is_sticky());
        assert!(!GpuError::new(GpuErrorKind::Closed, "closed").is_sticky());
    }
}
