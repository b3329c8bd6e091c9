//! Graphs: `GraphBuilder` collects nodes and edges (`builder.rs`), `build` checks them
//! (`validate.rs`) and freezes them into a `Plan` of node records that any number of runs share
//! (`plan.rs`), with the plan's wide joins and cached counter sets (`joins.rs`); `Graph` is the
//! validated graph's public face, `dot.rs` draws it, and `memory.rs` estimates what its records
//! cost.

use std::fmt;
use std::sync::Arc;

use crate::ids::{NodeId, Placement, Priority};

mod builder;
mod dot;
mod joins;
mod memory;
mod plan;
mod validate;

pub use self::builder::{GraphBuilder, Subgraph};
pub(crate) use self::joins::{leaf_of, Counters, WideJoins, WIDE_JOIN};
pub use self::memory::estimate_graph_bytes;
pub(crate) use self::memory::{filled, reserve, too_large, AllocFailure};
pub(crate) use self::plan::{NodeSpec, Plan, CLASS_ONE, CLASS_RECORD};

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
    ///
    /// # Panics
    /// If the predecessor lists, built on first use, cannot be allocated (the message is that
    /// of an [`ErrorKind::TooLarge`](crate::error::ErrorKind::TooLarge) error).
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
}

#[cfg(all(test, not(loom)))]
mod tests;
