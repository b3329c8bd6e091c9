//! What a graph's records cost: [`estimate_graph_bytes`], the figure a caller checks a graph's
//! size against before building it.

/// A node's record in the plan (`NodeSpec`: body pointer, two successors, in-degree, flags).
const RECORD: usize = 24;
/// Its name: the end offset in the packed name table, and a name of up to 16 bytes.
const NAME: usize = 4 + 16;
/// Its release class, its bit in the builder's has-a-predecessor set (rounded up to a byte),
/// its index in the sources and in the valued nodes.
const INDEXES: usize = 1 + 1 + 4 + 4;
/// Its body's block: the vtable pointer and up to 16 bytes of captured state.
const BODY: usize = 8 + 16;
/// One run's share: the dependency counter, the output slot, the slot's `NodeOutput` box, the
/// value's box (an output of up to 8 bytes) and its entry in the `GraphOutput`.
const RUN: usize = 4 + 8 + 16 + 8 + 24;
/// Its start offset in the predecessor lists, and `build`'s cycle check (remaining in-degree,
/// the ready stack).
const TRAVERSAL: usize = 4 + 8;

/// Bytes a node costs (see [`estimate_graph_bytes`]).
const NODE_BYTES: usize = RECORD + NAME + INDEXES + BODY + RUN + TRAVERSAL;
/// Bytes an edge costs: the builder's list of edges past a node's second successor, the
/// plan's successor lists, the predecessor lists, a wide join's leaf counters (a 128-byte
/// line per 128 predecessors).
const EDGE_BYTES: usize = 8 + 4 + 4 + 1;

/// About how many bytes the library allocates for a graph of `nodes` nodes and `edges` edges:
/// the [`GraphBuilder`](crate::GraphBuilder), [`build`](crate::GraphBuilder::build)'s
/// temporaries, the frozen graph and one run's counters, output slots and
/// [`GraphOutput`](crate::GraphOutput). Saturates at `usize::MAX` instead of overflowing.
///
/// A caller can refuse a size before building anything (the `boundpool run` command line
/// compares it with the machine's memory). It is `nodes × 150 + edges × 17`, an upper bound
/// for nodes whose names are at most 16 bytes, whose bodies capture at most 16 bytes and
/// whose outputs are at most 8 bytes; larger names, captures and outputs cost their size on
/// top, and each run in flight at once costs its share (60 bytes a node) again. On the
/// built-in shapes (chain, tree, wide, wavefront, random: 1 to 2 edges a node) the peak
/// measured while building and running a graph is 0.85 to 0.9 of the estimate for nodes that
/// return a value and 0.35 to 0.4 for nodes that return `()` (which store nothing), checked in
/// `tests/graph_memory.rs`.
///
/// ```
/// use boundpool_scheduler::estimate_graph_bytes;
///
/// assert!(estimate_graph_bytes(1_000_000, 2_000_000) < 200 << 20);
/// assert_eq!(estimate_graph_bytes(usize::MAX, 1), usize::MAX);
/// ```
pub fn estimate_graph_bytes(nodes: usize, edges: usize) -> usize {
    nodes
        .saturating_mul(NODE_BYTES)
        .saturating_add(edges.saturating_mul(EDGE_BYTES))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn estimate_is_linear_and_saturates() {
        assert_eq!(NODE_BYTES, 150);
        assert_eq!(EDGE_BYTES, 17);
        assert_eq!(estimate_graph_bytes(0, 0), 0);
        assert_eq!(estimate_graph_bytes(10, 20), 10 * 150 + 20 * 17);
        assert_eq!(estimate_graph_bytes(usize::MAX / 2, 0), usize::MAX);
        assert_eq!(estimate_graph_bytes(0, usize::MAX), usize::MAX);
        assert_eq!(
            estimate_graph_bytes(usize::MAX / 150, usize::MAX / 17),
            usize::MAX
        );
    }
}
