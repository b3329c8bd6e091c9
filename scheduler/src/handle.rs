//! The submitter's side of a run: [`GraphHandle`], which waits on the run's latch, and the
//! thread-local through which a wait on a pool's worker thread lends that worker to the pool
//! (set by the worker while it runs, read here and by the registry's admission).

use std::cell::Cell;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::ptr::NonNull;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use crate::error::Error;
use crate::latch::Completion;
use crate::output::GraphOutput;

/// A submitted graph. [`wait`](Self::wait) blocks for its result; `.await` does the same without
/// blocking (it needs no particular async runtime). Dropping the handle does not cancel the graph.
///
/// Waiting from inside a node of a pool runs that pool's other nodes meanwhile.
#[must_use = "a graph handle does nothing unless waited on; dropping it lets the graph run on"]
pub struct GraphHandle {
    pub(crate) completion: Arc<Completion>,
    pub(crate) graph: Arc<str>,
}

impl fmt::Debug for GraphHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GraphHandle")
            .field("graph", &self.graph)
            .field("done", &self.is_done())
            .finish()
    }
}

impl GraphHandle {
    /// Whether the graph has finished (successfully or not).
    pub fn is_done(&self) -> bool {
        self.completion.is_done()
    }

    /// The graph's name.
    pub fn graph_name(&self) -> &str {
        &self.graph
    }

    /// Runs `f` once the graph has finished, successfully or not, before its result is handed
    /// to the waiter (so a `wait` that returns sees what `f` did); at once, on this thread, if
    /// it already has. Otherwise `f` runs on the thread that finishes the graph, usually a
    /// worker: keep it short and never block in it. Dropping the handle keeps `f`. A panic in
    /// `f` is caught and dropped (the graph's result is still handed over).
    ///
    /// ```
    /// # use boundpool_scheduler::{Cores, GraphBuilder, PoolBuilder};
    /// # use std::sync::atomic::{AtomicBool, Ordering};
    /// # use std::sync::Arc;
    /// # let pool = PoolBuilder::new().workers(1).cores(Cores::Unpinned).build()?;
    /// let mut g = GraphBuilder::new("g");
    /// g.node("a", |_| Ok(()));
    /// let handle = pool.submit(&g.build()?)?;
    /// let released = Arc::new(AtomicBool::new(false));
    /// let r = released.clone();
    /// handle.on_done(move || r.store(true, Ordering::Release));
    /// handle.wait()?;
    /// assert!(released.load(Ordering::Acquire));
    /// # Ok::<(), boundpool_scheduler::Error>(())
    /// ```
    pub fn on_done(&self, f: impl FnOnce() + Send + 'static) {
        self.completion.on_done(Box::new(f));
    }

    /// Blocks until the graph has finished and returns its outputs, or the error of the node that
    /// failed it (its [`cancelled_nodes`](Error::cancelled_nodes) says how many nodes never ran).
    /// When this returns, no node of the run is still executing.
    pub fn wait(self) -> Result<GraphOutput, Error> {
        match self.wait_until(None) {
            Ok(result) => result,
            Err(_) => unreachable!("a wait without a deadline returns only when the graph is done"),
        }
    }

    /// Waits at most `timeout` for the graph: its result as [`wait`](Self::wait) gives it, or,
    /// if the graph is still running, `Err` with this handle back to wait again (or drop). A
    /// timeout does not cancel the graph.
    ///
    /// On a worker thread (inside a node) it runs the pool's other nodes meanwhile, as `wait`
    /// does, and returns once the deadline passes even when the worker has more to do. A
    /// `Duration::MAX` timeout waits for ever.
    ///
    /// ```
    /// # use boundpool_scheduler::{Cores, GraphBuilder, PoolBuilder};
    /// # use std::time::Duration;
    /// # let pool = PoolBuilder::new().workers(1).cores(Cores::Unpinned).build()?;
    /// let mut g = GraphBuilder::new("g");
    /// g.node("a", |_| Ok(()));
    /// let mut handle = pool.submit(&g.build()?)?;
    /// let output = loop {
    ///     match handle.wait_timeout(Duration::from_millis(10)) {
    ///         Ok(result) => break result?,
    ///         Err(still_running) => handle = still_running,
    ///     }
    /// };
    /// # let _ = output;
    /// # Ok::<(), boundpool_scheduler::Error>(())
    /// ```
    #[allow(clippy::result_large_err)]
    pub fn wait_timeout(
        self,
        timeout: Duration,
    ) -> Result<Result<GraphOutput, Error>, GraphHandle> {
        // A deadline beyond what `Instant` can hold is no deadline.
        let deadline = Instant::now().checked_add(timeout);
        self.wait_until(deadline)
    }

    #[allow(clippy::result_large_err)]
    fn wait_until(
        self,
        deadline: Option<Instant>,
    ) -> Result<Result<GraphOutput, Error>, GraphHandle> {
        if !self.completion.is_done() {
            let done = match help_until(&self.completion, deadline) {
                Some(done) => done,
                None => self.completion.block_until(deadline),
            };
            if !done {
                return Err(self);
            }
        }
        Ok(self
            .completion
            .take_result()
            .expect("a finished run has a result"))
    }
}

impl Future for GraphHandle {
    type Output = Result<GraphOutput, Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if !self.completion.is_done() {
            self.completion.register_waker(cx.waker());
            if !self.completion.is_done() {
                return Poll::Pending;
            }
        }
        Poll::Ready(
            self.completion
                .take_result()
                .expect("GraphHandle polled after it returned Ready"),
        )
    }
}

/// What a wait on a worker thread reaches through [`CURRENT`]: the worker, whatever its pool's
/// state type.
pub(crate) trait Helper {
    /// Runs other nodes until `c` completes (returns `true`) or `deadline` passes (`false`).
    fn help_until(&self, c: &Completion, deadline: Option<Instant>) -> bool;
    /// The address of the worker's registry (which pool it belongs to).
    fn registry_addr(&self) -> usize;
}

thread_local! {
    static CURRENT: Cell<Option<NonNull<dyn Helper>>> = const { Cell::new(None) };
}

/// Points [`CURRENT`] at this thread's worker for as long as it lives, and clears it when
/// dropped, also when the thread unwinds, so nothing ever reads a pointer to a dropped worker.
pub(crate) struct CurrentGuard(());

impl CurrentGuard {
    /// # Safety
    /// `helper` must stay valid (its worker alive, on this thread) until the guard is dropped.
    pub(crate) unsafe fn set(helper: NonNull<dyn Helper>) -> Self {
        CURRENT.with(|c| c.set(Some(helper)));
        CurrentGuard(())
    }
}

impl Drop for CurrentGuard {
    fn drop(&mut self) {
        CURRENT.with(|c| c.set(None));
    }
}

/// If this thread is a pool worker, runs other nodes until `c` completes or `deadline` passes,
/// and returns whether `c` completed; `None` on a thread that is not a worker.
fn help_until(c: &Completion, deadline: Option<Instant>) -> Option<bool> {
    CURRENT.with(|cur| cur.get()).map(|p| {
        // SAFETY: CURRENT is set only while a `CurrentGuard` lives, whose creator promised the
        // worker stays alive on this thread until then, and we are on that thread.
        unsafe { p.as_ref() }.help_until(c, deadline)
    })
}

/// Whether this thread is a worker of the pool whose registry is at `registry`.
pub(crate) fn on_worker_of(registry: *const ()) -> bool {
    match CURRENT.with(|cur| cur.get()) {
        // SAFETY: as in `help_until`.
        Some(p) => unsafe { p.as_ref() }.registry_addr() == registry as usize,
        None => false,
    }
}
