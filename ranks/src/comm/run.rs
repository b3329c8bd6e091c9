//! What the communication thread shares with workers and waiters: a graph's communication
//! plan ([`CommGraph`]), one run's state ([`RunState`]) with a cell per receive and per send
//! (each completing its node through the node's `Completer`), and the run's result across
//! ranks.

use rustc_hash::FxHashMap as HashMap;
use std::any::Any;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::task::Poll;
use std::time::{Duration, Instant};

use boundpool_scheduler::backend::Completer;
use boundpool_scheduler::BoxError;

use crate::comm::stamps::{monotonic_ns, EdgeStamps, RecvHop, RunStamps, SendHop};
use crate::comm::wire::{Failure, Outcome, TagLayout};
use crate::error::{Error, ErrorKind};
use crate::plan::Digest;
use crate::value::{AnyValue, LandFn, Landed, ReclaimFn, Spare};

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A send of this rank: which transfer, to whom, its index in the pair.
#[derive(Clone, Debug)]
pub(crate) struct SendSpec {
    pub(crate) to: usize,
    pub(crate) index: u32,
    /// The producing node (by index in the graph).
    pub(crate) producer: u32,
    /// How urgent the value is on its receiver (`Transfer::priority`): queued sends go
    /// most urgent first.
    pub(crate) priority: u32,
}

/// A receive of this rank: from whom, its index in the pair, how its bytes become a value, and
/// the edge it serves (for messages).
#[derive(Clone)]
pub(crate) struct RecvSpec {
    pub(crate) from: usize,
    pub(crate) index: u32,
    pub(crate) land: LandFn,
    pub(crate) edge: String,
    /// The receive node's index in the graph's numbering of failures (see `Failure::node`).
    pub(crate) producer: u32,
    pub(crate) producer_name: String,
    /// How a received value's memory is given back at its run's end (plain values whose type
    /// gives its `Vec` back), for the next value of this receive to land in.
    pub(crate) reclaim: Option<ReclaimFn>,
}

/// One graph's communication plan on this rank, shared by its runs and the comm thread.
pub(crate) struct CommGraph {
    pub(crate) name: String,
    pub(crate) rank: usize,
    pub(crate) digest: Digest,
    pub(crate) node_names: Arc<[String]>,
    pub(crate) runs_in_flight: u32,
    pub(crate) tags_per_run: u32,
    pub(crate) sends: Vec<SendSpec>,
    pub(crate) recvs: Vec<RecvSpec>,
    /// (sender, index) → position in `recvs`.
    pub(crate) recv_at: HashMap<(usize, u32), u32>,
    /// Its id among this process's graphs, given at first submission (the same on every rank,
    /// checked).
    pub(crate) gid: OnceLock<u32>,
    /// Its tags, once the verdict gave them (published by the comm thread for send nodes).
    layout: OnceLock<TagLayout>,
    /// Per run slot: whether a run holds it, and the seq of the next run to take it.
    slots: Mutex<Vec<(bool, u64)>>,
    slot_free: Condvar,
    /// Per receive: memory of values received before whose runs ended, for the next values
    /// to land in (at most `runs_in_flight` each).
    spares: Box<[Mutex<Vec<Spare>>]>,
    /// Values that landed in such memory.
    recycled: AtomicU64,
    /// Its runs stamp their edges' hops (`stamps.rs`).
    stamps: bool,
}

impl std::fmt::Debug for CommGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CommGraph")
            .field("name", &self.name)
            .field("rank", &self.rank)
            .field("gid", &self.gid.get())
            .finish()
    }
}

