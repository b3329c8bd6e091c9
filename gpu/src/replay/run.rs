//! One run of a replay graph: its [`RunInputs`], the [`ReplayHandle`] it is waited or awaited
//! through, its [`ReplayOutput`]; and the [`Lease`] of instances runs take and give back (a run
//! that finds every replayed instance busy waits for one, first come first served).

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Condvar, Mutex};
use std::task::{Context, Poll, Waker};

use boundpool_scheduler::{GraphHandle, GraphOutput, NodeRef};

use crate::error::{GpuError, GpuErrorKind, GpuResult};
use crate::pool::GpuPool;

use super::desc::{Desc, Kind, Out, RNode};
use super::graph::{make_instance, sched_error, Instance, Mode};
use super::instance::{InstanceState, Shared};

/// The values a run brings for its graph's input nodes
/// ([`ReplayBuilder::input`](super::ReplayBuilder::input)).
///
/// ```
/// # use boundpool_gpu::{ReplayBuilder, RunInputs};
/// let mut b = ReplayBuilder::new("served");
/// let x = b.input::<Vec<f32>>("x");
/// let inputs = RunInputs::new().set(x, vec![1.0; 8]);
/// # let _ = inputs;
/// ```
#[derive(Default)]
pub struct RunInputs {
    values: Vec<(u64, u32, Out)>,
}

impl fmt::Debug for RunInputs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunInputs")
            .field("values", &self.values.len())
            .finish()
    }
}

impl RunInputs {
    /// No values yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// `value` for input node `node` (a later value for the same node replaces it).
    pub fn set<T: Send + Sync + 'static>(self, node: RNode<T>, value: T) -> Self {
        self.set_arc(node, Arc::new(value))
    }

    /// [`set`](Self::set) of a value already shared.
    pub fn set_arc<T: Send + Sync + 'static>(mut self, node: RNode<T>, value: Arc<T>) -> Self {
        self.values.retain(|v| (v.0, v.1) != (node.graph, node.idx));
        self.values.push((node.graph, node.idx, value as Out));
        self
    }

    /// The values by input ordinal, or the error naming what is wrong.
    fn into_feeds(self, desc: &Desc) -> GpuResult<Vec<Out>> {
        let bad = |m: String| {
            GpuError::new(
                GpuErrorKind::InvalidArgument,
                format!("replay graph '{}': {m}", desc.name),
            )
        };
        let mut feeds: Vec<Option<Out>> = vec![None; desc.inputs.len()];
        for (graph, idx, value) in self.values {
            if graph != desc.uid {
                return Err(bad(
                    "a run input names a node of another replay graph".into()
                ));
            }
            match desc.kinds[idx as usize] {
                Kind::Input(o) => feeds[o as usize] = Some(value),
                _ => {
                    return Err(bad(format!(
                        "node '{}' is given a run input but is not an input node",
                        desc.names[idx as usize]
                    )))
                }
            }
        }
        feeds
            .into_iter()
            .enumerate()
            .map(|(o, v)| {
                v.ok_or_else(|| {
                    bad(format!(
                        "the run brings no value for input node '{}'",
                        desc.names[desc.inputs[o] as usize]
                    ))
                })
            })
            .collect()
    }
}

/// A run waiting for a replayed instance: the release hands one over here.
struct Ticket {
    slot: Mutex<TicketSlot>,
    handed: Condvar,
}

#[derive(Default)]
struct TicketSlot {
    instance: Option<Instance>,
    waker: Option<Waker>,
    withdrawn: bool,
}

impl Ticket {
    fn lock(&self) -> std::sync::MutexGuard<'_, TicketSlot> {
        self.slot.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[derive(Default)]
struct Replayed {
    free: Vec<Instance>,
    made: usize,
    waiting: VecDeque<Arc<Ticket>>,
}

/// A graph's instances: replayed ones (at most `max`, each captured at its first run) and
/// eager ones (made as needed), with the runs waiting for a replayed one.
pub(super) struct Lease {
    replayed: Mutex<Replayed>,
    eager: Mutex<Vec<Instance>>,
    max: usize,
}

impl Lease {
    pub(super) fn new(max: usize) -> Self {
        Self {
            replayed: Mutex::new(Replayed::default()),
            eager: Mutex::new(Vec::new()),
            max,
        }
    }

    fn replayed(&self) -> std::sync::MutexGuard<'_, Replayed> {
        self.replayed.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn made(&self) -> usize {
        self.replayed().made
    }

