//! The interface a backend builds on (the GPU backend, `boundpool-gpu`, is one), apart from what
//! a user of pools and graphs needs: markers passed from a node to its successors, deferred
//! completions (polled by the worker, or completed from any thread through a [`Completer`]),
//! the idle hook and the wakers that ask for it, extra timeline tracks, and groups named by
//! position.
//!
//! The methods come as extension traits (as `std::os::unix` adds platform methods to `std`'s
//! types): bring them into scope with `use boundpool_scheduler::backend::*;`. They are sealed:
//! only this crate's types implement them.
//!
//! ```
//! use boundpool_scheduler::backend::{Completer, NodeCtxExt, PoolBuilderExt, PoolExt};
//! use boundpool_scheduler::{GraphBuilder, PoolBuilder};
//! use std::task::Poll;
//!
//! let pool = PoolBuilder::new()
//!     .workers(1)
//!     .idle_hook(|info, _| println!("worker {} looks after its releases", info.index))
//!     .build()?;
//! let mut g = GraphBuilder::new("deferred");
//! let a = g.node("a", |ctx| {
//!     // Complete once polled three times (a device event would be polled here).
//!     let mut polls = 0;
//!     ctx.complete_when(move |_| {
//!         polls += 1;
//!         if polls == 3 { Poll::Ready(Ok(())) } else { Poll::Pending }
//!     });
//!     Ok(())
//! });
//! let b = g.node("b", |_| Ok(7u32));
//! g.edge(a, b);
//! let out = pool.submit(&g.build()?)?.wait()?;
//! assert_eq!(out.get(b), Some(&7));
//! // Ask a worker of the host group to run its idle hook soon.
//! pool.group_waker(pool.group("host").unwrap()).wake();
//!
//! // A node completed by another thread (a network or device thread would be that thread).
//! let (tx, rx) = std::sync::mpsc::channel::<Completer>();
//! let finisher = std::thread::spawn(move || {
//!     for c in rx {
//!         c.complete(Ok(())); // its successor runs on a worker, woken for it
//!     }
//! });
//! let mut g = GraphBuilder::new("external");
//! let a = g.node("a", move |ctx| {
//!     tx.send(ctx.complete_later()).unwrap();
//!     Ok(1u32)
//! });
//! let b = g.node("b", move |ctx| Ok(ctx.input(a)? + 1));
//! g.edge(a, b);
//! let graph = g.build()?;
//! assert_eq!(pool.run(&graph)?.get(b), Some(&2));
//! drop(graph); // the body's sender goes with it, and the finisher's loop ends
//! finisher.join().unwrap();
//! # Ok::<(), boundpool_scheduler::Error>(())
//! ```

use std::any::Any;
use std::fmt;
use std::sync::Arc;
use std::task::Poll;
use std::time::Instant;

use crate::config::WorkerInfo;
use crate::ctx::{Deferral, Inputs, NodeCtx};
use crate::error::BoxError;
use crate::ids::{DomainId, GroupId, NodeId, Priority};
use crate::pool::{Pool, PoolBuilder};
use crate::sleep::Sleep;

pub use crate::later::Completer;
pub use crate::trace::SpanRecorder;

mod sealed {
    /// Keeps the extension traits to this crate's types.
    pub trait Sealed {}
    impl<S> Sealed for crate::ctx::NodeCtx<'_, S> {}
    impl Sealed for crate::ctx::Inputs<'_> {}
    impl<S> Sealed for crate::pool::PoolBuilder<S> {}
    impl<S: Send + 'static> Sealed for crate::pool::Pool<S> {}
    impl<S: Send + 'static> Sealed for crate::graph::GraphBuilder<S> {}
    impl Sealed for crate::ids::GroupId {}
    impl Sealed for crate::ids::DomainId {}
}

