//! The frozen graph: `Plan`, its 24-byte node records (`NodeSpec`: body, in-degree, placement,
//! flags, up to two successors inline), the release classes (a byte a node), the packed name
//! table, predecessor lists built on first use, and the body of an inlined subgraph's node. What
//! a run reads.

use std::sync::{Arc, OnceLock};

use super::joins::{CounterCache, WideJoins};
use super::memory::{too_large, zeros, AllocFailure};
use crate::body::{NodeBody, ThinBody};
use crate::ctx::{Inputs, NodeCtx};
use crate::error::{bounded, BoxError, Error};
use crate::ids::{DomainId, GroupId, NodeId, Placement, Priority, ANY_GROUP, PLACEMENT_MASK};
use crate::trace::PlanNames;

/// A node of an inlined subgraph: the body lives in the subgraph's plan, and the `NodeRef`s it
/// captured map to this graph through `origin` and `base`.
pub(crate) struct InlinedBody<S> {
    pub(crate) plan: Arc<Plan<S>>,
    pub(crate) index: u32,
    /// The graph whose builder created the body: `NodeRef`s the body captured carry it.
    pub(crate) origin: u32,
    /// Where the origin graph's node 0 sits in this graph.
    pub(crate) base: u32,
}

impl<S: Send + 'static> NodeBody<S> for InlinedBody<S> {
    fn run(&self, ctx: &NodeCtx<'_, S>) -> Result<(), BoxError> {
        self.plan.nodes[self.index as usize].body.run(ctx)
    }

    fn run_inputs(&self, inputs: &Inputs<'_>) -> Result<(), BoxError> {
        self.plan.nodes[self.index as usize].body.run_inputs(inputs)
    }
}

/// The highest group and the highest domain nodes are placed on (with a node placed there),
/// checked against a pool at submit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct MaxPlacement {
    pub(crate) group: Option<(u32, GroupId)>,
    pub(crate) domain: Option<(u32, DomainId)>,
}

impl MaxPlacement {
    pub(super) fn note(&mut self, node: u32, p: Placement) {
        match p {
            Placement::Any => {}
            Placement::Group(g) => {
                if self.group.is_none_or(|(_, m)| g > m) {
                    self.group = Some((node, g));
                }
            }
            Placement::Domain(d) => {
                if self.domain.is_none_or(|(_, m)| d > m) {
                    self.domain = Some((node, d));
                }
            }
        }
    }
}
/// How `NodeSpec::succ` holds the successors: 0, 1 or 2 inline, or `SUCC_EXTERNAL`.
pub(super) const SUCC_SHIFT: u32 = 24;
pub(super) const SUCC_MASK: u32 = 3 << SUCC_SHIFT;
/// `succ` is `[start, len]` in `Plan::ext`.
pub(super) const SUCC_EXTERNAL: u32 = 3;
/// A CPU-heavy node ([`GraphBuilder::cpu_node`]).
pub(super) const FLAG_CPU: u32 = 1 << 26;
/// The body returns `()`: nothing to store.
pub(super) const FLAG_UNIT: u32 = 1 << 27;
/// The body is an [`InlinedBody`].
pub(super) const FLAG_INLINED: u32 = 1 << 28;
/// The node's one successor has this node as its only predecessor and may run wherever this
/// node runs: it is the node's continuation, with no check at run time (set by `build`).
pub(super) const FLAG_CHAIN: u32 = 1 << 29;
/// The node's priority level ([`Priority::bits`]: 0 is normal), resolved by `build` from the
/// graph's priority and the node's override.
pub(super) const PRIO_SHIFT: u32 = 30;
pub(crate) const PRIO_MASK: u32 = 3 << PRIO_SHIFT;

/// One node of a graph, 24 bytes: its body, how many predecessors it waits for, its placement
/// and flags, and its successors (up to two inline, more in the plan's `ext` list). Everything
/// the scheduler reads to run a node and release its successors sits in this one record, and a
/// successor's record is the one read next when it runs as the continuation, so a chain or a
/// tree touches one record per node instead of several arrays.
pub(crate) struct NodeSpec<S> {
    pub(crate) body: ThinBody<S>,
    /// Up to two successors inline (while building: the first two), or `[start, len]` in the
    /// plan's `ext` list (see `SUCC_MASK`).
    pub(super) succ: [u32; 2],
    /// Number of predecessors (edges into this node, repeated edges counted each time).
    pub(crate) indegree: u32,
    /// Placement and flags (`PLACEMENT_MASK`, `SUCC_MASK`, `FLAG_*`).
    pub(super) meta: u32,
}

