//! GPU stream tracks of the pool's trace: each GPU node's device time, measured with timing
//! events, on one extra track per stream.
//!
//! Only exists when the pool records a trace ([`GpuPoolBuilder::trace`](crate::GpuPoolBuilder::trace));
//! otherwise a GPU node pays one branch and no timing event is ever created.
//!
//! * **Reference.** The first worker of a device records a timing event on its idle stream and
//!   synchronises it, a few times, keeping the try with the shortest host round trip; the
//!   reference's host time is the end of that round trip (when the host saw it done). A
//!   node's device times are `reference + cuEventElapsedTime(reference, event)`. When the
//!   reference is more than a second old and the device has no traced work in flight, it is
//!   calibrated afresh on the device's first stream, so that the `f32` milliseconds keep
//!   sub-microsecond precision in long traces and the device clock's drift from the host's (a
//!   few µs a second) does not add up.
//! * **Per node.** After the node's waits on its predecessors, a start event is recorded on the
//!   worker's stream; after its body, an end event. The pair waits in the device's pending
//!   queue until the end event has completed; any bound worker of the device resolves it (at its
//!   next traced node, when polling completion, when idle; [`GpuPool::take_trace`](crate::GpuPool::take_trace)
//!   and shutdown wait for all of them) into a slice on the stream's track.
//! * **Order.** Pairs are queued in the order their nodes were enqueued, and the queue is
//!   resolved in order, so the slices of one track come out in stream order; a start is never
//!   put before the previous end on the same stream. (A stream handed over to another worker's
//!   node can, in a rare race with its owner, see two nodes queued out of stream order: the
//!   later one is then drawn from the earlier one's end, never overlapping.)

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use boundpool_scheduler::backend::SpanRecorder;

use crate::driver::{self, Ctx, DResult, Event, StreamRef};

/// Calibrate the reference afresh once it is this old (f32 milliseconds: ~0.06 µs steps at
/// 1 s; the device clock drifts from the host's by a few µs a second).
const REBASE_AFTER_MS: f32 = 1000.0;

/// A node's start event, recorded before its body. Dropped without [`DeviceTiming::end`]
/// (the body panicked), it gives the event back.
pub(crate) struct Started<'a> {
    timing: &'a DeviceTiming,
    event: Option<Event>,
}

impl Drop for Started<'_> {
    fn drop(&mut self) {
        if let Some(e) = self.event.take() {
            let mut st = self.timing.lock();
            st.open -= 1;
            st.free.push(e);
        }
    }
}

struct Pending {
    stream: usize,
    name: String,
    graph: String,
    node: u32,
    start: Event,
    end: Event,
}

struct StreamTrack {
    stream: StreamRef,
    track: String,
    last_end: Option<Instant>,
}

#[derive(Default)]
struct State {
    /// The reference event and its host time.
    reference: Option<(Event, Instant)>,
    /// Recorded pairs whose end may not have completed yet, in the order they were queued.
    pending: VecDeque<Pending>,
    /// Nodes between their start and end records.
    open: usize,
    /// Timing events not in use.
    free: Vec<Event>,
    streams: Vec<StreamTrack>,
}

/// The per-device timing state (present only when the pool records a trace).
pub(crate) struct DeviceTiming {
    recorder: OnceLock<SpanRecorder>,
    created: AtomicUsize,
    state: Mutex<State>,
    device_label: String,
}

impl DeviceTiming {
    pub(crate) fn new(ordinal: i32, name: &str) -> Self {
        Self {
            recorder: OnceLock::new(),
            created: AtomicUsize::new(0),
            state: Mutex::new(State::default()),
            device_label: format!("GPU {ordinal} ({name})"),
        }
    }

    /// Timing events created so far (they are recycled).
    pub(crate) fn events_created(&self) -> usize {
        self.created.load(Ordering::Relaxed)
    }

