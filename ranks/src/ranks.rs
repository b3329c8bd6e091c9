//! The per-rank runtime: a pool of workers plus one communication thread, submission of rank
//! graphs, and their runs' handles and outputs.

use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Once};
use std::time::{Duration, Instant};

use boundpool_scheduler::backend::PoolBuilderExt;
use boundpool_scheduler::{Cores, GraphHandle, GraphOutput, GroupId, Pool, PoolBuilder};

use crate::comm::run::RunState;
use crate::comm::stamps::EdgeStamps;
use crate::comm::{self, CommHandle, CommThread, Command, EngineConfig, ProgressSlot, Waiting};
use crate::error::{Error, ErrorKind};
use crate::graph::{Mapped, NodeRef, RankGraph, SlotEnv};
use crate::launch::LaunchInfo;
use crate::placement::{Placement, SPIN_WITH_SPARE_CORES};
use crate::transport::{LocalNetwork, Transport};

/// Settings of a rank's runtime: its pool and its communication thread.
#[derive(Clone, Debug)]
pub struct RanksBuilder {
    name: String,
    workers: usize,
    cores: Cores,
    trace: bool,
    peer_timeout: Duration,
    heartbeat: Duration,
    max_message: usize,
    comm_spin: Option<Duration>,
    idle_spin: Option<Duration>,
    stamps: bool,
    send_window: usize,
    worker_sends: bool,
    worker_polls: bool,
    posted_receives: bool,
    hosts: Option<Vec<usize>>,
    relay_per_host: bool,
}

impl Default for RanksBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl RanksBuilder {
    /// Defaults: 2 workers on the cores the process may use (shared out among the ranks of
    /// the node, see [`cores`](Self::cores)), peers declared dead after 5 s of silence
    /// (heartbeats every 0.5 s), values of 1 GiB or more sent in 1 GiB chunks; the
    /// communication thread and idle workers spin where every thread has a core of its own
    /// (see [`comm_spin`](Self::comm_spin)).
    pub fn new() -> Self {
        RanksBuilder {
            name: "ranks".into(),
            workers: 2,
            cores: Cores::All,
            trace: false,
            peer_timeout: Duration::from_secs(5),
            heartbeat: Duration::from_millis(500),
            max_message: 4 << 20,
            comm_spin: None,
            idle_spin: None,
            stamps: false,
            send_window: 16,
            worker_sends: true,
            worker_polls: true,
            posted_receives: true,
            hosts: None,
            relay_per_host: true,
        }
    }

    /// The pool's name (threads, metrics).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// The number of worker threads (the pool's OS threads are these plus the communication
    /// thread).
    pub fn workers(mut self, n: usize) -> Self {
        self.workers = n;
        self
    }

    /// The workers' cores. With [`Cores::All`] (the default) the ranks of one node share out
    /// the cores this process may use by their local rank (as the launcher says): with a core
    /// for every worker and communication thread of every local rank, rank `r` of `n` takes
    /// the `r`-th of `n` equal shares, its workers on its first cores and its communication
    /// thread on the next; with fewer, the local ranks' workers are dealt round-robin over the
    /// cores and the communication thread is not pinned. A launcher that binds each process
    /// to cores of its own (`mpirun --bind-to core`, `srun --cpu-bind`) leaves each one its
    /// own set, which it uses alone. Other values pin the workers as given and leave the
    /// communication thread unpinned. [`Ranks::placement`] tells what was chosen.
    pub fn cores(mut self, cores: Cores) -> Self {
        self.cores = cores;
        self
    }

    /// How long the communication thread, with work in flight and nothing to do, spins
    /// (polls the transport again at once) before it yields, then parks. A spin answers an
    /// arrival without a system call and costs nothing more than a yield where the thread has
    /// a core of its own; where threads share cores it takes the core from the thread it
    /// waits for. Default: 100 µs where every worker and communication thread of the node's
    /// ranks has a core (see [`cores`](Self::cores)), otherwise none.
    pub fn comm_spin(mut self, spin: Duration) -> Self {
        self.comm_spin = Some(spin);
        self
    }

    /// How long a worker that ran dry watches the queues before it parks
    /// ([`PoolBuilder::idle_spin`]): a received value's completion then reaches it without a
    /// wake-up. Default: 100 µs where every thread has a core (as [`comm_spin`](Self::comm_spin)),
    /// otherwise none: a worker spinning on a core it shares with its rank's communication
    /// thread keeps that thread from the arrival it waits for.
    pub fn idle_spin(mut self, spin: Duration) -> Self {
        self.idle_spin = Some(spin);
        self
    }

