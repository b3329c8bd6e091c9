//! The protocol, run by the communication thread alone: registration and the graph check,
//! sends (held until the check's verdict), arrivals processed in each sender's order, run
//! status across ranks, failures, heartbeats and dead peers. See the crate's README for the
//! protocol in prose.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use crate::comm::run::{CommGraph, RunState};
use crate::comm::wire::{
    Control, FailKind, Failure, Mismatch, Outcome, TagLayout, CONTROL_TAG, FIRST_DATA_TAG,
};
use crate::error::{Error, ErrorKind};
use crate::plan::{first_difference, Digest};
use crate::transport::{OpId, Probed, Transport};
use crate::value::{AnyValue, Landing};

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
    /// In the producer's output, which its run keeps until the send node completes.
    Borrowed { ptr: *const u8, len: usize },
    /// Encoded (serde), owned here until the transport is done with it.
    Owned(Vec<u8>),
}

// SAFETY: a borrowed payload points into a run's output slot, which the run keeps alive and
// unchanged until the send node completes, and the send node completes only after the comm
// thread saw the transport finish with it (or never). The comm thread only reads it.
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
    stash: HashMap<(u64, u32), Result<AnyValue, String>>,
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
}

impl<M> Entry<M> {
    fn complete(&self) -> bool {
        self.ops_left == 0 && self.chunks_left == 0 && !matches!(self.kind, EntryKind::Unmapped(_))
    }
}

