//! What a node body sees: its inputs ([`Inputs`]) and, on a worker, its worker's state and
//! identity and a way to submit nested graphs ([`NodeCtx`]).
//!
//! The run and the worker show themselves to a body only through the two narrow interfaces
//! defined here: [`RunAccess`] (the run's output slots and graph, implemented by `run::Run`) and
//! [`NodeHost`] (the part of a worker that its bodies use, owned by the worker, with the pool
//! behind [`Submit`]). So the graph side, whose bodies' signatures name `NodeCtx`, knows
//! nothing of the run, the registry or the worker. A body's context submits graphs whose
//! bodies take a context: `Submit` names [`Graph`], the one arrow back to the graph side.

use std::any::{Any, TypeId};
use std::cell::Cell;
use std::fmt;
use std::sync::Arc;
use std::task::Poll;

use crate::config::WorkerInfo;
use crate::error::{bounded, bounded_list, BoxError, Error, ErrorKind};
use crate::graph::Graph;
use crate::handle::GraphHandle;
use crate::ids::{NodeId, NodeRef, Placement, Priority};
use crate::later::{Completer, HandedOff};
use crate::output::{AnyValue, Slots, TakeError};

/// A deferred completion registered with [`NodeCtxExt::complete_when`](crate::backend::NodeCtxExt::complete_when).
pub(crate) type DeferFn<S> = Box<dyn FnMut(&S) -> Poll<Result<(), BoxError>> + Send>;

/// How the running body deferred its completion.
pub(crate) enum Deferral<S> {
    /// [`complete_when`](crate::backend::NodeCtxExt::complete_when): its worker polls it.
    Poll(DeferFn<S>),
    /// [`complete_later`](crate::backend::NodeCtxExt::complete_later): a `Completer`, called
    /// from any thread, completes it; this is the worker's side of their rendezvous.
    Later(HandedOff),
}

/// A node's view of its direct predecessors' outputs. CPU-heavy nodes
/// ([`GraphBuilder::cpu_node`](crate::GraphBuilder::cpu_node)) get only this; worker nodes get it
/// through [`NodeCtx`] (which dereferences to it).
pub struct Inputs<'a> {
    pub(crate) run: &'a dyn RunAccess,
    pub(crate) node: u32,
}

/// What `Inputs` needs of a run, without its state type (so `Inputs` stays two words wide and
/// CPU-lane bodies need no type parameter). Implemented by `run::Run`.
pub(crate) trait RunAccess: Sync {
    fn slots(&self) -> &Slots;
    fn successors(&self, node: u32) -> &[u32];
    /// A node's direct predecessors (their lists are built on first use: see
    /// `Plan::try_predecessors`).
    fn predecessors(&self, node: u32) -> Result<&[u32], Error>;
    fn node_name(&self, node: u32) -> &str;
    fn graph_uid(&self) -> u32;
    fn priority(&self, node: u32) -> Priority;
    fn graph_name(&self) -> &str;
    /// (origin graph, base offset) of a node's body: how its captured `NodeRef`s map here.
    fn origin_base(&self, node: u32) -> (u32, u32);
    /// Where node `id` of this run's graph is placed (`Any` for a node of another graph).
    fn placement_of(&self, id: NodeId) -> Placement;
    /// The error for output slots that could not be allocated.
    fn slots_too_large(&self) -> Error;
    /// The run itself, for the pool's side of a `Completer` (which knows its type).
    fn as_any(&self) -> &dyn Any;
    /// The priority of node `id` of this run's graph (`Normal` for a node of another graph).
    fn priority_of(&self, id: NodeId) -> Priority;
    /// Whether a backend marked node `id` of this run's graph as a device node (`false` for a
    /// node of another graph).
    fn is_device_node(&self, id: NodeId) -> bool;
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
    pub(crate) fn of(run: &'a dyn RunAccess, node: u32) -> Self {
        Inputs { run, node }
    }