impl CommGraph {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        name: String,
        rank: usize,
        digest: Digest,
        node_names: Arc<[String]>,
        runs_in_flight: u32,
        tags_per_run: u32,
        sends: Vec<SendSpec>,
        recvs: Vec<RecvSpec>,
    ) -> Self {
        let recv_at = recvs
            .iter()
            .enumerate()
            .map(|(k, r)| ((r.from, r.index), k as u32))
            .collect();
        CommGraph {
            name,
            rank,
            digest,
            node_names,
            runs_in_flight,
            tags_per_run,
            sends,
            spares: recvs.iter().map(|_| Mutex::new(Vec::new())).collect(),
            recycled: AtomicU64::new(0),
            recvs,
            recv_at,
            gid: OnceLock::new(),
            layout: OnceLock::new(),
            slots: Mutex::new((0..u64::from(runs_in_flight)).map(|s| (false, s)).collect()),
            slot_free: Condvar::new(),
            stamps: false,
        }
    }

    /// Its runs stamp their edges' hops (`RanksBuilder::stamp_edges`).
    pub(crate) fn with_stamps(mut self, on: bool) -> Self {
        self.stamps = on;
        self
    }

    /// Its tags, if the verdict is in and said the ranks' graphs match.
    pub(crate) fn layout(&self) -> Option<TagLayout> {
        self.layout.get().copied()
    }

    /// The verdict gave it `layout` (the comm thread, before it posts any of its sends).
    pub(crate) fn publish_layout(&self, layout: TagLayout) {
        let _ = self.layout.set(layout);
    }

    /// Memory for receive `k`'s next value, if an earlier one gave some back.
    pub(crate) fn take_spare(&self, k: u32) -> Option<Spare> {
        lock(&self.spares[k as usize]).pop()
    }

    /// A value landed in memory from [`take_spare`](Self::take_spare).
    pub(crate) fn note_recycled(&self) {
        self.recycled.fetch_add(1, Ordering::Relaxed);
    }

    /// How many values landed in recycled memory.
    pub(crate) fn recycled(&self) -> u64 {
        self.recycled.load(Ordering::Relaxed)
    }

    /// Keeps the memory of receive `k`'s value `v`, whose run ended, if its type gives it back.
    fn reclaim(&self, k: usize, v: AnyValue) {
        let Some(spare) = self.recvs[k].reclaim.and_then(|f| f(v)) else {
            return;
        };
        let mut spares = lock(&self.spares[k]);
        if spares.len() < self.runs_in_flight as usize {
            spares.push(spare);
        }
    }

    /// Waits until run `seq`'s slot is free and every earlier run of that slot has taken it,
    /// then takes it: run `seq` starts on a rank only after run `seq - runs_in_flight` ended
    /// there, so a slot's tags carry one run at a time from each sender, in order.
    pub(crate) fn take_slot(&self, seq: u64) {
        let w = u64::from(self.runs_in_flight);
        let slot = (seq % w) as usize;
        let mut s = lock(&self.slots);
        while s[slot].0 || s[slot].1 != seq {
            s = self.slot_free.wait(s).unwrap_or_else(|p| p.into_inner());
        }
        s[slot] = (true, seq + w);
    }

    /// Frees run slot `slot` (the comm thread, after the run's status went out).
    pub(crate) fn free_slot(&self, slot: u32) {
        lock(&self.slots)[slot as usize].0 = false;
        self.slot_free.notify_all();
    }
}

const PENDING: u8 = 0;
const READY: u8 = 1;
const FAILED: u8 = 2;

/// The completer of a cell's node, called once the cell is decided (filled, done or failed).
/// Attached by the node's body, which may come after the decision: whichever of the two comes
/// second calls it (the lock orders them: the decision is stored before the lock is taken to
/// look for a completer, and a body attaching under the lock sees it or leaves the completer
/// to be found).
struct Waiter(Mutex<Option<Completer>>);

impl Waiter {
    fn new() -> Self {
        Waiter(Mutex::new(None))
    }

    /// Attaches `c`, or calls it at once if `decided` already gives the cell's result.
    fn attach(&self, c: Completer, decided: impl Fn() -> Poll<Result<(), BoxError>>) {
        let mut w = lock(&self.0);
        match decided() {
            Poll::Pending => *w = Some(c),
            Poll::Ready(r) => {
                drop(w);
                c.complete(r);
            }
        }
    }