    /// Where this rank's threads go and how they wait (see [`cores`](Self::cores)).
    fn placement(&self, launch: &LaunchInfo) -> Placement {
        let allowed: Vec<usize> = core_affinity::get_core_ids()
            .map(|v| v.into_iter().map(|c| c.id).collect())
            .unwrap_or_default();
        // A process the launcher bound to fewer cores than the machine has is alone on them.
        let shared_mask = crate::placement::cpus_online().is_none_or(|n| allowed.len() >= n);
        let local = match (launch.local_rank, launch.local_size) {
            (Some(r), Some(n)) if shared_mask && n > 1 => Some((r, n)),
            _ => None,
        };
        let (auto_workers, auto_comm, spare) =
            crate::placement::plan(&allowed, local, self.workers);
        let (workers, comm) = match &self.cores {
            Cores::All => (auto_workers, auto_comm),
            Cores::Unpinned => (vec![None; self.workers], None),
            Cores::List(l) if !l.is_empty() => (
                (0..self.workers).map(|j| Some(l[j % l.len()])).collect(),
                None,
            ),
            Cores::List(_) => (auto_workers, None),
        };
        let spin = if spare {
            SPIN_WITH_SPARE_CORES
        } else {
            Duration::ZERO
        };
        Placement {
            workers,
            comm,
            local,
            cores: allowed.len(),
            spare_cores: spare,
            comm_spin: self.comm_spin.unwrap_or(spin),
            idle_spin: Some(self.idle_spin.unwrap_or(spin)),
        }
    }

    /// Records the pool's timeline ([`Ranks::pool`]'s `take_trace`).
    pub fn trace(mut self, on: bool) -> Self {
        self.trace = on;
        self
    }

    /// How long a peer may be silent before it is declared dead (at least twice the
    /// heartbeat). Runs that need it then end with [`ErrorKind::PeerDied`].
    pub fn peer_timeout(mut self, d: Duration) -> Self {
        self.peer_timeout = d;
        self
    }

    /// How often this rank tells its peers it is alive.
    pub fn heartbeat(mut self, d: Duration) -> Self {
        self.heartbeat = d;
        self
    }

    /// Values of this many bytes or more go as a header and chunks of at most this size
    /// (at most `i32::MAX`: MPI counts are `int`s). 4 MiB by default: Open MPI moves one long
    /// message posted without blocking far slower than several of a few MiB (figures in
    /// docs/benchmarks.md, "Ranks over MPI").
    pub fn max_message_bytes(mut self, n: usize) -> Self {
        self.max_message = n.clamp(1, i32::MAX as usize);
        self
    }

    /// At most this many sends (values, each one message or a header and its chunks) in
    /// flight from this rank; more wait, the most urgent first (each transfer's
    /// [`priority`](crate::plan::Transfer::priority): the longest path after its consumers),
    /// then in the order they came. 16 by default; at least 1.
    pub fn send_window(mut self, n: usize) -> Self {
        self.send_window = n.max(1);
        self
    }

    /// Whether a worker posts a small value's send itself (at most 4 KiB, where the transport
    /// allows calls from several threads: MPI at `MPI_THREAD_MULTIPLE`, the in-process
    /// network), rather than handing it to the communication thread (on by default: the
    /// hand-off is a thread's wait on the edge's path).
    pub fn worker_sends(mut self, on: bool) -> Self {
        self.worker_sends = on;
        self
    }

    /// Whether a worker with nothing to run looks at the network itself while it spins before
    /// parking ([`idle_spin`](Self::idle_spin)), where the transport allows calls from any
    /// thread (MPI at `MPI_THREAD_SERIALIZED` or more, the in-process network): an arrival
    /// then completes its receive node on that worker and the consumer runs there, without
    /// the communication thread's hand-off and a wake-up (on by default). The workers take
    /// the communication thread's engine under a lock they only try, so none ever waits for
    /// it; the thread keeps commands, timers, and the network whenever no worker spins. Only
    /// for runtimes whose pool `RanksBuilder` builds (a pool made elsewhere has no such hook).
    pub fn worker_polls(mut self, on: bool) -> Self {
        self.worker_polls = on;
        self
    }

