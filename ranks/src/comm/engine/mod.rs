//! The protocol, run by the communication thread alone: registration and the graph check,
//! sends (held until the check's verdict), arrivals processed in each sender's order, run
//! status across ranks, failures, heartbeats and dead peers. See the crate's README for the
//! protocol in prose.

mod arrive;
mod check;
mod faults;
mod queue;
mod staged;

pub(crate) use staged::StagedPayload;

use std::collections::{BTreeMap, BTreeSet, BinaryHeap, VecDeque};

// The engine's maps are keyed by small integers it makes itself (ids, sequence numbers,
// ranks), looked up several times per arrival: no untrusted keys, so a fast hash.
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use crate::comm::run::{CommGraph, RunState};
use crate::comm::send::Sending;
use crate::comm::stamps::{monotonic_ns, RecvHop, SendHop};
use crate::comm::wire::{
    Control, FailKind, Failure, LaneTrailer, Mismatch, Outcome, TagLayout, CONTROL_TAG,
    FIRST_DATA_TAG, LANE_TRAILER,
};
use crate::error::{Error, ErrorKind};
use crate::plan::{first_difference, Digest};
use crate::transport::{InFlight, OpId, Probed, Transport};
use crate::value::{AnyValue, Landed, Landing};

/// A message this long or longer moves only as MPI is polled (past every eager limit): the
/// thread does not park while one is in flight (`comm::next_wait`).
pub(crate) const BULK_BYTES: usize = 64 << 10;

/// What a worker or submitter asks of the communication thread.
pub(crate) enum Command {
    /// A graph's first submission: give it an id, send its digest to rank 0.
    Register {
        graph: Arc<CommGraph>,
        reply: mpsc::Sender<Result<u32, Error>>,
    },
    /// A run starts here.
    StartRun(Arc<RunState>),
    /// A send node ran: send its value.
    Send {
        run: Arc<RunState>,
        k: u32,
        payload: Payload,
    },
    /// A worker posted send `k` of `run` itself and the transport still holds it: learn
    /// when it is done (`comm/send.rs`).
    Adopt {
        sent: InFlight,
        run: Arc<RunState>,
        k: u32,
    },
    /// A worker's own send failed in the transport.
    DirectFailed(Error),
    /// A node of this rank failed.
    NodeFailed {
        run: Arc<RunState>,
        failure: Failure,
    },
    /// The run finished here (the pool's completion).
    LocalDone(Arc<RunState>),
    /// The runtime shuts down (`died`: the process is going down with this panic).
    Shutdown { died: Option<String> },
}

/// A send's bytes.
pub(crate) enum Payload {
    /// In the producer's output, which its run keeps until the send node completes (or, for a
    /// relay, in the value its rank received, which its `RunState` keeps).
    Borrowed { ptr: *const u8, len: usize },
    /// Encoded (serde), owned here until the transport is done with it.
    Owned(Vec<u8>),
    /// A device buffer's bytes, ready piece by piece in page-locked staging memory
    /// (`staged.rs`): each message goes out once its bytes are.
    Staged(StagedPayload),
}

// SAFETY: a borrowed payload points into a run's output slot, which the run keeps alive and
// unchanged until the send node completes, and the send node completes only after the comm
// thread saw the transport finish with it (or never). A relay's borrowed payload points into
// a value its rank received (or the bytes its landing kept) in a `RecvCell` of the
// `RunState` sent with it: set once before the forwarding node runs (its edge from the
// receive), never moved or changed while the state lives (taken only by its `Drop`), and the
// state outlives the send (the command, the engine's entry, and the slot's current run until
// the send node completes all hold it). A staged payload points into staging
// memory the run keeps alive likewise, written by the device only before the readiness it
// reports. The comm thread only reads them.
unsafe impl Send for Payload {}

