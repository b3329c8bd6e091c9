//! A completed node's release of its successors: the dependency counters (one-predecessor
//! nodes need none; two-predecessor ones are decided from the class byte), and, on the failure
//! path, the account of the nodes never released.

use super::wide::LeafBatcher;
use super::{Run, RunRef, Task};
use crate::graph::{filled, reserve, WideJoins, CLASS_ONE, CLASS_RECORD, WIDE_JOIN};
use crate::sync::{self, Ordering};

impl<S> Run<S> {
    /// Completes node `node`'s dependency bookkeeping: when `release` (it succeeded and the run
    /// has not failed) its successors' counters are decremented and each one that reaches zero is
    /// handed to `ready`. Returns how many were. The caller must then call [`RunRef::settle`]
    /// with that number *before* queueing any of them.
    #[inline]
    pub(crate) fn release(&self, node: u32, release: bool, ready: impl FnMut(Task<S>)) -> usize {
        self.release_batched(node, release, None, ready)
    }

    /// Counts `node`'s completion in its successor `s`; returns whether `s` is now ready.
    #[inline]
    pub(crate) fn release_one(&self, node: u32, s: u32) -> bool {
        let d = self.plan.nodes[s as usize].indegree;
        // One predecessor (the common case): ready, no shared counter at all; our output
        // reaches the successor through the queue hand-off. Otherwise count up: a count of
        // d - 1 seen by a predecessor that has not yet counted means it is the last one (each
        // counts once), so the node is ready without a read-modify-write. The Acquire load (or
        // the AcqRel increment) pairs with the other predecessors' Release increments, so their
        // outputs are visible to whoever runs the node. The store of d keeps "released"
        // readable for `take_result`.
        if d != 1 {
            // A wide join counts the leaf first; the leaf's last counts in the root, whose
            // target is the join's non-empty leaves.
            let target = if d >= WIDE_JOIN {
                match self.leaf_arrive(node, s) {
                    Some(roots) => roots,
                    None => return false,
                }
            } else {
                d
            };
            return self.count_in(s, target);
        }
        true
    }

    /// Where a counter with target `target` stands when this run has counted `k` arrivals in
    /// it (see `graph::CounterCache`).
    #[inline(always)]
    pub(super) fn mark(&self, target: u32, k: u32) -> u32 {
        self.epoch.wrapping_mul(target).wrapping_add(k)
    }

    /// Counts one arrival in node `s`'s own counter, whose target is `target`; returns whether
    /// `s` is now ready.
    #[inline]
    pub(super) fn count_in(&self, s: u32, target: u32) -> bool {
        let pending = &self.pending[s as usize];
        let last = self.mark(target, target - 1);
        if pending.load(Ordering::Acquire) == last {
            pending.store(last.wrapping_add(1), Ordering::Relaxed);
            true
        } else {
            pending.fetch_add(1, Ordering::AcqRel) == last
        }
    }

    /// A predecessor's arrival at `s`, of release class `class` ([`CLASS_ONE`] or
    /// [`CLASS_TWO`]): whether `s` is now ready, decided without its record (see
    /// `Plan::classes`). Counted as in [`release_one`](Self::release_one).
    #[inline(always)]
    pub(crate) fn arrive_by_class(&self, s: u32, class: u8) -> bool {
        // Its runner reads the record soon, here or elsewhere: ask for it now, without waiting
        // for it.
        sync::prefetch(self.plan.nodes.as_ptr().wrapping_add(s as usize));
        class == CLASS_ONE || self.count_in(s, 2)
    }

    /// [`release`](Self::release), for a worker that may batch its arrivals at wide joins
    /// (`batcher`, when it batches for this run): a wide join's leaf arrival joins the batch
    /// when it is for the same leaf, and
    /// otherwise replaces it, the old batch being counted in its leaf
    /// ([`flush_leaf`](Self::flush_leaf)), which may make the old batch's join ready (handed to
    /// `ready` like a successor, and counted in the result). The caller flushes what is left in
    /// `batch` before it gives away the unit that keeps the run alive.
    #[inline]
    pub(crate) fn release_batched(
        &self,
        node: u32,
        release: bool,
        batcher: Option<&LeafBatcher<S>>,
        mut ready: impl FnMut(Task<S>),
    ) -> usize {
        let mut n = 0;
        if !release || self.is_failed() {
            self.mark_unreleased(node);
        } else {
            for &s in self.plan.successors(node) {
                let class = self.plan.class(s);
                let r = match batcher {
                    // Decided from the class byte, without the successor's record (see
                    // `Plan::classes`).
                    _ if class != CLASS_RECORD => self.arrive_by_class(s, class).then_some(s),
                    Some(b)
                        if self.plan.nodes[s as usize].indegree >= WIDE_JOIN
                            && b.run.get().is_some_and(|r| r.same(RunRef::new(self))) =>
                    {
                        self.batch_arrive(node, s, &b.batch)
                    }
                    _ => self.release_one(node, s).then_some(s),
                };
                if let Some(r) = r {
                    ready(Task::new(RunRef::new(self), r));
                    n += 1;
                }
            }
        }
        n
    }

    /// Marks `node`'s one-predecessor successors as never released. Their counters are not
    /// otherwise touched (see `release`), so without the mark `take_result` could not tell them
    /// from released ones. Only on the failure path.
    #[cold]
    fn mark_unreleased(&self, node: u32) {
        self.mark_unreleased_of(self.plan.successors(node));
    }

    /// Marks the one-predecessor nodes of `succ` (successors of one node) as never released;
    /// a span that finds its run failed marks the part it did not release.
    #[cold]
    pub(crate) fn mark_unreleased_of(&self, succ: &[u32]) {
        let nodes = &self.plan.nodes;
        let mut list = sync::lock(&self.unreleased);
        list.extend(succ.iter().filter(|&&s| nodes[s as usize].indegree == 1));
    }

    /// Nodes that were never released: a counter below the in-degree for several predecessors;
    /// for one predecessor, a mark or a predecessor that was itself never released. `None`
    /// when the count's memory cannot be allocated.
    pub(super) fn count_unreleased(&self) -> Option<usize> {
        let n = self.plan.nodes.len();
        // 0 unknown, 1 released, 2 not released.
        let mut state = filled(n, 0u8, "cancelled nodes' count").ok()?;
        for &u in sync::lock(&self.unreleased).iter() {
            state[u as usize] = 2;
        }
        let mut path = Vec::new();
        let mut count = 0;
        for v in 0..n {
            // Walk up the one-predecessor chain until a node whose state is known.
            let mut u = v;
            let known = loop {
                if state[u] != 0 {
                    break state[u];
                }
                let s = match self.plan.nodes[u].indegree {
                    0 => 1,
                    1 => {
                        reserve(&mut path, 1, "cancelled nodes' count").ok()?;
                        path.push(u);
                        u = self.plan.try_predecessors(u as u32).ok()?[0] as usize;
                        continue;
                    }
                    d if {
                        let t = WideJoins::of(&self.plan).target(u as u32, d);
                        self.pending[u].load(Ordering::Relaxed) == self.mark(t, t)
                    } =>
                    {
                        1
                    }
                    _ => 2,
                };
                state[u] = s;
                break s;
            };
            for w in path.drain(..) {
                state[w] = known;
            }
            if state[v] == 2 {
                count += 1;
            }
        }
        Some(count)
    }
}
