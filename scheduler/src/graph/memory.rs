//! What a graph's records cost ([`estimate_graph_bytes`], the figure a caller checks a graph's
//! size against before building it), and their allocation without an abort: the builder, `build`
//! and a run reserve through [`reserve`] and [`filled`], and an allocation that fails becomes
//! an [`ErrorKind::TooLarge`] error naming the estimate and the limit ([`too_large`]).

use std::mem::size_of;

use crate::error::{bounded, Error, ErrorKind};
use crate::sync;

/// A node's record in the plan (`NodeSpec`: body pointer, two successors, in-degree, flags).
const RECORD: usize = 24;
/// Its name: the end offset in the packed name table, and a name of up to 16 bytes.
const NAME: usize = 4 + 16;
/// Its release class, its bit in the builder's has-a-predecessor set (rounded up to a byte),
/// its index in the sources and in the valued nodes.
const INDEXES: usize = 1 + 1 + 4 + 4;
/// Its body's block: the vtable pointer and up to 16 bytes of captured state.
const BODY: usize = 8 + 16;
/// One run's share: the dependency counter, the output slot, the slot's `NodeOutput` box (value,
/// marker, use byte), the value's box (an output of up to 8 bytes) and its entry in the
/// `GraphOutput`.
const RUN: usize = 4 + 8 + 40 + 8 + 24;
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
/// the [`GraphBuilder`](crate::graph::GraphBuilder), [`build`](crate::graph::GraphBuilder::build)'s
/// temporaries, the frozen graph and one run's counters, output slots and
/// [`GraphOutput`](crate::output::GraphOutput). Saturates at `usize::MAX` instead of overflowing.
///
/// A caller can refuse a size before building anything (the `boundpool run` command line
/// compares it with the machine's memory). It is `nodes × 174 + edges × 17`, an upper bound
/// for nodes whose names are at most 16 bytes, whose bodies capture at most 16 bytes and
/// whose outputs are at most 8 bytes; larger names, captures and outputs cost their size on
/// top, and each run in flight at once costs its share (84 bytes a node) again. On the
/// built-in shapes (chain, tree, wide, wavefront, random: 1 to 2 edges a node) the peak
/// measured while building a graph and running it once is about 0.75 to 0.8 of the estimate
/// for nodes that return a value and 0.4 to 0.5 for nodes that return `()` (which store
/// nothing), checked in `tests/graph_memory.rs`.
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

/// An allocation of a graph's records that failed: what it was for and how many bytes it asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct AllocFailure {
    /// What the memory was for ("node records", "output slots", ...).
    pub(crate) what: &'static str,
    /// The bytes asked for, or `None` when the size does not fit an allocation at all.
    pub(crate) bytes: Option<usize>,
}

impl AllocFailure {
    /// The failure of an allocation of `n` elements of `T`.
    pub(crate) fn of<T>(what: &'static str, n: usize) -> Self {
        AllocFailure {
            what,
            bytes: n
                .checked_mul(size_of::<T>())
                .filter(|&b| b <= isize::MAX as usize),
        }
    }
}

/// Makes room for `extra` more elements in `v`, growing it as `push` would, or says what could
/// not be allocated.
#[inline(always)]
pub(crate) fn reserve<T>(
    v: &mut Vec<T>,
    extra: usize,
    what: &'static str,
) -> Result<(), AllocFailure> {
    if v.capacity() - v.len() >= extra {
        return Ok(());
    }
    grow(v, extra, what)
}

#[cold]
#[inline(never)]
fn grow<T>(v: &mut Vec<T>, extra: usize, what: &'static str) -> Result<(), AllocFailure> {
    v.try_reserve(extra)
        .map_err(|_| AllocFailure::of::<T>(what, v.len().saturating_add(extra)))
}

/// `n` copies of `x`, allocated without an abort.
pub(crate) fn filled<T: Clone>(n: usize, x: T, what: &'static str) -> Result<Vec<T>, AllocFailure> {
    let mut v = Vec::new();
    v.try_reserve_exact(n)
        .map_err(|_| AllocFailure::of::<T>(what, n))?;
    v.resize(n, x);
    Ok(v)
}

/// `n` zeros from zeroed memory (see [`sync::zeroed_u32s`]), allocated without an abort.
pub(crate) fn zeros(n: usize, what: &'static str) -> Result<Vec<u32>, AllocFailure> {
    sync::zeroed_u32s(n).ok_or_else(|| AllocFailure::of::<u32>(what, n))
}

