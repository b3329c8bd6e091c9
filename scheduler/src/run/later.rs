//! The run side of a `Completer` (`later.rs`): [`Pending`], one node's completion handed to a
//! completer, which holds the node's in-flight unit until the node is complete, and the
//! [`Queue`] (the pool's injectors) its completion task goes to.
//!
//! The unit's path: the body's task held it while the body ran; when the body returns `Ok`
//! its worker gives it to the rendezvous instead of completing the node. If the completer
//! was called before, the worker takes it back at once and completes the node itself;
//! otherwise the call puts it in a completion task ([`Task::completion`]) on the node's
//! queue, and the worker that takes that task completes the node. So the run stays alive
//! (counted in flight) while a completer it waits for is outstanding, and it is finished by a
//! worker, never by the completing thread. A body that fails keeps its unit: its worker
//! completes the node as failed, and the call finds the rendezvous closed and touches nothing
//! (the run may be gone by then).

use std::sync::Arc;

use super::{RunRef, Task};
use crate::error::{BoxError, Error, ErrorKind};
use crate::later::{Call, Completer, HandedOff, Handoff, Rendezvous};
use crate::sync::{self, Mutex};

/// Where a completion task goes: the queue of the node's placement and level, with a worker
/// there woken (the registry's injectors).
pub(crate) trait Queue<S>: Send + Sync {
    fn push_completion(&self, t: Task<S>);
}

/// A node whose completion was handed to a [`Completer`].
pub(crate) struct Pending<S> {
    queue: Arc<dyn Queue<S>>,
    /// The node's task, which carries its in-flight unit once the body returned `Ok`: taken by
    /// the call that completes the node (a lock taken once, which also makes the pointer
    /// inside shareable).
    task: Mutex<Option<Task<S>>>,
    node: u32,
    rendezvous: Rendezvous,
}

/// A completer for node `node` of `run`, whose body is running on the caller (a worker), and
/// the worker's side of it.
pub(crate) fn hand_off<S: 'static>(
    queue: Arc<dyn Queue<S>>,
    run: RunRef<S>,
    node: u32,
) -> (Completer, HandedOff) {
    let p = Arc::new(Pending {
        queue,
        task: Mutex::new(Some(Task::new(run, node))),
        node,
        rendezvous: Rendezvous::new(),
    });
    (Completer::new(p.clone()), HandedOff::new(p))
}

impl<S> Call for Pending<S> {
    fn call(&self, result: Result<(), BoxError>) {
        let Some(result) = self.rendezvous.call(result) else {
            return;
        };
        // The body returned before: the node's unit is this call's, so the run is alive until
        // the completion task that carries it is queued.
        let task = sync::lock(&self.task)
            .take()
            .expect("one call completes the node");
        let run = task.run();
        let ok = match result {
            Ok(()) => true,
            Err(e) => {
                run.fail(
                    Error::new(
                        ErrorKind::NodeFailed,
                        format!("{} failed", run.plan.describe(self.node)),
                    )
                    .with_source(e),
                );
                false
            }
        };
        self.queue
            .push_completion(Task::completion(run, self.node, ok));
    }

    fn node(&self) -> u32 {
        self.node
    }
}

impl<S> Handoff for Pending<S> {
    fn body_returned(&self) -> Option<Result<(), BoxError>> {
        self.rendezvous.returned()
    }

    fn body_failed(&self) {
        self.rendezvous.body_failed();
    }
}
