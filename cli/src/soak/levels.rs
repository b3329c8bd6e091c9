//! The soak's levels: resident memory and, with `--gpu`, the device's free memory, live
//! allocations and event table, read at the start, after the warm-up and at the end; and the
//! checks at the end that the OS threads and these levels are back where they were.

use std::time::{Duration, Instant};

use super::gpu::GpuSide;
use super::tally::Tally;
use crate::process::{os_threads, rss_bytes};

/// Resident memory may end this much above its level after the warm-up. The allocator keeps
/// freed memory in per-thread arenas (glibc: up to 8 per core) and returns it to the OS only
/// when an arena's top is free, so the level moves by a few MiB with the last burst; a leak of
/// one allocation a graph grows by far more over the millions of graphs a soak runs.
const RSS_TOLERANCE_BYTES: u64 = 64 << 20;
/// Device free memory may end this much below its level after the warm-up (the driver's own
/// bookkeeping; the pool frees every buffer once dropped).
const DEVICE_TOLERANCE_BYTES: usize = 64 << 20;

/// The device's levels.
#[derive(Clone, Copy, Debug)]
pub(super) struct DeviceLevel {
    /// Free memory, bytes (none if it could not be read).
    pub(super) free: Option<usize>,
    pub(super) live: usize,
    pub(super) events: usize,
}

impl DeviceLevel {
    pub(super) fn now(g: &GpuSide) -> Self {
        DeviceLevel {
            free: g.pool.call(&g.device, |ctx| Ok(ctx.memory_info()?.0)).ok(),
            live: g.device.live_allocations(),
            events: g.device.events_created(),
        }
    }
}

/// Resident memory and the device's levels at one moment.
#[derive(Clone, Copy, Debug)]
pub(super) struct Levels {
    pub(super) rss: Option<u64>,
    pub(super) device: Option<DeviceLevel>,
}

impl Levels {
    pub(super) fn now(gpu: Option<&GpuSide>) -> Self {
        Levels {
            rss: rss_bytes(),
            device: gpu.map(DeviceLevel::now),
        }
    }
}

/// What the checks at the end read.
pub(super) struct End {
    pub(super) threads: usize,
    pub(super) levels: Levels,
}

/// The checks at the end: the OS threads back to `base_threads` (main + `workers`, and with a
/// GPU the driver's), resident memory within its tolerance of `warm`, and with `gpu` the
/// device's allocations released, its free memory back, its event table not grown, and the
/// device not failed. Every failure is a violation in `tally`.
pub(super) fn check_end(
    tally: &Tally,
    base_threads: usize,
    workers: usize,
    gpu: Option<&GpuSide>,
    start: &Levels,
    warm: &Levels,
) -> End {
    if base_threads != 1 + workers && gpu.is_none() {
        tally.violation(format!(
            "{base_threads} OS threads before the submitters, expected main + {workers} workers"
        ));
    }
    let threads = check_threads(tally, base_threads);
    let rss = rss_bytes();
    if let (Some(w), Some(e)) = (warm.rss, rss) {
        if e > w + RSS_TOLERANCE_BYTES {
            tally.violation(format!(
                "resident memory {} MiB at the end, {} MiB after the warm-up (tolerance {} MiB)",
                e >> 20,
                w >> 20,
                RSS_TOLERANCE_BYTES >> 20
            ));
        }
    }
    let device = gpu.map(|g| {
        let start = start.device.expect("measured with the pool");
        check_device(tally, g, &start, &warm.device.unwrap_or(start))
    });
    End {
        threads,
        levels: Levels { rss, device },
    }
}

/// The OS threads once the submitters are joined, which must be `base_threads` again.
fn check_threads(tally: &Tally, base_threads: usize) -> usize {
    // A scoped thread is joined once its closure returned, a moment before its OS thread exits.
    let t = Instant::now();
    let mut end = os_threads().unwrap_or(0);
    while end != base_threads && t.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(1));
        end = os_threads().unwrap_or(0);
    }
    if end != base_threads {
        tally.violation(format!(
            "{end} OS threads after the submitters were joined, {base_threads} before"
        ));
    }
    end
}

/// The device after the last graph: buffers dropped on the submitters are released by its
/// workers; give them a moment, then compare with the levels after the warm-up.
fn check_device(
    tally: &Tally,
    g: &GpuSide,
    start: &DeviceLevel,
    warm: &DeviceLevel,
) -> DeviceLevel {
    // Nothing the soak made is held now: every buffer was dropped (on the submitters), and
    // the device's idle workers must release them without another graph to wake them, so
    // the count is polled without submitting anything (the issue-9 deadline is 1 ms; 2 s
    // here is a hang guard).
    let t = Instant::now();
    while g.device.live_allocations() != 0 && t.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(1));
    }
    let idle_live = g.device.live_allocations();
    if idle_live != 0 {
        tally.violation(format!(
            "{idle_live} device allocations still live {:?} after the last graph, with the workers idle ({} after the warm-up)",
            t.elapsed(),
            start.live
        ));
    }
    let below = |end: &DeviceLevel| {
        end.free
            .zip(warm.free)
            .is_some_and(|(e, w)| e + DEVICE_TOLERANCE_BYTES < w)
    };
    let t = Instant::now();
    let mut end = DeviceLevel::now(g);
    while below(&end) && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(10));
        end = DeviceLevel::now(g);
    }
    if end.live != 0 {
        tally.violation(format!("{} device allocations live at the end", end.live));
    }
    match (end.free, warm.free) {
        (Some(e), Some(w)) if e + DEVICE_TOLERANCE_BYTES < w => tally.violation(format!(
            "device free memory {} MiB at the end, {} MiB after the warm-up (tolerance {} MiB)",
            e >> 20,
            w >> 20,
            DEVICE_TOLERANCE_BYTES >> 20
        )),
        (Some(_), Some(_)) => {}
        _ => tally.violation("the device's free memory could not be read".into()),
    }
    // Events are recycled: after the warm-up the table may grow a little (a burst), not with
    // the number of graphs.
    let grown = end.events.saturating_sub(warm.events);
    if grown > warm.events.saturating_sub(start.events) + 64 {
        tally.violation(format!(
            "the event table grew by {grown} after the warm-up ({} at the start, {} after the warm-up, {} at the end)",
            start.events, warm.events, end.events
        ));
    }
    if let Some(why) = g.device.failure() {
        tally.violation(format!("the device failed: {why}"));
    }
    end
}
