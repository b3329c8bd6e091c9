//! Optional timeline recording: one track per worker with a slice per node and per park, plus
//! extra tracks (GPU streams) added through `backend::PoolExt::record_span`.
//!
//! Off by default; when off, a worker pays one predictable branch per node. When on, each worker
//! writes its slices into a ring of its own ([`WorkerRing`]): a compact record per slice (start
//! and end in clock ticks, the graph's plan, the node's index, the kind), written with plain
//! stores and published by one store of the ring's head. No lock and no write that another
//! worker makes: recording stays cheap enough to leave on, and the ring keeps the last
//! `window` slices of each worker (a rolling window). Names are resolved when the trace is
//! read: the ring holds the plans its records point to in a table that the worker touches only
//! when it moves to another graph.
//!
//! Reading is a seqlock over the ring: the reader copies the records between its last take and
//! the head, then re-reads the head and drops the records the worker may have overwritten
//! meanwhile (modelled in `loom_models::trace_ring_*`).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use crate::config::WorkerInfo;
use crate::sync::{self, fence, AtomicU64, Mutex, Ordering};

/// Slices a worker's ring keeps unless [`PoolBuilder::trace_window`](crate::PoolBuilder::trace_window)
/// says otherwise (32 bytes each, touched only as they are written). Smaller under Miri, whose
/// shadow state of a zeroed allocation is not untouched pages: 32 MiB a worker took 24 GiB.
pub(crate) const DEFAULT_WINDOW: usize = if cfg!(miri) { 1 << 12 } else { 1 << 20 };

/// What a slice stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SliceKind {
    /// A node body ran; `stolen` when the worker took it from another worker's deque.
    Node {
        /// Taken from another worker's deque.
        stolen: bool,
    },
    /// The worker was parked for lack of work.
    Park,
    /// A span recorded with [`PoolExt::record_span`](crate::backend::PoolExt::record_span) (e.g. GPU time).
    Span,
}

/// A row of the timeline.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceTrack {
    /// Display name, e.g. `worker 0 (core 3, host)`.
    pub name: String,
    /// The worker, for worker tracks.
    pub worker: Option<usize>,
    /// The worker's core, if pinned.
    pub core: Option<usize>,
    /// The worker's group (empty for extra tracks).
    pub group: String,
}

/// One interval on a track.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceSlice {
    /// Index into [`Trace::tracks`].
    pub track: usize,
    /// Node name (or park / span name).
    pub name: String,
    /// Graph name (empty for parks).
    pub graph: String,
    /// The node's index in its graph, for node slices and spans that stand for a node.
    pub node: Option<u32>,
    /// Start, in nanoseconds since [`Trace::epoch`].
    pub start_ns: u64,
    /// End, in nanoseconds since [`Trace::epoch`].
    pub end_ns: u64,
    /// What it is.
    pub kind: SliceKind,
}

/// A recorded timeline, from [`Pool::take_trace`](crate::Pool::take_trace) or
/// [`Pool::snapshot_trace`](crate::Pool::snapshot_trace).
#[derive(Clone, Debug)]
pub struct Trace {
    /// The instant all times are measured from (the pool's build).
    pub epoch: Instant,
    /// Worker tracks in worker order, then extra tracks.
    pub tracks: Vec<TraceTrack>,
    /// Slices: each worker's in the order it recorded them (worker by worker), then the extra
    /// tracks' spans.
    pub slices: Vec<TraceSlice>,
    /// Slices recorded since the previous take that the window no longer held (each worker's
    /// ring and each extra track keep the last
    /// [`trace_window`](crate::PoolBuilder::trace_window) slices): 0 unless the window overflowed.
    pub dropped: u64,
}

/// The names of a graph, read when a trace is taken (a plan without its state type).
pub(crate) trait PlanNames: Send + Sync {
    fn graph_name(&self) -> &Arc<str>;
    fn node_name(&self, node: u32) -> &str;
}

/// Plan address -> the plan, for the records of one read.
type Plans = HashMap<u64, Arc<dyn PlanNames>>;

