//! The graph users build: [`RankGraphBuilder`] (nodes that name their rank or the datum they
//! write, with typed bodies), lowered by `build` into this rank's [`RankGraph`]: scheduler
//! graphs of this rank's nodes plus a send node per outgoing transfer and a receive node per
//! incoming one. Each run slot has its own scheduler graph, whose send and receive nodes know
//! the slot's current run.

use std::any::Any;
use std::marker::PhantomData;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use boundpool_scheduler::backend::NodeCtxExt;
use boundpool_scheduler::{BoxError, Graph, GraphBuilder, GroupId, NodeCtx, NodeId};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::comm::run::{CommGraph, RecvCell, RecvSpec, RunState, SendSpec};
use crate::comm::stamps::SendHop;
use crate::comm::wire::{FailKind, Failure, LANE_TRAILER};
use crate::comm::{CommHandle, Command, Payload, Sent, SMALL_SEND};
use crate::error::{Error, ErrorKind};
use crate::plan::{self, DataId, GraphDesc, LocalNode, Lowering, On, Wire};
use crate::value::{self, LandFn, PlainValue, ReclaimFn};

static BUILDERS: AtomicU64 = AtomicU64::new(1);

/// A typed reference to a node of a [`RankGraphBuilder`]: successors on any rank read its
/// output with [`RankCtx::input`], the submitter of a run with [`RankOutput::get`](crate::RankOutput::get).
pub struct NodeRef<T> {
    builder: u64,
    index: u32,
    _t: PhantomData<fn() -> T>,
}

impl<T> Clone for NodeRef<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for NodeRef<T> {}

impl<T> std::fmt::Debug for NodeRef<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "NodeRef<{}>(#{})",
            std::any::type_name::<T>(),
            self.index
        )
    }
}

impl<T> NodeRef<T> {
    /// The node's index in its graph (its [`GraphDesc`] position).
    pub fn index(&self) -> u32 {
        self.index
    }
}

/// An untyped node of a [`RankGraphBuilder`], for edges.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RankNodeId {
    builder: u64,
    index: u32,
}

impl<T> From<NodeRef<T>> for RankNodeId {
    fn from(r: NodeRef<T>) -> Self {
        RankNodeId {
            builder: r.builder,
            index: r.index,
        }
    }
}

/// What a node body sees: its inputs, on any rank, and its rank.
pub struct RankCtx<'a, S> {
    ctx: &'a NodeCtx<'a, S>,
    env: &'a SlotEnv,
}

impl<S> std::fmt::Debug for RankCtx<'_, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RankCtx")
            .field("rank", &self.env.graph.rank)
            .field("graph", &self.env.graph.name)
            .finish()
    }
}

impl<'a, S: Send + 'static> RankCtx<'a, S> {
    /// The context of a node of `env`'s slot graph running with scheduler context `ctx`.
    pub(crate) fn new(ctx: &'a NodeCtx<'a, S>, env: &'a SlotEnv) -> Self {
        RankCtx { ctx, env }
    }

    /// The output of `from`, a direct predecessor (an edge `from -> this`): computed on this
    /// rank, or received from the rank that computed it.
    pub fn input<T: 'static>(&self, from: NodeRef<T>) -> Result<&'a T, Error> {
        let bad = |what: String| {
            Error::new(
                ErrorKind::InvalidGraph,
                format!(
                    "node '{}' of graph '{}' {what}",
                    crate::error::bounded(self.ctx.node_name()),
                    crate::error::bounded(&self.env.graph.name)
                ),
            )
        };
        if from.builder != self.env.builder {
            return Err(bad("reads a node of another graph builder".into()));
        }
        let map = self.env.map.get().expect("the slot graph is mapped");
        match map.get(from.index as usize) {
            Some(Mapped::Local(r)) => {
                let r = r
                    .downcast_ref::<boundpool_scheduler::NodeRef<T>>()
                    .ok_or_else(|| {
                        bad(format!(
                            "reads node #{} as {}, which is not its output type",
                            from.index,
                            std::any::type_name::<T>()
                        ))
                    })?;
                Ok(self.ctx.input(*r)?)
            }
            Some(Mapped::Remote(r)) => {
                let received: &'a Received = self.ctx.input(*r)?;
                received.get::<T>().ok_or_else(|| {
                    bad(format!(
                        "reads node #{} as {}, which is not its output type (or it did not arrive)",
                        from.index,
                        std::any::type_name::<T>()
                    ))
                })
            }
            _ => Err(bad(format!(
                "reads node #{}, which is neither on this rank nor received here (no edge to it?)",
                from.index
            ))),
        }
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.env.graph.rank
    }

    /// The run's number among this graph's runs (the same on every rank).
    pub fn run_seq(&self) -> u64 {
        self.env.current().seq
    }

    /// The scheduler's context: the worker's state and identity, nested submission.
    pub fn node_ctx(&self) -> &'a NodeCtx<'a, S> {
        self.ctx
    }
}