impl<S> NodeSpec<S> {
    pub(super) fn new(body: ThinBody<S>, flags: u32) -> Self {
        NodeSpec {
            body,
            succ: [0; 2],
            indegree: 0,
            meta: ANY_GROUP | flags,
        }
    }

    #[inline]
    pub(crate) fn is_cpu(&self) -> bool {
        self.meta & FLAG_CPU != 0
    }

    #[inline]
    pub(crate) fn is_unit(&self) -> bool {
        self.meta & FLAG_UNIT != 0
    }

    /// The node's continuation, if it is a link of a chain (see `FLAG_CHAIN`).
    #[inline(always)]
    pub(crate) fn chain_successor(&self) -> Option<u32> {
        (self.meta & FLAG_CHAIN != 0).then_some(self.succ[0])
    }

    /// The node's successors when it has at most two, inline in the record; `None` for an
    /// external list.
    #[inline(always)]
    pub(crate) fn inline_successors(&self) -> Option<&[u32]> {
        match self.succ_mode() {
            SUCC_EXTERNAL => None,
            k => Some(&self.succ[..k as usize]),
        }
    }

    #[inline]
    pub(super) fn succ_mode(&self) -> u32 {
        (self.meta & SUCC_MASK) >> SUCC_SHIFT
    }

    pub(super) fn set_succ_mode(&mut self, mode: u32) {
        self.meta = (self.meta & !SUCC_MASK) | (mode << SUCC_SHIFT);
    }

    /// Where this node may run.
    #[inline]
    pub(crate) fn placement(&self) -> Placement {
        Placement::from_bits(self.meta & PLACEMENT_MASK)
    }

    /// The raw placement (`ANY_GROUP`, a group index, or `DOMAIN_BIT` | a domain index), for
    /// comparing two nodes'.
    #[inline]
    pub(crate) fn placement_bits(&self) -> u32 {
        self.meta & PLACEMENT_MASK
    }

    /// The node's priority level.
    #[inline]
    pub(crate) fn priority(&self) -> Priority {
        Priority::from_bits((self.meta & PRIO_MASK) >> PRIO_SHIFT)
    }

    /// Whether the node is of another level than normal (one test of bits already loaded).
    #[inline(always)]
    pub(crate) fn is_prioritized(&self) -> bool {
        self.meta & PRIO_MASK != 0
    }

    pub(super) fn set_priority(&mut self, p: Priority) {
        self.meta = (self.meta & !PRIO_MASK) | (p.bits() << PRIO_SHIFT);
    }

    pub(super) fn set_placement_bits(&mut self, p: u32) {
        self.meta = (self.meta & !PLACEMENT_MASK) | p;
    }
}

impl<S: Send + 'static> NodeSpec<S> {
    /// The node's body as an inlined subgraph's node, if it is one.
    #[inline]
    pub(crate) fn inlined(&self) -> Option<&InlinedBody<S>> {
        if self.meta & FLAG_INLINED == 0 {
            return None;
        }
        self.body.downcast_ref::<InlinedBody<S>>()
    }

    /// (origin, base): the graph whose builder created the body, and where that graph's node 0
    /// sits in the graph `uid` this node belongs to.
    #[inline]
    pub(crate) fn origin_base(&self, uid: u32) -> (u32, u32) {
        self.inlined().map_or((uid, 0), |b| (b.origin, b.base))
    }
}

/// The successors of node `i`: inline in its record or in `ext`.
#[inline]
pub(super) fn successors_of<'a, S>(nodes: &'a [NodeSpec<S>], ext: &'a [u32], i: u32) -> &'a [u32] {
    let spec = &nodes[i as usize];
    match spec.succ_mode() {
        SUCC_EXTERNAL => {
            let [start, len] = spec.succ;
            &ext[start as usize..start as usize + len as usize]
        }
        k => &spec.succ[..k as usize],
    }
}

impl<S: Send + 'static> PlanNames for Plan<S> {
    fn graph_name(&self) -> &Arc<str> {
        &self.name
    }
    fn node_name(&self, node: u32) -> &str {
        &self.names[node as usize]
    }
}

