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

    /// A failed driver call `call`, with context `what` (e.g. "device 0" or "node 'scale'").
    pub(crate) fn driver(call: &str, what: &str, e: DriverError) -> Self {
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
