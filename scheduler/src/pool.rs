//! The public face of the pool: its builder, its handle, its settings and statistics.

use std::fmt;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::affinity;
use crate::config::{
    Cores, GroupSpec, IdleHook, NameFn, ShutdownMode, SpinHook, StartHook, StopHook, WorkerInfo,
};
use crate::error::{bounded, bounded_list, BoxError, Error, ErrorKind};
use crate::graph::Graph;
use crate::handle::GraphHandle;
use crate::ids::{DomainId, GroupId};
use crate::metrics::PoolStats;
use crate::output::GraphOutput;
use crate::priority::WorkerDeques;
use crate::registry::{Hooks, Registry, Settings, Topology};
use crate::run::Task;
use crate::submit::SubmitFuture;
use crate::sync::{self, Mutex};
use crate::trace::Trace;
use crate::worker;

/// Configures and starts a [`Pool`].
///
/// # Examples
///
/// ```
/// use boundpool_scheduler::{Cores, PoolBuilder};
///
/// let pool = PoolBuilder::new()
///     .name("demo")
///     .workers(2)
///     .cores(Cores::Unpinned)
///     .start_hook(|info| Ok(format!("state of worker {}", info.index)))
///     .build()?;
/// assert_eq!(pool.workers().len(), 2);
/// # Ok::<(), boundpool_scheduler::Error>(())
/// ```
pub struct PoolBuilder<S = ()> {
    name: String,
    workers: Option<usize>,
    cores: Cores,
    groups: Option<Vec<GroupSpec>>,
    domains: Vec<(String, Vec<GroupId>)>,
    thread_name: Option<NameFn>,
    start: StartHook<S>,
    stop: Option<StopHook<S>>,
    pub(crate) idle: Option<IdleHook<S>>,
    pub(crate) spin: Option<SpinHook<S>>,
    rayon: Option<Arc<rayon_core::ThreadPool>>,
    cpu_lane_threads: Option<usize>,
    stack_size: Option<usize>,
    /// Whether to record a trace, and its window (slices per worker).
    trace: (bool, usize),
    metrics: bool,
    max_graphs_in_flight: Option<usize>,
    wait_spin: Duration,
    idle_spin: Duration,
    paced_spin: Option<Duration>,
    spinning_waiters: Option<usize>,
}

impl<S> fmt::Debug for PoolBuilder<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolBuilder")
            .field("name", &self.name)
            .field("workers", &self.workers)
            .field("cores", &self.cores)
            .field("groups", &self.groups)
            .finish_non_exhaustive()
    }
}

impl Default for PoolBuilder<()> {
    fn default() -> Self {
        Self::new()
    }
}

impl PoolBuilder<()> {
    /// A builder with the defaults: one group named `host` with one worker per core this
    /// process may use, pinned, with no worker state.
    pub fn new() -> Self {
        PoolBuilder {
            name: "boundpool".into(),
            workers: None,
            cores: Cores::All,
            groups: None,
            domains: Vec::new(),
            thread_name: None,
            start: Arc::new(|_| Ok(())),
            stop: None,
            idle: None,
            spin: None,
            rayon: None,
            cpu_lane_threads: None,
            stack_size: None,
            trace: (false, crate::trace::DEFAULT_WINDOW),
            metrics: true,
            max_graphs_in_flight: None,
            wait_spin: Duration::ZERO,
            idle_spin: crate::worker::SPIN_BEFORE_PARK,
            paced_spin: None,
            spinning_waiters: None,
        }
    }
}

/// The number of cores this process may run on.
pub fn default_workers() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