/// The engine's settings.
#[derive(Clone, Debug)]
pub(crate) struct EngineConfig {
    /// A peer silent this long is dead.
    pub(crate) peer_timeout: Duration,
    /// How often to tell the peers this rank is alive.
    pub(crate) heartbeat: Duration,
    /// Values of this many bytes or more go as a header and chunks of at most this size.
    pub(crate) max_message: usize,
    /// Runs stamp their edges' hops (`stamps.rs`).
    pub(crate) stamps: bool,
    /// At most this many sends in flight; more wait, most urgent first (`queue.rs`).
    pub(crate) send_window: usize,
    /// Workers post small sends themselves where the transport allows it (`comm/send.rs`).
    pub(crate) worker_sends: bool,
    /// Spinning workers look at the network themselves where the transport allows it
    /// (`comm/shared.rs`).
    pub(crate) worker_polls: bool,
    /// Small values go on the transport's posted lane, where it has one (`arrive.rs`).
    pub(crate) posted_receives: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum PeerState {
    Alive,
    Left,
    Dead(String),
}

struct Peer {
    last_heard: Instant,
    state: PeerState,
}

/// Seqs of runs started here: all below `below`, and `above`.
#[derive(Default)]
struct Started {
    below: u64,
    above: BTreeSet<u64>,
}

impl Started {
    fn insert(&mut self, seq: u64) {
        self.above.insert(seq);
        while self.above.remove(&self.below) {
            self.below += 1;
        }
    }
    fn contains(&self, seq: u64) -> bool {
        seq < self.below || self.above.contains(&seq)
    }
}

/// The comm thread's view of one graph (by id).
#[derive(Default)]
struct GraphState {
    graph: Option<Arc<CommGraph>>,
    layout: Option<TagLayout>,
    refused: Option<Error>,
    held: Vec<(Arc<RunState>, u32, Payload)>,
    active: HashMap<u64, Arc<RunState>>,
    started: Started,
    /// [sender][slot]: runs of the sender in that slot whose status arrived.
    finished: Vec<Vec<u64>>,
    stash: HashMap<(u64, u32), (Result<Landed, String>, arrive::ArrivalHops)>,
    statuses: HashMap<u64, Vec<Option<Outcome>>>,
    failed_early: HashMap<u64, Failure>,
}

struct SendProgress {
    run: Arc<RunState>,
    k: u32,
    ops_left: u32,
    _keep: Option<Vec<u8>>,
    _header: Option<Box<[u64; 2]>>,
}

enum EntryKind<M> {
    Control(Vec<u8>),
    Data {
        gid: u32,
        slot: u32,
        k: u32,
        landing: Box<dyn Landing>,
    },
    /// A placeholder whose message turned out to be a chunk of an earlier value.
    Skip,
    /// A data message whose graph's verdict has not arrived from rank 0 yet.
    Unmapped(Option<Probed<M>>),
}

struct Entry<M> {
    ops_left: u32,
    chunks_left: u64,
    offset: usize,
    kind: EntryKind<M>,
    /// When its (first) message arrived and when all its bytes were in (`stamps.rs`; 0 when
    /// not stamping).
    arrived: u64,
    received: u64,
}

impl<M> Entry<M> {
    fn complete(&self) -> bool {
        self.ops_left == 0 && self.chunks_left == 0 && !matches!(self.kind, EntryKind::Unmapped(_))
    }
}

enum OpKind {
    Send(u64),
    /// A worker's send the transport still held (`Command::Adopt`).
    Adopted {
        run: Arc<RunState>,
        k: u32,
    },
    Control(#[allow(dead_code)] Vec<u8>),
    Recv {
        src: usize,
        entry: u64,
    },
}

/// A registration at rank 0.
struct Reg {
    name: String,
    digest: Digest,
    tags: u64,
}

/// The communication thread's state.
pub(crate) struct Engine<T: Transport> {
    t: T,
    rank: usize,
    size: usize,
    cfg: EngineConfig,
    graphs: HashMap<u32, GraphState>,
    next_gid: u32,
    ranges: BTreeMap<u32, u32>,
    regs: HashMap<u32, Vec<Option<Reg>>>,
    next_tag: u64,
    next_op: OpId,
    ops: HashMap<OpId, OpKind>,
    /// The ops in `ops` that move a message of [`BULK_BYTES`] or more.
    bulk: HashSet<OpId>,
    sends: HashMap<u64, SendProgress>,
    /// Staged sends with messages still to post (`staged.rs`).
    staged: Vec<staged::StagedSend>,
    next_send: u64,
    queues: Vec<VecDeque<Entry<T::Message>>>,
    front_id: Vec<u64>,
    long_active: HashMap<(usize, u32), u64>,
    peers: Vec<Peer>,
    last_beat: Instant,
    last_check: Instant,
    /// A peer died: MPI is not finalized, and no run starts.
    poisoned: bool,
    /// The same, for the runtime (its drop does not wait for the pool then).
    poisoned_flag: Arc<std::sync::atomic::AtomicBool>,
    /// This rank's transport failed.
    fatal: Option<Error>,
    closing: Option<Instant>,
    done: Vec<OpId>,
    /// When the message being handled arrived (`stamps.rs`; 0 when not stamping).
    arrival: u64,
    /// A worker holds the engine (`comm/shared.rs`), for the stamps.
    pub(crate) worker_looking: bool,
    /// A value was handed to its receive in this look (`comm/shared.rs`): a looking worker
    /// stops taking arrivals and goes to run what it completed.
    pub(crate) delivered: bool,
    /// The last worker's look skipped its poll (it delivered).
    pub(crate) poll_deferred: bool,
    /// The window, shared with send nodes (`comm/send.rs`).
    sending: Arc<Sending>,
    /// Sends waiting for room in the window (`queue.rs`).
    queue: BinaryHeap<queue::QueuedSend>,
    /// Queued sends so far (their order among equals).
    queued_total: u64,
    /// Runs that ended here whose status waits for their queued sends.
    status_waits: Vec<Arc<RunState>>,
    /// A peer is gone: sends to it may never finish, so the window holds nothing back.
    unbounded: bool,
    /// The posted lane's largest message (0: small values are probed as the rest).
    lane: usize,
    /// Lane messages of a graph not registered here yet: (sender, message).
    lane_waiting: Vec<(usize, Vec<u8>)>,
}

/// Where a message goes: matched by its tag, or on the posted lane.
#[derive(Clone, Copy, Debug)]
enum Route {
    Tag(u32),
    Lane,
}

impl<T: Transport> Engine<T> {
    pub(crate) fn new(
        mut t: T,
        cfg: EngineConfig,
        poisoned_flag: Arc<std::sync::atomic::AtomicBool>,
        sending: Arc<Sending>,
    ) -> Self {
        let (rank, size) = (t.rank(), t.size());
        let lane = if cfg.posted_receives { t.lane() } else { 0 };
        sending.set_lane(lane);
        if cfg.worker_sends {
            if let Some(d) = t.direct() {
                let _ = sending.direct.set(d);
            }
        }
        let now = Instant::now();
        Engine {
            t,
            rank,
            size,
            cfg,
            graphs: HashMap::default(),
            next_gid: 0,
            ranges: BTreeMap::new(),
            regs: HashMap::default(),
            next_tag: u64::from(FIRST_DATA_TAG),
            next_op: 0,
            ops: HashMap::default(),
            bulk: HashSet::default(),
            sends: HashMap::default(),
            staged: Vec::new(),
            next_send: 0,
            queues: (0..size).map(|_| VecDeque::new()).collect(),
            front_id: vec![0; size],
            long_active: HashMap::default(),
            peers: (0..size)
                .map(|_| Peer {
                    last_heard: now,
                    state: PeerState::Alive,
                })
                .collect(),
            last_beat: now - cfg_heartbeat_never(),
            last_check: now,
            poisoned: false,
            poisoned_flag,
            fatal: None,
            closing: None,
            done: Vec::new(),
            arrival: 0,
            worker_looking: false,
            delivered: false,
            poll_deferred: false,
            sending,
            queue: BinaryHeap::new(),
            queued_total: 0,
            status_waits: Vec::new(),
            unbounded: false,
            lane,
            lane_waiting: Vec::new(),
        }
    }

