//! The rank-annotated description of a graph: what every rank builds the same, before any
//! rank, thread or message exists.

use std::fmt;

/// A datum with an owner rank: a node that writes it runs there (owner computes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DataId(pub u32);

/// Where a node runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum On {
    /// On this rank.
    Rank(usize),
    /// On the rank that owns this datum (owner computes).
    Writes(DataId),
}

impl From<usize> for On {
    fn from(rank: usize) -> Self {
        On::Rank(rank)
    }
}

impl From<DataId> for On {
    fn from(d: DataId) -> Self {
        On::Writes(d)
    }
}

/// How a node's output crosses to another rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Wire {
    /// It cannot: an edge to another rank is an error at `build`.
    Local,
    /// Plain data (`bytemuck::Pod` values, and `Vec`s, boxed slices and arrays of them): sent
    /// from the value's own memory.
    Plain,
    /// Encoded with `serde` (postcard) into a byte buffer, decoded on arrival.
    Serde,
    /// A device buffer, staged through page-locked host memory: copied out in chunks on the
    /// producer's device, each chunk sent once its copy is done, uploaded on the consumer's.
    Device,
    /// A device buffer sent with NCCL (`ncclSend` / `ncclRecv`, its length first as a host
    /// message): an NCCL operation, issued in the lowering's one order on both ranks.
    Nccl,
}

impl fmt::Display for Wire {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Wire::Local => "local",
            Wire::Plain => "plain",
            Wire::Serde => "serde",
            Wire::Device => "device",
            Wire::Nccl => "nccl",
        })
    }
}

/// One node of a [`GraphDesc`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeDesc {
    /// Its name (in errors, traces and the cross-rank check).
    pub name: String,
    /// Where it runs.
    pub on: On,
    /// How its output crosses ranks.
    pub wire: Wire,
    /// Its output type's name (part of the cross-rank check; `""` where unknown).
    pub type_name: String,
}

/// A datum of a [`GraphDesc`]: a name and the rank that owns it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DatumDesc {
    /// Its name.
    pub name: String,
    /// The rank that owns it.
    pub owner: usize,
}

/// One NCCL collective of a graph: its members, one node on each rank (each rank's part of the
/// operation), which every rank issues in the lowering's one order of NCCL operations
/// ([`Lowering::nccl_order`](crate::plan::Lowering::nccl_order)): NCCL matches operations by
/// their order on a communicator, not by tags.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CollectiveDesc {
    /// Its name (in errors).
    pub name: String,
    /// Its member nodes, by index: one per rank.
    pub members: Vec<u32>,
}

/// A rank-annotated graph: nodes that name their rank or the datum they write, and edges by
/// node index. [`RankGraphBuilder`](crate::RankGraphBuilder) makes one beside the node bodies;
/// the simulator (or a graph file) can make one without bodies and lower it the same way.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GraphDesc {
    /// The graph's name.
    pub name: String,
    /// Nodes, by index.
    pub nodes: Vec<NodeDesc>,
    /// Edges `(from, to)` by node index: `to` reads `from`'s output, after it.
    pub edges: Vec<(u32, u32)>,
    /// Data, by [`DataId`].
    pub data: Vec<DatumDesc>,
    /// Runs of this graph that may be in flight at once on a rank (each has its own tags).
    pub runs_in_flight: u32,
    /// NCCL collectives, each a set of member nodes (one per rank).
    pub collectives: Vec<CollectiveDesc>,
}

impl GraphDesc {
    /// An empty description named `name`, with 4 runs in flight.
    pub fn new(name: impl Into<String>) -> Self {
        GraphDesc {
            name: name.into(),
            nodes: Vec::new(),
            edges: Vec::new(),
            data: Vec::new(),
            runs_in_flight: 4,
            collectives: Vec::new(),
        }
    }

    /// Adds a collective over member nodes `members` (one per rank); returns its index.
    pub fn collective(&mut self, name: impl Into<String>, members: Vec<u32>) -> u32 {
        self.collectives.push(CollectiveDesc {
            name: name.into(),
            members,
        });
        (self.collectives.len() - 1) as u32
    }

    /// Adds a datum owned by `owner`.
    pub fn datum(&mut self, name: impl Into<String>, owner: usize) -> DataId {
        self.data.push(DatumDesc {
            name: name.into(),
            owner,
        });
        DataId((self.data.len() - 1) as u32)
    }

    /// Adds a node; returns its index.
    pub fn node(&mut self, name: impl Into<String>, on: impl Into<On>, wire: Wire) -> u32 {
        self.nodes.push(NodeDesc {
            name: name.into(),
            on: on.into(),
            wire,
            type_name: String::new(),
        });
        (self.nodes.len() - 1) as u32
    }

    /// Adds an edge by node index.
    pub fn edge(&mut self, from: u32, to: u32) -> &mut Self {
        self.edges.push((from, to));
        self
    }

    /// `'name' (#index)` of node `i`, for messages.
    pub(crate) fn describe(&self, i: u32) -> String {
        match self.nodes.get(i as usize) {
            Some(n) => format!("'{}' (#{i})", crate::error::bounded(&n.name)),
            None => format!("#{i}"),
        }
    }
}
