//! Graph building and validation: `GraphBuilder` collects nodes and edges, `build` checks them
//! and freezes them into a `Plan` that any number of runs share.

use std::any::Any;
use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU32 as StdAtomicU32, Ordering as StdOrdering};
use std::sync::{Arc, OnceLock};

use crate::body::{is_unit, CpuFn, NodeBody, ThinBody, WorkerFn};
use crate::ctx::{Inputs, NodeCtx};
use crate::error::{bounded, bounded_list, BoxError, Error, ErrorKind};
use crate::pool::{DomainId, GroupId};
use crate::priority::Priority;

/// A node's output, type-erased.
pub(crate) type AnyValue = Box<dyn Any + Send + Sync>;

/// Hands out a distinct id to every builder so edges between graphs can be told apart.
static NEXT_GRAPH_UID: StdAtomicU32 = StdAtomicU32::new(1);

/// Identifies a node of one graph (untyped). Obtained from [`NodeRef::id`].
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId {
    pub(crate) graph: u32,
    pub(crate) index: u32,
}

impl NodeId {
    /// The node's position in its graph, in the order nodes were added (subgraph nodes
    /// included, at the position they were inlined).
    pub fn index(self) -> usize {
        self.index as usize
    }
}

impl fmt::Debug for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NodeId(graph {}, #{})", self.graph, self.index)
    }
}

/// A typed reference to a node whose body returns `T`. Successors read the value with
/// [`Inputs::input`](crate::Inputs::input), the submitter with [`GraphOutput::get`](crate::GraphOutput::get).
pub struct NodeRef<T> {
    pub(crate) id: NodeId,
    _marker: PhantomData<fn() -> T>,
}

impl<T> NodeRef<T> {
    pub(crate) fn new(id: NodeId) -> Self {
        NodeRef {
            id,
            _marker: PhantomData,
        }
    }

    /// The untyped id.
    pub fn id(&self) -> NodeId {
        self.id
    }
}

impl<T> Clone for NodeRef<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for NodeRef<T> {}

impl<T> fmt::Debug for NodeRef<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NodeRef<{}>({:?})", std::any::type_name::<T>(), self.id)
    }
}

impl<T> From<NodeRef<T>> for NodeId {
    fn from(r: NodeRef<T>) -> NodeId {
        r.id
    }
}

impl<T> From<&NodeRef<T>> for NodeId {
    fn from(r: &NodeRef<T>) -> NodeId {
        r.id
    }
}

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

    fn inlined(&self) -> Option<&InlinedBody<S>> {
        Some(self)
    }
}

/// Bits of [`NodeSpec::meta`]: the placement in the low 24 bits, then the flags.
const PLACEMENT_MASK: u32 = 0x00FF_FFFF;
/// The placement of a node that may run on any worker.
pub(crate) const ANY_GROUP: u32 = PLACEMENT_MASK;
/// Set in a placement that names a domain (its index in the bits below); clear for a group.
pub(crate) const DOMAIN_BIT: u32 = 1 << 23;

/// Where a node may run: any worker, the workers of one group, or the workers of every group of
/// a domain (for example all of a GPU's workers, whatever the number of groups they form).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub enum Placement {
    /// Any worker of the pool.
    #[default]
    Any,
    /// Only workers of this group.
    Group(GroupId),
    /// Any worker of any group of this domain ([`PoolBuilder::domain`](crate::PoolBuilder::domain)).
    Domain(DomainId),
}

impl Placement {
    /// The group, for a node placed on one.
    pub fn group(self) -> Option<GroupId> {
        match self {
            Placement::Group(g) => Some(g),
            _ => None,
        }
    }

    /// The domain, for a node placed on one.
    pub fn domain(self) -> Option<DomainId> {
        match self {
            Placement::Domain(d) => Some(d),
            _ => None,
        }
    }

    /// The raw bits of a node record, if the index fits.
    fn bits(self) -> Option<u32> {
        match self {
            Placement::Any => Some(ANY_GROUP),
            Placement::Group(g) => (g.0 < DOMAIN_BIT).then_some(g.0),
            Placement::Domain(d) => (d.0 < ANY_GROUP - DOMAIN_BIT).then_some(d.0 | DOMAIN_BIT),
        }
    }

    #[inline]
    pub(crate) fn from_bits(p: u32) -> Self {
        if p == ANY_GROUP {
            Placement::Any
        } else if p & DOMAIN_BIT != 0 {
            Placement::Domain(DomainId(p & !DOMAIN_BIT))
        } else {
            Placement::Group(GroupId(p))
        }
    }
}

impl From<GroupId> for Placement {
    fn from(g: GroupId) -> Self {
        Placement::Group(g)
    }
}

impl From<DomainId> for Placement {
    fn from(d: DomainId) -> Self {
        Placement::Domain(d)
    }
}