    /// Connects the pool's trace; the stream tracks are created now, in stream order.
    pub(crate) fn set_recorder(&self, r: SpanRecorder) {
        for t in &self.lock().streams {
            r.add_track(&t.track);
        }
        let _ = self.recorder.set(r);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A worker's stream joins: gets its track (`GPU <ordinal> (<name>) stream <i>`) and, for the
    /// device's first stream, the reference is calibrated on it (the stream is idle). Returns the
    /// stream's index in this table.
    pub(crate) fn add_stream(
        &self,
        ctx: Ctx,
        stream: StreamRef,
        partition: Option<&str>,
    ) -> DResult<usize> {
        let mut st = self.lock();
        if st.reference.is_none() {
            st.reference = Some(calibrate(ctx, stream, &mut st.free, &self.created)?);
        }
        let i = st.streams.len();
        let track = match partition {
            Some(p) => format!("{} partition {p} stream {i}", self.device_label),
            None => format!("{} stream {i}", self.device_label),
        };
        st.streams.push(StreamTrack {
            stream,
            track,
            last_end: None,
        });
        Ok(i)
    }

    /// Records a node's start event on `stream` (after its waits, before its body).
    pub(crate) fn begin(&self, ctx: Ctx, stream: StreamRef) -> DResult<Started<'_>> {
        let mut st = self.lock();
        self.resolve_locked(ctx, &mut st, false);
        let e = take(ctx, &mut st.free, &self.created)?;
        if let Err(err) = driver::event_record(ctx, &e, stream) {
            st.free.push(e);
            return Err(err);
        }
        st.open += 1;
        Ok(Started {
            timing: self,
            event: Some(e),
        })
    }

    /// Records the node's end event and queues the pair. On `Err`, or when `ok` is false (the
    /// body failed), the start event goes back unused.
    pub(crate) fn end(
        &self,
        ctx: Ctx,
        s: StreamRef,
        mut started: Started<'_>,
        ok: bool,
        (name, graph, node): (&str, &str, u32),
    ) -> DResult<()> {
        let Some(start) = started.event.take() else {
            return Ok(());
        };
        let mut st = self.lock();
        st.open -= 1;
        // The node ran on `s`: its worker's own stream, or one a predecessor handed over.
        let Some(stream) = st.streams.iter().position(|t| t.stream == s) else {
            st.free.push(start);
            return Ok(());
        };
        if !ok {
            st.free.push(start);
            return Ok(());
        }
        let e = match take(ctx, &mut st.free, &self.created) {
            Ok(e) => e,
            Err(err) => {
                st.free.push(start);
                return Err(err);
            }
        };
        if let Err(err) = driver::event_record(ctx, &e, s) {
            st.free.push(e);
            st.free.push(start);
            return Err(err);
        }
        st.pending.push_back(Pending {
            stream,
            name: name.to_owned(),
            graph: graph.to_owned(),
            node,
            start,
            end: e,
        });
        Ok(())
    }

    /// Turns completed pairs into trace slices; with `wait`, waits for every pending pair.
    pub(crate) fn resolve(&self, ctx: Ctx, wait: bool) {
        let mut st = self.lock();
        self.resolve_locked(ctx, &mut st, wait);
    }

    /// Whether pairs wait to be resolved (a cheap look for the idle hook).
    pub(crate) fn has_pending(&self) -> bool {
        !self.lock().pending.is_empty()
    }

