//! SM partitions on the driver (CUDA 12.5+): a device's SM resource, its split into disjoint
//! partitions, a green context per partition and the streams made in it.
//!
//! Workers keep the device's primary context bound; only their *streams* belong to a green
//! context (`cuGreenCtxStreamCreate`), and work enqueued on such a stream runs on the
//! partition's SMs whichever context is current (seen on the device machine: a launch from a
//! module of the primary context on a green stream used exactly the partition's SMs; a graph
//! captured on one kept them wherever it was launched). So modules, events, memory and the
//! library handles stay the primary context's, and a green context is never current on any
//! thread (the driver allows one thread at a time to have it current, which several workers
//! of a partition could not share).

use std::cell::Cell;
use std::mem::MaybeUninit;
use std::sync::Arc;

use cudarc::driver::{sys, CudaContext, CudaStream};

use super::{check, Ctx, DResult, Dev, StreamRef, CHECK, WRONG, WRONG_SAMPLES};
use std::sync::atomic::Ordering;

/// The oldest driver with everything used here (`cuGreenCtxStreamCreate` came with 12.5).
pub(crate) const GREEN_MIN_DRIVER: i32 = 12050;

/// What a device's SMs allow: how many, the smallest partition and the step between sizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SmLimits {
    pub(crate) count: u32,
    pub(crate) min_partition: u32,
    pub(crate) alignment: u32,
}

/// A set of SMs as the driver describes it (a resource of type SM): plain data, no driver state.
#[derive(Clone, Copy)]
pub(crate) struct SmSet(sys::CUdevResource);

impl SmSet {
    pub(crate) fn count(&self) -> u32 {
        // SAFETY: every `SmSet` holds a resource of type SM, whose union member is `sm`.
        unsafe { self.0.__bindgen_anon_1.sm.smCount }
    }
}

// SAFETY: a resource is a plain description (counts and an opaque padding the driver reads);
// it points at nothing this process owns.
unsafe impl Send for SmSet {}
// SAFETY: as above; shared references only read it.
unsafe impl Sync for SmSet {}

/// The device's SMs and their partitioning limits (`cuDeviceGetDevResource`; needs `cuInit`
/// only, no context).
pub(crate) fn device_sms(dev: Dev) -> DResult<(SmSet, SmLimits)> {
    let mut r = MaybeUninit::<sys::CUdevResource>::zeroed();
    // SAFETY: writes one resource description.
    let r = unsafe {
        sys::cuDeviceGetDevResource(
            dev.0,
            r.as_mut_ptr(),
            sys::CUdevResourceType::CU_DEV_RESOURCE_TYPE_SM,
        )
        .result()?;
        r.assume_init()
    };
    // SAFETY: a resource of type SM (asked for above) uses the `sm` member.
    let sm = unsafe { r.__bindgen_anon_1.sm };
    Ok((
        SmSet(r),
        SmLimits {
            count: sm.smCount,
            min_partition: sm.minSmPartitionSize.max(1),
            alignment: sm.smCoscheduledAlignment.max(1),
        },
    ))
}

/// Splits `all` into up to `groups` groups of `unit` SMs and what remains, in one
/// `cuDevSmResourceSplitByCount` (the pieces of one split can be joined into one partition;
/// a remainder cannot be split again). The driver may make fewer groups, or rounder ones:
/// callers compare.
pub(crate) fn split(all: &SmSet, unit: u32, groups: u32) -> DResult<(Vec<SmSet>, SmSet)> {
    let mut out = vec![all.0; groups.max(1) as usize];
    let mut rest = MaybeUninit::<sys::CUdevResource>::zeroed();
    let mut n: std::ffi::c_uint = groups.max(1);
    // SAFETY: `out` has room for `n` resources, the call writes at most `n` (and sets `n` to
    // how many) and one into `rest`; `all` is a resource of type SM.
    unsafe {
        sys::cuDevSmResourceSplitByCount(
            out.as_mut_ptr(),
            &mut n,
            &all.0,
            rest.as_mut_ptr(),
            0,
            unit,
        )
        .result()?;
        out.truncate(n as usize);
        Ok((
            out.into_iter().map(SmSet).collect(),
            SmSet(rest.assume_init()),
        ))
    }
}