    /// Whether small values (at most 4 KiB with a 16-byte trailer) travel on the transport's
    /// posted lane, where it has one (MPI: a second communicator with a ring of receives posted
    /// ahead; the in-process network), rather than being probed and received as the rest (on
    /// by default: a message that finds its receive posted is in its landing when seen, as a
    /// blocking `MPI_Recv`'s is, without `MPI_Improbe` and `MPI_Imrecv` on the edge's path).
    pub fn posted_receives(mut self, on: bool) -> Self {
        self.posted_receives = on;
        self
    }

    /// Each rank's host (`hosts[r]` for rank `r`, any numbering), instead of what the
    /// transport found at start-up (MPI: the ranks' processor names, gathered; the in-process
    /// network: one host). For tests, and for launchers whose host names do not say which
    /// ranks share memory. Every rank must give the same map (the first submission of each
    /// graph checks it); its length must be the number of ranks (an error at build).
    pub fn hosts(mut self, hosts: Vec<usize>) -> Self {
        self.hosts = Some(hosts);
        self
    }

    /// One copy a host (on by default): a value read on several ranks of another host is sent
    /// once to that host's first consuming rank, which forwards the bytes as they arrived to
    /// the others of its host (over its shared memory), rather than once to each. Only host
    /// values (plain and serde) are relayed; device values stay direct. Ranks on one host
    /// change nothing. In simulation (`boundpool sim --broadcast hosts`, docs/benchmarks.md)
    /// this ran a distributed Cholesky 1.4–1.9× faster over Ethernet and never more than 1%
    /// slower elsewhere. Every rank must agree (checked at each graph's first submission).
    pub fn relay_per_host(mut self, on: bool) -> Self {
        self.relay_per_host = on;
        self
    }

    /// Stamps every hop of every run's cross-rank edges on this rank (off by default; see
    /// [`RankOutput::edge_stamps`]): a few clock reads per edge, to find where its time goes.
    pub fn stamp_edges(mut self, on: bool) -> Self {
        self.stamps = on;
        self
    }

    fn engine_config(&self) -> Result<EngineConfig, Error> {
        if self.peer_timeout < self.heartbeat * 2 {
            return Err(Error::new(
                ErrorKind::InvalidConfig,
                format!(
                    "the peer timeout ({:?}) must be at least twice the heartbeat ({:?})",
                    self.peer_timeout, self.heartbeat
                ),
            ));
        }
        Ok(EngineConfig {
            peer_timeout: self.peer_timeout,
            heartbeat: self.heartbeat,
            max_message: self.max_message,
            stamps: self.stamps,
            send_window: self.send_window,
            worker_sends: self.worker_sends,
            worker_polls: self.worker_polls,
            posted_receives: self.posted_receives,
        })
    }

    /// Builds rank `rank` of an in-process network (ranks as threads of one process).
    pub fn build_local(self, net: &LocalNetwork, rank: usize) -> Result<Ranks, Error> {
        let t = net.endpoint(rank);
        self.build_with(move || Ok(t))
    }

    /// Builds this process's rank over MPI (it must be started by `mpirun`, `mpiexec` or
    /// `srun`; a lone process is a world of one). MPI is initialized on the communication
    /// thread, which alone uses it.
    #[cfg(feature = "mpi")]
    pub fn build_mpi(self) -> Result<Ranks, Error> {
        self.build_with(crate::transport::MpiTransport::init)
    }

    /// Builds the runtime on the transport `make` returns, called on the communication thread.
    pub fn build_with<T, F>(self, make: F) -> Result<Ranks, Error>
    where
        T: Transport + 'static,
        F: FnOnce() -> Result<T, Error> + Send + 'static,
    {
        let cfg = self.engine_config()?;
        let launch = LaunchInfo::from_env();
        let placement = self.placement(&launch);
        let cores = match (&self.cores, placement.workers.iter().all(Option::is_some)) {
            (Cores::All, true) => {
                Cores::List(placement.workers.iter().flatten().copied().collect())
            }
            (other, _) => other.clone(),
        };
        // Spinning workers look at the network once the communication thread shares its
        // engine (`RanksBuilder::worker_polls`).
        let progress = ProgressSlot::default();
        let look = progress.clone();
        let mut pool = PoolBuilder::new()
            .name(self.name.clone())
            .workers(self.workers)
            .cores(cores)
            .trace(self.trace)
            .spin_hook(move |_, _| look.get().is_some_and(|p| p.progress()));
        if let Some(spin) = placement.idle_spin {
            pool = pool.idle_spin(spin);
        }
        if !placement.spare_cores {
            // As the idle spin: a worker watching at its pace would take the core its rank's
            // communication thread (or another rank's thread) needs.
            pool = pool.paced_spin(Duration::ZERO);
        }
        let pool = pool.build()?;
        let hosts = HostSettings::of(&self);
        let at = Setup {
            group: None,
            name: &self.name,
            cfg,
            placement,
            hosts,
            progress,
        };
        Ranks::from_pool(pool, at, make)
    }
}