    /// The cell was decided (with `result`): calls the attached completer, if any.
    fn wake(&self, result: impl FnOnce() -> Result<(), BoxError>) {
        let c = lock(&self.0).take();
        if let Some(c) = c {
            c.complete(result());
        }
    }
}

/// A receive's arrival, written by the comm thread, read by the receive node's consumers
/// through its output; it completes the receive node through the node's completer.
pub(crate) struct RecvCell {
    state: AtomicU8,
    value: OnceLock<AnyValue>,
    /// The bytes as they arrived, kept where this rank forwards them (a serde value).
    bytes: OnceLock<Vec<u8>>,
    error: OnceLock<Error>,
    waiter: Waiter,
}

impl RecvCell {
    fn new() -> Self {
        RecvCell {
            state: AtomicU8::new(PENDING),
            value: OnceLock::new(),
            bytes: OnceLock::new(),
            error: OnceLock::new(),
            waiter: Waiter::new(),
        }
    }

    /// The value arrived (the comm thread; the first fill or failure wins).
    #[cfg(test)]
    pub(crate) fn fill(&self, value: AnyValue) {
        self.fill_landed(Landed { value, bytes: None });
    }

    /// The value arrived, with its bytes where the landing kept them.
    pub(crate) fn fill_landed(&self, landed: Landed) {
        if self.state.load(Ordering::Acquire) != PENDING {
            return;
        }
        if let Some(b) = landed.bytes {
            let _ = self.bytes.set(b);
        }
        if self.value.set(landed.value).is_ok() {
            self.state.store(READY, Ordering::Release);
            self.waiter.wake(|| Ok(()));
        }
    }

    /// The value will not come (the comm thread).
    pub(crate) fn fail(&self, e: Error) {
        if self.state.load(Ordering::Acquire) == PENDING && self.error.set(e.clone()).is_ok() {
            self.state.store(FAILED, Ordering::Release);
            self.waiter.wake(|| Err(Box::new(e)));
        }
    }

    /// Completes the receive node through `c` once the value arrived (or failed): at once if
    /// it has.
    pub(crate) fn complete_on(&self, c: Completer) {
        self.waiter.attach(c, || self.poll());
    }

    /// Takes the value out (a run's end, to recycle its memory; see `CommGraph::reclaim`).
    fn take_value(&mut self) -> Option<AnyValue> {
        self.value.take()
    }

    pub(crate) fn is_pending(&self) -> bool {
        self.state.load(Ordering::Acquire) == PENDING
    }

    /// Ready, failed or still pending, for the receive node.
    pub(crate) fn poll(&self) -> Poll<Result<(), BoxError>> {
        match self.state.load(Ordering::Acquire) {
            READY => Poll::Ready(Ok(())),
            FAILED => Poll::Ready(Err(Box::new(
                self.error
                    .get()
                    .cloned()
                    .expect("a failed cell has its error"),
            ))),
            _ => Poll::Pending,
        }
    }

    /// The bytes as they arrived, once ready, if the landing kept them.
    pub(crate) fn bytes(&self) -> Option<&[u8]> {
        (self.state.load(Ordering::Acquire) == READY)
            .then(|| self.bytes.get().map(Vec::as_slice))
            .flatten()
    }

    /// The value, once ready.
    pub(crate) fn get(&self) -> Option<&(dyn Any + Send + Sync)> {
        (self.state.load(Ordering::Acquire) == READY)
            .then(|| self.value.get().map(|v| &**v))
            .flatten()
    }
}

/// A send's completion: done once the transport no longer reads the value; it completes the
/// send node through the node's completer.
pub(crate) struct SendCell {
    state: AtomicU8,
    error: OnceLock<Error>,
    waiter: Waiter,
}

impl SendCell {
    fn new() -> Self {
        SendCell {
            state: AtomicU8::new(PENDING),
            error: OnceLock::new(),
            waiter: Waiter::new(),
        }
    }

