//! Per-device shared state: the retained primary context, the event table, the release queue
//! (handles dropped on any thread wait there for a bound worker), the module and function
//! tables, the registered worker streams, and the device's failure state; and `GpuDevice`, a
//! device's public face (its placement, groups and counters).
//!
//! Nothing here calls the driver from a thread that is not a bound worker of the device: the
//! methods that make driver calls take the worker's [`Ctx`] and are only called by workers
//! (and by the device's setup/teardown, which runs on a worker too).

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock, Weak};

use boundpool_scheduler::{BoxError, GroupId, Placement};
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream};

use crate::driver::{self, Ctx, DResult, Dev, DeviceAlloc, Event, GraphExec, HostAlloc, StreamRef};
use crate::error::{GpuError, GpuErrorKind, GpuResult};
use crate::gate::CaptureGate;
use crate::lt_algos::LtAlgoCache;
use crate::metrics::DeviceMetrics;
use crate::module::Kernel;
use crate::partition::{DevicePartitions, PartitionInfo};
use crate::timing::DeviceTiming;

/// A device's place in its NCCL communicator ([`GpuDevice::nccl`]; made by
/// `GpuCtx::nccl_init`, with the `nccl` feature).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NcclInfo {
    /// This device's rank in the communicator.
    pub rank: usize,
    /// The communicator's number of ranks.
    pub world: usize,
}

/// A handle whose release waits for a bound worker.
pub(crate) enum Release {
    /// The memory of a dropped [`DeviceBuffer`](crate::DeviceBuffer): a `CudaSlice` of this
    /// device, taken apart and freed on the worker once its readers on other devices (or
    /// pools), if it had any, are done, as their fences say.
    Slice(Box<dyn LeakSlice>, Option<Arc<PeerReaders>>),
    /// A replay executable (`replay/`) whose last owner dropped it.
    Exec(GraphExec),
    /// The page-locked host memory of a dropped [`PinnedBuffer`](crate::PinnedBuffer), with the
    /// context it was allocated in (kept alive for a free after the device's teardown).
    Pinned(HostAlloc, Arc<CudaContext>),
}

impl fmt::Debug for Release {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Release::Slice(s, r) => write!(
                f,
                "Slice({} bytes, {} reader fences)",
                s.bytes(),
                r.as_ref().map_or(0, |r| r.len())
            ),
            Release::Exec(e) => write!(f, "Exec({e:?})"),
            Release::Pinned(a, _) => write!(f, "Pinned({} bytes)", a.bytes()),
        }
    }
}

/// An event recorded on a stream of another device (or of another pool's table of this
/// device) right after a node there read a buffer of this device ([`GpuCtx::on_device`],
/// [`GpuCtx::copy_peer`]): the buffer's free waits for it (`cuStreamWaitEvent` takes an event
/// of another context), then the event goes back to its own device's spares.
///
/// [`GpuCtx::on_device`]: crate::GpuCtx::on_device
/// [`GpuCtx::copy_peer`]: crate::GpuCtx::copy_peer
pub(crate) struct ReaderFence {
    pub(crate) event: Event,
    /// The device (table) whose worker recorded it, which owns the event.
    pub(crate) home: Arc<DeviceShared>,
}

impl ReaderFence {
    /// Gives the event back to its device's spares (no driver call, any thread).
    pub(crate) fn done(self) {
        self.home.put_event(self.event);
    }
}

/// The fences of a buffer's readers on other devices, and how many node bodies read it in
/// place right now (their fence comes when the body ends). The buffer's drop hands this to its
/// release; the draining worker frees the memory only once no body reads it in place any
/// more, after waiting for every fence. A reader adding a fence first gives back those of its
/// own device that have completed (it is a bound worker of that device: it may query them), so
/// a long-lived buffer read at every run keeps only the fences still in flight.
#[derive(Default)]
pub(crate) struct PeerReaders {
    fences: Mutex<Vec<ReaderFence>>,
    reading: AtomicUsize,
}

impl PeerReaders {
    /// Adds `fence`, recorded by a bound worker of `fence.home`, which calls this.
    pub(crate) fn push(&self, fence: ReaderFence) {
        let mut v = self.fences.lock().unwrap_or_else(|e| e.into_inner());
        let ctx = fence.home.ctx();
        let mut i = 0;
        while i < v.len() {
            let done = Arc::ptr_eq(&v[i].home, &fence.home)
                && driver::event_query(ctx, &v[i].event).unwrap_or(false);
            if done {
                v.swap_remove(i).done();
            } else {
                i += 1;
            }
        }
        v.push(fence);
    }

    /// A node body starts reading the buffer in place.
    pub(crate) fn begin_read(&self) {
        self.reading.fetch_add(1, Ordering::AcqRel);
    }

    /// That body ended: its fence, recorded after its work, is in. (A body whose fence could
    /// not be recorded never ends its read: the buffer is then never freed, rather than freed
    /// under it.)
    pub(crate) fn end_read(&self, fence: ReaderFence) {
        self.push(fence);
        self.reading.fetch_sub(1, Ordering::AcqRel);
    }

    /// Whether a body still reads it in place (its fence is not in yet).
    pub(crate) fn being_read(&self) -> bool {
        self.reading.load(Ordering::Acquire) > 0
    }

