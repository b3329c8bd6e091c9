//! A worker thread: start-up, the find-run-release loop, parking, deferred completions, and
//! helping while a node waits for a nested graph.

use std::any::Any;
use std::borrow::Cow;
use std::cell::{Cell, RefCell};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::NonNull;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use crossbeam_deque::{Steal, Worker as Deque};
use crossbeam_utils::CachePadded;

use crate::ctx::{DeferFn, Inputs, NodeCtx};
use crate::error::{BoxError, Error, ErrorKind};
use crate::graph::{Body, WorkerBody};
use crate::metrics::{self, Flusher, WorkerCounters, FLUSH_EVERY, SAMPLE_EVERY};
use crate::registry::Registry;
use crate::run::{Completion, Run, Task};
use crate::sync::{self, Condvar, Mutex};

/// Nodes between two runs of the idle hook on a busy worker.
const IDLE_HOOK_EVERY: u64 = 64;
/// Idle rounds spent yielding before a worker with deferred completions parks with a timeout.
const YIELD_ROUNDS: u32 = 64;
/// The timed park of a worker that waits for deferred completions and has nothing else to do.
const DEFERRED_PARK: Duration = Duration::from_micros(50);
/// How long a worker that just ran dry watches the queues before it parks. Work often follows
/// within microseconds (a chain of GPU nodes hopping between workers, a burst of submissions),
/// and a futex wake-up costs several; an idle pool still parks after this, so it burns nothing.
const SPIN_BEFORE_PARK: Duration = Duration::from_micros(20);

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

/// The body of a worker thread.
pub(crate) fn main<S: Send + 'static>(
    reg: Arc<Registry<S>>,
    index: usize,
    local: Deque<Task<S>>,
    gate: Arc<StartGate>,
) {
    let info = &reg.infos[index];
    reg.sleep.register(index, sync::current_thread());
    let pinned = match info.core {
        Some(core) => core_affinity::set_for_current(core_affinity::CoreId { id: core }),
        None => true,
    };
    let state = if !pinned {
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
        None
    } else {
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
    };
    let go = gate.wait_go();
    drop(gate);
    let Some(state) = state else { return };
    if !go {
        if let Some(stop) = &reg.hooks.stop {
            stop(info, state);
        }
        return;
    }
    let wt = WorkerThread {
        group: info.group.index(),
        flusher: RefCell::new(Flusher::new(&reg.name, index)),
        counters: reg.workers[index].clone(),
        registry: reg.clone(),
        index,
        local,
        state,
        deferred: RefCell::new(Vec::new()),
        stolen: Cell::new(false),
        current: Cell::new(None),
        rng: Cell::new(
            0x9E37_79B9_7F4A_7C15 ^ (index as u64 + 1).wrapping_mul(0xBF58_476D_1CE4_E5B9),
        ),
    };
    let helper: &dyn Helper = &wt;
    // SAFETY: only the lifetime is erased; `wt` lives on this stack frame until after CURRENT is
    // cleared below, and CURRENT is thread-local, so nothing reads the pointer after `wt` is gone.
    let helper: NonNull<dyn Helper> = unsafe {
        std::mem::transmute::<NonNull<dyn Helper + '_>, NonNull<dyn Helper>>(NonNull::from(helper))
    };
    CURRENT.with(|c| c.set(Some(helper)));
    wt.main_loop();
    CURRENT.with(|c| c.set(None));
    wt.flush();
    let WorkerThread {
        state, registry, ..
    } = wt;
    if let Some(stop) = &registry.hooks.stop {
        stop(&registry.infos[index], state);
    }
}

/// A node waiting on a nested graph helps through this, whatever the pool's state type.
trait Helper {
    fn help_until(&self, c: &Completion);
    fn registry_addr(&self) -> usize;
}

thread_local! {
    static CURRENT: Cell<Option<NonNull<dyn Helper>>> = const { Cell::new(None) };
}

/// If this thread is a pool worker, runs other nodes until `c` completes and returns `true`.
pub(crate) fn help_until(c: &Completion) -> bool {
    match CURRENT.with(|cur| cur.get()) {
        Some(p) => {
            // SAFETY: CURRENT is set only while the worker's `WorkerThread` is alive on this
            // thread's stack (see `main`), and we are on that thread.
            unsafe { p.as_ref() }.help_until(c);
            true
        }
        None => false,
    }
}