/// A validated graph: node records (bodies, degrees, placements, inline successors), the
/// successor lists of nodes with more than two, sources, names.
pub(crate) struct Plan<S> {
    pub(crate) uid: u32,
    pub(crate) name: Arc<str>,
    pub(crate) nodes: Box<[NodeSpec<S>]>,
    /// Successor lists of the nodes that have more than two (`SUCC_EXTERNAL`).
    pub(super) ext: Box<[u32]>,
    /// Number of edges.
    pub(crate) edges: usize,
    /// Some node has more than one predecessor.
    pub(crate) joins: bool,
    /// (start, list), built from the successor lists the first time a node asks for its
    /// predecessors: graphs whose nodes never read inputs never pay for them.
    pub(super) preds: OnceLock<Csr>,
    /// The joins with many predecessors and their leaf counters, built by the first run.
    pub(crate) wide_joins: OnceLock<WideJoins>,
    /// Dependency counters left by runs that succeeded, counted on by the next runs.
    pub(crate) counters: CounterCache,
    pub(crate) names: NameTable,
    pub(crate) sources: Box<[u32]>,
    /// Nodes whose output is not `()`: the ones copied into a `GraphOutput`.
    pub(crate) valued: Box<[u32]>,
    pub(super) max_placement: MaxPlacement,
    /// The builder's graph priority and node overrides (kept for inlining this graph).
    pub(crate) priority: Priority,
    pub(super) prio_overrides: Box<[(u32, Priority)]>,
    /// One bit per node a backend marked as a device node (empty: none).
    pub(super) device_nodes: Box<[u64]>,
    /// Some node is not of the normal level.
    pub(crate) prioritized: bool,
    /// Each node's release class ([`CLASS_ONE`], [`CLASS_TWO`], [`CLASS_RECORD`]), one byte a
    /// node, so that a predecessor releasing it does not read its 24-byte record.
    pub(crate) classes: Box<[u8]>,
}

/// Release class: one predecessor, placed anywhere, normal level. A predecessor that completes
/// releases it without a counter and may run it as its continuation, on any worker.
pub(crate) const CLASS_ONE: u8 = 1;
/// Release class: two predecessors, placed anywhere, normal level (a wavefront's cells).
pub(crate) const CLASS_TWO: u8 = 2;
/// Release class of every other node: the releasing worker reads the node's record.
pub(crate) const CLASS_RECORD: u8 = 0;

/// The release classes of `nodes` (see [`Plan::classes`]). The successor of a release is read
/// from the releasing node's record, but deciding whether it is ready and where it goes needed
/// the successor's own record too: with the successor run on another worker (a wavefront's
/// next row), that record's line was first read by the releasing worker and then fetched from
/// its cache by the running one. A byte array shares a line among 64 nodes instead of 2.7.
pub(super) fn release_classes<S>(nodes: &[NodeSpec<S>]) -> Result<Box<[u8]>, AllocFailure> {
    let mut classes = Vec::new();
    (classes.try_reserve_exact(nodes.len()))
        .map_err(|_| AllocFailure::of::<u8>("release classes", nodes.len()))?;
    classes.extend(nodes.iter().map(|spec| {
        if spec.placement_bits() != ANY_GROUP || spec.is_prioritized() {
            CLASS_RECORD
        } else {
            match spec.indegree {
                1 => CLASS_ONE,
                2 => CLASS_TWO,
                _ => CLASS_RECORD,
            }
        }
    }));
    Ok(classes.into_boxed_slice())
}

/// (start offsets, list): compressed adjacency lists.
pub(super) type Csr = (Box<[u32]>, Box<[u32]>);

/// Node names packed into one string: a node costs 4 bytes plus its name's bytes, where a
/// `Cow<str>` per node would cost 24 (building a large graph is mostly writing memory).
#[derive(Default)]
pub(crate) struct NameTable {
    text: String,
    /// End of each name in `text`.
    ends: Vec<u32>,
}

impl NameTable {
    /// Room for `n` more names of a byte each (`GraphBuilder::with_capacity`).
    pub(super) fn reserve_exact(&mut self, n: usize) -> Result<(), AllocFailure> {
        (self.text.try_reserve_exact(n)).map_err(|_| AllocFailure::of::<u8>("node names", n))?;
        (self.ends.try_reserve_exact(n)).map_err(|_| AllocFailure::of::<u32>("node names", n))
    }

    /// Room for one more name of `len` bytes (its end: see [`reserve_ends`](Self::reserve_ends)).
    #[inline(always)]
    pub(super) fn reserve_text(&mut self, len: usize) -> Result<(), AllocFailure> {
        if self.text.capacity() - self.text.len() >= len {
            return Ok(());
        }
        let want = self.text.len().saturating_add(len);
        (self.text.try_reserve(len)).map_err(|_| AllocFailure::of::<u8>("node names", want))
    }

    /// Room for the ends of `n` names in all.
    pub(super) fn reserve_ends(&mut self, n: usize) -> Result<(), AllocFailure> {
        let more = n.saturating_sub(self.ends.len());
        (self.ends.try_reserve_exact(more)).map_err(|_| AllocFailure::of::<u32>("node names", n))
    }

