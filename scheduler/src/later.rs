//! A node's completion handed to a [`Completer`] (a leaf: it knows no run and no pool): the
//! public handle, the two sides of it that the run side implements ([`Call`] for the
//! completer, [`Handoff`] for the worker), and the rendezvous of the two ([`Rendezvous`]).
//!
//! A body that calls `backend::NodeCtxExt::complete_later` gets a `Completer`; its node is
//! complete once **both** its body returned and the completer was called, whichever comes
//! second: a worker that sees the call already made when the body returns completes the node
//! itself; otherwise the call queues the node's completion (a completion task on the
//! injector of the node's placement) for whichever worker takes it. So successors are always
//! released by a worker, after the body's output was stored, and never by the completing
//! thread. A body that fails or panics completes its node as failed at once, and the call
//! then does nothing. See `run/later.rs` for the run side and the scheduler's README
//! ("Completers") for the protocol.

use std::fmt;
use std::sync::Arc;

use crate::error::BoxError;
use crate::sync::{self, AtomicU8, Mutex, Ordering};

/// Completes a node that deferred its completion with
/// [`NodeCtxExt::complete_later`](crate::backend::NodeCtxExt::complete_later), from any thread:
/// the node's successors are released (by a worker of the node's placement, woken for it) once
/// both its body returned and [`complete`](Self::complete) was called, in either order.
///
/// Exactly once: `complete` takes it by value, and dropping it without completing fails the
/// node with an error naming it ("… failed: its Completer was dropped without completing"),
/// so a lost completer never hangs its graph. Until it is called the node counts as running:
/// its graph does not finish, and a pool's shutdown (or drop) waits for it, as for a running
/// body; a cancelled graph (another node failed, a shutdown with `Cancel`) still waits for it,
/// and then cancels the successors.
///
/// Send it to the thread that learns of the completion (a network thread, a device callback);
/// the call costs a queue push and a wake-up of an idle worker, and does nothing else on that
/// thread.
pub struct Completer {
    call: Option<Arc<dyn Call>>,
}

impl Completer {
    pub(crate) fn new(call: Arc<dyn Call>) -> Self {
        Completer { call: Some(call) }
    }

    /// Completes the node: `Ok(())` releases its successors (once its body returned),
    /// `Err(e)` fails its graph naming the node, with `e` as the error's source.
    pub fn complete(mut self, result: Result<(), BoxError>) {
        if let Some(c) = self.call.take() {
            c.call(result);
        }
    }
}

impl Drop for Completer {
    fn drop(&mut self) {
        if let Some(c) = self.call.take() {
            c.call(Err(Box::new(CompleterDropped)));
        }
    }
}

impl fmt::Debug for Completer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.call {
            Some(c) => write!(f, "Completer(node #{})", c.node()),
            None => f.write_str("Completer(called)"),
        }
    }
}

/// The source of the error a node fails with when its [`Completer`] was dropped uncalled.
#[derive(Debug)]
pub(crate) struct CompleterDropped;

impl fmt::Display for CompleterDropped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("its Completer was dropped without completing")
    }
}

impl std::error::Error for CompleterDropped {}

/// The completer's side, implemented by the run side (`run/later.rs`).
pub(crate) trait Call: Send + Sync {
    /// The completer's one call (see [`Rendezvous::call`]).
    fn call(&self, result: Result<(), BoxError>);
    /// The node's index in its run's graph (for `Debug`; its name is in the run, which the
    /// handle may outlive).
    fn node(&self) -> u32;
}

/// The worker's side, implemented by the run side (`run/later.rs`): what the worker tells the
/// completer when the body ended.
pub(crate) trait Handoff: Send + Sync {
    /// See [`Rendezvous::returned`].
    fn body_returned(&self) -> Option<Result<(), BoxError>>;
    /// See [`Rendezvous::body_failed`].
    fn body_failed(&self);
}

/// The worker's handle on a [`Handoff`]: dropped without [`body_returned`](Self::body_returned)
/// (a failed or panicking body, whatever path drops it), it tells the completer
/// [`body_failed`](Handoff::body_failed), so that the node is never completed twice.
pub(crate) struct HandedOff(Option<Arc<dyn Handoff>>);

impl HandedOff {
    pub(crate) fn new(h: Arc<dyn Handoff>) -> Self {
        HandedOff(Some(h))
    }

    /// See [`Rendezvous::returned`].
    pub(crate) fn body_returned(mut self) -> Option<Result<(), BoxError>> {
        self.0.take().and_then(|h| h.body_returned())
    }
}

