//! The submitter's side of a run.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use crate::admission::Ticket;
use crate::error::Error;
use crate::graph::Graph;
use crate::registry::Registry;
use crate::run::{Completion, GraphOutput};
use crate::worker;

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
            let done = match worker::help_until(&self.completion, deadline) {
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

/// The future of [`Pool::submit_async`](crate::Pool::submit_async): waits for admission under
/// the pool's limit of graphs in flight, then starts the graph and yields its [`GraphHandle`].
/// Dropping it before it is ready withdraws the submission: its place in the admission queue
/// (or a wake-up it was handed) goes to the next waiter.
#[must_use = "a submission future does nothing unless polled"]
pub struct SubmitFuture<'a, S: Send + 'static> {
    registry: &'a Arc<Registry<S>>,
    graph: &'a Graph<S>,
    ticket: Ticket,
    done: bool,
}

impl<S: Send + 'static> fmt::Debug for SubmitFuture<'_, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SubmitFuture")
            .field("graph", &self.graph.name())
            .field("done", &self.done)
            .finish()
    }
}

impl<'a, S: Send + 'static> SubmitFuture<'a, S> {
    pub(crate) fn new(registry: &'a Arc<Registry<S>>, graph: &'a Graph<S>) -> Self {
        SubmitFuture {
            registry,
            graph,
            ticket: Ticket::None,
            done: false,
        }
    }
}

impl<S: Send + 'static> Future for SubmitFuture<'_, S> {
    type Output = Result<GraphHandle, Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // Every field is `Unpin`.
        let this = self.get_mut();
        assert!(!this.done, "SubmitFuture polled after it returned Ready");
        let reg = this.registry;
        if let Err(e) = Registry::check(reg, this.graph) {
            this.done = true;
            reg.cancel_admission(std::mem::replace(&mut this.ticket, Ticket::None));
            return Poll::Ready(Err(e));
        }
        let admitted = match &reg.admission {
            None => true,
            Some(_) if crate::worker::on_worker_of(reg) => {
                reg.cancel_admission(std::mem::replace(&mut this.ticket, Ticket::None));
                this.done = true;
                return Poll::Ready(Registry::submit(reg, this.graph));
            }
            Some(adm) => {
                let queued = this.ticket != Ticket::None;
                let ok = adm.poll_acquire(&mut this.ticket, cx.waker());
                if ok {
                    reg.note_admitted(queued);
                }
                reg.export().submissions_waiting(adm.waiting());
                ok
            }
        };
        if !admitted {
            return Poll::Pending;
        }
        this.done = true;
        Poll::Ready(Registry::start(reg, this.graph))
    }
}

impl<S: Send + 'static> Drop for SubmitFuture<'_, S> {
    fn drop(&mut self) {
        if !self.done {
            self.registry
                .cancel_admission(std::mem::replace(&mut self.ticket, Ticket::None));
        }
    }
}
