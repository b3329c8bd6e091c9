//! `GraphBuilder`: nodes, edges, placements, priorities and inlined subgraphs, recorded as they
//! come into the node records a `Plan` keeps (bad ids are kept aside for `build` to report).

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU32 as StdAtomicU32, Ordering as StdOrdering};
use std::sync::Arc;

use super::memory::{reserve, too_large, AllocFailure};
use super::plan::{
    InlinedBody, MaxPlacement, NameTable, NodeSpec, Plan, FLAG_CPU, FLAG_INLINED, FLAG_UNIT,
    SUCC_EXTERNAL,
};
use super::Graph;
use crate::body::{CpuFn, ThinBody, WorkerFn};
use crate::ctx::{Inputs, NodeCtx};
use crate::error::{BoxError, Error};
use crate::ids::{is_unit, NodeId, NodeRef, Placement, Priority};

/// Hands out a distinct id to every builder so edges between graphs can be told apart.
static NEXT_GRAPH_UID: StdAtomicU32 = StdAtomicU32::new(1);

/// An edge that `build` rejects: the first one added.
#[derive(Clone, Copy)]
pub(super) enum BadEdge {
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
/// # Examples
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
    pub(super) uid: u32,
    pub(super) name: Cow<'static, str>,
    pub(super) nodes: Vec<NodeSpec<S>>,
    pub(super) names: NameTable,
    /// Edges beyond their source's second successor, in the order added (the first two of a
    /// node's successors go into its record at once).
    pub(super) overflow: Vec<(u32, u32)>,
    /// Edges added (and accepted).
    pub(super) edges: usize,
    /// One bit per node: the node has a predecessor (so it is not a source).
    pub(super) has_pred: Vec<u64>,
    /// Every edge so far goes from a lower to a higher index: node order is a topological order.
    pub(super) forward: bool,
    /// Some node has more than one predecessor (runs need dependency counters).
    pub(super) joins: bool,
    /// Nodes whose output is not `()`.
    pub(super) valued: Vec<u32>,
    /// Nodes with the highest placements, kept up to date while nodes are placed.
    pub(super) max_placement: MaxPlacement,
    /// A node was placed again: `max_placement` must be recomputed at build.
    pub(super) replaced: bool,
    /// The priority of the graph's nodes that have no override of their own.
    pub(super) priority: Priority,
    /// Per-node overrides of `priority`, in the order given (the last one for a node wins).
    pub(super) prio_overrides: Vec<(u32, Priority)>,
    /// Nodes a backend marked as device nodes (`backend::GraphBuilderExt::mark_device_node`).
    pub(super) device_nodes: Vec<u32>,
    /// A placement that named a bad node, group or domain; reported by `build`.
    pub(super) bad_placement: Option<(NodeId, Option<Placement>)>,
    /// The first bad edge; reported by `build`.
    pub(super) bad_edge: Option<BadEdge>,
    /// Edges declared with `hand_on`: `build` checks that each target is its source's only
    /// successor.
    pub(super) handoffs: Vec<(u32, u32)>,
    /// The first allocation of the builder's records that failed, reported by `build`. The
    /// nodes and edges it could not keep are counted (for the error's estimate).
    failure: Option<AllocFailure>,
    /// Nodes whose memory could not be allocated: counted, not kept.
    lost_nodes: usize,
    /// The nodes and edges `with_capacity` was asked for (for the error's estimate).
    capacity: (usize, usize),
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

    /// An empty graph with room for `nodes` nodes and `edges` edges. Room that cannot be
    /// allocated is not an abort: [`build`](Self::build) then fails with
    /// [`ErrorKind::TooLarge`](crate::error::ErrorKind::TooLarge), as it does when adding nodes or
    /// edges runs out of memory.
    pub fn with_capacity(name: impl Into<Cow<'static, str>>, nodes: usize, edges: usize) -> Self {
        let mut b = GraphBuilder {
            uid: NEXT_GRAPH_UID.fetch_add(1, StdOrdering::Relaxed),
            name: name.into(),
            nodes: Vec::new(),
            names: NameTable::default(),
            overflow: Vec::new(),
            edges: 0,
            has_pred: Vec::new(),
            forward: true,
            joins: false,
            valued: Vec::new(),
            max_placement: MaxPlacement::default(),
            replaced: false,
            priority: Priority::Normal,
            prio_overrides: Vec::new(),
            device_nodes: Vec::new(),
            bad_placement: None,
            bad_edge: None,
            handoffs: Vec::new(),
            failure: None,
            lost_nodes: 0,
            capacity: (nodes, edges),
        };
        // Edges mostly live in their source's record; only those past a node's second
        // successor are listed apart, so reserve nothing for them.
        let room = (b.nodes.try_reserve_exact(nodes))
            .map_err(|_| AllocFailure::of::<NodeSpec<S>>("node records", nodes))
            .and_then(|()| b.names.reserve_exact(nodes))
            .and_then(|()| {
                (b.has_pred.try_reserve_exact(nodes.div_ceil(64)))
                    .map_err(|_| AllocFailure::of::<u64>("predecessor bits", nodes.div_ceil(64)))
            });
        b.failure = room.err();
        b
    }