    /// The fences so far (the buffer is going away).
    pub(crate) fn take(&self) -> Vec<ReaderFence> {
        std::mem::take(&mut *self.fences.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// How many fences are held.
    pub(crate) fn len(&self) -> usize {
        self.fences.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

/// A `CudaSlice` taken apart or dropped by the device's release queue, whatever its element
/// type.
pub(crate) trait LeakSlice: Send {
    /// Its size in bytes.
    fn bytes(&self) -> usize;
    /// Gives up the allocation: the caller frees the returned address. Makes no driver call
    /// on a context with event tracking off (the pool's); on a user's context with tracking on,
    /// cudarc first makes the slice's stream wait for its last reads and writes.
    fn leak(self: Box<Self>) -> u64;
    /// Drops it as cudarc does (frees it on the calling thread): only once the pool is gone.
    fn drop_here(self: Box<Self>);
}

impl<T: 'static> LeakSlice for CudaSlice<T> {
    fn bytes(&self) -> usize {
        self.num_bytes()
    }

    fn leak(self: Box<Self>) -> u64 {
        (*self).leak()
    }

    fn drop_here(self: Box<Self>) {
        drop(self)
    }
}

/// A replay executable of this device, owned by a segment of a replay instance (`replay/`).
/// Dropped anywhere: the executable goes to its device's release queue; the device's teardown
/// destroys those still held.
pub(crate) struct ExecSlot {
    pub(crate) exec: Mutex<Option<GraphExec>>,
    pub(crate) device: Arc<DeviceShared>,
    /// The replayable's count of executables.
    count: Arc<AtomicUsize>,
}

impl ExecSlot {
    /// An empty slot for an executable of `device`, counted in `count` while it holds one.
    pub(crate) fn new(device: Arc<DeviceShared>, count: Arc<AtomicUsize>) -> Self {
        Self {
            exec: Mutex::new(None),
            device,
            count,
        }
    }

    /// Takes the executable out (teardown).
    pub(crate) fn take(&self) -> Option<GraphExec> {
        let e = self.exec.lock().unwrap_or_else(|e| e.into_inner()).take();
        if e.is_some() {
            self.count.fetch_sub(1, Ordering::Relaxed);
        }
        e
    }
}

impl Drop for ExecSlot {
    fn drop(&mut self) {
        if let Some(e) = self.take() {
            // No driver call here: a bound worker of the device destroys it.
            self.device.release(Release::Exec(e));
        }
    }
}

/// Public, static facts about a device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// CUDA device ordinal.
    pub ordinal: i32,
    /// Device name as the driver reports it.
    pub name: String,
    /// PCI bus id (`0000:xx:yy.z`).
    pub pci_bus_id: String,
    /// Total device memory in bytes.
    pub total_memory: usize,
    /// Streaming multiprocessors (SMs).
    pub sms: u32,
    /// Cores the system reports as local to the device (empty when unknown).
    pub local_cores: Vec<usize>,
}

pub(crate) struct DeviceShared {
    pub(crate) info: DeviceInfo,
    pub(crate) dev: Dev,
    /// Set once the primary context has been retained (by the first worker of the device).
    ctx: OnceLock<Ctx>,
    /// The retain itself: cudarc's `CudaContext` over the primary context (its event tracking
    /// off: boundpool's edges order the streams). Dropped by the device's last worker; streams,
    /// buffers and workers hold their own `Arc`s, so a user's clone keeps it alive.
    primary: Mutex<Option<Arc<CudaContext>>>,
    events: Mutex<Vec<Event>>,
    events_created: AtomicUsize,
    releases: Mutex<Vec<Release>>,
    release_pending: AtomicBool,
    waker: Mutex<Option<Arc<dyn Fn() + Send + Sync>>>,
    /// Every worker stream of the device (workers, nodes and markers hold [`StreamRef`]
    /// views), dropped by the device's last worker (destroyed then, unless a user's clone or a
    /// buffer allocated on it still holds it).
    streams: RwLock<Vec<Arc<CudaStream>>>,
    /// Loaded modules (cudarc's), by [`Module`](crate::Module) id. Each function holds its
    /// module too, so a module is unloaded when its last function and this table's `Arc` are
    /// gone: workers drop their functions as they stop, and the device's last worker drops the
    /// functions here and then these `Arc`s (the last ones), context bound.
    modules: Mutex<HashMap<u64, Arc<CudaModule>>>,
    /// Functions looked up so far, by [`Kernel`] id (each worker caches a clone).
    functions: Mutex<HashMap<u64, CudaFunction>>,
    failed: OnceLock<String>,
    closed: AtomicBool,
    live_workers: AtomicUsize,
    /// [`DeviceBuffer`](crate::DeviceBuffer)s of this device not yet freed, and their bytes.
    live_buffers: AtomicUsize,
    live_bytes: AtomicUsize,
    /// GPU stream tracks of the trace (only when the pool records one).
    pub(crate) timing: Option<DeviceTiming>,
    /// Replay executables' slots, so that teardown destroys those still owned
    /// (`replay/`).
    exec_slots: Mutex<Vec<Weak<ExecSlot>>>,
    /// Replay executables instantiated and not yet destroyed.
    execs_live: AtomicUsize,
    /// The device's metric handles (set at the pool's build; none for the probe's device).
    metrics: OnceLock<DeviceMetrics>,
    /// Its SM partitions (none unless `GpuPoolBuilder::sm_partitions` asked).
    pub(crate) partitions: DevicePartitions,
    /// cuBLASLt's algorithm per matmul problem on this device (`blaslt.rs`).
    pub(crate) lt_algos: LtAlgoCache,
    /// Per device ordinal: whether this device's nodes read that device's buffers in place
    /// (peer access to its memory pool, granted at the first read), else through a copy.
    peer_access: Mutex<HashMap<i32, bool>>,
    /// The device's NCCL communicator (`nccl/`), made by `GpuCtx::nccl_init` on a bound
    /// worker, aborted by the device's last worker.
    #[cfg(feature = "nccl")]
    pub(crate) nccl: Mutex<Option<crate::nccl::comm::DeviceComm>>,
    /// The process's capture gate of this device (`gate.rs`), shared with every other pool's
    /// table of the device.
    pub(crate) gate: Arc<CaptureGate>,
}

impl fmt::Debug for DeviceShared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceShared")
            .field("ordinal", &self.info.ordinal)
            .field("failed", &self.failed.get())
            .finish()
    }
}

