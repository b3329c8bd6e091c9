//! Completing a node: releasing its successors (from their class bytes, through a span task for
//! a wide fan-out, into a span's wide-join batch, or on the general path), queueing the ready
//! ones where their placement and level say, completing nodes whose `Completer` queued their
//! completion, and finishing and settling runs whose in-flight count reached zero here.

use std::panic::{catch_unwind, AssertUnwindSafe};

use super::life::{abort_with, panic_message};
use super::WorkerThread;
use crate::graph::{NodeSpec, CLASS_ONE, CLASS_RECORD};
use crate::ids::{Placement, ANY_GROUP, DOMAIN_BIT};
use crate::priority::Priority;
use crate::run::{span_chunk, RunRef, Task, SPAN_GRAIN, SPAN_MIN};

impl<S: Send + 'static> WorkerThread<S> {
    /// Releases the successors of node `i`: one that may run here is returned as the
    /// continuation, the others are queued (here, or on their group's injector) and sleepers
    /// are woken. A link of a chain hands on its successor without any check.
    #[inline]
    pub(super) fn complete(&self, run: RunRef<S>, i: u32, ok: bool) -> Option<u32> {
        if ok {
            if let Some(s) = run.plan.nodes[i as usize].chain_successor() {
                return Some(s);
            }
        }
        self.complete_general(run, i, ok)
    }

    #[inline]
    pub(super) fn runs_here(&self, spec: &NodeSpec<S>) -> bool {
        let p = spec.placement_bits();
        p == ANY_GROUP
            || p == self.group as u32
            || (p & DOMAIN_BIT != 0
                && self.registry.groups[self.group]
                    .domains
                    .contains(&(p & !DOMAIN_BIT)))
    }

    /// `complete_general` for the commonest nodes after chain links: no successor (a leaf), or
    /// one or two inline in `spec` (a completed node of `run`), each of release class one or two
    /// predecessors (a tree's inner nodes, a wavefront's cells). Decided from the class bytes
    /// alone, as `complete_general` decides these, without its span, batch, placement and
    /// level checks and its queueing closure: the first ready successor is the continuation,
    /// a second ready one is pushed here with a unit of this worker's credit; with none ready
    /// the node's unit becomes a spare one. `None`: not such a node, or its run failed (the
    /// general path marks the successors unreleased).
    #[inline(always)]
    pub(super) fn release_by_class(
        &self,
        run: RunRef<S>,
        node: u32,
        spec: &NodeSpec<S>,
    ) -> Option<Option<u32>> {
        let (a, b) = match *spec.inline_successors()? {
            [] => {
                // A leaf: its unit becomes a spare one.
                if let Some(done) = self.credit.leave(run) {
                    self.finish_run(done);
                }
                return Some(None);
            }
            [a] => (a, None),
            [a, b] => (a, Some(b)),
            _ => return None,
        };
        let plan = &run.plan;
        let ca = plan.class(a);
        if ca == CLASS_RECORD && b.is_none() {
            // One successor read from its record: a wide join that a span's node arrives at
            // (a map-reduce's map) is counted in the span's batch here too.
            return self.arrive_at_wide_join(run, node, a);
        }
        let cb = match b {
            Some(b) => plan.class(b),
            None => CLASS_ONE,
        };
        if ca == CLASS_RECORD || cb == CLASS_RECORD || run.is_failed() {
            return None;
        }
        let ready_a = run.arrive_by_class(a, ca);
        let ready_b = b.filter(|&b| run.arrive_by_class(b, cb));
        Some(match (ready_a, ready_b) {
            (true, Some(b)) => {
                // The node's unit passes to `a`, the continuation; `b` takes one of the credit.
                if let Some(done) = self.credit.enter(run) {
                    self.finish_run(done);
                }
                self.local.push(Task::new(run, b));
                self.registry.sleep.notify_local(self.group);
                Some(a)
            }
            (true, None) => Some(a),
            (false, b) => {
                if b.is_none() {
                    if let Some(done) = self.credit.leave(run) {
                        self.finish_run(done);
                    }
                }
                b
            }
        })
    }

    /// Node `node`'s (of `run`, completed) arrival at its one successor `s`, when that is a
    /// wide join and this worker batches for `run` (a span's node): counted in the batch, and
    /// a join an older batch's flush made ready is the continuation (where it may run here,
    /// as `complete_general` decides) or queued with the node's unit. `None`: not such an
    /// arrival, for `complete_general`.
    #[inline(never)]
    pub(super) fn arrive_at_wide_join(
        &self,
        run: RunRef<S>,
        node: u32,
        s: u32,
    ) -> Option<Option<u32>> {
        match run.arrive_batched(node, s, &self.batcher)? {
            None => {
                // The node's unit becomes a spare one.
                if let Some(done) = self.credit.leave(run) {
                    self.finish_run(done);
                }
                Some(None)
            }
            Some(j) => {
                let spec = &run.plan.nodes[j as usize];
                if self.runs_here(spec) {
                    return Some(Some(j));
                }
                // `j` carries this node's unit: once it is queued the run may end any moment.
                if self.queue(Task::new(run, j), spec.placement(), spec.is_prioritized()) {
                    self.registry.sleep.notify_local(self.group);
                }
                Some(None)
            }
        }
    }

    /// Releases the successors of a node that has more than one, or whose one successor may
    /// be waiting on others or run elsewhere (a node with [`SPAN_MIN`] or more hands them to a
    /// span task, see `run_span`). The first ready one that may run here becomes the
    /// continuation and takes over the node's in-flight unit. The others are queued; each
    /// takes a unit from this worker's credit before it is queued, so the node's own unit keeps
    /// the run alive until the loop is over, except the last one when there is no continuation:
    /// it takes over the node's unit (no count traffic for a node whose one successor runs on
    /// another worker), and the run is not touched after it is queued.
    #[inline(never)]
    pub(super) fn complete_general(&self, run: RunRef<S>, i: u32, ok: bool) -> Option<u32> {
        if ok {
            let fan_out = run.plan.successors(i).len();
            if fan_out >= SPAN_MIN && !run.is_failed() {
                // A wide fan-out: one span task, which takes over the node's unit, instead of a
                // task per successor. Queued (popped next, here) rather than run from this
                // frame, so that fan-outs that follow fan-outs do not nest.
                let chunks = fan_out.div_ceil(span_chunk(fan_out));
                self.local.push(Task::span(run, i, 0, chunks));
                return None;
            }
        }
        let nodes = &run.plan.nodes;
        let mut cont = None;
        let mut held: Option<(Task<S>, Placement, bool)> = None;
        let mut pushed_here = false;
        run.release_batched(i, ok, Some(&self.batcher), |t| {
            // A successor placed anywhere at the normal level runs here or goes on this deque,
            // decided from its class byte: its record is first read by whoever runs it.
            let (here, place, prio) = if run.plan.class(t.node()) != CLASS_RECORD {
                (true, Placement::Any, false)
            } else {
                let spec = &nodes[t.node() as usize];
                (
                    self.runs_here(spec),
                    spec.placement(),
                    spec.is_prioritized(),
                )
            };
            if cont.is_none() && here {
                cont = Some(t.node());
                return;
            }
            if let Some((prev, place, prio)) = held.replace((t, place, prio)) {
                if let Some(done) = self.credit.enter(run) {
                    self.finish_run(done);
                }
                pushed_here |= self.queue(prev, place, prio);
            }
        });
        match (cont, held) {
            (_, None) => {}
            (Some(_), Some((t, place, prio))) => {
                if let Some(done) = self.credit.enter(run) {
                    self.finish_run(done);
                }
                pushed_here |= self.queue(t, place, prio);
            }
            (None, Some((t, place, prio))) => {
                // `t` carries this node's unit: once it is queued the run may end any moment.
                pushed_here |= self.queue(t, place, prio);
                if pushed_here {
                    self.registry.sleep.notify_local(self.group);
                }
                return None;
            }
        }
        if pushed_here {
            self.registry.sleep.notify_local(self.group);
        }
        if cont.is_none() {
            // The node's unit becomes a spare one of this worker (`Credit`): the run finishes
            // when the spare units are given back, not here, unless the switch gave back
            // another run's last units.
            if let Some(done) = self.credit.leave(run) {
                self.finish_run(done);
            }
        }
        cont
    }

    /// Queues a ready task placed on `place`: on this worker's deque (returns `true`; the caller
    /// wakes a peer once for all), or on its group's or domain's injector, waking a worker
    /// there. A domain's tasks always go to its injector, even from one of its workers: only
    /// the own group steals from this deque, and every worker of the domain may run them.
    #[inline]
    pub(super) fn queue(&self, t: Task<S>, place: Placement, prio: bool) -> bool {
        if prio {
            return self.queue_level(t, place);
        }
        match place {
            Placement::Group(g) if g.index() != self.group => {
                self.registry.groups[g.index()].injector.push(t);
                self.registry.sleep.notify_group(g.index());
                false
            }
            Placement::Domain(d) => {
                let domain = &self.registry.domains[d.index()];
                domain.injector.push(t);
                self.registry.sleep.notify_groups(&domain.groups);
                false
            }
            _ => {
                self.local.push(t);
                true
            }
        }
    }

    /// `queue` for a task of another level than normal.
    #[cold]
    #[inline(never)]
    pub(super) fn queue_level(&self, t: Task<S>, place: Placement) -> bool {
        let p = t.run().plan.nodes[t.node() as usize].priority();
        let reg = &*self.registry;
        let level = reg.level(p);
        match place {
            Placement::Group(g) if g.index() != self.group => {
                level.groups[g.index()].push(t);
                reg.sleep.notify_group(g.index());
                false
            }
            Placement::Domain(d) => {
                level.domains[d.index()].push(t);
                reg.sleep.notify_groups(&reg.domains[d.index()].groups);
                false
            }
            _ => {
                match p {
                    Priority::High => self.high.push(t),
                    _ => self.low.push(t),
                }
                true
            }
        }
    }

    /// Releases chunks `lo..hi` of node `i`'s successor list (a span task, which holds one
    /// unit of `run`): while the span is larger than [`SPAN_GRAIN`] successors, its upper half
    /// is queued here for a thief (a wide fan-out reaches every worker in a few steals of
    /// halves, as rayon splits a parallel iterator), then the rest is released in order, each
    /// ready successor that may run here run at once, the others queued where they belong.
    #[inline]
    pub(super) fn run_span(&self, run: RunRef<S>, i: u32, lo: usize, mut hi: usize) {
        let succ: &[u32] = run.plan.successors(i);
        let chunk = span_chunk(succ.len());
        while hi - lo > 1 && (hi - lo) * chunk > SPAN_GRAIN {
            let mid = lo + (hi - lo) / 2;
            if let Some(done) = self.credit.enter(run) {
                self.finish_run(done);
            }
            self.local.push(Task::span(run, i, mid, hi));
            self.registry.sleep.notify_local(self.group);
            hi = mid;
        }
        let part = &succ[lo * chunk..(hi * chunk).min(succ.len())];
        // The successors run from here, one at a time: the deque's top is this span's upper
        // halves, which `pop_local_of` would only pop and push back after each of them.
        self.nesting.set(self.nesting.get() + 1);
        // The outermost span batches its successors' arrivals at wide joins (see `batcher`);
        // its unit keeps the run alive until the batch is flushed below.
        let batching = self.batcher.run.get().is_none();
        if batching {
            self.batcher.run.set(Some(run));
        }
        for (k, &s) in part.iter().enumerate() {
            if run.is_failed() {
                run.mark_unreleased_of(&part[k..]);
                break;
            }
            if !run.release_one(i, s) {
                continue;
            }
            if let Some(done) = self.credit.enter(run) {
                self.finish_run(done);
            }
            let spec = &run.plan.nodes[s as usize];
            // Run here what would otherwise go to this deque (any worker's, or this group's);
            // a domain's nodes go to its injector, where every group of it looks.
            let p = spec.placement_bits();
            if (p == ANY_GROUP || p == self.group as u32) && !spec.is_prioritized() {
                self.execute_task(Task::new(run, s));
            } else if self.queue(Task::new(run, s), spec.placement(), spec.is_prioritized()) {
                self.registry.sleep.notify_local(self.group);
            }
        }
        if batching {
            self.flush_batch(run);
            self.batcher.run.set(None);
        }
        self.nesting.set(self.nesting.get() - 1);
        // The span's own unit; `succ` and `part` are not used past here.
        if let Some(done) = self.credit.leave(run) {
            self.finish_run(done);
        }
    }

    /// Counts this worker's batched wide-join arrivals (`batcher`, of `run`, which the caller
    /// keeps alive with a unit) in their leaf, and queues the join if that made it ready.
    pub(super) fn flush_batch(&self, run: RunRef<S>) {
        let Some(b) = self.batcher.batch.take() else {
            return;
        };
        if run.flush_leaf(b) {
            if let Some(done) = self.credit.enter(run) {
                self.finish_run(done);
            }
            let spec = &run.plan.nodes[b.join as usize];
            if self.queue(
                Task::new(run, b.join),
                spec.placement(),
                spec.is_prioritized(),
            ) {
                self.registry.sleep.notify_local(self.group);
            }
        }
    }

    /// A task that is not a node: a span ([`run_span`](Self::run_span)), or a node's
    /// completion that its `Completer` queued (`Task::completion`, carrying the node's unit),
    /// completed here as the worker that ran the body would have, its continuation run here.
    #[inline(never)]
    pub(super) fn run_queued(&self, task: Task<S>) {
        let (run, node) = (task.run(), task.node());
        match (task.completed(), task.chunks()) {
            (Some(ok), _) => {
                if let Some(c) = self.complete(run, node, ok) {
                    self.execute_task(Task::new(run, c));
                }
            }
            (None, Some((lo, hi))) => self.run_span(run, node, lo, hi),
            (None, None) => unreachable!("a node task is run by execute_task"),
        }
    }

    /// Gives this worker's spare in-flight units back (see `Credit`), finishing their run if
    /// that was the last of it, and settles what finished.
    #[inline]
    pub(super) fn flush_credit(&self) {
        if let Some(run) = self.credit.flush() {
            self.finish_run(run);
        }
        self.settle_finished();
    }

    /// `run`'s count reached zero here: this worker has it to itself until it is settled (in
    /// `settle_finished`, once no frame holding a `&Run` argument of it is live).
    #[cold]
    pub(super) fn finish_run(&self, run: RunRef<S>) {
        self.finished.borrow_mut().push(self.registry.finish(&run));
    }

    /// Settles the runs that finished on this worker since the last call. Called only where no
    /// function holding a `&Run` argument is on the stack (see `Registry::finish`).
    #[inline]
    pub(super) fn settle_finished(&self) {
        if self.finished.borrow().is_empty() {
            return;
        }
        let done = std::mem::take(&mut *self.finished.borrow_mut());
        for f in done {
            // The waiter's waker and the run's destructors (bodies, unclaimed outputs) are
            // foreign code: a panic there must not unwind into a node waiting on a nested graph
            // (it would be taken for that node's panic) nor skip the other waiters.
            if let Err(p) = catch_unwind(AssertUnwindSafe(|| f.settle())) {
                abort_with(&format!(
                    "pool '{}': worker {}: a panic while completing a graph (in its waker or a \
                     destructor of its nodes or outputs): {}",
                    crate::error::bounded(&self.registry.name),
                    crate::error::bounded(&self.registry.infos[self.index].name),
                    crate::error::bounded(&panic_message(&*p)),
                ));
            }
        }
    }
}