impl From<Option<GroupId>> for Placement {
    fn from(g: Option<GroupId>) -> Self {
        g.map_or(Placement::Any, Placement::Group)
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
    fn note(&mut self, node: u32, p: Placement) {
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
const SUCC_SHIFT: u32 = 24;
const SUCC_MASK: u32 = 3 << SUCC_SHIFT;
/// `succ` is `[start, len]` in `Plan::ext`.
const SUCC_EXTERNAL: u32 = 3;
/// A CPU-heavy node ([`GraphBuilder::cpu_node`]).
const FLAG_CPU: u32 = 1 << 26;
/// The body returns `()`: nothing to store.
const FLAG_UNIT: u32 = 1 << 27;
/// The body is an [`InlinedBody`].
const FLAG_INLINED: u32 = 1 << 28;
/// The node's one successor has this node as its only predecessor and may run wherever this
/// node runs: it is the node's continuation, with no check at run time (set by `build`).
const FLAG_CHAIN: u32 = 1 << 29;
/// The node's priority level ([`Priority::bits`]: 0 is normal), resolved by `build` from the
/// graph's priority and the node's override.
const PRIO_SHIFT: u32 = 30;
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
    succ: [u32; 2],
    /// Number of predecessors (edges into this node, repeated edges counted each time).
    pub(crate) indegree: u32,
    /// Placement and flags (`PLACEMENT_MASK`, `SUCC_MASK`, `FLAG_*`).
    meta: u32,
}

impl<S> NodeSpec<S> {
    fn new(body: ThinBody<S>, flags: u32) -> Self {
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

    #[inline]
    fn succ_mode(&self) -> u32 {
        (self.meta & SUCC_MASK) >> SUCC_SHIFT
    }

    fn set_succ_mode(&mut self, mode: u32) {
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

    fn set_priority(&mut self, p: Priority) {
        self.meta = (self.meta & !PRIO_MASK) | (p.bits() << PRIO_SHIFT);
    }

    fn set_placement_bits(&mut self, p: u32) {
        self.meta = (self.meta & !PLACEMENT_MASK) | p;
    }

    /// (origin, base): the graph whose builder created the body, and where that graph's node 0
    /// sits in the graph `uid` this node belongs to.
    #[inline]
    pub(crate) fn origin_base(&self, uid: u32) -> (u32, u32) {
        if self.meta & FLAG_INLINED != 0 {
            if let Some(b) = self.body.inlined() {
                return (b.origin, b.base);
            }
        }
        (uid, 0)
    }
}

/// The successors of node `i`: inline in its record or in `ext`.
#[inline]
fn successors_of<'a, S>(nodes: &'a [NodeSpec<S>], ext: &'a [u32], i: u32) -> &'a [u32] {
    let spec = &nodes[i as usize];
    match spec.succ_mode() {
        SUCC_EXTERNAL => {
            let [start, len] = spec.succ;
            &ext[start as usize..start as usize + len as usize]
        }
        k => &spec.succ[..k as usize],
    }
}

/// An edge that `build` rejects: the first one added.
#[derive(Clone, Copy)]
enum BadEdge {
    /// An endpoint of another graph.
    Foreign(NodeId),
    /// An endpoint this graph does not have.
    Unknown(NodeId),
    /// A node after itself.
    SelfLoop(u32),
}

/// Builds a task graph: named nodes, edges, placements and inlined subgraphs.
///
/// `build` validates it (cycles, unknown or foreign node ids) into a [`Graph`], which a
/// [`Pool`](crate::Pool) can run any number of times.
///
/// ```
/// use boundpool_scheduler::{GraphBuilder, PoolBuilder};
///
/// let pool = PoolBuilder::new().workers(2).build()?;
/// let mut g = GraphBuilder::new("sum");
/// let a = g.node("a", |_| Ok(20u64));
/// let b = g.node("b", |_| Ok(22u64));
/// let sum = g.node("sum", move |ctx| Ok(ctx.input(a)? + ctx.input(b)?));
/// g.edge(a, sum);
/// g.edge(b, sum);
/// let graph = g.build()?;
/// let out = pool.submit(&graph)?.wait()?;
/// assert_eq!(out.get(sum), Some(&42));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct GraphBuilder<S = ()> {
    uid: u32,
    name: Cow<'static, str>,
    nodes: Vec<NodeSpec<S>>,
    names: NameTable,
    /// Edges beyond their source's second successor, in the order added (the first two of a
    /// node's successors go into its record at once).
    overflow: Vec<(u32, u32)>,
    /// Edges added (and accepted).
    edges: usize,
    /// One bit per node: the node has a predecessor (so it is not a source).
    has_pred: Vec<u64>,
    /// Every edge so far goes from a lower to a higher index: node order is a topological order.
    forward: bool,
    /// Some node has more than one predecessor (runs need dependency counters).
    joins: bool,
    /// Nodes whose output is not `()`.
    valued: Vec<u32>,
    /// Nodes with the highest placements, kept up to date while nodes are placed.
    max_placement: MaxPlacement,
    /// A node was placed again: `max_placement` must be recomputed at build.
    replaced: bool,
    /// The priority of the graph's nodes that have no override of their own.
    priority: Priority,
    /// Per-node overrides of `priority`, in the order given (the last one for a node wins).
    prio_overrides: Vec<(u32, Priority)>,
    /// A placement that named a bad node, group or domain; reported by `build`.
    bad_placement: Option<(NodeId, Option<Placement>)>,
    /// The first bad edge; reported by `build`.
    bad_edge: Option<BadEdge>,
}

impl<S> fmt::Debug for GraphBuilder<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GraphBuilder")
            .field("name", &self.name)
            .field("nodes", &self.nodes.len())
            .field("edges", &self.edges)
            .finish()
    }
}

impl<S: Send + 'static> GraphBuilder<S> {
    /// An empty graph named `name` (the name appears in errors and metrics).
    pub fn new(name: impl Into<Cow<'static, str>>) -> Self {
        Self::with_capacity(name, 0, 0)
    }

    /// An empty graph with room for `nodes` nodes and `edges` edges.
    pub fn with_capacity(name: impl Into<Cow<'static, str>>, nodes: usize, edges: usize) -> Self {
        // Edges mostly live in their source's record; only those past a node's second
        // successor are listed apart, so reserve little for them.
        let _ = edges;
        GraphBuilder {
            uid: NEXT_GRAPH_UID.fetch_add(1, StdOrdering::Relaxed),
            name: name.into(),
            nodes: Vec::with_capacity(nodes),
            names: NameTable::with_capacity(nodes),
            overflow: Vec::new(),
            edges: 0,
            has_pred: Vec::with_capacity(nodes.div_ceil(64)),
            forward: true,
            joins: false,
            valued: Vec::new(),
            max_placement: MaxPlacement::default(),
            replaced: false,
            priority: Priority::Normal,
            prio_overrides: Vec::new(),
            bad_placement: None,
            bad_edge: None,
        }
    }