/// Whether this thread is a worker of `reg`'s pool.
pub(crate) fn on_worker_of<S>(reg: &Arc<Registry<S>>) -> bool {
    match CURRENT.with(|cur| cur.get()) {
        // SAFETY: as in `help_until`.
        Some(p) => unsafe { p.as_ref() }.registry_addr() == Arc::as_ptr(reg) as *const () as usize,
        None => false,
    }
}

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
    local: Deque<Task<S>>,
    pub(crate) state: S,
    deferred: RefCell<Vec<Deferred<S>>>,
    flusher: RefCell<Flusher>,
    rng: Cell<u64>,
    /// The task `find_task` just returned was stolen (for the trace).
    stolen: Cell<bool>,
    /// The node whose body is running (innermost, when nodes wait on nested graphs).
    current: Cell<Option<Task<S>>>,
}

impl<S: Send + 'static> Helper for WorkerThread<S> {
    fn help_until(&self, c: &Completion) {
        c.register_thread();
        let mut idle_rounds = 0;
        while !c.is_done() {
            if let Some(t) = self.find_task() {
                self.execute(t);
                idle_rounds = 0;
            } else if self.poll_deferred() {
                idle_rounds = 0;
            } else {
                self.go_idle(&mut idle_rounds, &|| c.is_done());
            }
        }
    }

    fn registry_addr(&self) -> usize {
        Arc::as_ptr(&self.registry) as *const () as usize
    }
}