    #[inline]
    pub(super) fn push(&mut self, name: &str) {
        self.text.push_str(name);
        let end = u32::try_from(self.text.len()).expect("a graph's node names total under 4 GiB");
        self.ends.push(end);
    }

    pub(super) fn shrunk(mut self) -> Self {
        self.text.shrink_to_fit();
        self.ends.shrink_to_fit();
        self
    }
}

impl std::ops::Index<usize> for NameTable {
    type Output = str;

    #[inline]
    fn index(&self, i: usize) -> &str {
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        &self.text[start..self.ends[i] as usize]
    }
}

/// Predecessor lists in compressed form, from the successor lists of `n` nodes.
pub(super) fn build_predecessors<'a>(
    n: usize,
    successors: impl Fn(u32) -> &'a [u32],
) -> Result<Csr, AllocFailure> {
    let mut start = zeros(n + 1, "predecessor lists")?;
    for f in 0..n as u32 {
        for &t in successors(f) {
            start[t as usize + 1] += 1;
        }
    }
    for i in 0..n {
        start[i + 1] += start[i];
    }
    let mut fill = Vec::new();
    (fill.try_reserve_exact(n)).map_err(|_| AllocFailure::of::<u32>("predecessor lists", n))?;
    fill.extend_from_slice(&start[..n]);
    let mut list = zeros(start[n] as usize, "predecessor lists")?;
    for f in 0..n as u32 {
        for &t in successors(f) {
            list[fill[t as usize] as usize] = f;
            fill[t as usize] += 1;
        }
    }
    Ok((start.into_boxed_slice(), list.into_boxed_slice()))
}

impl<S> Plan<S> {
    /// Whether a backend marked node `i` as a device node.
    #[inline]
    pub(crate) fn is_device_node(&self, i: u32) -> bool {
        self.device_nodes
            .get(i as usize / 64)
            .is_some_and(|w| w & (1 << (i % 64)) != 0)
    }

    /// Node `i`'s release class (see [`Plan::classes`]).
    #[inline(always)]
    pub(crate) fn class(&self, i: u32) -> u8 {
        self.classes[i as usize]
    }

    #[inline]
    pub(crate) fn successors(&self, i: u32) -> &[u32] {
        successors_of(&self.nodes, &self.ext, i)
    }

    /// Node `i`'s direct predecessors. The lists are built the first time a node asks (a graph
    /// whose nodes never read inputs never pays for them); lists that cannot be allocated are
    /// an [`ErrorKind::TooLarge`](crate::error::ErrorKind::TooLarge) error.
    #[inline]
    pub(crate) fn try_predecessors(&self, i: u32) -> Result<&[u32], Error> {
        let (start, list) = match self.preds.get() {
            Some(csr) => csr,
            None => self.init_predecessors()?,
        };
        let i = i as usize;
        Ok(&list[start[i] as usize..start[i + 1] as usize])
    }

    #[cold]
    fn init_predecessors(&self) -> Result<&Csr, Error> {
        let csr = build_predecessors(self.nodes.len(), |f| self.successors(f))
            .map_err(|f| too_large(&self.name, self.nodes.len(), self.edges, f))?;
        // Two nodes may build them at once: one set is kept, the other dropped.
        let _ = self.preds.set(csr);
        Ok(self.preds.get().expect("set just now"))
    }

    /// [`try_predecessors`](Self::try_predecessors) where no error can be returned: lists that
    /// cannot be allocated are a panic with its message (in a node body, the node's failure).
    #[inline]
    pub(crate) fn predecessors(&self, i: u32) -> &[u32] {
        self.try_predecessors(i).unwrap_or_else(|e| panic!("{e}"))
    }

    /// A node with the highest group placement, for checking placements against a pool.
    pub(crate) fn max_placement(&self) -> Option<(u32, GroupId)> {
        self.max_placement.group
    }

    /// A node with the highest domain placement, for checking placements against a pool.
    pub(crate) fn max_domain(&self) -> Option<(u32, DomainId)> {
        self.max_placement.domain
    }

    pub(super) fn sinks(&self) -> Vec<u32> {
        (0..self.nodes.len() as u32)
            .filter(|&i| self.successors(i).is_empty())
            .collect()
    }

    /// The index of `id` if it is a node of this plan.
    pub(crate) fn check(&self, id: NodeId) -> Option<u32> {
        (id.graph == self.uid && (id.index as usize) < self.nodes.len()).then_some(id.index)
    }

    pub(crate) fn describe(&self, i: u32) -> String {
        format!(
            "node '{}' (#{}) of graph '{}'",
            bounded(&self.names[i as usize]),
            i,
            bounded(&self.name)
        )
    }
}