/// A backend's methods of [`NodeCtx`].
pub trait NodeCtxExt<S>: sealed::Sealed {
    /// Attaches a side value to this node's completion, readable by direct successors through
    /// [`InputsExt::predecessor_markers`] (the GPU backend attaches the event recorded after
    /// the node's work). Replaces an earlier marker.
    ///
    /// # Panics
    /// If the run's output slots cannot be allocated (the message is that of an
    /// [`ErrorKind::TooLarge`](crate::error::ErrorKind::TooLarge) error; the node fails with it).
    fn set_marker(&self, marker: Box<dyn Any + Send + Sync>);

    /// Defers this node's completion: after the body returns, its successors are released (and
    /// its graph's completion counted) only once `poll` returns `Ready(Ok(()))`; `Ready(Err(_))`
    /// fails the graph naming this node. The same worker polls it when it has nothing else to
    /// do, backing off (yields, then short timed parks); a node of the
    /// [`High`](crate::Priority::High) level's poll also between the other nodes it runs, so a
    /// latency-critical request's device work is seen done while its worker is busy with
    /// other levels. A later call replaces the poll.
    ///
    /// # Panics
    /// If this body called [`complete_later`](Self::complete_later) (a node defers one way).
    fn complete_when(&self, poll: impl FnMut(&S) -> Poll<Result<(), BoxError>> + Send + 'static);

    /// Defers this node's completion to the returned [`Completer`], which any thread may
    /// complete, before or after the body returns: the successors are released once both the
    /// body returned `Ok` and the completer was called (with `Ok`), by a worker of the node's
    /// placement (the one that ran the body, if the call came first; otherwise one that takes
    /// the completion from the node's injector, woken for it), never on the completing thread
    /// and without any worker polling. `Err` from the completer, or a completer dropped
    /// without a call, fails the graph naming this node; a body that fails or panics fails it
    /// at once, and the completer's call then does nothing.
    ///
    /// For completions another thread learns of (a network thread's arrivals, a device
    /// callback): [`complete_when`](Self::complete_when) costs a poll per idle round of the
    /// registering worker, this a queue push and a wake-up per completion.
    ///
    /// # Panics
    /// If this body deferred its completion already (with either method).
    fn complete_later(&self) -> Completer;

    /// The priority of node `id` of the running graph (its own, or its graph's;
    /// [`Priority::Normal`] for a node of another graph): the GPU
    /// backend hands its stream over only to a successor of its own level.
    fn priority_of(&self, id: NodeId) -> Priority;

    /// Whether node `id` of the running graph is a device node
    /// ([`GraphBuilderExt::mark_device_node`]; `false` for a node of another graph): the GPU
    /// backend orders a device successor on the device, and makes any other wait for its
    /// work, wherever it is placed.
    fn is_device_node(&self, id: NodeId) -> bool;
}

/// A backend's methods of [`GraphBuilder`](crate::GraphBuilder).
pub trait GraphBuilderExt: sealed::Sealed {
    /// Marks `node` as a device node: one whose body hands its work to a device and whose
    /// successors the backend orders itself ([`NodeCtxExt::is_device_node`]). The GPU backend
    /// marks its GPU nodes, so that a host node placed on a device's workers is still one
    /// that waits for its GPU predecessors' work. A node of another graph is an error at
    /// `build`. Marks travel with a graph inlined into another.
    fn mark_device_node(&mut self, node: impl Into<NodeId>) -> &mut Self;
}

impl<S: Send + 'static> GraphBuilderExt for crate::graph::GraphBuilder<S> {
    fn mark_device_node(&mut self, node: impl Into<NodeId>) -> &mut Self {
        self.mark_device(node.into());
        self
    }
}

impl<S: Send + 'static> NodeCtxExt<S> for NodeCtx<'_, S> {
    #[inline]
    fn set_marker(&self, marker: Box<dyn Any + Send + Sync>) {
        let run = self.inputs.run;
        let Some(slot) = run.slots().get_or_alloc(self.inputs.node) else {
            panic!("{}", run.slots_too_large());
        };
        // SAFETY: this worker is running the node, so it is the slot's only writer, and no
        // successor reads it before the node completes.
        unsafe { slot.set_marker(marker) }
    }

