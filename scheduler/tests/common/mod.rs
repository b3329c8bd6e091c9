//! Helpers shared by the integration tests (each test binary uses a subset).

use std::sync::mpsc;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread::{self, Thread};
use std::time::Duration;

use boundpool_scheduler::{Cores, Pool, PoolBuilder};

/// The tests' pool builder: `workers` unpinned workers, the pool named `name` (its threads
/// `{name}-host-{i}`).
pub(crate) fn pool_builder(name: &str, workers: usize) -> PoolBuilder<()> {
    PoolBuilder::new()
        .name(name)
        .workers(workers)
        .cores(Cores::Unpinned)
}

/// The tests' pool: [`pool_builder`]'s, built.
pub(crate) fn pool(name: &str, workers: usize) -> Pool {
    pool_builder(name, workers).build().expect("build pool")
}

/// Runs `f` on its own thread and fails the test if it has not returned within `secs`
/// seconds: a hang (deadlock, lost wake-up) becomes a failure instead of a stuck suite.
pub(crate) fn with_deadline<T: Send + 'static>(
    secs: u64,
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = mpsc::channel();
    let h = thread::Builder::new()
        .name(format!("deadline-{what}"))
        .spawn(move || {
            let _ = tx.send(f());
        })
        .expect("spawn a test thread");
    // Miri interprets every step, hundreds of times slower.
    let secs = if cfg!(miri) { secs * 50 } else { secs };
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(v) => {
            h.join().expect("test thread");
            v
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => match h.join() {
            Err(p) => std::panic::resume_unwind(p),
            Ok(()) => unreachable!("the test thread returned without sending"),
        },
        Err(mpsc::RecvTimeoutError::Timeout) => {
            panic!("{what}: did not finish within {secs} s (deadlock or lost wake-up?)")
        }
    }
}

/// The number of OS threads of this process right now.
pub(crate) fn os_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .expect("read /proc/self/task")
        .count()
}

/// The names (`comm`, at most 15 bytes) of this process's OS threads.
pub(crate) fn thread_names() -> Vec<String> {
    let mut names = Vec::new();
    for e in std::fs::read_dir("/proc/self/task")
        .expect("read /proc/self/task")
        .flatten()
    {
        if let Ok(s) = std::fs::read_to_string(e.path().join("comm")) {
            names.push(s.trim_end().to_string());
        }
    }
    names
}

/// How many OS threads of this process have a name starting with `prefix`.
pub(crate) fn threads_named(prefix: &str) -> usize {
    thread_names()
        .iter()
        .filter(|n| n.starts_with(prefix))
        .count()
}

struct ThreadWaker {
    thread: Thread,
    wakes: std::sync::atomic::AtomicUsize,
}

impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref()
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.wakes.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.thread.unpark();
    }
}

/// A minimal executor: polls `fut` on this thread, parking between polls; the waker unparks it.
/// Returns the output and the number of times the waker was woken.
pub(crate) fn block_on<F: std::future::Future>(fut: F) -> (F::Output, usize) {
    let w = Arc::new(ThreadWaker {
        thread: thread::current(),
        wakes: std::sync::atomic::AtomicUsize::new(0),
    });
    let waker = Waker::from(w.clone());
    let mut cx = Context::from_waker(&waker);
    let mut fut = std::pin::pin!(fut);
    loop {
        if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return (v, w.wakes.load(std::sync::atomic::Ordering::SeqCst));
        }
        thread::park();
    }
}

/// Polls `f` until it returns true or `secs` seconds have passed; returns its last answer.
/// (A joined thread can linger in /proc/self/task for a moment after `join` returns.)
pub(crate) fn eventually(secs: u64, f: impl Fn() -> bool) -> bool {
    let deadline = std::time::Instant::now() + Duration::from_secs(secs);
    loop {
        if f() {
            return true;
        }
        if std::time::Instant::now() > deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(1));
    }
}

/// Installs (once) a panic hook that stays silent for panics on pool threads (names containing
/// `-host-` or `-cpu-`): those are the tests' deliberate node panics, which the pool catches and
/// reports as `NodePanicked` errors anyway. Other threads' panics print as usual.
pub(crate) fn quiet_worker_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let name = thread::current().name().unwrap_or("").to_string();
            if !(name.contains("-host-") || name.contains("-cpu-")) {
                default(info);
            }
        }));
    });
}

/// The cores the calling thread may run on.
pub(crate) fn allowed_cores() -> Vec<usize> {
    core_affinity::get_core_ids()
        .expect("core ids")
        .into_iter()
        .map(|c| c.id)
        .collect()
}