    /// The output of `from`, which must be a direct predecessor of this node (an edge
    /// `from -> this`), created by the same builder as this node's body.
    ///
    /// Errors ([`ErrorKind::BadInput`]): `from` is not such a predecessor, its output is not a
    /// `T`, it left none, or this node took it ([`take`](Self::take)).
    pub fn input<T: 'static>(&self, from: NodeRef<T>) -> Result<&'a T, Error> {
        let index = self.predecessor(from.id, "reads")?;
        // SAFETY: `index` is a direct predecessor, so it completed before this node became
        // ready (its counter decrement happened-before our Acquire of it reaching zero).
        let out = self.run.slots().get(index).and_then(|s| unsafe { s.get() });
        // SAFETY: as above; only `index`'s only successor may take its value (`take` checks
        // that before it takes), and a node that is one takes it on this thread.
        match out.and_then(|o| unsafe { o.lend() }) {
            Some(v) => v.downcast_ref::<T>().ok_or_else(|| {
                self.bad_input(format!(
                    "reads node #{index} as {}, which is not its output type",
                    std::any::type_name::<T>()
                ))
            }),
            None if TypeId::of::<T>() == TypeId::of::<()>() => {
                // A `()` output is never stored; any `()` will do.
                Ok((&() as &dyn Any).downcast_ref::<T>().expect("T is ()"))
            }
            None if out.is_some_and(|o| o.is_taken()) => Err(self.bad_input(format!(
                "reads the output of {}, which it took",
                self.label(index)
            ))),
            None => Err(self.bad_input(format!("reads node #{index}, which left no output"))),
        }
    }