static PANIC_HOOK: Once = Once::new();
static LAST_PANIC: Mutex<Option<String>> = Mutex::new(None);

/// Keeps the last panic's message, for the note a dying rank sends its peers.
fn install_panic_note() {
    PANIC_HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let note = format!(
                "{} (thread '{}')",
                info,
                std::thread::current().name().unwrap_or("unnamed")
            );
            *LAST_PANIC.lock().unwrap_or_else(|p| p.into_inner()) = Some(note);
            previous(info)
        }));
    });
}

/// One rank's runtime: a pool of workers, one communication thread, and the rank's place in
/// the world. Submit [`RankGraph`]s built with [`RankGraphBuilder::build`](crate::RankGraphBuilder::build).
///
/// Dropping it waits for this rank's runs in flight, tells the peers it leaves, and ends the
/// transport (MPI is finalized there). After a peer died it does not wait: the pool is leaked
/// (its threads park until the process exits) and MPI is not finalized, since either could
/// wait for ever on the dead rank.
pub struct Ranks<S: Send + 'static = ()> {
    pool: ManuallyDrop<Pool<S>>,
    comm: CommThread,
    group: Option<GroupId>,
    launch: LaunchInfo,
    placement: Placement,
    poisoned: Arc<AtomicBool>,
    /// Each rank's host.
    hosts: Vec<usize>,
    /// Graphs relay one copy a host (`RanksBuilder::relay_per_host`, several hosts).
    relay: bool,
}

/// How `Ranks::from_pool` sets a runtime up over its pool.
struct Setup<'a> {
    group: Option<GroupId>,
    name: &'a str,
    cfg: EngineConfig,
    placement: Placement,
    hosts: HostSettings,
    /// Where the pool's spin hook, if it has one, finds the engine.
    progress: ProgressSlot,
}

/// What `RanksBuilder` says about hosts, for `Ranks::from_pool`.
struct HostSettings {
    hosts: Option<Vec<usize>>,
    relay: bool,
}

impl HostSettings {
    fn of(b: &RanksBuilder) -> Self {
        HostSettings {
            hosts: b.hosts.clone(),
            relay: b.relay_per_host,
        }
    }
}

impl<S: Send + 'static> std::fmt::Debug for Ranks<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ranks")
            .field("rank", &self.comm.rank)
            .field("size", &self.comm.size)
            .field("launch", &self.launch)
            .finish()
    }
}