impl<S: Send + 'static> WorkerThread<S> {
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
                break;
            } else {
                self.go_idle(&mut idle_rounds, &|| false);
            }
        }
    }

    /// Runs `task` and the chain of continuations it hands on. A panicking node body unwinds to
    /// here (one landing pad for the whole chain instead of a `catch_unwind` per node); the node
    /// that was running is found in `current`.
    fn execute(&self, task: Task<S>) {
        let outer = self.current.get();
        let mut next = Some(task);
        while let Some(t) = next.take() {
            if let Err(p) = catch_unwind(AssertUnwindSafe(|| self.execute_chain(t))) {
                let failed = self
                    .current
                    .replace(outer)
                    .expect("a node body was running when it panicked");
                // The body unwound past its own `nodes_run` count.
                self.counters().nodes_run.add(1);
                let run = failed.run();
                run.fail(node_panicked(run, failed.node, &*p));
                next = self.complete(failed, false);
            }
        }
    }

    fn execute_chain(&self, task: Task<S>) {
        let mut next = Some(task);
        while let Some(t) = next {
            next = self.run_task(t);
            let n = self.counters().nodes_run.get();
            if n % IDLE_HOOK_EVERY == 0 {
                self.run_idle_hook();
                if n % FLUSH_EVERY == 0 {
                    self.flush();
                }
            }
        }
    }

    fn run_idle_hook(&self) {
        if let Some(h) = &self.registry.hooks.idle {
            h(&self.registry.infos[self.index], &self.state);
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
        if let Some(t) = self.local.pop() {
            return Some(t);
        }
        let reg = &*self.registry;
        loop {
            let mut retry = false;
            for injector in [&reg.groups[self.group].injector, &reg.any] {
                match injector.steal_batch_and_pop(&self.local) {
                    Steal::Success(t) => {
                        self.counters().injector_pops.add(1);
                        self.share_surplus();
                        return Some(t);
                    }
                    Steal::Retry => retry = true,
                    Steal::Empty => {}
                }
            }
            let members = &reg.groups[self.group].members;
            let n = members.len();
            if n > 1 {
                let start = self.next_rand() % n;
                for k in 0..n {
                    let victim = members[(start + k) % n];
                    if victim == self.index {
                        continue;
                    }
                    match reg.stealers[victim].steal_batch_and_pop(&self.local) {
                        Steal::Success(t) => {
                            self.counters().steals.add(1);
                            self.stolen.set(true);
                            self.share_surplus();
                            return Some(t);
                        }
                        Steal::Retry => retry = true,
                        Steal::Empty => {}
                    }
                }
            }
            if !retry {
                return None;
            }
        }
    }

    /// After taking a batch, wake a sleeping peer if there is more here than one task.
    fn share_surplus(&self) {
        if !self.local.is_empty() {
            self.registry.sleep.notify_local(self.group);
        }
    }

    /// Whether any queue this worker may take from holds a task (the re-check before parking).
    fn work_visible(&self) -> bool {
        let reg = &*self.registry;
        !self.local.is_empty()
            || !reg.groups[self.group].injector.is_empty()
            || !reg.any.is_empty()
            || reg.groups[self.group]
                .members
                .iter()
                .any(|&w| !reg.stealers[w].is_empty())
    }

    fn go_idle(&self, idle_rounds: &mut u32, condition: &dyn Fn() -> bool) {
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
            *idle_rounds += 1;
            if *idle_rounds < YIELD_ROUNDS {
                sync::yield_now();
                return;
            }
            Some(DEFERRED_PARK)
        };
        *idle_rounds = idle_rounds.saturating_add(1);
        self.counters().parks.add(1);
        let reg = &*self.registry;
        let start = reg.trace.as_ref().map(|_| Instant::now());
        reg.sleep.sleep(
            self.index,
            self.group,
            timeout,
            || self.work_visible(),
            || condition() || reg.is_terminated(),
        );
        if let (Some(sink), Some(start)) = (&reg.trace, start) {
            sink.park(self.index, start, Instant::now());
        }
    }

    /// Watches the queues (and `condition`) for up to [`SPIN_BEFORE_PARK`]; returns whether
    /// something turned up. Under loom, never: the models check the parking protocol itself.
    #[cfg(not(loom))]
    fn spin(&self, condition: &dyn Fn() -> bool) -> bool {
        let start = Instant::now();
        loop {
            for _ in 0..16 {
                std::hint::spin_loop();
            }
            if self.work_visible() || condition() {
                return true;
            }
            if start.elapsed() >= SPIN_BEFORE_PARK {
                return false;
            }
        }
    }

    #[cfg(loom)]
    fn spin(&self, _condition: &dyn Fn() -> bool) -> bool {
        false
    }

    /// Runs one ready node; returns the successor to run next on this worker, if any.
    #[inline(always)]
    fn run_task(&self, task: Task<S>) -> Option<Task<S>> {
        let run = task.run();
        let spec = &run.plan.nodes[task.node as usize];
        match &spec.body {
            Body::Worker(body) if !run.is_failed() => self.run_worker_body(task, body),
            _ => self.run_task_slow(task),
        }
    }

    /// The uncommon cases: a failed run, a cpu node, an inlined body.
    #[cold]
    #[inline(never)]
    fn run_task_slow(&self, task: Task<S>) -> Option<Task<S>> {
        let run = task.run();
        let i = task.node;
        if run.is_failed() {
            self.counters().skipped.add(1);
            run.note_skipped();
            return self.complete(task, false);
        }
        let spec = &run.plan.nodes[i as usize];
        match spec.resolved_body() {
            Body::Cpu(f) => {
                if let Some(lane) = &self.registry.cpu_lane {
                    let reg = self.registry.clone();
                    lane.spawn(move || run_on_cpu_lane(reg, task));
                    return None;
                }
                let inputs = Inputs::of(run, i);
                let res = catch_unwind(AssertUnwindSafe(|| f(&inputs)));
                self.counters().nodes_run.add(1);
                let ok = store_outcome(&task, res);
                self.complete(task, ok)
            }
            Body::Worker(f) => self.run_worker_body(task, f),
            Body::Inlined(..) => unreachable!("resolved_body never returns Inlined"),
        }
    }

    #[inline(always)]
    fn run_worker_body(&self, task: Task<S>, body: &WorkerBody<S>) -> Option<Task<S>> {
        let run = task.run();
        let counters = self.counters();
        let n = counters.nodes_run.get();
        if n % SAMPLE_EVERY == 0 || self.registry.trace.is_some() {
            return self.run_worker_body_instrumented(task, body);
        }
        let ctx = NodeCtx {
            inputs: Inputs::of(run, task.node),
            run,
            worker: self,
            deferred: Cell::new(None),
        };
        let prev = self.current.replace(Some(task));
        let res = body(&ctx);
        self.current.set(prev);
        counters.nodes_run.add(1);
        match (res, ctx.deferred.take()) {
            (Ok(()), None) => self.complete(task, true),
            (res, deferred) => self.after_body_slow(task, res, deferred),
        }
    }

    /// `run_worker_body` with the run time sampled for the histogram and, when the pool records a
    /// trace, the node's slice recorded.
    #[inline(never)]
    fn run_worker_body_instrumented(&self, task: Task<S>, body: &WorkerBody<S>) -> Option<Task<S>> {
        let run = task.run();
        let i = task.node;
        let ctx = NodeCtx {
            inputs: Inputs::of(run, i),
            run,
            worker: self,
            deferred: Cell::new(None),
        };
        let start = Instant::now();
        let prev = self.current.replace(Some(task));
        let res = body(&ctx);
        self.current.set(prev);
        let end = Instant::now();
        if let Some(sink) = &self.registry.trace {
            let name = Cow::Owned(run.plan.topo.names[i as usize].to_owned());
            sink.node(
                self.index,
                name,
                &run.plan.name,
                i,
                (start, end),
                self.stolen.replace(false),
            );
        }
        let counters = self.counters();
        if counters.nodes_run.get() % SAMPLE_EVERY == 0 {
            self.flusher
                .borrow_mut()
                .sample(end.saturating_duration_since(start).as_secs_f64());
        }
        counters.nodes_run.add(1);
        match (res, ctx.deferred.take()) {
            (Ok(()), None) => self.complete(task, true),
            (res, deferred) => self.after_body_slow(task, res, deferred),
        }
    }

    /// A body that failed, or deferred its completion.
    #[cold]
    #[inline(never)]
    fn after_body_slow(
        &self,
        task: Task<S>,
        res: Result<(), BoxError>,
        deferred: Option<DeferFn<S>>,
    ) -> Option<Task<S>> {
        match (res, deferred) {
            (Ok(()), Some(poll)) => {
                self.deferred.borrow_mut().push(Deferred { task, poll });
                None
            }
            (Ok(()), None) => self.complete(task, true),
            (Err(e), _) => {
                let run = task.run();
                run.fail(node_failed(run, task.node, e));
                self.complete(task, false)
            }
        }
    }

    /// Releases the node's successors: one that may run here is returned as the continuation,
    /// the others are queued (here, or on their group's injector) and sleepers are woken.
    #[inline(always)]
    fn complete(&self, task: Task<S>, ok: bool) -> Option<Task<S>> {
        // Fast path: a single successor whose only predecessor is this node, placed here. It is
        // ready without touching a shared counter and takes over this node's in-flight unit.
        let run = task.run();
        if ok {
            if let [s] = *run.plan.successors(task.node) {
                if run.plan.indegree[s as usize] == 1 && self.runs_here(run, s) && !run.is_failed()
                {
                    return Some(Task::new(run, s));
                }
            }
        }
        self.complete_general(task, ok)
    }

    #[inline]
    fn runs_here(&self, run: &Run<S>, node: u32) -> bool {
        match run.plan.nodes[node as usize].placement() {
            None => true,
            Some(g) => g.index() == self.group,
        }
    }

    /// Releases the successors of a node that has more than one, or whose one successor may
    /// be waiting on others or run elsewhere. The first ready one that may run here becomes the
    /// continuation and takes over the node's in-flight unit; every other one enters the
    /// in-flight count before it is queued, so the node's own unit keeps the run alive until
    /// the loop is over.
    #[inline(never)]
    fn complete_general(&self, task: Task<S>, ok: bool) -> Option<Task<S>> {
        let run = task.run();
        let mut cont = None;
        let mut pushed_here = false;
        run.release(task.node, ok, |t| {
            if cont.is_none() && self.runs_here(run, t.node) {
                cont = Some(t);
                return;
            }
            run.enter();
            match run.plan.nodes[t.node as usize].placement() {
                Some(g) if g.index() != self.group => {
                    self.registry.groups[g.index()].injector.push(t);
                    self.registry.sleep.notify_group(g.index());
                }
                _ => {
                    self.local.push(t);
                    pushed_here = true;
                }
            }
        });
        if pushed_here {
            self.registry.sleep.notify_local(self.group);
        }
        if cont.is_none() && run.leave() {
            self.registry.finish(run);
        }
        cont
    }

    /// Polls deferred completions; returns whether any completed.
    fn poll_deferred(&self) -> bool {
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
                    run.fail(node_failed(run, d.task.node, e));
                    false
                }
                Err(p) => {
                    let run = d.task.run();
                    run.fail(node_panicked(run, d.task.node, &*p));
                    false
                }
            };
            let d = list.swap_remove(i);
            progressed = true;
            if let Some(c) = self.complete(d.task, ok) {
                self.execute(c);
            }
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
fn store_outcome<S>(task: &Task<S>, res: std::thread::Result<Result<(), BoxError>>) -> bool {
    let run = task.run();
    match res {
        Ok(Ok(())) => true,
        Ok(Err(e)) => {
            run.fail(node_failed(run, task.node, e));
            false
        }
        Err(p) => {
            run.fail(node_panicked(run, task.node, &*p));
            false
        }
    }
}

/// Runs a CPU-heavy node on the rayon lane and releases its successors through the injectors.
fn run_on_cpu_lane<S: Send + 'static>(reg: Arc<Registry<S>>, task: Task<S>) {
    let run = task.run();
    let i = task.node;
    let ok = if run.is_failed() {
        run.note_skipped();
        false
    } else {
        let Body::Cpu(f) = run.plan.nodes[i as usize].resolved_body() else {
            unreachable!("only cpu nodes are sent to the cpu lane")
        };
        let inputs = Inputs::of(run, i);
        let res = catch_unwind(AssertUnwindSafe(|| f(&inputs)));
        metrics::cpu_lane_node(&reg);
        store_outcome(&task, res)
    };
    let mut ready = Vec::new();
    let n = run.release(i, ok, |t| ready.push(t));
    if run.settle(n) {
        reg.finish(run);
        return;
    }
    for t in ready {
        reg.push_external(t);
    }
}