    pub(crate) fn rank(&self) -> usize {
        self.rank
    }

    pub(crate) fn size(&self) -> usize {
        self.size
    }

    /// Whether anything waits on the network (a reason to poll often).
    pub(crate) fn busy(&self) -> bool {
        !self.ops.is_empty()
            || !self.staged.is_empty()
            || !self.queue.is_empty()
            || self.graphs.values().any(|g| !g.active.is_empty())
            || !self.regs.is_empty()
            || self.queues.iter().any(|q| !q.is_empty())
    }

    /// Whether a long message is moving (the thread then polls without parking).
    pub(crate) fn moving_bulk(&self) -> bool {
        self.fatal.is_none() && !self.bulk.is_empty()
    }

    /// Whether the thread may end: shutting down, and nothing in flight (or given up on).
    pub(crate) fn finished(&self) -> bool {
        match self.closing {
            None => false,
            Some(since) => {
                self.fatal.is_some()
                    || self.ops.is_empty()
                    || since.elapsed() > self.cfg.peer_timeout
            }
        }
    }

    /// Ends the transport; `poisoned` tells the runtime not to wait for its pool.
    pub(crate) fn close(mut self) -> bool {
        let clean = !self.poisoned && self.fatal.is_none() && self.ops.is_empty();
        let poisoned = self.poisoned || self.fatal.is_some();
        if !self.ops.is_empty() {
            // Sends and receives the transport may still hold: their memory (a run's output, a
            // landing) must never be freed under it, so their runs' send nodes are never
            // completed (the cells keep their completers) and the landings stay.
            std::mem::forget(std::mem::take(&mut self.sends));
            std::mem::forget(std::mem::take(&mut self.queues));
        }
        self.t.close(clean);
        poisoned
    }

