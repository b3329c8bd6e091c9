//! The crate's one error type (a leaf module).

use std::fmt;

/// What went wrong, without the details that [`SimError`]'s `Display` gives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SimErrorKind {
    /// The graph cannot be lowered (a rank out of range, a cycle, an edge that cannot cross);
    /// `source()` is the ranks crate's error.
    InvalidGraph,
    /// The machine description is inconsistent (no workers, a group the graph names that the
    /// machine lacks, a GPU node on a rank without a GPU, a link without bandwidth).
    InvalidMachine,
    /// The cost model lacks a kind the graph uses, or holds an invalid distribution.
    MissingCost,
    /// A file could not be read or written.
    Io,
    /// A file's content is not what it should be (JSON, a trace, a cost model).
    Parse,
    /// An argument is out of range (a workload's size, a seed's use).
    InvalidArgument,
}

/// The error type of `boundpool-sim`: `Display` names the node, kind, setting or file at
/// fault; `source()` gives the error underneath (the lowering's, an I/O or JSON error).
#[derive(Debug)]
pub struct SimError {
    kind: SimErrorKind,
    message: String,
    source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
}

impl SimError {
    pub(crate) fn new(kind: SimErrorKind, message: impl Into<String>) -> Self {
        SimError {
            kind,
            message: message.into(),
            source: None,
        }
    }

    pub(crate) fn with_source(
        mut self,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        self.source = Some(Box::new(source));
        self
    }

    /// What went wrong.
    pub fn kind(&self) -> SimErrorKind {
        self.kind
    }
}

impl fmt::Display for SimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for SimError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// A `Result` with [`SimError`].
pub type SimResult<T> = Result<T, SimError>;