impl<S: Send + 'static> Ranks<S> {
    /// A runtime over an existing pool (a GPU pool, for example): its compute nodes are placed
    /// on `group` (`None`: anywhere), and the communication thread runs `make`'s transport.
    /// The pool's threads plus the communication thread are the rank's OS threads.
    pub fn from_pool_with<T, F>(
        pool: Pool<S>,
        group: Option<GroupId>,
        settings: &RanksBuilder,
        make: F,
    ) -> Result<Self, Error>
    where
        T: Transport + 'static,
        F: FnOnce() -> Result<T, Error> + Send + 'static,
    {
        let cfg = settings.engine_config()?;
        // The pool's workers are where its builder put them; the communication thread is
        // not pinned, and spins only if told to.
        let placement = Placement {
            workers: pool.workers().iter().map(|w| w.core).collect(),
            comm: None,
            local: None,
            cores: core_affinity::get_core_ids().map_or(0, |v| v.len()),
            spare_cores: false,
            comm_spin: settings.comm_spin.unwrap_or(Duration::ZERO),
            idle_spin: None,
        };
        let at = Setup {
            group,
            name: &settings.name,
            cfg,
            placement,
            hosts: HostSettings::of(settings),
            // No spin hook on a pool made elsewhere: nothing reads the slot.
            progress: ProgressSlot::default(),
        };
        Self::from_pool(pool, at, make)
    }

    fn from_pool<T, F>(pool: Pool<S>, at: Setup<'_>, make: F) -> Result<Self, Error>
    where
        T: Transport + 'static,
        F: FnOnce() -> Result<T, Error> + Send + 'static,
    {
        install_panic_note();
        let poisoned = Arc::new(AtomicBool::new(false));
        let Setup {
            group,
            name,
            cfg,
            placement,
            hosts: host_settings,
            progress,
        } = at;
        let waiting = Waiting {
            spin: placement.comm_spin,
            core: placement.comm,
        };
        let comm = comm::spawn(
            format!("{name}-comm"),
            make,
            cfg,
            poisoned.clone(),
            waiting,
            progress,
        )?;
        let bad_hosts = host_settings
            .hosts
            .as_ref()
            .filter(|h| h.len() != comm.size)
            .map(|h| h.len());
        let hosts = host_settings.hosts.unwrap_or_else(|| comm.hosts.clone());
        let relay = host_settings.relay && hosts.iter().any(|&h| h != hosts[0]);
        let ranks = Ranks {
            pool: ManuallyDrop::new(pool),
            comm,
            group,
            launch: LaunchInfo::from_env(),
            placement,
            poisoned,
            hosts,
            relay,
        };
        if let Some(len) = bad_hosts {
            return Err(Error::new(
                ErrorKind::InvalidConfig,
                format!(
                    "RanksBuilder::hosts gives {len} hosts, but there are {} ranks",
                    ranks.size()
                ),
            ));
        }
        Ok(ranks)
    }

    /// Each rank's host (by rank): what the transport found at start-up, or
    /// [`RanksBuilder::hosts`].
    pub fn hosts(&self) -> &[usize] {
        &self.hosts
    }

    /// Whether values read on several ranks of another host go there once and are forwarded
    /// ([`RanksBuilder::relay_per_host`], and the ranks span more than one host).
    pub fn relays_per_host(&self) -> bool {
        self.relay
    }

    /// The host map graphs relay on (`None`: they do not).
    pub(crate) fn relay_hosts(&self) -> Option<&[usize]> {
        self.relay.then_some(&self.hosts[..])
    }

    /// How many of this rank's sends wait for room in its window of sends in flight
    /// ([`RanksBuilder::send_window`]), as its communication thread last counted them.
    pub fn sends_waiting(&self) -> usize {
        self.comm.handle.sends_waiting()
    }

    /// Where this rank's threads run and how they wait when idle.
    pub fn placement(&self) -> &Placement {
        &self.placement
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.comm.rank
    }

    /// The number of ranks.
    pub fn size(&self) -> usize {
        self.comm.size
    }

    /// This process's position among the ranks of its node, as the launcher said
    /// (`OMPI_COMM_WORLD_LOCAL_RANK`, `MPI_LOCALRANKID`, `SLURM_LOCALID`).
    pub fn local_rank(&self) -> Option<usize> {
        self.launch.local_rank
    }

    /// What the launcher said about this process.
    pub fn launch_info(&self) -> &LaunchInfo {
        &self.launch
    }

    /// The pool the rank's nodes run on.
    pub fn pool(&self) -> &Pool<S> {
        &self.pool
    }

    /// The group compute nodes are placed on (`None`: anywhere).
    pub fn compute_group(&self) -> Option<GroupId> {
        self.group
    }

    pub(crate) fn comm(&self) -> CommHandle {
        self.comm.handle.clone()
    }

    /// Whether a peer died (or the transport failed): no run starts any more.
    pub fn is_poisoned(&self) -> bool {
        self.poisoned.load(Ordering::Acquire)
    }

    /// Starts a run of `graph` on this rank. The n-th submission of a graph on each rank
    /// makes one run together; a graph's first submission checks that every rank built the
    /// same graph. At most the graph's `runs_in_flight` runs are in flight here: a submission
    /// beyond waits for the oldest to end.
    pub fn submit(&self, graph: &RankGraph<S>) -> Result<RunHandle, Error> {
        let g = &graph.inner;
        g.register()?;
        let seq = g.next_seq.fetch_add(1, Ordering::Relaxed);
        g.comm_graph.take_slot(seq);
        let run = Arc::new(RunState::new(g.comm_graph.clone(), seq));
        let slot = match g.slot(run.slot) {
            Ok(s) => s,
            Err(e) => {
                self.comm.handle.send(Command::StartRun(run.clone()));
                self.comm.handle.send(Command::LocalDone(run));
                return Err(e);
            }
        };
        slot.env.set_current(run.clone());
        self.comm.handle.send(Command::StartRun(run.clone()));
        let handle = match self.pool.submit(&slot.graph) {
            Ok(h) => h,
            Err(e) => {
                self.comm.handle.send(Command::LocalDone(run));
                return Err(e.into());
            }
        };
        let comm = self.comm.handle.clone();
        let (done, env) = (run.clone(), slot.env.clone());
        handle.on_done(move || {
            env.clear_current();
            comm.send(Command::LocalDone(done))
        });
        Ok(RunHandle {
            handle: Some(handle),
            local: None,
            run,
            env: slot.env.clone(),
        })
    }

    /// Submits and waits.
    pub fn run(&self, graph: &RankGraph<S>) -> Result<RankOutput, Error> {
        self.submit(graph)?.wait()
    }
}

