//! Layer (c): moving bytes between ranks. The [`Transport`] trait is what the communication
//! thread calls, and only that thread: start a send from memory, take the next arrived message
//! (a matched probe: any sender, any tag), receive it into memory, and learn which operations
//! finished. Nothing here blocks. Two implementations: [`LocalNetwork`]'s endpoints (ranks as
//! threads of one process, for tests and the simulator) and, with the `mpi` feature,
//! `MpiTransport` (rsmpi).
//!
//! The communication protocol above this layer relies on one ordering guarantee, MPI's
//! non-overtaking rule seen through a wildcard probe: the messages one rank sends to another
//! arrive (are probed) in the order they were sent, whatever their tags. Messages that other
//! threads post through a [`DirectSend`] keep it where their posts are ordered (one happened
//! before the other, as a run's data before its status: the protocol sees to that).
//!
//! A transport whose library may be called from several threads at once (MPI at
//! `MPI_THREAD_MULTIPLE`, the in-process network) also gives a [`DirectSend`]: a worker posts
//! a small send itself, without a hand-off to the communication thread, which adopts what is
//! still in flight and learns its completion in `poll`.
//!
//! A transport may also have a **posted lane** ([`Transport::lane`]): small messages, at most
//! the lane's size, each of which finds a receive posted ahead for it (as a blocking
//! `MPI_Recv`'s message does), so it is taken in one test of that receive, without a probe
//! and a matched receive of its own. The lane's messages carry no tag and are not ordered
//! with the others (the protocol puts what it needs in a header: `comm/wire.rs`).

mod local;
#[cfg(feature = "mpi")]
mod mpi;

#[cfg(feature = "mpi")]
pub use self::mpi::MpiTransport;
pub use local::{LocalNetwork, LocalTransport};

use std::any::Any;
use std::sync::Arc;

use crate::error::{Error, ErrorKind};

/// Names a send or receive the transport started, until [`Transport::poll`] reports it done.
pub type OpId = u64;

/// A message that arrived and was taken off the matching queue by [`Transport::probe`]: it is
/// received (into memory of `len` bytes) only by [`Transport::receive`].
#[derive(Debug)]
pub struct Probed<M> {
    /// The sending rank.
    pub from: usize,
    /// Its tag.
    pub tag: u32,
    /// Its length in bytes.
    pub len: usize,
    /// The transport's handle of the matched message.
    pub message: M,
}

/// Moves bytes between ranks, for the communication thread. Owned by that thread (MPI's handles
/// may not leave it), so it need not be `Send`; a `Send` closure makes it there.
pub trait Transport {
    /// The transport's handle of a probed message.
    type Message;

    /// This process's rank.
    fn rank(&self) -> usize;

    /// The number of ranks.
    fn size(&self) -> usize;

    /// The largest tag a message may carry (MPI's `MPI_TAG_UB`, at least 32767).
    fn max_tag(&self) -> u32;

    /// Each rank's host (numbered in order of first appearance: rank 0's host is 0), for the
    /// runtime's relays (one copy of a value a host). Called once, on the communication
    /// thread, right after the transport is made and before anything is sent: a transport
    /// may exchange what it needs with a blocking collective there. The default: every rank
    /// on one host (the in-process network).
    fn hosts(&mut self) -> Result<Vec<usize>, Error> {
        Ok(vec![0; self.size()])
    }

    /// Starts sending `len` bytes at `data` to rank `to` with `tag`; `poll` reports `op` once
    /// the memory may be reused.
    ///
    /// # Safety
    /// The `len` bytes at `data` stay valid and unchanged until `poll` reports `op` done (or
    /// for ever, if it never does).
    unsafe fn send(
        &mut self,
        to: usize,
        tag: u32,
        data: *const u8,
        len: usize,
        op: OpId,
    ) -> Result<(), Error>;

    /// The next message that arrived for this rank, from any rank with any tag, if there is one.
    /// Messages from one sender come in the order it sent them.
    fn probe(&mut self) -> Result<Option<Probed<Self::Message>>, Error>;

    /// Starts receiving a probed message into `into`; `poll` reports `op` once all its bytes
    /// are there.
    ///
    /// # Safety
    /// `into` is valid for writes of `message.len` bytes until `poll` reports `op` done (or for
    /// ever, if it never does).
    unsafe fn receive(
        &mut self,
        message: Probed<Self::Message>,
        into: *mut u8,
        op: OpId,
    ) -> Result<(), Error>;

    /// The largest message (in bytes) the posted lane carries; 0 (the default): no lane.
    fn lane(&self) -> usize {
        0
    }

    /// Starts sending `len` bytes at `data` (at most [`lane`](Self::lane)) to rank `to` on the
    /// posted lane; `poll` reports `op` once the memory may be reused.
    ///
    /// # Safety
    /// As [`send`](Self::send)'s.
    unsafe fn lane_send(
        &mut self,
        to: usize,
        data: *const u8,
        len: usize,
        op: OpId,
    ) -> Result<(), Error> {
        let _ = (data, len, op);
        Err(no_lane(self.rank(), to))
    }