/// The low word of a record's `word` field: the node's index; the high word: the kind.
const KIND_NODE: u64 = 0;
const KIND_STOLEN: u64 = 1;
const KIND_PARK: u64 = 2;

/// One slice as a worker writes it (`repr(C)`: all-zero bits are a valid slot). Atomics so that a reader may copy a record while its
/// worker overwrites it (the copy is then dropped); the worker's stores are plain stores.
#[repr(C)]
struct Slot {
    start: AtomicU64,
    end: AtomicU64,
    /// The plan's address (a key of [`PlanTable::plans`]); 0 for a park.
    plan: AtomicU64,
    /// `node | kind << 32`.
    word: AtomicU64,
}

/// `n` slots at zero. Outside loom they come from zeroed memory: the allocator hands out
/// untouched pages, so the slots of a large window cost nothing until the worker reaches them.
#[cfg(not(loom))]
fn zeroed_slots(n: usize) -> Box<[Slot]> {
    assert!(n > 0);
    let layout = std::alloc::Layout::array::<Slot>(n).expect("trace window size");
    // SAFETY: `layout` has a non-zero size (n > 0 and a `Slot` is 32 bytes).
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) } as *mut Slot;
    if ptr.is_null() {
        std::alloc::handle_alloc_error(layout);
    }
    // SAFETY: a `Slot` is four `AtomicU64`s, which have the layout of `u64`s, for which all-zero
    // bits are 0; the memory holds `n` of them and was allocated with the layout that
    // `Box<[Slot]>` frees with.
    unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(ptr, n)) }
}

/// `n` slots at zero (loom's atomics must be constructed).
#[cfg(loom)]
fn zeroed_slots(n: usize) -> Box<[Slot]> {
    (0..n)
        .map(|_| Slot {
            start: AtomicU64::new(0),
            end: AtomicU64::new(0),
            plan: AtomicU64::new(0),
            word: AtomicU64::new(0),
        })
        .collect()
}

/// A record copied out of a ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Record {
    pub(crate) start: u64,
    pub(crate) end: u64,
    pub(crate) plan: u64,
    pub(crate) word: u64,
}

/// The plans a ring's records point to, with the reader's position.
#[derive(Default)]
struct PlanTable {
    /// Plan address -> (the plan, the head when the worker last moved away from it; `u64::MAX`
    /// for the plan it records now).
    plans: HashMap<u64, (Arc<dyn PlanNames>, u64)>,
    /// Table size after the last prune (the next prune waits for it to double).
    pruned_len: usize,
    /// Records before this index were taken already.
    taken: u64,
}

/// One worker's slices: a ring of more than `window` slots (a power of two, so a slot is found
/// with a mask; the slot after the newest record is the one being written, so `window` records
/// are always whole), written by that worker only.
pub(crate) struct WorkerRing {
    slots: Box<[Slot]>,
    /// `slots.len() - 1`.
    mask: u64,
    /// Records a read returns at most.
    window: u64,
    /// Records published (the next one goes to `slots[head & mask]`). Written by the worker only.
    head: AtomicU64,
    /// The plan address the worker records now. Read and written by the worker only.
    current: AtomicU64,
    table: Mutex<PlanTable>,
}

impl WorkerRing {
    pub(crate) fn new(window: usize) -> Self {
        let window = window.max(1);
        let len = (window + 1).next_power_of_two();
        WorkerRing {
            slots: zeroed_slots(len),
            mask: len as u64 - 1,
            window: window as u64,
            head: AtomicU64::new(0),
            current: AtomicU64::new(0),
            table: Mutex::new(PlanTable::default()),
        }
    }