    /// The graph's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Number of nodes so far.
    pub fn len(&self) -> usize {
        self.nodes.len() + self.lost_nodes
    }

    /// Whether the graph has no nodes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    #[inline]
    fn push(&mut self, name: &str, spec: NodeSpec<S>) -> NodeId {
        match self.record(name, spec) {
            Ok(index) => NodeId {
                graph: self.uid,
                index,
            },
            Err(f) => self.lose(f),
        }
    }

    /// A node whose memory could not be allocated: the failure is kept for `build` to report
    /// (the first one), the node only counted, under an id no kept node has (from the top of
    /// the range down, so an edge naming it is a bad edge, counted in `bad_edge`).
    #[cold]
    #[inline(never)]
    fn lose(&mut self, f: AllocFailure) -> NodeId {
        self.failure.get_or_insert(f);
        self.lost_nodes += 1;
        NodeId {
            graph: self.uid,
            index: (u32::MAX - 1).saturating_sub(self.lost_nodes as u32),
        }
    }

    /// Keeps a node's record, name and bits: every allocation is made before anything is
    /// stored, so a failed one leaves the builder as it was. The per-node vectors grow
    /// together (`grow_nodes`), so one check covers the record, the name's end and the bits.
    #[inline]
    fn record(&mut self, name: &str, spec: NodeSpec<S>) -> Result<u32, AllocFailure> {
        let len = self.nodes.len();
        if len == self.nodes.capacity() {
            self.grow_nodes()?;
        }
        self.names.reserve_text(name.len())?;
        let valued = !spec.is_unit();
        if valued {
            reserve(&mut self.valued, 1, "valued nodes' list")?;
        }
        let index = u32::try_from(len)
            .ok()
            .filter(|&i| i < u32::MAX)
            .expect("a graph holds at most 2^32 - 2 nodes");
        if index % 64 == 0 {
            self.has_pred.push(0);
        }
        if valued {
            self.valued.push(index);
        }
        self.nodes.push(spec);
        self.names.push(name);
        Ok(index)
    }

