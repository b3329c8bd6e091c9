//! The capture gate of each device, one per process. A replay capture holds it *alone* from
//! `cuStreamBeginCapture` to `cuStreamEndCapture`; calls that synchronise the device or its
//! context hold it as a *sync*, shared with other syncs. So no such call runs while a stream
//! of another thread captures: the driver invalidates every capture of a context that a
//! synchronise meets (a capture in thread-local mode is protected from another thread's
//! `cudaMalloc`, not from its `cuCtxSynchronize`, `cuMemFree`, a library handle's destroy,
//! which synchronises, or a module unload), and the call itself may fail.
//!
//! Captures exclude each other too: a body under capture may make such a call itself (cudarc's
//! `CudaBlasLT::new` synchronises the device), which fails its own capture by name, and must
//! not take down another thread's capture with it. A capture happens once per generation of
//! a replay and lasts milliseconds on the host; captures of one device in one process then
//! take turns.
//!
//! The gate is keyed by device ordinal, not by pool: every pool of the process uses the
//! device's primary context, so two pools' workers (or two tests of one binary) are what it
//! keeps apart. Captures come first: a sync waits while a capture holds the gate or waits for
//! it, so a stream of syncs never starves captures (and captures, rare and short, delay syncs
//! without starving them). On a thread already holding a gate (a sync called inside a
//! capture's body, or nested inside another sync; any device's gate, so that two devices'
//! holds never wait on each other) a new hold passes through without waiting:
//! waiting there could only deadlock, and a synchronising call made under the thread's own
//! capture fails that capture by name anyway. A captured body must therefore not wait for
//! another graph's capture or for a node that synchronises. Nothing on the replay launch path
//! takes the gate.

use std::cell::Cell;
use std::marker::PhantomData;
use std::sync::{Arc, Condvar, Mutex, OnceLock, Weak};

/// The gates made so far, by device ordinal.
type Gates = Vec<(i32, Arc<CaptureGate>)>;

/// One device's gate (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct CaptureGate {
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Debug, Default)]
struct State {
    /// Captures holding the gate (0 or 1).
    captures: usize,
    /// Captures waiting for syncs to end (new syncs wait behind them).
    captures_waiting: usize,
    /// Syncs holding the gate.
    syncs: usize,
    /// Called when the captures have ended (none holding, none waiting): the wakers of
    /// release queues whose frees were deferred for a capture (`Weak`: a pool gone since
    /// needs no wake-up).
    after_captures: Vec<Waker>,
}

/// A release queue's waker, as the gate keeps it.
pub(crate) type Waker = Weak<dyn Fn() + Send + Sync>;

thread_local! {
    /// Holds of any gate on this thread: a new hold passes through while one is held.
    static HELD: Cell<u32> = const { Cell::new(0) };
}

/// A hold on a gate, released when dropped (`Pass`: a hold that took nothing).
#[must_use = "the gate is held until this is dropped"]
#[derive(Debug)]
pub(crate) struct GateHold {
    gate: Option<Arc<CaptureGate>>,
    capture: bool,
    /// Released on the thread that took it (the thread's count of holds says so).
    _here: PhantomData<*const ()>,
}

impl GateHold {
    fn pass() -> Self {
        GateHold {
            gate: None,
            capture: false,
            _here: PhantomData,
        }
    }

    fn held(gate: &Arc<CaptureGate>, capture: bool) -> Self {
        HELD.with(|h| h.set(h.get() + 1));
        GateHold {
            gate: Some(gate.clone()),
            capture,
            _here: PhantomData,
        }
    }
}

impl Drop for GateHold {
    fn drop(&mut self) {
        let Some(gate) = self.gate.take() else {
            return;
        };
        HELD.with(|h| h.set(h.get() - 1));
        let mut s = gate.lock();
        let mut wake = Vec::new();
        if self.capture {
            s.captures -= 1;
            if s.captures_waiting == 0 {
                wake = std::mem::take(&mut s.after_captures);
            }
        } else {
            s.syncs -= 1;
        }
        drop(s);
        gate.changed.notify_all();
        for w in wake.iter().filter_map(Weak::upgrade) {
            w();
        }
    }
}

