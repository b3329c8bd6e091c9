//! Small shared identifiers, a leaf module: nodes (`NodeId`, `NodeRef`), worker groups and
//! domains (`GroupId`, `DomainId`) and where a node may run (`Placement`, with the bits a node
//! record keeps it in), and a node's `Priority`. The graph builder and the run side both use them; they use neither.

use std::fmt;
use std::marker::PhantomData;

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

/// Whether a node's output type is `()`: such a node stores nothing (no slot, no allocation),
/// and its output reads as `()` wherever a `NodeRef<()>` of its graph is asked for.
#[inline(always)]
pub(crate) fn is_unit<T: 'static>() -> bool {
    std::any::TypeId::of::<T>() == std::any::TypeId::of::<()>()
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

/// Identifies a worker group of a pool (the host group, or one GPU's workers).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct GroupId(pub(crate) u32);

impl GroupId {
    /// The group's position in the pool's group list.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// Identifies a domain of a pool: a set of groups whose workers all serve the nodes placed on
/// it (see [`PoolBuilder::domain`](crate::PoolBuilder::domain)).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct DomainId(pub(crate) u32);

impl DomainId {
    /// The domain's position in the order [`PoolBuilder::domain`](crate::PoolBuilder::domain) was called.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// Bits of [`NodeSpec::meta`]: the placement in the low 24 bits, then the flags.
pub(crate) const PLACEMENT_MASK: u32 = 0x00FF_FFFF;
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
    pub(crate) fn bits(self) -> Option<u32> {
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

/// How urgent a node is: a worker that looks for work takes high before normal before low
/// (see the crate README, "Priorities and admission").
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default, PartialOrd, Ord)]
pub enum Priority {
    /// Latency-critical work: taken first. On a GPU worker, enqueued on its high-priority stream.
    High,
    /// The default.
    #[default]
    Normal,
    /// Batch work: taken when nothing more urgent waits, and at least once in every 16 takes
    /// of a worker while it has work.
    Low,
}

impl Priority {
    /// The node-record bits of this level (`0` is normal, so default records need no bits).
    pub(crate) const fn bits(self) -> u32 {
        match self {
            Priority::Normal => 0,
            Priority::High => 1,
            Priority::Low => 2,
        }
    }

    pub(crate) const fn from_bits(bits: u32) -> Self {
        match bits {
            1 => Priority::High,
            2 => Priority::Low,
            _ => Priority::Normal,
        }
    }
}