/// A receive node's output: its run, and which receive.
pub(crate) struct Received {
    run: Arc<RunState>,
    k: u32,
}

impl Received {
    pub(crate) fn get<T: 'static>(&self) -> Option<&T> {
        self.run.recvs[self.k as usize].get()?.downcast_ref::<T>()
    }
}

/// How a node of the graph is read on this rank.
pub(crate) enum Mapped {
    /// Computed here: the scheduler's `NodeRef<T>`.
    Local(Box<dyn Any + Send + Sync>),
    /// Received here: its receive node.
    Remote(boundpool_scheduler::NodeRef<Received>),
    /// Neither.
    Absent,
}

/// What a run slot's nodes share: the slot's current run, and how to read nodes.
pub(crate) struct SlotEnv {
    pub(crate) graph: Arc<CommGraph>,
    pub(crate) comm: CommHandle,
    pub(crate) builder: u64,
    current: Mutex<Option<Arc<RunState>>>,
    pub(crate) map: OnceLock<Box<[Mapped]>>,
}

impl SlotEnv {
    pub(crate) fn current(&self) -> Arc<RunState> {
        self.current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .expect("a slot's nodes run during a run")
    }

    pub(crate) fn set_current(&self, run: Arc<RunState>) {
        *self.current.lock().unwrap_or_else(|p| p.into_inner()) = Some(run);
    }

    /// The slot's run ended here: its nodes no longer read it, so the slot lets go of it (its
    /// received values' memory is recycled once the outputs are dropped, not when the slot's
    /// next run starts).
    pub(crate) fn clear_current(&self) {
        self.current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
    }

    pub(crate) fn failed(&self, node: u32, kind: FailKind, message: String) {
        let run = self.current();
        let failure = Failure {
            rank: self.graph.rank as u32,
            node,
            node_name: self.graph.node_names[node as usize].clone(),
            graph: self.graph.name.clone(),
            message,
            kind,
        };
        self.comm.send(Command::NodeFailed { run, failure });
    }
}

/// The scheduler nodes of one send: edges from the producer go to each of `inputs`; the
/// lowering's NCCL chain (an NCCL transfer) goes through `nccl`.
pub(crate) struct SendNodes {
    pub(crate) inputs: Vec<NodeId>,
    pub(crate) nccl: Option<NodeId>,
}

/// The scheduler nodes of one receive: edges to the consumers leave `out`; the NCCL chain goes
/// through `nccl`; consumers read the value as `mapped` says.
pub(crate) struct RecvNodes {
    pub(crate) out: NodeId,
    pub(crate) nccl: Option<NodeId>,
    pub(crate) mapped: Mapped,
}

/// Adds one kind of node to a slot's scheduler graph; one per node of the rank graph, typed.
/// Host values use [`Maker`]; device values and NCCL collectives (`gpu/`) have makers of
/// their own, whose sends and receives are GPU nodes.
pub(crate) trait NodeMaker<S: Send + 'static>: Send + Sync {
    /// The node itself, on its rank: its id and its typed scheduler reference (boxed).
    fn compute(
        &self,
        gb: &mut GraphBuilder<S>,
        env: &Arc<SlotEnv>,
        index: u32,
    ) -> (NodeId, Box<dyn Any + Send + Sync>);
    /// Send `k` of its value to rank `to`.
    fn send(
        &self,
        gb: &mut GraphBuilder<S>,
        env: &Arc<SlotEnv>,
        producer: &(dyn Any + Send + Sync),
        k: u32,
        to: usize,
    ) -> SendNodes;
    /// How its value lands on a receiving rank.
    fn land(&self) -> Option<LandFn>;
    /// How its value lands on a rank that also forwards it (a relay, `plan::relay`): the
    /// bytes it sends on must stay as they arrived. `None`: it is never forwarded (device
    /// values: the lowering relays host values only).
    fn land_forwarded(&self) -> Option<LandFn> {
        None
    }
    /// Send `k` to rank `to` of the value this rank received in its receive `recv` (a relay:
    /// the bytes as they arrived). Only called for makers whose `land_forwarded` is `Some`.
    fn forward(
        &self,
        gb: &mut GraphBuilder<S>,
        env: &Arc<SlotEnv>,
        recv: u32,
        k: u32,
        to: usize,
    ) -> SendNodes {
        let _ = (gb, env, recv, k, to);
        unreachable!("build_for refuses a relayed value whose maker cannot forward it")
    }
    /// How a received value of it gives its memory back (plain values; see `value::ReclaimFn`);
    /// `None`: not recycled.
    fn reclaim(&self) -> Option<ReclaimFn> {
        None
    }
    /// Receive `k` of its value on this rank (a receive node whose output is a handle to the
    /// arrived value, by default).
    fn recv(
        &self,
        gb: &mut GraphBuilder<S>,
        env: &Arc<SlotEnv>,
        k: u32,
        name: String,
    ) -> RecvNodes {
        let r = add_recv(gb, env, k, name);
        RecvNodes {
            out: r.id(),
            nccl: None,
            mapped: Mapped::Remote(r),
        }
    }
    /// The wire its node takes, decided when the graph is built (a device value goes over NCCL
    /// where its device has a communicator): `None` keeps the description's.
    fn wire_at_build(&self) -> Option<Wire> {
        None
    }
    /// Whether its node places itself (a GPU node, on its device): the runtime's compute
    /// group is not imposed on it.
    fn places_itself(&self) -> bool {
        false
    }
}

