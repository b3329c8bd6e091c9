//! A worker thread: start-up, the find-run-release loop, parking, deferred completions, and
//! helping while a node waits for a nested graph.

use std::any::Any;
use std::cell::{Cell, RefCell};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::NonNull;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use crossbeam_deque::{Injector, Steal, Stealer, Worker as Deque};
use crossbeam_utils::CachePadded;

use crate::ctx::{DeferFn, Inputs, NodeCtx};
use crate::error::{BoxError, Error, ErrorKind};
use crate::graph::{NodeSpec, CLASS_ONE, CLASS_RECORD};
use crate::ids::{Placement, ANY_GROUP, DOMAIN_BIT};
use crate::metrics::{Flusher, WorkerCounters, FLUSH_EVERY, SAMPLE_EVERY};
use crate::priority::{poll_order, Priority, WorkerDeques};
use crate::registry::{Finished, Registry};
use crate::run::{
    span_chunk, Completion, Credit, LeafBatcher, Run, RunRef, Task, SPAN_GRAIN, SPAN_MIN,
};
use crate::sync::{self, Condvar, Mutex, Ordering};
use crate::trace::TraceSink;

/// Nodes between two service points of a busy worker (idle hook, metrics flush, timing
/// sample); [`FLUSH_EVERY`] and [`SAMPLE_EVERY`] are multiples of it.
const SERVICE_EVERY: u64 = 64;
const _: () = assert!(FLUSH_EVERY % SERVICE_EVERY == 0 && SAMPLE_EVERY % SERVICE_EVERY == 0);
/// How many records past a chain link's successor the chain loop asks the cache for: a chain
/// walked out of cache is a dependent walk the hardware prefetcher does not keep ahead of, and
/// links are usually laid out in order (otherwise the hint is wasted, never wrong).
const CHAIN_AHEAD: usize = 160;
/// `running` between node bodies.
const NO_NODE: u32 = u32::MAX;
/// How long a worker with deferred completions and nothing else to do polls them between
/// yields before it parks with a timeout: long enough that a GPU graph of a couple of
/// milliseconds (a replayed segment) is seen done within a yield, not at the end of a timed
/// park. The yield leaves the core to any other thread that wants it.
const DEFERRED_SPIN: Duration = Duration::from_millis(2);
/// The timed park of a worker that waits for deferred completions and has nothing else to do.
const DEFERRED_PARK: Duration = Duration::from_micros(50);
/// How long a worker that just ran dry watches the queues before it parks, by default
/// (`PoolBuilder::idle_spin`). Work often follows within microseconds (a chain of GPU nodes
/// hopping between workers, a burst of submissions), and a futex wake-up costs several; an
/// idle pool still parks after this, so it burns nothing.
pub(crate) const SPIN_BEFORE_PARK: Duration = Duration::from_micros(20);

/// Start-up rendezvous: every worker reports its start hook's outcome, then waits for the
/// builder's verdict (run, or exit because another worker failed).
pub(crate) struct StartGate {
    state: Mutex<GateState>,
    cv: Condvar,
}

struct GateState {
    reported: usize,
    first_error: Option<(usize, Error)>,
    go: Option<bool>,
}

impl StartGate {
    pub(crate) fn new(_workers: usize) -> Self {
        StartGate {
            state: Mutex::new(GateState {
                reported: 0,
                first_error: None,
                go: None,
            }),
            cv: Condvar::new(),
        }
    }

    fn report(&self, index: usize, result: Result<(), Error>) {
        let mut s = sync::lock(&self.state);
        s.reported += 1;
        if let Err(e) = result {
            if s.first_error.as_ref().is_none_or(|(i, _)| index < *i) {
                s.first_error = Some((index, e));
            }
        }
        self.cv.notify_all();
    }

    /// Waits for `n` reports; returns the error of the lowest-numbered failing worker.
    pub(crate) fn wait_reports(&self, n: usize) -> Option<Error> {
        let mut s = sync::lock(&self.state);
        while s.reported < n {
            s = self.cv.wait(s).unwrap_or_else(|p| p.into_inner());
        }
        s.first_error.take().map(|(_, e)| e)
    }

    pub(crate) fn release(&self, go: bool) {
        sync::lock(&self.state).go = Some(go);
        self.cv.notify_all();
    }

    fn wait_go(&self) -> bool {
        let mut s = sync::lock(&self.state);
        loop {
            if let Some(go) = s.go {
                return go;
            }
            s = self.cv.wait(s).unwrap_or_else(|p| p.into_inner());
        }
    }
}

pub(crate) fn panic_message(p: &(dyn Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "a non-string panic payload".to_string()
    }
}