impl<S: Send + 'static> PoolBuilder<S> {
    /// The pool's name (metrics label `pool`, thread names, errors). Default `boundpool`.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Number of workers of the default `host` group. Default: [`default_workers`].
    /// Ignored when [`groups`](Self::groups) is given.
    pub fn workers(mut self, n: usize) -> Self {
        self.workers = Some(n);
        self
    }

    /// Cores of the default `host` group. Ignored when [`groups`](Self::groups) is given.
    pub fn cores(mut self, cores: Cores) -> Self {
        self.cores = cores;
        self
    }

    /// Explicit worker groups, in [`GroupId`] order (for example one per GPU, plus a host group).
    pub fn groups(mut self, groups: Vec<GroupSpec>) -> Self {
        self.groups = Some(groups);
        self
    }

    /// Adds a domain named `name` over `groups`: a node placed on it
    /// ([`GraphBuilder::place`](crate::GraphBuilder::place) with the [`DomainId`], the index of
    /// this call among the builder's `domain` calls) may run on any worker of any of those
    /// groups, and its ready successors placed on it are queued where all of them look. Groups
    /// stay placements of their own. A group may belong to several domains.
    ///
    /// `build` fails ([`ErrorKind::InvalidConfig`]) for a domain without groups, a group the
    /// pool does not have, a group named twice in a domain, or a name used twice.
    pub fn domain(
        mut self,
        name: impl Into<String>,
        groups: impl IntoIterator<Item = GroupId>,
    ) -> Self {
        self.domains
            .push((name.into(), groups.into_iter().collect()));
        self
    }

    /// Names each worker thread. Default `{pool}-{group}-{index_in_group}`.
    pub fn thread_name(
        mut self,
        f: impl Fn(&WorkerInfo) -> String + Send + Sync + 'static,
    ) -> Self {
        self.thread_name = Some(Arc::new(f));
        self
    }

    /// Stack size of the worker threads, in bytes.
    pub fn stack_size(mut self, bytes: usize) -> Self {
        self.stack_size = Some(bytes);
        self
    }

    /// Records a timeline (a slice per node and per park on each worker's track), read with
    /// [`Pool::take_trace`] or [`Pool::snapshot_trace`]. Off by default; when off it costs one
    /// branch per node, when on a few ns per node (each worker writes its own ring, no lock).
    /// Each worker keeps its last [`trace_window`](Self::trace_window) slices.
    pub fn trace(mut self, on: bool) -> Self {
        self.trace.0 = on;
        self
    }

    /// When tracing ([`trace`](Self::trace)), keep the last `slices` slices of each worker and
    /// of each extra track: a rolling window that a service can leave on and take on demand;
    /// older slices are overwritten ([`Trace::dropped`](crate::Trace::dropped) counts them).
    /// Default 1,048,576 (a worker's ring costs 32 bytes a slice, touched as it fills).
    pub fn trace_window(mut self, slices: usize) -> Self {
        self.trace.1 = slices.max(1);
        self
    }

    /// Whether to export through the `metrics` facade (default on; with no recorder installed the
    /// export costs next to nothing). [`Pool::stats`] works either way.
    pub fn metrics(mut self, on: bool) -> Self {
        self.metrics = on;
        self
    }

    /// Admission control: at most `limit` graphs in flight (submitted and not finished). At the
    /// limit, [`Pool::submit`] blocks its thread until a graph finishes, [`Pool::try_submit`]
    /// fails with [`ErrorKind::WouldBlock`], and [`Pool::submit_async`] waits without blocking.
    /// A submission from a node of this pool (a nested graph) is admitted at once, over the
    /// limit if need be: its parent holds a slot and may be waiting for it. No limit by default;
    /// a limit of 0 is an [`ErrorKind::InvalidConfig`] error at build.
    pub fn max_graphs_in_flight(mut self, limit: usize) -> Self {
        self.max_graphs_in_flight = Some(limit);
        self
    }

    /// How long a thread off the pool that waits for a graph ([`GraphHandle::wait`](crate::GraphHandle::wait))
    /// watches for its end, yielding its core, before it parks. Default zero: it parks at once,
    /// and its wake-up costs a futex wake and a thread switch (microseconds to tens of
    /// microseconds on an idle machine). A client that waits for graphs of about that length
    /// (a served request of a replayed model) and wants the lowest latency sets a few tens of
    /// microseconds; the cost is that much CPU per wait.
    ///
    /// Spinning waiters never crowd the machine's cores: a waiter of a graph of
    /// [`Priority::High`](crate::Priority::High) may always spin, and while one does, waiters of
    /// other levels park; those spin only within [`spinning_waiters`](Self::spinning_waiters).
    pub fn wait_spin(mut self, spin: Duration) -> Self {
        self.wait_spin = spin;
        self
    }

    /// At most `n` waiters of graphs of the normal and low levels spin at once (within
    /// [`wait_spin`](Self::wait_spin)); the others park at once. Default: the cores this
    /// process may use, less the pool's workers, less one, so that spinning clients never take
    /// the cores a worker or a latency-critical waiter needs (a spinning waiter queued behind
    /// another thread's core is one that sees its graph's end late).
    pub fn spinning_waiters(mut self, n: usize) -> Self {
        self.spinning_waiters = Some(n);
        self
    }

    /// How long a worker that ran out of work watches the queues before it parks (default
    /// 20 µs). Work that comes within it starts without a wake-up; an idle pool parks after
    /// it. A server that wants its first node started at once after a pause between requests
    /// longer than that sets more, and pays that much CPU per worker per pause; past the first
    /// 20 µs the worker yields its core between looks, so a thread queued on it runs at once.
    pub fn idle_spin(mut self, spin: Duration) -> Self {
        self.idle_spin = spin;
        self
    }

    /// How long a worker may watch past [`idle_spin`](Self::idle_spin) when work has been
    /// coming back to it at a steady pace (zero: never). Such a worker watches for one and a
    /// half of its recent pauses between running dry and finding work (at most `max`), so
    /// requests that arrive a few hundred microseconds apart find it awake instead of each
    /// paying a wake-up, which on a virtual machine is sometimes hundreds of microseconds. One
    /// worker of each group at a time, so the pool spends at most a core per group on it, and
    /// none once its pauses grow past `max`; past the first 20 µs it yields between looks, as
    /// the idle spin does.
    ///
    /// Default: 1 ms where the pool's workers leave at least two of the process's cores to
    /// other threads (a server whose clients have cores of their own: there it took a
    /// latency-critical client's slowest requests from hundreds of microseconds of waiting for
    /// a worker to tens), zero otherwise (a pool with a worker on every core: the watching
    /// worker would take the core a client needs; on a 2-core machine it made a chain
    /// submitted every millisecond twice as slow).
    pub fn paced_spin(mut self, max: Duration) -> Self {
        self.paced_spin = Some(max);
        self
    }

    /// Runs on each worker, after it pinned itself and before it takes any node; its result is
    /// that worker's state, which its nodes see through [`NodeCtx::worker_state`](crate::NodeCtx::worker_state).
    /// An error (or panic) fails [`build`](Self::build), naming the worker.
    ///
    /// Replaces the state type, so set the stop, idle and spin hooks after this one.
    pub fn start_hook<T: Send + 'static>(
        self,
        f: impl Fn(&WorkerInfo) -> Result<T, BoxError> + Send + Sync + 'static,
    ) -> PoolBuilder<T> {
        PoolBuilder {
            name: self.name,
            workers: self.workers,
            cores: self.cores,
            groups: self.groups,
            domains: self.domains,
            thread_name: self.thread_name,
            start: Arc::new(f),
            stop: None,
            idle: None,
            spin: None,
            rayon: self.rayon,
            cpu_lane_threads: self.cpu_lane_threads,
            stack_size: self.stack_size,
            trace: self.trace,
            metrics: self.metrics,
            max_graphs_in_flight: self.max_graphs_in_flight,
            wait_spin: self.wait_spin,
            idle_spin: self.idle_spin,
            paced_spin: self.paced_spin,
            spinning_waiters: self.spinning_waiters,
        }
    }

    /// Runs on each worker as it exits, with its state (so resources bound to the worker's
    /// thread are released there). A panic in it aborts the process with a message naming the
    /// worker (see the crate README, "Failure").
    pub fn stop_hook(mut self, f: impl Fn(&WorkerInfo, S) + Send + Sync + 'static) -> Self {
        self.stop = Some(Arc::new(f));
        self
    }

    /// The host-work lane: CPU-heavy nodes ([`GraphBuilder::cpu_node`](crate::GraphBuilder::cpu_node))
    /// run on this rayon pool instead of a pinned worker.
    pub fn rayon_pool(mut self, pool: Arc<rayon_core::ThreadPool>) -> Self {
        self.rayon = Some(pool);
        self
    }

    /// Creates a host-work lane of `threads` rayon threads at build (unless
    /// [`rayon_pool`](Self::rayon_pool) gives one). Without a lane, CPU-heavy nodes run on workers.
    pub fn cpu_lane_threads(mut self, threads: usize) -> Self {
        self.cpu_lane_threads = Some(threads);
        self
    }

    /// Starts the workers.
    ///
    /// Errors: zero workers in a group, an empty core list or a core outside the process's
    /// affinity mask ([`ErrorKind::InvalidConfig`]), a failing start hook ([`ErrorKind::StartHook`];
    /// the workers already started are stopped and joined), or a thread the OS would not create.
    pub fn build(self) -> Result<Pool<S>, Error> {
        if self.max_graphs_in_flight == Some(0) {
            return Err(Error::new(
                ErrorKind::InvalidConfig,
                format!(
                    "pool '{}': max_graphs_in_flight is 0 (no graph could ever run)",
                    crate::error::bounded(&self.name)
                ),
            ));
        }
        let specs = match self.groups {
            Some(g) => g,
            None => vec![GroupSpec {
                name: "host".into(),
                workers: self.workers.unwrap_or_else(default_workers),
                cores: self.cores,
            }],
        };
        let infos = plan_workers(&self.name, &specs, self.thread_name.as_deref())?;
        let spinning_waiters = self
            .spinning_waiters
            .unwrap_or_else(|| crate::spin::default_budget(default_workers(), infos.len()));
        let paced_spin = self
            .paced_spin
            .unwrap_or_else(|| crate::worker::default_paced_spin(default_workers(), infos.len()));
        let cpu_lane = cpu_lane(&self.name, self.rayon, self.cpu_lane_threads)?;
        let hooks = Hooks {
            start: self.start,
            stop: self.stop,
            idle: self.idle,
            spin: self.spin,
        };
        let group_names: Vec<String> = specs.iter().map(|g| g.name.clone()).collect();
        let domains = check_domains(&self.name, &group_names, self.domains)?;
        let (registry, deques) = Registry::new(
            self.name.clone(),
            infos,
            Topology {
                groups: group_names,
                domains,
            },
            hooks,
            cpu_lane,
            Settings {
                trace: self.trace.0.then_some(self.trace.1),
                export_metrics: self.metrics,
                max_graphs_in_flight: self.max_graphs_in_flight,
                wait_spin: self.wait_spin,
                idle_spin: self.idle_spin,
                paced_spin,
                spinning_waiters,
            },
        );
        let threads = start_workers(&registry, deques, self.stack_size)?;
        registry
            .export()
            .pool_started(&registry.infos, registry.cpu_lane.is_some());
        Ok(Pool {
            registry,
            threads: Mutex::new(threads),
            reserved_cores: Mutex::new(Vec::new()),
        })
    }
}