impl DeviceShared {
    pub(crate) fn new(info: DeviceInfo, dev: Dev, trace: bool) -> Self {
        let gate = CaptureGate::of_device(info.ordinal);
        Self {
            timing: trace.then(|| DeviceTiming::new(info.ordinal, &info.name)),
            info,
            dev,
            ctx: OnceLock::new(),
            primary: Mutex::new(None),
            events: Mutex::new(Vec::new()),
            events_created: AtomicUsize::new(0),
            releases: Mutex::new(Vec::new()),
            release_pending: AtomicBool::new(false),
            waker: Mutex::new(None),
            streams: RwLock::new(Vec::new()),
            modules: Mutex::new(HashMap::new()),
            functions: Mutex::new(HashMap::new()),
            failed: OnceLock::new(),
            closed: AtomicBool::new(false),
            live_workers: AtomicUsize::new(0),
            live_buffers: AtomicUsize::new(0),
            live_bytes: AtomicUsize::new(0),
            exec_slots: Mutex::new(Vec::new()),
            execs_live: AtomicUsize::new(0),
            metrics: OnceLock::new(),
            partitions: DevicePartitions::default(),
            lt_algos: LtAlgoCache::default(),
            peer_access: Mutex::new(HashMap::new()),
            #[cfg(feature = "nccl")]
            nccl: Mutex::new(None),
            gate,
        }
    }

    /// The device with its SM partitions, split at build (`partition.rs`).
    pub(crate) fn with_partitions(mut self, partitions: DevicePartitions) -> Self {
        self.partitions = partitions;
        self
    }

    pub(crate) fn set_metrics(&self, m: DeviceMetrics) {
        let _ = self.metrics.set(m);
    }

    /// The device's metric handles.
    pub(crate) fn metrics(&self) -> &DeviceMetrics {
        static NOOP: OnceLock<DeviceMetrics> = OnceLock::new();
        self.metrics
            .get()
            .unwrap_or_else(|| NOOP.get_or_init(DeviceMetrics::noop))
    }

    // ---------------------------------------------------------------- replay executables

    /// Registers a replay executable's slot for teardown (dead slots are pruned here).
    pub(crate) fn register_exec_slot(&self, slot: &std::sync::Arc<ExecSlot>) {
        let mut v = self.exec_slots.lock().unwrap_or_else(|e| e.into_inner());
        v.retain(|w| w.strong_count() > 0);
        v.push(std::sync::Arc::downgrade(slot));
    }

    /// Counts an executable just instantiated.
    pub(crate) fn exec_created(&self) {
        self.execs_live.fetch_add(1, Ordering::Relaxed);
    }

    /// Destroys an executable (on a bound worker of this device) and counts it.
    pub(crate) fn destroy_exec(&self, ctx: Ctx, e: GraphExec) {
        let _ = e.destroy(ctx);
        self.execs_live.fetch_sub(1, Ordering::Relaxed);
    }

    /// Replay executables instantiated on this device and not yet destroyed.
    pub(crate) fn execs_live(&self) -> usize {
        self.execs_live.load(Ordering::Relaxed)
    }

    pub(crate) fn ordinal(&self) -> i32 {
        self.info.ordinal
    }

    /// The primary context; only valid after a worker of the device has started.
    pub(crate) fn ctx(&self) -> Ctx {
        *self
            .ctx
            .get()
            .expect("device context used before any worker bound it")
    }

    /// Retains the primary context once per device (the first worker to start does it) and
    /// binds it to the calling thread. Returns the context. Fails once the device has been torn
    /// down: at a failed start, the other workers of the device may all have stopped (and
    /// released the context) before this one binds.
    pub(crate) fn bind_worker(&self) -> GpuResult<(Ctx, Arc<CudaContext>)> {
        let what = format!("device {}", self.info.ordinal);
        // Under the `primary` lock: the check, the retain and the count, against a teardown
        // (which takes the lock to count its worker out and to mark the device closed).
        let mut primary = self.primary.lock().unwrap_or_else(|e| e.into_inner());
        if self.closed.load(Ordering::Acquire) {
            return Err(GpuError::new(
                GpuErrorKind::Closed,
                format!("{what}: its other workers have stopped and released it (the pool is shutting down or failed to start)"),
            ));
        }
        let cuda = match &*primary {
            Some(c) => c.clone(),
            None => {
                let c = CudaContext::new(self.info.ordinal as usize)
                    .map_err(|e| GpuError::driver("cuDevicePrimaryCtxRetain", &what, e))?;
                // SAFETY: boundpool orders the work of different streams itself (GPU edges and
                // the release fence); no stream of this context relies on cudarc's events.
                unsafe { c.disable_event_tracking() };
                let _ = self.ctx.set(Ctx::of(&c));
                *primary = Some(c.clone());
                c
            }
        };
        let ctx = self.ctx();
        driver::ctx_set_current(ctx).map_err(|e| GpuError::driver("cuCtxSetCurrent", &what, e))?;
        self.partitions.make_contexts(ctx, self.dev, &what)?;
        match driver::ctx_current() {
            Ok(Some(c)) if c == ctx => {}
            Ok(other) => {
                return Err(GpuError::new(
                    GpuErrorKind::Driver,
                    format!(
                        "{what}: after cuCtxSetCurrent the current context is {other:?}, not the device's primary context"
                    ),
                ))
            }
            Err(e) => return Err(GpuError::driver("cuCtxGetCurrent", &what, e)),
        }
        self.live_workers.fetch_add(1, Ordering::SeqCst);
        drop(primary);
        Ok((ctx, cuda))
    }