    pub(crate) fn done(&self) {
        self.state.store(READY, Ordering::Release);
        self.waiter.wake(|| Ok(()));
    }

    /// The send will not happen: fails the send node. Only for a send the transport never
    /// started (one held for a verdict that said the graphs differ).
    pub(crate) fn fail(&self, e: Error) {
        if self.state.load(Ordering::Acquire) == PENDING && self.error.set(e.clone()).is_ok() {
            self.state.store(FAILED, Ordering::Release);
            self.waiter.wake(|| Err(Box::new(e)));
        }
    }

    /// Completes the send node through `c` once the transport is done with the value (or the
    /// send failed): at once if it is.
    pub(crate) fn complete_on(&self, c: Completer) {
        self.waiter.attach(c, || self.poll());
    }

    pub(crate) fn poll(&self) -> Poll<Result<(), BoxError>> {
        match self.state.load(Ordering::Acquire) {
            READY => Poll::Ready(Ok(())),
            FAILED => Poll::Ready(Err(Box::new(
                self.error
                    .get()
                    .cloned()
                    .expect("a failed cell has its error"),
            ))),
            _ => Poll::Pending,
        }
    }
}

/// One run of a graph on this rank.
pub(crate) struct RunState {
    pub(crate) graph: Arc<CommGraph>,
    pub(crate) seq: u64,
    pub(crate) slot: u32,
    pub(crate) recvs: Box<[RecvCell]>,
    pub(crate) sends: Box<[SendCell]>,
    /// The first node failure of this run on this rank.
    root: Mutex<Option<Failure>>,
    /// Cancelled by another rank's failure, a mismatch or a dead peer.
    cancelled: AtomicBool,
    /// The local run has finished (the pool's completion ran).
    local_done: AtomicBool,
    /// The run's result across ranks, once every rank's status is in (or a peer died).
    global: Mutex<Option<Result<(), Error>>>,
    global_cv: Condvar,
    /// Per-hop timestamps of its sends and receives, if its graph stamps them.
    stamps: Option<RunStamps>,
    /// Its sends waiting in the comm thread's queue (that thread's count: its status waits
    /// for them).
    unposted: AtomicU32,
}

impl std::fmt::Debug for RunState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunState")
            .field("graph", &self.graph.name)
            .field("seq", &self.seq)
            .finish()
    }
}

impl Drop for RunState {
    /// The run is over and nothing reads its received values any more: their memory goes
    /// back to the graph, for the same receives of later runs to land in.
    fn drop(&mut self) {
        for (k, cell) in self.recvs.iter_mut().enumerate() {
            if let Some(v) = cell.take_value() {
                self.graph.reclaim(k, v);
            }
        }
    }
}

impl RunState {
    pub(crate) fn new(graph: Arc<CommGraph>, seq: u64) -> Self {
        let slot = (seq % u64::from(graph.runs_in_flight)) as u32;
        RunState {
            recvs: (0..graph.recvs.len()).map(|_| RecvCell::new()).collect(),
            sends: (0..graph.sends.len()).map(|_| SendCell::new()).collect(),
            stamps: graph
                .stamps
                .then(|| RunStamps::new(graph.sends.len(), graph.recvs.len())),
            unposted: AtomicU32::new(0),
            graph,
            seq,
            slot,
            root: Mutex::new(None),
            cancelled: AtomicBool::new(false),
            local_done: AtomicBool::new(false),
            global: Mutex::new(None),
            global_cv: Condvar::new(),
        }
    }

    /// Stamps hop `hop` of send `k` now, if the run stamps its edges.
    #[inline]
    pub(crate) fn stamp_send(&self, k: u32, hop: SendHop) {
        if let Some(s) = &self.stamps {
            s.send(k, hop, monotonic_ns());
        }
    }

    /// Stamps hop `hop` of receive `k` at `at` (ns of `monotonic_ns`; 0 leaves it unstamped),
    /// if the run stamps its edges.
    #[inline]
    pub(crate) fn stamp_recv(&self, k: u32, hop: RecvHop, at: u64) {
        if let (Some(s), true) = (&self.stamps, at != 0) {
            s.recv(k, hop, at);
        }
    }