/// The cpu lane: the user's rayon pool, or a new one of `threads` threads, or none.
fn cpu_lane(
    pool: &str,
    rayon: Option<Arc<rayon_core::ThreadPool>>,
    threads: Option<usize>,
) -> Result<Option<Arc<rayon_core::ThreadPool>>, Error> {
    Ok(match (rayon, threads) {
        (Some(p), _) => Some(p),
        (None, Some(0)) => {
            return Err(Error::new(
                ErrorKind::InvalidConfig,
                format!("pool '{pool}': cpu_lane_threads must be at least 1"),
            ))
        }
        (None, Some(n)) => Some(Arc::new(
            rayon_core::ThreadPoolBuilder::new()
                .num_threads(n)
                .thread_name({
                    let name = pool.to_string();
                    move |i| format!("{name}-cpu-{i}")
                })
                .build()
                .map_err(|e| {
                    Error::new(
                        ErrorKind::Spawn,
                        format!("pool '{pool}': cannot start the cpu lane"),
                    )
                    .with_source(Box::new(e))
                })?,
        )),
        (None, None) => None,
    })
}

/// Spawns a thread per worker and waits until each has run its start hook. On a failure (a
/// hook's, or a thread the OS would not create) the started workers are told to stop (they
/// run their stop hooks) and joined, and the first error is returned.
fn start_workers<S: Send + 'static>(
    registry: &Arc<Registry<S>>,
    deques: Vec<WorkerDeques<Task<S>>>,
    stack_size: Option<usize>,
) -> Result<Vec<JoinHandle<()>>, Error> {
    let gate = Arc::new(worker::StartGate::new(registry.infos.len()));
    let mut threads: Vec<JoinHandle<()>> = Vec::with_capacity(deques.len());
    let mut spawn_error = None;
    for (index, deque) in deques.into_iter().enumerate() {
        let info = &registry.infos[index];
        let mut tb = std::thread::Builder::new().name(info.name.clone());
        if let Some(sz) = stack_size {
            tb = tb.stack_size(sz);
        }
        let reg = registry.clone();
        let g = gate.clone();
        match tb.spawn(move || worker::main(reg, index, deque, g)) {
            Ok(h) => threads.push(h),
            Err(e) => {
                spawn_error = Some(
                    Error::new(
                        ErrorKind::Spawn,
                        format!(
                            "pool '{}': cannot start worker {}",
                            registry.name, info.name
                        ),
                    )
                    .with_source(Box::new(e)),
                );
                break;
            }
        }
    }
    let started = threads.len();
    let failure = gate.wait_reports(started).or(spawn_error);
    if let Some(err) = failure {
        gate.release(false);
        for t in threads {
            let _ = t.join();
        }
        return Err(err);
    }
    gate.release(true);
    Ok(threads)
}