    pub(crate) fn command(&mut self, cmd: Command) {
        match cmd {
            Command::Register { graph, reply } => {
                let _ = reply.send(self.register(graph));
            }
            Command::StartRun(run) => self.start_run(run),
            Command::Send { run, k, payload } => self.send_value(run, k, payload),
            Command::Adopt { sent, run, k } => {
                if self.fatal.is_some() {
                    // Never given to the transport: its bytes are leaked, not freed under it.
                    return;
                }
                let op = self.next_op;
                self.next_op += 1;
                self.ops.insert(op, OpKind::Adopted { run, k });
                self.t.adopt(sent, op);
            }
            Command::DirectFailed(e) => self.transport_failed(e),
            Command::NodeFailed { run, failure } => self.node_failed(&run, failure),
            Command::LocalDone(run) => self.local_done(run),
            Command::Shutdown { died } => {
                // What waits for the window goes now, and the statuses behind it: `Bye`
                // follows them.
                self.post_queued(true);
                let msg = match died {
                    Some(reason) => Control::Died { reason },
                    None => Control::Bye,
                };
                self.broadcast(&msg);
                self.closing = Some(Instant::now());
            }
        }
    }

    fn register(&mut self, graph: Arc<CommGraph>) -> Result<u32, Error> {
        if let Some(e) = &self.fatal {
            return Err(e.clone());
        }
        let gid = self.next_gid;
        self.next_gid += 1;
        let _ = graph.gid.set(gid);
        let tags = TagLayout::size(graph.runs_in_flight, graph.tags_per_run);
        let reg = Reg {
            name: graph.name.clone(),
            digest: graph.digest.clone(),
            tags,
        };
        let gs = self.graphs.entry(gid).or_default();
        gs.finished = vec![vec![0; graph.runs_in_flight as usize]; self.size];
        gs.graph = Some(graph);
        if !self.lane_waiting.is_empty() {
            self.retry_lane_waiting();
        }
        if self.rank == 0 {
            self.registered(gid, 0, reg);
        } else {
            let msg = Control::Register {
                gid,
                name: reg.name,
                graph: reg.digest.graph,
                nodes: reg.digest.nodes,
                relay: reg.digest.relay,
                tags,
            };
            self.send_control(0, &msg);
        }
        Ok(gid)
    }