type Body<T, S> = dyn Fn(&RankCtx<'_, S>) -> Result<T, BoxError> + Send + Sync;

/// How a send node makes its payload from the producer's value.
type EncodeFn<T> = fn(&T) -> Result<Payload, String>;

/// How a relay's send makes its payload from the value its rank received.
type ForwardFn = fn(&RecvCell) -> Result<Payload, String>;

/// How a host value crosses ranks: sent, landed, forwarded, recycled.
struct Crossing<T> {
    encode: EncodeFn<T>,
    land: value::LandPlain,
    /// The landing on a rank that forwards the value.
    land_forwarded: value::LandPlain,
    forward: ForwardFn,
    reclaim: Option<ReclaimFn>,
}

struct Maker<T, S> {
    name: String,
    body: Arc<Body<T, S>>,
    /// `None`: a local value.
    crossing: Option<Crossing<T>>,
}

fn encode_plain<T: PlainValue>(v: &T) -> Result<Payload, String> {
    let b = value::plain_bytes(v);
    // A small value is copied: its send need not wait for the transport (`comm/send.rs`).
    if b.len() <= SMALL_SEND {
        return Ok(Payload::Owned(owned_copy(b)));
    }
    Ok(Payload::Borrowed {
        ptr: b.as_ptr(),
        len: b.len(),
    })
}

/// A small value's bytes, copied with room for the posted lane's trailer.
fn owned_copy(b: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(b.len() + LANE_TRAILER);
    v.extend_from_slice(b);
    v
}

fn encode_serde<T: Serialize>(v: &T) -> Result<Payload, String> {
    value::serde_bytes(v).map(Payload::Owned)
}

const NOT_ARRIVED: &str = "the value to forward did not arrive";

/// A plain value received here, sent on from its own memory: the bytes as they arrived.
fn forward_plain<T: PlainValue>(cell: &RecvCell) -> Result<Payload, String> {
    let v = cell.get().and_then(|v| v.downcast_ref::<T>());
    encode_plain(v.ok_or(NOT_ARRIVED)?)
}

/// A serde value received here, sent on from the bytes its landing kept (no re-encoding).
fn forward_kept(cell: &RecvCell) -> Result<Payload, String> {
    let b = cell.bytes().ok_or(NOT_ARRIVED)?;
    if b.len() <= SMALL_SEND {
        return Ok(Payload::Owned(owned_copy(b)));
    }
    Ok(Payload::Borrowed {
        ptr: b.as_ptr(),
        len: b.len(),
    })
}

impl<T: PlainValue> Crossing<T> {
    fn plain() -> Self {
        Crossing {
            encode: encode_plain::<T>,
            land: value::plain_landing::<T>,
            land_forwarded: value::plain_landing::<T>,
            forward: forward_plain::<T>,
            reclaim: Some(value::plain_reclaim::<T>),
        }
    }
}

impl<T: Serialize + DeserializeOwned + Send + Sync + 'static> Crossing<T> {
    fn serde() -> Self {
        Crossing {
            encode: encode_serde::<T>,
            land: value::serde_landing::<T>,
            land_forwarded: value::serde_landing_kept::<T>,
            forward: forward_kept,
            reclaim: None,
        }
    }
}