    // ---------------------------------------------------------------- failure state

    pub(crate) fn failed(&self) -> Option<&str> {
        self.failed.get().map(String::as_str)
    }

    pub(crate) fn mark_failed(&self, why: String) {
        if self.failed.set(why).is_ok() {
            self.metrics().sticky_failures.increment(1);
        }
    }

    pub(crate) fn check_usable(&self) -> GpuResult<()> {
        if let Some(why) = self.failed() {
            return Err(GpuError::new(
                GpuErrorKind::DeviceFailed,
                format!("device {} failed earlier: {why}", self.info.ordinal),
            ));
        }
        if self.closed.load(Ordering::Acquire) {
            return Err(GpuError::new(
                GpuErrorKind::Closed,
                format!("device {}: its pool has shut down", self.info.ordinal),
            ));
        }
        Ok(())
    }

    /// Turns a driver error of a call made for node `what` into a [`GpuError`], marking the
    /// device failed when the error is sticky.
    pub(crate) fn driver_error(&self, call: &str, what: &str, e: driver::DriverError) -> GpuError {
        let err = GpuError::driver(call, what, e);
        if driver::is_sticky(e) {
            self.mark_failed(err.message().to_owned());
            return GpuError::new(
                GpuErrorKind::DeviceFailed,
                format!(
                    "{} (device {} is now marked failed)",
                    err.message(),
                    self.info.ordinal
                ),
            )
            .with_source(e);
        }
        err
    }

    /// A node body's error. When it is, or wraps, a sticky driver error (a cudarc call in the
    /// body that hit an illegal address, say), the device is marked failed as
    /// [`Self::driver_error`] marks it and the node fails with a `DeviceFailed` error naming
    /// `what` (the node); any other error is returned as it is.
    pub(crate) fn body_error(&self, what: &str, e: BoxError) -> BoxError {
        let gpu = e.downcast_ref::<GpuError>();
        if gpu.is_some_and(|g| g.kind() == GpuErrorKind::DeviceFailed) {
            // One of boundpool's own calls for this node: already marked.
            return e;
        }
        let Some(d) = driver::sticky_in(&*e) else {
            return e;
        };
        let why = match gpu {
            Some(g) => g.message().to_owned(),
            None if e.is::<driver::DriverError>() => {
                GpuError::driver("a driver call in its body", what, d)
                    .message()
                    .to_owned()
            }
            None => format!("{what}: {e} ({} underneath)", driver::error_name(d)),
        };
        self.mark_failed(why.clone());
        let msg = format!("{why} (device {} is now marked failed)", self.info.ordinal);
        Box::new(GpuError::new(GpuErrorKind::DeviceFailed, msg).with_source(e))
    }

    // ---------------------------------------------------------------- events

    /// An event from the table (created when the table is empty). Caller is a bound worker.
    pub(crate) fn take_event(&self) -> DResult<Event> {
        if let Some(e) = self.events.lock().unwrap_or_else(|e| e.into_inner()).pop() {
            return Ok(e);
        }
        let e = driver::event_create(self.ctx())?;
        self.events_created.fetch_add(1, Ordering::Relaxed);
        Ok(e)
    }

    /// Puts an event back; no driver call, any thread.
    pub(crate) fn put_event(&self, e: Event) {
        self.events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(e);
    }

    /// Whether this device's nodes can read `src`'s buffers in place: `src` is this device
    /// (another pool's table of it: one context), or the pair supports peer access and
    /// `src`'s memory pool granted it (asked once per pair, on a bound worker of this device).
    pub(crate) fn reads_in_place(&self, src: &DeviceShared) -> bool {
        if src.dev == self.dev {
            return true;
        }
        let mut known = self.peer_access.lock().unwrap_or_else(|e| e.into_inner());
        *known.entry(src.info.ordinal).or_insert_with(|| {
            driver::device_can_access_peer(self.dev, src.dev).unwrap_or(false)
                && driver::mempool_grant_access(self.ctx(), src.dev, self.dev).is_ok()
        })
    }

    /// The device's place in its NCCL communicator, if it has one (`None` without the `nccl`
    /// feature).
    pub(crate) fn nccl_info(&self) -> Option<NcclInfo> {
        #[cfg(feature = "nccl")]
        {
            self.nccl
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .as_ref()
                .map(|c| NcclInfo {
                    rank: c.rank,
                    world: c.world,
                })
        }
        #[cfg(not(feature = "nccl"))]
        None
    }

    pub(crate) fn events_created(&self) -> usize {
        self.events_created.load(Ordering::Relaxed)
    }

    // ---------------------------------------------------------------- streams

    /// Takes a worker's stream into the device's table (dropped by the device's last worker)
    /// and returns the view the worker enqueues on.
    pub(crate) fn register_stream(&self, s: Arc<CudaStream>) -> StreamRef {
        let view = StreamRef::of(&s);
        self.streams
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .push(s);
        view
    }

    /// The cudarc stream behind `view`, if it is one of this device's worker streams.
    pub(crate) fn cuda_stream(&self, view: StreamRef) -> Option<Arc<CudaStream>> {
        self.streams
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .find(|s| StreamRef::of(s) == view)
            .cloned()
    }