    /// The graph's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Number of nodes so far.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether the graph has no nodes.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    fn push(&mut self, name: &str, spec: NodeSpec<S>) -> NodeId {
        let index = u32::try_from(self.nodes.len())
            .ok()
            .filter(|&i| i < u32::MAX)
            .expect("a graph holds at most 2^32 - 2 nodes");
        if index % 64 == 0 {
            self.has_pred.push(0);
        }
        if !spec.is_unit() {
            self.valued.push(index);
        }
        self.nodes.push(spec);
        self.names.push(name);
        NodeId {
            graph: self.uid,
            index,
        }
    }

    /// Adds a node that runs `body` on a pool worker. The body gets a [`NodeCtx`] (inputs,
    /// the worker's state, nested submission) and returns the node's output or an error.
    pub fn node<T, F>(&mut self, name: impl Into<Cow<'static, str>>, body: F) -> NodeRef<T>
    where
        T: Send + Sync + 'static,
        F: Fn(&NodeCtx<'_, S>) -> Result<T, BoxError> + Send + Sync + 'static,
    {
        let flags = if is_unit::<T>() { FLAG_UNIT } else { 0 };
        let spec = NodeSpec::new(ThinBody::new(WorkerFn(body, PhantomData)), flags);
        NodeRef::new(self.push(&name.into(), spec))
    }

    /// Adds a CPU-heavy node. When the pool has a host-work lane (see
    /// [`PoolBuilder::rayon_pool`](crate::PoolBuilder::rayon_pool)) it runs there, so it does not hold
    /// a pinned (possibly context-bound) worker; otherwise it runs on a worker like any node.
    /// It sees its inputs but no worker state.
    pub fn cpu_node<T, F>(&mut self, name: impl Into<Cow<'static, str>>, body: F) -> NodeRef<T>
    where
        T: Send + Sync + 'static,
        F: Fn(&Inputs<'_>) -> Result<T, BoxError> + Send + Sync + 'static,
    {
        let flags = FLAG_CPU | if is_unit::<T>() { FLAG_UNIT } else { 0 };
        let spec = NodeSpec::new(ThinBody::new(CpuFn(body, PhantomData)), flags);
        NodeRef::new(self.push(&name.into(), spec))
    }

    /// Adds an edge: `to` starts only after `from` has finished, and may read its output.
    /// A node of another graph, a node this graph does not have, or a node after itself is
    /// reported by [`build`](Self::build).
    pub fn edge(&mut self, from: impl Into<NodeId>, to: impl Into<NodeId>) -> &mut Self {
        let (from, to) = (from.into(), to.into());
        let n = self.nodes.len() as u32;
        let bad = if from.graph != self.uid {
            Some(BadEdge::Foreign(from))
        } else if to.graph != self.uid {
            Some(BadEdge::Foreign(to))
        } else if from.index >= n {
            Some(BadEdge::Unknown(from))
        } else if to.index >= n {
            Some(BadEdge::Unknown(to))
        } else if from.index == to.index {
            Some(BadEdge::SelfLoop(from.index))
        } else {
            None
        };
        match bad {
            None => self.add_edge(from.index, to.index),
            Some(b) => {
                if self.bad_edge.is_none() {
                    self.bad_edge = Some(b);
                }
            }
        }
        self
    }

    /// Records edge `f -> t` (two distinct nodes of this builder).
    #[inline]
    fn add_edge(&mut self, f: u32, t: u32) {
        self.forward &= f < t;
        self.edges += 1;
        let to = &mut self.nodes[t as usize];
        to.indegree = to
            .indegree
            .checked_add(1)
            .expect("a node has at most 2^32 - 1 predecessors");
        self.joins |= to.indegree > 1;
        self.has_pred[t as usize / 64] |= 1 << (t % 64);
        let from = &mut self.nodes[f as usize];
        match from.succ_mode() {
            k @ (0 | 1) => {
                from.succ[k as usize] = t;
                from.set_succ_mode(k + 1);
            }
            2 => {
                from.set_succ_mode(SUCC_EXTERNAL);
                self.overflow.push((f, t));
            }
            _ => self.overflow.push((f, t)),
        }
    }

    /// Sets the priority of this graph's nodes (default [`Priority::Normal`]); a node's own
    /// [`node_priority`](Self::node_priority) overrides it. Workers take ready nodes of a higher
    /// level first (see the crate README, "Priorities and admission").
    pub fn priority(&mut self, priority: Priority) -> &mut Self {
        self.priority = priority;
        self
    }

    /// Gives `node` its own priority, whatever the graph's. A node of an inlined subgraph keeps
    /// the override its own builder gave it; the others take this graph's priority.
    pub fn node_priority(&mut self, node: impl Into<NodeId>, priority: Priority) -> &mut Self {
        let id = node.into();
        if id.graph == self.uid && (id.index as usize) < self.nodes.len() {
            self.prio_overrides.push((id.index, priority));
        } else if self.bad_placement.is_none() {
            self.bad_placement = Some((id, None));
        }
        self
    }

    /// Restricts `node` to the workers of a group (`GroupId`), or of every group of a domain
    /// (`DomainId`, for example all of a GPU's workers), or lifts the restriction
    /// (`Placement::Any`). The last call for a node wins.
    pub fn place(&mut self, node: impl Into<NodeId>, placement: impl Into<Placement>) -> &mut Self {
        let id = node.into();
        let placement = placement.into();
        let ok_node = id.graph == self.uid && (id.index as usize) < self.nodes.len();
        match placement.bits() {
            Some(bits) if ok_node => {
                let spec = &mut self.nodes[id.index as usize];
                if spec.placement() != Placement::Any {
                    self.replaced = true;
                }
                spec.set_placement_bits(bits);
                self.max_placement.note(id.index, placement);
            }
            _ => {
                if self.bad_placement.is_none() {
                    self.bad_placement = Some((id, ok_node.then_some(placement)));
                }
            }
        }
        self
    }

    /// Inlines a copy of `graph`'s nodes and edges into this one. The returned [`Subgraph`]
    /// maps the inner graph's node references to this graph's, for edges and outputs.
    /// Bodies are shared, not cloned, so one `Graph` may be inlined many times.
    pub fn subgraph(&mut self, graph: &Graph<S>) -> Subgraph {
        let plan = &graph.plan;
        let offset = u32::try_from(self.nodes.len()).expect("a graph holds at most 2^32 - 2 nodes");
        for (i, spec) in plan.nodes.iter().enumerate() {
            let (origin, base) = spec.origin_base(plan.uid);
            let (body_plan, body_index) = match spec.body.inlined() {
                Some(b) => (b.plan.clone(), b.index),
                None => (plan.clone(), i as u32),
            };
            let flags = spec.meta & (FLAG_CPU | FLAG_UNIT) | FLAG_INLINED;
            let mut inner = NodeSpec::new(
                ThinBody::new(InlinedBody {
                    plan: body_plan,
                    index: body_index,
                    origin,
                    base: offset + base,
                }),
                flags,
            );
            inner.set_placement_bits(spec.placement_bits());
            let id = self.push(&plan.names[i], inner);
            self.max_placement.note(id.index, spec.placement());
        }
        for from in 0..plan.nodes.len() as u32 {
            for &to in plan.successors(from) {
                self.add_edge(offset + from, offset + to);
            }
        }
        self.prio_overrides
            .extend(plan.prio_overrides.iter().map(|&(i, p)| (offset + i, p)));
        Subgraph {
            inner: plan.uid,
            outer: self.uid,
            offset,
            len: plan.nodes.len() as u32,
            sources: plan.sources.clone(),
            sinks: plan.sinks(),
        }
    }

    /// Validates the graph and freezes it.
    ///
    /// Errors: an edge naming a node this graph does not have ([`ErrorKind::UnknownNode`]), a node
    /// of another graph ([`ErrorKind::ForeignNode`]), a placement on a group index no pool can
    /// have ([`ErrorKind::UnknownGroup`]), or a cycle ([`ErrorKind::Cycle`], naming nodes on it).
    /// Nothing runs before this succeeds.
    pub fn build(mut self) -> Result<Graph<S>, Error> {
        if self.priority != Priority::Normal {
            let p = self.priority;
            self.nodes.iter_mut().for_each(|n| n.set_priority(p));
        }
        for &(i, p) in &self.prio_overrides {
            self.nodes[i as usize].set_priority(p);
        }
        Plan::build(self).map(|plan| Graph {
            plan: Arc::new(plan),
        })
    }
}

/// A subgraph inlined by [`GraphBuilder::subgraph`].
#[derive(Debug, Clone)]
pub struct Subgraph {
    inner: u32,
    outer: u32,
    offset: u32,
    len: u32,
    sources: Box<[u32]>,
    sinks: Vec<u32>,
}

impl Subgraph {
    /// This graph's reference to the inner graph's node `r`.
    ///
    /// # Panics
    /// If `r` is not a node of the inlined graph.
    pub fn node<T>(&self, r: NodeRef<T>) -> NodeRef<T> {
        assert!(
            r.id.graph == self.inner && r.id.index < self.len,
            "{:?} is not a node of the inlined subgraph",
            r.id
        );
        NodeRef::new(NodeId {
            graph: self.outer,
            index: self.offset + r.id.index,
        })
    }

    /// The inlined nodes that have no predecessor inside the subgraph.
    pub fn sources(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.sources.iter().map(move |&i| NodeId {
            graph: self.outer,
            index: self.offset + i,
        })
    }

    /// The inlined nodes that have no successor inside the subgraph.
    pub fn sinks(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.sinks.iter().map(move |&i| NodeId {
            graph: self.outer,
            index: self.offset + i,
        })
    }
}

/// A validated, immutable task graph. Cheap to clone; submit it with
/// [`Pool::submit`](crate::Pool::submit) as often as you like, also concurrently.
pub struct Graph<S = ()> {
    pub(crate) plan: Arc<Plan<S>>,
}

impl<S> Clone for Graph<S> {
    fn clone(&self) -> Self {
        Graph {
            plan: self.plan.clone(),
        }
    }
}

impl<S> fmt::Debug for Graph<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Graph")
            .field("name", &self.plan.name)
            .field("nodes", &self.plan.nodes.len())
            .field("edges", &self.plan.edges)
            .finish()
    }
}

impl<S> Graph<S> {
    /// The graph's name.
    pub fn name(&self) -> &str {
        &self.plan.name
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.plan.nodes.len()
    }

    /// Whether the graph has no nodes.
    pub fn is_empty(&self) -> bool {
        self.plan.nodes.is_empty()
    }

    /// Number of edges.
    pub fn edge_count(&self) -> usize {
        self.plan.edges
    }

    /// Every node's id, in order.
    pub fn nodes(&self) -> impl Iterator<Item = NodeId> + '_ {
        let uid = self.plan.uid;
        (0..self.plan.nodes.len() as u32).map(move |index| NodeId { graph: uid, index })
    }

    /// A node's name, if `id` belongs to this graph.
    pub fn node_name(&self, id: NodeId) -> Option<&str> {
        self.plan.check(id).map(|i| &self.plan.names[i as usize])
    }

    /// The graph's priority (its nodes' unless they have their own).
    pub fn priority(&self) -> Priority {
        self.plan.priority
    }

    /// A node's priority, if `id` belongs to this graph.
    pub fn node_priority(&self, id: NodeId) -> Option<Priority> {
        self.plan
            .check(id)
            .map(|i| self.plan.nodes[i as usize].priority())
    }

    /// A node's placement, if `id` belongs to this graph.
    pub fn placement(&self, id: NodeId) -> Option<Placement> {
        self.plan
            .check(id)
            .map(|i| self.plan.nodes[i as usize].placement())
    }

    /// A node's direct successors.
    pub fn successors(&self, id: NodeId) -> impl Iterator<Item = NodeId> + '_ {
        let uid = self.plan.uid;
        let list = self
            .plan
            .check(id)
            .map(|i| self.plan.successors(i))
            .unwrap_or(&[]);
        list.iter().map(move |&index| NodeId { graph: uid, index })
    }

    /// A node's direct predecessors.
    pub fn predecessors(&self, id: NodeId) -> impl Iterator<Item = NodeId> + '_ {
        let uid = self.plan.uid;
        let list = self
            .plan
            .check(id)
            .map(|i| self.plan.predecessors(i))
            .unwrap_or(&[]);
        list.iter().map(move |&index| NodeId { graph: uid, index })
    }

    /// Whether `id` is a CPU-heavy node (see [`GraphBuilder::cpu_node`]).
    pub fn is_cpu_node(&self, id: NodeId) -> bool {
        self.plan
            .check(id)
            .is_some_and(|i| self.plan.nodes[i as usize].is_cpu())
    }

    /// The graph in Graphviz DOT: nodes labelled with their name and placement
    /// (`host` or the group's name from `group_name`, `cpu lane` for CPU-heavy nodes).
    pub fn to_dot_with(&self, group_name: impl Fn(GroupId) -> String) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let _ = writeln!(s, "digraph \"{}\" {{", dot_escape(&self.plan.name));
        let _ = writeln!(s, "  node [shape=box, style=rounded];");
        for (i, spec) in self.plan.nodes.iter().enumerate() {
            let place = if spec.is_cpu() {
                "cpu lane".to_string()
            } else {
                match spec.placement() {
                    Placement::Any => "host".to_string(),
                    Placement::Group(g) => group_name(g),
                    Placement::Domain(d) => format!("domain {}", d.index()),
                }
            };
            let _ = writeln!(
                s,
                "  n{i} [label=\"{}\\n[{}]\"];",
                dot_escape(&self.plan.names[i]),
                dot_escape(&place)
            );
        }
        for i in 0..self.plan.nodes.len() as u32 {
            for &j in self.plan.successors(i) {
                let _ = writeln!(s, "  n{i} -> n{j};");
            }
        }
        s.push_str("}\n");
        s
    }

    /// [`to_dot_with`](Self::to_dot_with) naming groups `group N`.
    pub fn to_dot(&self) -> String {
        self.to_dot_with(|g| format!("group {}", g.index()))
    }
}