    #[inline]
    fn complete_when(&self, poll: impl FnMut(&S) -> Poll<Result<(), BoxError>> + Send + 'static) {
        if self.host.deferred_later() {
            panic!(
                "{} called complete_when after complete_later: a node defers its completion one \
                 way",
                describe(&self.inputs)
            );
        }
        self.host.set_deferred(Deferral::Poll(Box::new(poll)));
    }

    fn complete_later(&self) -> Completer {
        if let Some(how) = self.host.deferral_kind() {
            panic!(
                "{} called complete_later after {how}: a node defers its completion once",
                describe(&self.inputs)
            );
        }
        let (completer, handed) =
            (self.host.pool.clone()).complete_later(self.inputs.run, self.inputs.node);
        self.host.set_deferred(Deferral::Later(handed));
        completer
    }

    #[inline]
    fn priority_of(&self, id: NodeId) -> Priority {
        self.inputs.run.priority_of(id)
    }

    #[inline]
    fn is_device_node(&self, id: NodeId) -> bool {
        self.inputs.run.is_device_node(id)
    }
}

/// "node 'name' (#i) of graph 'g'" of the node whose body sees `inputs`.
fn describe(inputs: &Inputs<'_>) -> String {
    format!(
        "node '{}' (#{}) of graph '{}'",
        crate::error::bounded(inputs.node_name()),
        inputs.node,
        crate::error::bounded(inputs.graph_name())
    )
}

/// A backend's methods of [`Inputs`] (and so of [`NodeCtx`], which dereferences to it).
pub trait InputsExt<'a>: sealed::Sealed {
    /// Markers that direct predecessors attached with [`NodeCtxExt::set_marker`].
    ///
    /// # Panics
    /// As [`Inputs::predecessors`].
    fn predecessor_markers(
        &self,
    ) -> impl Iterator<Item = (NodeId, &'a (dyn Any + Send + Sync))> + 'a;
}

impl<'a> InputsExt<'a> for Inputs<'a> {
    #[inline]
    fn predecessor_markers(
        &self,
    ) -> impl Iterator<Item = (NodeId, &'a (dyn Any + Send + Sync))> + 'a {
        let g = self.run.graph_uid();
        let slots = self.run.slots();
        self.run
            .predecessors(self.node)
            .unwrap_or_else(|e| panic!("{e}"))
            .iter()
            .filter_map(move |&index| {
                // SAFETY: a direct predecessor completed before this node became ready.
                let out = unsafe { slots.get(index)?.get() }?;
                out.marker
                    .as_deref()
                    .map(|m| (NodeId { graph: g, index }, m))
            })
    }
}

/// A backend's settings of [`PoolBuilder`].
pub trait PoolBuilderExt<S>: sealed::Sealed + Sized {
    /// Runs on a worker each time it runs out of work (before it parks) and every 64 nodes it
    /// runs: the place for deferred releases. [`GroupWaker::wake`] makes a worker of the
    /// waker's group run it soon, also one that was about to park.
    /// A panic in it aborts the process with a message naming the worker: a worker cannot go on
    /// without the state its hook keeps, and one that quietly exited would leave its graphs
    /// waiting.
    fn idle_hook(self, f: impl Fn(&WorkerInfo, &S) + Send + Sync + 'static) -> Self;

    /// Runs on a worker with nothing to run, between its looks at the queues while it spins
    /// before parking ([`PoolBuilder::idle_spin`]): the place to make progress on something
    /// outside the pool that completes nodes (a network's arrivals), on a thread that is
    /// awake anyway. Returns whether it did anything (the spin then starts over). A
    /// [`Completer`] it calls for a node this worker may run queues the completion for this
    /// worker, which takes it as soon as the hook returns: no peer is woken, and the
    /// successors run here. Keep it short (it delays the worker's next look) and never
    /// blocking. A panic in it aborts the process, as one in the idle hook does.
    fn spin_hook(self, f: impl Fn(&WorkerInfo, &S) -> bool + Send + Sync + 'static) -> Self;
}

impl<S: Send + 'static> PoolBuilderExt<S> for PoolBuilder<S> {
    fn idle_hook(mut self, f: impl Fn(&WorkerInfo, &S) + Send + Sync + 'static) -> Self {
        self.idle = Some(Arc::new(f));
        self
    }

    fn spin_hook(mut self, f: impl Fn(&WorkerInfo, &S) -> bool + Send + Sync + 'static) -> Self {
        self.spin = Some(Arc::new(f));
        self
    }
}

/// A backend's methods of [`Pool`].
pub trait PoolExt: sealed::Sealed {
    /// A handle that wakes an idle worker of `group` so it runs its idle hook.
    fn group_waker(&self, group: GroupId) -> GroupWaker;