/// Hands `payload` (send `k` of the slot's current run) to the communication thread, or fails
/// the node as `producer`'s failure when it could not be made.
fn send_payload<S: Send + 'static>(
    ctx: &NodeCtx<'_, S>,
    env: &SlotEnv,
    run: Arc<RunState>,
    k: u32,
    payload: Result<Payload, String>,
) -> Result<(), BoxError> {
    let payload = match payload {
        Ok(p) => p,
        Err(msg) => {
            let producer = env.graph.sends[k as usize].producer;
            env.failed(producer, FailKind::Failed, msg.clone());
            return Err(msg.into());
        }
    };
    let cell = run.clone();
    if env.comm.send_value(run, k, payload) == Sent::Pending {
        // Completed by the comm thread once the transport is done with the value.
        cell.sends[k as usize].complete_on(ctx.complete_later());
    }
    Ok(())
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

impl<T: Send + Sync + 'static, S: Send + 'static> NodeMaker<S> for Maker<T, S> {
    fn compute(
        &self,
        gb: &mut GraphBuilder<S>,
        env: &Arc<SlotEnv>,
        index: u32,
    ) -> (NodeId, Box<dyn Any + Send + Sync>) {
        let body = self.body.clone();
        let env = env.clone();
        let r = gb.node(self.name.clone(), move |ctx: &NodeCtx<'_, S>| {
            let rctx = RankCtx { ctx, env: &env };
            match catch_unwind(AssertUnwindSafe(|| body(&rctx))) {
                Ok(Ok(v)) => Ok(v),
                Ok(Err(e)) => {
                    env.failed(index, FailKind::Failed, e.to_string());
                    Err(e)
                }
                Err(p) => {
                    env.failed(index, FailKind::Panicked, panic_message(&*p));
                    resume_unwind(p)
                }
            }
        });
        (r.id(), Box::new(r))
    }

    fn send(
        &self,
        gb: &mut GraphBuilder<S>,
        env: &Arc<SlotEnv>,
        producer: &(dyn Any + Send + Sync),
        k: u32,
        to: usize,
    ) -> SendNodes {
        let from = *producer
            .downcast_ref::<boundpool_scheduler::NodeRef<T>>()
            .expect("the producer's own type");
        let encode = self.crossing.as_ref().expect("a crossing producer").encode;
        let env = env.clone();
        let r = gb.node(
            format!("send '{}' to rank {to}", self.name),
            move |ctx: &NodeCtx<'_, S>| {
                let run = env.current();
                run.stamp_send(k, SendHop::Body);
                let payload = encode(ctx.input(from)?);
                send_payload(ctx, &env, run, k, payload)
            },
        );
        SendNodes {
            inputs: vec![r.id()],
            nccl: None,
        }
    }

    fn land(&self) -> Option<LandFn> {
        self.crossing.as_ref().map(|c| value::land_fn(c.land))
    }

    fn land_forwarded(&self) -> Option<LandFn> {
        self.crossing
            .as_ref()
            .map(|c| value::land_fn(c.land_forwarded))
    }

    fn forward(
        &self,
        gb: &mut GraphBuilder<S>,
        env: &Arc<SlotEnv>,
        recv: u32,
        k: u32,
        to: usize,
    ) -> SendNodes {
        let forward = self.crossing.as_ref().expect("a crossing producer").forward;
        let env = env.clone();
        // After the receive node (the lowering's edge): its cell is filled. A receive that
        // failed fails its node, and the scheduler cancels this one; the failure that caused
        // it reached every rank (a node's `Fail`, a dead peer), so `to` does not wait for it.
        let r = gb.node(
            format!("forward '{}' to rank {to}", self.name),
            move |ctx: &NodeCtx<'_, S>| {
                let run = env.current();
                run.stamp_send(k, SendHop::Body);
                let payload = forward(&run.recvs[recv as usize]);
                send_payload(ctx, &env, run, k, payload)
            },
        );
        SendNodes {
            inputs: vec![r.id()],
            nccl: None,
        }
    }

    fn reclaim(&self) -> Option<ReclaimFn> {
        self.crossing.as_ref().and_then(|c| c.reclaim)
    }
}

pub(crate) fn add_recv<S: Send + 'static>(
    gb: &mut GraphBuilder<S>,
    env: &Arc<SlotEnv>,
    k: u32,
    name: String,
) -> boundpool_scheduler::NodeRef<Received> {
    let env = env.clone();
    gb.node(name, move |ctx: &NodeCtx<'_, S>| {
        let run = env.current();
        let cell = &run.recvs[k as usize];
        if cell.is_pending() {
            // Completed by the comm thread when the value arrives (or will not).
            cell.complete_on(ctx.complete_later());
        } else if let std::task::Poll::Ready(Err(e)) = cell.poll() {
            return Err(e);
        }
        Ok(Received { run, k })
    })
}

