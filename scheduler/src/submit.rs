//! An async submission: [`SubmitFuture`] waits for admission under the pool's limit of graphs
//! in flight, then starts the graph.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use crate::admission::Ticket;
use crate::error::Error;
use crate::graph::Graph;
use crate::handle::GraphHandle;
use crate::registry::Registry;

/// The future of [`Pool::submit_async`](crate::Pool::submit_async): waits for admission under
/// the pool's limit of graphs in flight, then starts the graph and yields its [`GraphHandle`].
/// Dropping it before it is ready withdraws the submission: its place in the admission queue
/// (or a wake-up it was handed) goes to the next waiter.
#[must_use = "a submission future does nothing unless polled"]
pub struct SubmitFuture<'a, S: Send + 'static> {
    registry: &'a Registry<S>,
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
    pub(crate) fn new(registry: &'a Registry<S>, graph: &'a Graph<S>) -> Self {
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
        if let Err(e) = reg.check(this.graph) {
            this.done = true;
            reg.cancel_admission(std::mem::replace(&mut this.ticket, Ticket::None));
            return Poll::Ready(Err(e));
        }
        let admitted = match &reg.admission {
            None => true,
            Some(_) if reg.on_worker_thread() => {
                reg.cancel_admission(std::mem::replace(&mut this.ticket, Ticket::None));
                this.done = true;
                return Poll::Ready(reg.submit(this.graph));
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
        Poll::Ready(reg.start(this.graph))
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
