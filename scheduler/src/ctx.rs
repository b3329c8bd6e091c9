//! What a node body sees: its inputs, its worker, and a way to submit nested graphs.

use std::any::{Any, TypeId};
use std::fmt;
use std::task::Poll;

use crate::config::WorkerInfo;
use crate::error::{BoxError, Error, ErrorKind};
use crate::graph::AnyValue;
use crate::handle::GraphHandle;
use crate::ids::{NodeId, NodeRef, Placement};
use crate::registry::Registry;
use crate::run::{Run, Slots};
use crate::worker::WorkerThread;
use crate::Graph;

/// A deferred completion registered with [`NodeCtxExt::complete_when`](crate::backend::NodeCtxExt::complete_when).
pub(crate) type DeferFn<S> = Box<dyn FnMut(&S) -> Poll<Result<(), BoxError>> + Send>;

/// A node's view of its direct predecessors' outputs. CPU-heavy nodes
/// ([`GraphBuilder::cpu_node`](crate::GraphBuilder::cpu_node)) get only this; worker nodes get it
/// through [`NodeCtx`] (which dereferences to it).
pub struct Inputs<'a> {
    pub(crate) run: &'a dyn RunAccess,
    pub(crate) node: u32,
}

/// What `Inputs` needs of a run, without its state type (so `Inputs` stays two words wide and
/// CPU-lane bodies need no type parameter).
pub(crate) trait RunAccess: Sync {
    fn slots(&self) -> &Slots;
    fn successors(&self, node: u32) -> &[u32];
    fn predecessors(&self, node: u32) -> &[u32];
    fn node_name(&self, node: u32) -> &str;
    fn graph_uid(&self) -> u32;
    fn priority(&self, node: u32) -> crate::Priority;
    fn graph_name(&self) -> &str;
    /// (origin graph, base offset) of a node's body: how its captured `NodeRef`s map here.
    fn origin_base(&self, node: u32) -> (u32, u32);
    /// Where node `id` of this run's graph is placed (`Any` for a node of another graph).
    fn placement_of(&self, id: NodeId) -> Placement;
    /// The priority of node `id` of this run's graph (`Normal` for a node of another graph).
    fn priority_of(&self, id: NodeId) -> crate::Priority;
}

impl<S: Send + 'static> RunAccess for Run<S> {
    fn slots(&self) -> &Slots {
        &self.slots
    }
    fn successors(&self, node: u32) -> &[u32] {
        self.plan.successors(node)
    }
    fn predecessors(&self, node: u32) -> &[u32] {
        self.plan.predecessors(node)
    }
    fn node_name(&self, node: u32) -> &str {
        &self.plan.names[node as usize]
    }
    fn graph_uid(&self) -> u32 {
        self.plan.uid
    }
    fn priority(&self, node: u32) -> crate::Priority {
        self.plan.nodes[node as usize].priority()
    }
    fn graph_name(&self) -> &str {
        &self.plan.name
    }
    fn origin_base(&self, node: u32) -> (u32, u32) {
        self.plan.nodes[node as usize].origin_base(self.plan.uid)
    }
    fn placement_of(&self, id: NodeId) -> Placement {
        self.plan
            .check(id)
            .map_or(Placement::Any, |i| self.plan.nodes[i as usize].placement())
    }
    fn priority_of(&self, id: NodeId) -> crate::Priority {
        self.plan.check(id).map_or(crate::Priority::Normal, |i| {
            self.plan.nodes[i as usize].priority()
        })
    }
}

impl fmt::Debug for Inputs<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Inputs")
            .field("graph", &self.graph_name())
            .field("node", &self.node_name())
            .finish()
    }
}