    fn start_run(&mut self, run: Arc<RunState>) {
        let gid = *run
            .graph
            .gid
            .get()
            .expect("a started run's graph is registered");
        // No run can end without every rank's status: one started after a rank left fails.
        let gone = self.first_gone().and_then(|r| self.gone_error(r));
        let fatal = self.fatal.clone();
        let gs = self.graphs.entry(gid).or_default();
        gs.started.insert(run.seq);
        for k in 0..run.recvs.len() as u32 {
            match gs.stash.remove(&(run.seq, k)) {
                Some((Ok(v), hops)) => hops.fill(&run, k, v),
                Some((Err(msg), _)) => {
                    let f = decode_failure(&run, k, self.rank, msg);
                    run.recvs[k as usize].fail(f.to_error());
                    // Reported below, once the run is in the table.
                    gs.failed_early.entry(u64::MAX).or_insert(f);
                }
                None => {}
            }
        }
        let own_decode = gs.failed_early.remove(&u64::MAX);
        if let Some(e) = &gs.refused {
            run.cancel(e);
        }
        if let Some(f) = gs.failed_early.remove(&run.seq) {
            run.cancel(&f.to_error());
        }
        gs.active.insert(run.seq, run.clone());
        if let Some(e) = fatal.or(gone) {
            run.cancel(&e);
            run.resolve(Err(e));
        }
        if let Some(f) = own_decode {
            self.node_failed(&run, f);
        }
    }

    fn send_value(&mut self, run: Arc<RunState>, k: u32, payload: Payload) {
        run.stamp_send(k, SendHop::Taken);
        if self.fatal.is_some() || run.fatal().is_some() {
            // The run is abandoned (a dead peer or transport): the send node stays pending
            // and its run is never freed, so its memory is never reused under the transport.
            return;
        }
        let gid = *run.graph.gid.get().expect("registered");
        let gs = self.graphs.entry(gid).or_default();
        if let Some(e) = &gs.refused {
            run.sends[k as usize].fail(e.clone());
            return;
        }
        match gs.layout {
            None => gs.held.push((run, k, payload)),
            Some(layout) => self.post_or_queue(layout, run, k, payload),
        }
    }

    fn post_send(&mut self, layout: TagLayout, run: Arc<RunState>, k: u32, payload: Payload) {
        let spec = &run.graph.sends[k as usize];
        let to = spec.to;
        if self.peers[to].state != PeerState::Alive {
            return;
        }
        let max = self.cfg.max_message.max(1);
        let payload = match payload {
            Payload::Owned(mut v) if v.len() + LANE_TRAILER <= self.lane && v.len() < max => {
                // A small owned value: on the lane, with its trailer.
                LaneTrailer {
                    gid: layout_gid(&run),
                    index: spec.index,
                    seq: run.seq,
                }
                .append_to(&mut v);
                return self.post_lane(run, k, v);
            }
            payload => payload,
        };
        let (ptr, len, keep) = match payload {
            Payload::Borrowed { ptr, len } => (ptr, len, None),
            Payload::Owned(v) => (v.as_ptr(), v.len(), Some(v)),
            Payload::Staged(p) => return self.post_staged(layout, run, k, p),
        };
        let id = self.next_send;
        self.next_send += 1;
        self.sending.window.enter();
        let mut progress = SendProgress {
            run: run.clone(),
            k,
            ops_left: 0,
            _keep: None,
            _header: None,
        };
        let result = if len < max {
            let tag = layout.tag(run.slot, spec.index, false);
            progress.ops_left = 1;
            self.start_send(to, Route::Tag(tag), ptr, len, OpKind::Send(id))
        } else {
            let tag = layout.tag(run.slot, spec.index, true);
            let chunks = len.div_ceil(max);
            let header = Box::new([len as u64, chunks as u64]);
            let hptr = header.as_ptr().cast::<u8>();
            progress._header = Some(header);
            progress.ops_left = 1 + chunks as u32;
            let mut r = self.start_send(to, Route::Tag(tag), hptr, 16, OpKind::Send(id));
            for c in 0..chunks {
                if r.is_err() {
                    break;
                }
                let off = c * max;
                let n = max.min(len - off);
                // SAFETY: `off + n <= len`: within the payload.
                let p = unsafe { ptr.add(off) };
                r = self.start_send(to, Route::Tag(tag), p, n, OpKind::Send(id));
            }
            r
        };
        progress._keep = keep;
        run.stamp_send(k, SendHop::Posted);
        self.sends.insert(id, progress);
        if let Err(e) = result {
            self.transport_failed(e);
        }
    }