    /// Makes `own` wait for everything enqueued so far on `other`, another worker's stream of
    /// this device: records `e` (one of the calling worker's events) on `other` and waits on it.
    /// Needs no lock: a worker's stream lives until the device's last worker stops, so it
    /// outlives every node that can still name it.
    pub(crate) fn wait_for_stream(
        &self,
        own: StreamRef,
        other: StreamRef,
        e: &Event,
    ) -> DResult<()> {
        let ctx = self.ctx();
        driver::event_record(ctx, e, other).and_then(|_| driver::stream_wait_event(ctx, own, e))
    }

    // ---------------------------------------------------------------- release queue

    pub(crate) fn set_waker(&self, f: Box<dyn Fn() + Send + Sync>) {
        *self.waker.lock().unwrap_or_else(|e| e.into_inner()) = Some(Arc::from(f));
    }

    /// Queues a handle for release by a bound worker; no driver call, any thread.
    pub(crate) fn release(&self, r: Release) {
        if self.closed.load(Ordering::Acquire) {
            // The device's workers are gone (teardown freed what was queued).
            match r {
                Release::Slice(s, readers) => {
                    // No bound worker is left: cudarc frees it here (its slice keeps the
                    // context). Readers of other devices finished with the pool's graphs.
                    let bytes = s.bytes();
                    s.drop_here();
                    self.buffer_freed(bytes);
                    readers
                        .iter()
                        .flat_map(|r| r.take())
                        .for_each(ReaderFence::done);
                }
                Release::Pinned(a, cuda) => {
                    // As cudarc does for its slices: bind the context it keeps, free here
                    // (`cuMemFreeHost` synchronises: not during another thread's capture).
                    let _gate = self.gate.sync();
                    if cuda.bind_to_thread().is_ok() {
                        let _ = a.free(Ctx::of(&cuda));
                    }
                }
                Release::Exec(_) => {}
            }
            return;
        }
        self.releases
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(r);
        self.metrics().releases_queued.increment(1);
        if !self.release_pending.swap(true, Ordering::AcqRel) {
            if let Some(w) = &*self.waker.lock().unwrap_or_else(|e| e.into_inner()) {
                w();
            }
        }
    }

    pub(crate) fn has_pending_releases(&self) -> bool {
        self.release_pending.load(Ordering::Acquire)
    }

    /// Frees the queued handles. Runs on a bound worker (`own` is its stream): the worker first
    /// makes its stream wait for everything already enqueued on the device's other streams (a
    /// handle dropped anywhere was last used by work enqueued before the drop), then frees
    /// stream-ordered. When every stream of the device was idle before the drain and still is
    /// after it, it then synchronises its stream (at once: only the frees are queued there), so that the memory
    /// pool hands the freed memory back to the device (the default pool keeps nothing past a
    /// synchronise) and an idle device's free memory comes back. Returns how many were
    /// released.
    pub(crate) fn drain_releases(&self, own: StreamRef) -> usize {
        if !self.release_pending.swap(false, Ordering::AcqRel) {
            return 0;
        }
        let batch: Vec<Release> =
            std::mem::take(&mut *self.releases.lock().unwrap_or_else(|e| e.into_inner()));
        if batch.is_empty() {
            return 0;
        }
        let ctx = self.ctx();
        // Every registered stream lives until the device's last worker stops (which is after
        // this worker), so recording on them is safe.
        let mut fenced = true;
        let device_idle;
        {
            let streams = self.streams.read().unwrap_or_else(|e| e.into_inner());
            device_idle = streams
                .iter()
                .all(|s| driver::stream_query(ctx, StreamRef::of(s)).unwrap_or(false));
            for s in streams
                .iter()
                .map(|s| StreamRef::of(s))
                .filter(|&s| s != own)
            {
                let ok = self.take_event().and_then(|e| {
                    let r = driver::event_record(ctx, &e, s)
                        .and_then(|_| driver::stream_wait_event(ctx, own, &e));
                    self.put_event(e);
                    r
                });
                if ok.is_err() {
                    fenced = false;
                }
            }
        }
        let n = batch.len();
        // Host frees and a free without a fence synchronise the device: not while a stream of
        // another thread captures on it (`gate.rs`). Then they wait for a later drain, as
        // PyTorch's caching allocator defers its frees while a capture is under way.
        let needs_gate = !fenced || batch.iter().any(|r| matches!(r, Release::Pinned(..)));
        let gate = needs_gate.then(|| self.gate.try_sync()).flatten();
        let deferred = needs_gate && gate.is_none();
        let mut pinned = Vec::new();
        let mut later = Vec::new();
        for r in batch {
            match r {
                r @ (Release::Slice(..) | Release::Pinned(..)) if deferred && !fenced => {
                    later.push(r);
                }
                r @ Release::Pinned(..) if deferred => later.push(r),
                Release::Slice(s, Some(readers)) if readers.being_read() => {
                    // A body of another device reads it in place and has not recorded its
                    // fence yet: freed at a later drain.
                    later.push(Release::Slice(s, Some(readers)));
                }
                Release::Slice(s, readers) => {
                    let bytes = s.bytes();
                    // Readers on other devices: this stream waits for their events (of
                    // another context: allowed), so the free below follows their reads.
                    let mut waited = true;
                    for f in readers.iter().flat_map(|r| r.take()) {
                        waited &= driver::stream_wait_event(ctx, own, &f.event).is_ok();
                        f.done();
                    }
                    // SAFETY: the slice was allocated in this device's context (checked when
                    // it became a `DeviceBuffer`) and is taken apart here: freed once.
                    let a = unsafe { DeviceAlloc::adopt(s.leak()) };
                    if !waited {
                        // A reader's read may still be in flight and nothing orders the free
                        // after it: the memory is leaked rather than reused under it.
                        self.buffer_freed(bytes);
                        let _ = a.into_raw();
                        continue;
                    }
                    let _ = if fenced {
                        a.free_async(ctx, own)
                    } else {
                        a.free(ctx)
                    };
                    self.buffer_freed(bytes);
                }
                // An in-flight launch finishes first (the driver defers the free).
                Release::Exec(e) => self.destroy_exec(ctx, e),
                Release::Pinned(a, _) => pinned.push(a),
            }
        }
        if !pinned.is_empty() {
            // Host memory is freed at once, not in stream order: wait (fenced) for the copies
            // that may still use it. Rare: pinned buffers live as long as replay instances.
            let done = fenced && driver::stream_synchronize(ctx, own).is_ok();
            let _ = if done {
                Ok(())
            } else {
                driver::ctx_synchronize(ctx)
            };
            for a in pinned {
                let _ = a.free(ctx);
            }
        }
        drop(gate);
        let n = n - later.len();
        self.metrics().releases_done.increment(n as u64);
        if !later.is_empty() {
            self.releases
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .extend(later);
            self.release_pending.store(true, Ordering::Release);
            if deferred {
                // Asked back when the capture ends: the flag stays up, so a later drop would
                // not wake a worker, and an idle pool would keep the deferred frees.
                if let Some(w) = &*self.waker.lock().unwrap_or_else(|e| e.into_inner()) {
                    self.gate.wake_after_captures(Arc::downgrade(w));
                }
            }
        }
        // Look again before blocking: work another worker enqueued since the first look (before
        // the fence events were recorded) would make this worker wait for it. A stream idle now
        // has finished everything the fence waits for, so the synchronise returns at once.
        if device_idle && fenced && self.other_streams_idle(own) {
            let _ = driver::stream_synchronize(ctx, own);
        }
        n
    }

