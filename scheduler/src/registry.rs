//! State shared by a pool's workers: queues, sleep, active runs, statistics, hooks.

use std::sync::Arc;

use crossbeam_deque::{Injector, Stealer, Worker as Deque};
use crossbeam_utils::CachePadded;

use crate::active::{ActiveRuns, SHARDS};
use crate::admission::Admission;
use crate::config::{IdleHook, ShutdownMode, SpinHook, StartHook, StopHook, WorkerInfo};
use crate::ctx::{RunAccess, Submit};
use crate::error::{Error, ErrorKind};
use crate::graph::{Graph, Plan};
use crate::handle::{on_worker_of, GraphHandle};
use crate::ids::Placement;
use crate::latch::Completion;
use crate::later::{Completer, HandedOff};
use crate::metrics::{Export, PoolCounters, PoolStats, WorkerCounters, WorkerStats};
use crate::output::GraphOutput;
use crate::priority::{LevelQueues, Priority, WorkerDeques};
use crate::run::{hand_off, Queue, Run, RunRef, Task};
use crate::sleep::Sleep;
use crate::spin::Spinners;
use crate::sync::{AtomicBool, AtomicU64, Ordering};

/// A run that is over and out of the active-run table: the last reference to it, and its
/// result for the waiter.
pub(crate) struct Finished<S> {
    keep: Option<Arc<Run<S>>>,
    completion: Arc<Completion>,
    result: Result<GraphOutput, Error>,
}

impl<S> Finished<S> {
    /// Frees the run, then hands the result to the waiter (so the run's bodies and unclaimed
    /// outputs are gone by the time `wait` returns).
    pub(crate) fn settle(self) {
        drop(self.keep);
        self.completion.complete(self.result);
    }
}

pub(crate) struct Hooks<S> {
    pub(crate) start: StartHook<S>,
    pub(crate) stop: Option<StopHook<S>>,
    pub(crate) idle: Option<IdleHook<S>>,
    pub(crate) spin: Option<SpinHook<S>>,
}

pub(crate) struct GroupQueues<S> {
    pub(crate) name: Arc<str>,
    pub(crate) injector: Injector<Task<S>>,
    pub(crate) members: Box<[usize]>,
    /// The domains this group belongs to: its workers take from their injectors too.
    pub(crate) domains: Box<[u32]>,
    /// A worker of this group is watching past the idle spin at its work's pace (one at a time).
    pub(crate) paced_spinner: CachePadded<std::sync::atomic::AtomicBool>,
}

/// A set of groups whose workers all serve the nodes placed on it: ready nodes of the domain
/// that do not run at once as a continuation wait here, where every one of them looks.
pub(crate) struct DomainQueues<S> {
    pub(crate) name: Arc<str>,
    pub(crate) injector: Injector<Task<S>>,
    pub(crate) groups: Arc<[usize]>,
    /// Workers of all its groups.
    pub(crate) workers: usize,
}

/// The pool's groups (names, in `GroupId` order) and domains (names and group indices, in
/// `DomainId` order), checked by the builder.
pub(crate) struct Topology {
    pub(crate) groups: Vec<String>,
    pub(crate) domains: Vec<(String, Vec<usize>)>,
}

/// The builder's switches the registry keeps.
pub(crate) struct Settings {
    /// The trace window per worker, when tracing.
    pub(crate) trace: Option<usize>,
    pub(crate) export_metrics: bool,
    pub(crate) max_graphs_in_flight: Option<usize>,
    pub(crate) wait_spin: std::time::Duration,
    pub(crate) idle_spin: std::time::Duration,
    pub(crate) paced_spin: std::time::Duration,
    /// `PoolBuilder::spinning_waiters`.
    pub(crate) spinning_waiters: usize,
}

