//! The state each pool worker holds for life: its device's bound context, its streams (one per
//! priority level: the normal one made at start, the high and low ones at the first node of
//! their level), its function cache and its completion trackers.

use std::cell::{Cell, OnceCell, Ref, RefCell};
use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::{Duration, Instant};

use boundpool_scheduler::{BoxError, GroupId, Placement, Priority, WorkerInfo};
use cudarc::driver::{CudaContext, CudaFunction, CudaStream};

use crate::device::DeviceShared;
use crate::driver::{self, Ctx, DriverError, Event, StreamRef};
use crate::error::{GpuError, GpuErrorKind, GpuResult};
use crate::libs::WorkerLibs;
use crate::module::Kernel;
use crate::state::{WorkerPlan, WorkerSetup, WorkerStates};

/// Pool-wide facts every worker needs: which group belongs to which device.
#[derive(Debug)]
pub(crate) struct PoolShared {
    /// Group index -> index into `devices` (None: a host group).
    pub(crate) group_device: Vec<Option<usize>>,
    /// Domain index -> index into `devices` (a device of several groups is a domain).
    pub(crate) domain_device: Vec<usize>,
    pub(crate) devices: Vec<Arc<DeviceShared>>,
    /// `GpuPoolBuilder::stream_handoff`.
    pub(crate) stream_handoff: bool,
    /// Libraries and user states every device worker sets up at start.
    pub(crate) plan: WorkerPlan,
    /// Group index -> priority of its workers' streams (`GpuPoolBuilder::stream_priority`).
    pub(crate) group_priority: Vec<i32>,
    /// Group index -> the SM partition of its device it is (`GpuPoolBuilder::sm_partitions`).
    pub(crate) group_partition: Vec<Option<usize>>,
    /// The first device worker whose start failed, and why (`GpuPool::build` reports it: the
    /// scheduler names the lowest-numbered failing worker, which may have failed only because
    /// this one's failure had the device released before it bound).
    pub(crate) first_start_failure: std::sync::Mutex<Option<(String, String)>>,
}

impl PoolShared {
    pub(crate) fn device_of_group(&self, g: GroupId) -> Option<usize> {
        self.group_device.get(g.index()).copied().flatten()
    }

    /// The SM partition group `g` is (None: not a partition).
    pub(crate) fn partition_of_group(&self, g: GroupId) -> Option<usize> {
        self.group_partition.get(g.index()).copied().flatten()
    }

    /// The device whose workers run a node placed on `p` (None: host or any worker).
    pub(crate) fn device_of(&self, p: Placement) -> Option<usize> {
        match p {
            Placement::Group(g) => self.device_of_group(g),
            Placement::Domain(d) => self.domain_device.get(d.index()).copied(),
            Placement::Any => None,
        }
    }
}

/// Events a worker recorded for its successors come back here when their markers are dropped
/// (any thread, no driver call); the worker takes them back in one batch. Keeps the node path
/// free of the device-wide event table and of shared reference counts.
#[derive(Debug, Default)]
pub(crate) struct EventReturn {
    back: Mutex<Vec<Event>>,
}

impl EventReturn {
    /// Gives an event back; no driver call, any thread.
    pub(crate) fn put(&self, e: Event) {
        self.back.lock().unwrap_or_else(|e| e.into_inner()).push(e);
    }
}

/// An event recorded after a node's work on a stream handed over to it, polled by the node's
/// deferred completion. Dropped before it completed (the pool stopped), it gives the event back
/// to its worker.
pub(crate) struct PendingEvent {
    pub(crate) event: Option<Event>,
    pub(crate) back: Arc<EventReturn>,
    /// When the event was last found not ready.
    pub(crate) last: Option<Instant>,
}

impl Drop for PendingEvent {
    fn drop(&mut self) {
        if let Some(e) = self.event.take() {
            self.back.put(e);
        }
    }
}

/// One of a worker's streams (one per priority level) and the completion tracking of the nodes
/// enqueued on it.
pub(crate) struct Lane {
    /// A view of `cuda`, the one the node path uses.
    pub(crate) stream: StreamRef,
    /// The stream as cudarc's type, for node bodies that use cudarc
    /// ([`GpuCtx::stream`](crate::GpuCtx::stream)); the device's table holds it too (so
    /// that other workers may record on it until the device's last worker stops).
    pub(crate) cuda: Arc<CudaStream>,
    /// GPU nodes enqueued on `stream` so far.
    pub(crate) seq: Cell<u64>,
    completion: RefCell<Completion>,
    /// Its completion word's index in the worker's [`CompletionWords`].
    word: usize,
}