    fn other_streams_idle(&self, own: StreamRef) -> bool {
        let ctx = self.ctx();
        let streams = self.streams.read().unwrap_or_else(|e| e.into_inner());
        streams
            .iter()
            .map(|s| StreamRef::of(s))
            .filter(|&s| s != own)
            .all(|s| driver::stream_query(ctx, s).unwrap_or(false))
    }

    /// Counts a new [`DeviceBuffer`](crate::DeviceBuffer) of `bytes`.
    pub(crate) fn buffer_made(&self, bytes: usize) {
        self.live_buffers.fetch_add(1, Ordering::Relaxed);
        self.live_bytes.fetch_add(bytes, Ordering::Relaxed);
        let m = self.metrics();
        m.live_buffers.increment(1.0);
        m.live_bytes.increment(bytes as f64);
    }

    /// Counts a buffer freed (or handed back to cudarc as a `CudaSlice`).
    pub(crate) fn buffer_freed(&self, bytes: usize) {
        self.live_buffers.fetch_sub(1, Ordering::Relaxed);
        self.live_bytes.fetch_sub(bytes, Ordering::Relaxed);
        let m = self.metrics();
        m.live_buffers.decrement(1.0);
        m.live_bytes.decrement(bytes as f64);
    }

    pub(crate) fn live_allocations(&self) -> usize {
        self.live_buffers.load(Ordering::Relaxed)
    }

    pub(crate) fn live_bytes(&self) -> usize {
        self.live_bytes.load(Ordering::Relaxed)
    }

    // ---------------------------------------------------------------- modules

