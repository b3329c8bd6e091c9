//! A send node's side of a send: what it shares with the communication thread (the window of
//! sends in flight, the transport's direct handle) and how it decides, per value, to post it
//! itself, to hand it over, and whether its node waits for the transport.
//!
//! * **Owned bytes complete the node at once.** A serde value's encoding, or a small plain
//!   value's copy (at most [`SMALL_SEND`] bytes), is the engine's (or the transport's) to keep
//!   until the transport is done with it, so the send node need not wait: no `Completer`, no
//!   completion task for a worker per edge. Only once the graph's verdict is in (its tags are
//!   known), so that the send cannot be held behind the verdict while the run's status, which
//!   must follow its data, goes out.
//! * **Small values are posted by the worker**, where the transport allows it
//!   ([`Transport::direct`](crate::Transport::direct)) and the window has room with nothing
//!   queued: no hand-off to the communication thread on the edge's path. What the transport
//!   still holds after its call goes to the communication thread (`Command::Adopt`). Where
//!   the transport has a posted lane ([`Transport::lane`](crate::Transport::lane)), a value
//!   that fits goes there with a trailer (`wire::LaneTrailer`), by the worker or the thread.
//! * **Everything else** (a value past [`SMALL_SEND`] sent from the producer's memory, a
//!   staged device value, any send before the verdict) goes to the communication thread, and
//!   its node completes when the transport is done with it.
//!
//! The window ([`SendWindow`]) is counted in sends (values), shared: the communication thread
//! posts a send while fewer than its limit are in flight and none waits, and queues it
//! otherwise, posting the queue's most urgent first as sends finish; a worker posts only while
//! the window has room and nothing is queued. The counts are hints between threads (a worker
//! and the thread may both take the last place): they bound the sends in flight and order the
//! queue, they never lose or duplicate a send.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use crate::comm::run::RunState;
use crate::comm::stamps::SendHop;
use crate::comm::wire::{LaneTrailer, LANE_TRAILER};
use crate::comm::{CommHandle, Command, Payload};
use crate::transport::DirectSend;

/// Values of at most this many bytes are copied by their send node (they cross without
/// waiting for the transport) and may be posted by the worker. Open MPI's shared-memory
/// transport sends this much eagerly: such a send is done within its call.
pub(crate) const SMALL_SEND: usize = 4096;

/// The sends in flight and waiting, against the limit (`RanksBuilder::send_window`).
#[derive(Debug)]
pub(crate) struct SendWindow {
    limit: usize,
    in_flight: AtomicUsize,
    queued: AtomicUsize,
}

impl SendWindow {
    pub(crate) fn new(limit: usize) -> Self {
        SendWindow {
            limit: limit.max(1),
            in_flight: AtomicUsize::new(0),
            queued: AtomicUsize::new(0),
        }
    }

    /// A worker takes a place for a send of its own: only with room and nothing queued.
    fn enter_direct(&self) -> bool {
        if self.queued.load(Ordering::Relaxed) != 0 {
            return false;
        }
        if self.in_flight.fetch_add(1, Ordering::Relaxed) < self.limit {
            return true;
        }
        self.leave();
        false
    }

    /// Whether the communication thread may post another send now.
    pub(crate) fn has_room(&self) -> bool {
        self.in_flight.load(Ordering::Relaxed) < self.limit
    }

    /// A send was posted (by the communication thread).
    pub(crate) fn enter(&self) {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
    }

    /// A send in flight finished.
    pub(crate) fn leave(&self) {
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
    }

    /// The communication thread's queue now holds `n` sends.
    pub(crate) fn set_queued(&self, n: usize) {
        self.queued.store(n, Ordering::Relaxed);
    }

    /// The sends waiting for room (as the communication thread last set it).
    pub(crate) fn queued(&self) -> usize {
        self.queued.load(Ordering::Relaxed)
    }
}

/// What send nodes share with the communication thread.
pub(crate) struct Sending {
    pub(crate) window: SendWindow,
    /// Values of this many bytes or more go as a header and chunks (the engine's), so never
    /// from a worker.
    max_message: usize,
    /// The transport's handle for workers' sends, set once the transport is made (if it has
    /// one and the runtime lets workers send).
    pub(crate) direct: OnceLock<Arc<dyn DirectSend>>,
    /// Cleared for good once a peer is gone or the transport failed: every send then goes
    /// through the communication thread, which knows what to drop.
    pub(crate) direct_ok: AtomicBool,
    /// The posted lane's largest message (0: none), set once the transport is made.
    lane: AtomicUsize,
}

