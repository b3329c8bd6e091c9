//! A built replay graph: [`Replayable`] runs it replayed or eagerly, each run on an
//! *instance* (`graph.rs`) that the run takes from the graph's lease (`run.rs`).

use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::error::GpuResult;
use crate::pool::GpuPool;

use super::desc::{Desc, RNode};
use super::graph::Mode;
use super::instance::{ReplayStats, Shared};
use super::probe::LaunchRecord;
use super::run::{Lease, ReplayHandle, ReplayOutput, RunInputs};

/// A graph whose GPU work is captured once per instance and replayed (see the `replay` module
/// docs).
///
/// # Captures beside other threads
///
/// A capture (an instance's first run, or its first after [`update`](Self::update)) holds
/// its device's capture gate, one per device for the whole process (every pool's), from
/// `cuStreamBeginCapture` to `cuStreamEndCapture`. It waits for calls of other threads that
/// synchronise the device, and they wait for it: a pool's workers starting or stopping (their
/// library handles, the device's teardown), a pinned buffer's free (deferred while a capture
/// is under way), [`GpuCtx::outside_captures`](crate::GpuCtx::outside_captures). Captures
/// of one device take turns. Replayed launches and eager runs take no lock.
///
/// What boundpool guarantees: no call of its own breaks another thread's capture, in this pool
/// or another one of the process. What user code must not do while another thread may capture
/// on the device: a call that synchronises the device or its context outside
/// `outside_captures` (cudarc's `CudaBlas`, `CudaBlasLT` or `CudaRng` made or dropped, a
/// `CudaRng`'s first draw, which sets its state up, `load_module` and a module's unload, `CudaContext::synchronize`, a synchronous free, a
/// library doing one of these inside). The driver invalidates the capture (it fails naming the
/// graph and the node it was at, and the graph runs eagerly until `update`) and the call
/// itself may fail; thread-local capture mode does not protect against it. A captured body
/// must not wait for another graph's run (its capture holds the gate).
pub struct Replayable {
    pub(super) desc: Arc<Desc>,
    pub(super) shared: Arc<Shared>,
    pub(super) lease: Arc<Lease>,
}

impl fmt::Debug for Replayable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Replayable")
            .field("name", &self.desc.name)
            .field("nodes", &self.desc.names.len())
            .field("segments", &self.desc.segments.len())
            .field("instances", &self.instances())
            .finish()
    }
}

impl Replayable {
    pub(super) fn new(desc: Arc<Desc>, shared: Arc<Shared>, max_instances: usize) -> Self {
        Self {
            desc,
            shared,
            lease: Arc::new(Lease::new(max_instances)),
        }
    }

    /// The graph's name.
    pub fn name(&self) -> &str {
        &self.desc.name
    }

    /// Number of segments (CUDA graphs per instance).
    pub fn segments(&self) -> usize {
        self.desc.segments.len()
    }

    /// The segment of captured node `r` (None for host, input and eager nodes).
    pub fn segment_of<T>(&self, r: RNode<T>) -> Option<usize> {
        self.desc
            .seg_of
            .get(r.idx as usize)
            .copied()
            .flatten()
            .map(|s| s as usize)
    }

    /// Replayed instances made so far (at most
    /// [`ReplayBuilder::instances`](super::ReplayBuilder::instances)).
    pub fn instances(&self) -> usize {
        self.lease.made()
    }

    /// Executables this graph holds now (at most one per segment and instance; none for a
    /// segment whose capture recorded no work).
    pub fn executables(&self) -> usize {
        self.shared.execs.load(Ordering::Relaxed)
    }

    /// Capture, instantiation and update costs so far.
    pub fn stats(&self) -> ReplayStats {
        *self.shared.stats.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A diagnostic of where a replayed run's time goes around its launches (for benches
    /// chasing a latency tail): while on, each launch of a segment's executable is timed
    /// ([`LaunchRecord`]: the host time inside `cuGraphLaunch`, when the device ran the
    /// launched work, read from two timing events recorded around the launch on its stream,
    /// and when the node's worker saw it done), at the cost of those two event records per
    /// launch; off (the default), a launch pays one load. Turning it on discards launches not
    /// read yet and calibrates a fresh reference between the device's clock and the host's at
    /// the next launch (a few round trips to the device, on that launch's stream: meant for a
    /// graph run by one client at a time, whose stream is then idle). A launch is read at a
    /// later probed launch, once its work is done and its worker saw it: the last one stays
    /// unread. Only the device of the first probed launch is probed. Records over longer than
    /// a few seconds drift by the device clock's few microseconds a second from the host's:
    /// turn the probe on afresh for each measurement.
    pub fn probe_launches(&self, on: bool) {
        if on || self.shared.probe.get().is_some() {
            self.shared.probe.get_or_init(Default::default).set(on);
        }
    }

    /// The launches the probe ([`probe_launches`](Self::probe_launches)) has read so far,
    /// oldest first; each is returned once.
    pub fn take_launch_records(&self) -> Vec<LaunchRecord> {
        self.shared
            .probe
            .get()
            .map(|p| p.take_records())
            .unwrap_or_default()
    }

    /// Marks every instance's capture stale: the next run of each instance calls the GPU
    /// bodies again under capture and updates its executables in place (`cuGraphExecUpdate`;
    /// re-instantiated only where the driver refuses, the topology having changed). Outputs
    /// are then the values the bodies return at that capture. After a failed capture this is
    /// what asks for another one: until then, runs go eager.
    pub fn update(&self) {
        self.shared.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// Submits a replayed run with `inputs` (a value for each input node) and returns at once.
    /// The run takes a free instance, or makes one (captured at this first run), or, when
    /// [`ReplayBuilder::instances`](super::ReplayBuilder::instances) are all busy, waits for
    /// one in submission order: the handle's [`wait`](ReplayHandle::wait) or `.await` waits.
    /// An instance is held from the start of its run's graph to its end, never longer. Its
    /// graph is submitted as [`GpuPool::submit`] does (waiting for admission there when the
    /// pool limits graphs in flight). A run missing an input, or naming a node that is not one
    /// of this graph's input nodes, is refused here.
    pub fn submit<'p>(
        &'p self,
        pool: &'p GpuPool,
        inputs: RunInputs,
    ) -> GpuResult<ReplayHandle<'p>> {
        ReplayHandle::submit(
            &self.desc,
            &self.shared,
            &self.lease,
            pool,
            inputs,
            self.replay_mode(),
        )
    }