impl Lane {
    fn new(cuda: Arc<CudaStream>, word: usize) -> Self {
        Self {
            stream: StreamRef::of(&cuda),
            cuda,
            seq: Cell::new(0),
            completion: RefCell::new(Completion::default()),
            word,
        }
    }
}

/// A bound device worker's own resources.
pub(crate) struct Bound {
    pub(crate) device: Arc<DeviceShared>,
    pub(crate) device_index: usize,
    /// The device's SM partition whose streams this worker makes (None: the whole device's).
    pub(crate) partition: Option<usize>,
    pub(crate) ctx: Ctx,
    /// The device's context as cudarc's type ([`GpuCtx::context`](crate::GpuCtx::context)).
    pub(crate) cuda: Arc<CudaContext>,
    /// The normal level's stream, made at start with the group's priority
    /// (`GpuPoolBuilder::stream_priority`). Also the stream of the idle hook's releases.
    pub(crate) stream: StreamRef,
    /// The normal level's lane (on `stream`).
    normal: Lane,
    /// The high level's lane: a stream of the device's greatest priority, made at this worker's
    /// first high node.
    high: OnceCell<Lane>,
    /// The low level's lane: a stream of the device's least priority, made at this worker's
    /// first low node.
    low: OnceCell<Lane>,
    /// The functions this worker launched, by [`Kernel`] id (cudarc's, each holding its
    /// module: dropped in [`GpuWorker::stop`] on this worker, before the device's teardown).
    funcs: RefCell<HashMap<u64, CudaFunction>>,
    /// Events ready for reuse, this worker's own.
    events: RefCell<Vec<Event>>,
    /// Where this worker's events come back from markers.
    pub(crate) returned: Arc<EventReturn>,
    /// cuBLAS / cuSOLVER handles and workspaces.
    pub(crate) libs: WorkerLibs,
    /// User states (`GpuPoolBuilder::worker_state`).
    pub(crate) states: WorkerStates,
    /// Edge counts not yet pushed to the device's metrics.
    pub(crate) edges: crate::metrics::EdgeCounts,
    /// The lanes' completion words.
    words: CompletionWords,
}

#[derive(Default)]
struct Completion {
    /// Highest sequence number of the lane known complete on the device.
    done: u64,
    /// Highest sequence number a write of the lane's completion word was enqueued for.
    written: u64,
    /// When the stream was last found busy.
    last_query: Option<Instant>,
}

impl Completion {
    /// The sequence number the word's 32 bits stand for: the writes enqueued are all within
    /// 2^32 below `written`.
    fn seen(&self, word: u32) -> u64 {
        self.written - u64::from((self.written as u32).wrapping_sub(word))
    }
}

/// The state of one pool worker (the scheduler's `S`): for a device worker, its device's
/// primary context bound to the thread for life and its own stream; for a host worker, nothing.
/// Nodes reach it through [`GpuCtx`](crate::GpuCtx); it is not used directly.
pub struct GpuWorker {
    pub(crate) bound: Option<Bound>,
    pub(crate) shared: Arc<PoolShared>,
}

impl fmt::Debug for GpuWorker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GpuWorker")
            .field("device", &self.bound.as_ref().map(|b| b.device.ordinal()))
            .finish()
    }
}

/// Poll no faster than this when the oldest event is not ready (a query costs ~1 µs).
const REQUERY_AFTER: Duration = Duration::from_micros(2);

/// How often a worker waiting on its completion word also asks the driver (which reports a
/// failed device; the word alone never would).
const QUERY_EVERY: Duration = Duration::from_micros(50);

impl GpuWorker {
    pub(crate) fn host(shared: Arc<PoolShared>) -> Self {
        Self {
            bound: None,
            shared,
        }
    }

