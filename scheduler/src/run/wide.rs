//! A run's side of the wide joins (`graph::WideJoins`): leaf arrivals, and a worker's batching
//! of the arrivals of a span's nodes at one leaf (one read-modify-write per batch).

use std::cell::Cell;
use std::fmt;

use super::{Run, RunRef};
use crate::graph::{leaf_of, WideJoins, WIDE_JOIN};
use crate::sync::Ordering;

/// Counters per leaf slot in `Run::leaves`: one leaf per 128-byte line, so workers finishing
/// neighbouring ranges of predecessors do not share a line.
pub(super) const LEAF_STRIDE: usize = if cfg!(loom) { 1 } else { 32 };

/// Arrivals of one worker's predecessors at one leaf of a wide join, not yet counted in the
/// leaf (see `Run::release_batched`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct LeafBatch {
    /// The join node.
    pub(crate) join: u32,
    /// The leaf's index among all the plan's leaves.
    leaf: u32,
    /// Arrivals counted in this batch (at least 1).
    count: u32,
}

/// A worker's batching of wide-join arrivals (see `Run::release_batched`).
pub(crate) struct LeafBatcher<S> {
    /// The run whose arrivals are batched, if any (the caller keeps it alive while set).
    pub(crate) run: Cell<Option<RunRef<S>>>,
    /// Arrivals at one leaf of a wide join of `run`, not yet counted.
    pub(crate) batch: Cell<Option<LeafBatch>>,
}

impl<S> LeafBatcher<S> {
    pub(crate) fn new() -> Self {
        LeafBatcher {
            run: Cell::new(None),
            batch: Cell::new(None),
        }
    }
}

impl<S> fmt::Debug for LeafBatcher<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LeafBatcher({:?})", self.batch.get())
    }
}

impl<S> Run<S> {
    /// Node `node`'s arrival at wide join `s` counted in `batcher`'s batch, when the batcher
    /// batches for this run, as [`release_batched`](Self::release_batched) counts it: `None`
    /// when it does not (or `s` is not a wide join, or the run failed), else the join that an
    /// older batch's flush made ready, if any.
    #[inline]
    pub(crate) fn arrive_batched(
        &self,
        node: u32,
        s: u32,
        batcher: &LeafBatcher<S>,
    ) -> Option<Option<u32>> {
        if self.plan.nodes[s as usize].indegree < WIDE_JOIN
            || !batcher.run.get().is_some_and(|r| r.same(RunRef::new(self)))
            || self.is_failed()
        {
            return None;
        }
        Some(self.batch_arrive(node, s, &batcher.batch))
    }

    /// Predecessor `p`'s arrival at wide join `s`, batched (see `release_batched`). Returns a
    /// join that the flush of an older batch made ready.
    #[inline(never)]
    pub(super) fn batch_arrive(
        &self,
        p: u32,
        s: u32,
        batch: &Cell<Option<LeafBatch>>,
    ) -> Option<u32> {
        let wide = WideJoins::of(&self.plan);
        let (_, first, leaves, _) = wide.join(s);
        let leaf = first + leaf_of(p, leaves);
        match batch.get() {
            Some(b) if b.leaf == leaf => {
                batch.set(Some(LeafBatch {
                    count: b.count + 1,
                    ..b
                }));
                None
            }
            old => {
                batch.set(Some(LeafBatch {
                    join: s,
                    leaf,
                    count: 1,
                }));
                old.and_then(|b| self.flush_leaf(b).then_some(b.join))
            }
        }
    }

    /// Counts a batch of arrivals in its leaf (one read-modify-write for all of them); returns
    /// whether that made its join ready. Orderings as for one arrival (`leaf_arrive`): the
    /// batch's predecessors ran on this thread before the Release half of the increment.
    pub(crate) fn flush_leaf(&self, b: LeafBatch) -> bool {
        let wide = WideJoins::of(&self.plan);
        let quota = wide.quota(b.leaf as usize);
        let counter = &self.leaves[b.leaf as usize * LEAF_STRIDE];
        let before = self.mark(quota, quota - b.count);
        // The leaf's last arrivals leave it at its target, as `count_in` does, so that the
        // next run of the plan counts on from there.
        let last = if counter.load(Ordering::Acquire) == before {
            counter.store(self.mark(quota, quota), Ordering::Relaxed);
            true
        } else {
            counter.fetch_add(b.count, Ordering::AcqRel) == before
        };
        last && self.count_in(b.join, wide.join(b.join).3)
    }

    /// Counts predecessor `p`'s completion in its leaf of wide join `s`. Returns the join's root
    /// target when `p` completed the leaf (it then counts in the root), else `None`. Orderings
    /// as for the root: the leaf's last predecessor acquires the others' Release increments and
    /// passes them on with its own increment of the root.
    #[inline(never)]
    pub(super) fn leaf_arrive(&self, p: u32, s: u32) -> Option<u32> {
        let wide = WideJoins::of(&self.plan);
        let (_, first, leaves, roots) = wide.join(s);
        let leaf = (first + leaf_of(p, leaves)) as usize;
        let quota = wide.quota(leaf);
        let counter = &self.leaves[leaf * LEAF_STRIDE];
        let before = self.mark(quota, quota - 1);
        let last = if counter.load(Ordering::Acquire) == before {
            // Left at its target for the next run, as in `count_in`.
            counter.store(self.mark(quota, quota), Ordering::Relaxed);
            true
        } else {
            counter.fetch_add(1, Ordering::AcqRel) == before
        };
        last.then_some(roots)
    }
}