/// A descriptor of some pieces of one split (`cuDevResourceGenerateDesc`), valid for the
/// process's life, with their SM count: what a green context is made from.
pub(crate) struct SmDesc {
    desc: sys::CUdevResourceDesc,
    sms: u32,
}

// SAFETY: a descriptor is an opaque handle the driver keeps for the process's life and only
// reads; any thread may pass it to `cuGreenCtxCreate`.
unsafe impl Send for SmDesc {}
// SAFETY: as above.
unsafe impl Sync for SmDesc {}

impl SmDesc {
    /// The descriptor of `pieces` (outputs of one [`split`]).
    pub(crate) fn of(pieces: &[SmSet]) -> DResult<SmDesc> {
        let mut raw: Vec<sys::CUdevResource> = pieces.iter().map(|p| p.0).collect();
        let mut desc = MaybeUninit::<sys::CUdevResourceDesc>::uninit();
        // SAFETY: reads `raw.len()` resources and writes one descriptor.
        let desc = unsafe {
            sys::cuDevResourceGenerateDesc(desc.as_mut_ptr(), raw.as_mut_ptr(), raw.len() as u32)
                .result()?;
            desc.assume_init()
        };
        Ok(SmDesc {
            desc,
            sms: pieces.iter().map(SmSet::count).sum(),
        })
    }

    pub(crate) fn sms(&self) -> u32 {
        self.sms
    }
}

/// A green context over a set of SMs, owned: destroyed once by [`GreenCtx::destroy`]. Never
/// made current (see the module's docs): only its streams are used.
#[derive(Debug)]
pub(crate) struct GreenCtx(sys::CUgreenCtx);

// SAFETY: a green context handle is an identifier the driver lets any thread use; this crate
// makes streams from it on bound workers and destroys it by value on the device's last one.
unsafe impl Send for GreenCtx {}
// SAFETY: as above; shared references only read the handle.
unsafe impl Sync for GreenCtx {}

/// A stream of a green context, owned: destroyed once by [`GreenStream::destroy`]. Node bodies
/// see it as a borrowed cudarc `CudaStream` (which never destroys it), made by the caller.
#[derive(Debug)]
pub(crate) struct GreenStream(sys::CUstream);

// SAFETY: as for `GreenCtx`.
unsafe impl Send for GreenStream {}
// SAFETY: as for `GreenCtx`.
unsafe impl Sync for GreenStream {}

impl GreenCtx {
    /// A green context over `sms` (`cuGreenCtxCreate`; it retains the primary context until
    /// destroyed). Called with the primary context current.
    pub(crate) fn create(expect: Ctx, dev: Dev, sms: &SmDesc) -> DResult<GreenCtx> {
        check(expect, "cuGreenCtxCreate");
        let mut g = MaybeUninit::<sys::CUgreenCtx>::uninit();
        // SAFETY: writes one handle on success; the descriptor is live for the process.
        unsafe {
            sys::cuGreenCtxCreate(
                g.as_mut_ptr(),
                sms.desc,
                dev.0,
                sys::CUgreenCtxCreate_flags::CU_GREEN_CTX_DEFAULT_STREAM as u32,
            )
            .result()?;
            Ok(GreenCtx(g.assume_init()))
        }
    }

    /// The SMs the driver gave this context (`cuGreenCtxGetDevResource`).
    pub(crate) fn sm_count(&self) -> DResult<u32> {
        let mut r = MaybeUninit::<sys::CUdevResource>::zeroed();
        // SAFETY: writes one resource of type SM for a live green context.
        unsafe {
            sys::cuGreenCtxGetDevResource(
                self.0,
                r.as_mut_ptr(),
                sys::CUdevResourceType::CU_DEV_RESOURCE_TYPE_SM,
            )
            .result()?;
            Ok(r.assume_init().__bindgen_anon_1.sm.smCount)
        }
    }

