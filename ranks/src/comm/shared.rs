//! The engine as the communication thread shares it with the pool's spinning workers: a
//! worker with nothing to run, spinning before it parks, looks at the network itself
//! ([`Progress::progress`], the pool's spin hook), so that an arrival completes its receive
//! node on a thread that is awake anyway and the consumer runs there, with no hand-off to a
//! worker that has to be woken. One thread at a time holds the engine (a lock that workers
//! only try); while workers look, the communication thread leaves arrivals to them and keeps
//! its commands and timers.
//!
//! Only for a transport that any thread may call, one call at a time
//! ([`Transport::any_thread`](crate::Transport::any_thread): MPI at `MPI_THREAD_SERIALIZED`
//! or more, the in-process network); otherwise the engine never leaves its thread.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, TryLockError};

use super::engine::Engine;
use crate::comm::stamps::monotonic_ns;
use crate::transport::Transport;

/// While a worker looked this recently (ns), the communication thread leaves arrivals to the
/// workers.
const WORKERS_LOOKING_NS: u64 = 20_000;
/// A looking worker renews the mark at most this often (ns): every spinning worker writing
/// one shared word on every look would bounce its cache line between them.
const MARK_EVERY_NS: u64 = 2_000;

/// Progress on the network from a worker's spin hook.
pub(crate) trait Progress: Send + Sync {
    /// Takes what arrived and what finished, if no other thread holds the engine; whether
    /// anything did.
    fn progress(&self) -> bool;
}

/// Where the pool's spin hook finds the engine once the communication thread made it (set
/// only where the transport allows calls from any thread and the runtime lets workers look).
pub(crate) type ProgressSlot = Arc<OnceLock<Arc<dyn Progress>>>;

/// The engine, behind a lock; `None` once the communication thread closed it. Boxed, so that
/// workers trying the lock do not contend for the cache line of the engine's own fields.
pub(crate) struct SharedEngine<T: Transport> {
    engine: Mutex<Option<Box<Engine<T>>>>,
    /// When a worker last looked at the network (`monotonic_ns`); 0: never.
    looked_at: AtomicU64,
    rank: usize,
}

// SAFETY: the engine holds the transport's handles (MPI's are raw pointers), which the
// transport's library lets any thread use one call at a time only where
// `Transport::any_thread` says so. Every access goes through the lock, and `share` publishes
// the engine to other threads only for such a transport; otherwise it stays on the
// communication thread that made it, as before (the other fields are atomics and a number).
unsafe impl<T: Transport> Send for SharedEngine<T> {}
// SAFETY: as above: shared references reach the engine only through its lock.
unsafe impl<T: Transport> Sync for SharedEngine<T> {}

impl<T: Transport + 'static> SharedEngine<T> {
    pub(crate) fn new(engine: Engine<T>) -> Arc<Self> {
        let rank = engine.rank();
        Arc::new(SharedEngine {
            engine: Mutex::new(Some(Box::new(engine))),
            looked_at: AtomicU64::new(0),
            rank,
        })
    }

    /// Lets the pool's workers look at the network through `slot`, if the transport allows
    /// calls from any thread (`any_thread`, asked of the engine's transport by the caller).
    pub(crate) fn share(self: &Arc<Self>, slot: &ProgressSlot, any_thread: bool) {
        if any_thread {
            let _ = slot.set(self.clone() as Arc<dyn Progress>);
        }
    }

    /// The engine, for the communication thread (it waits while a worker holds it).
    pub(crate) fn lock(&self) -> MutexGuard<'_, Option<Box<Engine<T>>>> {
        // A worker that panicked holding it aborted the process (`progress`): never poisoned.
        self.engine.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether a worker looked at the network within the last [`WORKERS_LOOKING_NS`].
    pub(crate) fn workers_looking(&self) -> bool {
        looking(self.looked_at.load(Ordering::Relaxed), monotonic_ns())
    }
}

/// Whether a worker's look polls the sends after its arrivals: not when it delivered a value
/// (it goes to run the consumer; the next look polls), but never two looks in a row, so that
/// a stream of arrivals cannot hold the window's completions back. `deferred`: the last look
/// skipped its poll.
fn polls_now(delivered: bool, deferred: &mut bool) -> bool {
    let skip = delivered && !*deferred;
    *deferred = skip;
    !skip
}