    /// Appends a record. Only the ring's worker may call this.
    #[inline]
    pub(crate) fn push(&self, r: Record) {
        let head = self.head.load(Ordering::Relaxed);
        let slot = &self.slots[(head & self.mask) as usize];
        #[cfg(all(target_arch = "x86_64", not(loom), not(miri)))]
        {
            // A window larger than the caches makes every record's first store wait for its
            // line to be read from memory: ask for the line 16 records ahead now, for writing.
            let ahead = &self.slots[(head.wrapping_add(16) & self.mask) as usize];
            // SAFETY: a prefetch is a hint that never faults and changes no memory; the address
            // is that of a live slot of this ring.
            unsafe {
                core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_ET0 }>(
                    (ahead as *const Slot).cast(),
                )
            };
        }
        // Orders the previous record's head store before this record's stores: a reader that
        // sees any of them then sees a head past the previous record, so it drops the record
        // this slot held before (the seqlock's "write begins").
        fence(Ordering::Release);
        slot.start.store(r.start, Ordering::Relaxed);
        slot.end.store(r.end, Ordering::Relaxed);
        slot.plan.store(r.plan, Ordering::Relaxed);
        slot.word.store(r.word, Ordering::Relaxed);
        self.head.store(head + 1, Ordering::Release);
    }

    /// Makes `plan` the plan the next records point to, keeping it in the table. Only the
    /// ring's worker may call this; it takes the table's lock, once per change of graph.
    #[cold]
    #[inline(never)]
    fn switch_plan(&self, key: u64, plan: Arc<dyn PlanNames>) {
        let head = self.head.load(Ordering::Relaxed);
        let mut t = sync::lock(&self.table);
        let previous = self.current.load(Ordering::Relaxed);
        if let Some(e) = t.plans.get_mut(&previous) {
            e.1 = head;
        }
        t.plans.entry(key).or_insert((plan, u64::MAX)).1 = u64::MAX;
        self.current.store(key, Ordering::Relaxed);
        if t.plans.len() >= (2 * t.pruned_len).max(16) {
            // Plans none of whose records the ring still holds (or that were taken) go.
            let oldest = head.saturating_sub(self.window).max(t.taken);
            t.plans.retain(|_, e| e.1 > oldest);
            t.pruned_len = t.plans.len();
        }
    }

    /// Copies the records not taken yet (and marks them taken if `drain`), with the plans
    /// they point to; the second value counts the records the ring overwrote before they
    /// could be taken.
    pub(crate) fn read(&self, drain: bool) -> (Vec<Record>, u64, Plans) {
        // Holding the table keeps the worker from pruning (or adding) plans meanwhile: every
        // record read points to a plan in it.
        let mut t = sync::lock(&self.table);
        let (records, head) = self.read_records(t.taken);
        let dropped = head - t.taken - records.len() as u64;
        let plans = records
            .iter()
            .filter_map(|r| {
                let e = t.plans.get(&r.plan)?;
                Some((r.plan, e.0.clone()))
            })
            .collect();
        if drain {
            t.taken = head;
        }
        (records, dropped, plans)
    }

    /// The seqlock read: the whole records from index `taken` up to the head (returned too),
    /// less the ones the worker may have overwritten while they were copied.
    pub(crate) fn read_records(&self, taken: u64) -> (Vec<Record>, u64) {
        let len = self.slots.len() as u64;
        let head = self.head.load(Ordering::Acquire);
        // At most the window; the slot after the newest record may be being written, so
        // `len - 1 >= window` records are whole.
        let from = taken.max(head.saturating_sub(self.window));
        let mut out: Vec<Record> = (from..head)
            .map(|i| {
                let s = &self.slots[(i & self.mask) as usize];
                Record {
                    start: s.start.load(Ordering::Relaxed),
                    end: s.end.load(Ordering::Relaxed),
                    plan: s.plan.load(Ordering::Relaxed),
                    word: s.word.load(Ordering::Relaxed),
                }
            })
            .collect();
        // Pairs with the worker's release fence: a copy that saw any store of a newer record
        // in its slot sees a head at least at that record here, and is dropped below.
        fence(Ordering::Acquire);
        let now = self.head.load(Ordering::Relaxed);
        let valid = (now + 1).saturating_sub(len).max(from);
        let overwritten = (valid - from).min(out.len() as u64) as usize;
        out.drain(..overwritten);
        (out, head)
    }
}