enum OpKind {
    Send(u64),
    Control(#[allow(dead_code)] Vec<u8>),
    Recv { src: usize, entry: u64 },
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
    sends: HashMap<u64, SendProgress>,
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
    /// Cells were filled or failed since the last take (wake the workers).
    woke: bool,
}

impl<T: Transport> Engine<T> {
    pub(crate) fn new(
        t: T,
        cfg: EngineConfig,
        poisoned_flag: Arc<std::sync::atomic::AtomicBool>,
    ) -> Self {
        let (rank, size) = (t.rank(), t.size());
        let now = Instant::now();
        Engine {
            t,
            rank,
            size,
            cfg,
            graphs: HashMap::new(),
            next_gid: 0,
            ranges: BTreeMap::new(),
            regs: HashMap::new(),
            next_tag: u64::from(FIRST_DATA_TAG),
            next_op: 0,
            ops: HashMap::new(),
            sends: HashMap::new(),
            next_send: 0,
            queues: (0..size).map(|_| VecDeque::new()).collect(),
            front_id: vec![0; size],
            long_active: HashMap::new(),
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
            woke: false,
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
            || self.graphs.values().any(|g| !g.active.is_empty())
            || !self.regs.is_empty()
            || self.queues.iter().any(|q| !q.is_empty())
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

    /// Whether workers should look at their receives.
    pub(crate) fn take_woke(&mut self) -> bool {
        std::mem::take(&mut self.woke)
    }

    /// Ends the transport; `poisoned` tells the runtime not to wait for its pool.
    pub(crate) fn close(self) -> bool {
        let clean = !self.poisoned && self.fatal.is_none() && self.ops.is_empty();
        let poisoned = self.poisoned || self.fatal.is_some();
        self.t.close(clean);
        poisoned
    }

    // ---------------------------------------------------------------- commands

    pub(crate) fn command(&mut self, cmd: Command) {
        match cmd {
            Command::Register { graph, reply } => {
                let _ = reply.send(self.register(graph));
            }
            Command::StartRun(run) => self.start_run(run),
            Command::Send { run, k, payload } => self.send_value(run, k, payload),
            Command::NodeFailed { run, failure } => self.node_failed(&run, failure),
            Command::LocalDone(run) => self.local_done(run),
            Command::Shutdown { died } => {
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
        if self.rank == 0 {
            self.registered(gid, 0, reg);
        } else {
            let msg = Control::Register {
                gid,
                name: reg.name,
                graph: reg.digest.graph,
                nodes: reg.digest.nodes,
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
        let gone = self.gone_error();
        let fatal = self.fatal.clone();
        let gs = self.graphs.entry(gid).or_default();
        gs.started.insert(run.seq);
        for k in 0..run.recvs.len() as u32 {
            match gs.stash.remove(&(run.seq, k)) {
                Some(Ok(v)) => run.recvs[k as usize].fill(v),
                Some(Err(msg)) => {
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
        self.woke = true;
    }

    fn send_value(&mut self, run: Arc<RunState>, k: u32, payload: Payload) {
        if self.fatal.is_some() || run.fatal().is_some() {
            // The run is abandoned (a dead peer or transport): the send node stays pending
            // and its run is never freed, so its memory is never reused under the transport.
            return;
        }
        let gid = *run.graph.gid.get().expect("registered");
        let gs = self.graphs.entry(gid).or_default();
        if let Some(e) = &gs.refused {
            run.sends[k as usize].fail(e.clone());
            self.woke = true;
            return;
        }
        match gs.layout {
            None => gs.held.push((run, k, payload)),
            Some(layout) => self.post_send(layout, run, k, payload),
        }
    }

    fn post_send(&mut self, layout: TagLayout, run: Arc<RunState>, k: u32, payload: Payload) {
        let spec = &run.graph.sends[k as usize];
        let to = spec.to;
        if self.peers[to].state != PeerState::Alive {
            return;
        }
        let (ptr, len, keep) = match payload {
            Payload::Borrowed { ptr, len } => (ptr, len, None),
            Payload::Owned(v) => (v.as_ptr(), v.len(), Some(v)),
        };
        let id = self.next_send;
        self.next_send += 1;
        let mut progress = SendProgress {
            run: run.clone(),
            k,
            ops_left: 0,
            _keep: None,
            _header: None,
        };
        let max = self.cfg.max_message.max(1);
        let result = if len < max {
            let tag = layout.tag(run.slot, spec.index, false);
            progress.ops_left = 1;
            self.start_send(to, tag, ptr, len, OpKind::Send(id))
        } else {
            let tag = layout.tag(run.slot, spec.index, true);
            let chunks = len.div_ceil(max);
            let header = Box::new([len as u64, chunks as u64]);
            let hptr = header.as_ptr().cast::<u8>();
            progress._header = Some(header);
            progress.ops_left = 1 + chunks as u32;
            let mut r = self.start_send(to, tag, hptr, 16, OpKind::Send(id));
            for c in 0..chunks {
                if r.is_err() {
                    break;
                }
                let off = c * max;
                let n = max.min(len - off);
                // SAFETY: `off + n <= len`: within the payload.
                let p = unsafe { ptr.add(off) };
                r = self.start_send(to, tag, p, n, OpKind::Send(id));
            }
            r
        };
        progress._keep = keep;
        self.sends.insert(id, progress);
        if let Err(e) = result {
            self.transport_failed(e);
        }
    }

    fn start_send(
        &mut self,
        to: usize,
        tag: u32,
        ptr: *const u8,
        len: usize,
        kind: OpKind,
    ) -> Result<(), Error> {
        let op = self.next_op;
        self.next_op += 1;
        self.ops.insert(op, kind);
        // SAFETY: the bytes are a run's output (kept until the send node completes, which waits
        // for this op), or a buffer owned by the op's record or its send's progress entry
        // (dropped only once the op is reported done).
        unsafe { self.t.send(to, tag, ptr, len, op) }
    }

    fn send_control(&mut self, to: usize, msg: &Control) {
        if self.fatal.is_some() || self.peers[to].state != PeerState::Alive {
            return;
        }
        let bytes = msg.encode();
        let (ptr, len) = (bytes.as_ptr(), bytes.len());
        if let Err(e) = self.start_send(to, CONTROL_TAG, ptr, len, OpKind::Control(bytes)) {
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
        self.woke = true;
        let gid = *run.graph.gid.get().expect("registered");
        self.broadcast(&Control::Fail {
            gid,
            seq: run.seq,
            failure,
        });
    }

    fn local_done(&mut self, run: Arc<RunState>) {
        run.set_local_done();
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

    // ---------------------------------------------------------------- the check

    fn registered(&mut self, gid: u32, from: usize, reg: Reg) {
        let size = self.size;
        let regs = self
            .regs
            .entry(gid)
            .or_insert_with(|| (0..size).map(|_| None).collect());
        regs[from] = Some(reg);
        if regs.iter().any(Option::is_none) {
            return;
        }
        let regs = self.regs.remove(&gid).expect("complete");
        let first = regs[0].as_ref().expect("complete");
        let mismatch = regs.iter().enumerate().skip(1).find_map(|(r, reg)| {
            let reg = reg.as_ref().expect("complete");
            let diff = if reg.name != first.name {
                Some(None)
            } else {
                first_difference(&first.digest, &reg.digest)
            };
            diff.map(|node| Mismatch {
                rank: r as u32,
                node: node.map(|i| i as u32),
                name_on_0: None,
                graph_on_0: first.name.clone(),
            })
        });
        let result = match mismatch {
            Some(mut m) => {
                m.name_on_0 = m.node.and_then(|i| {
                    self.graphs
                        .get(&gid)
                        .and_then(|g| g.graph.as_ref())
                        .and_then(|g| g.node_names.get(i as usize).cloned())
                });
                Err(m)
            }
            None => {
                let base = self.next_tag;
                let end = base + first.tags;
                if end > u64::from(self.t.max_tag()) + 1 {
                    Err(Mismatch {
                        rank: u32::MAX,
                        node: None,
                        name_on_0: Some(format!(
                            "needs {} tags, and {} of the transport's {} are left",
                            first.tags,
                            (u64::from(self.t.max_tag()) + 1).saturating_sub(base),
                            self.t.max_tag()
                        )),
                        graph_on_0: first.name.clone(),
                    })
                } else {
                    self.next_tag = end;
                    Ok(base as u32)
                }
            }
        };
        let msg = Control::Verdict { gid, result };
        self.broadcast(&msg);
        if let Control::Verdict { result, .. } = msg {
            self.verdict(gid, result);
        }
    }

    fn mismatch_error(&self, gid: u32, m: &Mismatch) -> Error {
        let gs = self.graphs.get(&gid);
        let name = gs
            .and_then(|g| g.graph.as_ref())
            .map_or("?", |g| g.name.as_str());
        if m.rank == u32::MAX {
            return Error::new(
                ErrorKind::InvalidConfig,
                format!(
                    "graph '{}' {} (MPI_TAG_UB); fewer runs in flight or fewer transfers per pair of ranks need fewer",
                    crate::error::bounded(name),
                    m.name_on_0.as_deref().unwrap_or("needs more tags")
                ),
            );
        }
        let here = if self.rank == m.rank as usize {
            m.node
                .and_then(|i| {
                    gs.and_then(|g| g.graph.as_ref())
                        .map(|g| match g.node_names.get(i as usize) {
                            Some(n) => format!(" (here: '{}')", crate::error::bounded(n)),
                            None => " (here: no such node)".to_string(),
                        })
                })
                .unwrap_or_default()
        } else {
            String::new()
        };
        let msg = match (m.node, &m.name_on_0) {
            (Some(i), Some(n0)) => format!(
                "graph '{}' differs between ranks: node #{i} is '{}' on rank 0 but differs on rank {}{here} (its name, rank, wire, output type or inputs)",
                crate::error::bounded(&m.graph_on_0),
                crate::error::bounded(n0),
                m.rank
            ),
            (Some(i), None) => format!(
                "graph '{}' differs between ranks: rank 0's graph has no node #{i}, rank {}'s has{here}",
                crate::error::bounded(&m.graph_on_0),
                m.rank
            ),
            (None, _) => format!(
                "graph '{}' (first submitted as graph #{gid} here) differs between ranks: rank {} has another name, node count or runs in flight{}",
                crate::error::bounded(&m.graph_on_0),
                m.rank,
                if self.rank == m.rank as usize { format!(" (here: '{}')", crate::error::bounded(name)) } else { String::new() }
            ),
        };
        let mut e = Error::new(ErrorKind::GraphMismatch, msg).at_rank(m.rank as usize);
        if let Some(n) = &m.name_on_0 {
            e = e.at_node(n.clone());
        }
        e
    }

    fn verdict(&mut self, gid: u32, result: Result<u32, Mismatch>) {
        match result {
            Ok(base) => {
                let gs = self.graphs.entry(gid).or_default();
                let graph = gs
                    .graph
                    .clone()
                    .expect("a verdict follows our registration");
                let layout = TagLayout {
                    base,
                    slots: graph.runs_in_flight,
                    per_run: graph.tags_per_run,
                };
                gs.layout = Some(layout);
                if TagLayout::size(layout.slots, layout.per_run) > 0 {
                    self.ranges.insert(base, gid);
                }
                let held = std::mem::take(&mut gs.held);
                for (run, k, payload) in held {
                    self.post_send(layout, run, k, payload);
                }
                self.remap_unmapped();
            }
            Err(m) => {
                let e = self.mismatch_error(gid, &m);
                let gs = self.graphs.entry(gid).or_default();
                gs.refused = Some(e.clone());
                for (run, k, _) in std::mem::take(&mut gs.held) {
                    run.sends[k as usize].fail(e.clone());
                }
                for run in gs.active.values() {
                    run.cancel(&e);
                }
                self.woke = true;
            }
        }
    }

    // ---------------------------------------------------------------- arrivals

    /// Takes up to `max` arrived messages; returns how many.
    pub(crate) fn probe(&mut self, max: usize) -> usize {
        if self.fatal.is_some() {
            return 0;
        }
        let mut n = 0;
        while n < max {
            match self.t.probe() {
                Ok(Some(p)) => {
                    n += 1;
                    if p.from < self.size {
                        self.peers[p.from].last_heard = Instant::now();
                    }
                    let src = p.from;
                    if let Err(e) = self.arrived(p) {
                        self.transport_failed(e);
                        return n;
                    }
                    self.process(src);
                }
                Ok(None) => break,
                Err(e) => {
                    self.transport_failed(e);
                    break;
                }
            }
        }
        n
    }

    fn push_entry(&mut self, src: usize, entry: Entry<T::Message>) -> u64 {
        let id = self.front_id[src] + self.queues[src].len() as u64;
        self.queues[src].push_back(entry);
        id
    }

    fn entry_mut(&mut self, src: usize, id: u64) -> Option<&mut Entry<T::Message>> {
        let i = id.checked_sub(self.front_id[src])?;
        self.queues[src].get_mut(i as usize)
    }

    fn arrived(&mut self, p: Probed<T::Message>) -> Result<(), Error> {
        let src = p.from;
        if p.tag == CONTROL_TAG {
            let mut buf = vec![0u8; p.len];
            let id = self.push_entry(
                src,
                Entry {
                    ops_left: 1,
                    chunks_left: 0,
                    offset: 0,
                    kind: EntryKind::Control(Vec::new()),
                },
            );
            let ptr = buf.as_mut_ptr();
            if let Some(e) = self.entry_mut(src, id) {
                e.kind = EntryKind::Control(buf);
            }
            return self.start_receive(p, ptr, src, id);
        }
        // Data waits behind an unmapped message of the same sender (order matters), and for
        // its graph's verdict.
        let blocked = self.queues[src]
            .iter()
            .any(|e| matches!(e.kind, EntryKind::Unmapped(_)));
        if blocked || self.layout_of(p.tag).is_none() {
            self.push_entry(
                src,
                Entry {
                    ops_left: 0,
                    chunks_left: 0,
                    offset: 0,
                    kind: EntryKind::Unmapped(Some(p)),
                },
            );
            return Ok(());
        }
        self.map_data(p, None)
    }

    fn layout_of(&self, tag: u32) -> Option<(u32, TagLayout)> {
        let (_, &gid) = self.ranges.range(..=tag).next_back()?;
        let layout = self.graphs.get(&gid)?.layout?;
        layout.decode(tag).map(|_| (gid, layout))
    }

    /// Starts receiving a mapped data message: a whole value, a long value's header, or one of
    /// its chunks. `at`: the unmapped entry it replaces, if it waited for a verdict.
    fn map_data(&mut self, p: Probed<T::Message>, at: Option<u64>) -> Result<(), Error> {
        let (src, tag) = (p.from, p.tag);
        let (gid, layout) = self.layout_of(tag).expect("mapped");
        let (slot, index, long) = layout.decode(tag).expect("in range");
        let graph = self.graphs[&gid].graph.clone().expect("registered");
        let Some(&k) = graph.recv_at.get(&(src, index)) else {
            return Err(Error::new(
                ErrorKind::Transport,
                format!(
                    "rank {}: rank {src} sent transfer {index} of graph '{}', which this rank does not receive",
                    self.rank, graph.name
                ),
            ));
        };
        let land = graph.recvs[k as usize].land;
        if long {
            if let Some(&id) = self.long_active.get(&(src, tag)) {
                return self.chunk(p, id, at);
            }
            // The header: received now (16 bytes, already here), so the landing can be made.
            let header = self.receive_now(p)?;
            let total = u64::from_le_bytes(header[0..8].try_into().expect("8 bytes")) as usize;
            let chunks = u64::from_le_bytes(header[8..16].try_into().expect("8 bytes"));
            let entry = Entry {
                ops_left: 0,
                chunks_left: chunks,
                offset: 0,
                kind: EntryKind::Data {
                    gid,
                    slot,
                    k,
                    landing: landing_for(land, total),
                },
            };
            let id = self.place_entry(src, entry, at);
            if chunks > 0 {
                self.long_active.insert((src, tag), id);
            }
            return Ok(());
        }
        let mut landing = landing_for(land, p.len);
        let ptr = landing.ptr();
        let entry = Entry {
            ops_left: 1,
            chunks_left: 0,
            offset: 0,
            kind: EntryKind::Data {
                gid,
                slot,
                k,
                landing,
            },
        };
        let id = self.place_entry(src, entry, at);
        self.start_receive(p, ptr, src, id)
    }

    /// A chunk of long value `id`: received into its landing at the entry's offset.
    fn chunk(&mut self, p: Probed<T::Message>, id: u64, at: Option<u64>) -> Result<(), Error> {
        let (src, tag, len) = (p.from, p.tag, p.len);
        if let Some(at) = at {
            // The placeholder it waited in is done with.
            if let Some(e) = self.entry_mut(src, at) {
                e.kind = EntryKind::Skip;
            }
        }
        let e = self.entry_mut(src, id).expect("a long value in progress");
        let EntryKind::Data { landing, .. } = &mut e.kind else {
            unreachable!("long values land in data entries")
        };
        if e.offset + len > landing.len() || e.chunks_left == 0 {
            return Err(Error::new(
                ErrorKind::Transport,
                format!("rank {src} sent more bytes of a long value than its header said"),
            ));
        }
        // SAFETY: `offset + len` is within the landing, checked above.
        let ptr = unsafe { landing.ptr().add(e.offset) };
        e.offset += len;
        e.chunks_left -= 1;
        e.ops_left += 1;
        if e.chunks_left == 0 {
            self.long_active.remove(&(src, tag));
        }
        self.start_receive(p, ptr, src, id)
    }

    /// Puts `entry` in `src`'s queue, in the place of placeholder `at` if it waited.
    fn place_entry(&mut self, src: usize, entry: Entry<T::Message>, at: Option<u64>) -> u64 {
        match at {
            Some(at) => {
                *self.entry_mut(src, at).expect("placeholder") = entry;
                at
            }
            None => self.push_entry(src, entry),
        }
    }

    fn start_receive(
        &mut self,
        p: Probed<T::Message>,
        into: *mut u8,
        src: usize,
        entry: u64,
    ) -> Result<(), Error> {
        let op = self.next_op;
        self.next_op += 1;
        self.ops.insert(op, OpKind::Recv { src, entry });
        // SAFETY: `into` is a buffer owned by entry `entry` of `src`'s queue (a control
        // buffer, a landing, or scratch), with room for the message; the entry is popped
        // only once this op is reported done.
        unsafe { self.t.receive(p, into, op) }
    }

    /// Receives a small message at once (a long value's 16-byte header, which is already here).
    fn receive_now(&mut self, p: Probed<T::Message>) -> Result<Vec<u8>, Error> {
        if p.len != 16 {
            return Err(Error::new(
                ErrorKind::Transport,
                format!("rank {}: a long value's header of {} bytes", p.from, p.len),
            ));
        }
        let mut buf = vec![0u8; 16];
        let op = self.next_op;
        self.next_op += 1;
        // SAFETY: `buf` has the 16 bytes and outlives the op: we poll until it is done.
        unsafe { self.t.receive(p, buf.as_mut_ptr(), op)? };
        let start = Instant::now();
        let mut done = Vec::new();
        loop {
            self.t.poll(&mut done)?;
            if let Some(i) = done.iter().position(|&d| d == op) {
                done.swap_remove(i);
                self.done.extend(done);
                return Ok(buf);
            }
            if start.elapsed() > self.cfg.peer_timeout {
                // Leak the buffer: the transport may still write it.
                std::mem::forget(buf);
                return Err(Error::new(
                    ErrorKind::Transport,
                    "a 16-byte header did not arrive in time",
                ));
            }
            std::hint::spin_loop();
        }
    }

    /// After a verdict: maps data that waited for it, in each sender's order.
    fn remap_unmapped(&mut self) {
        for src in 0..self.size {
            let mut i = 0;
            while i < self.queues[src].len() {
                let id = self.front_id[src] + i as u64;
                let waiting = matches!(self.queues[src][i].kind, EntryKind::Unmapped(Some(_)));
                if waiting {
                    let tag = match &self.queues[src][i].kind {
                        EntryKind::Unmapped(Some(p)) => p.tag,
                        _ => unreachable!(),
                    };
                    if self.layout_of(tag).is_none() {
                        break;
                    }
                    let p = match &mut self.queues[src][i].kind {
                        EntryKind::Unmapped(p) => p.take().expect("waiting"),
                        _ => unreachable!(),
                    };
                    if let Err(e) = self.map_data(p, Some(id)) {
                        self.transport_failed(e);
                        return;
                    }
                }
                i += 1;
            }
            self.process(src);
        }
    }

    /// Polls the transport; returns how many operations finished.
    pub(crate) fn poll(&mut self) -> usize {
        if self.fatal.is_some() {
            return 0;
        }
        let mut done = std::mem::take(&mut self.done);
        if let Err(e) = self.t.poll(&mut done) {
            self.transport_failed(e);
            return 0;
        }
        let n = done.len();
        let mut sources = Vec::new();
        for op in done.drain(..) {
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
                        s.run.sends[s.k as usize].done();
                        self.woke = true;
                    }
                }
                Some(OpKind::Control(_)) | None => {}
                Some(OpKind::Recv { src, entry }) => {
                    if let Some(e) = self.entry_mut(src, entry) {
                        e.ops_left -= 1;
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

    /// Handles `src`'s finished arrivals, in the order it sent them.
    fn process(&mut self, src: usize) {
        while self.queues[src].front().is_some_and(Entry::complete) {
            let e = self.queues[src].pop_front().expect("front");
            self.front_id[src] += 1;
            match e.kind {
                EntryKind::Skip => {}
                EntryKind::Control(bytes) => match Control::decode(&bytes, src) {
                    Ok(c) => self.control(src, c),
                    Err(err) => {
                        self.transport_failed(err);
                        return;
                    }
                },
                EntryKind::Data {
                    gid,
                    slot,
                    k,
                    landing,
                } => {
                    // SAFETY: every op writing the landing finished, and the header's total
                    // bytes were written by its chunks (or the one message).
                    let value = unsafe { landing.finish() };
                    self.deliver(gid, src, slot, k, value);
                }
                EntryKind::Unmapped(_) => unreachable!("not complete"),
            }
        }
    }

    fn deliver(
        &mut self,
        gid: u32,
        src: usize,
        slot: u32,
        k: u32,
        value: Result<AnyValue, String>,
    ) {
        let rank = self.rank;
        let gs = self.graphs.entry(gid).or_default();
        let w = u64::from(gs.graph.as_ref().map_or(1, |g| g.runs_in_flight));
        let seq = u64::from(slot) + w * gs.finished[src][slot as usize];
        match gs.active.get(&seq) {
            Some(run) if !run.is_local_done() => {
                let run = run.clone();
                match value {
                    Ok(v) => run.recvs[k as usize].fill(v),
                    Err(msg) => {
                        let f = decode_failure(&run, k, rank, msg);
                        run.recvs[k as usize].fail(f.to_error());
                        self.node_failed(&run, f);
                    }
                }
                self.woke = true;
            }
            Some(_) => {}
            None if gs.started.contains(seq) => {}
            None => {
                gs.stash.insert((seq, k), value);
            }
        }
    }

    fn control(&mut self, src: usize, c: Control) {
        match c {
            Control::Register {
                gid,
                name,
                graph,
                nodes,
                tags,
            } => {
                if self.rank == 0 {
                    self.registered(
                        gid,
                        src,
                        Reg {
                            name,
                            digest: Digest { graph, nodes },
                            tags,
                        },
                    );
                }
            }
            Control::Verdict { gid, result } => self.verdict(gid, result),
            Control::Status { gid, seq, outcome } => {
                let size = self.size;
                let gs = self.graphs.entry(gid).or_default();
                if let Some(g) = &gs.graph {
                    let slot = (seq % u64::from(g.runs_in_flight)) as usize;
                    gs.finished[src][slot] += 1;
                }
                gs.statuses.entry(seq).or_insert_with(|| vec![None; size])[src] = Some(outcome);
                self.try_resolve(gid, seq);
            }
            Control::Fail { gid, seq, failure } => {
                let gs = self.graphs.entry(gid).or_default();
                let e = failure.to_error();
                match gs.active.get(&seq) {
                    Some(run) => {
                        run.cancel(&e);
                        self.woke = true;
                    }
                    None if gs.started.contains(seq) => {}
                    None => {
                        gs.failed_early.entry(seq).or_insert(failure);
                    }
                }
            }
            Control::Heartbeat => {}
            Control::Bye => self.peer_gone(src, PeerState::Left),
            Control::Died { reason } => self.peer_gone(src, PeerState::Dead(reason)),
        }
    }

    fn try_resolve(&mut self, gid: u32, seq: u64) {
        let gone = self.gone_error();
        let Some(gs) = self.graphs.get_mut(&gid) else {
            return;
        };
        let Some(run) = gs.active.get(&seq).cloned() else {
            return;
        };
        if !run.is_local_done() {
            return;
        }
        let Some(statuses) = gs.statuses.get(&seq) else {
            return;
        };
        let complete = statuses.iter().all(Option::is_some);
        if !complete && gone.is_none() {
            return;
        }
        let failure = statuses
            .iter()
            .flatten()
            .filter_map(|o| match o {
                Outcome::Failed(f) => Some(f),
                _ => None,
            })
            .min_by_key(|f| f.rank);
        let result = match (failure, &gs.refused, complete, gone) {
            (Some(f), _, _, _) => Err(f.to_error()),
            (None, Some(e), _, _) => Err(e.clone()),
            (None, None, true, _) => Ok(()),
            (None, None, false, Some(e)) => Err(e),
            (None, None, false, None) => unreachable!("returned above"),
        };
        run.resolve(result);
        gs.active.remove(&seq);
        gs.statuses.remove(&seq);
    }

    // ---------------------------------------------------------------- peers and faults

    /// The error for runs when some peer is gone (the first gone one).
    fn gone_error(&self) -> Option<Error> {
        self.peers
            .iter()
            .enumerate()
            .find_map(|(r, p)| match &p.state {
                PeerState::Alive => None,
                PeerState::Left => Some(
                    Error::new(
                        ErrorKind::PeerLeft,
                        format!("rank {r} shut its runtime down while this run needed it"),
                    )
                    .at_rank(r),
                ),
                PeerState::Dead(why) => Some(
                    Error::new(ErrorKind::PeerDied, format!("rank {r} died: {why}")).at_rank(r),
                ),
            })
    }

    fn peer_gone(&mut self, r: usize, state: PeerState) {
        if self.peers[r].state != PeerState::Alive {
            return;
        }
        if matches!(state, PeerState::Dead(_)) {
            self.poison();
        }
        self.peers[r].state = state;
        let e = self.gone_error().expect("a peer is gone");
        let mut pending = Vec::new();
        for (&gid, gs) in &self.graphs {
            for (&seq, run) in &gs.active {
                // A run that has everything from every rank resolves normally.
                let needs = run.recvs.iter().any(|c| c.is_pending())
                    || gs.statuses.get(&seq).is_none_or(|s| s[r].is_none());
                if needs {
                    run.cancel(&e);
                    run.resolve(Err(e.clone()));
                } else {
                    pending.push((gid, seq));
                }
            }
        }
        for (gid, seq) in pending {
            self.try_resolve(gid, seq);
        }
        self.woke = true;
    }

    fn transport_failed(&mut self, e: Error) {
        if self.fatal.is_some() {
            return;
        }
        self.fatal = Some(e.clone());
        self.poison();
        for gs in self.graphs.values_mut() {
            for run in gs.active.values() {
                run.cancel(&e);
                run.resolve(Err(e.clone()));
            }
            for (run, _, _) in gs.held.drain(..) {
                run.resolve(Err(e.clone()));
            }
        }
        self.woke = true;
    }

    fn poison(&mut self) {
        self.poisoned = true;
        self.poisoned_flag
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// Heartbeats out, silent peers declared dead. Cheap to call often.
    pub(crate) fn timers(&mut self) {
        let now = Instant::now();
        if self.closing.is_none() && now.duration_since(self.last_beat) >= self.cfg.heartbeat {
            self.last_beat = now;
            self.broadcast(&Control::Heartbeat);
        }
        if now.duration_since(self.last_check) < Duration::from_millis(10) {
            return;
        }
        self.last_check = now;
        for r in 0..self.size {
            if r == self.rank || self.peers[r].state != PeerState::Alive {
                continue;
            }
            let silent = now.duration_since(self.peers[r].last_heard);
            if silent > self.cfg.peer_timeout {
                self.peer_gone(
                    r,
                    PeerState::Dead(format!(
                        "silent for {:.1} s (killed, or hung; the peer timeout is {:.1} s)",
                        silent.as_secs_f64(),
                        self.cfg.peer_timeout.as_secs_f64()
                    )),
                );
            }
        }
    }
}

fn cfg_heartbeat_never() -> Duration {
    Duration::from_secs(3600)
}

/// The landing for `len` bytes of a value, or scratch memory that refuses (the size does not
/// fit the type: the message is still received, and its receive node fails naming the edge).
fn landing_for(land: crate::value::LandFn, len: usize) -> Box<dyn Landing> {
    match land(len) {
        Ok(l) => l,
        Err(error) => Box::new(Refused(vec![0u8; len], error)),
    }
}

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

/// Scratch memory for a value that cannot land; always refuses.
struct Refused(Vec<u8>, String);

impl Landing for Refused {
    fn ptr(&mut self) -> *mut u8 {
        self.0.as_mut_ptr()
    }
    fn len(&self) -> usize {
        self.0.len()
    }
    unsafe fn finish(self: Box<Self>) -> Result<AnyValue, String> {
        Err(self.1)
    }
}
