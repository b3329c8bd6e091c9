//! Layer (c): moving bytes between ranks. The [`Transport`] trait is what the communication
//! thread calls, and only that thread: start a send from memory, take the next arrived message
//! (a matched probe: any sender, any tag), receive it into memory, and learn which operations
//! finished. Nothing here blocks. Two implementations: [`LocalNetwork`]'s endpoints (ranks as
//! threads of one process, for tests and the simulator) and, with the `mpi` feature,
//! `MpiTransport` (rsmpi).
//!
//! The communication protocol above this layer relies on one ordering guarantee, MPI's
//! non-overtaking rule seen through a wildcard probe: the messages one rank sends to another
//! arrive (are probed) in the order they were sent, whatever their tags.

mod local;
#[cfg(feature = "mpi")]
mod mpi;

#[cfg(feature = "mpi")]
pub use self::mpi::MpiTransport;
pub use local::{LocalNetwork, LocalTransport};

use crate::error::Error;

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

    /// Appends the operations that finished since the last call.
    fn poll(&mut self, done: &mut Vec<OpId>) -> Result<(), Error>;

    /// Ends the transport. `clean`: every operation has finished and the other ranks are
    /// alive, so MPI may be finalized; otherwise it is left as it is (finalizing with a dead
    /// peer can hang), and the process should exit soon.
    fn close(self, clean: bool);
}