impl CaptureGate {
    /// The process's gate of device `ordinal` (made at its first use).
    pub(crate) fn of_device(ordinal: i32) -> Arc<CaptureGate> {
        static GATES: OnceLock<Mutex<Gates>> = OnceLock::new();
        let mut gates = GATES
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some((_, g)) = gates.iter().find(|(o, _)| *o == ordinal) {
            return g.clone();
        }
        let g = Arc::new(CaptureGate::default());
        gates.push((ordinal, g.clone()));
        g
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn held_here() -> bool {
        HELD.with(|h| h.get() > 0)
    }

    /// Held by a capture from its begin to its end: waits while a sync or another capture
    /// holds the gate.
    pub(crate) fn capture(self: &Arc<Self>) -> GateHold {
        if Self::held_here() {
            return GateHold::pass();
        }
        let mut s = self.lock();
        if s.syncs > 0 || s.captures > 0 {
            s.captures_waiting += 1;
            while s.syncs > 0 || s.captures > 0 {
                s = self.changed.wait(s).unwrap_or_else(|e| e.into_inner());
            }
            s.captures_waiting -= 1;
        }
        s.captures += 1;
        GateHold::held(self, true)
    }

    /// Held around a call that synchronises the device or its context: waits while a capture
    /// holds the gate or waits for it.
    pub(crate) fn sync(self: &Arc<Self>) -> GateHold {
        if Self::held_here() {
            return GateHold::pass();
        }
        let mut s = self.lock();
        while s.captures > 0 || s.captures_waiting > 0 {
            s = self.changed.wait(s).unwrap_or_else(|e| e.into_inner());
        }
        s.syncs += 1;
        GateHold::held(self, false)
    }

    /// Calls `waker` once the captures under way (holding the gate or waiting for it) have
    /// ended, at once if there are none: a release queue that deferred its frees for a
    /// capture asks a worker back then (its pending flag alone would not wake one).
    pub(crate) fn wake_after_captures(&self, waker: Waker) {
        let mut s = self.lock();
        if s.captures == 0 && s.captures_waiting == 0 {
            drop(s);
            if let Some(w) = waker.upgrade() {
                w();
            }
            return;
        }
        if !s.after_captures.iter().any(|w| Weak::ptr_eq(w, &waker)) {
            s.after_captures.push(waker);
        }
    }

    /// [`sync`](Self::sync) without waiting: `None` while a capture holds the gate or waits
    /// for it (the caller defers its call).
    pub(crate) fn try_sync(self: &Arc<Self>) -> Option<GateHold> {
        if Self::held_here() {
            return Some(GateHold::pass());
        }
        let mut s = self.lock();
        if s.captures > 0 || s.captures_waiting > 0 {
            return None;
        }
        s.syncs += 1;
        Some(GateHold::held(self, false))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Barrier;
    use std::time::Duration;

    #[test]
    fn gates_are_per_device_and_process_wide() {
        let a = CaptureGate::of_device(1000);
        let b = CaptureGate::of_device(1001);
        assert!(Arc::ptr_eq(&a, &CaptureGate::of_device(1000)));
        assert!(!Arc::ptr_eq(&a, &b));
    }

    #[test]
    fn captures_exclude_everything_and_syncs_share() {
        let g = Arc::new(CaptureGate::default());
        let captures = AtomicUsize::new(0);
        let syncs = AtomicUsize::new(0);
        let max_captures = AtomicUsize::new(0);
        let max_syncs = AtomicUsize::new(0);
        let overlap = AtomicBool::new(false);
        std::thread::scope(|s| {
            for t in 0..8 {
                let (g, captures, syncs) = (&g, &captures, &syncs);
                let (max_captures, max_syncs, overlap) = (&max_captures, &max_syncs, &overlap);
                s.spawn(move || {
                    for i in 0..300 {
                        let capture = (t + i) % 3 == 0;
                        let _h = if capture { g.capture() } else { g.sync() };
                        let (mine, other, max) = if capture {
                            (captures, syncs, max_captures)
                        } else {
                            (syncs, captures, max_syncs)
                        };
                        let n = mine.fetch_add(1, Ordering::SeqCst) + 1;
                        max.fetch_max(n, Ordering::SeqCst);
                        if other.load(Ordering::SeqCst) != 0 || (capture && n > 1) {
                            overlap.store(true, Ordering::SeqCst);
                        }
                        std::thread::yield_now();
                        mine.fetch_sub(1, Ordering::SeqCst);
                    }
                });
            }
        });
        assert!(
            !overlap.load(Ordering::SeqCst),
            "a capture overlapped a sync or another capture"
        );
        assert_eq!(max_captures.load(Ordering::SeqCst), 1);
        // Not asserted (scheduling decides), but printed: syncs did share the gate.
        println!("most syncs at once {}", max_syncs.load(Ordering::SeqCst));
        let s = g.lock();
        assert_eq!((s.captures, s.captures_waiting, s.syncs), (0, 0, 0));
    }

    #[test]
    fn a_hold_inside_a_hold_on_one_thread_passes_through() {
        let g = Arc::new(CaptureGate::default());
        let waiting = Arc::new(Barrier::new(2));
        let c = g.capture();
        // A sync inside the thread's own capture (a call in a captured body) does not wait.
        let inner = g.sync();
        assert!(inner.gate.is_none());
        assert!(g.try_sync().is_some_and(|h| h.gate.is_none()));
        drop(inner);
        drop(c);
        // A sync nested in a sync passes even while a capture of another thread waits.
        let outer = g.sync();
        let t = {
            let (g, waiting) = (g.clone(), waiting.clone());
            std::thread::spawn(move || {
                waiting.wait();
                let _c = g.capture();
            })
        };
        waiting.wait();
        while g.lock().captures_waiting == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
        let nested = g.sync();
        assert!(nested.gate.is_none());
        drop(nested);
        drop(outer);
        t.join().unwrap();
    }

    #[test]
    fn a_waiting_capture_holds_new_syncs_back() {
        let g = Arc::new(CaptureGate::default());
        let s1 = g.sync();
        let captured = Arc::new(AtomicBool::new(false));
        let t = {
            let (g, captured) = (g.clone(), captured.clone());
            std::thread::spawn(move || {
                let _c = g.capture();
                captured.store(true, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(20));
            })
        };
        while g.lock().captures_waiting == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
        // Another thread's new sync is held back by the waiting capture: not granted now.
        let other = {
            let g = g.clone();
            std::thread::spawn(move || g.try_sync().is_some())
        };
        assert!(
            !other.join().unwrap(),
            "a new sync went ahead of a waiting capture"
        );
        assert!(!captured.load(Ordering::SeqCst));
        drop(s1);
        // After the capture, syncs go again.
        let other = {
            let g = g.clone();
            std::thread::spawn(move || drop(g.sync()))
        };
        other.join().unwrap();
        assert!(captured.load(Ordering::SeqCst));
        t.join().unwrap();
    }

    #[test]
    fn a_deferred_queue_is_woken_when_the_captures_end() {
        let g = Arc::new(CaptureGate::default());
        let woken = Arc::new(AtomicUsize::new(0));
        let w = woken.clone();
        let waker: Arc<dyn Fn() + Send + Sync> = Arc::new(move || {
            w.fetch_add(1, Ordering::SeqCst);
        });
        // No capture: at once.
        g.wake_after_captures(Arc::downgrade(&waker));
        assert_eq!(woken.load(Ordering::SeqCst), 1);
        // Under a capture (of another thread): when it ends, once however often asked.
        let (tx, rx) = std::sync::mpsc::channel();
        let (tx2, rx2) = std::sync::mpsc::channel::<()>();
        let t = {
            let g = g.clone();
            std::thread::spawn(move || {
                let _c = g.capture();
                tx.send(()).unwrap();
                rx2.recv().unwrap();
            })
        };
        rx.recv().unwrap();
        g.wake_after_captures(Arc::downgrade(&waker));
        g.wake_after_captures(Arc::downgrade(&waker));
        assert_eq!(woken.load(Ordering::SeqCst), 1);
        tx2.send(()).unwrap();
        t.join().unwrap();
        assert_eq!(woken.load(Ordering::SeqCst), 2);
        // A waker whose pool is gone is not called.
        let c = g.capture();
        let gone: Arc<dyn Fn() + Send + Sync> = Arc::new(|| panic!("called after its drop"));
        g.wake_after_captures(Arc::downgrade(&gone));
        drop(gone);
        drop(c);
    }

    #[test]
    fn try_sync_fails_while_a_capture_holds() {
        let g = Arc::new(CaptureGate::default());
        let c = {
            let g = g.clone();
            let (tx, rx) = std::sync::mpsc::channel();
            let (tx2, rx2) = std::sync::mpsc::channel::<()>();
            let t = std::thread::spawn(move || {
                let _c = g.capture();
                tx.send(()).unwrap();
                rx2.recv().unwrap();
            });
            rx.recv().unwrap();
            (t, tx2)
        };
        assert!(g.try_sync().is_none());
        c.1.send(()).unwrap();
        c.0.join().unwrap();
        assert!(g.try_sync().is_some_and(|h| h.gate.is_some()));
    }
}