/// Checks the domains against the groups; returns them as (name, group indices).
fn check_domains(
    pool: &str,
    groups: &[String],
    domains: Vec<(String, Vec<GroupId>)>,
) -> Result<Vec<(String, Vec<usize>)>, Error> {
    let invalid = |m: String| {
        Error::new(
            ErrorKind::InvalidConfig,
            format!("pool '{}': {m}", bounded(pool)),
        )
    };
    let mut out: Vec<(String, Vec<usize>)> = Vec::with_capacity(domains.len());
    for (name, members) in domains {
        let shown = bounded(&name);
        if out.iter().any(|(n, _)| *n == name) {
            return Err(invalid(format!("two domains are named '{shown}'")));
        }
        if members.is_empty() {
            return Err(invalid(format!("domain '{shown}' has no groups")));
        }
        let mut idx = Vec::with_capacity(members.len());
        for g in members {
            if g.index() >= groups.len() {
                return Err(invalid(format!(
                    "domain '{shown}' names group {}, but the pool has {} group(s)",
                    g.index(),
                    groups.len()
                )));
            }
            if idx.contains(&g.index()) {
                return Err(invalid(format!(
                    "domain '{shown}' names group '{}' twice",
                    bounded(&groups[g.index()])
                )));
            }
            idx.push(g.index());
        }
        out.push((name, idx));
    }
    Ok(out)
}