    /// The function of `k` on this device, loading its module on first use (`cuda` is this
    /// device's context, bound to the calling worker).
    pub(crate) fn function(&self, cuda: &Arc<CudaContext>, k: &Kernel) -> GpuResult<CudaFunction> {
        if let Some(f) = self
            .functions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&k.inner.id)
        {
            return Ok(f.clone());
        }
        let ctx = self.ctx();
        let m = &k.inner.module.inner;
        let mut mods = self.modules.lock().unwrap_or_else(|e| e.into_inner());
        let module = match mods.entry(m.id) {
            std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => {
                let r = driver::module_load(ctx, cuda, m.ptx.clone()).map_err(|e| {
                    GpuError::driver(
                        "cuModuleLoadData",
                        &format!("device {}: module '{}'", self.info.ordinal, m.name),
                        e,
                    )
                })?;
                v.insert(r)
            }
        };
        let f = driver::module_function(ctx, module, &k.inner.name);
        drop(mods);
        let f = f.map_err(|e| {
            let err = GpuError::driver(
                "cuModuleGetFunction",
                &format!(
                    "device {}: kernel '{}' of module '{}'",
                    self.info.ordinal,
                    k.name(),
                    m.name
                ),
                e,
            );
            GpuError::new(GpuErrorKind::Compile, err.message().to_owned()).with_source(e)
        })?;
        self.functions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(k.inner.id, f.clone());
        Ok(f)
    }

    // ---------------------------------------------------------------- teardown

    /// Called by each worker as it stops. Its stream stays (idle) until the device's last
    /// worker stops, so that a node still running on another worker may record on it; the last
    /// worker destroys every stream, frees what is left and releases the primary context.
    pub(crate) fn worker_stopped(&self, own: StreamRef) {
        let ctx = self.ctx();
        self.drain_releases(own);
        if self.failed().is_none() {
            let _ = driver::stream_synchronize(ctx, own);
        }
        self.worker_stopped_without_stream();
    }

    /// Teardown of a worker that has no stream (its creation failed), and the common tail.
    pub(crate) fn worker_stopped_without_stream(&self) {
        let ctx = self.ctx();
        let failed = self.failed().is_some();
        {
            // With `bind_worker`'s lock: a worker binding now either counted itself before
            // (this is not the last) or sees the device closed and does not use it.
            let _bind = self.primary.lock().unwrap_or_else(|e| e.into_inner());
            if self.live_workers.fetch_sub(1, Ordering::SeqCst) != 1 {
                return;
            }
            // Last worker of this device.
            self.closed.store(true, Ordering::Release);
        }
        drop(self.waker.lock().unwrap_or_else(|e| e.into_inner()).take());
        if !failed {
            let _ = driver::ctx_synchronize(ctx);
        }
        // Everything still allocated: queued releases and buffers whose owners outlive the
        // pool (their later drop does nothing). Replay executables: those queued, and those
        // still owned (their owners' later drop finds the slot empty).
        let queued = std::mem::take(&mut *self.releases.lock().unwrap_or_else(|e| e.into_inner()));
        self.metrics().releases_done.increment(queued.len() as u64);
        for r in queued {
            match r {
                Release::Exec(e) => self.destroy_exec(ctx, e),
                // After the context's synchronise above (or a failed device): nothing runs.
                Release::Pinned(a, _) => {
                    let _ = a.free(ctx);
                }
                Release::Slice(s, readers) => {
                    let bytes = s.bytes();
                    // SAFETY: as in `drain_releases`: this device's allocation, freed once.
                    let _ = unsafe { DeviceAlloc::adopt(s.leak()) }.free(ctx);
                    self.buffer_freed(bytes);
                    // The pool's graphs are done: so are their reads on other devices.
                    readers
                        .iter()
                        .flat_map(|r| r.take())
                        .for_each(ReaderFence::done);
                }
            }
        }
        let slots = std::mem::take(&mut *self.exec_slots.lock().unwrap_or_else(|e| e.into_inner()));
        for s in slots.iter().filter_map(Weak::upgrade) {
            if let Some(e) = s.take() {
                self.destroy_exec(ctx, e);
            }
        }
        // The NCCL communicator, before its stream goes with the others below.
        #[cfg(feature = "nccl")]
        if let Some(c) = self.nccl.lock().unwrap_or_else(|e| e.into_inner()).take() {
            c.abort();
        }
        // Buffers still held keep their memory (and, through their `CudaSlice`, their stream
        // and the context): freed when their owner drops them, on that thread (cudarc's rule:
        // no bound worker is left). Every worker has stopped: no node, marker or hook can use a
        // view of these streams any more; each is destroyed now unless something still holds it.
        drop(std::mem::take(
            &mut *self.streams.write().unwrap_or_else(|e| e.into_inner()),
        ));
        // The partitions' streams (those no clone holds) and green contexts.
        self.partitions.teardown(ctx, failed);
        for e in std::mem::take(&mut *self.events.lock().unwrap_or_else(|e| e.into_inner())) {
            let _ = e.destroy(ctx);
        }
        if let Some(t) = &self.timing {
            t.destroy(ctx);
        }
        // Every worker dropped its functions as it stopped: with the table's functions gone,
        // the table's module `Arc`s are the last ones, and cudarc unloads each here.
        drop(std::mem::take(
            &mut *self.functions.lock().unwrap_or_else(|e| e.into_inner()),
        ));
        for (_, m) in std::mem::take(&mut *self.modules.lock().unwrap_or_else(|e| e.into_inner())) {
            driver::module_release(ctx, m);
        }
        if !failed {
            let _ = driver::ctx_synchronize(ctx);
            let _ = driver::mempool_trim(ctx, self.dev);
        }
        // cudarc's drop binds the context to release it: unbind after.
        drop(
            self.primary
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take(),
        );
        let _ = driver::ctx_unbind();
    }
}

/// One device of a [`GpuPool`](crate::GpuPool): where to place its nodes, and its state.
#[derive(Clone)]
pub struct GpuDevice {
    pub(crate) shared: Arc<DeviceShared>,
    pub(crate) groups: Vec<GroupId>,
    pub(crate) placement: Placement,
    pub(crate) partitions: Vec<PartitionInfo>,
}

impl fmt::Debug for GpuDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GpuDevice")
            .field("ordinal", &self.shared.ordinal())
            .field("groups", &self.groups)
            .field("placement", &self.placement)
            .field("partitions", &self.partitions)
            .field("failed", &self.shared.failed())
            .finish()
    }
}