    /// A free instance, a new one, or (replayed, all busy) a ticket to wait on.
    fn take(
        &self,
        desc: &Arc<Desc>,
        shared: &Arc<Shared>,
        mode: Mode,
    ) -> GpuResult<Result<Instance, Arc<Ticket>>> {
        if mode == Mode::Eager {
            let free = self.eager.lock().unwrap_or_else(|e| e.into_inner()).pop();
            return match free {
                Some(i) => Ok(Ok(i)),
                None => make_instance(desc, shared, Mode::Eager).map(Ok),
            };
        }
        let mut r = self.replayed();
        if let Some(i) = r.free.pop() {
            return Ok(Ok(i));
        }
        if r.made >= self.max {
            let t = Arc::new(Ticket {
                slot: Mutex::new(TicketSlot::default()),
                handed: Condvar::new(),
            });
            r.waiting.push_back(t.clone());
            return Ok(Err(t));
        }
        r.made += 1;
        drop(r);
        make_instance(desc, shared, Mode::Replay)
            .map(Ok)
            .inspect_err(|_| {
                // Not made after all: a waiter may need the place.
                self.replayed().made -= 1;
            })
    }

    /// The end of a run: its instance goes to the first run waiting for one, or back to the
    /// free list. Runs on the thread that finished the run's graph (a worker): short.
    fn release(&self, inst: Instance) {
        inst.feeds.clear();
        if inst.state.is_none() {
            self.eager
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(inst);
            return;
        }
        let mut r = self.replayed();
        let mut inst = Some(inst);
        while let Some(t) = r.waiting.pop_front() {
            let mut slot = t.lock();
            if slot.withdrawn {
                continue;
            }
            slot.instance = inst.take();
            let waker = slot.waker.take();
            drop(slot);
            t.handed.notify_one();
            if let Some(w) = waker {
                w.wake();
            }
            return;
        }
        r.free.extend(inst);
    }

    /// A waiting run gives up its place (its handle was dropped); an instance already handed
    /// to it goes on to the next.
    fn withdraw(&self, t: &Arc<Ticket>) {
        let mut r = self.replayed();
        r.waiting.retain(|w| !Arc::ptr_eq(w, t));
        drop(r);
        let handed = {
            let mut slot = t.lock();
            slot.withdrawn = true;
            slot.instance.take()
        };
        if let Some(i) = handed {
            self.release(i);
        }
    }
}

enum State {
    Waiting {
        ticket: Arc<Ticket>,
        feeds: Vec<Out>,
    },
    Running {
        graph: GraphHandle,
        refs: Arc<[Option<NodeRef<Out>>]>,
        state: Option<Arc<InstanceState>>,
        inputs: Vec<Option<Out>>,
    },
    Done,
}

/// A submitted run of a [`Replayable`](crate::Replayable) ([`Replayable::submit`](crate::Replayable::submit)): [`wait`](Self::wait) blocks
/// for its outputs, `.await` waits without blocking (no particular runtime needed). Dropping it
/// while it waits for an instance withdraws the run; once started, the run goes on and its
/// instance is given back when it ends.
#[must_use = "a replay handle does nothing unless waited on or awaited"]
pub struct ReplayHandle<'p> {
    desc: &'p Arc<Desc>,
    lease: &'p Arc<Lease>,
    pool: &'p GpuPool,
    state: State,
}

impl fmt::Debug for ReplayHandle<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Waiting { .. } => "waiting for an instance",
            State::Running { .. } => "running",
            State::Done => "done",
        };
        f.debug_struct("ReplayHandle")
            .field("graph", &self.desc.name)
            .field("state", &state)
            .finish()
    }
}

impl<'p> ReplayHandle<'p> {
    /// A run of the graph `desc` (its instances' `shared` state and `lease`) on `pool`.
    pub(super) fn submit(
        desc: &'p Arc<Desc>,
        shared: &Arc<Shared>,
        lease: &'p Arc<Lease>,
        pool: &'p GpuPool,
        inputs: RunInputs,
        mode: Mode,
    ) -> GpuResult<Self> {
        let feeds = inputs.into_feeds(desc)?;
        let state = match lease.take(desc, shared, mode)? {
            Ok(inst) => Self::start(lease, pool, inst, feeds)?,
            Err(ticket) => State::Waiting { ticket, feeds },
        };
        Ok(Self {
            desc,
            lease,
            pool,
            state,
        })
    }

    /// Submits `inst`'s graph with `feeds`; the instance is given back when the run ends.
    fn start(
        lease: &Arc<Lease>,
        pool: &GpuPool,
        inst: Instance,
        feeds: Vec<Out>,
    ) -> GpuResult<State> {
        inst.feeds.set(feeds);
        let (refs, state, inputs) = (inst.refs.clone(), inst.state.clone(), inst.feeds.values());
        match pool.submit(&inst.graph) {
            Ok(graph) => {
                let lease = lease.clone();
                graph.on_done(move || lease.release(inst));
                Ok(State::Running {
                    graph,
                    refs,
                    state,
                    inputs,
                })
            }
            Err(e) => {
                lease.release(inst);
                Err(e)
            }
        }
    }