    /// Start hook of a device worker: bind the primary context, check it, create the stream
    /// (in its SM partition's green context, for a partition's worker).
    pub(crate) fn start_device(
        shared: Arc<PoolShared>,
        device_index: usize,
        priority: i32,
        partition: Option<usize>,
    ) -> GpuResult<Self> {
        let device = shared.devices[device_index].clone();
        let (ctx, cuda) = device.bind_worker()?;
        driver::green::expect_partition(device.partitions.expected(partition));
        let stream = match new_stream(&device, &cuda, ctx, partition, priority) {
            Ok(s) => s,
            Err(e) => {
                // Undo the bind so the context's reference count stays right.
                let err =
                    GpuError::driver("cuStreamCreate", &format!("device {}", device.ordinal()), e);
                device.worker_stopped_without_stream();
                return Err(err);
            }
        };
        // Held by the device's table from here on; this worker keeps a view and a clone.
        let cuda_stream = stream.clone();
        let stream = device.register_stream(stream);
        if let Some(t) = &device.timing {
            let part = partition.map(|p| device.partitions.planned[p].name.as_str());
            if let Err(e) = t.add_stream(ctx, stream, part) {
                let err = GpuError::driver(
                    "cuEventRecord",
                    &format!("device {}: trace reference event", device.ordinal()),
                    e,
                );
                device.worker_stopped(stream);
                return Err(err);
            }
        }
        let words = match CompletionWords::new(ctx) {
            Ok(w) => w,
            Err(e) => {
                let err = GpuError::driver(
                    "cuMemHostAlloc",
                    &format!("device {}: completion words", device.ordinal()),
                    e,
                );
                device.worker_stopped(stream);
                return Err(err);
            }
        };
        Ok(Self {
            bound: Some(Bound {
                device,
                device_index,
                partition,
                ctx,
                cuda,
                stream,
                normal: Lane::new(cuda_stream, 0),
                high: OnceCell::new(),
                low: OnceCell::new(),
                funcs: RefCell::new(HashMap::new()),
                events: RefCell::new(Vec::new()),
                returned: Arc::new(EventReturn::default()),
                libs: Default::default(),
                states: Default::default(),
                edges: Default::default(),
                words,
            }),
            shared,
        })
    }

    /// After binding: the libraries asked for up front and the user states, on this worker.
    /// On failure the worker is stopped (its context released) and the error names it.
    pub(crate) fn set_up(mut self, info: &WorkerInfo) -> GpuResult<Self> {
        let plan = self.shared.plan.clone();
        let r = (|| {
            let Some(b) = self.bound.as_mut() else {
                return Ok(());
            };
            let what = || format!("worker '{}' of device {}", info.name, b.device.ordinal());
            if plan.blas {
                b.libs.ensure_blas(b.normal_stream(), &what)?;
            }
            if plan.solver {
                b.libs.ensure_solver(b.normal_stream(), &what)?;
            }
            let setup = WorkerSetup::new(info, &b.device.info, &b.cuda);
            b.states.make(&plan.states, &setup, &what)
        })();
        match r {
            Ok(()) => Ok(self),
            Err(e) => {
                self.stop();
                Err(e)
            }
        }
    }

    /// Stop hook: finish the streams' work, give back every event, free what is queued, and
    /// (last worker of the device) release the device. The streams themselves, like every
    /// registered stream of the device, are destroyed by its last worker (a node still running
    /// elsewhere may record on them until then).
    pub(crate) fn stop(self) {
        if let Some(b) = self.bound {
            // Handle destroys (a synchronise inside), host frees and the device's teardown
            // synchronise the device: never while a stream of another thread captures on it.
            let gate = b.device.gate.clone();
            let _gate = gate.sync();
            b.edges.flush(b.device.metrics());
            // User states and library handles go first, on this worker, context still bound.
            b.states.drop_all();
            b.libs.shutdown(b.ctx, b.device.failed().is_some());
            // The functions hold their modules: dropped here, context bound, so that the device's
            // last worker drops the last `Arc` of each module (cudarc unloads it then).
            drop(b.funcs);
            let lanes = [Some(b.normal), b.high.into_inner(), b.low.into_inner()];
            for lane in lanes.into_iter().flatten() {
                if b.device.failed().is_none() {
                    let _ = driver::stream_synchronize(b.ctx, lane.stream);
                }
            }
            // Every lane has finished (or its context failed, a sticky error: nothing runs
            // there any more), so no write of a completion word is left.
            let _ = b.words.alloc.free(b.ctx);
            for e in b.events.into_inner() {
                b.device.put_event(e);
            }
            for e in std::mem::take(&mut *b.returned.back.lock().unwrap_or_else(|e| e.into_inner()))
            {
                b.device.put_event(e);
            }
            if let Some(t) = &b.device.timing {
                t.resolve(b.ctx, true);
            }
            b.device.worker_stopped(b.stream);
        }
    }