pub(crate) struct Registry<S> {
    pub(crate) name: Arc<str>,
    pub(crate) infos: Box<[WorkerInfo]>,
    pub(crate) groups: Box<[GroupQueues<S>]>,
    pub(crate) domains: Box<[DomainQueues<S>]>,
    /// Ready nodes with no placement, from threads that are not workers of this pool.
    pub(crate) any: Injector<Task<S>>,
    pub(crate) stealers: Box<[Stealer<Task<S>>]>,
    pub(crate) sleep: Arc<Sleep>,
    /// The runs in flight and the pool's life (running, shutting down, terminated).
    runs: ActiveRuns<Run<S>>,
    next_run: AtomicU64,
    pub(crate) workers: Box<[Arc<CachePadded<WorkerCounters>>]>,
    pub(crate) counters: PoolCounters,
    pub(crate) hooks: Hooks<S>,
    pub(crate) cpu_lane: Option<Arc<rayon_core::ThreadPool>>,
    pub(crate) trace: Option<crate::trace::TraceSink>,
    /// Export through the `metrics` facade (`PoolBuilder::metrics`).
    pub(crate) export_metrics: bool,
    /// The queues of the high and low levels (the normal level's are the fields above).
    pub(crate) high: LevelQueues<Task<S>>,
    pub(crate) low: LevelQueues<Task<S>>,
    /// A graph with a node of another level than normal was submitted: workers poll every level
    /// from then on (set once, before that graph's first node is queued; never cleared).
    pub(crate) prioritized: AtomicBool,
    /// The limit on graphs in flight (`PoolBuilder::max_graphs_in_flight`).
    pub(crate) admission: Option<Admission>,
    /// `PoolBuilder::wait_spin`, given to every run's completion.
    pub(crate) wait_spin: std::time::Duration,
    /// Which of the waiters may spin now (`spin.rs`).
    spinners: Arc<Spinners>,
    /// `PoolBuilder::idle_spin`: how long a worker that ran dry watches before it parks.
    pub(crate) idle_spin: std::time::Duration,
    /// `PoolBuilder::paced_spin`: how long one worker of a group may watch past `idle_spin`
    /// when its work comes at a steady pace.
    pub(crate) paced_spin: std::time::Duration,
}