/// The clock slices are measured with: the CPU's time-stamp counter where there is one (a few
/// ns to read, where `Instant::now` costs several times that), else nanoseconds of `Instant`
/// (also under loom and Miri, which do not model the counter).
/// Ticks become nanoseconds when the trace is read, by the rate between the pool's build and
/// that read.
struct Clock {
    epoch: Instant,
    tick0: u64,
}

impl Clock {
    fn new() -> Self {
        let epoch = Instant::now();
        Clock {
            epoch,
            tick0: Self::raw_ticks(epoch),
        }
    }

    #[cfg(all(target_arch = "x86_64", not(loom), not(miri)))]
    #[inline]
    fn raw_ticks(_epoch: Instant) -> u64 {
        // SAFETY: `rdtsc` reads the time-stamp counter; every x86_64 CPU has it and it has no
        // preconditions. Linux boots with a TSC that is constant-rate and synchronised across
        // cores on the CPUs that also use it as their clock source.
        unsafe { core::arch::x86_64::_rdtsc() }
    }

    /// Waits until every instruction ahead of it has completed, loads included, so that a
    /// counter read after it is not read early (see [`start_tick`](Self::start_tick)).
    #[cfg(all(target_arch = "x86_64", not(loom), not(miri)))]
    #[inline]
    fn after_loads() {
        // SAFETY: `lfence` has no preconditions and touches no memory; SSE2, so every x86_64
        // CPU has it. It lets nothing after it execute before everything ahead of it has
        // completed (Intel's, and AMD's with the setting Linux makes).
        unsafe { core::arch::x86_64::_mm_lfence() }
    }

    #[cfg(not(all(target_arch = "x86_64", not(loom), not(miri))))]
    #[inline]
    fn raw_ticks(epoch: Instant) -> u64 {
        epoch.elapsed().as_nanos() as u64
    }

    #[cfg(not(all(target_arch = "x86_64", not(loom), not(miri))))]
    #[inline]
    fn after_loads() {}

    #[inline]
    fn now(&self) -> u64 {
        Self::raw_ticks(self.epoch)
    }

    /// The tick a node starts at when it was found ready, not continued from a body that just
    /// ended here. `rdtsc` alone may execute before the loads ahead of it complete: a node
    /// that starts once it has seen its last predecessor's arrival could read the counter
    /// while that load was still in flight, earlier than the predecessor's end tick (the order
    /// test saw it under load). An end tick needs no fence: read early, it only makes the slice end sooner,
    /// still before the arrival that a successor's start waits for.
    #[inline]
    fn start_tick(&self) -> u64 {
        Self::after_loads();
        Self::raw_ticks(self.epoch)
    }

    /// A function from ticks to nanoseconds since the epoch, calibrated now.
    fn to_ns(&self) -> impl Fn(u64) -> u64 + '_ {
        // Bracket the Instant between two tick reads: its tick is their middle.
        let a = self.now();
        let at = Instant::now();
        let b = self.now();
        let ns = at.saturating_duration_since(self.epoch).as_nanos() as f64;
        let ticks = (a / 2 + b / 2).saturating_sub(self.tick0) as f64;
        let per_tick = if ticks > 0.0 { ns / ticks } else { 1.0 };
        move |t: u64| (t.saturating_sub(self.tick0) as f64 * per_tick) as u64
    }
}

/// A span on an extra track (times as `Instant`: spans come from other clocks, e.g. GPU events
/// mapped to host time).
struct Span {
    name: String,
    node: Option<(Arc<str>, u32)>,
    start: Instant,
    end: Instant,
}

#[derive(Default)]
struct ExtraTracks {
    /// (track name, its last `window` spans), in creation order.
    tracks: Vec<(String, VecDeque<Span>)>,
    dropped: u64,
}

/// The recording state; shared (cheap clones) so that a [`SpanRecorder`] can outlive a borrow
/// of the pool.
#[derive(Clone)]
pub(crate) struct TraceSink(Arc<SinkInner>);