    /// A non-blocking stream of this context at `priority` (`cuGreenCtxStreamCreate`, which
    /// ignores the current context).
    pub(crate) fn stream(&self, expect: Ctx, priority: i32) -> DResult<GreenStream> {
        check(expect, "cuGreenCtxStreamCreate");
        let mut s = MaybeUninit::<sys::CUstream>::uninit();
        // SAFETY: writes one stream handle for a live green context.
        unsafe {
            sys::cuGreenCtxStreamCreate(
                s.as_mut_ptr(),
                self.0,
                sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32,
                priority,
            )
            .result()?;
            Ok(GreenStream(s.assume_init()))
        }
    }

    /// What the partition check compares a stream's green context with.
    pub(crate) fn id(&self) -> usize {
        self.0 as usize
    }

    /// `cuGreenCtxDestroy` (releases its retain of the primary context). Its streams must have
    /// been destroyed first.
    pub(crate) fn destroy(self, expect: Ctx) -> DResult<()> {
        check(expect, "cuGreenCtxDestroy");
        // SAFETY: `self` is owned and consumed here: destroyed once.
        unsafe { sys::cuGreenCtxDestroy(self.0).result() }
    }
}

impl GreenStream {
    /// The stream as cudarc's type, borrowed: cudarc never destroys it (its owner does, once
    /// no clone of the returned `Arc` is left; see `partition.rs`).
    pub(crate) fn borrowed(&self, cuda: &Arc<CudaContext>) -> Arc<CudaStream> {
        // SAFETY: the stream is live and of `cuda`'s device: a green context of `cuda`'s
        // primary context, whose streams the driver runs with that primary context current
        // (launches, stream-ordered allocations and cuBLAS were seen to work so), which is
        // the context cudarc binds for it. Its owner destroys it only once the returned `Arc`
        // and every clone are gone (one kept past the pool leaves it undestroyed). Work on it
        // is ordered by boundpool's edges, as on every worker stream.
        unsafe { cuda.wrap_borrowed_stream(self.0) }
    }

    /// A view of it.
    pub(crate) fn view(&self) -> StreamRef {
        StreamRef(self.0)
    }

    /// Waits for its work, then `cuStreamDestroy`.
    pub(crate) fn destroy(self, expect: Ctx) -> DResult<()> {
        check(expect, "cuStreamDestroy");
        // SAFETY: `self` is owned and consumed here: destroyed once; the driver frees it once
        // the work already enqueued is done.
        unsafe { sys::cuStreamDestroy_v2(self.0).result() }
    }
}

// ----------------------------------------------------------------------------------------------
// The partition check: which green context a thread's work must go to.

thread_local! {
    /// The green context this thread's work goes to: `None` for a thread that checks nothing
    /// (no partitioned device), `Some(0)` for a worker of a partitioned device outside its
    /// partitions, `Some(id)` for a partition's worker.
    static EXPECTED: Cell<Option<usize>> = const { Cell::new(None) };
}

/// Declares, for the calling worker (for life), the green context its work must go to (see
/// `EXPECTED`).
pub(crate) fn expect_partition(green: Option<usize>) {
    EXPECTED.with(|e| e.set(green));
}

/// With context checking on, on a worker of a partitioned device: counts `call` as wrong when
/// `s` is not a stream of the worker's partition (or, outside partitions, is one of a
/// partition's), which would run the work on SMs reserved for others.
#[inline]
pub(crate) fn check_partition(s: StreamRef, call: &'static str) {
    if !CHECK.load(Ordering::Relaxed) {
        return;
    }
    let Some(expected) = EXPECTED.with(Cell::get) else {
        return;
    };
    let mut g = MaybeUninit::<sys::CUgreenCtx>::uninit();
    // SAFETY: writes one green context handle (null for a stream of no green context).
    let got = unsafe { sys::cuStreamGetGreenCtx(s.0, g.as_mut_ptr()).result() }
        // SAFETY: written by the successful call.
        .map(|()| unsafe { g.assume_init() } as usize);
    if got != Ok(expected) {
        WRONG.fetch_add(1, Ordering::SeqCst);
        if let Ok(mut v) = WRONG_SAMPLES.lock() {
            if v.len() < 32 {
                v.push(format!(
                    "{call} on thread {:?} enqueued on a stream of green context {:?}, expected {expected:#x} (0: none)",
                    std::thread::current().name().unwrap_or("<unnamed>"),
                    got.map(|g| format!("{g:#x}")),
                ));
            }
        }
    }
}