    /// How a run asked to replay runs: eagerly while the current generation's capture has
    /// failed (until [`update`](Self::update)), replayed otherwise.
    fn replay_mode(&self) -> Mode {
        if self.shared.capture_failed_now() {
            self.shared
                .stats
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .eager_fallbacks += 1;
            Mode::Eager
        } else {
            Mode::Replay
        }
    }

    /// Why this graph's runs go eager: the message of the error its capture failed with
    /// (naming the graph, the node and why), until [`update`](Self::update) asks for a new
    /// capture; `None` while it replays (or has not captured yet).
    pub fn capture_failure(&self) -> Option<String> {
        self.shared.current_failure()
    }

    /// [`submit`](Self::submit) of an eager run: every body is called, no capture, on an
    /// eager instance of its own (made when none is free; eager runs never wait for one).
    pub fn submit_eager<'p>(
        &'p self,
        pool: &'p GpuPool,
        inputs: RunInputs,
    ) -> GpuResult<ReplayHandle<'p>> {
        ReplayHandle::submit(
            &self.desc,
            &self.shared,
            &self.lease,
            pool,
            inputs,
            Mode::Eager,
        )
    }

    /// A replayed run with `inputs`, waited for: captures at the instance's first run (and
    /// after [`update`](Self::update)), replays otherwise. A failed capture fails the run with
    /// [`GpuErrorKind::Capture`](crate::GpuErrorKind::Capture), naming the graph, the node and
    /// why; the graph's later runs then run eagerly (every body called, as
    /// [`run_eager`](Self::run_eager)) until [`update`](Self::update) asks for a new capture:
    /// one capture attempt per generation, not one per run
    /// ([`capture_failure`](Self::capture_failure) says why, [`ReplayStats::eager_fallbacks`]
    /// counts those runs).
    pub fn run_with(&self, pool: &GpuPool, inputs: RunInputs) -> GpuResult<ReplayOutput> {
        self.submit(pool, inputs)?.wait()
    }

    /// [`run_with`](Self::run_with) for a graph without input nodes.
    pub fn run(&self, pool: &GpuPool) -> GpuResult<ReplayOutput> {
        self.run_with(pool, RunInputs::new())
    }

    /// An eager run with `inputs`, waited for (every body called, as an ordinary graph).
    pub fn run_eager_with(&self, pool: &GpuPool, inputs: RunInputs) -> GpuResult<ReplayOutput> {
        self.submit_eager(pool, inputs)?.wait()
    }

    /// [`run_eager_with`](Self::run_eager_with) for a graph without input nodes.
    pub fn run_eager(&self, pool: &GpuPool) -> GpuResult<ReplayOutput> {
        self.run_eager_with(pool, RunInputs::new())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::{ReplayBuilder, ReplayCtx};

    fn host_graph() -> Replayable {
        let mut b = ReplayBuilder::new("host");
        let a = b.host_node("a", |_c: &ReplayCtx<'_, '_>| Ok(1u32));
        let _ = a;
        b.build().expect("a host graph builds")
    }

    #[test]
    fn a_failed_capture_sends_runs_eager_until_update() {
        let r = host_graph();
        assert_eq!(r.replay_mode(), Mode::Replay, "nothing failed yet");
        assert_eq!(r.capture_failure(), None);
        r.shared
            .capture_failed(0, "replay capture of graph 'host' failed at node 'a': why");
        assert_eq!(r.stats().failed_captures, 1);
        for i in 1..=3 {
            assert_eq!(r.replay_mode(), Mode::Eager, "run {i} after the failure");
            assert_eq!(r.stats().eager_fallbacks, i);
        }
        assert!(r
            .capture_failure()
            .is_some_and(|m| m.contains("node 'a': why")));
        assert_eq!(
            r.shared.failure_of(0).as_deref(),
            r.capture_failure().as_deref()
        );
        // `update` asks for a new capture: runs replay again (and capture at their next run).
        r.update();
        assert_eq!(r.capture_failure(), None);
        assert_eq!(r.shared.failure_of(1), None);
        assert_eq!(r.replay_mode(), Mode::Replay);
        assert_eq!(
            r.stats().eager_fallbacks,
            3,
            "no fallback counted after the update"
        );
        // A failure of the new generation goes eager again; one of an old generation does not
        // (a late report of a capture begun before the update).
        r.shared.capture_failed(0, "late");
        assert_eq!(r.replay_mode(), Mode::Replay, "an old generation's failure");
        r.shared.capture_failed(1, "again");
        assert_eq!(r.replay_mode(), Mode::Eager);
        assert_eq!(r.capture_failure().as_deref(), Some("again"));
        r.shared.capture_failed(0, "later still");
        assert_eq!(r.replay_mode(), Mode::Eager, "an old report clears nothing");
        assert_eq!(r.capture_failure().as_deref(), Some("again"));
        assert_eq!(r.stats().failed_captures, 4);
    }
}