fn dot_escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}

/// A validated graph: node records (bodies, degrees, placements, inline successors), the
/// successor lists of nodes with more than two, sources, names.
pub(crate) struct Plan<S> {
    pub(crate) uid: u32,
    pub(crate) name: Arc<str>,
    pub(crate) nodes: Box<[NodeSpec<S>]>,
    /// Successor lists of the nodes that have more than two (`SUCC_EXTERNAL`).
    ext: Box<[u32]>,
    /// Number of edges.
    pub(crate) edges: usize,
    /// Some node has more than one predecessor.
    pub(crate) joins: bool,
    /// (start, list), built from the successor lists the first time a node asks for its
    /// predecessors: graphs whose nodes never read inputs never pay for them.
    preds: OnceLock<Csr>,
    /// The joins with many predecessors and their leaf counters, built by the first run.
    pub(crate) wide_joins: OnceLock<crate::run::WideJoins>,
    pub(crate) names: NameTable,
    pub(crate) sources: Box<[u32]>,
    /// Nodes whose output is not `()`: the ones copied into a `GraphOutput`.
    pub(crate) valued: Box<[u32]>,
    max_placement: MaxPlacement,
    /// The builder's graph priority and node overrides (kept for inlining this graph).
    pub(crate) priority: Priority,
    prio_overrides: Box<[(u32, Priority)]>,
    /// Some node is not of the normal level.
    pub(crate) prioritized: bool,
}