/// Makes this thread's timed waits end on time: Linux lets a timer fire up to the thread's
/// timer slack late (50 µs by default), which doubled a worker's 50 µs timed parks
/// ([`DEFERRED_PARK`]) while it waits for a long GPU segment.
#[cfg(all(target_os = "linux", not(miri)))]
fn tighten_timer_slack() {
    // SAFETY: PR_SET_TIMERSLACK takes one unsigned long (nanoseconds) by value and changes only
    // the calling thread's timer slack; a failure (an old kernel) leaves the default.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1_000 as libc::c_ulong);
    }
}

#[cfg(not(all(target_os = "linux", not(miri))))]
fn tighten_timer_slack() {}

/// The body of a worker thread.
pub(crate) fn main<S: Send + 'static>(
    reg: Arc<Registry<S>>,
    index: usize,
    deques: WorkerDeques<Task<S>>,
    gate: Arc<StartGate>,
) {
    let info = &reg.infos[index];
    reg.sleep.register(index, sync::current_thread());
    let state = start(&reg, index, &gate);
    let go = gate.wait_go();
    drop(gate);
    let Some(state) = state else { return };
    if !go {
        run_stop_hook(&reg, index, state);
        return;
    }
    let wt = WorkerThread::new(reg.clone(), index, deques, state);
    let helper: &dyn Helper = &wt;
    // SAFETY: only the lifetime is erased; `wt` lives on this stack frame until after the
    // `CurrentGuard` below has cleared CURRENT (on return or unwind), and CURRENT is
    // thread-local, so nothing reads the pointer after `wt` is gone.
    let helper: NonNull<dyn Helper> = unsafe {
        std::mem::transmute::<NonNull<dyn Helper + '_>, NonNull<dyn Helper>>(NonNull::from(helper))
    };
    let abort_guard = AbortOnUnwind {
        pool: &reg.name,
        worker: &info.name,
    };
    {
        let _current = CurrentGuard::set(helper);
        wt.main_loop();
    }
    wt.flush();
    std::mem::forget(abort_guard);
    let WorkerThread {
        state, registry, ..
    } = wt;
    run_stop_hook(&registry, index, state);
}

/// Start-up on the worker's own thread: pins it to its core and runs the start hook, whose
/// result is the worker's state; reports the outcome to `gate` (`None`: it failed).
fn start<S: Send + 'static>(reg: &Registry<S>, index: usize, gate: &StartGate) -> Option<S> {
    let info = &reg.infos[index];
    let pinned = match info.core {
        Some(core) => core_affinity::set_for_current(core_affinity::CoreId { id: core }),
        None => true,
    };
    tighten_timer_slack();
    if !pinned {
        gate.report(
            index,
            Err(Error::new(
                ErrorKind::InvalidConfig,
                format!(
                    "pool '{}': worker {} could not pin itself to core {:?}",
                    reg.name, info.name, info.core
                ),
            )),
        );
        return None;
    }
    match catch_unwind(AssertUnwindSafe(|| (reg.hooks.start)(info))) {
        Ok(Ok(s)) => {
            gate.report(index, Ok(()));
            Some(s)
        }
        Ok(Err(e)) => {
            let msg = format!(
                "pool '{}': the start hook of worker {} (core {:?}) failed",
                reg.name, info.name, info.core
            );
            gate.report(
                index,
                Err(Error::new(ErrorKind::StartHook, msg).with_source(e)),
            );
            None
        }
        Err(p) => {
            let msg = format!(
                "pool '{}': the start hook of worker {} (core {:?}) panicked: {}",
                reg.name,
                info.name,
                info.core,
                panic_message(&*p)
            );
            gate.report(index, Err(Error::new(ErrorKind::StartHook, msg)));
            None
        }
    }
}

/// Runs the stop hook of worker `index`; a panic there aborts the process with a message
/// naming the worker (see [`abort_on_hook_panic`]).
fn run_stop_hook<S: Send + 'static>(reg: &Registry<S>, index: usize, state: S) {
    if let Some(stop) = &reg.hooks.stop {
        let info = &reg.infos[index];
        if let Err(p) = catch_unwind(AssertUnwindSafe(|| stop(info, state))) {
            abort_on_hook_panic(&reg.name, &info.name, "stop hook", &*p);
        }
    }
}

/// A panic in a hook the worker runs between nodes (idle, stop): the hook's state (the GPU
/// backend's release queues and streams) cannot be trusted any more, and the worker cannot go on
/// without it, so, as rayon-core does for a panic outside a job, the process aborts with a
/// message rather than lose a worker quietly and leave its graphs (and `shutdown`) waiting.
#[cold]
fn abort_on_hook_panic(pool: &str, worker: &str, hook: &str, p: &(dyn Any + Send)) -> ! {
    abort_with(&format!(
        "pool '{}': the {hook} of worker {} panicked: {}",
        crate::error::bounded(pool),
        crate::error::bounded(worker),
        crate::error::bounded(&panic_message(p)),
    ))
}