    /// Idle hook: free handles dropped elsewhere.
    pub(crate) fn idle(&self) {
        if let Some(b) = &self.bound {
            b.edges.flush(b.device.metrics());
            if b.device.has_pending_releases() {
                b.device.drain_releases(b.stream);
            }
            if let Some(t) = &b.device.timing {
                if t.has_pending() {
                    t.resolve(b.ctx, false);
                }
            }
        }
    }
}

/// A non-blocking stream of the context, of `priority` clamped to the context's range (lower
/// numbers are more urgent; 0, the default, makes a plain stream), as cudarc's type so that
/// node bodies can take it: owned by cudarc, or, in SM partition `partition`, made in its
/// green context (owned by the device's partitions, borrowed by cudarc).
fn new_stream(
    device: &DeviceShared,
    cuda: &Arc<CudaContext>,
    ctx: Ctx,
    partition: Option<usize>,
    priority: i32,
) -> driver::DResult<Arc<CudaStream>> {
    let priority = if priority == 0 {
        0
    } else {
        let (least, greatest) = driver::stream_priority_range(ctx)?;
        priority.clamp(greatest, least)
    };
    match partition {
        Some(p) => device.partitions.stream(ctx, cuda, p, priority),
        None if priority == 0 => cuda.new_stream(),
        None => cuda.new_stream_with_priority(priority),
    }
}

impl Bound {
    /// The lane of a node of level `p` on this worker, making its stream at the level's first
    /// node: high nodes go to a stream of the device's greatest priority, low ones to one of its
    /// least, normal ones to the worker's stream made at start. A level has a stream of its own
    /// even where its number equals another's (a default group's normal stream has the least
    /// priority too): in one stream a node waits for everything queued before it, so a high
    /// node sharing a stream with queued low work would wait for all of it.
    #[inline]
    pub(crate) fn lane(&self, p: Priority) -> GpuResult<&Lane> {
        let cell = match p {
            Priority::Normal => return Ok(&self.normal),
            Priority::High => &self.high,
            Priority::Low => &self.low,
        };
        if let Some(l) = cell.get() {
            return Ok(l);
        }
        let word = if p == Priority::High { 1 } else { 2 };
        let lane = Lane::new(self.level_stream(p)?, word);
        Ok(cell.get_or_init(|| lane))
    }

    /// A stream for a replay's capture, in this worker's SM partition if it has one (so that
    /// the captured graph keeps the partition wherever it is launched). A partition's is
    /// retired at once: destroyed once the capture's clones of it are gone (cudarc's own goes
    /// with its last `Arc`).
    pub(crate) fn capture_stream(&self) -> driver::DResult<Arc<CudaStream>> {
        let s = new_stream(&self.device, &self.cuda, self.ctx, self.partition, 0)?;
        if self.partition.is_some() {
            self.device.partitions.retire(&s);
        }
        Ok(s)
    }

    /// The worker's normal-level stream (hoisted allocations of a capture go there).
    pub(crate) fn normal_stream(&self) -> &Arc<CudaStream> {
        &self.normal.cuda
    }

    /// The lane of level `p` if this worker made it.
    pub(crate) fn lane_if_made(&self, p: Priority) -> Option<&Lane> {
        match p {
            Priority::Normal => Some(&self.normal),
            Priority::High => self.high.get(),
            Priority::Low => self.low.get(),
        }
    }

    /// Makes and registers the stream of level `p` (high or low).
    #[cold]
    fn level_stream(&self, p: Priority) -> GpuResult<Arc<CudaStream>> {
        let what = format!("device {}: {p:?} priority stream", self.device.ordinal());
        let (least, greatest) = driver::stream_priority_range(self.ctx).map_err(|e| {
            self.device
                .driver_error("cuCtxGetStreamPriorityRange", &what, e)
        })?;
        let prio = if p == Priority::High { greatest } else { least };
        let stream =
            new_stream(&self.device, &self.cuda, self.ctx, self.partition, prio).map_err(|e| {
                self.device
                    .driver_error("cuStreamCreateWithPriority", &what, e)
            })?;
        // Registered at once, so the last worker drops it whatever happens next.
        let view = self.device.register_stream(stream.clone());
        if let Some(t) = &self.device.timing {
            let part = self
                .partition
                .map(|p| self.device.partitions.planned[p].name.as_str());
            t.add_stream(self.ctx, view, part)
                .map_err(|e| self.device.driver_error("cuEventRecord", &what, e))?;
        }
        Ok(stream)
    }