impl<S: Send + 'static> Drop for Ranks<S> {
    fn drop(&mut self) {
        let died = std::thread::panicking().then(|| {
            LAST_PANIC
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone()
                .unwrap_or_else(|| "panicked outside a node".into())
        });
        // Let this rank's runs finish (they may need the comm thread), unless a peer died:
        // then a run may never end, and the pool is leaked rather than waited for.
        let mut leak = false;
        while self.pool.graphs_in_flight() > 0 {
            if self.poisoned.load(Ordering::Acquire) || died.is_some() {
                leak = true;
                break;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        if !leak && !self.poisoned.load(Ordering::Acquire) {
            // SAFETY: the pool is taken once, here in `drop`, and not used after.
            let pool = unsafe { ManuallyDrop::take(&mut self.pool) };
            drop(pool);
        }
        self.comm.handle.send(Command::Shutdown { died });
        if let Some(j) = self
            .comm
            .join
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            let _ = j.join();
        }
    }
}

/// A run in flight on this rank: [`wait`](Self::wait) for its outputs here and its result
/// across ranks.
pub struct RunHandle {
    handle: Option<GraphHandle>,
    local: Option<Result<GraphOutput, boundpool_scheduler::Error>>,
    run: Arc<RunState>,
    env: Arc<SlotEnv>,
}

impl std::fmt::Debug for RunHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunHandle")
            .field("graph", &self.run.graph.name)
            .field("seq", &self.run.seq)
            .finish()
    }
}

impl RunHandle {
    /// The run's number among its graph's runs (the same on every rank).
    pub fn seq(&self) -> u64 {
        self.run.seq
    }

    /// Waits for the run on this rank and for every other rank's word on it. A node that failed
    /// on any rank makes every rank's `wait` return that failure, naming its rank and node (the
    /// lowest such rank's, when several failed). A dead peer ends the wait within the peer
    /// timeout, naming the rank.
    pub fn wait(self) -> Result<RankOutput, Error> {
        match self.wait_until(None) {
            Ok(r) => r,
            Err(_) => unreachable!("a wait without a deadline returns only when done"),
        }
    }

    /// As [`wait`](Self::wait), at most `timeout`: `Err` gives the handle back if the run
    /// is still going (here, or on another rank).
    #[allow(clippy::result_large_err)]
    pub fn wait_timeout(self, timeout: Duration) -> Result<Result<RankOutput, Error>, RunHandle> {
        self.wait_until(Instant::now().checked_add(timeout))
    }

    #[allow(clippy::result_large_err)]
    fn wait_until(
        mut self,
        deadline: Option<Instant>,
    ) -> Result<Result<RankOutput, Error>, RunHandle> {
        // The local run, in steps, so that a dead peer (whose runs may never end here) is seen.
        while self.local.is_none() {
            if let Some(e) = self.run.fatal() {
                return Ok(Err(e));
            }
            let h = self.handle.take().expect("a handle until the local result");
            let step = match deadline {
                Some(d) => STEP.min(d.saturating_duration_since(Instant::now())),
                None => STEP,
            };
            match h.wait_timeout(step) {
                Ok(r) => self.local = Some(r),
                Err(h) => {
                    self.handle = Some(h);
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        return Err(self);
                    }
                }
            }
        }
        let Some(global) = self.run.wait_global(deadline) else {
            return Err(self);
        };
        let local = self.local.take().expect("checked above");
        Ok(match (global, local) {
            (Err(e), _) => Err(e),
            (Ok(()), Ok(out)) => Ok(RankOutput {
                out,
                run: self.run,
                env: self.env,
            }),
            (Ok(()), Err(e)) => Err(e.into()),
        })
    }
}