    /// A handle that makes a worker of `domain` (any of its groups) run its idle hook.
    ///
    /// # Panics
    /// If the pool has no such domain.
    fn domain_waker(&self, domain: DomainId) -> GroupWaker;

    /// Adds a slice to an extra timeline track named `track` (created on first use), for example
    /// a GPU stream's busy time. Does nothing unless the pool records a trace.
    fn record_span(&self, track: &str, name: &str, start: Instant, end: Instant);

    /// A handle that adds slices to extra tracks from any thread (what
    /// [`record_span`](Self::record_span) does, without a borrow of the pool); `None` unless
    /// the pool records a trace.
    fn span_recorder(&self) -> Option<SpanRecorder>;
}

impl<S: Send + 'static> PoolExt for Pool<S> {
    fn group_waker(&self, group: GroupId) -> GroupWaker {
        GroupWaker {
            sleep: self.registry.sleep.clone(),
            groups: Arc::from([group.index()]),
        }
    }

    fn domain_waker(&self, domain: DomainId) -> GroupWaker {
        GroupWaker {
            sleep: self.registry.sleep.clone(),
            groups: self.registry.domains[domain.index()].groups.clone(),
        }
    }

    fn record_span(&self, track: &str, name: &str, start: Instant, end: Instant) {
        if let Some(t) = &self.registry.trace {
            t.span(track, name, None, start, end);
        }
    }

    fn span_recorder(&self) -> Option<SpanRecorder> {
        self.registry
            .trace
            .as_ref()
            .map(|t| SpanRecorder::new(t.clone()))
    }
}

/// Group and domain ids by position, for a backend that lays out a pool's groups itself (a
/// user gets them by name: [`Pool::group`], [`Pool::domain`]).
pub trait FromIndex: sealed::Sealed {
    /// The id at position `index` (a group's as given to [`PoolBuilder::groups`], a domain's in
    /// the order [`PoolBuilder::domain`] was called).
    ///
    /// # Panics
    /// If `index` does not fit in `u32`.
    fn from_index(index: usize) -> Self;
}

impl FromIndex for GroupId {
    fn from_index(index: usize) -> Self {
        GroupId(u32::try_from(index).expect("group index fits in u32"))
    }
}

impl FromIndex for DomainId {
    fn from_index(index: usize) -> Self {
        DomainId(u32::try_from(index).expect("domain index fits in u32"))
    }
}

/// Makes a worker of one group, or of a domain's groups, run its idle hook (see
/// [`PoolBuilderExt::idle_hook`], [`PoolExt::group_waker`], [`PoolExt::domain_waker`]). Cheap to
/// clone; usable from any thread, also after the pool is gone (it then does nothing useful).
#[derive(Clone)]
pub struct GroupWaker {
    sleep: Arc<Sleep>,
    groups: Arc<[usize]>,
}

impl fmt::Debug for GroupWaker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GroupWaker")
            .field("groups", &self.groups)
            .finish()
    }
}

impl GroupWaker {
    /// Makes a worker of the group (of the domain's groups, for a domain waker) run its idle
    /// hook soon, whatever the workers are doing: an idle one is woken; one about to park
    /// runs the hook first; a busy one runs it within 64 nodes. Call it after making what the
    /// hook should handle visible (a handle queued for release): the hook runs after the call.
    pub fn wake(&self) {
        self.sleep.request_hook(&self.groups);
    }
}
