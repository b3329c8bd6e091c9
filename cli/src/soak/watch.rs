//! The soak's watch on the process's OS threads: sampled every 20 ms from the main thread, the
//! threads listed at the start (main, the workers, the driver's, the submitters) must all stay,
//! and every other one must be a short-lived pool's worker.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::tally::Tally;
use crate::process::thread_ids;

/// The name of the short-lived pools' worker threads.
pub(super) const CANCEL_POOL_THREAD: &str = "soak-cancel";

/// How long a short-lived pool's thread may stay listed after its stop hook ran: the thread
/// still unwinds its stack and frees its thread-locals, and the kernel removes it from
/// `/proc/self/task` a moment after it woke its joiner (on a loaded machine, milliseconds).
const EXIT_GRACE: Duration = Duration::from_secs(1);

/// The short-lived pools' worker threads by id: registered by each worker's start hook, and
/// marked with the time its stop hook ran (the thread is about to exit).
#[derive(Default)]
pub(super) struct ExtraThreads {
    threads: Mutex<HashMap<u32, Option<Instant>>>,
    /// Short-lived pools inside `build`: their worker may exist before its start hook ran.
    pub(super) building: AtomicUsize,
}

impl ExtraThreads {
    pub(super) fn lock(&self) -> MutexGuard<'_, HashMap<u32, Option<Instant>>> {
        self.threads.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// What the watch saw.
#[derive(Clone, Copy, Debug)]
pub(super) struct ThreadWatch {
    /// Fewest and most threads listed at a sample.
    pub(super) min: usize,
    pub(super) max: usize,
    pub(super) samples: u64,
    /// Most short-lived pools' threads listed at once.
    pub(super) max_short_lived: usize,
    /// Most of them not registered yet (their pool still in `build`).
    pub(super) max_starting: usize,
}

/// Samples the OS threads against those listed at the start.
pub(super) struct Watcher<'a> {
    core_tids: HashSet<u32>,
    extra: &'a ExtraThreads,
    tally: &'a Tally,
    /// Who the threads listed at the start are, for the violation that some exited.
    who: String,
    pub(super) seen: ThreadWatch,
}

impl<'a> Watcher<'a> {
    /// A watch on the threads listed now (`core_tids`, described as `who`).
    pub(super) fn new(
        core_tids: HashSet<u32>,
        extra: &'a ExtraThreads,
        tally: &'a Tally,
        who: String,
    ) -> Self {
        Watcher {
            core_tids,
            extra,
            tally,
            who,
            seen: ThreadWatch {
                min: usize::MAX,
                max: 0,
                samples: 0,
                max_short_lived: 0,
                max_starting: 0,
            },
        }
    }

    /// One sample: the threads listed at the start must all still be there, and every other
    /// one must be a short-lived pool's worker: registered by its start hook, and gone within
    /// EXIT_GRACE of its stop hook, or not registered yet because its pool is still in `build`.
    /// Read in this order (the listing, then the pools in `build`, then the registry), a worker
    /// found unregistered belongs to a pool that was in `build` when the count was read, so
    /// unknown <= building.
    pub(super) fn sample(&mut self) {
        let tids = thread_ids();
        let building = self.extra.building.load(Ordering::SeqCst);
        let present = self.core_tids.iter().filter(|t| tids.contains(t)).count();
        let mut reg = self.extra.lock();
        // Forget the exited threads the listing no longer shows (ids are reused).
        reg.retain(|tid, stopped| stopped.is_none() || tids.contains(tid));
        let (mut others, mut unknown, mut late) = (0, 0, 0);
        for tid in tids.iter().filter(|t| !self.core_tids.contains(t)) {
            others += 1;
            match reg.get(tid) {
                None => unknown += 1,
                Some(Some(t)) if t.elapsed() > EXIT_GRACE => late += 1,
                Some(_) => {}
            }
        }
        drop(reg);
        let seen = &mut self.seen;
        seen.max_starting = seen.max_starting.max(unknown);
        let unknown = unknown.saturating_sub(building);
        seen.samples += 1;
        seen.min = seen.min.min(present + others);
        seen.max = seen.max.max(present + others);
        seen.max_short_lived = seen.max_short_lived.max(others);
        if present != self.core_tids.len() {
            self.tally.violation(format!(
                "{} of the {} threads listed at the start ({}) have exited",
                self.core_tids.len() - present,
                self.core_tids.len(),
                self.who
            ));
        }
        if unknown > 0 {
            self.tally.violation(format!(
                "{unknown} OS threads that are neither main, a worker, a submitter nor a short-lived pool's worker"
            ));
        }
        if late > 0 {
            self.tally.violation(format!(
                "{late} short-lived pools' threads still listed {EXIT_GRACE:?} after they stopped"
            ));
        }
    }
}