    /// Grows the node records as `push` would, and the names' ends and the predecessor bits to
    /// match, so that `record` pushes onto all three after one check.
    #[cold]
    #[inline(never)]
    fn grow_nodes(&mut self) -> Result<(), AllocFailure> {
        let len = self.nodes.len();
        (self.nodes.try_reserve(1))
            .map_err(|_| AllocFailure::of::<NodeSpec<S>>("node records", len + 1))?;
        let cap = self.nodes.capacity();
        self.names.reserve_ends(cap)?;
        let words = cap.div_ceil(64);
        (self
            .has_pred
            .try_reserve_exact(words.saturating_sub(self.has_pred.len())))
        .map_err(|_| AllocFailure::of::<u64>("predecessor bits", words))
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
            Some(b) => self.note_bad_edge(b),
        }
        self
    }

    /// An edge `build` rejects (the first one is reported), or, once memory ran out, an edge
    /// to or from a node not kept: counted only (`build` reports the failure).
    #[cold]
    #[inline(never)]
    fn note_bad_edge(&mut self, b: BadEdge) {
        if self.failure.is_some() {
            self.edges += 1;
        } else if self.bad_edge.is_none() {
            self.bad_edge = Some(b);
        }
    }

    /// Adds an edge `from -> to` along which `to` takes `from`'s output by value
    /// ([`Inputs::take`]): [`build`](Self::build) checks that `to` is `from`'s only successor
    /// (no other node could read the value), and fails with [`ErrorKind::BadInput`] naming
    /// both nodes and another successor if it is not. (`take` checks it again, along any edge,
    /// when it happens: declaring the edge reports the mistake before anything runs.)
    ///
    /// [`ErrorKind::BadInput`]: crate::ErrorKind::BadInput
    pub fn hand_on(&mut self, from: impl Into<NodeId>, to: impl Into<NodeId>) -> &mut Self {
        let (f, t) = (from.into(), to.into());
        let edges = self.edges;
        self.edge(f, t);
        if self.edges > edges && self.failure.is_none() {
            match reserve(&mut self.handoffs, 1, "hand-on edges") {
                Ok(()) => self.handoffs.push((f.index, t.index)),
                Err(e) => _ = self.failure.get_or_insert(e),
            }
        }
        self
    }

    /// Records edge `f -> t` (two distinct nodes this builder keeps).
    #[inline(always)]
    fn add_edge(&mut self, f: u32, t: u32) {
        self.edges += 1;
        self.forward &= f < t;
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
                self.push_overflow(f, t);
            }
            _ => self.push_overflow(f, t),
        }
    }

    /// Lists edge `f -> t` past its source's second successor.
    #[inline(always)]
    fn push_overflow(&mut self, f: u32, t: u32) {
        if self.overflow.len() == self.overflow.capacity() {
            if let Err(e) = reserve(&mut self.overflow, 1, "successor lists") {
                self.failure.get_or_insert(e);
                return;
            }
        }
        self.overflow.push((f, t));
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
        if self.failure.is_some() {
            return self;
        }
        if id.graph == self.uid && (id.index as usize) < self.nodes.len() {
            match reserve(&mut self.prio_overrides, 1, "priority overrides") {
                Ok(()) => self.prio_overrides.push((id.index, priority)),
                Err(e) => _ = self.failure.get_or_insert(e),
            }
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
            let (body_plan, body_index) = match spec.inlined() {
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
                if self.failure.is_some() {
                    self.edges += 1; // counted only
                } else {
                    self.add_edge(offset + from, offset + to);
                }
            }
        }
        match reserve(
            &mut self.prio_overrides,
            plan.prio_overrides.len(),
            "priority overrides",
        ) {
            Ok(()) => (self.prio_overrides)
                .extend(plan.prio_overrides.iter().map(|&(i, p)| (offset + i, p))),
            Err(e) => self.failure = self.failure.or(Some(e)),
        }
        let marked = (0..plan.nodes.len() as u32).filter(|&i| plan.is_device_node(i));
        self.device_nodes.extend(marked.map(|i| offset + i));
        Subgraph {
            inner: plan.uid,
            outer: self.uid,
            offset,
            len: plan.nodes.len() as u32,
            sources: plan.sources.clone(),
            sinks: plan.sinks(),
        }
    }

    /// Marks `node` as a device node (`backend::GraphBuilderExt::mark_device_node`).
    pub(crate) fn mark_device(&mut self, node: NodeId) {
        if node.graph == self.uid && (node.index as usize) < self.nodes.len() {
            self.device_nodes.push(node.index);
        } else {
            self.bad_placement = self.bad_placement.or(Some((node, None)));
        }
    }

    /// Validates the graph and freezes it.
    ///
    /// Errors: an edge naming a node this graph does not have ([`ErrorKind::UnknownNode`]), a node
    /// of another graph ([`ErrorKind::ForeignNode`]), a placement on a group index no pool can
    /// have ([`ErrorKind::UnknownGroup`]), or a cycle ([`ErrorKind::Cycle`], naming nodes on it).
    ///
    /// [`ErrorKind::UnknownNode`]: crate::ErrorKind::UnknownNode
    /// [`ErrorKind::ForeignNode`]: crate::ErrorKind::ForeignNode
    /// [`ErrorKind::UnknownGroup`]: crate::ErrorKind::UnknownGroup
    /// [`ErrorKind::Cycle`]: crate::ErrorKind::Cycle
    ///
    /// A graph whose records cannot be allocated, here or while it was built, is an
    /// [`ErrorKind::TooLarge`](crate::error::ErrorKind::TooLarge) error naming its estimate
    /// ([`estimate_graph_bytes`](crate::graph::estimate_graph_bytes)) and the limit, not an abort.
    ///
    /// Nothing runs before this succeeds.
    pub fn build(mut self) -> Result<Graph<S>, Error> {
        if let Some(f) = self.failure {
            let nodes = self.len().max(self.capacity.0);
            return Err(too_large(
                &self.name,
                nodes,
                self.edges.max(self.capacity.1),
                f,
            ));
        }
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