/// Resolves cores and names for every worker, checking the settings.
fn plan_workers(
    pool: &str,
    specs: &[GroupSpec],
    name_fn: Option<&(dyn Fn(&WorkerInfo) -> String + Send + Sync)>,
) -> Result<Vec<WorkerInfo>, Error> {
    let invalid = |m: String| {
        Error::new(
            ErrorKind::InvalidConfig,
            format!("pool '{}': {m}", bounded(pool)),
        )
    };
    if specs.is_empty() {
        return Err(invalid("no worker groups".into()));
    }
    let allowed = affinity::allowed_cores();
    let mut infos = Vec::new();
    for (gi, spec) in specs.iter().enumerate() {
        if spec.workers == 0 {
            return Err(invalid(format!(
                "group '{}' has 0 workers; a pool needs at least one worker per group",
                bounded(&spec.name)
            )));
        }
        let cores: Vec<Option<usize>> = match &spec.cores {
            Cores::Unpinned => vec![None],
            Cores::All => match &allowed {
                Some(a) if !a.is_empty() => a.iter().map(|&c| Some(c)).collect(),
                _ => vec![None],
            },
            Cores::List(list) => {
                if list.is_empty() {
                    return Err(invalid(format!(
                        "group '{}' was given an empty core list",
                        bounded(&spec.name)
                    )));
                }
                let a = allowed.as_ref().ok_or_else(|| {
                    invalid(format!(
                        "group '{}' asks for cores [{}], but this platform cannot pin threads",
                        bounded(&spec.name),
                        bounded_list(list, list.len(), ", ")
                    ))
                })?;
                for &c in list {
                    if !a.contains(&c) {
                        return Err(invalid(format!(
                            "group '{}' asks for core {c}, which does not exist or is outside \
                             this process's affinity mask (allowed: {} core(s): {})",
                            bounded(&spec.name),
                            a.len(),
                            bounded_list(a, a.len(), ", ")
                        )));
                    }
                }
                list.iter().map(|&c| Some(c)).collect()
            }
        };
        // With `All`, groups continue where the previous group stopped, spreading the pool.
        let start = if spec.cores == Cores::All {
            infos.len()
        } else {
            0
        };
        for j in 0..spec.workers {
            let index = infos.len();
            let mut info = WorkerInfo {
                index,
                group: GroupId(gi as u32),
                group_name: spec.name.clone(),
                index_in_group: j,
                core: cores[(start + j) % cores.len()],
                name: String::new(),
            };
            info.name = match name_fn {
                Some(f) => f(&info),
                None => format!("{pool}-{}-{j}", spec.name),
            };
            infos.push(info);
        }
    }
    Ok(infos)
}

