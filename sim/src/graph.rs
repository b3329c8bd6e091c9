//! What the simulator runs: a rank-annotated [`GraphDesc`] (the ranks crate's, lowered with
//! its `plan::lower`) and, per node, what the real node's body would cost and where on its
//! rank it runs.

use boundpool_ranks::{DataId, GraphDesc, On, Wire};
use boundpool_scheduler::Priority;

/// What a node is, beside its place in the [`GraphDesc`].
#[derive(Clone, Debug, PartialEq)]
pub struct NodeSpec {
    /// Its kind: the cost model's key.
    pub kind: String,
    /// A GPU node (its body launches work on its worker's stream) or a host node.
    pub gpu: bool,
    /// The worker group of its rank it is placed on (index into the machine's groups).
    pub group: usize,
    /// Its level (`GraphBuilder::node_priority`).
    pub priority: Priority,
    /// Bytes of its output, sent to each rank that reads it.
    pub out_bytes: u64,
    /// Multiplies the kind's sampled costs (a ragged tile's fraction of a whole one).
    pub scale: f64,
}

impl NodeSpec {
    /// A host node of `kind` on group 0, normal level, 8 bytes of output.
    pub fn host(kind: impl Into<String>) -> Self {
        NodeSpec {
            kind: kind.into(),
            gpu: false,
            group: 0,
            priority: Priority::Normal,
            out_bytes: 8,
            scale: 1.0,
        }
    }

    /// A GPU node of `kind` on group 0, normal level, 8 bytes of output.
    pub fn gpu(kind: impl Into<String>) -> Self {
        NodeSpec {
            gpu: true,
            ..NodeSpec::host(kind)
        }
    }

    /// On worker group `g` of its rank.
    pub fn group(mut self, g: usize) -> Self {
        self.group = g;
        self
    }

    /// At level `p`.
    pub fn priority(mut self, p: Priority) -> Self {
        self.priority = p;
        self
    }

    /// With `bytes` of output.
    pub fn bytes(mut self, bytes: u64) -> Self {
        self.out_bytes = bytes;
        self
    }

    /// Costs scaled by `s`.
    pub fn scale(mut self, s: f64) -> Self {
        self.scale = s;
        self
    }
}

/// A graph to simulate: the rank-annotated description every rank would build (names,
/// placement by rank or owned datum, edges) and a [`NodeSpec`] per node.
#[derive(Clone, Debug)]
pub struct SimGraph {
    /// The description `boundpool_ranks::plan::lower` lowers, as the real runs do.
    pub desc: GraphDesc,
    /// Per node, in node order.
    pub nodes: Vec<NodeSpec>,
    /// Floating-point operations of one run (for TFLOP/s; 0 when not known).
    pub flops: f64,
}

impl SimGraph {
    /// An empty graph named `name`, one run in flight.
    pub fn new(name: impl Into<String>) -> Self {
        let mut desc = GraphDesc::new(name);
        desc.runs_in_flight = 1;
        SimGraph {
            desc,
            nodes: Vec::new(),
            flops: 0.0,
        }
    }

    /// Adds a datum owned by `owner` (a node that writes it runs there).
    pub fn datum(&mut self, name: impl Into<String>, owner: usize) -> DataId {
        self.desc.datum(name, owner)
    }

    /// Adds a node on `on` (a rank, or the owner of the datum it writes); returns its index.
    pub fn node(&mut self, name: impl Into<String>, on: impl Into<On>, spec: NodeSpec) -> u32 {
        let i = self.desc.node(name, on, Wire::Plain);
        self.nodes.push(spec);
        i
    }

    /// Adds an edge: `to` reads `from`'s output, after it.
    pub fn edge(&mut self, from: u32, to: u32) -> &mut Self {
        self.desc.edge(from, to);
        self
    }

    /// Nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether it has no node.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }
}
