//! A worker thread's life: the start-up gate, pinning and the start hook on the worker's own
//! thread, the main loop under its abort guard, the stop hook; and the aborts for a panic
//! outside a node body (a hook's, or the scheduler's own).

use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::NonNull;
use std::sync::Arc;

use super::WorkerThread;
use crate::error::{Error, ErrorKind};
use crate::handle::{CurrentGuard, Helper};
use crate::priority::WorkerDeques;
use crate::registry::Registry;
use crate::run::Task;
use crate::sync::{self, Condvar, Mutex};

/// Start-up rendezvous: every worker reports its start hook's outcome, then waits for the
/// builder's verdict (run, or exit because another worker failed).
pub(crate) struct StartGate {
    state: Mutex<GateState>,
    cv: Condvar,
}

struct GateState {
    reported: usize,
    first_error: Option<(usize, Error)>,
    go: Option<bool>,
}

impl StartGate {
    pub(crate) fn new(_workers: usize) -> Self {
        StartGate {
            state: Mutex::new(GateState {
                reported: 0,
                first_error: None,
                go: None,
            }),
            cv: Condvar::new(),
        }
    }

    fn report(&self, index: usize, result: Result<(), Error>) {
        let mut s = sync::lock(&self.state);
        s.reported += 1;
        if let Err(e) = result {
            if s.first_error.as_ref().is_none_or(|(i, _)| index < *i) {
                s.first_error = Some((index, e));
            }
        }
        self.cv.notify_all();
    }

    /// Waits for `n` reports; returns the error of the lowest-numbered failing worker.
    pub(crate) fn wait_reports(&self, n: usize) -> Option<Error> {
        let mut s = sync::lock(&self.state);
        while s.reported < n {
            s = self.cv.wait(s).unwrap_or_else(|p| p.into_inner());
        }
        s.first_error.take().map(|(_, e)| e)
    }

    pub(crate) fn release(&self, go: bool) {
        sync::lock(&self.state).go = Some(go);
        self.cv.notify_all();
    }

    fn wait_go(&self) -> bool {
        let mut s = sync::lock(&self.state);
        loop {
            if let Some(go) = s.go {
                return go;
            }
            s = self.cv.wait(s).unwrap_or_else(|p| p.into_inner());
        }
    }
}

pub(crate) fn panic_message(p: &(dyn Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "a non-string panic payload".to_string()
    }
}

/// Makes this thread's timed waits end on time: Linux lets a timer fire up to the thread's
/// timer slack late (50 µs by default), which doubled a worker's 50 µs timed parks
/// ([`DEFERRED_PARK`]) while it waits for a long GPU segment.
#[cfg(all(target_os = "linux", not(miri)))]
fn tighten_timer_slack() {
    // SAFETY: PR_SET_TIMERSLACK takes one unsigned long (nanoseconds) by value and changes only
    // the calling thread's timer slack; a failure (an old kernel) leaves the default.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1_000 as libc::c_ulong);
    }
}

#[cfg(not(all(target_os = "linux", not(miri))))]
fn tighten_timer_slack() {}

/// The body of a worker thread.
pub(crate) fn main<S: Send + 'static>(
    reg: Arc<Registry<S>>,
    index: usize,
    deques: WorkerDeques<Task<S>>,
    gate: Arc<StartGate>,
) {
    let info = &reg.infos[index];
    reg.sleep.register(index, sync::current_thread());
    let state = start(&reg, index, &gate);
    let go = gate.wait_go();
    drop(gate);
    let Some(state) = state else { return };
    if !go {
        run_stop_hook(&reg, index, state);
        return;
    }
    let wt = WorkerThread::new(reg.clone(), index, deques, state);
    let helper: &dyn Helper = &wt;
    // SAFETY: only the lifetime is erased; `wt` lives on this stack frame until after the
    // `CurrentGuard` below has cleared CURRENT (on return or unwind), and CURRENT is
    // thread-local, so nothing reads the pointer after `wt` is gone.
    let helper: NonNull<dyn Helper> = unsafe {
        std::mem::transmute::<NonNull<dyn Helper + '_>, NonNull<dyn Helper>>(NonNull::from(helper))
    };
    let abort_guard = AbortOnUnwind {
        pool: &reg.name,
        worker: &info.name,
    };
    {
        // SAFETY: `wt` outlives the guard (see above), on this thread.
        let _current = unsafe { CurrentGuard::set(helper) };
        wt.main_loop();
    }
    wt.flush();
    std::mem::forget(abort_guard);
    let WorkerThread { host, registry, .. } = wt;
    run_stop_hook(&registry, index, host.state);
}