impl GpuDevice {
    /// The CUDA ordinal.
    pub fn ordinal(&self) -> i32 {
        self.shared.ordinal()
    }
    /// Name, bus id, memory, local cores.
    pub fn info(&self) -> &DeviceInfo {
        &self.shared.info
    }
    /// The device as a placement: any of its workers, whatever the number of groups they form
    /// (the device's group when it has one, else the scheduler domain over its groups). This
    /// is where [`GpuGraphExt::gpu_node`](crate::GpuGraphExt::gpu_node) places its nodes; pass it to
    /// [`GraphBuilder::place`](boundpool_scheduler::GraphBuilder::place) for other nodes that
    /// need the device's context.
    pub fn placement(&self) -> Placement {
        self.placement
    }
    /// The device's first worker group: only that group's workers (with
    /// [`GpuPoolBuilder::groups_per_device`](crate::GpuPoolBuilder::groups_per_device) above 1, part of the device's workers). To mean
    /// the whole device, use [`placement`](Self::placement).
    pub fn group(&self) -> GroupId {
        self.groups[0]
    }
    /// All of the device's groups (more than one with
    /// [`GpuPoolBuilder::groups_per_device`](crate::GpuPoolBuilder::groups_per_device)).
    pub fn groups(&self) -> &[GroupId] {
        &self.groups
    }
    /// The device's SM partitions, in the order asked
    /// ([`GpuPoolBuilder::sm_partitions`](crate::GpuPoolBuilder::sm_partitions)), each with
    /// the SMs the driver gave it and its worker group; empty when not partitioned.
    pub fn partitions(&self) -> &[PartitionInfo] {
        &self.partitions
    }
    /// The SM partition named `name`.
    pub fn partition(&self, name: &str) -> Option<&PartitionInfo> {
        self.partitions.iter().find(|p| p.name == name)
    }
    /// This device as seen from its SM partition `name`: nodes made with the returned
    /// `GpuDevice` ([`GpuGraphExt::gpu_node`](crate::GpuGraphExt::gpu_node),
    /// [`ReplayBuilder::gpu_node`](crate::ReplayBuilder::gpu_node), [`GpuPool::call`](crate::GpuPool::call))
    /// run on the partition's workers, their work on its SMs. `None` when there is no such
    /// partition.
    pub fn on_partition(&self, name: &str) -> Option<GpuDevice> {
        let p = self.partition(name)?;
        Some(GpuDevice {
            shared: self.shared.clone(),
            groups: vec![p.group],
            placement: p.placement(),
            partitions: self.partitions.clone(),
        })
    }
    /// SMs that no partition got (partitions were asked for without a
    /// [`rest`](crate::SmPartition::rest) one): no worker's stream runs on them.
    pub fn unused_sms(&self) -> u32 {
        self.shared.partitions.unused_sms
    }
    /// Whether a node placed on `p` runs on this device's workers.
    pub(crate) fn serves(&self, p: Placement) -> bool {
        match p {
            Placement::Group(g) => self.groups.contains(&g),
            Placement::Domain(_) => p == self.placement,
            Placement::Any => false,
        }
    }
    /// The device's place in its NCCL communicator, once a node made it
    /// (`GpuCtx::nccl_init`, feature `nccl`).
    pub fn nccl(&self) -> Option<NcclInfo> {
        self.shared.nccl_info()
    }

    /// Why the device was marked failed (a sticky error), if it was.
    pub fn failure(&self) -> Option<String> {
        self.shared.failed().map(str::to_owned)
    }
    /// Device buffers ([`DeviceBuffer`](crate::DeviceBuffer)s) of this pool not yet freed.
    pub fn live_allocations(&self) -> usize {
        self.shared.live_allocations()
    }
    /// The bytes of those buffers.
    pub fn live_bytes(&self) -> usize {
        self.shared.live_bytes()
    }
    /// Events created so far for the device's event table (the table recycles them).
    pub fn events_created(&self) -> usize {
        self.shared.events_created()
    }
    /// Replay executables (`Replayable`) instantiated on this device and not yet destroyed
    /// (a dropped one is destroyed by a worker of the device, soon after the drop).
    pub fn replay_executables(&self) -> usize {
        self.shared.execs_live()
    }
    /// Timing events created so far for the trace's GPU stream tracks (recycled; always 0
    /// when the pool does not record a trace).
    pub fn timing_events_created(&self) -> usize {
        self.shared
            .timing
            .as_ref()
            .map_or(0, |t| t.events_created())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cudarc::driver::sys::CUresult;

    fn device() -> DeviceShared {
        let info = DeviceInfo {
            ordinal: 3,
            name: "test".into(),
            pci_bus_id: String::new(),
            total_memory: 0,
            sms: 0,
            local_cores: Vec::new(),
        };
        DeviceShared::new(info, Dev::for_test(), false)
    }

    /// A cudarc `DriverError` from a node's body that is sticky marks the device failed, as
    /// boundpool's own calls do, and fails the node with a `DeviceFailed` error naming it; a
    /// sticky one inside a `GpuError` too. No driver call (runs without a GPU).
    #[test]
    fn sticky_body_errors_mark_the_device_failed() {
        let d = device();
        let what = "node 'k' of graph 'g' on device 3";
        let e = d.body_error(
            what,
            Box::new(driver::DriverError(CUresult::CUDA_ERROR_ILLEGAL_ADDRESS)),
        );
        let g = e.downcast_ref::<GpuError>().expect("a GpuError");
        assert_eq!(g.kind(), GpuErrorKind::DeviceFailed);
        assert!(g.message().starts_with(what), "{}", g.message());
        assert!(g.message().contains("ILLEGAL_ADDRESS"), "{}", g.message());
        assert!(g.message().ends_with("(device 3 is now marked failed)"));
        let why = d.failed().expect("marked failed");
        assert!(
            why.contains("ILLEGAL_ADDRESS") && why.starts_with(what),
            "{why}"
        );
        assert!(d.check_usable().is_err());

        let d = device();
        let inner = GpuError::driver(
            "cuMemcpyDtoHAsync",
            what,
            driver::DriverError(CUresult::CUDA_ERROR_LAUNCH_FAILED),
        );
        let e = d.body_error(what, Box::new(inner));
        let g = e.downcast_ref::<GpuError>().expect("a GpuError");
        assert_eq!(g.kind(), GpuErrorKind::DeviceFailed);
        assert!(d.failed().is_some_and(|w| w.contains("LAUNCH_FAILED")));
    }

    /// Other body errors (not sticky, or not the driver's) leave the device usable and come
    /// back unchanged.
    #[test]
    fn other_body_errors_leave_the_device_usable() {
        let d = device();
        let e = d.body_error(
            "n",
            Box::new(driver::DriverError(CUresult::CUDA_ERROR_OUT_OF_MEMORY)),
        );
        assert!(e.is::<driver::DriverError>());
        let e = d.body_error("n", "a host error".into());
        assert_eq!(e.to_string(), "a host error");
        assert!(d.failed().is_none());
    }
}