    /// Posts send `k` of `run` on the posted lane: `message`, the value with its trailer.
    fn post_lane(&mut self, run: Arc<RunState>, k: u32, message: Vec<u8>) {
        let to = run.graph.sends[k as usize].to;
        let id = self.next_send;
        self.next_send += 1;
        self.sending.window.enter();
        let (ptr, len) = (message.as_ptr(), message.len());
        let result = self.start_send(to, Route::Lane, ptr, len, OpKind::Send(id));
        run.stamp_send(k, SendHop::Posted);
        self.sends.insert(
            id,
            SendProgress {
                run,
                k,
                ops_left: 1,
                _keep: Some(message),
                _header: None,
            },
        );
        if let Err(e) = result {
            self.transport_failed(e);
        }
    }

    fn start_send(
        &mut self,
        to: usize,
        route: Route,
        ptr: *const u8,
        len: usize,
        kind: OpKind,
    ) -> Result<(), Error> {
        let op = self.next_op;
        self.next_op += 1;
        self.ops.insert(op, kind);
        if len >= BULK_BYTES {
            self.bulk.insert(op);
        }
        // SAFETY: the bytes are a run's output (kept until the send node completes, which waits
        // for this op), or a buffer owned by the op's record or its send's progress entry
        // (dropped only once the op is reported done).
        unsafe {
            match route {
                Route::Tag(tag) => self.t.send(to, tag, ptr, len, op),
                Route::Lane => self.t.lane_send(to, ptr, len, op),
            }
        }
    }

    fn send_control(&mut self, to: usize, msg: &Control) {
        if self.fatal.is_some() || self.peers[to].state != PeerState::Alive {
            return;
        }
        let bytes = msg.encode();
        let (ptr, len) = (bytes.as_ptr(), bytes.len());
        let control = OpKind::Control(bytes);
        if let Err(e) = self.start_send(to, Route::Tag(CONTROL_TAG), ptr, len, control) {
            self.transport_failed(e);
        }
    }

    fn broadcast(&mut self, msg: &Control) {
        for to in 0..self.size {
            if to != self.rank {
                self.send_control(to, msg);
            }
        }
    }

    fn node_failed(&mut self, run: &Arc<RunState>, failure: Failure) {
        if !run.record_failure(failure.clone()) {
            return;
        }
        // The failed run ends here only once every deferred receive completes: fail them.
        run.cancel(&failure.to_error());
        let gid = *run.graph.gid.get().expect("registered");
        self.broadcast(&Control::Fail {
            gid,
            seq: run.seq,
            failure,
        });
    }

    fn local_done(&mut self, run: Arc<RunState>) {
        run.set_local_done();
        if run.unposted(0) > 0 {
            // Its status must follow its data: it goes once the queue posted them.
            self.status_waits.push(run);
            return;
        }
        self.send_status(run);
    }