    /// An event for this worker's use: its own spare ones first, then those its markers gave
    /// back (one lock for the whole batch), then the device's table (which creates one when
    /// empty).
    pub(crate) fn take_event(&self) -> crate::driver::DResult<Event> {
        let mut own = self.events.borrow_mut();
        if let Some(e) = own.pop() {
            return Ok(e);
        }
        {
            let mut back = self.returned.back.lock().unwrap_or_else(|e| e.into_inner());
            std::mem::swap(&mut *own, &mut *back);
        }
        match own.pop() {
            Some(e) => Ok(e),
            None => self.device.take_event(),
        }
    }

    /// Gives an event back to this worker's spares.
    pub(crate) fn put_event(&self, e: Event) {
        self.events.borrow_mut().push(e);
    }

    /// Records one of this worker's events on `stream` (after everything enqueued there so
    /// far); on failure the event goes back to the spares.
    pub(crate) fn record_event(
        &self,
        stream: StreamRef,
    ) -> Result<Event, (&'static str, DriverError)> {
        let e = self.take_event().map_err(|err| ("cuEventCreate", err))?;
        if let Err(err) = driver::event_record(self.ctx, &e, stream) {
            self.put_event(e);
            return Err(("cuEventRecord", err));
        }
        Ok(e)
    }

    /// `k`'s function if this worker has looked it up before (no driver call, no reference
    /// count touched), borrowed from the worker's cache.
    pub(crate) fn cached_function(&self, k: &Kernel) -> Option<Ref<'_, CudaFunction>> {
        Ref::filter_map(self.funcs.borrow(), |m| m.get(&k.inner.id)).ok()
    }

    /// `k`'s function, looked up on the device (which loads its module on first use) and
    /// cached on this worker when not yet. No borrow of the cache may be held.
    pub(crate) fn load_function(&self, k: &Kernel) -> GpuResult<Ref<'_, CudaFunction>> {
        if !self.funcs.borrow().contains_key(&k.inner.id) {
            let f = self.device.function(&self.cuda, k)?;
            self.funcs.borrow_mut().insert(k.inner.id, f);
        }
        Ok(Ref::map(self.funcs.borrow(), |m| &m[&k.inner.id]))
    }

    /// Polls whether the work before `pending`'s event (recorded on a stream another worker's
    /// node handed over) has completed, at most once every few microseconds.
    pub(crate) fn poll_event(&self, pending: &mut PendingEvent) -> Poll<Result<(), BoxError>> {
        if let Some(why) = self.device.failed() {
            return Poll::Ready(Err(Box::new(GpuError::new(
                GpuErrorKind::DeviceFailed,
                format!("device {} failed: {why}", self.device.ordinal()),
            ))));
        }
        if pending.last.is_some_and(|t| t.elapsed() < REQUERY_AFTER) {
            return Poll::Pending;
        }
        let Some(e) = &pending.event else {
            return Poll::Ready(Ok(()));
        };
        match driver::event_query(self.ctx, e) {
            Ok(true) => {
                if let Some(e) = pending.event.take() {
                    self.put_event(e);
                }
                if let Some(t) = &self.device.timing {
                    t.resolve(self.ctx, false);
                }
                Poll::Ready(Ok(()))
            }
            Ok(false) => {
                pending.last = Some(Instant::now());
                Poll::Pending
            }
            Err(err) => Poll::Ready(Err(Box::new(self.device.driver_error(
                "cuEventQuery",
                "waiting for GPU work",
                err,
            )))),
        }
    }

    /// Polls whether the work up to sequence number `seq` on this worker's stream of level `p`
    /// has completed. The lane's completion word tells (a load, no driver call): when no write
    /// enqueued so far covers `seq`, one is enqueued for everything on the lane so far, so a
    /// burst of nodes shares one. The stream is also queried, at most once every
    /// [`QUERY_EVERY`], for a failed device (whose word never moves).
    pub(crate) fn poll_done(&self, p: Priority, seq: u64) -> Poll<Result<(), BoxError>> {
        let Some(lane) = self.lane_if_made(p) else {
            // Not reached: a node's completion is polled by the worker that enqueued it, on the
            // lane it enqueued on.
            return Poll::Ready(Ok(()));
        };
        let mut c = lane.completion.borrow_mut();
        if c.done >= seq {
            return Poll::Ready(Ok(()));
        }
        if let Some(why) = self.device.failed() {
            return Poll::Ready(Err(Box::new(GpuError::new(
                GpuErrorKind::DeviceFailed,
                format!("device {} failed: {why}", self.device.ordinal()),
            ))));
        }
        c.done = c.done.max(c.seen(self.words.read(lane.word)));
        if c.done < seq && c.last_query.is_none_or(|t| t.elapsed() >= QUERY_EVERY) {
            let tail = lane.seq.get();
            match driver::stream_query(self.ctx, lane.stream) {
                Ok(true) => c.done = c.done.max(tail),
                Ok(false) => c.last_query = Some(Instant::now()),
                Err(err) => {
                    let e = self
                        .device
                        .driver_error("cuStreamQuery", "waiting for GPU work", err);
                    return Poll::Ready(Err(Box::new(e)));
                }
            }
        }
        if c.done >= seq {
            c.last_query = None;
            if let Some(t) = &self.device.timing {
                t.resolve(self.ctx, false);
            }
            return Poll::Ready(Ok(()));
        }
        if c.written < seq {
            let tail = lane.seq.get();
            // SAFETY: the word is this worker's mapped host memory, freed in `stop` only after
            // every lane's stream has finished.
            let w = unsafe {
                driver::stream_write_value32(
                    self.ctx,
                    lane.stream,
                    self.words.device_addr(lane.word),
                    tail as u32,
                )
            };
            if let Err(err) = w {
                let e =
                    self.device
                        .driver_error("cuStreamWriteValue32", "waiting for GPU work", err);
                return Poll::Ready(Err(Box::new(e)));
            }
            c.written = tail;
        }
        Poll::Pending
    }
}