    /// Whether the run has finished (successfully or not).
    pub fn is_done(&self) -> bool {
        match &self.state {
            State::Waiting { .. } => false,
            State::Running { graph, .. } => graph.is_done(),
            State::Done => true,
        }
    }

    /// Blocks until the run has finished: its outputs, or the error of the node that failed
    /// it. Inside a node of the pool, waits for an instance block the worker; waiting for the
    /// run itself runs the pool's other nodes meanwhile.
    pub fn wait(mut self) -> GpuResult<ReplayOutput> {
        if let State::Waiting { ticket, .. } = &self.state {
            let inst = {
                let mut slot = ticket.lock();
                loop {
                    if let Some(i) = slot.instance.take() {
                        break i;
                    }
                    slot = ticket.handed.wait(slot).unwrap_or_else(|e| e.into_inner());
                }
            };
            self.begin(inst)?;
        }
        match std::mem::replace(&mut self.state, State::Done) {
            State::Running {
                graph,
                refs,
                state,
                inputs,
            } => {
                let out = graph.wait().map_err(sched_error)?;
                Ok(self.output(out, refs, state, inputs))
            }
            _ => unreachable!("a started run is running"),
        }
    }

    /// Starts a waiting run on the instance handed to it.
    fn begin(&mut self, inst: Instance) -> GpuResult<()> {
        let State::Waiting { feeds, .. } = std::mem::replace(&mut self.state, State::Done) else {
            unreachable!("only a waiting run begins")
        };
        self.state = Self::start(self.lease, self.pool, inst, feeds)?;
        Ok(())
    }

    fn output(
        &self,
        out: GraphOutput,
        refs: Arc<[Option<NodeRef<Out>>]>,
        state: Option<Arc<InstanceState>>,
        inputs: Vec<Option<Out>>,
    ) -> ReplayOutput {
        ReplayOutput {
            out,
            refs,
            state,
            inputs,
            desc: self.desc.clone(),
        }
    }
}

impl Future for ReplayHandle<'_> {
    type Output = GpuResult<ReplayOutput>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // Every field is `Unpin`.
        let this = self.get_mut();
        if let State::Waiting { ticket, .. } = &this.state {
            let handed = {
                let mut slot = ticket.lock();
                let i = slot.instance.take();
                if i.is_none() {
                    slot.waker = Some(cx.waker().clone());
                }
                i
            };
            match handed {
                Some(inst) => this.begin(inst)?,
                None => return Poll::Pending,
            }
        }
        let State::Running { graph, .. } = &mut this.state else {
            panic!("ReplayHandle polled after it returned Ready");
        };
        let out = match Pin::new(graph).poll(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(r) => r.map_err(sched_error),
        };
        let State::Running {
            refs,
            state,
            inputs,
            ..
        } = std::mem::replace(&mut this.state, State::Done)
        else {
            unreachable!("checked above")
        };
        Poll::Ready(out.map(|out| this.output(out, refs, state, inputs)))
    }
}

impl Drop for ReplayHandle<'_> {
    fn drop(&mut self) {
        if let State::Waiting { ticket, .. } = &self.state {
            self.lease.withdraw(ticket);
        }
    }
}

/// The outputs of one run: host, input and eager nodes' values of this run; captured nodes'
/// values from their capture (shared with later runs of the same instance: same buffers, which
/// the next run of the instance overwrites on the device).
pub struct ReplayOutput {
    out: GraphOutput,
    refs: Arc<[Option<NodeRef<Out>>]>,
    state: Option<Arc<InstanceState>>,
    /// The run's input values, by input ordinal.
    inputs: Vec<Option<Out>>,
    desc: Arc<Desc>,
}

impl fmt::Debug for ReplayOutput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReplayOutput")
            .field("graph", &self.desc.name)
            .field("replayed", &self.state.is_some())
            .finish()
    }
}

impl ReplayOutput {
    /// The output of node `r`: `None` for a node whose output its successor took
    /// ([`ReplayCtx::take`](super::ReplayCtx::take): replayed, the taker's output is what the
    /// instance keeps).
    pub fn get<T: Send + Sync + 'static>(&self, r: RNode<T>) -> Option<Arc<T>> {
        let v: Out = match (&self.state, self.desc.kinds.get(r.idx as usize)?) {
            (_, Kind::Input(o)) => self.inputs.get(*o as usize)?.clone()?,
            (Some(s), _) if self.desc.captured(r.idx) => s.outputs.get(r.idx)?,
            _ => self.out.get((*self.refs.get(r.idx as usize)?)?)?.clone(),
        };
        v.downcast::<T>().ok()
    }
}

#[cfg(test)]
mod tests {
    //! The run side without a GPU: a graph of host and input nodes only has no segment, so its
    //! instances are plain scheduler graphs (built, never submitted here).

