//! The submitter's side of a run.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use crate::error::Error;
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

    /// Blocks until the graph has finished and returns its outputs, or the error of the node that
    /// failed it (its [`cancelled_nodes`](Error::cancelled_nodes) says how many nodes never ran).
    /// When this returns, no node of the run is still executing.
    pub fn wait(self) -> Result<GraphOutput, Error> {
        if !self.completion.is_done() && !worker::help_until(&self.completion) {
            self.completion.block();
        }
        self.completion
            .take_result()
            .expect("a finished run has a result")
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