/// How often a waiter looks for a dead peer while the local run goes on.
const STEP: Duration = Duration::from_millis(20);

/// A finished run's outputs on this rank: of the nodes that ran here, and of the values
/// received here.
pub struct RankOutput {
    out: GraphOutput,
    run: Arc<RunState>,
    env: Arc<SlotEnv>,
}

impl std::fmt::Debug for RankOutput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RankOutput")
            .field("graph", &self.run.graph.name)
            .field("seq", &self.run.seq)
            .finish()
    }
}

impl RankOutput {
    /// The output of `node`, if it ran on this rank or its value was received here.
    pub fn get<T: 'static>(&self, node: NodeRef<T>) -> Option<&T> {
        match self.env.map.get()?.get(node.index() as usize)? {
            Mapped::Local(r) => self
                .out
                .get(*r.downcast_ref::<boundpool_scheduler::NodeRef<T>>()?),
            Mapped::Remote(_) => {
                let k = self
                    .run
                    .graph
                    .recvs
                    .iter()
                    .position(|r| r.producer == node.index())?;
                self.run.recvs[k].get()?.downcast_ref::<T>()
            }
            Mapped::Absent => None,
        }
    }

    /// Takes the output of `node`, if it ran on this rank.
    pub fn take<T: 'static>(&mut self, node: NodeRef<T>) -> Option<T> {
        match self.env.map.get()?.get(node.index() as usize)? {
            Mapped::Local(r) => self
                .out
                .take(*r.downcast_ref::<boundpool_scheduler::NodeRef<T>>()?),
            _ => None,
        }
    }

    /// The run's number among its graph's runs.
    pub fn seq(&self) -> u64 {
        self.run.seq
    }

    /// Where the run's sends and receives on this rank spent their time, hop by hop
    /// (`None` unless the runtime was built with
    /// [`RanksBuilder::stamp_edges`]). A send's completion may be seen after the run's end
    /// (its `done` is then 0 here).
    pub fn edge_stamps(&self) -> Option<EdgeStamps> {
        self.run.edge_stamps()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::LocalNetwork;
    use crate::RankGraphBuilder;

    #[test]
    fn a_received_value_lands_in_the_memory_of_the_one_before() {
        // Two ranks in lockstep: once rank 1 dropped run n's outputs, run n + 1's value
        // lands in their memory (every run after the first; and not while one is kept).
        let net = LocalNetwork::new(2);
        let ranks: Vec<Ranks> = (0..2)
            .map(|r| {
                RanksBuilder::new()
                    .workers(1)
                    .cores(Cores::Unpinned)
                    .build_local(&net, r)
                    .unwrap()
            })
            .collect();
        let step = std::sync::Barrier::new(2);
        let recycled = std::thread::scope(|s| {
            let hs: Vec<_> = ranks
                .iter()
                .map(|r| {
                    let step = &step;
                    s.spawn(move || {
                        let mut g = RankGraphBuilder::new("recycle");
                        let a = g.plain_node(0, "make", |_| Ok(vec![1u32; 4096]));
                        let b = g.plain_node(1, "read", move |ctx| Ok(ctx.input(a)?.len()));
                        g.edge(a, b);
                        let graph = g.build(r).unwrap();
                        let (mut counts, mut kept) = (Vec::new(), None);
                        for run in 1..=5 {
                            let out = r.run(&graph).unwrap();
                            counts.push(graph.recycled_landings());
                            match run {
                                3 => kept = Some(out),
                                4 => drop((out, kept.take())),
                                _ => drop(out),
                            }
                            step.wait();
                        }
                        counts
                    })
                })
                .collect();
            hs.into_iter()
                .map(|h| h.join().unwrap())
                .collect::<Vec<_>>()
        });
        assert!(
            recycled[0].iter().all(|&n| n == 0),
            "rank 0 receives nothing"
        );
        // Runs 2 and 3 recycle; run 4 does not (run 3's output was kept past its start);
        // run 5 does.
        assert_eq!(recycled[1], vec![0, 1, 2, 2, 3]);
    }
}