/// Whether a worker's look at `at` (0: never) counts as looking at `now`.
fn looking(at: u64, now: u64) -> bool {
    at != 0 && now.saturating_sub(at) < WORKERS_LOOKING_NS
}

impl<T: Transport + 'static> Progress for SharedEngine<T> {
    fn progress(&self) -> bool {
        // Marked before the lock is tried: the communication thread, which may hold it,
        // then leaves the next look to the workers.
        let now = monotonic_ns();
        if now.saturating_sub(self.looked_at.load(Ordering::Relaxed)) > MARK_EVERY_NS {
            self.looked_at.store(now, Ordering::Relaxed);
        }
        let mut g = match self.engine.try_lock() {
            Ok(g) => g,
            Err(TryLockError::WouldBlock) => return false,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
        };
        let Some(engine) = g.as_mut() else {
            return false;
        };
        // The engine's state cannot be trusted after a panic in it, here as on its thread.
        let guard = super::AbortOnUnwind(self.rank);
        engine.worker_looking = true;
        engine.delivered = false;
        let mut n = engine.probe(16);
        if polls_now(engine.delivered, &mut engine.poll_deferred) {
            n += engine.poll();
        }
        engine.worker_looking = false;
        std::mem::forget(guard);
        n > 0
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;
    use std::time::Duration;

    use super::*;
    use crate::comm::engine::EngineConfig;
    use crate::comm::send::Sending;
    use crate::transport::LocalNetwork;

    fn shared(net: &LocalNetwork) -> Arc<SharedEngine<crate::transport::LocalTransport>> {
        let cfg = EngineConfig {
            peer_timeout: Duration::from_secs(5),
            heartbeat: Duration::from_secs(1),
            max_message: 1 << 20,
            stamps: false,
            send_window: 4,
            worker_sends: false,
            worker_polls: true,
            posted_receives: true,
        };
        let sending = Arc::new(Sending::new(4, 1 << 20));
        let flag = Arc::new(AtomicBool::new(false));
        SharedEngine::new(Engine::new(net.endpoint(0), cfg, flag, sending))
    }

    #[test]
    fn a_look_marks_the_workers_looking_and_never_waits_for_the_lock() {
        let net = LocalNetwork::new(2);
        let s = shared(&net);
        assert_eq!(
            s.looked_at.load(Ordering::Relaxed),
            0,
            "no worker looked yet"
        );
        // Published only where the transport allows calls from any thread.
        let slot = ProgressSlot::default();
        s.share(&slot, false);
        assert!(slot.get().is_none());
        s.share(&slot, true);
        let p = slot.get().expect("shared").clone();
        let before = monotonic_ns();
        assert!(!p.progress(), "nothing arrived");
        let marked = s.looked_at.load(Ordering::Relaxed);
        assert!(marked >= before, "the look is marked");
        // While the communication thread holds the engine, a worker's look returns at once,
        // still marked (so that the thread leaves the next look to the workers).
        let held = s.lock();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_nanos(2 * MARK_EVERY_NS));
            p.progress()
        });
        assert!(
            !t.join().unwrap(),
            "a look that found the engine held did nothing"
        );
        drop(held);
        assert!(s.looked_at.load(Ordering::Relaxed) > marked, "marked again");
        // Closed (the thread took the engine out): a look does nothing.
        let engine = s.lock().take();
        assert!(engine.is_some());
        assert!(!slot.get().unwrap().progress());
    }

    #[test]
    fn a_look_that_delivered_polls_at_the_next_look_never_two_later() {
        let mut deferred = false;
        assert!(polls_now(false, &mut deferred), "nothing delivered: polls");
        assert!(
            !polls_now(true, &mut deferred),
            "delivered: the consumer first"
        );
        assert!(
            polls_now(true, &mut deferred),
            "delivered again, but the last look skipped: polls"
        );
        assert!(!polls_now(true, &mut deferred));
        assert!(polls_now(false, &mut deferred));
        assert!(!deferred);
    }

    #[test]
    fn a_look_counts_for_a_while() {
        let w = WORKERS_LOOKING_NS;
        assert!(!looking(0, 5), "never looked");
        assert!(looking(100, 100));
        assert!(looking(100, 100 + w - 1));
        assert!(!looking(100, 100 + w), "lapsed");
        assert!(
            looking(100, 50),
            "a clock read before the mark still counts"
        );
    }
}