/// Describes a graph whose nodes run on ranks. Every rank builds the same one (the first
/// submission checks), each node naming its rank or the datum it writes.
pub struct RankGraphBuilder<S = ()> {
    desc: GraphDesc,
    makers: Vec<Arc<dyn NodeMaker<S>>>,
    builder: u64,
    bad: Option<Error>,
    /// Bytes per chunk of the device values added next (`gpu/`).
    pub(crate) staging_chunk: usize,
}

impl<S> std::fmt::Debug for RankGraphBuilder<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RankGraphBuilder")
            .field("name", &self.desc.name)
            .field("nodes", &self.desc.nodes.len())
            .field("edges", &self.desc.edges.len())
            .finish()
    }
}

impl<S: Send + 'static> RankGraphBuilder<S> {
    /// An empty graph named `name` (4 runs of it may be in flight at once on a rank).
    pub fn new(name: impl Into<String>) -> Self {
        RankGraphBuilder {
            desc: GraphDesc::new(name),
            makers: Vec::new(),
            builder: BUILDERS.fetch_add(1, Ordering::Relaxed),
            bad: None,
            staging_chunk: 4 << 20,
        }
    }

    /// Adds a datum owned by rank `owner`: a node placed with `On::Writes(datum)` runs there.
    pub fn datum(&mut self, name: impl Into<String>, owner: usize) -> DataId {
        self.desc.datum(name, owner)
    }

    fn add<T: Send + Sync + 'static>(
        &mut self,
        on: On,
        name: String,
        body: Arc<Body<T, S>>,
        wire: Wire,
        crossing: Option<Crossing<T>>,
    ) -> NodeRef<T> {
        let desc = plan::NodeDesc {
            name: name.clone(),
            on,
            wire,
            type_name: std::any::type_name::<T>().to_string(),
        };
        let maker = Arc::new(Maker {
            name,
            body,
            crossing,
        });
        self.add_node(desc, maker)
    }

    /// Adds a node described by `desc`, made on its rank by `maker` (the GPU nodes, `gpu/`).
    pub(crate) fn add_node<T>(
        &mut self,
        desc: plan::NodeDesc,
        maker: Arc<dyn NodeMaker<S>>,
    ) -> NodeRef<T> {
        self.desc.nodes.push(desc);
        self.makers.push(maker);
        NodeRef {
            builder: self.builder,
            index: (self.desc.nodes.len() - 1) as u32,
            _t: PhantomData,
        }
    }

    /// Adds NCCL collective `name` over `members` (one node per rank, `gpu/`).
    #[cfg(feature = "nccl")]
    pub(crate) fn add_collective(&mut self, name: String, members: Vec<u32>) {
        self.desc.collective(name, members);
    }

    /// The rank node `node` names (its own, or its datum's owner), if it is a node of this
    /// builder.
    #[cfg(feature = "nccl")]
    pub(crate) fn rank_of_node(&self, node: RankNodeId) -> Option<usize> {
        if node.builder != self.builder {
            return None;
        }
        match self.desc.nodes.get(node.index as usize)?.on {
            On::Rank(r) => Some(r),
            On::Writes(d) => self.desc.data.get(d.0 as usize).map(|x| x.owner),
        }
    }

    /// Records the first error of a call that cannot fail on the spot (reported by `build`).
    #[cfg(feature = "nccl")]
    pub(crate) fn set_error(&mut self, e: Error) {
        self.bad.get_or_insert(e);
    }

    /// Adds a node whose output stays on its rank: an edge from it to another rank is an
    /// error at `build`, naming the edge.
    pub fn node<T, F>(&mut self, on: impl Into<On>, name: impl Into<String>, body: F) -> NodeRef<T>
    where
        T: Send + Sync + 'static,
        F: Fn(&RankCtx<'_, S>) -> Result<T, BoxError> + Send + Sync + 'static,
    {
        self.add(on.into(), name.into(), Arc::new(body), Wire::Local, None)
    }

    /// Adds a node whose output is plain data ([`PlainValue`]): it crosses ranks as its own
    /// bytes, sent from its memory and received into the memory of the consumer's value.
    pub fn plain_node<T, F>(
        &mut self,
        on: impl Into<On>,
        name: impl Into<String>,
        body: F,
    ) -> NodeRef<T>
    where
        T: PlainValue,
        F: Fn(&RankCtx<'_, S>) -> Result<T, BoxError> + Send + Sync + 'static,
    {
        self.add(
            on.into(),
            name.into(),
            Arc::new(body),
            Wire::Plain,
            Some(Crossing::plain()),
        )
    }

    /// Adds a node whose output crosses ranks encoded by `serde` (postcard).
    pub fn serde_node<T, F>(
        &mut self,
        on: impl Into<On>,
        name: impl Into<String>,
        body: F,
    ) -> NodeRef<T>
    where
        T: Serialize + DeserializeOwned + Send + Sync + 'static,
        F: Fn(&RankCtx<'_, S>) -> Result<T, BoxError> + Send + Sync + 'static,
    {
        self.add(
            on.into(),
            name.into(),
            Arc::new(body),
            Wire::Serde,
            Some(Crossing::serde()),
        )
    }

    /// Adds an edge: `to` runs after `from` and may read its output, on any rank.
    pub fn edge(&mut self, from: impl Into<RankNodeId>, to: impl Into<RankNodeId>) -> &mut Self {
        let (a, b) = (from.into(), to.into());
        if a.builder != self.builder || b.builder != self.builder {
            self.bad.get_or_insert_with(|| {
                Error::new(
                    ErrorKind::InvalidGraph,
                    format!(
                        "graph '{}': an edge names a node of another graph builder",
                        crate::error::bounded(&self.desc.name)
                    ),
                )
            });
        } else {
            self.desc.edges.push((a.index, b.index));
        }
        self
    }

    /// How many runs of this graph may be in flight at once on a rank (4 by default; at least
    /// 1). Each has its own tags; a submission beyond waits for the oldest to end here.
    pub fn runs_in_flight(&mut self, n: u32) -> &mut Self {
        self.desc.runs_in_flight = n.max(1);
        self
    }

    /// The description built so far (what the simulator and the cross-rank check see).
    pub fn desc(&self) -> &GraphDesc {
        &self.desc
    }

    /// Lowers the graph for `ranks` (this rank's nodes, sends and receives) and builds its first
    /// run slot. Errors name the node or edge at fault: a rank out of range, a cycle (also one
    /// that closes only across ranks), an edge from a node whose output cannot cross.
    pub fn build(self, ranks: &crate::Ranks<S>) -> Result<RankGraph<S>, Error> {
        self.build_for(
            ranks.rank(),
            ranks.size(),
            ranks.relay_hosts(),
            ranks.comm(),
            ranks.compute_group(),
        )
    }

    /// Lowers for rank `rank` of `size`, relaying one copy a host on `relay_hosts` (`None`:
    /// flat).
    pub(crate) fn build_for(
        self,
        rank: usize,
        size: usize,
        relay_hosts: Option<&[usize]>,
        comm: CommHandle,
        group: Option<GroupId>,
    ) -> Result<RankGraph<S>, Error> {
        if let Some(e) = self.bad {
            return Err(e);
        }
        let mut desc = self.desc;
        for (node, maker) in desc.nodes.iter_mut().zip(&self.makers) {
            if let Some(w) = maker.wire_at_build() {
                node.wire = w;
            }
        }
        let flat = plan::lower(&desc, size)?;
        let mut digest = plan::digest(&desc, &flat.rank_of);
        digest.relay = plan::relay_digest(relay_hosts);
        if relay_hosts.is_some() {
            // A value the lowering may relay must be one its maker can forward: an error
            // naming the node, on every rank alike, rather than a panic in a relay's build.
            let stuck = desc
                .nodes
                .iter()
                .zip(&self.makers)
                .find(|(n, m)| plan::relayable(n.wire) && m.land_forwarded().is_none());
            if let Some((n, _)) = stuck {
                return Err(Error::new(
                    ErrorKind::InvalidConfig,
                    format!(
                        "graph '{}': node '{}' crosses ranks as a host value its maker cannot forward; build the runtime with RanksBuilder::relay_per_host(false)",
                        crate::error::bounded(&desc.name),
                        crate::error::bounded(&n.name)
                    ),
                ));
            }
        }
        let lowering = match relay_hosts {
            Some(hosts) => plan::relay(&desc, &flat, &*plan::per_host(hosts.to_vec())),
            None => flat,
        };
        let local = &lowering.plans[rank];
        // This rank's receives whose values it forwards (their landings keep the bytes).
        let forwarded: std::collections::HashSet<u32> = local
            .sends
            .iter()
            .filter_map(|&t| lowering.transfers[t as usize].via)
            .collect();
        let names: Arc<[String]> = desc.nodes.iter().map(|n| n.name.clone()).collect();
        let sends = local
            .sends
            .iter()
            .map(|&t| {
                let tr = &lowering.transfers[t as usize];
                SendSpec {
                    to: tr.to,
                    index: tr.index,
                    producer: tr.producer,
                    priority: tr.priority,
                }
            })
            .collect();
        let recvs = local
            .recvs
            .iter()
            .map(|&t| {
                let tr = &lowering.transfers[t as usize];
                let producer = &desc.nodes[tr.producer as usize];
                let maker = &self.makers[tr.producer as usize];
                let land = if forwarded.contains(&t) {
                    maker.land_forwarded()
                } else {
                    maker.land()
                };
                let from_rank = lowering.rank_of[tr.producer as usize];
                RecvSpec {
                    from: tr.from,
                    index: tr.index,
                    land: land.expect("a crossing producer has a wire"),
                    edge: if tr.via.is_some() {
                        format!(
                            "'{}' (rank {from_rank}, forwarded by rank {}) -> rank {}",
                            crate::error::bounded(&producer.name),
                            tr.from,
                            tr.to
                        )
                    } else {
                        format!(
                            "'{}' (rank {from_rank}) -> rank {}",
                            crate::error::bounded(&producer.name),
                            tr.to
                        )
                    },
                    producer: tr.producer,
                    producer_name: producer.name.clone(),
                    reclaim: self.makers[tr.producer as usize].reclaim(),
                }
            })
            .collect();
        let comm_graph = Arc::new(
            CommGraph::new(
                desc.name.clone(),
                rank,
                digest,
                names,
                desc.runs_in_flight,
                lowering.tags_per_run,
                sends,
                recvs,
            )
            .with_stamps(comm.stamps),
        );
        let inner = Arc::new(GraphInner {
            slots: (0..desc.runs_in_flight).map(|_| OnceLock::new()).collect(),
            desc,
            lowering,
            makers: self.makers,
            builder: self.builder,
            comm_graph,
            comm,
            group,
            rank,
            registered: Mutex::new(None),
            next_seq: AtomicU64::new(0),
        });
        inner.slot(0)?;
        Ok(RankGraph { inner })
    }
}

/// A run slot's scheduler graph and what its nodes share.
pub(crate) struct SlotGraph<S> {
    pub(crate) graph: Graph<S>,
    pub(crate) env: Arc<SlotEnv>,
}

pub(crate) struct GraphInner<S> {
    pub(crate) desc: GraphDesc,
    pub(crate) lowering: Lowering,
    makers: Vec<Arc<dyn NodeMaker<S>>>,
    builder: u64,
    pub(crate) comm_graph: Arc<CommGraph>,
    comm: CommHandle,
    group: Option<GroupId>,
    rank: usize,
    registered: Mutex<Option<Result<u32, Error>>>,
    pub(crate) next_seq: AtomicU64,
    slots: Vec<OnceLock<Arc<SlotGraph<S>>>>,
}

impl<S: Send + 'static> GraphInner<S> {
    /// The scheduler graph of run slot `slot`, built on first use.
    pub(crate) fn slot(&self, slot: u32) -> Result<Arc<SlotGraph<S>>, Error> {
        if let Some(s) = self.slots[slot as usize].get() {
            return Ok(s.clone());
        }
        let built = Arc::new(self.build_slot()?);
        Ok(self.slots[slot as usize].get_or_init(|| built).clone())
    }

    fn build_slot(&self) -> Result<SlotGraph<S>, Error> {
        let plan = &self.lowering.plans[self.rank];
        let env = Arc::new(SlotEnv {
            graph: self.comm_graph.clone(),
            comm: self.comm.clone(),
            builder: self.builder,
            current: Mutex::new(None),
            map: OnceLock::new(),
        });
        let mut gb: GraphBuilder<S> = GraphBuilder::with_capacity(
            self.desc.name.clone(),
            plan.compute.len() + plan.sends.len() + plan.recvs.len(),
            plan.edges.len(),
        );
        let n = self.desc.nodes.len();
        let mut map: Vec<Mapped> = (0..n).map(|_| Mapped::Absent).collect();
        let mut ids: Vec<Option<NodeId>> = vec![None; n];
        for &i in &plan.compute {
            let maker = &self.makers[i as usize];
            let (id, r) = maker.compute(&mut gb, &env, i);
            if let (Some(g), false) = (self.group, maker.places_itself()) {
                gb.place(id, g);
            }
            ids[i as usize] = Some(id);
            map[i as usize] = Mapped::Local(r);
        }
        let recv_pos: std::collections::HashMap<u32, usize> = plan
            .recvs
            .iter()
            .enumerate()
            .map(|(k, &t)| (t, k))
            .collect();
        let mut send_nodes = Vec::with_capacity(plan.sends.len());
        for (k, &t) in plan.sends.iter().enumerate() {
            let tr = &self.lowering.transfers[t as usize];
            let maker = &self.makers[tr.producer as usize];
            let nodes = match (tr.via, &map[tr.producer as usize]) {
                // A relay: it sends on what its receive of `up` got.
                (Some(up), _) => {
                    maker.forward(&mut gb, &env, recv_pos[&up] as u32, k as u32, tr.to)
                }
                (None, Mapped::Local(producer)) => {
                    maker.send(&mut gb, &env, &**producer, k as u32, tr.to)
                }
                (None, _) => unreachable!("a send's producer is on its rank"),
            };
            send_nodes.push(nodes);
        }
        let mut recv_nodes = Vec::with_capacity(plan.recvs.len());
        for (k, &t) in plan.recvs.iter().enumerate() {
            let tr = &self.lowering.transfers[t as usize];
            let name = format!(
                "receive '{}' from rank {}",
                self.desc.nodes[tr.producer as usize].name, tr.from
            );
            let mut r = self.makers[tr.producer as usize].recv(&mut gb, &env, k as u32, name);
            map[tr.producer as usize] = std::mem::replace(&mut r.mapped, Mapped::Absent);
            recv_nodes.push(r);
        }
        let send_pos: std::collections::HashMap<u32, usize> = plan
            .sends
            .iter()
            .enumerate()
            .map(|(k, &t)| (t, k))
            .collect();
        let compute_id = |i: u32| ids[i as usize].expect("a compute node here");
        for &(a, b) in &plan.edges {
            let from = match a {
                LocalNode::Compute(i) => compute_id(i),
                LocalNode::Recv(t) => recv_nodes[recv_pos[&t]].out,
                LocalNode::Send(_) => unreachable!("a send has no local successor"),
            };
            match b {
                LocalNode::Compute(i) => {
                    gb.edge(from, compute_id(i));
                }
                LocalNode::Send(t) => {
                    for &to in &send_nodes[send_pos[&t]].inputs {
                        gb.edge(from, to);
                    }
                }
                LocalNode::Recv(_) => unreachable!("a receive has no local predecessor"),
            }
        }
        // The NCCL operations of this rank, each after the one before (the lowering's order).
        let nccl_id = |node: LocalNode| -> NodeId {
            match node {
                LocalNode::Compute(i) => compute_id(i),
                LocalNode::Send(t) => {
                    let s = &send_nodes[send_pos[&t]];
                    s.nccl.expect("an NCCL transfer's send issues NCCL")
                }
                LocalNode::Recv(t) => {
                    let r = &recv_nodes[recv_pos[&t]];
                    r.nccl.expect("an NCCL transfer's receive issues NCCL")
                }
            }
        };
        for w in plan.nccl.windows(2) {
            gb.edge(nccl_id(w[0]), nccl_id(w[1]));
        }
        let graph = gb.build()?;
        let _ = env.map.set(map.into_boxed_slice());
        Ok(SlotGraph { graph, env })
    }

    /// Registers the graph with the comm thread at its first submission (its id, the check).
    pub(crate) fn register(&self) -> Result<u32, Error> {
        let mut r = self.registered.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(res) = &*r {
            return res.clone();
        }
        let (tx, rx) = std::sync::mpsc::channel();
        self.comm.send(Command::Register {
            graph: self.comm_graph.clone(),
            reply: tx,
        });
        let res = rx.recv().unwrap_or_else(|_| {
            Err(Error::new(
                ErrorKind::ShutDown,
                "the communication thread has ended",
            ))
        });
        *r = Some(res.clone());
        res
    }
}

/// A graph lowered for this rank, ready to submit with [`Ranks::submit`](crate::Ranks::submit)
/// any number of times (runs are numbered in submission order; the n-th run on each rank is
/// one run of the graph).
pub struct RankGraph<S = ()> {
    pub(crate) inner: Arc<GraphInner<S>>,
}

impl<S> std::fmt::Debug for RankGraph<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RankGraph")
            .field("name", &self.inner.desc.name)
            .field("rank", &self.inner.rank)
            .finish()
    }
}

impl<S> RankGraph<S> {
    /// The description every rank built (for the simulator, or to print).
    pub fn desc(&self) -> &GraphDesc {
        &self.inner.desc
    }

    /// The lowering: every rank's plan and the transfers between them.
    pub fn lowering(&self) -> &Lowering {
        &self.inner.lowering
    }

    /// The rank each node runs on.
    pub fn rank_of<T>(&self, node: NodeRef<T>) -> usize {
        self.inner.lowering.rank_of[node.index as usize]
    }

    /// How many values this rank received for this graph in memory recycled from the values
    /// of earlier runs (a plain `Vec` or boxed slice, once its run's outputs were dropped),
    /// rather than in a fresh allocation.
    pub fn recycled_landings(&self) -> u64 {
        self.inner.comm_graph.recycled()
    }
}
