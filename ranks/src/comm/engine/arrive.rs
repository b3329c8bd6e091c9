//! Arrivals: every message is taken at once (a matched probe) into its landing, and handled
//! in its sender's order (a sender's control messages and data interleave meaningfully: a
//! status before the next run's data of the same slot). A small value on the posted lane
//! comes first: its trailer names its graph, transfer and run, so it needs no order, and it
//! is in its receive already when seen.

use super::*;

impl<T: Transport> Engine<T> {
    /// Takes up to `max` arrived messages (the posted lane's first); returns how many.
    pub(crate) fn probe(&mut self, max: usize) -> usize {
        if self.fatal.is_some() {
            return 0;
        }
        let mut n = 0;
        if self.lane > 0 {
            n = self.take_lane(max);
            if self.fatal.is_some() || (self.worker_looking && self.delivered) {
                return n;
            }
        }
        while n < max {
            match self.t.probe() {
                Ok(Some(p)) => {
                    n += 1;
                    if p.from < self.size {
                        self.peers[p.from].last_heard = Instant::now();
                    }
                    let src = p.from;
                    if self.cfg.stamps {
                        self.arrival = monotonic_ns();
                    }
                    if let Err(e) = self.arrived(p) {
                        self.transport_failed(e);
                        return n;
                    }
                    // A message that was all here is received already: handled now.
                    self.take_finished();
                    self.process(src);
                    if self.worker_looking && self.delivered {
                        // The worker runs the consumer first; the rest waits for its next look.
                        break;
                    }
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

    /// Takes up to `max` messages of the posted lane; returns how many.
    fn take_lane(&mut self, max: usize) -> usize {
        let mut n = 0;
        while n < max {
            let (graphs, rank) = (&self.graphs, self.rank);
            let mut got = None;
            let taken = self.t.lane_take(&mut |from, message| {
                got = Some((from, lane_landing(graphs, rank, from, message)));
            });
            let Some((src, arrival)) = (match taken {
                Ok(true) => got,
                Ok(false) => None,
                Err(e) => {
                    self.transport_failed(e);
                    None
                }
            }) else {
                break;
            };
            n += 1;
            if let Some(peer) = self.peers.get_mut(src) {
                peer.last_heard = Instant::now();
            }
            match arrival {
                LaneArrival::Landed { gid, seq, k, value } => {
                    let at = if self.cfg.stamps { monotonic_ns() } else { 0 };
                    self.deliver(gid, seq, k, value, (at, at));
                }
                LaneArrival::Unregistered(message) => self.lane_waiting.push((src, message)),
                LaneArrival::Refused(e) => {
                    self.transport_failed(e);
                    break;
                }
            }
            if self.worker_looking && self.delivered {
                break;
            }
        }
        n
    }

    /// Lane messages that waited for their graph's registration here, delivered if it came.
    pub(super) fn retry_lane_waiting(&mut self) {
        for (src, message) in std::mem::take(&mut self.lane_waiting) {
            match lane_landing(&self.graphs, self.rank, src, &message) {
                LaneArrival::Landed { gid, seq, k, value } => {
                    self.deliver(gid, seq, k, value, (0, 0))
                }
                LaneArrival::Unregistered(message) => self.lane_waiting.push((src, message)),
                LaneArrival::Refused(e) => return self.transport_failed(e),
            }
        }
    }

    pub(super) fn push_entry(&mut self, src: usize, entry: Entry<T::Message>) -> u64 {
        let id = self.front_id[src] + self.queues[src].len() as u64;
        self.queues[src].push_back(entry);
        id
    }

    pub(super) fn entry_mut(&mut self, src: usize, id: u64) -> Option<&mut Entry<T::Message>> {
        let i = id.checked_sub(self.front_id[src])?;
        self.queues[src].get_mut(i as usize)
    }

    pub(super) fn arrived(&mut self, p: Probed<T::Message>) -> Result<(), Error> {
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
                    arrived: 0,
                    received: 0,
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
                    arrived: 0,
                    received: 0,
                },
            );
            return Ok(());
        }
        self.map_data(p, None)
    }

    pub(super) fn layout_of(&self, tag: u32) -> Option<(u32, TagLayout)> {
        let (_, &gid) = self.ranges.range(..=tag).next_back()?;
        let layout = self.graphs.get(&gid)?.layout?;
        layout.decode(tag).map(|_| (gid, layout))
    }

    /// Starts receiving a mapped data message: a whole value, a long value's header, or one of
    /// its chunks. `at`: the unmapped entry it replaces, if it waited for a verdict.
    pub(super) fn map_data(&mut self, p: Probed<T::Message>, at: Option<u64>) -> Result<(), Error> {
        let (src, tag) = (p.from, p.tag);
        let (gid, layout) = self.layout_of(tag).expect("mapped");
        let (slot, index, long) = layout.decode(tag).expect("in range");
        let graph = self.graphs[&gid].graph.as_ref().expect("registered");
        let Some(&k) = graph.recv_at.get(&(src, index)) else {
            return Err(Error::new(
                ErrorKind::Transport,
                format!(
                    "rank {}: rank {src} sent transfer {index} of graph '{}', which this rank does not receive",
                    self.rank, graph.name
                ),
            ));
        };
        if long {
            let graph = graph.clone();
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
                    landing: landing_for(&graph, k, total),
                },
                arrived: self.arrival,
                received: 0,
            };
            let id = self.place_entry(src, entry, at);
            if chunks > 0 {
                self.long_active.insert((src, tag), id);
            }
            return Ok(());
        }
        let mut landing = landing_for(graph, k, p.len);
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
            arrived: self.arrival,
            received: 0,
        };
        let id = self.place_entry(src, entry, at);
        self.start_receive(p, ptr, src, id)
    }

    /// A chunk of long value `id`: received into its landing at the entry's offset.
    pub(super) fn chunk(
        &mut self,
        p: Probed<T::Message>,
        id: u64,
        at: Option<u64>,
    ) -> Result<(), Error> {
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
    pub(super) fn place_entry(
        &mut self,
        src: usize,
        entry: Entry<T::Message>,
        at: Option<u64>,
    ) -> u64 {
        match at {
            Some(at) => {
                *self.entry_mut(src, at).expect("placeholder") = entry;
                at
            }
            None => self.push_entry(src, entry),
        }
    }

    pub(super) fn start_receive(
        &mut self,
        p: Probed<T::Message>,
        into: *mut u8,
        src: usize,
        entry: u64,
    ) -> Result<(), Error> {
        let op = self.next_op;
        self.next_op += 1;
        self.ops.insert(op, OpKind::Recv { src, entry });
        if p.len >= BULK_BYTES {
            self.bulk.insert(op);
        }
        // SAFETY: `into` is a buffer owned by entry `entry` of `src`'s queue (a control
        // buffer, a landing, or scratch), with room for the message; the entry is popped
        // only once this op is reported done.
        unsafe { self.t.receive(p, into, op) }
    }

    /// Receives a small message at once (a long value's 16-byte header, which is already here).
    pub(super) fn receive_now(&mut self, p: Probed<T::Message>) -> Result<Vec<u8>, Error> {
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
    pub(super) fn remap_unmapped(&mut self) {
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

    /// Handles `src`'s finished arrivals, in the order it sent them.
    pub(super) fn process(&mut self, src: usize) {
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
                    let value = unsafe { landing.finish_landed() };
                    // Its run: the next in its slot after the runs whose status `src` sent
                    // before it (a sender's messages are handled in its order).
                    let gs = self.graphs.entry(gid).or_default();
                    let w = u64::from(gs.graph.as_ref().map_or(1, |g| g.runs_in_flight));
                    let seq = u64::from(slot) + w * gs.finished[src][slot as usize];
                    self.deliver(gid, seq, k, value, (e.arrived, e.received));
                }
                EntryKind::Unmapped(_) => unreachable!("not complete"),
            }
        }
    }

    /// Hands receive `k`'s value of run `seq` of graph `gid` to its run (or keeps it for the
    /// run's start).
    pub(super) fn deliver(
        &mut self,
        gid: u32,
        seq: u64,
        k: u32,
        value: Result<Landed, String>,
        (arrived, received): (u64, u64),
    ) {
        let rank = self.rank;
        let hops = ArrivalHops {
            arrived,
            received,
            by_worker: self.worker_looking,
        };
        let gs = self.graphs.entry(gid).or_default();
        match gs.active.get(&seq) {
            Some(run) if !run.is_local_done() => {
                self.delivered = true;
                match value {
                    Ok(v) => hops.fill(run, k, v),
                    Err(msg) => {
                        let run = run.clone();
                        let f = decode_failure(&run, k, rank, msg);
                        run.recvs[k as usize].fail(f.to_error());
                        self.node_failed(&run, f);
                    }
                }
            }
            Some(_) => {}
            None if gs.started.contains(seq) => {}
            None => {
                // Before its run started here (its data overtook the run's start): filled, and
                // stamped, when it starts.
                gs.stash.insert((seq, k), (value, hops));
            }
        }
    }

    pub(super) fn control(&mut self, src: usize, c: Control) {
        match c {
            Control::Register {
                gid,
                name,
                graph,
                nodes,
                relay,
                tags,
            } => {
                if self.rank == 0 {
                    self.registered(
                        gid,
                        src,
                        Reg {
                            name,
                            digest: Digest {
                                graph,
                                nodes,
                                relay,
                            },
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
}

/// What a lane message turned out to be.
enum LaneArrival {
    /// Receive `k`'s value of run `seq` of graph `gid`, landed.
    Landed {
        gid: u32,
        seq: u64,
        k: u32,
        value: Result<Landed, String>,
    },
    /// Of a graph this rank has not registered yet: kept until it does.
    Unregistered(Vec<u8>),
    /// Not a value this rank receives: the transport (or the peer) is broken.
    Refused(Error),
}

/// Lands a lane message from `src` in its receive's landing (a copy of at most the lane's
/// size, out of the transport's posted memory).
fn lane_landing(
    graphs: &HashMap<u32, GraphState>,
    rank: usize,
    src: usize,
    message: &[u8],
) -> LaneArrival {
    let Some((h, bytes)) = LaneTrailer::split(message) else {
        return LaneArrival::Refused(Error::new(
            ErrorKind::Transport,
            format!(
                "rank {rank}: rank {src} sent {} bytes on the posted lane, less than a trailer",
                message.len()
            ),
        ));
    };
    let Some(graph) = graphs.get(&h.gid).and_then(|g| g.graph.as_ref()) else {
        return LaneArrival::Unregistered(message.to_vec());
    };
    let Some(&k) = graph.recv_at.get(&(src, h.index)) else {
        return LaneArrival::Refused(Error::new(
            ErrorKind::Transport,
            format!(
                "rank {rank}: rank {src} sent transfer {} of graph '{}', which this rank does not receive",
                h.index, graph.name
            ),
        ));
    };
    let mut landing = landing_for(graph, k, bytes.len());
    // SAFETY: the landing has room for `bytes.len()` bytes (`landing_for` made it so), and a
    // landing's memory is its own, apart from the transport's.
    let value = unsafe {
        if !bytes.is_empty() {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), landing.ptr(), bytes.len());
        }
        landing.finish_landed()
    };
    LaneArrival::Landed {
        gid: h.gid,
        seq: h.seq,
        k,
        value,
    }
}

/// The landing for `len` bytes of receive `k`'s value, in the memory an earlier value of it
/// gave back if that fits (see `CommGraph::take_spare`), or scratch memory that refuses (the
/// size does not fit the type: the message is still received, and its receive node fails
/// naming the edge).
fn landing_for(graph: &CommGraph, k: u32, len: usize) -> Box<dyn Landing> {
    match (graph.recvs[k as usize].land)(len) {
        Ok(mut l) => {
            if graph.take_spare(k).is_some_and(|spare| l.reuse(spare)) {
                graph.note_recycled();
            }
            l
        }
        Err(error) => Box::new(Refused(vec![0u8; len], error)),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::run::RecvSpec;
    use crate::value::{plain_landing, plain_reclaim};

    #[test]
    fn a_landing_takes_the_spare_of_its_receive() {
        let recv = RecvSpec {
            from: 1,
            index: 0,
            land: crate::value::land_fn(plain_landing::<Vec<u16>>),
            edge: "e".into(),
            producer: 0,
            producer_name: "p".into(),
            reclaim: Some(plain_reclaim::<Vec<u16>>),
        };
        let graph = Arc::new(CommGraph::new(
            "g".into(),
            1,
            Digest {
                graph: 0,
                nodes: vec![],
                relay: 0,
            },
            Arc::from(Vec::new()),
            1,
            1,
            vec![],
            vec![recv],
        ));
        // A run whose received value was dropped leaves its memory to the receive.
        let run = RunState::new(graph.clone(), 0);
        let v = vec![3u16; 500];
        let addr = v.as_ptr() as usize;
        run.recvs[0].fill(Box::new(v));
        drop(run);
        let mut l = landing_for(&graph, 0, 1000);
        assert_eq!(graph.recycled(), 1, "the next value lands in it");
        assert_eq!(l.ptr() as usize, addr);
        // None left: the one after that gets memory of its own.
        landing_for(&graph, 0, 1000);
        assert_eq!(graph.recycled(), 1);
    }
}

/// When a value's message arrived and its bytes were all in, and whether a worker took it:
/// its receive's stamps, kept with a value that waits for its run to start.
#[derive(Clone, Copy, Debug)]
pub(super) struct ArrivalHops {
    arrived: u64,
    received: u64,
    by_worker: bool,
}

impl ArrivalHops {
    /// Fills receive `k` of `run` with `v`, stamping the hops if the run stamps its edges.
    pub(super) fn fill(self, run: &RunState, k: u32, v: Landed) {
        if !run.stamps() {
            run.recvs[k as usize].fill_landed(v);
            return;
        }
        run.stamp_recv(k, RecvHop::Arrived, self.arrived);
        run.stamp_recv(k, RecvHop::Received, self.received);
        run.stamp_recv(k, RecvHop::Completing, monotonic_ns());
        if self.by_worker {
            run.stamp_recv(k, RecvHop::ByWorker, 1);
        }
        run.recvs[k as usize].fill_landed(v);
        run.stamp_recv(k, RecvHop::Completed, monotonic_ns());
    }
}