    /// Takes the next message that arrived on the posted lane, if one did: calls `take` with
    /// its sender and bytes (valid for the call only) and posts a receive in its place.
    /// Returns whether it took one.
    fn lane_take(&mut self, take: &mut dyn FnMut(usize, &[u8])) -> Result<bool, Error> {
        let _ = take;
        Ok(false)
    }

    /// Appends the operations that finished since the last call.
    fn poll(&mut self, done: &mut Vec<OpId>) -> Result<(), Error>;

    /// Appends operations the transport already knows finished without looking at the
    /// network (a receive whose bytes were all there when it started); `poll` reports those
    /// not taken here. Cheap enough to call after every receive.
    fn finished(&mut self, done: &mut Vec<OpId>) {
        let _ = done;
    }

    /// Whether any thread may call this transport's methods, one call at a time (the
    /// communication thread hands its engine to a spinning worker under a lock: MPI at
    /// `MPI_THREAD_SERIALIZED` or more, the in-process network). The default: only the thread
    /// that made it.
    fn any_thread(&self) -> bool {
        false
    }

    /// A handle through which other threads post small sends themselves, if the transport
    /// allows calls from several threads; `None` (the default): only this thread sends.
    fn direct(&mut self) -> Option<Arc<dyn DirectSend>> {
        None
    }

    /// Takes over a send a [`DirectSend`] of this transport left in flight: `poll` reports
    /// `op` once the transport is done with it (and drops its bytes then). Only called with
    /// what this transport's own [`direct`](Self::direct) handle returned.
    fn adopt(&mut self, sent: InFlight, op: OpId) {
        // A transport without a direct handle is never given one; dropping it leaks its bytes.
        let _ = (sent, op);
    }

    /// Ends the transport. `clean`: every operation has finished and the other ranks are
    /// alive, so MPI may be finalized; otherwise it is left as it is (finalizing with a dead
    /// peer can hang), and the process should exit soon.
    fn close(self, clean: bool);
}

/// The error of a lane send on a transport without a lane.
fn no_lane(rank: usize, to: usize) -> Error {
    Error::new(
        ErrorKind::Transport,
        format!("rank {rank}: a send to rank {to} on a posted lane this transport does not have"),
    )
}

/// Host numbers from one key per rank (a hash of its host's name): ranks with equal keys share
/// a host; hosts are numbered in order of first appearance.
#[cfg(any(feature = "mpi", test))]
pub(crate) fn hosts_from_keys(keys: &[u64]) -> Vec<usize> {
    let mut seen: Vec<u64> = Vec::new();
    keys.iter()
        .map(|k| match seen.iter().position(|s| s == k) {
            Some(h) => h,
            None => {
                seen.push(*k);
                seen.len() - 1
            }
        })
        .collect()
}

/// Posts small sends from any thread, for a transport whose library allows it
/// ([`Transport::direct`]). It never blocks; after the transport closed it refuses.
pub trait DirectSend: Send + Sync {
    /// Sends `bytes` to rank `to` with `tag`. `Ok(None)`: the transport is done with them
    /// already; `Ok(Some(sent))`: still in flight, to be handed to the communication thread
    /// ([`Transport::adopt`]), which learns when it finished.
    fn send(&self, to: usize, tag: u32, bytes: Box<[u8]>) -> Result<Option<InFlight>, Error>;

    /// As [`send`](Self::send), on the transport's posted lane ([`Transport::lane`]; `bytes`
    /// no longer than it).
    fn send_lane(&self, to: usize, bytes: Box<[u8]>) -> Result<Option<InFlight>, Error>;
}

/// A send a [`DirectSend`] left in flight: the transport's handle of it and the bytes it
/// reads, for [`Transport::adopt`]. Dropped without that (its thread gone), it leaks the
/// bytes rather than free them under the transport.
pub struct InFlight(Option<Box<dyn Any + Send>>);

impl InFlight {
    /// Wraps a transport's record of a send in flight.
    pub fn new(record: Box<dyn Any + Send>) -> Self {
        InFlight(Some(record))
    }

    /// The transport's record, to downcast to its own type.
    pub fn into_record(mut self) -> Box<dyn Any + Send> {
        self.0.take().expect("a record until taken")
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        // The transport may still read the bytes: never free them here.
        if let Some(record) = self.0.take() {
            std::mem::forget(record);
        }
    }
}

impl std::fmt::Debug for InFlight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("InFlight")
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn hosts_are_numbered_in_order_of_first_appearance() {
        assert_eq!(
            super::hosts_from_keys(&[9, 9, 4, 7, 4]),
            vec![0, 0, 1, 2, 1]
        );
        assert_eq!(super::hosts_from_keys(&[]), Vec::<usize>::new());
    }
}
