//! Running nodes: a task (a node or a span), the chain loop over a node's continuations with
//! one landing pad for a panicking body, and the slow paths: a failed run's skipped nodes,
//! CPU-heavy nodes (here or on the host-work lane), bodies whose run time is sampled or whose
//! slice is traced, and bodies that failed or deferred their completion.

use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Instant;

use super::life::{abort_with, panic_message};
use super::{Deferred, WorkerThread, SERVICE_EVERY};
use crate::ctx::{Deferral, Inputs, NodeCtx};
use crate::error::{BoxError, Error, ErrorKind};
use crate::graph::{NodeSpec, CLASS_ONE};
use crate::metrics::SAMPLE_EVERY;
use crate::priority::Priority;
use crate::registry::Registry;
use crate::run::{Run, RunRef, Task};
use crate::sync::{self, Ordering};
use crate::trace::TraceSink;

/// How many records past a chain link's successor the chain loop asks the cache for: a chain
/// walked out of cache is a dependent walk the hardware prefetcher does not keep ahead of, and
/// links are usually laid out in order (otherwise the hint is wasted, never wrong).
const CHAIN_AHEAD: usize = 160;
/// `running` between node bodies.
const NO_NODE: u32 = u32::MAX;

impl<S: Send + 'static> WorkerThread<S> {
    /// Runs `task` and the chain of continuations it hands on. A panicking node body unwinds to
    /// here (one landing pad for the whole chain instead of a `catch_unwind` per node); the
    /// chain loop keeps the running node in `running`, so the landing pad knows which failed.
    pub(super) fn execute(&self, task: Task<S>) {
        if self.credit.holds_other(task.run()) {
            self.flush_credit();
        }
        match task.chunks() {
            None => self.execute_task(task),
            // A span, or a completion a `Completer` queued (out of line: this stays as small
            // as it was before completion tasks, and is inlined into the worker's loop).
            Some(_) => self.run_queued(task),
        }
        self.settle_finished();
    }

    pub(super) fn execute_task(&self, task: Task<S>) {
        let run = task.run();
        let mut running = task.node();
        loop {
            let mut cur = running;
            match catch_unwind(AssertUnwindSafe(|| self.execute_chain(run, &mut cur))) {
                Ok(()) => return,
                Err(p) => {
                    if cur == NO_NODE {
                        // The scheduler's own code panicked: its state cannot be trusted (a
                        // node might complete twice), so stop here rather than corrupt runs.
                        abort_with(&format!(
                            "pool '{}': worker {}: a panic outside a node body (in a waker, a \
                             metrics recorder, an output's destructor, or the scheduler itself): {}",
                            crate::error::bounded(&self.registry.name),
                            crate::error::bounded(&self.registry.infos[self.index].name),
                            crate::error::bounded(&panic_message(&*p)),
                        ));
                    }
                    // The body unwound past its own `nodes_run` count.
                    self.counters().nodes_run.add(1);
                    // A deferred completion the body registered before it panicked dies with
                    // it: left in the slot, it was taken for the next body's (which then waited
                    // on the dead node's poll). A nested wait's count needs no re-read here:
                    // the chain loop starts again from the count.
                    if self.host.attention.replace(false) {
                        self.drop_deferral();
                    }
                    run.fail(node_panicked(&run, cur, &*p));
                    match self.complete(run, cur, false) {
                        Some(s) => running = s,
                        None => return,
                    }
                }
            }
        }
    }

    /// The loop of a chain of continuations, starting at node `*running`. They all belong to
    /// `run`, so its node records are read from a slice held in registers, and one `NodeCtx`
    /// serves the whole chain (only its node changes). `*running` names the node whose body
    /// runs ([`NO_NODE`] between bodies, except from a chain link's body to its successor's,
    /// where nothing can panic).
    #[inline(always)]
    pub(super) fn execute_chain(&self, run: RunRef<S>, running: &mut u32) {
        // Two instantiations: a pool without a trace (the usual case) keeps no trace state in
        // the loop and checks for none per node.
        if self.registry.trace.is_some() {
            self.chain_loop::<true>(run, running)
        } else {
            self.chain_loop::<false>(run, running)
        }
    }

    #[inline(always)]
    pub(super) fn chain_loop<const TRACE: bool>(&self, run: RunRef<S>, running: &mut u32) {
        let nodes: &[NodeSpec<S>] = &run.plan.nodes;
        let counters = self.counters();
        // `None` in the instantiation without a trace (so is every tick below).
        let sink = self.registry.trace.as_ref().filter(|_| TRACE);
        let mut node = *running;
        *running = NO_NODE;
        let mut ctx = NodeCtx {
            inputs: Inputs::of(&*run, node),
            host: &self.host,
        };
        let mut n = counters.nodes_run.get();
        // The trace tick at which the previous body of this chain ended, when this node is its
        // continuation: that body's end is this one's start (one clock read a node).
        let mut chained: Option<u64> = None;
        loop {
            let spec = &nodes[node as usize];
            let next = if !spec.is_cpu() && !run.is_failed() && n % SERVICE_EVERY != 0 {
                // The fast path: a body on this worker, then its continuation if any.
                ctx.inputs.node = node;
                *running = node;
                // The count before this body (the landing pad counts a panicking one).
                counters.nodes_run.set(n);
                let tick = sink.map(|t| chained.take().unwrap_or_else(|| t.start_tick()));
                let res = spec.body.run(&ctx);
                let mut end = None;
                if TRACE {
                    *running = NO_NODE;
                    end = self.trace_node(sink, run, node, tick);
                }
                match res {
                    // `attention`: the body deferred its completion or ran other nodes in a
                    // nested wait (see `after_body_attention`). One flag for both, not a take
                    // of the slot and a check of a second flag per node on a chain link.
                    Ok(()) if !self.host.attention.get() => {
                        n += 1;
                        // A failed run is caught when the continuation starts: it is skipped
                        // and counted there.
                        if let Some(s) = spec.chain_successor() {
                            prefetch_ahead(nodes, s);
                            node = s;
                            chained = end;
                            // `*running` still names the node that ran: nothing up to the
                            // next body's start can panic (the path that can sets `NO_NODE`).
                            continue;
                        }
                        *running = NO_NODE;
                        counters.nodes_run.set(n);
                        // The node this worker goes straight on with (a successor made ready
                        // here, or its deque's newest) starts its slice where this one ended
                        // if this was its one predecessor (see below): one clock read a node
                        // here too, its slice then covering this completion's bookkeeping.
                        chained = end;
                        match self.release_by_class(run, node, spec) {
                            Some(next) => next,
                            None => self.complete_general(run, node, true),
                        }
                    }
                    res => {
                        *running = NO_NODE;
                        chained = None;
                        self.after_body_attention(run, node, res)
                    }
                }
            } else {
                *running = NO_NODE;
                chained = None;
                counters.nodes_run.set(n);
                if spec.is_cpu() || run.is_failed() {
                    self.run_task_slow(run, node)
                } else {
                    // A service point.
                    if n % SERVICE_EVERY == 0 {
                        self.service(n);
                    }
                    let sample = n % SAMPLE_EVERY == 0 && self.registry.export_metrics;
                    self.run_worker_body_instrumented(run, node, running, sample, TRACE)
                }
            };
            n = counters.nodes_run.get();
            match next.or_else(|| self.pop_local_of(run)) {
                Some(s) => {
                    // The body that just ended is a start for `s` only when it was `s`'s one
                    // predecessor: another predecessor may have read its end tick after this
                    // worker read its own and still arrived first, leaving this worker's
                    // arrival the last one (`s` traced as starting before a predecessor
                    // ended). A node popped from the deque may have been made ready by this
                    // same completion, so it takes the same rule.
                    if TRACE && run.plan.class(s) != CLASS_ONE {
                        chained = None;
                    }
                    node = s
                }
                None => return,
            }
        }
    }

    /// Records node `node`'s slice in the trace `sink`, from `tick` to now, before the node
    /// completes (so a trace taken once its graph is done has it); returns its end tick.
    #[inline(always)]
    pub(super) fn trace_node(
        &self,
        sink: Option<&TraceSink>,
        run: RunRef<S>,
        node: u32,
        tick: Option<u64>,
    ) -> Option<u64> {
        let (Some(t), Some(tick)) = (sink, tick) else {
            return None;
        };
        let e = t.now();
        t.node(
            self.index,
            &run.plan,
            node,
            (tick, e),
            self.stolen.replace(false),
        );
        Some(e)
    }

    /// The newest task of this worker's deque, if it is a node of `run`: the chain loop goes on
    /// with it (a tree's leaf is followed by its sibling without a trip through `find_task` and a
    /// new chain). Not while nested in a wait (the helper checks its graph between tasks) or a
    /// span (see `run_span`), nor in a pool with priorities (`find_task` orders the levels).
    #[inline]
    pub(super) fn pop_local_of(&self, run: RunRef<S>) -> Option<u32> {
        if self.nesting.get() != 0 || self.registry.prioritized.load(Ordering::Relaxed) {
            return None;
        }
        let t = self.local.pop()?;
        if t.chunks().is_none() && t.run().same(run) {
            Some(t.node())
        } else {
            self.local.push(t);
            None
        }
    }

    /// Drops what a panicking body deferred (a `Completer`'s side of it tells the completer
    /// to do nothing). Out of line: its drop glue kept in `execute_task`'s landing pad cost
    /// every node there two instructions of prologue.
    #[cold]
    #[inline(never)]
    fn drop_deferral(&self) {
        drop(self.host.defer_slot.take());
    }

    /// The chain loop's fast path after a body that failed, or left `attention` set: it
    /// deferred its completion (`defer_slot`), or waited for a nested graph and ran other
    /// nodes here, which counted themselves in `nodes_run` (the loop re-reads the count, which
    /// the loop set before the body: a stale one would set it back, and the metrics flush
    /// would see it go down).
    #[cold]
    #[inline(never)]
    pub(super) fn after_body_attention(
        &self,
        run: RunRef<S>,
        node: u32,
        res: Result<(), BoxError>,
    ) -> Option<u32> {
        let counters = self.counters();
        counters.nodes_run.set(counters.nodes_run.get() + 1);
        let deferred = if self.host.attention.replace(false) {
            self.host.defer_slot.take()
        } else {
            None
        };
        self.after_body_slow(run, node, res, deferred)
    }

    /// The uncommon cases: a failed run, a CPU-heavy node.
    #[cold]
    #[inline(never)]
    pub(super) fn run_task_slow(&self, run: RunRef<S>, i: u32) -> Option<u32> {
        if run.is_failed() {
            self.counters().skipped.add(1);
            run.note_skipped();
            return self.complete(run, i, false);
        }
        let spec = &run.plan.nodes[i as usize];
        if let Some(lane) = &self.registry.cpu_lane {
            let reg = self.registry.clone();
            let task = Task::new(run, i);
            lane.spawn(move || run_on_cpu_lane(reg, task));
            return None;
        }
        let inputs = Inputs::of(&*run, i);
        let res = catch_unwind(AssertUnwindSafe(|| spec.body.run_inputs(&inputs)));
        self.counters().nodes_run.add(1);
        let ok = store_outcome(&run, i, res);
        self.complete(run, i, ok)
    }

    /// A node body run out of the fast path: its run time sampled for the histogram (`sample`)
    /// and, when the pool records a trace (`tracing`), its slice recorded.
    #[inline(never)]
    pub(super) fn run_worker_body_instrumented(
        &self,
        run: RunRef<S>,
        i: u32,
        running: &mut u32,
        sample: bool,
        tracing: bool,
    ) -> Option<u32> {
        let ctx = NodeCtx {
            inputs: Inputs::of(&*run, i),
            host: &self.host,
        };
        let start = sample.then(Instant::now);
        let tick = match &self.registry.trace {
            Some(sink) if tracing => Some(sink.start_tick()),
            _ => None,
        };
        *running = i;
        let res = run.plan.nodes[i as usize].body.run(&ctx);
        *running = NO_NODE;
        self.record_slice(&run, i, start, tick);
        self.counters().nodes_run.add(1);
        match res {
            // As in the chain loop: the slot is looked at only when the body set `attention`.
            Ok(()) if !self.host.attention.get() => self.complete(run, i, true),
            res => {
                let deferred = if self.host.attention.replace(false) {
                    self.host.defer_slot.take()
                } else {
                    None
                };
                self.after_body_slow(run, i, res, deferred)
            }
        }
    }

    /// Records a node's trace slice (from trace tick `tick`, when the pool traces) and run-time
    /// sample (from `start`).
    #[inline]
    pub(super) fn record_slice(
        &self,
        run: &Run<S>,
        i: u32,
        start: Option<Instant>,
        tick: Option<u64>,
    ) {
        if let (Some(sink), Some(tick)) = (&self.registry.trace, tick) {
            let span = (tick, sink.now());
            sink.node(self.index, &run.plan, i, span, self.stolen.replace(false));
        }
        if let Some(start) = start {
            self.flusher
                .borrow_mut()
                .sample(start.elapsed().as_secs_f64());
        }
    }

    /// A body that failed, or deferred its completion. A completion handed to a `Completer`
    /// is completed here if the completer was called already; otherwise its call queues it
    /// (the node's unit is gone with it, and the run may be freed any moment). A failed
    /// body's deferral is dropped, which tells a completer that its call is to do nothing.
    #[cold]
    #[inline(never)]
    pub(super) fn after_body_slow(
        &self,
        run: RunRef<S>,
        i: u32,
        res: Result<(), BoxError>,
        deferred: Option<Deferral<S>>,
    ) -> Option<u32> {
        match (res, deferred) {
            (Ok(()), Some(Deferral::Poll(poll))) => {
                let urgent = run.plan.nodes[i as usize].priority() == Priority::High;
                if urgent {
                    self.urgent.set(self.urgent.get() + 1);
                }
                self.deferred.borrow_mut().push(Deferred {
                    task: Task::new(run, i),
                    poll,
                    urgent,
                });
                None
            }
            (Ok(()), Some(Deferral::Later(handed))) => match handed.body_returned() {
                None => None,
                Some(Ok(())) => self.complete(run, i, true),
                Some(Err(e)) => {
                    run.fail(node_failed(&run, i, e));
                    self.complete(run, i, false)
                }
            },
            (Ok(()), None) => self.complete(run, i, true),
            (Err(e), _) => {
                run.fail(node_failed(&run, i, e));
                self.complete(run, i, false)
            }
        }
    }
}