/// Writes `msg` to the process's real stderr (not the test harness's capture, which an abort
/// would discard) and aborts.
#[cold]
fn abort_with(msg: &str) -> ! {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "boundpool-scheduler: {msg}; aborting");
    std::process::abort()
}

/// Aborts if a worker's main loop unwinds: a panic there comes from outside any node body and
/// any hook (the scheduler itself, a metrics recorder, a waker, an output's destructor), after
/// which the worker's queues and its runs' counters cannot be trusted, and a worker that quietly
/// exits would leave the graphs placed on its group, and `shutdown`, waiting for ever.
struct AbortOnUnwind<'a> {
    pool: &'a str,
    worker: &'a str,
}

impl Drop for AbortOnUnwind<'_> {
    fn drop(&mut self) {
        abort_with(&format!(
            "pool '{}': worker {} unwound out of its main loop (a panic outside a node body: \
             in a metrics recorder, a waker, an output's destructor, or the scheduler itself)",
            crate::error::bounded(self.pool),
            crate::error::bounded(self.worker),
        ));
    }
}

/// Points `CURRENT` at this thread's worker for as long as it lives, and clears it when dropped,
/// also when the thread unwinds, so nothing ever reads a pointer to a dropped worker.
struct CurrentGuard;

impl CurrentGuard {
    fn set(helper: NonNull<dyn Helper>) -> Self {
        CURRENT.with(|c| c.set(Some(helper)));
        CurrentGuard
    }
}

impl Drop for CurrentGuard {
    fn drop(&mut self) {
        CURRENT.with(|c| c.set(None));
    }
}

/// A node waiting on a nested graph helps through this, whatever the pool's state type.
trait Helper {
    /// Runs other nodes until `c` completes (returns `true`) or `deadline` passes (`false`).
    fn help_until(&self, c: &Completion, deadline: Option<Instant>) -> bool;
    fn registry_addr(&self) -> usize;
}

thread_local! {
    static CURRENT: Cell<Option<NonNull<dyn Helper>>> = const { Cell::new(None) };
}

/// If this thread is a pool worker, runs other nodes until `c` completes or `deadline` passes,
/// and returns whether `c` completed; `None` on a thread that is not a worker.
pub(crate) fn help_until(c: &Completion, deadline: Option<Instant>) -> Option<bool> {
    CURRENT.with(|cur| cur.get()).map(|p| {
        // SAFETY: CURRENT is set only while the worker's `WorkerThread` is alive on this
        // thread's stack (see `main`), and we are on that thread.
        unsafe { p.as_ref() }.help_until(c, deadline)
    })
}

/// Whether this thread is a worker of `reg`'s pool.
pub(crate) fn on_worker_of<S>(reg: &Arc<Registry<S>>) -> bool {
    match CURRENT.with(|cur| cur.get()) {
        // SAFETY: as in `help_until`.
        Some(p) => unsafe { p.as_ref() }.registry_addr() == Arc::as_ptr(reg) as *const () as usize,
        None => false,
    }
}

/// A worker's view of one level: (own deque, group injector, pool-wide injector, stealers).
type LevelRefs<'a, S> = (
    &'a Deque<Task<S>>,
    &'a Injector<Task<S>>,
    &'a Injector<Task<S>>,
    &'a [Stealer<Task<S>>],
);

struct Deferred<S> {
    task: Task<S>,
    poll: DeferFn<S>,
}

pub(crate) struct WorkerThread<S> {
    pub(crate) registry: Arc<Registry<S>>,
    /// This worker's block of `registry.workers`, held directly to save the indexing per node.
    counters: Arc<CachePadded<WorkerCounters>>,
    pub(crate) index: usize,
    group: usize,
    /// The normal level's deque (the only one a pool without priorities uses).
    local: Deque<Task<S>>,
    high: Deque<Task<S>>,
    low: Deque<Task<S>>,
    /// Tasks taken from the queues in prioritized mode, for the fixed shares (`poll_order`).
    takes: Cell<u32>,
    pub(crate) state: S,
    deferred: RefCell<Vec<Deferred<S>>>,
    /// Runs that finished here, to settle once no frame holds a reference to them.
    finished: RefCell<Vec<Finished<S>>>,
    /// Spare in-flight units of one run (see `Credit`): node completions and hand-offs on this
    /// worker touch no shared count.
    credit: Credit<S>,
    /// A body running here waited for a nested graph and ran other nodes meanwhile (their
    /// counts are in `nodes_run`; the chain loop re-reads it), or deferred its completion
    /// (`defer_slot`): the chain loop looks at either only when this is set.
    attention: Cell<bool>,
    /// Nested waits (`help_until`) and spans (`run_span`) in progress on this worker: while
    /// there are any, a chain does not go on with the deque's top (`pop_local_of`).
    nesting: Cell<u32>,
    /// The run whose wide-join arrivals this worker batches (`batcher.run`), set by the
    /// outermost span in progress here (`run_span`), whose unit keeps the run alive until the
    /// span flushes the batch; nodes of that run count their arrivals at a wide join's leaf in
    /// `batcher.batch` (one read-modify-write per batch instead of one per node, which made a
    /// map-reduce's reduce a large part of a mapped node's cost).
    batcher: LeafBatcher<S>,
    /// What the running node's body passed to `NodeCtx::complete_when`, taken after the body.
    defer_slot: Cell<Option<DeferFn<S>>>,
    /// When this worker, with deferred completions, last ran dry (see [`DEFERRED_SPIN`]).
    dry_since: Cell<Option<Instant>>,
    flusher: RefCell<Flusher>,
    rng: Cell<u64>,
    /// The task `find_task` just returned was stolen (for the trace).
    stolen: Cell<bool>,
}