impl Drop for HandedOff {
    fn drop(&mut self) {
        if let Some(h) = self.0.take() {
            h.body_failed();
        }
    }
}

/// The body returned `Ok` (set by its worker).
const RETURNED: u8 = 1;
/// The body failed or panicked; its worker completed the node (set by its worker).
const BODY_FAILED: u8 = 2;
/// The completer was called (set by the completer's thread).
const CALLED: u8 = 4;
/// ... with an error, left in `Rendezvous::error`.
const CALLED_ERR: u8 = 8;

/// Who completes a node whose body handed its completion to a [`Completer`]: the worker, when
/// the body returns after the call, or the caller, when the call comes after the body
/// returned. One `fetch_or` on each side decides it: each side sets its bit and reads the
/// other's, so exactly one of them sees both (loom model `completer_rendezvous`).
///
/// Orderings: both read-modify-writes are AcqRel. The worker's Release publishes the body's
/// output (and everything before the body's return) to a caller that sees `RETURNED`, which
/// then queues the completion (the queue's push and pop carry it to the worker that takes
/// it); the caller's Release publishes what it did before the call (the arrived value a node
/// reads) and the error it left to a worker that sees `CALLED`.
pub(crate) struct Rendezvous {
    state: AtomicU8,
    error: Mutex<Option<BoxError>>,
}

impl Rendezvous {
    pub(crate) fn new() -> Self {
        Rendezvous {
            state: AtomicU8::new(0),
            error: Mutex::new(None),
        }
    }

    /// The completer's call. `Some(result)`: the body returned before, so the caller completes
    /// the node (queues its completion) with `result`; the node's in-flight unit is the
    /// caller's to pass on. `None`: nothing more to do here (the worker completes it when the
    /// body returns, or did so already because the body failed).
    pub(crate) fn call(&self, result: Result<(), BoxError>) -> Option<Result<(), BoxError>> {
        let bits = match result {
            Ok(()) => CALLED,
            Err(e) => {
                *sync::lock(&self.error) = Some(e);
                CALLED | CALLED_ERR
            }
        };
        let prev = self.state.fetch_or(bits, Ordering::AcqRel);
        if prev & RETURNED == 0 {
            return None;
        }
        Some(self.result(bits))
    }

    /// The body returned `Ok`. `Some(result)`: the completer was called before, so the worker
    /// completes the node now with `result`. `None`: the call will come (and complete it).
    pub(crate) fn returned(&self) -> Option<Result<(), BoxError>> {
        let prev = self.state.fetch_or(RETURNED, Ordering::AcqRel);
        (prev & CALLED != 0).then(|| self.result(prev))
    }

    /// The body failed or panicked: its worker completes the node as failed; a call, before or
    /// after, does nothing.
    pub(crate) fn body_failed(&self) {
        self.state.fetch_or(BODY_FAILED, Ordering::AcqRel);
    }

    /// The call's result, from its bits (`state` as the completing side saw or set it).
    fn result(&self, bits: u8) -> Result<(), BoxError> {
        if bits & CALLED_ERR == 0 {
            return Ok(());
        }
        Err(sync::lock(&self.error)
            .take()
            .expect("a call with an error left it before setting its bit"))
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn the_second_side_completes() {
        let r = Rendezvous::new();
        assert!(
            r.call(Ok(())).is_none(),
            "called first: the worker completes"
        );
        assert!(matches!(r.returned(), Some(Ok(()))));

        let r = Rendezvous::new();
        assert!(r.returned().is_none(), "returned first: the call completes");
        assert!(matches!(r.call(Ok(())), Some(Ok(()))));

        let r = Rendezvous::new();
        assert!(r.call(Err("lost".into())).is_none());
        let e = r.returned().unwrap().unwrap_err();
        assert_eq!(e.to_string(), "lost");

        let r = Rendezvous::new();
        assert!(r.returned().is_none());
        let e = r.call(Err("late".into())).unwrap().unwrap_err();
        assert_eq!(e.to_string(), "late");
    }

    #[test]
    fn a_failed_body_leaves_the_call_nothing_to_do() {
        for call_first in [true, false] {
            let r = Rendezvous::new();
            if call_first {
                assert!(r.call(Ok(())).is_none());
                r.body_failed();
            } else {
                r.body_failed();
                assert!(r.call(Err("after".into())).is_none());
            }
        }
    }
}
