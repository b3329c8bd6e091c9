//! The Cholesky's error type.

use std::fmt;

use boundpool_gpu::{GpuError, GpuErrorKind};

/// Why [`CholeskyPlan::build`](super::CholeskyPlan::build) could not make the graph (kind
/// `InvalidArgument`: a bad size; `Scheduler`: the graph did not build), why its check node
/// failed (kind `Library`: a POTRF's `info` says its tile was not positive definite), or why a
/// tile routine did ([`super::TileBlas`], [`super::potrf`]: kind `Library` or `OutOfMemory`
/// for a library status, `InvalidArgument` for operands that do not fit, a `boundpool-gpu`
/// error's kind for a handle that could not be lent). Its kinds and messages are those of the
/// [`boundpool_gpu::GpuError`] it was while the factorization and its routines lived in that
/// crate.
#[derive(Debug)]
pub struct CholeskyError {
    kind: GpuErrorKind,
    message: String,
    source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
}

impl CholeskyError {
    pub(crate) fn new(kind: GpuErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
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

    /// The kind of failure.
    pub fn kind(&self) -> GpuErrorKind {
        self.kind
    }

    /// The full message (same as `Display`).
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for CholeskyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for CholeskyError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

impl From<GpuError> for CholeskyError {
    /// A `boundpool-gpu` call's error (a library handle that could not be lent, say), its kind
    /// and message kept, the error itself as `source()`.
    fn from(e: GpuError) -> Self {
        Self::new(e.kind(), e.message()).with_source(e)
    }
}
