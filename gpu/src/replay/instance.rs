//! What an instance of a replay graph holds between runs: each segment's executable slot and
//! capture generation, its captured outputs, the current run's feeds; and what the graph's
//! instances share (the current generation, the executables' count, [`ReplayStats`]).

use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::buffer::DeviceBuffer;
use crate::device::ExecSlot;

use super::desc::{Desc, Feeds, Outputs};

pub(super) struct SegState {
    pub(super) slot: Arc<ExecSlot>,
    /// The generation captured (None: never, or the last capture failed).
    pub(super) generation: Option<u64>,
    /// Staging buffers of captured host copies.
    pub(super) _staged: Vec<DeviceBuffer<u8>>,
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
    pub(super) execs: Arc<AtomicUsize>,
    pub(super) stats: Mutex<ReplayStats>,
}

/// What captures have cost so far (totals over every segment and instance).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ReplayStats {
    /// Segment captures that succeeded (first captures and updates).
    pub captures: u64,
    /// Captures that failed.
    pub failed_captures: u64,
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
