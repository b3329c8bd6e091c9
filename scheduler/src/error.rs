//! The crate's one error type.

use std::fmt;

/// A boxed error as returned by node bodies and start hooks.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// What went wrong, without the details that [`Error`]'s `Display` gives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A pool setting is invalid (zero workers, an unknown or disallowed core, an empty group).
    InvalidConfig,
    /// A worker's start hook returned an error or panicked; the pool was not built.
    StartHook,
    /// The OS refused to create a worker thread.
    Spawn,
    /// The graph has a cycle; the message names nodes on it.
    Cycle,
    /// An edge or placement refers to a node id that this graph does not have.
    UnknownNode,
    /// An edge refers to a node of another graph.
    ForeignNode,
    /// A node is placed on a worker group this pool does not have.
    UnknownGroup,
    /// A node body returned an error.
    NodeFailed,
    /// A node body panicked.
    NodePanicked,
    /// The graph was cancelled (by [`Pool::shutdown`](crate::Pool::shutdown) with
    /// [`ShutdownMode::Cancel`](crate::ShutdownMode::Cancel)).
    Cancelled,
    /// The pool is shut down and takes no more graphs.
    ShutDown,
    /// A node asked for an input it may not read (not a direct predecessor, wrong type, or no value).
    BadInput,
    /// [`Pool::try_submit`](crate::Pool::try_submit): the pool is at its limit of graphs in
    /// flight ([`PoolBuilder::max_graphs_in_flight`](crate::PoolBuilder::max_graphs_in_flight)).
    WouldBlock,
    /// A graph's records (its builder's, its plan's or a run's) could not be allocated: the
    /// message gives the graph's estimate ([`estimate_graph_bytes`](crate::graph::estimate_graph_bytes))
    /// and the limit it met (the allocation refused, and the machine's memory).
    TooLarge,
    /// A thread could not be placed as asked ([`Pool::keep_off_workers`](crate::Pool::keep_off_workers)):
    /// no core is left free of the pool's workers, or the OS refused the placement (the
    /// message names the cores; `source()` gives the OS error).
    Placement,
}

/// The error type of `boundpool-scheduler`.
///
/// `Display` names the graph, node, worker or setting at fault; [`source`](std::error::Error::source)
/// gives the node's own error for [`ErrorKind::NodeFailed`] and the start hook's for
/// [`ErrorKind::StartHook`].
pub struct Error {
    kind: ErrorKind,
    message: String,
    cancelled: usize,
    source: Option<BoxError>,
}

impl Error {
    pub(crate) fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error {
            kind,
            message: message.into(),
            cancelled: 0,
            source: None,
        }
    }

    pub(crate) fn with_source(mut self, source: BoxError) -> Self {
        self.source = Some(source);
        self
    }

    pub(crate) fn with_cancelled(mut self, cancelled: usize) -> Self {
        self.cancelled = cancelled;
        self
    }

    /// The kind of failure.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// For a failed graph: how many of its nodes never started because the graph failed or
    /// was cancelled. Zero for other errors.
    pub fn cancelled_nodes(&self) -> usize {
        self.cancelled
    }

    /// Takes the node's own error out (for [`ErrorKind::NodeFailed`]), e.g. to downcast it.
    pub fn into_source(self) -> Option<BoxError> {
        self.source
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)?;
        if let Some(src) = &self.source {
            write!(f, ": {src}")?;
        }
        if self.cancelled > 0 {
            write!(f, " ({} node(s) cancelled)", self.cancelled)?;
        }
        Ok(())
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Error")
            .field("kind", &self.kind)
            .field("message", &self.message)
            .field("cancelled", &self.cancelled)
            .field("source", &self.source)
            .finish()
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_ref()
            .map(|e| &**e as &(dyn std::error::Error + 'static))
    }
}

impl Clone for Error {
    /// Clones the error; the source is kept as its message (boxed errors are not `Clone`).
    fn clone(&self) -> Self {
        Error {
            kind: self.kind,
            message: self.message.clone(),
            cancelled: self.cancelled,
            source: self
                .source
                .as_ref()
                .map(|s| Box::new(SourceText(s.to_string())) as BoxError),
        }
    }
}

#[derive(Debug)]
struct SourceText(String);

impl fmt::Display for SourceText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SourceText {}

/// The most characters of one name (a node, graph, group or worker name, a panic message) that
/// an error message quotes; longer ones are cut with `…`, so that no message grows with its input.
pub(crate) const NAME_LIMIT: usize = 64;

/// The most items of a list (a cycle's nodes, cores) that an error message names.
pub(crate) const LIST_LIMIT: usize = 10;

/// `s`, cut to [`NAME_LIMIT`] characters (with `…` when it was longer).
pub(crate) fn bounded(s: &str) -> std::borrow::Cow<'_, str> {
    match s.char_indices().nth(NAME_LIMIT) {
        None => std::borrow::Cow::Borrowed(s),
        Some((cut, _)) => std::borrow::Cow::Owned(format!("{}…", &s[..cut])),
    }
}

/// At most [`LIST_LIMIT`] of the `len` items of `items`, joined by `sep`: the first ones, `…`,
/// and the last ones, so that both ends of a long list stay visible.
pub(crate) fn bounded_list<I>(items: I, len: usize, sep: &str) -> String
where
    I: IntoIterator,
    I::Item: fmt::Display,
{
    let head = if len > LIST_LIMIT {
        LIST_LIMIT - 4
    } else {
        len
    };
    let tail_from = if len > LIST_LIMIT { len - 4 } else { len };
    let mut out = String::new();
    for (i, item) in items.into_iter().enumerate() {
        if i < head || i >= tail_from {
            if !out.is_empty() {
                out.push_str(sep);
            }
            out.push_str(&item.to_string());
        } else if i == head {
            out.push_str(sep);
            out.push('…');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_names_and_lists() {
        assert_eq!(bounded("short"), "short");
        let long = "é".repeat(NAME_LIMIT + 5);
        let cut = bounded(&long);
        assert_eq!(cut.chars().count(), NAME_LIMIT + 1);
        assert!(cut.ends_with('…'));
        assert_eq!(bounded_list(0..3, 3, ", "), "0, 1, 2");
        assert_eq!(
            bounded_list(0..10, 10, ", "),
            "0, 1, 2, 3, 4, 5, 6, 7, 8, 9"
        );
        assert_eq!(
            bounded_list(0..1000, 1000, ", "),
            "0, 1, 2, 3, 4, 5, …, 996, 997, 998, 999"
        );
        assert_eq!(bounded_list(0..0, 0, ", "), "");
    }
}