    fn resolve_locked(&self, ctx: Ctx, st: &mut State, wait: bool) {
        // Out of the state while in use; put back on every way out but a rebase (which puts
        // the new one).
        let Some((reference, ref_host)) = st.reference.take() else {
            return;
        };
        while let Some(p) = st.pending.front() {
            let ready = if wait {
                driver::event_synchronize(ctx, &p.end).is_ok()
            } else {
                matches!(driver::event_query(ctx, &p.end), Ok(true))
            };
            if !ready {
                if wait {
                    // A failed device: its times are lost; give the events back.
                    let p = st.pending.pop_front().expect("front exists");
                    st.free.push(p.start);
                    st.free.push(p.end);
                    continue;
                }
                break;
            }
            let p = st.pending.pop_front().expect("front exists");
            let times = driver::event_elapsed_ms(ctx, &reference, &p.start)
                .and_then(|a| driver::event_elapsed_ms(ctx, &reference, &p.end).map(|b| (a, b)));
            if let Ok((a, b)) = times {
                let track = &mut st.streams[p.stream];
                let mut start = at(ref_host, a);
                if let Some(prev) = track.last_end {
                    start = start.max(prev);
                }
                let end = at(ref_host, b).max(start);
                track.last_end = Some(end);
                if let Some(r) = self.recorder.get() {
                    r.node_span(&track.track, &p.name, (&p.graph, p.node), start, end);
                }
                if b > REBASE_AFTER_MS && st.pending.is_empty() && st.open == 0 {
                    // Nothing traced in flight: a fresh reference. (Chaining `p.end` as the
                    // next one would carry the device clock's drift from the host's, a few
                    // microseconds a second, into every later slice.)
                    st.free.push(p.start);
                    st.free.push(p.end);
                    let stream = st.streams[0].stream;
                    match calibrate(ctx, stream, &mut st.free, &self.created) {
                        Ok(fresh) => {
                            st.free.push(reference);
                            st.reference = Some(fresh);
                        }
                        Err(_) => st.reference = Some((reference, ref_host)),
                    }
                    return;
                }
            }
            st.free.push(p.start);
            st.free.push(p.end);
        }
        st.reference = Some((reference, ref_host));
    }

    /// Destroys every timing event (the device's last worker, at teardown, after `resolve(.., true)`).
    pub(crate) fn destroy(&self, ctx: Ctx) {
        let mut st = self.lock();
        let mut all = std::mem::take(&mut st.free);
        all.extend(st.reference.take().map(|(e, _)| e));
        for p in std::mem::take(&mut st.pending) {
            all.push(p.start);
            all.push(p.end);
        }
        for e in all {
            let _ = e.destroy(ctx);
        }
    }
}

fn take(ctx: Ctx, free: &mut Vec<Event>, created: &AtomicUsize) -> DResult<Event> {
    match free.pop() {
        Some(e) => Ok(e),
        None => {
            let e = driver::event_create_timed(ctx)?;
            created.fetch_add(1, Ordering::Relaxed);
            Ok(e)
        }
    }
}

/// `base` moved by `ms` milliseconds (either way).
pub(crate) fn at(base: Instant, ms: f32) -> Instant {
    let d = Duration::from_secs_f64(f64::from(ms.abs()) / 1e3);
    if ms >= 0.0 {
        base + d
    } else {
        base.checked_sub(d).unwrap_or(base)
    }
}

/// Records a reference event on the idle `stream` a few times and keeps the try with the
/// shortest host round trip; its host time is the end of that round trip (the event is
/// timestamped when the device reaches it, after the record call's trip to the device, and
/// seen done about a microsecond later: the round trip's middle would be microseconds early).
/// Also the reference of a replay's launch probe (`replay/probe.rs`).
pub(crate) fn calibrate(
    ctx: Ctx,
    stream: StreamRef,
    free: &mut Vec<Event>,
    created: &AtomicUsize,
) -> DResult<(Event, Instant)> {
    let mut best: Option<(Event, Instant, Duration)> = None;
    for _ in 0..5 {
        let e = take(ctx, free, created)?;
        let t0 = Instant::now();
        let r =
            driver::event_record(ctx, &e, stream).and_then(|_| driver::event_synchronize(ctx, &e));
        let t1 = Instant::now();
        if let Err(err) = r {
            free.push(e);
            if let Some((b, _, _)) = best.take() {
                free.push(b);
            }
            return Err(err);
        }
        let rt = t1 - t0;
        match &best {
            Some((_, _, b)) if *b <= rt => free.push(e),
            _ => {
                if let Some((old, _, _)) = best.replace((e, t1, rt)) {
                    free.push(old);
                }
            }
        }
    }
    let (e, host, _) = best.expect("five tries");
    Ok((e, host))
}
