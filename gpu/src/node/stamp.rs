//! A diagnostic watch on one GPU node's deferred completion: when its worker polled it, and
//! when a poll found the device's work done. Set on the node's [`GpuCtx`](super::GpuCtx) by a
//! probe (a replay's launch probe, `replay/probe.rs`); nodes without one pay a `Cell::take`.

use std::sync::Mutex;
use std::task::Poll;
use std::time::{Duration, Instant};

/// What the polls of one node's completion saw.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct PollTimes {
    /// The first poll's start (its worker enqueues the completion word's write there).
    pub(crate) first: Option<Instant>,
    /// The start of the poll that found the work done.
    pub(crate) seen: Option<Instant>,
    /// Polls made, the last included.
    pub(crate) polls: u32,
    /// Host time inside the polls (the word's write and the stream's queries are driver calls
    /// made there).
    pub(crate) inside: Duration,
    /// From the end of the poll before the one that found the work done to that one's start:
    /// long when the worker was not polling (busy elsewhere, parked, preempted).
    pub(crate) gap_before_seen: Duration,
    /// The end of the last poll so far.
    last_end: Option<Instant>,
}

/// Shared between the probe that made it and the node's completion poll.
#[derive(Debug, Default)]
pub(crate) struct CompletionStamp {
    times: Mutex<PollTimes>,
}

impl CompletionStamp {
    /// Runs one poll of the node's completion, timing it.
    pub(crate) fn poll<R>(&self, poll: impl FnOnce() -> Poll<R>) -> Poll<R> {
        let began = Instant::now();
        let r = poll();
        let ended = Instant::now();
        let mut t = self.times.lock().unwrap_or_else(|e| e.into_inner());
        t.first.get_or_insert(began);
        t.polls += 1;
        t.inside += ended - began;
        if r.is_ready() && t.seen.is_none() {
            t.seen = Some(began);
            t.gap_before_seen = t.last_end.map_or(Duration::ZERO, |e| began - e);
        }
        t.last_end = Some(ended);
        r
    }

    /// The polls so far.
    pub(crate) fn times(&self) -> PollTimes {
        *self.times.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stamp_counts_polls_and_keeps_the_first_that_found_the_work_done() {
        let s = CompletionStamp::default();
        assert!(s.poll(|| Poll::<()>::Pending).is_pending());
        let t = s.times();
        assert_eq!((t.polls, t.seen.is_none()), (1, true));
        let first = t.first.expect("the first poll is stamped");
        std::thread::sleep(Duration::from_millis(2));
        assert!(s.poll(|| Poll::Ready(())).is_ready());
        let t = s.times();
        assert_eq!(t.polls, 2);
        assert_eq!(t.first, Some(first), "the first poll stays the first");
        let seen = t.seen.expect("the ready poll is stamped");
        assert!(seen > first);
        assert!(
            t.gap_before_seen >= Duration::from_millis(2),
            "the sleep between the polls is the gap before the one that saw it done: {:?}",
            t.gap_before_seen
        );
        assert!(
            t.inside < seen - first,
            "time inside polls excludes the gap"
        );
        // A later poll (none is made by the scheduler, but a stamp must not move) keeps it.
        let _ = s.poll(|| Poll::Ready(()));
        assert_eq!(s.times().seen, Some(seen));
    }
}