/// A bounded pool of pinned worker threads that runs task graphs.
///
/// The OS threads are created by [`PoolBuilder::build`] and their number never changes.
/// Share a pool between threads with `Arc<Pool<S>>` or scoped threads; every method takes `&self`.
///
/// Dropping the pool finishes every submitted graph, then stops and joins the workers (their stop
/// hooks run). [`shutdown`](Self::shutdown) does the same explicitly and can cancel instead.
pub struct Pool<S: Send + 'static = ()> {
    pub(crate) registry: Arc<Registry<S>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// The cores [`reserve_core`](Self::reserve_core) kept, in the order it kept them.
    reserved_cores: Mutex<Vec<usize>>,
}

impl<S: Send + 'static> fmt::Debug for Pool<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pool")
            .field("name", &self.registry.name)
            .field("workers", &self.registry.infos.len())
            .finish()
    }
}

impl<S: Send + 'static> Pool<S> {
    /// Starts running `graph`. Validation that needs the pool (placements on groups it does
    /// not have) happens here, before any node runs.
    ///
    /// With a limit of graphs in flight ([`PoolBuilder::max_graphs_in_flight`]) it first
    /// blocks until the pool is under it (not on a worker of this pool: see there).
    ///
    /// Errors: [`ErrorKind::ShutDown`] after [`shutdown`](Self::shutdown),
    /// [`ErrorKind::UnknownGroup`] for a node placed on a group this pool lacks.
    ///
    /// # Examples
    ///
    /// One graph submitted from several threads at once; each submission is a run of its own.
    ///
    /// ```
    /// use boundpool_scheduler::{GraphBuilder, PoolBuilder};
    ///
    /// let pool = PoolBuilder::new().workers(2).build()?;
    /// let mut g = GraphBuilder::new("square");
    /// let x = g.node("x", |_| Ok(12u64));
    /// let sq = g.node("square", move |ctx| Ok(ctx.input(x)? * ctx.input(x)?));
    /// g.edge(x, sq);
    /// let graph = g.build()?;
    /// std::thread::scope(|s| {
    ///     for _ in 0..4 {
    ///         s.spawn(|| {
    ///             let out = pool.submit(&graph).unwrap().wait().unwrap();
    ///             assert_eq!(out.get(sq), Some(&144));
    ///         });
    ///     }
    /// });
    /// # Ok::<(), boundpool_scheduler::Error>(())
    /// ```
    pub fn submit(&self, graph: &Graph<S>) -> Result<GraphHandle, Error> {
        self.registry.submit(graph)
    }

    /// [`submit`](Self::submit) that never waits for admission: at the pool's limit of graphs
    /// in flight it fails with [`ErrorKind::WouldBlock`] (and counts a rejection).
    pub fn try_submit(&self, graph: &Graph<S>) -> Result<GraphHandle, Error> {
        self.registry.submit_with(graph, false)
    }

    /// [`submit`](Self::submit) for async code: the future waits for admission without
    /// blocking its thread (it needs no particular runtime), then starts the graph and yields its
    /// handle. Dropping the future before it is ready withdraws the submission and leaves
    /// nothing behind. Errors are `submit`'s.
    pub fn submit_async<'a>(&'a self, graph: &'a Graph<S>) -> SubmitFuture<'a, S> {
        SubmitFuture::new(&self.registry, graph)
    }

    /// Submits `graph` and waits for it.
    pub fn run(&self, graph: &Graph<S>) -> Result<GraphOutput, Error> {
        self.submit(graph)?.wait()
    }

    /// The pool's name.
    pub fn name(&self) -> &str {
        &self.registry.name
    }

    /// Every worker, in index order, with its group and core.
    pub fn workers(&self) -> &[WorkerInfo] {
        &self.registry.infos
    }

    /// The cores the calling thread may run on that none of this pool's workers is pinned to
    /// and none is reserved for one thread ([`reserve_core`](Self::reserve_core)); every core
    /// it may run on, where the workers are unpinned.
    pub fn free_cores(&self) -> Vec<usize> {
        affinity::free_cores(
            &affinity::allowed_cores().unwrap_or_default(),
            &self.taken_cores(&sync::lock(&self.reserved_cores)),
        )
    }

    /// Keeps the calling thread off the cores this pool's workers are pinned to (and off those
    /// [`reserve_core`](Self::reserve_core) kept), and returns the cores it may now run on
    /// ([`free_cores`](Self::free_cores)). Threads it starts afterwards inherit the set, so a
    /// server calls it on its main thread before starting its request threads: a worker then
    /// never waits behind a request thread for its core, which is where a latency-critical
    /// graph's tail comes from once the host has more runnable threads than cores. Nothing
    /// changes where the workers are unpinned.
    ///
    /// An [`ErrorKind::Placement`] error where every core the thread may run on has a worker
    /// (it would have none left), or where the OS refuses (`source()`); on platforms other
    /// than Linux with pinned workers, always.
    ///
    /// ```
    /// use boundpool_scheduler::{Cores, GroupSpec, PoolBuilder};
    ///
    /// let cores = std::thread::available_parallelism()?.get();
    /// let pool = PoolBuilder::new().workers(1).build()?;
    /// if cores > 1 && cfg!(target_os = "linux") {
    ///     let free = pool.keep_off_workers()?;
    ///     let worker_core = pool.workers()[0].core;
    ///     assert!(worker_core.is_none() || !free.contains(&worker_core.unwrap()));
    ///     // Request threads started here run on `free` only.
    ///     std::thread::spawn(move || { /* submit and wait */ }).join().unwrap();
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn keep_off_workers(&self) -> Result<Vec<usize>, Error> {
        let allowed = affinity::allowed_cores().unwrap_or_default();
        if self.worker_cores().is_empty() {
            return Ok(allowed);
        }
        let taken = self.taken_cores(&sync::lock(&self.reserved_cores));
        let free = affinity::free_cores(&allowed, &taken);
        let name = bounded(&self.registry.name);
        if free.is_empty() {
            return Err(Error::new(
                ErrorKind::Placement,
                format!(
                    "pool '{name}': no core is free of its workers (the thread may run on [{}], the workers are pinned to or cores reserved at [{}])",
                    bounded_list(&allowed, allowed.len(), ", "),
                    bounded_list(&taken, taken.len(), ", ")
                ),
            ));
        }
        affinity::pin_current_thread(&free)?;
        Ok(free)
    }

    /// Reserves one of [`free_cores`](Self::free_cores) (the last) for one latency-critical
    /// thread, which then pins itself there with
    /// [`pin_current_thread`](crate::pin_current_thread), and returns it. Later
    /// [`free_cores`](Self::free_cores) and [`keep_off_workers`](Self::keep_off_workers)
    /// leave it out, so the other request threads, placed after, never share it (threads
    /// placed before the reservation may still run there).
    ///
    /// An [`ErrorKind::Placement`] error where the workers are unpinned (a worker may run on
    /// any core, so none is one thread's own), or where fewer than two cores are free (the
    /// other threads would have none).
    ///
    /// ```
    /// use boundpool_scheduler::{pin_current_thread, PoolBuilder};
    ///
    /// let pool = PoolBuilder::new().workers(1).build()?;
    /// match pool.reserve_core() {
    ///     Ok(core) => {
    ///         assert!(!pool.free_cores().contains(&core));
    ///         std::thread::spawn(move || {
    ///             pin_current_thread(&[core]).unwrap();
    ///             // submit the latency-critical graphs and wait here
    ///         })
    ///         .join()
    ///         .unwrap();
    ///         // then `pool.keep_off_workers()` and start the other request threads
    ///     }
    ///     Err(e) => println!("no core of its own here: {e}"),
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reserve_core(&self) -> Result<usize, Error> {
        let name = bounded(&self.registry.name);
        if self.worker_cores().is_empty() {
            return Err(Error::new(
                ErrorKind::Placement,
                format!(
                    "pool '{name}': its workers are unpinned, so no core can be one thread's own"
                ),
            ));
        }
        // Held while choosing, so that two reservations at once never leave the rest none.
        let mut reserved = sync::lock(&self.reserved_cores);
        let free = affinity::free_cores(
            &affinity::allowed_cores().unwrap_or_default(),
            &self.taken_cores(&reserved),
        );
        match free.as_slice() {
            [.., _, last] => {
                reserved.push(*last);
                Ok(*last)
            }
            _ => Err(Error::new(
                ErrorKind::Placement,
                format!(
                    "pool '{name}': reserving a core needs two free of its workers and of reserved cores, and [{}] {} free",
                    bounded_list(&free, free.len(), ", "),
                    if free.len() == 1 { "is" } else { "are" }
                ),
            )),
        }
    }

    /// The cores the workers are pinned to, each once.
    fn worker_cores(&self) -> Vec<usize> {
        let mut cores: Vec<usize> = self.registry.infos.iter().filter_map(|w| w.core).collect();
        cores.sort_unstable();
        cores.dedup();
        cores
    }

    /// The cores the workers are pinned to and those `reserved`, each once.
    fn taken_cores(&self, reserved: &[usize]) -> Vec<usize> {
        let mut cores = self.worker_cores();
        cores.extend_from_slice(reserved);
        cores.sort_unstable();
        cores.dedup();
        cores
    }

    /// The group named `name`.
    pub fn group(&self, name: &str) -> Option<GroupId> {
        self.registry
            .groups
            .iter()
            .position(|g| &*g.name == name)
            .map(|i| GroupId(i as u32))
    }

    /// Number of worker groups.
    pub fn group_count(&self) -> usize {
        self.registry.groups.len()
    }

    /// The domain named `name`.
    pub fn domain(&self, name: &str) -> Option<DomainId> {
        self.registry
            .domains
            .iter()
            .position(|d| &*d.name == name)
            .map(|i| DomainId(i as u32))
    }

    /// Number of domains.
    pub fn domain_count(&self) -> usize {
        self.registry.domains.len()
    }

    /// The groups of `domain` (empty for a domain this pool does not have).
    pub fn domain_groups(&self, domain: DomainId) -> Vec<GroupId> {
        self.registry
            .domains
            .get(domain.index())
            .map_or_else(Vec::new, |d| {
                d.groups.iter().map(|&g| GroupId(g as u32)).collect()
            })
    }

    /// Drains the timeline recorded since the last take (empty unless built with
    /// [`PoolBuilder::trace`]). Every node of a graph whose handle returned is in it, unless
    /// the window overflowed since the last take ([`Trace::dropped`](crate::Trace::dropped)).
    pub fn take_trace(&self) -> Trace {
        self.read_trace(true)
    }

    /// The timeline recorded since the last take, left in place for the next take or
    /// snapshot (what a `/trace` endpoint serves).
    pub fn snapshot_trace(&self) -> Trace {
        self.read_trace(false)
    }

    fn read_trace(&self, drain: bool) -> Trace {
        match &self.registry.trace {
            Some(t) => t.read(drain),
            None => Trace {
                epoch: std::time::Instant::now(),
                tracks: Vec::new(),
                slices: Vec::new(),
                dropped: 0,
            },
        }
    }

    /// Whether this pool records a timeline.
    pub fn is_tracing(&self) -> bool {
        self.registry.trace.is_some()
    }

    /// Graphs submitted to this pool that have not finished yet (the pool's table of active
    /// runs). A finished graph leaves the table before its handle's `wait` returns, whether or
    /// not anyone waits, so an idle pool reads 0.
    pub fn graphs_in_flight(&self) -> usize {
        self.registry.active_runs()
    }

    /// The scheduler's counters, read live (no metrics recorder needed).
    pub fn stats(&self) -> PoolStats {
        self.registry.stats()
    }

    /// Stops taking graphs, finishes or cancels the running ones (see [`ShutdownMode`]), stops
    /// the workers and joins them. Later [`submit`](Self::submit)s fail with
    /// [`ErrorKind::ShutDown`]. Idempotent. Called from inside a node, it does not wait: the
    /// workers stop once the running graphs are done.
    pub fn shutdown(&self, mode: ShutdownMode) {
        let on_worker = self.registry.on_worker_thread();
        self.registry.begin_shutdown(mode);
        if on_worker {
            return;
        }
        self.registry.wait_terminated();
        let threads = std::mem::take(&mut *sync::lock(&self.threads));
        for t in threads {
            let _ = t.join();
        }
    }
}

impl<S: Send + 'static> Drop for Pool<S> {
    fn drop(&mut self) {
        self.shutdown(ShutdownMode::Finish);
    }
}