    /// Moves the output of `from` out of the run, by value: for a node that writes into what
    /// its predecessor made (a buffer written in place), without a lock or a copy. `from` must
    /// be a direct predecessor created by the same builder as this node's body, as for
    /// [`input`](Self::input), and **this node must be its only successor**, so that no other
    /// node can be reading the value: an edge declared with
    /// [`GraphBuilder::hand_on`](crate::graph::GraphBuilder::hand_on) has `build` check that;
    /// otherwise it is checked here.
    ///
    /// The value is gone from the run afterwards: the submitter's
    /// [`GraphOutput::get`](crate::output::GraphOutput::get) gives `None` for `from` (return it from
    /// this node to hand it on). A marker a backend attached to `from` (the GPU backend's event
    /// of its work) stays, so this node is still ordered after `from`'s device work. A `()`
    /// output is never stored: taking one gives `()`.
    ///
    /// Errors ([`ErrorKind::BadInput`], naming both nodes): `from` is not such a predecessor;
    /// it has another successor (named), which could read the value; this node read it with
    /// `input` before (that `&T` may still be alive) or took it before; the value is not a `T`
    /// (it stays where it is); `from` left none.
    ///
    /// ```
    /// use boundpool_scheduler::{GraphBuilder, PoolBuilder};
    ///
    /// let pool = PoolBuilder::new().workers(2).build()?;
    /// let mut g = GraphBuilder::new("in place");
    /// let a = g.node("a", |_| Ok(vec![1u32, 2, 3]));
    /// let b = g.node("b", move |ctx| {
    ///     let mut v = ctx.take(a)?; // no copy, no lock
    ///     v.iter_mut().for_each(|x| *x *= 10);
    ///     Ok(v)
    /// });
    /// g.hand_on(a, b);
    /// let out = pool.run(&g.build()?)?;
    /// assert_eq!(out.get(b), Some(&vec![10, 20, 30]));
    /// assert_eq!(out.get(a), None); // taken
    /// # Ok::<(), boundpool_scheduler::Error>(())
    /// ```
    pub fn take<T: 'static>(&self, from: NodeRef<T>) -> Result<T, Error> {
        let index = self.predecessor(from.id, "takes")?;
        let mut others: Vec<u32> = (self.run.successors(index).iter())
            .copied()
            .filter(|&s| s != self.node)
            .collect();
        if !others.is_empty() {
            others.dedup();
            let names = others.iter().map(|&o| self.label(o));
            return Err(self.bad_take(
                index,
                &format!(
                    "which {} other successor(s) may also read: {}; a node takes an output only \
                     as its only successor",
                    others.len(),
                    bounded_list(names, others.len(), ", ")
                ),
            ));
        }
        if TypeId::of::<T>() == TypeId::of::<()>() {
            // A `()` output is never stored; any `()` will do.
            let unit: Box<dyn Any> = Box::new(());
            return Ok(*unit.downcast::<T>().expect("T is ()"));
        }
        // SAFETY: `index` is a direct predecessor, so it completed before this node became
        // ready (as in `input`).
        let Some(out) = self.run.slots().get(index).and_then(|s| unsafe { s.get() }) else {
            return Err(self.bad_take(index, "which left no output"));
        };
        // SAFETY: this node is `index`'s only successor (checked above) and runs after it
        // completed: its worker's writes happened-before this node became ready (the dependency
        // counter's Release/Acquire, or the queue's hand-off), no other node of the run reads
        // its slot, and the run's finisher reads it only after this node completed (the
        // in-flight count's AcqRel). So this thread is the slot's only user while the body runs.
        unsafe { out.take_value::<T>() }.map_err(|e| {
            let why = match e {
                TakeError::Lent => "which it read with `input` before (that `&` may still be \
                                    alive): take it instead of reading it"
                    .to_string(),
                TakeError::Taken => "which it took before".to_string(),
                TakeError::Missing => "which left no value".to_string(),
                TakeError::OtherType => format!(
                    "as {}, which is not its output type",
                    std::any::type_name::<T>()
                ),
            };
            self.bad_take(index, &why)
        })
    }

    /// The direct predecessor `from` as a node of the graph being run, or the error naming
    /// why it is not one (`verb`: what this node does with it).
    fn predecessor(&self, from: NodeId, verb: &str) -> Result<u32, Error> {
        let (origin, base) = self.run.origin_base(self.node);
        if from.graph != origin {
            return Err(self.bad_input(format!(
                "{verb} node #{} of graph {}, which is not a node of the graph that defined it",
                from.index, from.graph
            )));
        }
        let index = base + from.index;
        if !self.run.predecessors(self.node)?.contains(&index) {
            return Err(self.bad_input(format!(
                "{verb} node #{index}, which is not a direct predecessor"
            )));
        }
        Ok(index)
    }

    /// Stores this node's output value (an error when the run's output slots cannot be
    /// allocated).
    ///
    /// # Safety
    /// Only the thread running this node may call this, before the node completes.
    #[inline]
    pub(crate) unsafe fn store_output(&self, value: AnyValue) -> Result<(), Error> {
        let Some(slot) = self.run.slots().get_or_alloc(self.node) else {
            return Err(self.run.slots_too_large());
        };
        // SAFETY: the caller runs this node, so it is the slot's only writer, and no successor
        // reads the slot before the node completes.
        unsafe { slot.set_value(value) };
        Ok(())
    }

    fn bad_input(&self, what: String) -> Error {
        Error::new(
            ErrorKind::BadInput,
            format!(
                "node '{}' (#{}) of graph '{}' {what}",
                bounded(self.node_name()),
                self.node,
                bounded(self.graph_name())
            ),
        )
    }

    /// `bad_input` for a take of node `index`'s output.
    fn bad_take(&self, index: u32, why: &str) -> Error {
        self.bad_input(format!("takes the output of {}, {why}", self.label(index)))
    }

    /// "node 'name' (#i)" of node `i` of the graph being run.
    fn label(&self, i: u32) -> String {
        format!("node '{}' (#{i})", bounded(self.run.node_name(i)))
    }

    /// This node's name.
    pub fn node_name(&self) -> &'a str {
        self.run.node_name(self.node)
    }

    /// This node's priority (its own, or its graph's): the GPU backend enqueues a node on the
    /// worker's stream of this level.
    pub fn priority(&self) -> Priority {
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
    ///
    /// # Panics
    /// If the graph's predecessor lists, built on first use, cannot be allocated (the message
    /// is that of an [`ErrorKind::TooLarge`] error; in a body, the node fails with it).
    pub fn predecessors(&self) -> impl Iterator<Item = NodeId> + 'a {
        let g = self.run.graph_uid();
        self.run
            .predecessors(self.node)
            .unwrap_or_else(|e| panic!("{e}"))
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

/// The part of a worker that the bodies it runs see: the state its start hook returned, its
/// identity, the pool (for nested submissions and completers), and the slot where a body
/// leaves its deferred completion. Owned by the worker thread; a [`NodeCtx`] borrows it.
pub(crate) struct NodeHost<S> {
    pub(crate) state: S,
    pub(crate) info: WorkerInfo,
    /// The pool this worker belongs to.
    pub(crate) pool: Arc<dyn Submit<S>>,
    /// How the running body deferred its completion (`complete_when`, `complete_later`), taken
    /// by the worker after the body.
    pub(crate) defer_slot: Cell<Option<Deferral<S>>>,
    /// A body running here deferred its completion (`defer_slot`) or waited for a nested graph
    /// and ran other nodes meanwhile: the worker's chain loop looks at either only when this is
    /// set (one flag to test per node, not two).
    pub(crate) attention: Cell<bool>,
}

impl<S> NodeHost<S> {
    pub(crate) fn new(state: S, info: WorkerInfo, pool: Arc<dyn Submit<S>>) -> Self {
        NodeHost {
            state,
            info,
            pool,
            defer_slot: Cell::new(None),
            attention: Cell::new(false),
        }
    }

    /// Called by `NodeCtx::complete_when` and `complete_later` from the running body. Returns
    /// the deferral it replaced.
    #[inline]
    pub(crate) fn set_deferred(&self, d: Deferral<S>) -> Option<Deferral<S>> {
        self.attention.set(true);
        self.defer_slot.replace(Some(d))
    }

    /// How the running body deferred its completion so far, if it did.
    pub(crate) fn deferral_kind(&self) -> Option<&'static str> {
        let d = self.defer_slot.take();
        let kind = match &d {
            None => None,
            Some(Deferral::Poll(_)) => Some("complete_when"),
            Some(Deferral::Later(_)) => Some("complete_later"),
        };
        self.defer_slot.set(d);
        kind
    }

    /// Whether the running body deferred its completion to a `Completer`.
    pub(crate) fn deferred_later(&self) -> bool {
        self.deferral_kind() == Some("complete_later")
    }
}

