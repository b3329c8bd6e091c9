//! Per-hop timestamps of a run's sends and receives (`RanksBuilder::stamp_edges`), to find
//! where an edge's time goes: the workers and the communication thread each stamp the hops
//! they see in the run's cells, on `CLOCK_MONOTONIC`, which every process of a host shares,
//! so stamps of two ranks on one host subtract. Off by default: a run then has no stamp cells
//! and each hop costs one branch.

use std::sync::atomic::{AtomicU64, Ordering};

/// Nanoseconds on `CLOCK_MONOTONIC` (shared by every process of a host), the clock of
/// [`EdgeStamps`]: a node body that stamps its own start or end with it can be set beside the
/// runtime's hops.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer; CLOCK_MONOTONIC exists on every Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The hops of a send, in path order.
#[derive(Clone, Copy, Debug)]
pub(crate) enum SendHop {
    /// The send node's body started (a worker).
    Body = 0,
    /// The worker is handing the payload to the communication thread.
    Queued = 1,
    /// The communication thread took it.
    Taken = 2,
    /// The transport's send call returned (whichever thread made it).
    Posted = 3,
    /// The transport's completion of the send's last message was seen.
    Done = 4,
}

/// The hops of a receive, in path order (all on the thread that holds the engine: the
/// communication thread, or a worker looking at the network).
#[derive(Clone, Copy, Debug)]
pub(crate) enum RecvHop {
    /// The transport's probe returned the message (its first, for a long value).
    Arrived = 0,
    /// All its bytes were in (the receive's completion seen).
    Received = 1,
    /// The cell is about to be filled, which calls the receive node's `Completer`.
    Completing = 2,
    /// The fill (and so the `Completer`'s call) returned.
    Completed = 3,
    /// Not a time: 1 where a worker looking at the network took the value.
    ByWorker = 4,
}

const SEND_HOPS: usize = 5;
const RECV_HOPS: usize = 5;

/// One run's stamp cells: `SEND_HOPS` per send, then `RECV_HOPS` per receive; 0 = not
/// stamped.
pub(crate) struct RunStamps {
    sends: usize,
    cells: Box<[AtomicU64]>,
}

impl RunStamps {
    pub(crate) fn new(sends: usize, recvs: usize) -> Self {
        RunStamps {
            sends,
            cells: (0..sends * SEND_HOPS + recvs * RECV_HOPS)
                .map(|_| AtomicU64::new(0))
                .collect(),
        }
    }

    pub(crate) fn send(&self, k: u32, hop: SendHop, at: u64) {
        // Relaxed: read only once the run is over (after its completion's synchronisation).
        self.cells[k as usize * SEND_HOPS + hop as usize].store(at, Ordering::Relaxed);
    }

    pub(crate) fn recv(&self, k: u32, hop: RecvHop, at: u64) {
        let i = self.sends * SEND_HOPS + k as usize * RECV_HOPS + hop as usize;
        self.cells[i].store(at, Ordering::Relaxed);
    }

    fn get(&self, i: usize) -> u64 {
        self.cells[i].load(Ordering::Relaxed)
    }

    /// The stamps as the public record, with each cell's transfer.
    pub(crate) fn read(
        &self,
        sends: impl Iterator<Item = (u32, usize)>,
        recvs: impl Iterator<Item = (u32, usize)>,
    ) -> EdgeStamps {
        let sends = sends
            .enumerate()
            .map(|(k, (producer, to))| {
                let c = |h: SendHop| self.get(k * SEND_HOPS + h as usize);
                SendStamps {
                    producer,
                    to,
                    body: c(SendHop::Body),
                    queued: c(SendHop::Queued),
                    taken: c(SendHop::Taken),
                    posted: c(SendHop::Posted),
                    done: c(SendHop::Done),
                }
            })
            .collect();
        let base = self.sends * SEND_HOPS;
        let recvs = recvs
            .enumerate()
            .map(|(k, (producer, from))| {
                let c = |h: RecvHop| self.get(base + k * RECV_HOPS + h as usize);
                RecvStamps {
                    producer,
                    from,
                    arrived: c(RecvHop::Arrived),
                    received: c(RecvHop::Received),
                    completing: c(RecvHop::Completing),
                    completed: c(RecvHop::Completed),
                    by_worker: c(RecvHop::ByWorker) != 0,
                }
            })
            .collect();
        EdgeStamps { sends, recvs }
    }
}

/// Where one run's cross-rank edges spent their time on this rank
/// ([`RankOutput::edge_stamps`](crate::RankOutput::edge_stamps), with
/// [`RanksBuilder::stamp_edges`](crate::RanksBuilder::stamp_edges) on): a row per send and
/// per receive of the run, each hop in nanoseconds of [`monotonic_ns`]; 0 where a hop was not
/// passed (a send the worker posted itself is never queued; a completion not yet seen).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct EdgeStamps {
    /// This rank's sends, in its plan's order.
    pub sends: Vec<SendStamps>,
    /// This rank's receives, in its plan's order.
    pub recvs: Vec<RecvStamps>,
}

/// The hops of one send ([`EdgeStamps`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SendStamps {
    /// The producing node (its index in the graph).
    pub producer: u32,
    /// The receiving rank.
    pub to: usize,
    /// The send node's body started, on a worker (its producer's end is just before).
    pub body: u64,
    /// The worker was handing the payload to the communication thread (0: it posted it
    /// itself).
    pub queued: u64,
    /// The communication thread took it (0: the worker posted it).
    pub taken: u64,
    /// The transport's send call returned.
    pub posted: u64,
    /// The transport's completion of the send (its last message) was seen.
    pub done: u64,
}

/// The hops of one receive ([`EdgeStamps`]), all on the thread that held the engine: the
/// communication thread, or a worker that looked at the network while it spun
/// ([`RanksBuilder::worker_polls`](crate::RanksBuilder::worker_polls)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RecvStamps {
    /// The producing node (its index in the graph).
    pub producer: u32,
    /// The sending rank.
    pub from: usize,
    /// The transport's probe returned the value's (first) message.
    pub arrived: u64,
    /// All its bytes were in.
    pub received: u64,
    /// The receive's cell was about to be filled, which calls its node's `Completer`.
    pub completing: u64,
    /// That call returned (a worker takes the completion from the pool's queue from then on).
    pub completed: u64,
    /// A worker looking at the network took the value (it runs the consumer next), not the
    /// communication thread.
    pub by_worker: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_hop_lands_in_its_own_cell() {
        let s = RunStamps::new(2, 1);
        s.send(1, SendHop::Posted, 7);
        s.send(0, SendHop::Body, 3);
        s.recv(0, RecvHop::Completed, 9);
        let e = s.read([(4, 1), (5, 1)].into_iter(), [(6, 1)].into_iter());
        assert_eq!((e.sends[0].body, e.sends[0].posted), (3, 0));
        assert_eq!((e.sends[1].producer, e.sends[1].posted), (5, 7));
        assert_eq!((e.recvs[0].producer, e.recvs[0].completed), (6, 9));
        assert_eq!(e.recvs[0].arrived, 0);
        let (a, b) = (monotonic_ns(), monotonic_ns());
        assert!(a > 0 && b >= a);
    }
}