    /// Its sends in the comm thread's queue, after adding `delta` (that thread's count).
    pub(crate) fn unposted(&self, delta: i32) -> u32 {
        let n = self
            .unposted
            .load(Ordering::Relaxed)
            .wrapping_add_signed(delta);
        self.unposted.store(n, Ordering::Relaxed);
        n
    }

    /// Whether the run stamps its edges.
    #[inline]
    pub(crate) fn stamps(&self) -> bool {
        self.stamps.is_some()
    }

    /// The run's stamps, if it stamps its edges.
    pub(crate) fn edge_stamps(&self) -> Option<EdgeStamps> {
        let g = &self.graph;
        self.stamps.as_ref().map(|s| {
            s.read(
                g.sends.iter().map(|x| (x.producer, x.to)),
                g.recvs.iter().map(|x| (x.producer, x.from)),
            )
        })
    }

    /// Records this rank's first node failure; `true` if it is the first.
    pub(crate) fn record_failure(&self, f: Failure) -> bool {
        let mut r = lock(&self.root);
        if r.is_none() {
            *r = Some(f);
            true
        } else {
            false
        }
    }

    /// Fails every receive still pending (another rank failed, a mismatch, a dead peer).
    pub(crate) fn cancel(&self, e: &Error) {
        self.cancelled.store(true, Ordering::Release);
        for c in self.recvs.iter() {
            c.fail(e.clone());
        }
    }

    /// How the run ended here.
    pub(crate) fn outcome(&self) -> Outcome {
        if let Some(f) = lock(&self.root).clone() {
            Outcome::Failed(f)
        } else if self.cancelled.load(Ordering::Acquire) {
            Outcome::Cancelled
        } else {
            Outcome::Done
        }
    }

    pub(crate) fn set_local_done(&self) {
        self.local_done.store(true, Ordering::Release);
    }

    pub(crate) fn is_local_done(&self) -> bool {
        self.local_done.load(Ordering::Acquire)
    }

    /// Sets the result across ranks (the first one set stays).
    pub(crate) fn resolve(&self, result: Result<(), Error>) {
        let mut g = lock(&self.global);
        if g.is_none() {
            *g = Some(result);
            self.global_cv.notify_all();
        }
    }

    /// The result across ranks if it is in and is an error that does not wait for the local
    /// run (a dead or departed peer, a failed transport: the local run may never end).
    pub(crate) fn fatal(&self) -> Option<Error> {
        match &*lock(&self.global) {
            Some(Err(e))
                if matches!(
                    e.kind(),
                    ErrorKind::PeerDied | ErrorKind::PeerLeft | ErrorKind::Transport
                ) =>
            {
                Some(e.clone())
            }
            _ => None,
        }
    }

