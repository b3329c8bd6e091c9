//! A run as its nodes' bodies see it: `ctx`'s [`RunAccess`], through which `Inputs` reads the
//! run's output slots and graph without naming the run.

use std::any::Any;

use super::Run;
use crate::ctx::RunAccess;
use crate::error::Error;
use crate::graph::{too_large, AllocFailure};
use crate::ids::{NodeId, Placement, Priority};
use crate::output::{Slot, Slots};

impl<S: Send + 'static> RunAccess for Run<S> {
    fn slots(&self) -> &Slots {
        &self.slots
    }
    fn successors(&self, node: u32) -> &[u32] {
        self.plan.successors(node)
    }
    fn predecessors(&self, node: u32) -> Result<&[u32], Error> {
        self.plan.try_predecessors(node)
    }
    fn node_name(&self, node: u32) -> &str {
        &self.plan.names[node as usize]
    }
    fn graph_uid(&self) -> u32 {
        self.plan.uid
    }
    fn priority(&self, node: u32) -> Priority {
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
    fn priority_of(&self, id: NodeId) -> Priority {
        self.plan
            .check(id)
            .map_or(Priority::Normal, |i| self.plan.nodes[i as usize].priority())
    }
    fn is_device_node(&self, id: NodeId) -> bool {
        self.plan
            .check(id)
            .is_some_and(|i| self.plan.is_device_node(i))
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn slots_too_large(&self) -> Error {
        let n = self.plan.nodes.len();
        let f = AllocFailure::of::<Slot>("output slots", n);
        too_large(&self.plan.name, n, self.plan.edges, f)
    }
}