impl<S: Send + 'static> Registry<S> {
    pub(crate) fn new(
        name: String,
        infos: Vec<WorkerInfo>,
        topology: Topology,
        hooks: Hooks<S>,
        cpu_lane: Option<Arc<rayon_core::ThreadPool>>,
        settings: Settings,
    ) -> (Arc<Self>, Vec<WorkerDeques<Task<S>>>) {
        let Settings {
            trace,
            export_metrics,
            max_graphs_in_flight,
            wait_spin,
            idle_spin,
            paced_spin,
            spinning_waiters,
        } = settings;
        let Topology {
            groups: group_names,
            domains: domain_specs,
        } = topology;
        let deques: Vec<Deque<Task<S>>> = infos.iter().map(|_| Deque::new_lifo()).collect();
        let stealers = deques.iter().map(|d| d.stealer()).collect();
        let groups = group_names
            .iter()
            .enumerate()
            .map(|(gi, n)| GroupQueues {
                name: Arc::from(n.as_str()),
                injector: Injector::new(),
                members: infos
                    .iter()
                    .filter(|i| i.group.index() == gi)
                    .map(|i| i.index)
                    .collect(),
                domains: domain_specs
                    .iter()
                    .enumerate()
                    .filter(|(_, (_, gs))| gs.contains(&gi))
                    .map(|(d, _)| d as u32)
                    .collect(),
                paced_spinner: CachePadded::new(std::sync::atomic::AtomicBool::new(false)),
            })
            .collect::<Box<[GroupQueues<S>]>>();
        let domains: Box<[DomainQueues<S>]> = domain_specs
            .into_iter()
            .map(|(n, gs)| DomainQueues {
                name: Arc::from(n.as_str()),
                injector: Injector::new(),
                workers: gs.iter().map(|&g| groups[g].members.len()).sum(),
                groups: Arc::from(gs),
            })
            .collect();
        let trace = trace.map(|window| crate::trace::TraceSink::new(&infos, window));
        let (high, high_deques) = LevelQueues::new(groups.len(), domains.len(), infos.len());
        let (low, low_deques) = LevelQueues::new(groups.len(), domains.len(), infos.len());
        let deques = deques
            .into_iter()
            .zip(high_deques.into_iter().zip(low_deques))
            .map(|(normal, (high, low))| WorkerDeques { normal, high, low })
            .collect();
        let reg = Registry {
            high,
            low,
            prioritized: AtomicBool::new(false),
            admission: max_graphs_in_flight.map(Admission::new),
            wait_spin,
            spinners: Arc::new(Spinners::new(
                spinning_waiters,
                infos.iter().filter_map(|i| i.core),
            )),
            idle_spin,
            paced_spin,
            trace,
            export_metrics,
            name: Arc::from(name.as_str()),
            workers: infos
                .iter()
                .map(|_| Arc::new(CachePadded::new(WorkerCounters::new())))
                .collect(),
            sleep: Arc::new(Sleep::new(group_names.len(), infos.len())),
            infos: infos.into_boxed_slice(),
            groups,
            domains,
            any: Injector::new(),
            stealers,
            runs: ActiveRuns::new(SHARDS),
            next_run: AtomicU64::new(1),
            counters: PoolCounters::new(),
            hooks,
            cpu_lane,
        };
        (Arc::new(reg), deques)
    }

    /// The pool as its `metrics` export sees it.
    #[inline]
    pub(crate) fn export(&self) -> Export<'_> {
        Export {
            pool: &self.name,
            on: self.export_metrics,
        }
    }

    /// A node ran on the cpu lane (counted by the lane's threads, so in a shared counter).
    pub(crate) fn note_cpu_lane_node(&self) {
        self.counters.cpu_lane_nodes.fetch_add(1, Ordering::Relaxed);
        self.export().cpu_lane_node();
    }

    /// The live statistics (`Pool::stats`).
    pub(crate) fn stats(&self) -> PoolStats {
        let workers = self
            .workers
            .iter()
            .map(|c| WorkerStats {
                nodes_run: c.nodes_run.get(),
                steals: c.steals.get(),
                injector_pops: c.injector_pops.get(),
                parks: c.parks.get(),
                skipped: c.skipped.get(),
            })
            .collect();
        let c = &self.counters;
        PoolStats {
            workers,
            cpu_lane_nodes: c.cpu_lane_nodes.load(Ordering::Relaxed),
            graphs_submitted: c.graphs_submitted.load(Ordering::Relaxed),
            graphs_completed: c.graphs_completed.load(Ordering::Relaxed),
            graphs_failed: c.graphs_failed.load(Ordering::Relaxed),
            nodes_cancelled: c.nodes_cancelled.load(Ordering::Relaxed),
            queue_depth: self.queue_depth(),
            submissions_admitted: c.submissions_admitted.load(Ordering::Relaxed),
            submissions_waited: c.submissions_waited.load(Ordering::Relaxed),
            submissions_rejected: c.submissions_rejected.load(Ordering::Relaxed),
            submissions_waiting: self.admission.as_ref().map_or(0, |a| a.waiting()),
        }
    }

    /// Tasks queued at every level, in every deque and injector.
    fn queue_depth(&self) -> usize {
        self.stealers.iter().map(|s| s.len()).sum::<usize>()
            + self.any.len()
            + self.groups.iter().map(|g| g.injector.len()).sum::<usize>()
            + self.domains.iter().map(|d| d.injector.len()).sum::<usize>()
            + self.high.len()
            + self.low.len()
    }

    pub(crate) fn is_terminated(&self) -> bool {
        self.runs.is_terminated()
    }

    /// The queues of level `p` other than normal.
    #[inline]
    pub(crate) fn level(&self, p: Priority) -> &LevelQueues<Task<S>> {
        match p {
            Priority::High => &self.high,
            _ => &self.low,
        }
    }

    /// Queues a ready task from outside the worker loop (a submission, the cpu lane) on the
    /// injector of its placement and level. Returns nothing: the caller wakes workers.
    fn inject(&self, t: Task<S>, spec_prio: Priority, placement: Placement) {
        if spec_prio == Priority::Normal {
            match placement {
                Placement::Any => self.any.push(t),
                Placement::Group(g) => self.groups[g.index()].injector.push(t),
                Placement::Domain(d) => self.domains[d.index()].injector.push(t),
            }
        } else {
            let level = self.level(spec_prio);
            match placement {
                Placement::Any => level.any.push(t),
                Placement::Group(g) => level.groups[g.index()].push(t),
                Placement::Domain(d) => level.domains[d.index()].push(t),
            }
        }
    }

    /// Whether the calling thread is one of this pool's workers.
    pub(crate) fn on_worker_thread(&self) -> bool {
        on_worker_of(self as *const Self as *const ())
    }

    /// Switches the pool to polling every level before a node of another level is queued.
    pub(crate) fn note_prioritized(&self) {
        if !self.prioritized.load(Ordering::Relaxed) {
            self.prioritized.store(true, Ordering::SeqCst);
        }
    }

    /// Admission before a submission: a slot, waited for when `wait` (a blocking submit off the
    /// pool's workers), taken at once on a worker of self pool (a nested submission must not wait
    /// for graphs that may be waiting for it), or a `WouldBlock` error.
    pub(crate) fn admit(&self, graph: &Graph<S>, wait: bool) -> Result<(), Error> {
        let Some(adm) = &self.admission else {
            return Ok(());
        };
        if adm.try_acquire() {
            self.note_admitted(false);
            return Ok(());
        }
        if self.on_worker_thread() {
            adm.force_acquire();
            self.note_admitted(false);
            return Ok(());
        }
        if !wait {
            self.counters
                .submissions_rejected
                .fetch_add(1, Ordering::Relaxed);
            self.export().submission_rejected();
            return Err(Error::new(
                ErrorKind::WouldBlock,
                format!(
                    "pool '{}' has {} graph(s) in flight, its limit; graph '{}' was not submitted",
                    crate::error::bounded(&self.name),
                    adm.limit,
                    crate::error::bounded(&graph.plan.name)
                ),
            ));
        }
        let waited = adm.acquire_blocking(|waiting| self.export().submissions_waiting(waiting));
        self.note_admitted(waited);
        Ok(())
    }

    /// Counts an admitted submission.
    pub(crate) fn note_admitted(&self, waited: bool) {
        self.counters
            .submissions_admitted
            .fetch_add(1, Ordering::Relaxed);
        if waited {
            self.counters
                .submissions_waited
                .fetch_add(1, Ordering::Relaxed);
        }
        if self.admission.is_some() {
            self.export().submission_admitted(waited);
        }
    }

    /// A withdrawn async submission (see `Admission::cancel`).
    pub(crate) fn cancel_admission(&self, ticket: crate::admission::Ticket) {
        if let Some(adm) = &self.admission {
            adm.cancel(ticket);
            self.export().submissions_waiting(adm.waiting());
        }
    }

    /// Gives a graph's admission slot back (it finished, or its submission failed after
    /// admission).
    pub(crate) fn release_admission(&self) {
        if let Some(adm) = &self.admission {
            adm.release();
        }
    }

    /// Checks, admits (see [`admit`](Self::admit)) and starts `graph`.
    pub(crate) fn submit(&self, graph: &Graph<S>) -> Result<GraphHandle, Error> {
        self.submit_with(graph, true)
    }

    /// Starts `graph` once [`admit`](Self::admit) let it in.
    pub(crate) fn submit_with(&self, graph: &Graph<S>, wait: bool) -> Result<GraphHandle, Error> {
        self.check(graph)?;
        self.admit(graph, wait)?;
        self.start(graph)
    }

    /// Placement checks against self pool.
    pub(crate) fn check(&self, graph: &Graph<S>) -> Result<(), Error> {
        let plan: &Arc<Plan<S>> = &graph.plan;
        if let Some((node, g)) = plan.max_placement() {
            if g.index() >= self.groups.len() {
                return Err(Error::new(
                    ErrorKind::UnknownGroup,
                    format!(
                        "{} is placed on group {}, but pool '{}' has {} group(s)",
                        plan.describe(node),
                        g.index(),
                        crate::error::bounded(&self.name),
                        self.groups.len()
                    ),
                ));
            }
        }
        if let Some((node, d)) = plan.max_domain() {
            if d.index() >= self.domains.len() {
                return Err(Error::new(
                    ErrorKind::UnknownGroup,
                    format!(
                        "{} is placed on domain {}, but pool '{}' has {} domain(s)",
                        plan.describe(node),
                        d.index(),
                        crate::error::bounded(&self.name),
                        self.domains.len()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Starts a checked and admitted graph (its slot is given back if it cannot start).
    pub(crate) fn start(&self, graph: &Graph<S>) -> Result<GraphHandle, Error> {
        let plan: &Arc<Plan<S>> = &graph.plan;
        let id = self.next_run.fetch_add(1, Ordering::Relaxed);
        let run = match Run::new(id, plan.clone()) {
            Ok(run) => Arc::new(run),
            Err(e) => {
                self.release_admission();
                return Err(e);
            }
        };
        run.completion.set_spin(
            self.wait_spin,
            &self.spinners,
            plan.priority == Priority::High,
        );
        let handle = GraphHandle {
            completion: run.completion.clone(),
            graph: plan.name.clone(),
        };
        // An empty graph finishes here and now: it never enters the table.
        let admitted = if plan.nodes.is_empty() {
            self.runs.is_open()
        } else {
            self.runs.enter(id, &run)
        };
        if !admitted {
            self.release_admission();
            return Err(Error::new(
                ErrorKind::ShutDown,
                format!(
                    "pool '{}' is shut down; graph '{}' was not submitted",
                    crate::error::bounded(&self.name),
                    crate::error::bounded(&plan.name)
                ),
            ));
        }
        self.counters
            .graphs_submitted
            .fetch_add(1, Ordering::Relaxed);
        self.export().graph_submitted();
        if plan.nodes.is_empty() {
            let result = run.take_result();
            self.counters
                .graphs_completed
                .fetch_add(1, Ordering::Relaxed);
            self.export().graph_finished(None, run.submitted.elapsed());
            self.release_admission();
            run.completion.complete(result);
            return Ok(handle);
        }
        if plan.prioritized {
            self.note_prioritized();
        }
        let mut any = 0usize;
        let mut per_group = vec![0usize; self.groups.len()];
        let mut per_domain = vec![0usize; self.domains.len()];
        for &s in plan.sources.iter() {
            let t = Task::new(RunRef::new(&run), s);
            let spec = &plan.nodes[s as usize];
            let placement = spec.placement();
            self.inject(t, spec.priority(), placement);
            match placement {
                Placement::Any => any += 1,
                Placement::Group(g) => per_group[g.index()] += 1,
                Placement::Domain(d) => per_domain[d.index()] += 1,
            }
        }
        // Wake as many workers as there is work for; each woken worker wakes another if it
        // finds more than it takes.
        for (g, &n) in per_group.iter().enumerate() {
            for _ in 0..n.min(self.groups[g].members.len()) {
                if !self.sleep.notify_group(g) {
                    break;
                }
            }
        }
        for (d, &n) in per_domain.iter().enumerate() {
            let domain = &self.domains[d];
            for _ in 0..n.min(domain.workers) {
                if !self.sleep.notify_groups(&domain.groups) {
                    break;
                }
            }
        }
        for _ in 0..any.min(self.infos.len()) {
            if !self.sleep.notify_any() {
                break;
            }
        }
        Ok(handle)
    }

    /// Pushes a ready task from a thread that is not one of this pool's workers (the cpu lane,
    /// a `Completer`'s completion task), waking a worker of its placement.
    pub(crate) fn push_external(&self, t: Task<S>) {
        let spec = &t.run().plan.nodes[t.node() as usize];
        let placement = spec.placement();
        self.inject(t, spec.priority(), placement);
        if self.spinning_here_for(placement) {
            // The pusher is a worker of this placement in its spin hook: it looks at the
            // injectors as soon as the hook returns, and a peer woken for this would cost a
            // wake-up on this thread and race it for the task.
            return;
        }
        match placement {
            Placement::Any => {
                self.sleep.notify_any();
            }
            Placement::Group(g) => {
                self.sleep.notify_group(g.index());
            }
            Placement::Domain(d) => {
                self.sleep.notify_groups(&self.domains[d.index()].groups);
            }
        }
    }

    /// Whether this thread is a worker of this pool, in its spin hook, that takes tasks of
    /// `placement` (see `worker::idle`'s `SpinHookGuard`).
    fn spinning_here_for(&self, placement: Placement) -> bool {
        let Some(group) = crate::hooked::spin_hook_group(self as *const Self as usize) else {
            return false;
        };
        match placement {
            Placement::Any => true,
            Placement::Group(g) => g.index() == group,
            Placement::Domain(d) => self.domains[d.index()].groups.contains(&group),
        }
    }

    /// Called by the thread whose decrement brought `run`'s in-flight count to zero.
    /// The caller must not touch `run` afterwards, and must [`settle`](Finished::settle) what
    /// this returns once no function that holds a `&Run` of it as an argument is on its stack:
    /// settling may free the run, and freeing memory that a reference argument still points to
    /// is undefined behaviour (Miri's protectors find it), even if the reference is never used
    /// again.
    #[must_use = "a finished run must be settled, or its waiter is never told"]
    pub(crate) fn finish(&self, run: &Run<S>) -> Finished<S> {
        let result = run.take_result();
        let elapsed = run.submitted.elapsed();
        match &result {
            Ok(_) => {
                self.counters
                    .graphs_completed
                    .fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                self.counters.graphs_failed.fetch_add(1, Ordering::Relaxed);
                self.counters
                    .nodes_cancelled
                    .fetch_add(e.cancelled_nodes() as u64, Ordering::Relaxed);
            }
        }
        self.export().graph_finished(result.as_ref().err(), elapsed);
        let completion = run.completion.clone();
        let keep = self.runs.leave(run.id, || self.sleep.unpark_all());
        self.release_admission();
        Finished {
            keep,
            completion,
            result,
        }
    }

    /// The number of runs in the active-run table.
    pub(crate) fn active_runs(&self) -> usize {
        self.runs.len()
    }

    pub(crate) fn begin_shutdown(&self, mode: ShutdownMode) {
        let cancel = |run: &Run<S>| {
            if mode == ShutdownMode::Cancel {
                run.fail(Error::new(
                    ErrorKind::Cancelled,
                    format!(
                        "graph '{}' was cancelled: pool '{}' is shutting down",
                        crate::error::bounded(&run.plan.name),
                        crate::error::bounded(&self.name)
                    ),
                ));
            }
        };
        self.runs.close(cancel, || self.sleep.unpark_all());
    }

    pub(crate) fn wait_terminated(&self) {
        self.runs.wait_terminated();
    }
}

impl<S: Send + 'static> Submit<S> for Registry<S> {
    fn submit(&self, graph: &Graph<S>) -> Result<GraphHandle, Error> {
        Registry::submit(self, graph)
    }

    fn complete_later(self: Arc<Self>, run: &dyn RunAccess, node: u32) -> (Completer, HandedOff) {
        let run = run
            .as_any()
            .downcast_ref::<Run<S>>()
            .expect("a body's run is a run of its pool");
        hand_off(self, RunRef::new(run), node)
    }
}

impl<S: Send + 'static> Queue<S> for Registry<S> {
    /// A `Completer`'s completion task: on the injector of its node's placement and level.
    fn push_completion(&self, t: Task<S>) {
        self.push_external(t);
    }
}
