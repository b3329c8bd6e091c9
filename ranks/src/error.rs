//! The crate's one error type (a leaf module).

use std::fmt;
use std::sync::Arc;

/// What went wrong, without the details that [`Error`]'s `Display` gives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The rank-annotated graph is invalid: a rank out of range, an unknown datum, a node of
    /// another builder, a cycle (also one that only closes across ranks).
    InvalidGraph,
    /// An edge crosses ranks but its producer's output cannot cross (made with
    /// [`node`](crate::RankGraphBuilder::node), not `plain_node` or `serde_node`).
    CannotCross,
    /// The graph differs between ranks; the message names the first node that differs.
    GraphMismatch,
    /// A node body returned an error; [`Error::rank`] and [`Error::node`] name it.
    NodeFailed,
    /// A node body panicked; [`Error::rank`] and [`Error::node`] name it.
    NodePanicked,
    /// A received value could not be decoded into its node's type (the message names the edge).
    Decode,
    /// Another rank died (killed, panicked outside a node, or silent past the peer timeout).
    PeerDied,
    /// Another rank shut its runtime down while a run still needed it.
    PeerLeft,
    /// The transport (MPI, or the in-process network) failed.
    Transport,
    /// A setting is invalid (the launcher's environment, a size, too few tags).
    InvalidConfig,
    /// An error of the pool underneath (`boundpool-scheduler`); see `source()`.
    Scheduler,
    /// The runtime is shut down, or was poisoned by a dead rank, and takes no more runs.
    ShutDown,
    /// The GPU backend (`boundpool-gpu`) failed outside a node: building a rank's GPU pool (no
    /// device, a missing library such as libnccl, named with the files tried), making its
    /// NCCL communicator, a call or download; see `source()`.
    Gpu,
}

/// The error type of `boundpool-ranks`.
///
/// `Display` names the rank, node, edge or setting at fault; [`rank`](Error::rank) and
/// [`node`](Error::node) give them programmatically. The same failure reads the same on every
/// rank (a node failure is reported by every rank's `wait` naming the rank that ran the node).
#[derive(Clone)]
pub struct Error {
    kind: ErrorKind,
    message: String,
    rank: Option<usize>,
    node: Option<String>,
    source: Option<Arc<dyn std::error::Error + Send + Sync + 'static>>,
}

/// Messages quote at most this many characters of any name or remote text.
const MAX_QUOTE: usize = 200;

/// `s`, cut to [`MAX_QUOTE`] characters (`…` marks a cut).
pub(crate) fn bounded(s: &str) -> std::borrow::Cow<'_, str> {
    if s.chars().count() <= MAX_QUOTE {
        s.into()
    } else {
        let mut t: String = s.chars().take(MAX_QUOTE).collect();
        t.push('…');
        t.into()
    }
}

impl Error {
    pub(crate) fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error {
            kind,
            message: message.into(),
            rank: None,
            node: None,
            source: None,
        }
    }

    pub(crate) fn at_rank(mut self, rank: usize) -> Self {
        self.rank = Some(rank);
        self
    }

    pub(crate) fn at_node(mut self, node: impl Into<String>) -> Self {
        self.node = Some(node.into());
        self
    }

    pub(crate) fn with_source(
        mut self,
        source: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
    ) -> Self {
        self.source = Some(Arc::from(source.into()));
        self
    }

    /// The kind of failure.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The rank at fault: the rank whose node failed, or the rank that died or left.
    pub fn rank(&self) -> Option<usize> {
        self.rank
    }

    /// The name of the node at fault, where there is one.
    pub fn node(&self) -> Option<&str> {
        self.node.as_deref()
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Error");
        d.field("kind", &self.kind).field("message", &self.message);
        if let Some(r) = self.rank {
            d.field("rank", &r);
        }
        if let Some(n) = &self.node {
            d.field("node", n);
        }
        if let Some(s) = &self.source {
            d.field("source", s);
        }
        d.finish()
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|s| s as &(dyn std::error::Error + 'static))
    }
}

impl From<boundpool_scheduler::Error> for Error {
    fn from(e: boundpool_scheduler::Error) -> Self {
        Error::new(ErrorKind::Scheduler, e.to_string()).with_source(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_is_the_message_and_fields_are_kept() {
        let e = Error::new(ErrorKind::NodeFailed, "rank 1: node 'x' failed: boom")
            .at_rank(1)
            .at_node("x");
        assert_eq!(e.to_string(), "rank 1: node 'x' failed: boom");
        assert_eq!(e.rank(), Some(1));
        assert_eq!(e.node(), Some("x"));
        assert_eq!(e.kind(), ErrorKind::NodeFailed);
    }

    #[test]
    fn long_names_are_cut() {
        let long = "n".repeat(1000);
        let b = bounded(&long);
        assert_eq!(b.chars().count(), MAX_QUOTE + 1);
        assert!(b.ends_with('…'));
        assert_eq!(bounded("short"), "short");
    }
}