/// Start-up on the worker's own thread: pins it to its core and runs the start hook, whose
/// result is the worker's state; reports the outcome to `gate` (`None`: it failed).
fn start<S: Send + 'static>(reg: &Registry<S>, index: usize, gate: &StartGate) -> Option<S> {
    let info = &reg.infos[index];
    let pinned = match info.core {
        Some(core) => core_affinity::set_for_current(core_affinity::CoreId { id: core }),
        None => true,
    };
    tighten_timer_slack();
    if !pinned {
        gate.report(
            index,
            Err(Error::new(
                ErrorKind::InvalidConfig,
                format!(
                    "pool '{}': worker {} could not pin itself to core {:?}",
                    reg.name, info.name, info.core
                ),
            )),
        );
        return None;
    }
    match catch_unwind(AssertUnwindSafe(|| (reg.hooks.start)(info))) {
        Ok(Ok(s)) => {
            gate.report(index, Ok(()));
            Some(s)
        }
        Ok(Err(e)) => {
            let msg = format!(
                "pool '{}': the start hook of worker {} (core {:?}) failed",
                reg.name, info.name, info.core
            );
            gate.report(
                index,
                Err(Error::new(ErrorKind::StartHook, msg).with_source(e)),
            );
            None
        }
        Err(p) => {
            let msg = format!(
                "pool '{}': the start hook of worker {} (core {:?}) panicked: {}",
                reg.name,
                info.name,
                info.core,
                panic_message(&*p)
            );
            gate.report(index, Err(Error::new(ErrorKind::StartHook, msg)));
            None
        }
    }
}

/// Runs the stop hook of worker `index`; a panic there aborts the process with a message
/// naming the worker (see [`abort_on_hook_panic`]).
fn run_stop_hook<S: Send + 'static>(reg: &Registry<S>, index: usize, state: S) {
    if let Some(stop) = &reg.hooks.stop {
        let info = &reg.infos[index];
        if let Err(p) = catch_unwind(AssertUnwindSafe(|| stop(info, state))) {
            abort_on_hook_panic(&reg.name, &info.name, "stop hook", &*p);
        }
    }
}

/// A panic in a hook the worker runs between nodes (idle, stop): the hook's state (the GPU
/// backend's release queues and streams) cannot be trusted any more, and the worker cannot go on
/// without it, so, as rayon-core does for a panic outside a job, the process aborts with a
/// message rather than lose a worker quietly and leave its graphs (and `shutdown`) waiting.
#[cold]
pub(super) fn abort_on_hook_panic(pool: &str, worker: &str, hook: &str, p: &(dyn Any + Send)) -> ! {
    abort_with(&format!(
        "pool '{}': the {hook} of worker {} panicked: {}",
        crate::error::bounded(pool),
        crate::error::bounded(worker),
        crate::error::bounded(&panic_message(p)),
    ))
}

/// Writes `msg` to the process's real stderr (not the test harness's capture, which an abort
/// would discard) and aborts.
#[cold]
pub(super) fn abort_with(msg: &str) -> ! {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "boundpool-scheduler: {msg}; aborting");
    std::process::abort()
}

/// Aborts if a worker's main loop unwinds: a panic there comes from outside any node body and
/// any hook (the scheduler itself, a metrics recorder, a waker, an output's destructor), after
/// which the worker's queues and its runs' counters cannot be trusted, and a worker that quietly
/// exits would leave the graphs placed on its group, and `shutdown`, waiting for ever.
struct AbortOnUnwind<'a> {
    pool: &'a str,
    worker: &'a str,
}

impl Drop for AbortOnUnwind<'_> {
    fn drop(&mut self) {
        abort_with(&format!(
            "pool '{}': worker {} unwound out of its main loop (a panic outside a node body: \
             in a metrics recorder, a waker, an output's destructor, or the scheduler itself)",
            crate::error::bounded(self.pool),
            crate::error::bounded(self.worker),
        ));
    }
}