impl<S: Send + 'static> Helper for WorkerThread<S> {
    fn help_until(&self, c: &Completion, deadline: Option<Instant>) -> bool {
        // The waiting body may already have deferred its completion: keep that apart while
        // other nodes run here, and put it back for the waiting node.
        let waiting = self.defer_slot.take();
        // The loop below does not go on with the span that batches here: count the batch now
        // (the span's unit keeps its run alive), and batch again once the body goes on.
        let batching = self.batcher.run.take();
        if let Some(run) = batching {
            self.flush_batch(run);
        }
        self.nesting.set(self.nesting.get() + 1);
        let done = self.help_loop(c, deadline);
        self.nesting.set(self.nesting.get() - 1);
        self.batcher.run.set(batching);
        self.defer_slot.set(waiting);
        self.attention.set(true);
        done
    }

    fn registry_addr(&self) -> usize {
        Arc::as_ptr(&self.registry) as *const () as usize
    }
}

impl<S: Send + 'static> WorkerThread<S> {
    fn new(reg: Arc<Registry<S>>, index: usize, deques: WorkerDeques<Task<S>>, state: S) -> Self {
        let WorkerDeques {
            normal: local,
            high,
            low,
        } = deques;
        WorkerThread {
            group: reg.infos[index].group.index(),
            flusher: RefCell::new(Flusher::new(&reg.name, index)),
            counters: reg.workers[index].clone(),
            registry: reg,
            index,
            local,
            high,
            low,
            takes: Cell::new(0),
            state,
            deferred: RefCell::new(Vec::new()),
            finished: RefCell::new(Vec::new()),
            credit: Credit::new(),
            attention: Cell::new(false),
            nesting: Cell::new(0),
            batcher: LeafBatcher::new(),
            defer_slot: Cell::new(None),
            dry_since: Cell::new(None),
            stolen: Cell::new(false),
            rng: Cell::new(
                0x9E37_79B9_7F4A_7C15 ^ (index as u64 + 1).wrapping_mul(0xBF58_476D_1CE4_E5B9),
            ),
        }
    }

    fn help_loop(&self, c: &Completion, deadline: Option<Instant>) -> bool {
        c.register_thread();
        let mut idle_rounds = 0;
        while !c.is_done() {
            if deadline.is_some_and(|d| Instant::now() >= d) {
                self.flush_credit();
                return false;
            }
            if let Some(t) = self.find_task() {
                self.execute(t);
                idle_rounds = 0;
            } else if self.poll_deferred() {
                idle_rounds = 0;
            } else {
                self.go_idle(&mut idle_rounds, &|| c.is_done(), deadline);
                if c.is_done() || deadline.is_some_and(|d| Instant::now() >= d) {
                    self.pass_on_wakeup();
                }
            }
        }
        // The waiting body goes on, maybe for long: runs helped along here must not wait for it.
        self.flush_credit();
        true
    }

    /// A nested wait that ends as it parks (the awaited graph finished, or its deadline passed)
    /// may have been chosen by a pusher in that instant: the body then goes on, and the task or
    /// idle-hook request it was woken for would wait behind parked peers. Pass the wake-up on
    /// when something is waiting. A spare wake-up costs one peer a look at the queues.
    #[cold]
    fn pass_on_wakeup(&self) {
        let reg = &*self.registry;
        let group = &reg.groups[self.group];
        if reg.sleep.hook_requested(self.group) || self.work_visible() {
            reg.sleep.notify_group(self.group);
        }
        for &d in group.domains.iter() {
            let domain = &reg.domains[d as usize];
            if !domain.injector.is_empty() {
                reg.sleep.notify_groups(&domain.groups);
            }
        }
        if !reg.any.is_empty() {
            reg.sleep.notify_any();
        }
    }

    /// Called by `NodeCtx::complete_when` from the running body.
    pub(crate) fn set_deferred(&self, poll: DeferFn<S>) {
        self.defer_slot.set(Some(poll));
        self.attention.set(true);
    }

    #[inline]
    fn counters(&self) -> &WorkerCounters {
        &self.counters
    }

    fn main_loop(&self) {
        let mut idle_rounds = 0;
        loop {
            if let Some(t) = self.find_task() {
                self.execute(t);
                idle_rounds = 0;
            } else if self.poll_deferred() {
                idle_rounds = 0;
            } else if self.registry.is_terminated() && self.deferred.borrow().is_empty() {
                // Spare units keep their run in the table, so none are left at termination.
                debug_assert_eq!(self.credit.units(), 0);
                break;
            } else {
                self.go_idle(&mut idle_rounds, &|| false, None);
            }
        }
    }

    /// Runs `task` and the chain of continuations it hands on. A panicking node body unwinds to
    /// here (one landing pad for the whole chain instead of a `catch_unwind` per node); the
    /// chain loop keeps the running node in `running`, so the landing pad knows which failed.
    fn execute(&self, task: Task<S>) {
        if self.credit.holds_other(task.run()) {
            self.flush_credit();
        }
        match task.chunks() {
            None => self.execute_task(task),
            Some((lo, hi)) => self.run_span(task.run(), task.node(), lo, hi),
        }
        self.settle_finished();
    }

    /// Releases chunks `lo..hi` of node `i`'s successor list (a span task, which holds one
    /// unit of `run`): while the span is larger than [`SPAN_GRAIN`] successors, its upper half
    /// is queued here for a thief (a wide fan-out reaches every worker in a few steals of
    /// halves, as rayon splits a parallel iterator), then the rest is released in order, each
    /// ready successor that may run here run at once, the others queued where they belong.
    #[inline(never)]
    fn run_span(&self, run: RunRef<S>, i: u32, lo: usize, mut hi: usize) {
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
    fn flush_batch(&self, run: RunRef<S>) {
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

    /// Gives this worker's spare in-flight units back (see `Credit`), finishing their run if
    /// that was the last of it, and settles what finished.
    #[inline]
    fn flush_credit(&self) {
        if let Some(run) = self.credit.flush() {
            self.finish_run(run);
        }
        self.settle_finished();
    }

    /// `run`'s count reached zero here: this worker has it to itself until it is settled (in
    /// `settle_finished`, once no frame holding a `&Run` argument of it is live).
    #[cold]
    fn finish_run(&self, run: RunRef<S>) {
        self.finished.borrow_mut().push(self.registry.finish(&run));
    }

    /// Settles the runs that finished on this worker since the last call. Called only where no
    /// function holding a `&Run` argument is on the stack (see `Registry::finish`).
    #[inline]
    fn settle_finished(&self) {
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

    fn execute_task(&self, task: Task<S>) {
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
                    if self.attention.replace(false) {
                        drop(self.defer_slot.take());
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
    fn execute_chain(&self, run: RunRef<S>, running: &mut u32) {
        // Two instantiations: a pool without a trace (the usual case) keeps no trace state in
        // the loop and checks for none per node.
        if self.registry.trace.is_some() {
            self.chain_loop::<true>(run, running)
        } else {
            self.chain_loop::<false>(run, running)
        }
    }

    #[inline(always)]
    fn chain_loop<const TRACE: bool>(&self, run: RunRef<S>, running: &mut u32) {
        let nodes: &[NodeSpec<S>] = &run.plan.nodes;
        let counters = self.counters();
        let sink = if TRACE {
            self.registry.trace.as_ref()
        } else {
            None
        };
        let mut node = *running;
        *running = NO_NODE;
        let mut ctx = NodeCtx {
            inputs: Inputs::of(&run, node),
            worker: self,
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
                let tick = if TRACE {
                    sink.map(|t| chained.take().unwrap_or_else(|| t.start_tick()))
                } else {
                    None
                };
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
                    Ok(()) if !self.attention.get() => {
                        n += 1;
                        // A failed run is caught when the continuation starts: it is skipped
                        // and counted there.
                        if let Some(s) = spec.chain_successor() {
                            sync::prefetch(
                                nodes
                                    .as_ptr()
                                    .wrapping_add(s as usize)
                                    .wrapping_add(CHAIN_AHEAD),
                            );
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
    fn trace_node(
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
    fn pop_local_of(&self, run: RunRef<S>) -> Option<u32> {
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

    /// Every [`SERVICE_EVERY`] nodes: the idle hook (a busy worker still frees what its
    /// device's drops queued) and, less often, the metrics flush.
    #[cold]
    fn service(&self, n: u64) {
        if n == 0 {
            return;
        }
        self.run_idle_hook();
        if n % FLUSH_EVERY == 0 {
            self.flush();
        }
    }

    fn run_idle_hook(&self) {
        // Take a waker's request before the hook runs, so that one made while it runs (for a
        // handle queued after the hook looked) sets the flag again and is served next time.
        self.registry.sleep.take_hook_request(self.group);
        if let Some(h) = &self.registry.hooks.idle {
            let info = &self.registry.infos[self.index];
            if let Err(p) = catch_unwind(AssertUnwindSafe(|| h(info, &self.state))) {
                abort_on_hook_panic(&self.registry.name, &info.name, "idle hook", &*p);
            }
        }
    }

    fn flush(&self) {
        if !self.registry.export_metrics {
            return;
        }
        self.flusher
            .borrow_mut()
            .flush(self.counters(), self.local.len());
    }

    fn next_rand(&self) -> usize {
        // xorshift64*: cheap victim selection.
        let mut x = self.rng.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng.set(x);
        (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 32) as usize
    }

    fn find_task(&self) -> Option<Task<S>> {
        if self.registry.prioritized.load(Ordering::Relaxed) {
            return self.find_task_prioritized();
        }
        // The normal level is the only one in a pool that never saw a priority.
        loop {
            match self.take_at(Priority::Normal) {
                Steal::Success(t) => return Some(t),
                Steal::Retry => {}
                Steal::Empty => return None,
            }
        }
    }

    /// `find_task` in a pool that has seen another level than normal: each take polls the
    /// levels in the order `poll_order` gives (high → normal → low but for the fixed shares).
    #[inline(never)]
    fn find_task_prioritized(&self) -> Option<Task<S>> {
        let n = self.takes.get().wrapping_add(1);
        loop {
            let mut retry = false;
            for level in poll_order(n) {
                match self.take_at(level) {
                    Steal::Success(t) => {
                        self.takes.set(n);
                        return Some(t);
                    }
                    Steal::Retry => retry = true,
                    Steal::Empty => {}
                }
            }
            if !retry {
                return None;
            }
        }
    }

    /// This worker's deque and the queues it may take from, of level `p`.
    #[inline]
    fn level_queues(&self, p: Priority) -> LevelRefs<'_, S> {
        let reg = &*self.registry;
        match p {
            Priority::Normal => (
                &self.local,
                &reg.groups[self.group].injector,
                &reg.any,
                &reg.stealers,
            ),
            Priority::High => (
                &self.high,
                &reg.high.groups[self.group],
                &reg.high.any,
                &reg.high.stealers,
            ),
            Priority::Low => (
                &self.low,
                &reg.low.groups[self.group],
                &reg.low.any,
                &reg.low.stealers,
            ),
        }
    }

    /// The domain injector `d` of level `p`.
    #[inline]
    fn domain_injector(&self, p: Priority, d: u32) -> &Injector<Task<S>> {
        let reg = &*self.registry;
        match p {
            Priority::Normal => &reg.domains[d as usize].injector,
            p => &reg.level(p).domains[d as usize],
        }
    }

    /// One look at level `p`: own deque, the group's injector, those of its domains (none in
    /// most pools), the pool-wide one, then the group's other workers' deques.
    #[inline]
    fn take_at(&self, p: Priority) -> Steal<Task<S>> {
        let (local, group_inj, any, stealers) = self.level_queues(p);
        if let Some(t) = local.pop() {
            return Steal::Success(t);
        }
        let reg = &*self.registry;
        let group = &reg.groups[self.group];
        let mut retry = false;
        // A domain's tasks are taken one at a time: a batch would land in this worker's deque,
        // where only its own group could steal them, while the domain's other groups find its
        // injector empty.
        let injectors = std::iter::once((group_inj, true))
            .chain(
                group
                    .domains
                    .iter()
                    .map(|&d| (self.domain_injector(p, d), false)),
            )
            .chain(std::iter::once((any, true)));
        for (injector, batch) in injectors {
            let stolen = if batch {
                injector.steal_batch_and_pop(local)
            } else {
                injector.steal()
            };
            match stolen {
                Steal::Success(t) => {
                    self.counters().injector_pops.add(1);
                    if batch {
                        self.share_surplus(local);
                    }
                    return Steal::Success(t);
                }
                Steal::Retry => retry = true,
                Steal::Empty => {}
            }
        }
        let members = &group.members;
        let n = members.len();
        if n > 1 {
            let start = self.next_rand() % n;
            for k in 0..n {
                let victim = members[(start + k) % n];
                if victim == self.index {
                    continue;
                }
                match stealers[victim].steal_batch_and_pop(local) {
                    Steal::Success(t) => {
                        self.counters().steals.add(1);
                        self.stolen.set(true);
                        self.share_surplus(local);
                        return Steal::Success(t);
                    }
                    Steal::Retry => retry = true,
                    Steal::Empty => {}
                }
            }
        }
        if retry {
            Steal::Retry
        } else {
            Steal::Empty
        }
    }

    /// Whether a queue of level `p` (high or low) that this worker may take from holds a task.
    fn level_visible(&self, p: Priority) -> bool {
        let (local, group_inj, any, stealers) = self.level_queues(p);
        let group = &self.registry.groups[self.group];
        !local.is_empty()
            || !group_inj.is_empty()
            || group
                .domains
                .iter()
                .any(|&d| !self.domain_injector(p, d).is_empty())
            || !any.is_empty()
            || group.members.iter().any(|&w| !stealers[w].is_empty())
    }

    /// After taking a batch, wake a sleeping peer if there is more here than one task.
    fn share_surplus(&self, local: &Deque<Task<S>>) {
        if !local.is_empty() {
            self.registry.sleep.notify_local(self.group);
        }
    }

    /// Whether any queue this worker may take from holds a task (the re-check before parking).
    fn work_visible(&self) -> bool {
        let reg = &*self.registry;
        let group = &reg.groups[self.group];
        !self.local.is_empty()
            || !group.injector.is_empty()
            || group
                .domains
                .iter()
                .any(|&d| !reg.domains[d as usize].injector.is_empty())
            || !reg.any.is_empty()
            || group.members.iter().any(|&w| !reg.stealers[w].is_empty())
            || (reg.prioritized.load(Ordering::SeqCst)
                && (self.level_visible(Priority::High) || self.level_visible(Priority::Low)))
    }

    /// Spins, then parks until work, `condition`, termination or `deadline` (a nested
    /// `wait_timeout`).
    fn go_idle(
        &self,
        idle_rounds: &mut u32,
        condition: &dyn Fn() -> bool,
        deadline: Option<Instant>,
    ) {
        // Before anything else: a run whose last task ended here finishes now, not when this
        // worker next finds work.
        self.flush_credit();
        if *idle_rounds == 0 && self.deferred.borrow().is_empty() && self.spin(condition) {
            return;
        }
        // The idle hook runs on every idle round (a `GroupWaker` wakes a parked worker exactly
        // so that it runs); the metrics flush only when the worker first runs dry.
        self.run_idle_hook();
        if *idle_rounds == 0 {
            self.flush();
        }
        let timeout = if self.deferred.borrow().is_empty() {
            None
        } else {
            if *idle_rounds == 0 {
                self.dry_since.set(Some(Instant::now()));
            }
            *idle_rounds += 1;
            // Under loom, a few rounds: the models check the protocol, not the timing.
            let polling = if cfg!(loom) {
                *idle_rounds < 4
            } else {
                self.dry_since
                    .get()
                    .is_some_and(|t| t.elapsed() < DEFERRED_SPIN)
            };
            if polling {
                sync::yield_now();
                return;
            }
            Some(DEFERRED_PARK)
        };
        let timeout = match deadline {
            None => timeout,
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return;
                }
                Some(timeout.map_or(left, |t| t.min(left)))
            }
        };
        *idle_rounds = idle_rounds.saturating_add(1);
        self.counters().parks.add(1);
        let reg = &*self.registry;
        let start = reg.trace.as_ref().map(|t| t.now());
        reg.sleep.sleep(
            self.index,
            self.group,
            timeout,
            || self.work_visible(),
            || condition() || reg.is_terminated(),
        );
        if let (Some(sink), Some(start)) = (&reg.trace, start) {
            sink.park(self.index, start, sink.now());
        }
    }

    /// Watches the queues (and `condition`) for up to the pool's idle spin
    /// ([`SPIN_BEFORE_PARK`] by default); returns whether
    /// something turned up. Under loom, never: the models check the parking protocol itself.
    #[cfg(not(loom))]
    fn spin(&self, condition: &dyn Fn() -> bool) -> bool {
        // Look often (a hand-off between two workers waits for exactly this look), read the
        // clock seldom.
        let start = Instant::now();
        let limit = self.registry.idle_spin;
        let mut looks = 0u32;
        loop {
            std::hint::spin_loop();
            if self.work_visible() || condition() {
                return true;
            }
            looks = looks.wrapping_add(1);
            if looks % 64 == 0 && start.elapsed() >= limit {
                return false;
            }
        }
    }

    #[cfg(loom)]
    fn spin(&self, _condition: &dyn Fn() -> bool) -> bool {
        false
    }

    /// The chain loop's fast path after a body that failed, or left `attention` set: it
    /// deferred its completion (`defer_slot`), or waited for a nested graph and ran other
    /// nodes here, which counted themselves in `nodes_run` (the loop re-reads the count, which
    /// the loop set before the body: a stale one would set it back, and the metrics flush
    /// would see it go down).
    #[cold]
    #[inline(never)]
    fn after_body_attention(
        &self,
        run: RunRef<S>,
        node: u32,
        res: Result<(), BoxError>,
    ) -> Option<u32> {
        let counters = self.counters();
        counters.nodes_run.set(counters.nodes_run.get() + 1);
        let deferred = if self.attention.replace(false) {
            self.defer_slot.take()
        } else {
            None
        };
        self.after_body_slow(run, node, res, deferred)
    }

    /// The uncommon cases: a failed run, a CPU-heavy node.
    #[cold]
    #[inline(never)]
    fn run_task_slow(&self, run: RunRef<S>, i: u32) -> Option<u32> {
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
        let inputs = Inputs::of(&run, i);
        let res = catch_unwind(AssertUnwindSafe(|| spec.body.run_inputs(&inputs)));
        self.counters().nodes_run.add(1);
        let ok = store_outcome(&run, i, res);
        self.complete(run, i, ok)
    }

    /// A node body run out of the fast path: its run time sampled for the histogram (`sample`)
    /// and, when the pool records a trace (`tracing`), its slice recorded.
    #[inline(never)]
    fn run_worker_body_instrumented(
        &self,
        run: RunRef<S>,
        i: u32,
        running: &mut u32,
        sample: bool,
        tracing: bool,
    ) -> Option<u32> {
        let ctx = NodeCtx {
            inputs: Inputs::of(&run, i),
            worker: self,
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
        match (res, self.defer_slot.take()) {
            (Ok(()), None) => self.complete(run, i, true),
            (res, deferred) => self.after_body_slow(run, i, res, deferred),
        }
    }

    /// Records a node's trace slice (from trace tick `tick`, when the pool traces) and run-time
    /// sample (from `start`).
    #[inline]
    fn record_slice(&self, run: &Run<S>, i: u32, start: Option<Instant>, tick: Option<u64>) {
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

    /// A body that failed, or deferred its completion.
    #[cold]
    #[inline(never)]
    fn after_body_slow(
        &self,
        run: RunRef<S>,
        i: u32,
        res: Result<(), BoxError>,
        deferred: Option<DeferFn<S>>,
    ) -> Option<u32> {
        match (res, deferred) {
            (Ok(()), Some(poll)) => {
                self.deferred.borrow_mut().push(Deferred {
                    task: Task::new(run, i),
                    poll,
                });
                None
            }
            (Ok(()), None) => self.complete(run, i, true),
            (Err(e), _) => {
                run.fail(node_failed(&run, i, e));
                self.complete(run, i, false)
            }
        }
    }

    /// Releases the successors of node `i`: one that may run here is returned as the
    /// continuation, the others are queued (here, or on their group's injector) and sleepers
    /// are woken. A link of a chain hands on its successor without any check.
    #[inline]
    fn complete(&self, run: RunRef<S>, i: u32, ok: bool) -> Option<u32> {
        if ok {
            if let Some(s) = run.plan.nodes[i as usize].chain_successor() {
                return Some(s);
            }
        }
        self.complete_general(run, i, ok)
    }

    #[inline]
    fn runs_here(&self, spec: &NodeSpec<S>) -> bool {
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
    fn release_by_class(
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
    fn arrive_at_wide_join(&self, run: RunRef<S>, node: u32, s: u32) -> Option<Option<u32>> {
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
    fn complete_general(&self, run: RunRef<S>, i: u32, ok: bool) -> Option<u32> {
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
    fn queue(&self, t: Task<S>, place: Placement, prio: bool) -> bool {
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
    fn queue_level(&self, t: Task<S>, place: Placement) -> bool {
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

    /// Polls deferred completions; returns whether any completed. Called when nothing was
    /// queued: a run whose last node ended here is finished first (its spare units given back),
    /// not after the polls.
    fn poll_deferred(&self) -> bool {
        self.flush_credit();
        if self.deferred.borrow().is_empty() {
            return false;
        }
        let mut list = std::mem::take(&mut *self.deferred.borrow_mut());
        let mut progressed = false;
        let mut i = 0;
        while i < list.len() {
            let d = &mut list[i];
            let outcome = catch_unwind(AssertUnwindSafe(|| (d.poll)(&self.state)));
            let ok = match outcome {
                Ok(Poll::Pending) => {
                    i += 1;
                    continue;
                }
                Ok(Poll::Ready(Ok(()))) => true,
                Ok(Poll::Ready(Err(e))) => {
                    let run = d.task.run();
                    run.fail(node_failed(&run, d.task.node(), e));
                    false
                }
                Err(p) => {
                    let run = d.task.run();
                    run.fail(node_panicked(&run, d.task.node(), &*p));
                    false
                }
            };
            let d = list.swap_remove(i);
            progressed = true;
            let run = d.task.run();
            if let Some(c) = self.complete(run, d.task.node(), ok) {
                self.execute(Task::new(run, c));
            }
            self.settle_finished();
        }
        let mut cur = self.deferred.borrow_mut();
        list.append(&mut cur);
        *cur = list;
        progressed
    }
}

fn node_failed<S>(run: &Run<S>, node: u32, e: BoxError) -> Error {
    Error::new(
        ErrorKind::NodeFailed,
        format!("{} failed", run.plan.describe(node)),
    )
    .with_source(e)
}

fn node_panicked<S>(run: &Run<S>, node: u32, p: &(dyn Any + Send)) -> Error {
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
        let inputs = Inputs::of(&run, i);
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