/// Asks the cache for the record [`CHAIN_AHEAD`] past chain link successor `s`'s.
#[inline(always)]
fn prefetch_ahead<S>(nodes: &[NodeSpec<S>], s: u32) {
    sync::prefetch(
        nodes
            .as_ptr()
            .wrapping_add(s as usize)
            .wrapping_add(CHAIN_AHEAD),
    );
}

pub(super) fn node_failed<S>(run: &Run<S>, node: u32, e: BoxError) -> Error {
    Error::new(
        ErrorKind::NodeFailed,
        format!("{} failed", run.plan.describe(node)),
    )
    .with_source(e)
}

pub(super) fn node_panicked<S>(run: &Run<S>, node: u32, p: &(dyn Any + Send)) -> Error {
    Error::new(
        ErrorKind::NodePanicked,
        format!("{} panicked: {}", run.plan.describe(node), panic_message(p)),
    )
}

/// Records a body's failure or panic on its run. Returns whether the body succeeded.
fn store_outcome<S>(run: &Run<S>, i: u32, res: std::thread::Result<Result<(), BoxError>>) -> bool {
    match res {
        Ok(Ok(())) => true,
        Ok(Err(e)) => {
            run.fail(node_failed(run, i, e));
            false
        }
        Err(p) => {
            run.fail(node_panicked(run, i, &*p));
            false
        }
    }
}

/// Runs a CPU-heavy node on the rayon lane and releases its successors through the injectors.
fn run_on_cpu_lane<S: Send + 'static>(reg: Arc<Registry<S>>, task: Task<S>) {
    let run = task.run();
    let i = task.node();
    let ok = if run.is_failed() {
        run.note_skipped();
        false
    } else {
        let inputs = Inputs::of(&*run, i);
        let body = &run.plan.nodes[i as usize].body;
        let res = catch_unwind(AssertUnwindSafe(|| body.run_inputs(&inputs)));
        reg.note_cpu_lane_node();
        store_outcome(&run, i, res)
    };
    let mut ready = Vec::new();
    let n = run.release(i, ok, |t| ready.push(t));
    if run.settle(n) {
        // The count reached zero: this thread has the run to itself.
        reg.finish(&run).settle();
        return;
    }
    for t in ready {
        reg.push_external(t);
    }
}