/// (start offsets, list): compressed adjacency lists.
type Csr = (Box<[u32]>, Box<[u32]>);

/// Node names packed into one string: a node costs 4 bytes plus its name's bytes, where a
/// `Cow<str>` per node would cost 24 (building a large graph is mostly writing memory).
#[derive(Default)]
pub(crate) struct NameTable {
    text: String,
    /// End of each name in `text`.
    ends: Vec<u32>,
}

impl NameTable {
    fn with_capacity(n: usize) -> Self {
        NameTable {
            text: String::with_capacity(n),
            ends: Vec::with_capacity(n),
        }
    }

    #[inline]
    fn push(&mut self, name: &str) {
        self.text.push_str(name);
        let end = u32::try_from(self.text.len()).expect("a graph's node names total under 4 GiB");
        self.ends.push(end);
    }

    fn shrunk(mut self) -> Self {
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
fn build_predecessors<'a>(n: usize, successors: impl Fn(u32) -> &'a [u32]) -> Csr {
    let mut start = vec![0u32; n + 1];
    for f in 0..n as u32 {
        for &t in successors(f) {
            start[t as usize + 1] += 1;
        }
    }
    for i in 0..n {
        start[i + 1] += start[i];
    }
    let mut fill: Vec<u32> = start[..n].to_vec();
    let mut list = vec![0u32; start[n] as usize];
    for f in 0..n as u32 {
        for &t in successors(f) {
            list[fill[t as usize] as usize] = f;
            fill[t as usize] += 1;
        }
    }
    (start.into_boxed_slice(), list.into_boxed_slice())
}

impl<S> Plan<S> {
    #[inline]
    pub(crate) fn successors(&self, i: u32) -> &[u32] {
        successors_of(&self.nodes, &self.ext, i)
    }

    #[inline]
    pub(crate) fn predecessors(&self, i: u32) -> &[u32] {
        let (start, list) = self
            .preds
            .get_or_init(|| build_predecessors(self.nodes.len(), |f| self.successors(f)));
        let i = i as usize;
        &list[start[i] as usize..start[i + 1] as usize]
    }

    /// A node with the highest group placement, for checking placements against a pool.
    pub(crate) fn max_placement(&self) -> Option<(u32, GroupId)> {
        self.max_placement.group
    }

    /// A node with the highest domain placement, for checking placements against a pool.
    pub(crate) fn max_domain(&self) -> Option<(u32, DomainId)> {
        self.max_placement.domain
    }