    use super::*;
    use crate::replay::builder::ReplayBuilder;
    use crate::replay::desc::ReplayCtx;
    use crate::replay::replayable::Replayable;

    fn host_graph(max: usize) -> (Replayable, RNode<u32>, RNode<String>, RNode<u32>) {
        let mut b = ReplayBuilder::new("host");
        b.instances(max);
        let a = b.input::<u32>("a");
        let s = b.input::<String>("s");
        let h = b.host_node("h", move |c: &ReplayCtx<'_, '_>| {
            Ok(*c.input(a)? + c.input(s)?.len() as u32)
        });
        b.edge(a, h).edge(s, h);
        (b.build().expect("a host graph builds"), a, s, h)
    }

    #[test]
    fn run_inputs_are_ordered_by_input_and_checked() {
        let (r, a, s, h) = host_graph(1);
        let feeds = RunInputs::new()
            .set(s, "xy".to_string())
            .set(a, 1)
            .set(a, 7)
            .into_feeds(&r.desc)
            .expect("every input given");
        assert_eq!(feeds.len(), 2);
        assert_eq!(feeds[0].clone().downcast::<u32>().ok().as_deref(), Some(&7));
        assert_eq!(
            feeds[1].clone().downcast::<String>().ok().as_deref(),
            Some(&"xy".to_string())
        );
        let e = RunInputs::new().set(a, 1).into_feeds(&r.desc).unwrap_err();
        assert_eq!(e.kind(), GpuErrorKind::InvalidArgument);
        assert!(e.to_string().contains("input node 's'"), "{e}");
        let e = RunInputs::new()
            .set(a, 1)
            .set(s, String::new())
            .set(h, 3)
            .into_feeds(&r.desc)
            .unwrap_err();
        assert!(e.to_string().contains("'h' is given a run input"), "{e}");
        let (other, oa, ..) = host_graph(1);
        let e = RunInputs::new()
            .set(oa, 1)
            .set(s, String::new())
            .into_feeds(&r.desc)
            .unwrap_err();
        assert!(e.to_string().contains("another replay graph"), "{e}");
        drop(other);
    }

    fn take(r: &Replayable, mode: Mode) -> Result<Instance, Arc<Ticket>> {
        r.lease
            .take(&r.desc, &r.shared, mode)
            .expect("an instance of a host graph builds")
    }

    fn handed(t: &Arc<Ticket>) -> Option<Instance> {
        t.lock().instance.take()
    }

    #[test]
    fn instances_go_to_waiting_runs_in_order_and_withdrawn_runs_pass_theirs_on() {
        let (r, ..) = host_graph(2);
        let i1 = take(&r, Mode::Replay).ok().expect("first instance made");
        let i2 = take(&r, Mode::Replay).ok().expect("second instance made");
        assert_eq!(r.instances(), 2);
        let t1 = take(&r, Mode::Replay).err().expect("both busy: a ticket");
        let t2 = take(&r, Mode::Replay).err().expect("both busy: a ticket");
        let t3 = take(&r, Mode::Replay).err().expect("both busy: a ticket");
        assert_eq!(r.instances(), 2, "no third instance");
        // The first waiter gets the first instance given back.
        r.lease.release(i1);
        let got1 = handed(&t1).expect("the first waiter is served first");
        assert!(handed(&t2).is_none() && handed(&t3).is_none());
        // A waiter handed an instance, then withdrawn, passes it to the next one.
        r.lease.release(i2);
        assert!(t2.lock().instance.is_some());
        r.lease.withdraw(&t2);
        assert!(
            t2.lock().instance.is_none(),
            "withdrawn: its instance moved on"
        );
        let got3 = handed(&t3).expect("the next waiter got it");
        // With nobody waiting, a given-back instance is free for the next take.
        r.lease.withdraw(&t1);
        r.lease.release(got1);
        r.lease.release(got3);
        assert!(take(&r, Mode::Replay).is_ok());
        assert!(take(&r, Mode::Replay).is_ok());
        assert!(take(&r, Mode::Replay).is_err());
        assert_eq!(r.instances(), 2);
    }

    #[test]
    fn eager_runs_never_wait_and_reuse_their_instances() {
        let (r, ..) = host_graph(1);
        let e1 = take(&r, Mode::Eager).ok().expect("eager instance");
        let e2 = take(&r, Mode::Eager).ok().expect("another, never a ticket");
        assert_eq!(r.instances(), 0, "eager instances are not replayed ones");
        let f1 = e1.feeds.clone();
        r.lease.release(e1);
        r.lease.release(e2);
        let again = take(&r, Mode::Eager).ok().expect("a free one");
        let again2 = take(&r, Mode::Eager).ok().expect("the other free one");
        assert!(
            Arc::ptr_eq(&again.feeds, &f1) || Arc::ptr_eq(&again2.feeds, &f1),
            "a given-back eager instance is reused"
        );
    }
}
