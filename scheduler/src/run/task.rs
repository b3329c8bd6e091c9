//! A queued unit of work: a ready node of a run, a span of a node's successor list still to
//! be released, or the completion of a node whose body handed it to a `Completer`. A task
//! carries one of its run's in-flight units (see the module docs of `run`).

use std::fmt;

use super::RunRef;

/// A ready node of a run, as it sits in a deque or injector, a part of a large node's
/// successor list still to be released (a *span*, see [`Task::span`]), or a node's completion
/// queued by its `Completer` ([`Task::completion`]). Move-only: it stands for one in-flight
/// unit of its run, so it is completed exactly once, by whoever holds it last.
pub(crate) struct Task<S> {
    run: RunRef<S>,
    /// The node (low 32 bits) and the span (high 32 bits): 0 to run the node, otherwise the
    /// chunks `[span >> 16, span & 0xFFFF)` of the node's successor list (see [`span_chunk`]),
    /// which the node completed without releasing them yet, or, with [`COMPLETION`] as its
    /// first chunk (never a span's: `lo < hi <= 0xFFFF`), the node's completion, its low bit
    /// telling whether it succeeded. One word, so that a task is a
    /// pair of scalars passed in two registers, not through the stack to `Worker::push`
    /// (where a 16-byte load of three smaller stores stalled on store forwarding).
    word: u64,
}

/// Nodes with at least this many successors hand them on as spans (`Task::span`) that workers
/// split in halves, instead of queueing every ready successor one by one (issue 14: a million
/// tasks pushed on one deque and stolen one CAS at a time from its one end).
pub(crate) const SPAN_MIN: usize = if cfg!(loom) { 3 } else { 64 };
/// A span of at most this many successors is released by the worker that holds it.
pub(crate) const SPAN_GRAIN: usize = if cfg!(loom) { 1 } else { 32 };

/// The first chunk of a completion task's span part (see [`Task::completion`]).
const COMPLETION: u64 = 0xFFFF;

/// The chunk size of a successor list of `len` nodes: at most 65,535 chunks, so that a span's
/// two ends fit in a `u32`.
#[inline]
pub(crate) fn span_chunk(len: usize) -> usize {
    len.div_ceil(0xFFFF).max(1)
}

// SAFETY: a task is a (run, node) pair; `Run<S>` is shared between workers by design (its mutable
// parts are atomics, locks or slots ordered as documented on `Slot`), and the pointer's validity
// is guaranteed by the in-flight protocol described in the module docs of `run`.
unsafe impl<S> Send for Task<S> {}

impl<S> Task<S> {
    #[inline]
    pub(crate) fn new(run: RunRef<S>, node: u32) -> Self {
        Task {
            run,
            word: node as u64,
        }
    }

    /// A span: chunks `lo..hi` of `node`'s successor list, to be released (`lo < hi <= 0xFFFF`).
    #[inline]
    pub(crate) fn span(run: RunRef<S>, node: u32, lo: usize, hi: usize) -> Self {
        debug_assert!(lo < hi && hi <= 0xFFFF);
        let span = ((lo as u64) << 16) | hi as u64;
        Task {
            run,
            word: (span << 32) | node as u64,
        }
    }

    /// The completion of `node`, whose body returned and whose `Completer` was called after
    /// that (`ok`: with success): whoever takes it completes the node (releases its
    /// successors), as the worker that ran the body would have.
    #[inline]
    pub(crate) fn completion(run: RunRef<S>, node: u32, ok: bool) -> Self {
        let span = (COMPLETION << 16) | ok as u64;
        Task {
            run,
            word: (span << 32) | node as u64,
        }
    }

    /// For a completion task, whether the node succeeded; `None` for a node or span task.
    #[inline]
    pub(crate) fn completed(&self) -> Option<bool> {
        let span = self.word >> 32;
        (span >> 16 == COMPLETION).then_some(span & 1 == 1)
    }

    /// The chunks of a span task, `None` for a node task; a completion task is neither (its
    /// `Some` is not a span: ask [`completed`](Self::completed) first).
    #[inline]
    pub(crate) fn chunks(&self) -> Option<(usize, usize)> {
        let span = (self.word >> 32) as u32;
        (span != 0).then_some(((span >> 16) as usize, (span & 0xFFFF) as usize))
    }

    /// The node to run, or whose successors the span releases.
    #[inline]
    pub(crate) fn node(&self) -> u32 {
        self.word as u32
    }

    /// The run this task belongs to: valid to dereference while this task's unit is held (it is
    /// counted in flight until its node completes).
    #[inline]
    pub(crate) fn run(&self) -> RunRef<S> {
        self.run
    }
}

impl<S> fmt::Debug for Task<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.completed(), self.chunks()) {
            (Some(ok), _) => write!(f, "Task(completion of node #{}, ok: {ok})", self.node()),
            (None, Some((lo, hi))) => write!(f, "Task(span {lo}..{hi} of node #{})", self.node()),
            (None, None) => write!(f, "Task(node #{})", self.node()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::GraphBuilder;
    use crate::run::Run;

    #[test]
    fn node_span_and_completion_words_are_told_apart() {
        let mut g = GraphBuilder::<()>::new("g");
        g.node("a", |_| Ok(()));
        let graph = g.build().unwrap();
        let run = Run::new(1, graph.plan.clone()).unwrap();
        let r = RunRef::new(&run);
        let node = Task::new(r, 7);
        assert_eq!(
            (node.node(), node.chunks(), node.completed()),
            (7, None, None)
        );
        let span = Task::span(r, 7, 0xFFFE, 0xFFFF);
        assert_eq!(span.chunks(), Some((0xFFFE, 0xFFFF)));
        assert_eq!(span.completed(), None);
        for ok in [true, false] {
            let c = Task::completion(r, u32::MAX, ok);
            assert_eq!((c.node(), c.completed()), (u32::MAX, Some(ok)));
            assert!(
                c.chunks().is_some(),
                "a completion is never taken for a node to run"
            );
        }
    }
}