    fn sinks(&self) -> Vec<u32> {
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

    fn build(mut b: GraphBuilder<S>) -> Result<Self, Error> {
        let n = b.nodes.len();
        let gname: Arc<str> = Arc::from(&*b.name);
        if let Some((id, placement)) = b.bad_placement {
            return Err(match placement {
                Some(p) => {
                    let (what, index, max) = match p {
                        Placement::Domain(d) => ("domain", d.index(), ANY_GROUP - DOMAIN_BIT - 1),
                        Placement::Group(g) => ("group", g.index(), DOMAIN_BIT - 1),
                        Placement::Any => unreachable!("`Any` always fits"),
                    };
                    Error::new(
                        ErrorKind::UnknownGroup,
                        format!(
                            "graph '{}': node '{}' (#{}) is placed on {what} {index}, above the \
                             largest {what} index a pool can have ({max})",
                            bounded(&gname),
                            bounded(&b.names[id.index as usize]),
                            id.index,
                        ),
                    )
                }
                None => node_error(&gname, id, b.uid, n, "a placement or priority"),
            });
        }
        match b.bad_edge {
            None => {}
            Some(BadEdge::Foreign(id)) | Some(BadEdge::Unknown(id)) => {
                return Err(node_error(&gname, id, b.uid, n, "an edge"));
            }
            Some(BadEdge::SelfLoop(f)) => {
                return Err(Error::new(
                    ErrorKind::Cycle,
                    format!(
                        "graph '{}' has a cycle of 1 node: node '{}' (#{f}) depends on itself",
                        bounded(&gname),
                        bounded(&b.names[f as usize])
                    ),
                ));
            }
        }
        let ext = external_successors(&mut b.nodes, &b.overflow);
        mark_chains(&mut b.nodes);
        let mut sources = Vec::new();
        for (w, &bits) in b.has_pred.iter().enumerate() {
            let mut free = !bits;
            while free != 0 {
                let i = w * 64 + free.trailing_zeros() as usize;
                if i >= n {
                    break;
                }
                sources.push(i as u32);
                free &= free - 1;
            }
        }

        // Kahn's algorithm: every node must become ready, or there is a cycle. Skipped when every
        // edge goes from a lower to a higher index: node order is then a topological order.
        if !b.forward {
            let mut remaining: Vec<u32> = b.nodes.iter().map(|s| s.indegree).collect();
            let mut stack = sources.clone();
            let mut seen = 0;
            while let Some(i) = stack.pop() {
                seen += 1;
                for &s in successors_of(&b.nodes, &ext, i) {
                    let r = &mut remaining[s as usize];
                    *r -= 1;
                    if *r == 0 {
                        stack.push(s);
                    }
                }
            }
            if seen < n {
                let preds = build_predecessors(n, |f| successors_of(&b.nodes, &ext, f));
                let cycle = find_cycle(&remaining, &preds.0, &preds.1);
                // Name at most a few of its nodes: a cycle can be millions of nodes long.
                let name = |i: u32| format!("'{}' (#{i})", bounded(&b.names[i as usize]));
                return Err(Error::new(
                    ErrorKind::Cycle,
                    format!(
                        "graph '{}' has a cycle of {} nodes: {} -> {}",
                        bounded(&gname),
                        cycle.len(),
                        bounded_list(cycle.iter().map(|&i| name(i)), cycle.len(), " -> "),
                        name(cycle[0])
                    ),
                ));
            }
        }
        let prioritized = b.nodes.iter().any(|n| n.is_prioritized());
        let mut max_placement = b.max_placement;
        if b.replaced {
            max_placement = MaxPlacement::default();
            for (i, spec) in b.nodes.iter().enumerate() {
                max_placement.note(i as u32, spec.placement());
            }
        }
        Ok(Plan {
            uid: b.uid,
            name: gname,
            nodes: b.nodes.into_boxed_slice(),
            ext,
            edges: b.edges,
            joins: b.joins,
            preds: OnceLock::new(),
            wide_joins: OnceLock::new(),
            names: b.names.shrunk(),
            sources: sources.into_boxed_slice(),
            valued: b.valued.into_boxed_slice(),
            max_placement,
            priority: b.priority,
            prio_overrides: b.prio_overrides.into_boxed_slice(),
            prioritized,
        })
    }
}

/// The error for a placement or edge naming node `id`, which is of another graph or beyond the
/// `n` nodes of graph `uid`.
fn node_error(gname: &str, id: NodeId, uid: u32, n: usize, what: &str) -> Error {
    let gname = bounded(gname);
    if id.graph != uid {
        Error::new(
            ErrorKind::ForeignNode,
            format!(
                "graph '{gname}': {what} refers to node #{} of another graph; \
                 inline that graph with `subgraph` and map the node through the returned `Subgraph`",
                id.index
            ),
        )
    } else {
        Error::new(
            ErrorKind::UnknownNode,
            format!(
                "graph '{gname}': {what} refers to node #{}, but the graph has {n} node(s)",
                id.index
            ),
        )
    }
}

/// Moves the successors of nodes with more than two into one list: each such node's first two
/// (from its record) and then its `overflow` edges, in the order they were added; the record
/// then holds `[start, len]`. Nothing to do (and nothing allocated) when no node has more than two.
fn external_successors<S>(nodes: &mut [NodeSpec<S>], overflow: &[(u32, u32)]) -> Box<[u32]> {
    if overflow.is_empty() {
        return Box::new([]);
    }
    // Overflow edges per node; then each node's fill cursor.
    let mut extra = vec![0u32; nodes.len()];
    for &(f, _) in overflow {
        extra[f as usize] += 1;
    }
    let total: usize = extra
        .iter()
        .filter(|&&k| k > 0)
        .map(|&k| 2 + k as usize)
        .sum();
    let total_u32 = u32::try_from(total).expect("a graph holds at most 2^32 - 1 edges");
    let mut ext = vec![0u32; total_u32 as usize];
    let mut cursor = 0u32;
    for (f, k) in extra.iter_mut().enumerate() {
        if *k == 0 {
            continue;
        }
        let spec = &mut nodes[f];
        let len = 2 + *k;
        ext[cursor as usize] = spec.succ[0];
        ext[cursor as usize + 1] = spec.succ[1];
        spec.succ = [cursor, len];
        *k = cursor + 2;
        cursor += len;
    }
    for &(f, t) in overflow {
        let at = &mut extra[f as usize];
        ext[*at as usize] = t;
        *at += 1;
    }
    ext.into_boxed_slice()
}

/// Sets `FLAG_CHAIN` on every node whose one successor has it as its only predecessor and is
/// placed anywhere or where the node is.
fn mark_chains<S>(nodes: &mut [NodeSpec<S>]) {
    for i in 0..nodes.len() {
        let spec = &nodes[i];
        if spec.succ_mode() != 1 {
            continue;
        }
        let next = &nodes[spec.succ[0] as usize];
        let place = next.placement_bits();
        if next.indegree == 1 && (place == ANY_GROUP || place == spec.placement_bits()) {
            nodes[i].meta |= FLAG_CHAIN;
        }
    }
}

/// Walks predecessors among the nodes Kahn's algorithm could not reach until one repeats;
/// returns that cycle in edge order.
fn find_cycle(remaining: &[u32], pred_start: &[u32], pred: &[u32]) -> Vec<u32> {
    let start = remaining
        .iter()
        .position(|&r| r > 0)
        .expect("a cycle exists") as u32;
    let mut pos = vec![u32::MAX; remaining.len()];
    let mut path = Vec::new();
    let mut cur = start;
    loop {
        if pos[cur as usize] != u32::MAX {
            let mut cycle = path[pos[cur as usize] as usize..].to_vec();
            cycle.reverse(); // we walked predecessors; report in edge direction
            return cycle;
        }
        pos[cur as usize] = path.len() as u32;
        path.push(cur);
        let i = cur as usize;
        cur = *pred[pred_start[i] as usize..pred_start[i + 1] as usize]
            .iter()
            .find(|&&p| remaining[p as usize] > 0)
            .expect("a node left with predecessors has an unfinished one");
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::{Cores, PoolBuilder};

    fn noop() -> impl Fn(&NodeCtx<'_, ()>) -> Result<(), BoxError> + Send + Sync + 'static {
        |_| Ok(())
    }

    #[test]
    fn unknown_node_ids_are_reported() {
        let mut g = GraphBuilder::<()>::new("g");
        let a = g.node("a", noop());
        let _b = g.node("b", noop());
        let ghost = NodeId {
            graph: g.uid,
            index: 7,
        };
        g.edge(a, ghost);
        let err = g.build().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::UnknownNode);
        let msg = err.to_string();
        assert!(
            msg.contains("#7") && msg.contains("2 node(s)") && msg.contains("'g'"),
            "{msg}"
        );

        let mut g = GraphBuilder::<()>::new("g2");
        let a = g.node("a", noop());
        let ghost = NodeId {
            graph: g.uid,
            index: 1,
        };
        g.edge(ghost, a);
        assert_eq!(g.build().unwrap_err().kind(), ErrorKind::UnknownNode);

        // A placement naming a node that does not exist.
        let mut g = GraphBuilder::<()>::new("g3");
        g.node("a", noop());
        let ghost = NodeId {
            graph: g.uid,
            index: 5,
        };
        g.place(ghost, GroupId::from_index(0));
        assert_eq!(g.build().unwrap_err().kind(), ErrorKind::UnknownNode);
    }

    #[test]
    fn plan_holds_degrees_sources_and_adjacency() {
        // a -> b, a -> c, b -> d, c -> d, plus an isolated e and a duplicate edge c -> d.
        let mut g = GraphBuilder::<()>::new("diamond");
        let a = g.node("a", noop());
        let b = g.node("b", noop());
        let c = g.node("c", noop());
        let d = g.node("d", noop());
        let e = g.node("e", noop());
        g.edge(a, b).edge(a, c).edge(b, d).edge(c, d).edge(c, d);
        let graph = g.build().unwrap();
        let p = &graph.plan;
        let indegree: Vec<u32> = p.nodes.iter().map(|s| s.indegree).collect();
        assert_eq!(indegree, vec![0, 1, 1, 3, 0]);
        assert_eq!(&*p.sources, &[0, 4]);
        assert_eq!(p.successors(0), &[1, 2]);
        assert_eq!(p.successors(2), &[3, 3]);
        assert!(p.successors(3).is_empty() && p.successors(4).is_empty());
        let mut preds = p.predecessors(3).to_vec();
        preds.sort();
        assert_eq!(preds, vec![1, 2, 2]);
        assert!(p.predecessors(0).is_empty());
        assert_eq!(p.check(d.id()), Some(3));
        assert_eq!(
            p.check(NodeId {
                graph: p.uid,
                index: 5
            }),
            None
        );
        assert_eq!(
            p.check(NodeId {
                graph: p.uid + 1,
                index: 0
            }),
            None
        );
        assert_eq!(p.describe(4), "node 'e' (#4) of graph 'diamond'");
        let _ = e;
    }

    #[test]
    fn backward_edges_that_form_no_cycle_build() {
        // Edges from higher to lower index: node order is not a topological order.
        let mut g = GraphBuilder::<()>::new("backward");
        let refs: Vec<NodeRef<()>> = (0..100).map(|i| g.node(format!("n{i}"), noop())).collect();
        for w in refs.windows(2) {
            g.edge(w[1], w[0]);
        }
        let graph = g.build().unwrap();
        assert_eq!(&*graph.plan.sources, &[99]);
    }

    /// The names of a cycle message, in order.
    fn cycle_names(msg: &str) -> Vec<String> {
        msg.split('\'')
            .skip(1)
            .step_by(2)
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn cycle_message_lists_the_cycle_in_edge_order() {
        for rot in 0..4 {
            let mut g = GraphBuilder::<()>::new("c");
            let names = ["p", "q", "r", "s", "x", "y"];
            let n: Vec<NodeRef<()>> = names.iter().map(|s| g.node(*s, noop())).collect();
            // Cycle p -> q -> r -> s -> p, entered from x; y hangs off r. Edge order rotated.
            let mut edges = vec![(0, 1), (1, 2), (2, 3), (3, 0)];
            edges.rotate_left(rot);
            edges.push((4, 0));
            edges.push((2, 5));
            for (f, t) in &edges {
                g.edge(n[*f], n[*t]);
            }
            let msg = g.build().unwrap_err().to_string();
            // "graph 'c' has a cycle: 'p' (#0) -> ... -> 'p' (#0)": drop the graph name.
            let cyc = cycle_names(&msg)[1..].to_vec();
            assert_eq!(cyc.first(), cyc.last(), "{msg}");
            let cyc = &cyc[..cyc.len() - 1];
            assert_eq!(cyc.len(), 4, "{msg}");
            let idx = |s: &str| names.iter().position(|x| *x == s).unwrap();
            for w in 0..cyc.len() {
                let (f, t) = (idx(&cyc[w]), idx(&cyc[(w + 1) % cyc.len()]));
                assert!(
                    edges.contains(&(f, t)),
                    "{} -> {} is not an edge: {msg}",
                    cyc[w],
                    cyc[(w + 1) % cyc.len()]
                );
            }
        }
    }

    #[test]
    fn wrong_output_type_and_unit_inputs() {
        let pool = PoolBuilder::new()
            .workers(1)
            .cores(Cores::Unpinned)
            .build()
            .unwrap();
        let mut g = GraphBuilder::<()>::new("types");
        let a = g.node("a", |_| Ok(7u32));
        let u = g.node("u", |_| Ok(()));
        // A reference to `a` with the wrong type: only constructible inside the crate.
        let wrong: NodeRef<u64> = NodeRef::new(a.id());
        let b = g.node("b", move |ctx| {
            let e = ctx.input(wrong).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::BadInput);
            assert!(
                e.to_string().contains("u64") && e.to_string().contains("'b'"),
                "{e}"
            );
            ctx.input(u)?;
            Ok(*ctx.input(a)? + 1)
        });
        // Reading a `()` node as something else fails: it left no value.
        let wrong_unit: NodeRef<u8> = NodeRef::new(u.id());
        let c = g.node("c", move |ctx| {
            Ok(ctx.input(wrong_unit).map(|_| ()).map_err(|e| e.kind()))
        });
        g.edge(a, b).edge(u, b).edge(u, c);
        let out = pool.run(&g.build().unwrap()).unwrap();
        assert_eq!(out.get(b), Some(&8));
        assert_eq!(out.get(c), Some(&Err(ErrorKind::BadInput)));
        // The output holds `a` as u32, not as u64.
        assert_eq!(out.get(wrong), None);
        assert_eq!(out.get(a), Some(&7));
    }

    #[test]
    fn inlined_nodes_keep_origin_and_base() {
        let mut inner = GraphBuilder::<()>::new("inner");
        let i0 = inner.node("i0", noop());
        let i1 = inner.node("i1", noop());
        inner.edge(i0, i1);
        let inner = inner.build().unwrap();
        let inner_uid = inner.plan.uid;

        let mut mid = GraphBuilder::<()>::new("mid");
        mid.node("m0", noop());
        let s = mid.subgraph(&inner);
        assert_eq!(s.node(i1).id().index(), 2);
        let mid = mid.build().unwrap();
        assert_eq!(mid.plan.nodes[1].origin_base(mid.plan.uid), (inner_uid, 1));
        assert_eq!(
            mid.plan.nodes[0].origin_base(mid.plan.uid),
            (mid.plan.uid, 0)
        );

        let mut outer = GraphBuilder::<()>::new("outer");
        outer.node("o0", noop());
        outer.node("o1", noop());
        let s2 = outer.subgraph(&mid);
        let outer = outer.build().unwrap();
        // mid's node 2 (inner's i1) now sits at 2 + 2 = 4; its body still comes from `inner`.
        assert_eq!(s2.node(s.node(i1)).id().index(), 4);
        let spec = &outer.plan.nodes[4];
        assert_eq!(spec.origin_base(outer.plan.uid), (inner_uid, 2 + 1));
        // mid's own node 0 keeps mid as its origin, now based at 2.
        assert_eq!(
            outer.plan.nodes[2].origin_base(outer.plan.uid),
            (mid.plan.uid, 2)
        );
        assert_eq!(outer.node_name(s2.node(s.node(i1)).id()), Some("i1"));
        assert_eq!(outer.plan.successors(3), &[4]);
    }

    #[test]
    fn successor_lists_inline_and_external_keep_edge_order() {
        let mut g = GraphBuilder::<()>::new("fan");
        let n: Vec<NodeRef<()>> = (0..8).map(|i| g.node(format!("n{i}"), noop())).collect();
        // n0 gets five successors (two inline, then the list), interleaved with other edges
        // and with a repeated one; n6 one successor, n5 two.
        g.edge(n[0], n[3])
            .edge(n[5], n[6])
            .edge(n[0], n[1])
            .edge(n[0], n[7]);
        g.edge(n[5], n[7])
            .edge(n[0], n[2])
            .edge(n[6], n[7])
            .edge(n[0], n[3]);
        let graph = g.build().unwrap();
        let p = &graph.plan;
        assert_eq!(p.successors(0), &[3, 1, 7, 2, 3]);
        assert_eq!(p.successors(5), &[6, 7]);
        assert_eq!(p.successors(6), &[7]);
        assert!(p.successors(7).is_empty());
        assert_eq!(graph.edge_count(), 8);
        let indegree: Vec<u32> = p.nodes.iter().map(|s| s.indegree).collect();
        assert_eq!(indegree, vec![0, 1, 1, 2, 0, 0, 1, 3]);
        assert_eq!(&*p.sources, &[0, 4, 5]);
        let mut preds = p.predecessors(7).to_vec();
        preds.sort();
        assert_eq!(preds, vec![0, 5, 6]);
        // n6's one successor has other predecessors: not a chain link.
        assert_eq!(p.nodes[6].chain_successor(), None);
    }

    #[test]
    fn chain_links_need_one_predecessor_and_a_compatible_placement() {
        let mut g = GraphBuilder::<()>::new("links");
        let n: Vec<NodeRef<()>> = (0..5).map(|i| g.node(format!("n{i}"), noop())).collect();
        g.edge(n[0], n[1])
            .edge(n[1], n[2])
            .edge(n[2], n[3])
            .edge(n[3], n[4]);
        // n1 and n2 on group 1; n3 on group 2; n4 anywhere.
        g.place(n[1], GroupId::from_index(1));
        g.place(n[2], GroupId::from_index(1));
        g.place(n[3], GroupId::from_index(2));
        let graph = g.build().unwrap();
        let links: Vec<Option<u32>> = graph
            .plan
            .nodes
            .iter()
            .map(|s| s.chain_successor())
            .collect();
        // n0 (anywhere) -> n1 (group 1): checked at run time, not a link; n1 -> n2 same group: a
        // link; n2 -> n3 other group: not; n3 -> n4 (anywhere): a link.
        assert_eq!(links, vec![None, Some(2), None, Some(4), None]);
        assert_eq!(
            graph.plan.max_placement(),
            Some((3, GroupId::from_index(2)))
        );
        // Re-placing a node recomputes the highest placement.
        let mut g = GraphBuilder::<()>::new("replaced");
        let a = g.node("a", noop());
        let b = g.node("b", noop());
        g.place(a, GroupId::from_index(5));
        g.place(b, GroupId::from_index(1));
        g.place(a, GroupId::from_index(0));
        let graph = g.build().unwrap();
        assert_eq!(
            graph.plan.max_placement(),
            Some((1, GroupId::from_index(1)))
        );
        // A group index no pool can have is an error at build.
        let mut g = GraphBuilder::<()>::new("huge");
        let a = g.node("a", noop());
        g.place(a, GroupId::from_index(1 << 30));
        let err = g.build().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::UnknownGroup);
        assert!(err.to_string().contains("'a'"), "{err}");
    }

    #[test]
    fn node_spec_stays_small() {
        // Building and running a large graph is mostly writing and reading these: keep them
        // at 24 bytes.
        assert_eq!(std::mem::size_of::<NodeSpec<()>>(), 24);
    }

    #[test]
    fn empty_graph_plan() {
        let g = GraphBuilder::<()>::new("nothing").build().unwrap();
        assert!(g.plan.sources.is_empty() && g.plan.nodes.is_empty());
        assert_eq!(g.edge_count(), 0);
    }
}
