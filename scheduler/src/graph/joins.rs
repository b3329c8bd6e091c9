//! The plan's wide joins (two-level dependency counters for joins of many predecessors), and
//! the counter sets that a plan's successful runs leave for its next runs. Both are built or
//! filled by runs but describe the plan, so they live with it; the counting is in `run/`.

use super::memory::{reserve, zeros, AllocFailure};
use super::Plan;
use crate::sync::{self, AtomicU32, Mutex};

/// In-degree from which a join counts its predecessors in leaf counters first (see
/// [`WideJoins`]).
pub(crate) const WIDE_JOIN: u32 = if cfg!(loom) { 3 } else { 256 };
/// Predecessors, by consecutive node index, that share a leaf counter.
const LEAF_SPAN: u32 = if cfg!(loom) { 2 } else { 128 };

/// The leaf of a wide join with `leaves` leaves that predecessor `p` counts in:
/// `(p / LEAF_SPAN) % leaves`, without the division when no wrap is needed (a join's
/// predecessors are mostly numbered below `leaves * LEAF_SPAN`, and a mapped node of a
/// map-reduce pays for every instruction here).
#[inline]
pub(crate) fn leaf_of(p: u32, leaves: u32) -> u32 {
    let q = p / LEAF_SPAN;
    if q < leaves {
        q
    } else {
        q % leaves
    }
}

/// Two-level dependency counters for the joins with at least [`WIDE_JOIN`] predecessors (issue
/// 14: a million predecessors finishing on every worker all incremented one counter). A
/// predecessor `p` of such a join counts in leaf `(p / LEAF_SPAN) % leaves` of the join; the one
/// that completes a leaf (its quota, fixed here from the edges) counts once in the join's own
/// counter, whose target is the number of non-empty leaves. Predecessors are mostly numbered in
/// ranges and stolen in ranges, so a leaf is shared by a few workers at most. A worker running
/// a span batches its nodes' arrivals at one leaf (`Run::release_batched`) and counts them with
/// one increment when the span ends or the leaf changes, so the join is ready at most one
/// span's part after its last predecessor completes.
#[derive(Debug, Default)]
pub(crate) struct WideJoins {
    /// (join node, first leaf, leaves, non-empty leaves), sorted by node.
    joins: Box<[(u32, u32, u32, u32)]>,
    /// The quota of each leaf, every join's leaves in a row.
    quota: Box<[u32]>,
}

impl WideJoins {
    /// The plan's wide joins, built by its first run ([`try_of`](Self::try_of), in `Run::new`).
    #[inline]
    pub(crate) fn of<S>(plan: &Plan<S>) -> &WideJoins {
        match plan.wide_joins.get() {
            Some(w) => w,
            None => Self::first_of(plan),
        }
    }

    /// [`of`](Self::of) before any run built them (a run does, in `Run::new`).
    #[cold]
    #[inline(never)]
    fn first_of<S>(plan: &Plan<S>) -> &WideJoins {
        Self::try_of(plan).unwrap_or_else(|f| panic!("{f:?}"))
    }

    /// The plan's wide joins, built the first time (their memory that cannot be allocated is
    /// the caller's error to report).
    pub(crate) fn try_of<S>(plan: &Plan<S>) -> Result<&WideJoins, AllocFailure> {
        if let Some(w) = plan.wide_joins.get() {
            return Ok(w);
        }
        // Two runs may build them at once: one set is kept, the other dropped.
        let _ = plan.wide_joins.set(Self::build(plan)?);
        Ok(plan.wide_joins.get().expect("set just now"))
    }

    fn build<S>(plan: &Plan<S>) -> Result<WideJoins, AllocFailure> {
        let mut joins = Vec::new();
        let mut first = 0u32;
        for (i, spec) in plan.nodes.iter().enumerate() {
            if spec.indegree >= WIDE_JOIN {
                let leaves = spec.indegree.div_ceil(LEAF_SPAN);
                reserve(&mut joins, 1, "wide joins")?;
                joins.push((i as u32, first, leaves, 0));
                first += leaves;
            }
        }
        if joins.is_empty() {
            return Ok(WideJoins::default());
        }
        let mut quota = zeros(first as usize, "wide joins' leaf quotas")?;
        for p in 0..plan.nodes.len() as u32 {
            for &s in plan.successors(p) {
                if plan.nodes[s as usize].indegree >= WIDE_JOIN {
                    let k = joins.partition_point(|j| j.0 < s);
                    let (_, first, leaves, _) = joins[k];
                    quota[(first + leaf_of(p, leaves)) as usize] += 1;
                }
            }
        }
        for j in joins.iter_mut() {
            j.3 = quota[j.1 as usize..(j.1 + j.2) as usize]
                .iter()
                .filter(|&&q| q > 0)
                .count() as u32;
        }
        Ok(WideJoins {
            joins: joins.into(),
            quota: quota.into(),
        })
    }

    /// Leaf slots a run needs.
    pub(crate) fn leaves(&self) -> usize {
        self.quota.len()
    }

    /// Join `node`'s (node, first leaf, leaves, non-empty leaves).
    #[inline]
    pub(crate) fn join(&self, node: u32) -> (u32, u32, u32, u32) {
        let k = self.joins.partition_point(|j| j.0 < node);
        self.joins[k]
    }

    /// What `node`'s counter counts up to: its in-degree, or its non-empty leaves when wide.
    pub(crate) fn target(&self, node: u32, indegree: u32) -> u32 {
        if indegree >= WIDE_JOIN {
            self.join(node).3
        } else {
            indegree
        }
    }

    /// The number of arrivals that complete leaf `leaf` (an index among all the plan's leaves).
    #[inline]
    pub(crate) fn quota(&self, leaf: usize) -> u32 {
        self.quota[leaf]
    }
}

/// The dependency counters of one run: `pending` (one a node) and the wide joins' `leaves`.
/// A counter whose target is `t` starts at `epoch × t` (wrapping) and counts up to `(epoch +
/// 1) × t`.
pub(crate) struct Counters {
    pub(crate) pending: Box<[AtomicU32]>,
    pub(crate) leaves: Box<[AtomicU32]>,
    pub(crate) epoch: u32,
}

/// How many counter sets a plan keeps for its next runs (more runs of one graph at once
/// allocate their own).
const CACHED_COUNTERS: usize = 2;

/// A plan's dependency counters left by its runs that succeeded, for its next runs (see
/// `Run::epoch`). A run that succeeded counted every arrival at every join, so each counter
/// stands at its target above where it started: the next run counts on from there instead of
/// allocating (and zeroing, on the submitting thread) `4 × nodes` bytes, and its workers find
/// the counters where the last run left them. The cost is the set kept while the graph lives.
pub(crate) struct CounterCache(Mutex<Vec<Counters>>);

impl CounterCache {
    pub(crate) fn new() -> Self {
        CounterCache(Mutex::new(Vec::new()))
    }

    /// A set that an earlier run left, if any.
    pub(crate) fn take(&self) -> Option<Counters> {
        sync::lock(&self.0).pop()
    }

    /// Keeps the set of a run that succeeded (its counters at their targets), unless the cache
    /// is full.
    pub(crate) fn keep(&self, counters: impl FnOnce() -> Counters) {
        let mut cache = sync::lock(&self.0);
        if cache.len() < CACHED_COUNTERS {
            cache.push(counters());
        }
    }
}