impl Sending {
    pub(crate) fn new(window: usize, max_message: usize) -> Self {
        Sending {
            window: SendWindow::new(window),
            max_message,
            direct: OnceLock::new(),
            direct_ok: AtomicBool::new(true),
            lane: AtomicUsize::new(0),
        }
    }

    /// The posted lane's size (`Transport::lane`, 0 where it is not used).
    pub(crate) fn set_lane(&self, bytes: usize) {
        self.lane.store(bytes, Ordering::Relaxed);
    }

    /// Whether a value of `len` bytes goes on the posted lane.
    fn on_lane(&self, len: usize) -> bool {
        len + LANE_TRAILER <= self.lane.load(Ordering::Relaxed)
    }

    /// Workers post no more sends themselves.
    pub(crate) fn stop_direct(&self) {
        self.direct_ok.store(false, Ordering::Relaxed);
    }

    fn direct_for(&self, len: usize) -> Option<&Arc<dyn DirectSend>> {
        if len > SMALL_SEND || len >= self.max_message || !self.direct_ok.load(Ordering::Relaxed) {
            return None;
        }
        self.direct.get()
    }
}

/// What a send node does after handing its value on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Sent {
    /// Nothing: the value's bytes are owned by whoever sends them; the node completes now.
    Done,
    /// Waits on its send cell (`SendCell::complete_on`): the transport reads the run's memory.
    Pending,
}

impl CommHandle {
    /// Sends value `k` of `run` (from its send node's body): posts it on this thread where it
    /// may, else hands it to the communication thread. The caller attaches its node's
    /// completer to the send cell if this says `Pending`.
    pub(crate) fn send_value(&self, run: Arc<RunState>, k: u32, payload: Payload) -> Sent {
        let layout = run.graph.layout();
        let (layout, bytes) = match (layout, payload) {
            (Some(layout), Payload::Owned(bytes)) => (layout, bytes),
            (_, payload) => {
                run.stamp_send(k, SendHop::Queued);
                self.send(Command::Send { run, k, payload });
                return Sent::Pending;
            }
        };
        let s = &self.sending;
        let direct = s.direct_for(bytes.len());
        match direct {
            Some(d) if s.window.enter_direct() => {
                let spec = &run.graph.sends[k as usize];
                let posted = if s.on_lane(bytes.len()) {
                    let mut message = bytes;
                    let trailer = LaneTrailer {
                        gid: *run.graph.gid.get().expect("registered"),
                        index: spec.index,
                        seq: run.seq,
                    };
                    trailer.append_to(&mut message);
                    d.send_lane(spec.to, message.into_boxed_slice())
                } else {
                    let tag = layout.tag(run.slot, spec.index, false);
                    d.send(spec.to, tag, bytes.into_boxed_slice())
                };
                match posted {
                    Ok(None) => {
                        s.window.leave();
                        run.stamp_send(k, SendHop::Posted);
                        run.stamp_send(k, SendHop::Done);
                    }
                    Ok(Some(sent)) => {
                        run.stamp_send(k, SendHop::Posted);
                        self.send(Command::Adopt { sent, run, k });
                    }
                    Err(e) => {
                        s.window.leave();
                        self.send(Command::DirectFailed(e));
                    }
                }
            }
            _ => {
                run.stamp_send(k, SendHop::Queued);
                self.send(Command::Send {
                    run,
                    k,
                    payload: Payload::Owned(bytes),
                });
            }
        }
        Sent::Done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_posts_only_with_room_and_nothing_queued() {
        let w = SendWindow::new(2);
        assert!(w.enter_direct() && w.enter_direct());
        assert!(!w.enter_direct(), "full");
        assert!(!w.has_room());
        w.leave();
        assert!(w.has_room());
        w.set_queued(1);
        assert!(!w.enter_direct(), "a queued send goes first");
        w.set_queued(0);
        assert!(w.enter_direct());
        assert_eq!(w.in_flight.load(Ordering::Relaxed), 2);
    }
}