impl<'a> Inputs<'a> {
    #[inline]
    pub(crate) fn of<S: Send + 'static>(run: &'a Run<S>, node: u32) -> Self {
        Inputs { run, node }
    }

    /// The output of `from`, which must be a direct predecessor of this node (an edge
    /// `from -> this`), created by the same builder as this node's body.
    pub fn input<T: 'static>(&self, from: NodeRef<T>) -> Result<&'a T, Error> {
        let (origin, base) = self.run.origin_base(self.node);
        if from.id.graph != origin {
            return Err(self.bad_input(format!(
                "reads node #{} of graph {}, which is not a node of the graph that defined it",
                from.id.index, from.id.graph
            )));
        }
        let index = base + from.id.index;
        if !self.run.predecessors(self.node).contains(&index) {
            return Err(self.bad_input(format!(
                "reads node #{index}, which is not a direct predecessor"
            )));
        }
        // SAFETY: `index` is a direct predecessor, so it completed before this node became
        // ready (its counter decrement happened-before our Acquire of it reaching zero).
        let out = self.run.slots().get(index).and_then(|s| unsafe { s.get() });
        match out.and_then(|o| o.value.as_deref()) {
            Some(v) => (v as &(dyn Any + Send + Sync))
                .downcast_ref::<T>()
                .ok_or_else(|| {
                    self.bad_input(format!(
                        "reads node #{index} as {}, which is not its output type",
                        std::any::type_name::<T>()
                    ))
                }),
            None if TypeId::of::<T>() == TypeId::of::<()>() => {
                // A `()` output is never stored; any `()` will do.
                Ok((&() as &dyn Any).downcast_ref::<T>().expect("T is ()"))
            }
            None => Err(self.bad_input(format!("reads node #{index}, which left no output"))),
        }
    }

    /// Stores this node's output value.
    ///
    /// # Safety
    /// Only the thread running this node may call this, before the node completes.
    #[inline]
    pub(crate) unsafe fn store_output(&self, value: AnyValue) {
        // SAFETY: the caller runs this node, so it is the slot's only writer, and no successor
        // reads the slot before the node completes.
        unsafe { self.run.slots().get_or_alloc(self.node).set_value(value) }
    }

    fn bad_input(&self, what: String) -> Error {
        Error::new(
            ErrorKind::BadInput,
            format!(
                "node '{}' (#{}) of graph '{}' {what}",
                crate::error::bounded(self.node_name()),
                self.node,
                crate::error::bounded(self.graph_name())
            ),
        )
    }

    /// This node's name.
    pub fn node_name(&self) -> &'a str {
        self.run.node_name(self.node)
    }

    /// This node's priority (its own, or its graph's): the GPU backend enqueues a node on the
    /// worker's stream of this level.
    pub fn priority(&self) -> crate::Priority {
        self.run.priority(self.node)
    }

    /// The name of the graph being run.
    pub fn graph_name(&self) -> &'a str {
        self.run.graph_name()
    }

    /// This node's id in the graph being run.
    pub fn node_id(&self) -> NodeId {
        NodeId {
            graph: self.run.graph_uid(),
            index: self.node,
        }
    }

    /// Direct predecessors, as ids of the graph being run.
    pub fn predecessors(&self) -> impl Iterator<Item = NodeId> + 'a {
        let g = self.run.graph_uid();
        self.run
            .predecessors(self.node)
            .iter()
            .map(move |&index| NodeId { graph: g, index })
    }

    /// Direct successors, as ids of the graph being run.
    pub fn successors(&self) -> impl Iterator<Item = NodeId> + 'a {
        let g = self.run.graph_uid();
        self.run
            .successors(self.node)
            .iter()
            .map(move |&index| NodeId { graph: g, index })
    }
}

/// The context a worker node's body gets: its inputs (through `Deref` to [`Inputs`]), the
/// worker's state and identity, and nested submission.
pub struct NodeCtx<'a, S> {
    pub(crate) inputs: Inputs<'a>,
    pub(crate) worker: &'a WorkerThread<S>,
}

impl<S: Send + 'static> fmt::Debug for NodeCtx<'_, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NodeCtx")
            .field("graph", &self.inputs.graph_name())
            .field("node", &self.inputs.node_name())
            .field("worker", &self.worker.index)
            .finish()
    }
}

impl<'a, S: Send + 'static> std::ops::Deref for NodeCtx<'a, S> {
    type Target = Inputs<'a>;
    fn deref(&self) -> &Inputs<'a> {
        &self.inputs
    }
}

impl<'a, S: Send + 'static> NodeCtx<'a, S> {
    /// The state this worker's start hook returned (for the GPU backend: its bound context
    /// and streams).
    pub fn worker_state(&self) -> &'a S {
        &self.worker.state
    }

    /// Which worker runs this node.
    pub fn worker_info(&self) -> &'a WorkerInfo {
        &self.worker.registry.infos[self.worker.index]
    }

    /// Where node `id` of the running graph is placed ([`Placement::Any`] also for a node of
    /// another graph).
    pub fn placement_of(&self, id: NodeId) -> Placement {
        self.inputs.run.placement_of(id)
    }

    /// Submits `graph` to the pool running this node. Waiting on the handle from inside a node
    /// runs other nodes meanwhile, so nesting cannot deadlock the pool.
    pub fn submit(&self, graph: &Graph<S>) -> Result<GraphHandle, Error> {
        Registry::submit(&self.worker.registry, graph)
    }
}
