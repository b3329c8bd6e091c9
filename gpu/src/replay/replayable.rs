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
use super::run::{Lease, ReplayHandle, ReplayOutput, RunInputs};

/// A graph whose GPU work is captured once per instance and replayed (see the `replay` module
/// docs).
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

    /// Marks every instance's capture stale: the next run of each instance calls the GPU
    /// bodies again under capture and updates its executables in place (`cuGraphExecUpdate`;
    /// re-instantiated only where the driver refuses, the topology having changed). Outputs
    /// are then the values the bodies return at that capture.
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
            Mode::Replay,
        )
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
    /// [`GpuErrorKind::Capture`](crate::GpuErrorKind::Capture) (the segment is captured again at the next run);
    /// [`run_eager`](Self::run_eager) still works.
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