pub(crate) struct SinkInner {
    clock: Clock,
    window: usize,
    workers: Box<[WorkerInfo]>,
    rings: Box<[WorkerRing]>,
    extra: Mutex<ExtraTracks>,
}

impl std::ops::Deref for TraceSink {
    type Target = SinkInner;
    fn deref(&self) -> &SinkInner {
        &self.0
    }
}

/// A handle that adds slices to extra tracks of a pool's trace from any thread, for example a
/// GPU stream's per-node device time (from [`PoolExt::span_recorder`](crate::backend::PoolExt::span_recorder);
/// only exists while the pool records a trace). Keeps the recorded slices alive, not the pool;
/// it also reads them ([`snapshot`](Self::snapshot), [`take`](Self::take)), for a server that
/// serves the window without holding the pool.
#[derive(Clone)]
pub struct SpanRecorder(TraceSink);

impl std::fmt::Debug for SpanRecorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpanRecorder").finish_non_exhaustive()
    }
}

impl SpanRecorder {
    pub(crate) fn new(sink: TraceSink) -> Self {
        SpanRecorder(sink)
    }

    /// The instant the trace's times are measured from.
    pub fn epoch(&self) -> Instant {
        self.0.clock.epoch
    }

    /// Creates the extra track `track` now, if it does not exist yet (extra tracks come in the
    /// order they were created: create them up front to fix their order).
    pub fn add_track(&self, track: &str) {
        self.0.extra_track(&mut sync::lock(&self.0.extra), track);
    }

    /// Adds a slice named `name` to the extra track `track` (created on first use).
    pub fn span(&self, track: &str, name: &str, start: Instant, end: Instant) {
        self.0.span(track, name, None, start, end);
    }

    /// Adds a slice standing for node `node` (its index in its graph) of graph `graph` to the
    /// extra track `track`: the slice carries the graph's name and the node's index, like a
    /// worker track's node slice, with [`SliceKind::Span`].
    pub fn node_span(
        &self,
        track: &str,
        name: &str,
        (graph, node): (&str, u32),
        start: Instant,
        end: Instant,
    ) {
        self.0
            .span(track, name, Some((Arc::from(graph), node)), start, end);
    }

    /// The window recorded so far, left in place (what [`Pool::snapshot_trace`](crate::Pool::snapshot_trace) returns).
    pub fn snapshot(&self) -> Trace {
        self.0.read(false)
    }

    /// Drains the window (what [`Pool::take_trace`](crate::Pool::take_trace) returns).
    pub fn take(&self) -> Trace {
        self.0.read(true)
    }
}

impl TraceSink {
    pub(crate) fn new(workers: &[WorkerInfo], window: usize) -> Self {
        TraceSink(Arc::new(SinkInner {
            clock: Clock::new(),
            window: window.max(1),
            workers: workers.into(),
            rings: workers.iter().map(|_| WorkerRing::new(window)).collect(),
            extra: Mutex::new(ExtraTracks::default()),
        }))
    }

    /// The trace clock, in ticks (see [`Clock`]).
    #[inline]
    pub(crate) fn now(&self) -> u64 {
        self.clock.now()
    }

    /// The trace clock for the start of a node found ready (see `Clock::start_tick`).
    #[inline]
    pub(crate) fn start_tick(&self) -> u64 {
        self.clock.start_tick()
    }

