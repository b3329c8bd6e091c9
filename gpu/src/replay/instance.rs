//! What an instance of a replay graph holds between runs: each segment's executable slot and
//! capture generation, its captured outputs, the current run's feeds; and what the graph's
//! instances share (the current generation, the executables' count, [`ReplayStats`]).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use crate::capture::Kept;
use crate::device::ExecSlot;

use super::desc::{Desc, Feeds, Outputs};
use super::probe::LaunchProbe;

pub(super) struct SegState {
    pub(super) slot: Arc<ExecSlot>,
    /// The generation captured (None: never, or the last capture failed).
    pub(super) generation: Option<u64>,
    /// What the last capture keeps as long as the executable (staging and hoisted buffers,
    /// values read from outside the segment).
    pub(super) kept: Kept,
}

pub(super) struct InstanceState {
    pub(super) desc: Arc<Desc>,
    pub(super) shared: Arc<Shared>,
    pub(super) outputs: Outputs,
    /// The input values of the run holding the instance (shared with its `Instance`).
    pub(super) feeds: Arc<Feeds>,
    pub(super) segs: Vec<Mutex<SegState>>,
}

#[derive(Default)]
pub(super) struct Shared {
    pub(super) generation: AtomicU64,
    /// One more than the generation whose capture failed (0: none failed): replayed runs of
    /// that generation run eagerly instead, until `update` moves the generation on.
    failed: AtomicU64,
    /// Why that capture failed (the error's message).
    failure: Mutex<Option<String>>,
    pub(super) execs: Arc<AtomicUsize>,
    pub(super) stats: Mutex<ReplayStats>,
    /// The launch probe, made when first turned on (`Replayable::probe_launches`).
    pub(super) probe: OnceLock<LaunchProbe>,
}

impl Shared {
    /// A capture of `generation` failed with `why`: the graph runs eagerly until the next
    /// generation.
    pub(super) fn capture_failed(&self, generation: u64, why: &str) {
        let mut failure = self.failure.lock().unwrap_or_else(|e| e.into_inner());
        // A late report of an older generation (a capture begun before an update) changes
        // nothing.
        if self.failed.load(Ordering::Acquire) <= generation + 1 {
            *failure = Some(why.to_owned());
            self.failed.store(generation + 1, Ordering::Release);
        }
        drop(failure);
        self.stats
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .failed_captures += 1;
    }

    /// Whether the current generation's capture failed (then runs go eager): two loads.
    pub(super) fn capture_failed_now(&self) -> bool {
        self.failed.load(Ordering::Acquire) == self.generation.load(Ordering::Acquire) + 1
    }

    /// Why the current generation's capture failed, if it did.
    pub(super) fn current_failure(&self) -> Option<String> {
        self.failure_of(self.generation.load(Ordering::Acquire))
    }

    /// The launch probe, if it is on.
    pub(super) fn probe_on(&self) -> Option<&LaunchProbe> {
        self.probe.get().filter(|p| p.is_on())
    }

    /// Why `generation`'s capture failed, if it did.
    pub(super) fn failure_of(&self, generation: u64) -> Option<String> {
        if self.failed.load(Ordering::Acquire) != generation + 1 {
            return None;
        }
        self.failure
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// What captures have cost so far (totals over every segment and instance).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ReplayStats {
    /// Segment captures that succeeded (first captures and updates).
    pub captures: u64,
    /// Captures that failed (each fails its run; later runs go eager until
    /// [`Replayable::update`](super::Replayable::update)).
    pub failed_captures: u64,
    /// Runs asked to replay that ran eagerly instead, because the capture of the graph's
    /// current generation had failed.
    pub eager_fallbacks: u64,
    /// Time in captures: bodies called under capture, capture begin/end.
    pub capture_time: Duration,
    /// Executables instantiated (first captures, and updates the driver refused).
    pub instantiations: u64,
    /// Time instantiating.
    pub instantiate_time: Duration,
    /// Executables updated in place (`cuGraphExecUpdate`).
    pub updates: u64,
    /// Updates the driver refused (topology changed): re-instantiated instead.
    pub update_fallbacks: u64,
    /// Time in `cuGraphExecUpdate` (successful or not).
    pub update_time: Duration,
    /// CUDA graph nodes captured, summed over captures.
    pub captured_nodes: u64,
    /// CUDA graph edges captured, summed over captures (an independent segment has none: the
    /// capture keeps the DAG's parallelism).
    pub captured_edges: u64,
    /// Captures during which the driver refused an empty dependency set, so that an empty
    /// node stood in for it (removed before instantiation).
    pub stand_in_roots: u64,
}