    /// Waits for the result across ranks, at most until `deadline`.
    pub(crate) fn wait_global(&self, deadline: Option<Instant>) -> Option<Result<(), Error>> {
        let mut g = lock(&self.global);
        loop {
            if let Some(r) = &*g {
                return Some(r.clone());
            }
            match deadline {
                None => g = self.global_cv.wait(g).unwrap_or_else(|p| p.into_inner()),
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return None;
                    }
                    g = self
                        .global_cv
                        .wait_timeout(g, left.min(Duration::from_secs(1)))
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Digest;

    fn graph(recvs: usize, sends: usize) -> Arc<CommGraph> {
        let recv = RecvSpec {
            from: 1,
            index: 0,
            land: crate::value::land_fn(crate::value::plain_landing::<u64>),
            edge: "e".into(),
            producer: 0,
            producer_name: "p".into(),
            reclaim: Some(crate::value::plain_reclaim::<u64>),
        };
        Arc::new(CommGraph::new(
            "g".into(),
            0,
            Digest {
                graph: 0,
                nodes: vec![],
                relay: 0,
            },
            Arc::from(Vec::new()),
            2,
            1,
            vec![
                SendSpec {
                    to: 1,
                    index: 0,
                    producer: 0,
                    priority: 0,
                };
                sends
            ],
            vec![recv; recvs],
        ))
    }

    #[test]
    fn cells_fill_or_fail_once() {
        let run = RunState::new(graph(2, 1), 3);
        assert_eq!(run.slot, 1);
        assert!(run.recvs[0].poll().is_pending());
        run.recvs[0].fill(Box::new(5u64));
        run.recvs[0].fail(Error::new(ErrorKind::PeerDied, "late"));
        assert!(matches!(run.recvs[0].poll(), Poll::Ready(Ok(()))));
        assert_eq!(run.recvs[0].get().unwrap().downcast_ref::<u64>(), Some(&5));
        run.cancel(&Error::new(ErrorKind::NodeFailed, "remote"));
        assert!(matches!(run.recvs[1].poll(), Poll::Ready(Err(_))));
        assert_eq!(run.outcome(), Outcome::Cancelled);
        run.sends[0].done();
        assert!(matches!(run.sends[0].poll(), Poll::Ready(Ok(()))));
    }

    #[test]
    fn a_run_gives_its_received_vecs_back_when_dropped() {
        let mut recv = graph(1, 0).recvs[0].clone();
        recv.reclaim = Some(crate::value::plain_reclaim::<Vec<u8>>);
        let g = Arc::new(CommGraph::new(
            "g".into(),
            0,
            Digest {
                graph: 0,
                nodes: vec![],
                relay: 0,
            },
            Arc::from(Vec::new()),
            2,
            1,
            vec![],
            vec![recv],
        ));
        let mut addrs = Vec::new();
        for seq in 0..3 {
            let run = RunState::new(g.clone(), seq);
            let v = vec![seq as u8; 100];
            addrs.push(v.as_ptr() as usize);
            run.recvs[0].fill(Box::new(v));
            drop(run);
        }
        // At most `runs_in_flight` (2) kept, the newest on top.
        let top = g.take_spare(0).expect("kept");
        let top = top.downcast_ref::<Vec<u8>>().unwrap();
        assert_eq!((top.as_ptr() as usize, top.capacity()), (addrs[1], 100));
        assert!(g.take_spare(0).is_some());
        assert!(g.take_spare(0).is_none());
        // A type that does not give its memory back (`u64` in `graph`) keeps nothing.
        let plain = graph(1, 0);
        let run = RunState::new(plain.clone(), 0);
        run.recvs[0].fill(Box::new(5u64));
        drop(run);
        assert!(plain.take_spare(0).is_none());
    }

    #[test]
    fn the_first_result_across_ranks_stays() {
        let run = RunState::new(graph(0, 0), 0);
        assert!(run
            .wait_global(Some(Instant::now() + Duration::from_millis(5)))
            .is_none());
        run.resolve(Err(
            Error::new(ErrorKind::PeerDied, "rank 1 died").at_rank(1)
        ));
        run.resolve(Ok(()));
        assert_eq!(run.fatal().unwrap().rank(), Some(1));
        assert!(run.wait_global(None).unwrap().is_err());
    }

    #[test]
    fn slots_are_taken_one_run_at_a_time_in_order() {
        // Two slots: runs 1 and 3 share slot 1; run 3 waits for run 1 to take and free it.
        let g = graph(0, 0);
        let g2 = g.clone();
        let t = std::thread::spawn(move || {
            g2.take_slot(3);
            g2.free_slot(1);
        });
        std::thread::sleep(Duration::from_millis(20));
        assert!(!t.is_finished(), "run 3 started before run 1");
        g.take_slot(1);
        std::thread::sleep(Duration::from_millis(20));
        assert!(!t.is_finished(), "run 3 started while run 1 held the slot");
        g.free_slot(1);
        t.join().unwrap();
        g.take_slot(0);
    }
}