/// One mapped host word per lane (normal, high, low), written by the device once the lane's
/// work up to a sequence number has completed (`cuStreamWriteValue32`, after a fence) and read
/// by the worker with a load. Allocated at the worker's start, freed in [`GpuWorker::stop`]
/// after the lanes' streams have finished.
struct CompletionWords {
    alloc: driver::HostAlloc,
}

impl CompletionWords {
    const LANES: usize = 3;

    fn new(ctx: Ctx) -> driver::DResult<Self> {
        let alloc = driver::mem_host_alloc(ctx, 4 * Self::LANES)?;
        // SAFETY: `alloc` holds 4 * LANES bytes, not yet visible to the device.
        unsafe { std::ptr::write_bytes(alloc.ptr(), 0, 4 * Self::LANES) };
        Ok(Self { alloc })
    }

    /// The last value the device wrote to lane `i`'s word.
    fn read(&self, i: usize) -> u32 {
        debug_assert!(i < Self::LANES);
        // SAFETY: page-locked memory of this worker, 4-byte aligned (a page), alive while the
        // worker is; the device writes whole words, so an atomic load reads one of them.
        unsafe { (*(self.alloc.ptr() as *const AtomicU32).add(i)).load(Ordering::Acquire) }
    }

    /// Lane `i`'s word as the device addresses it.
    fn device_addr(&self, i: usize) -> u64 {
        self.alloc.device_ptr() + 4 * i as u64
    }
}

#[cfg(test)]
mod tests {
    use super::Completion;

    #[test]
    fn a_completion_word_stands_for_the_sequence_number_below_the_last_write() {
        let mut c = Completion::default();
        assert_eq!(c.seen(0), 0, "nothing written, nothing seen");
        c.written = 7;
        assert_eq!(c.seen(0), 0, "the write not done yet");
        assert_eq!(c.seen(5), 5, "an earlier write done");
        assert_eq!(c.seen(7), 7);
        // Past 2^32 nodes on a lane: the word wraps, the number does not.
        c.written = (1 << 32) + 3;
        assert_eq!(c.seen(3), (1 << 32) + 3);
        assert_eq!(
            c.seen(u32::MAX),
            (1 << 32) - 1,
            "the last write before the wrap"
        );
        assert_eq!(c.seen(1), (1 << 32) + 1);
    }
}