/// How a body reaches the pool that runs it (the pool's registry): nested graphs, and the
/// queue a `Completer` puts its node's completion on.
pub(crate) trait Submit<S>: Send + Sync {
    fn submit(&self, graph: &Graph<S>) -> Result<GraphHandle, Error>;

    /// A `Completer` for node `node` of `run` (the running body's), and the worker's side of
    /// it (`run/later.rs`).
    fn complete_later(self: Arc<Self>, run: &dyn RunAccess, node: u32) -> (Completer, HandedOff);
}

/// The context a worker node's body gets: its inputs (through `Deref` to [`Inputs`]), the
/// worker's state and identity, and nested submission.
pub struct NodeCtx<'a, S> {
    pub(crate) inputs: Inputs<'a>,
    pub(crate) host: &'a NodeHost<S>,
}

impl<S: Send + 'static> fmt::Debug for NodeCtx<'_, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NodeCtx")
            .field("graph", &self.inputs.graph_name())
            .field("node", &self.inputs.node_name())
            .field("worker", &self.host.info.index)
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
        &self.host.state
    }

    /// Which worker runs this node.
    pub fn worker_info(&self) -> &'a WorkerInfo {
        &self.host.info
    }

    /// Where node `id` of the running graph is placed ([`Placement::Any`] also for a node of
    /// another graph).
    pub fn placement_of(&self, id: NodeId) -> Placement {
        self.inputs.run.placement_of(id)
    }

    /// Submits `graph` to the pool running this node. Waiting on the handle from inside a node
    /// runs other nodes meanwhile, so nesting cannot deadlock the pool.
    pub fn submit(&self, graph: &Graph<S>) -> Result<GraphHandle, Error> {
        self.host.pool.submit(graph)
    }
}