    /// The run ended here and its sends are posted: its status to every rank, its slot freed.
    fn send_status(&mut self, run: Arc<RunState>) {
        let gid = *run.graph.gid.get().expect("registered");
        let outcome = run.outcome();
        self.broadcast(&Control::Status {
            gid,
            seq: run.seq,
            outcome: outcome.clone(),
        });
        // Only now may run seq + runs_in_flight start here: its sends follow this status.
        run.graph.free_slot(run.slot);
        let size = self.size;
        let gs = self.graphs.entry(gid).or_default();
        gs.statuses
            .entry(run.seq)
            .or_insert_with(|| vec![None; size])[self.rank] = Some(outcome);
        self.try_resolve(gid, run.seq);
    }

    /// Polls the transport; returns how many operations finished.
    pub(crate) fn poll(&mut self) -> usize {
        if self.fatal.is_some() {
            return 0;
        }
        let staged = self.advance_staged();
        let mut done = std::mem::take(&mut self.done);
        if let Err(e) = self.t.poll(&mut done) {
            self.transport_failed(e);
            return 0;
        }
        let n = self.handle_done(done);
        if !self.queue.is_empty() {
            self.post_queued(false);
        }
        n + staged
    }

    /// Takes what the transport knows finished without polling (a receive of a message that
    /// was all there), so an arrival is handled in the step that saw it.
    pub(super) fn take_finished(&mut self) {
        let mut done = std::mem::take(&mut self.done);
        self.t.finished(&mut done);
        if done.is_empty() {
            self.done = done;
        } else {
            self.handle_done(done);
        }
    }

    /// Handles finished operations (`done` is given back empty to `self.done`); returns how
    /// many.
    fn handle_done(&mut self, mut done: Vec<OpId>) -> usize {
        let n = done.len();
        let mut sources = Vec::new();
        for op in done.drain(..) {
            if !self.bulk.is_empty() {
                self.bulk.remove(&op);
            }
            match self.ops.remove(&op) {
                Some(OpKind::Send(id)) => {
                    let finished = match self.sends.get_mut(&id) {
                        Some(s) => {
                            s.ops_left -= 1;
                            s.ops_left == 0
                        }
                        None => false,
                    };
                    if finished {
                        let s = self.sends.remove(&id).expect("present");
                        self.sending.window.leave();
                        s.run.stamp_send(s.k, SendHop::Done);
                        s.run.sends[s.k as usize].done();
                    }
                }
                Some(OpKind::Adopted { run, k }) => {
                    self.sending.window.leave();
                    run.stamp_send(k, SendHop::Done);
                }
                Some(OpKind::Control(_)) | None => {}
                Some(OpKind::Recv { src, entry }) => {
                    let stamps = self.cfg.stamps;
                    if let Some(e) = self.entry_mut(src, entry) {
                        e.ops_left -= 1;
                        if stamps && e.ops_left == 0 && e.chunks_left == 0 {
                            e.received = monotonic_ns();
                        }
                    }
                    sources.push(src);
                }
            }
        }
        self.done = done;
        sources.sort_unstable();
        sources.dedup();
        for src in sources {
            self.process(src);
        }
        n
    }
}

/// The id of a run's graph (registered before any of its runs starts).
fn layout_gid(run: &RunState) -> u32 {
    *run.graph.gid.get().expect("registered")
}

fn cfg_heartbeat_never() -> Duration {
    Duration::from_secs(3600)
}

/// The failure of a receive whose bytes do not make its value (named by its edge).
fn decode_failure(run: &RunState, k: u32, rank: usize, message: String) -> Failure {
    let spec = &run.graph.recvs[k as usize];
    Failure {
        rank: rank as u32,
        node: spec.producer,
        node_name: format!("receive of '{}'", spec.producer_name),
        graph: run.graph.name.clone(),
        message: format!("edge {}: {message}", spec.edge),
        kind: FailKind::Decode,
    }
}