/// The error for graph `graph` of `nodes` nodes and `edges` edges whose records could not be
/// allocated: the estimate, what failed, and the limit (the allocation's, and the memory this
/// machine has, where it can be read).
#[cold]
pub(crate) fn too_large(graph: &str, nodes: usize, edges: usize, failure: AllocFailure) -> Error {
    let limit = match failure.bytes {
        None => format!(
            "its {} need more than one allocation can hold ({} bytes)",
            failure.what,
            isize::MAX
        ),
        Some(b) => format!(
            "the allocator refused {} for its {}{}",
            human_bytes(b),
            failure.what,
            machine_memory()
                .map(|(total, available)| format!(
                    "; this machine has {} of memory, {} available",
                    human_bytes(total),
                    human_bytes(available)
                ))
                .unwrap_or_default()
        ),
    };
    Error::new(
        ErrorKind::TooLarge,
        format!(
            "graph '{}' is too large: its records for {nodes} node(s) and {edges} edge(s) need \
             about {} (estimate_graph_bytes), and {limit}",
            bounded(graph),
            human_bytes(estimate_graph_bytes(nodes, edges)),
        ),
    )
}

/// `b` bytes in binary units, 3 significant digits.
fn human_bytes(b: usize) -> String {
    const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut v = b as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    match unit {
        0 => format!("{b} B"),
        _ if v >= 100.0 => format!("{v:.0} {}", UNITS[unit]),
        _ if v >= 10.0 => format!("{v:.1} {}", UNITS[unit]),
        _ => format!("{v:.2} {}", UNITS[unit]),
    }
}

/// (total, available) memory of this machine in bytes, from `/proc/meminfo` (Linux; `None`
/// elsewhere or when it cannot be read). Read only for an error's message.
fn machine_memory() -> Option<(usize, usize)> {
    if cfg!(miri) {
        return None; // no file system under Miri's isolation
    }
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let field = |name: &str| -> Option<usize> {
        let line = info.lines().find(|l| l.starts_with(name))?;
        let kib: usize = line[name.len()..]
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()?;
        kib.checked_mul(1024)
    };
    Some((field("MemTotal:")?, field("MemAvailable:")?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn estimate_is_linear_and_saturates() {
        assert_eq!(NODE_BYTES, 174);
        assert_eq!(EDGE_BYTES, 17);
        assert_eq!(estimate_graph_bytes(0, 0), 0);
        assert_eq!(estimate_graph_bytes(10, 20), 10 * 174 + 20 * 17);
        assert_eq!(estimate_graph_bytes(usize::MAX / 2, 0), usize::MAX);
        assert_eq!(estimate_graph_bytes(0, usize::MAX), usize::MAX);
        assert_eq!(
            estimate_graph_bytes(usize::MAX / 174, usize::MAX / 17),
            usize::MAX
        );
    }

    #[test]
    fn failed_allocations_are_errors_naming_estimate_and_limit() {
        let mut v: Vec<u64> = Vec::new();
        let f = reserve(&mut v, usize::MAX / 4, "node records").unwrap_err();
        assert_eq!(
            f.bytes, None,
            "over isize::MAX bytes: no allocation can hold it"
        );
        // Too large for any address space (Miri reports it as its own resource exhaustion).
        let f = if cfg!(miri) {
            AllocFailure::of::<u32>("dependency counters", 1 << 58)
        } else {
            filled(1 << 58, 0u32, "dependency counters").unwrap_err()
        };
        assert_eq!(f.bytes, Some(1 << 60));
        let e = too_large("g", 1 << 58, 0, f);
        assert_eq!(e.kind(), ErrorKind::TooLarge);
        let msg = e.to_string();
        assert!(
            msg.starts_with(
                "graph 'g' is too large: its records for 288230376151711744 node(s) and 0 \
                 edge(s) need about 16.0 EiB (estimate_graph_bytes), and the allocator refused \
                 1.00 EiB for its dependency counters"
            ),
            "{msg}"
        );
        assert_eq!(human_bytes(1023), "1023 B");
        assert_eq!(human_bytes(3 << 29), "1.50 GiB");
        assert_eq!(human_bytes(200 << 20), "200 MiB");
        assert!(reserve(&mut v, 3, "x").is_ok() && v.capacity() >= 3);
    }
}