    /// Records that `worker` ran node `node` of `plan` from `start` to `end` (ticks of
    /// [`now`](Self::now)). Only worker `worker` may call this.
    #[inline]
    pub(crate) fn node<P: PlanNames + 'static>(
        &self,
        worker: usize,
        plan: &Arc<P>,
        node: u32,
        (start, end): (u64, u64),
        stolen: bool,
    ) {
        let ring = &self.rings[worker];
        let key = Arc::as_ptr(plan) as *const () as usize as u64;
        if ring.current.load(Ordering::Relaxed) != key {
            ring.switch_plan(key, plan.clone());
        }
        let kind = if stolen { KIND_STOLEN } else { KIND_NODE };
        ring.push(Record {
            start,
            end,
            plan: key,
            word: node as u64 | kind << 32,
        });
    }

    /// Records that `worker` was parked from `start` to `end` (ticks). Only worker `worker`
    /// may call this.
    pub(crate) fn park(&self, worker: usize, start: u64, end: u64) {
        self.rings[worker].push(Record {
            start,
            end,
            plan: 0,
            word: KIND_PARK << 32,
        });
    }

    /// The index of extra track `track` among the extra tracks, created if new.
    fn extra_track(&self, extra: &mut ExtraTracks, track: &str) -> usize {
        match extra.tracks.iter().position(|t| t.0 == track) {
            Some(i) => i,
            None => {
                extra.tracks.push((track.to_string(), VecDeque::new()));
                extra.tracks.len() - 1
            }
        }
    }

    pub(crate) fn span(
        &self,
        track: &str,
        name: &str,
        node: Option<(Arc<str>, u32)>,
        start: Instant,
        end: Instant,
    ) {
        let span = Span {
            name: name.to_string(),
            node,
            start,
            end,
        };
        let mut extra = sync::lock(&self.extra);
        let i = self.extra_track(&mut extra, track);
        let spans = &mut extra.tracks[i].1;
        let full = spans.len() >= self.window;
        if full {
            spans.pop_front();
        }
        spans.push_back(span);
        extra.dropped += full as u64;
    }

    /// The window: every worker's records not taken yet, then the extra tracks' spans; drained
    /// when `drain`.
    pub(crate) fn read(&self, drain: bool) -> Trace {
        let epoch = self.clock.epoch;
        let mut tracks: Vec<TraceTrack> = self
            .workers
            .iter()
            .map(|i| TraceTrack {
                name: match i.core {
                    Some(c) => format!("worker {} (core {c}, {})", i.index, i.group_name),
                    None => format!("worker {} (unpinned, {})", i.index, i.group_name),
                },
                worker: Some(i.index),
                core: i.core,
                group: i.group_name.clone(),
            })
            .collect();
        let mut slices = Vec::new();
        let mut dropped = 0;
        let to_ns = self.clock.to_ns();
        for (w, ring) in self.rings.iter().enumerate() {
            let (records, lost, plans) = ring.read(drain);
            dropped += lost;
            slices.reserve(records.len());
            for r in records {
                let node = (r.word & 0xffff_ffff) as u32;
                let kind = match r.word >> 32 {
                    KIND_PARK => SliceKind::Park,
                    k => SliceKind::Node {
                        stolen: k == KIND_STOLEN,
                    },
                };
                let (name, graph, node) = match (kind, plans.get(&r.plan)) {
                    (SliceKind::Node { .. }, Some(p)) => (
                        p.node_name(node).to_string(),
                        p.graph_name().to_string(),
                        Some(node),
                    ),
                    _ => ("park".to_string(), String::new(), None),
                };
                slices.push(TraceSlice {
                    track: w,
                    name,
                    graph,
                    node,
                    start_ns: to_ns(r.start),
                    end_ns: to_ns(r.end),
                    kind,
                });
            }
        }
        let ns = |t: Instant| t.saturating_duration_since(epoch).as_nanos() as u64;
        let mut extra = sync::lock(&self.extra);
        dropped += extra.dropped;
        if drain {
            extra.dropped = 0;
        }
        for (i, (track, spans)) in extra.tracks.iter_mut().enumerate() {
            tracks.push(TraceTrack {
                name: track.clone(),
                worker: None,
                core: None,
                group: String::new(),
            });
            let track = self.workers.len() + i;
            let to_slice = |s: &Span| TraceSlice {
                track,
                name: s.name.clone(),
                graph: s.node.as_ref().map(|n| n.0.to_string()).unwrap_or_default(),
                node: s.node.as_ref().map(|n| n.1),
                start_ns: ns(s.start),
                end_ns: ns(s.end),
                kind: SliceKind::Span,
            };
            slices.extend(spans.iter().map(to_slice));
            if drain {
                spans.clear();
            }
        }
        Trace {
            epoch,
            tracks,
            slices,
            dropped,
        }
    }
}
