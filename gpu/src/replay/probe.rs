//! A diagnostic of replayed launches ([`Replayable::probe_launches`](super::Replayable::probe_launches)):
//! for each launch of a segment's executable while the probe is on, the host time inside
//! `cuGraphLaunch`, when the device ran the launched work (two timing events on the node's
//! stream, one before the launch and one after it, read against a reference calibrated to
//! the host's clock as the trace's are, `timing.rs`), and when the node's worker saw the work
//! done (its completion's polls, `node/stamp.rs`). Off, a replayed launch pays one load.
//!
//! The events of a launch are read at a later probed launch (they are done by then: a run's
//! host successor of the segment ran after them), on a bound worker, before that launch
//! begins: never between a launch and its completion's first poll (which enqueues the
//! completion word's write), and timed, so the probe's cost shows.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use boundpool_scheduler::BoxError;

use crate::device::DeviceShared;
use crate::driver::{self, DResult, Event};
use crate::node::{CompletionStamp, GpuCtx};
use crate::timing;

/// One probed launch of a replayed segment ([`Replayable::probe_launches`](super::Replayable::probe_launches)):
/// host instants, and the device's, on the host's clock. A diagnostic: its fields may change.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct LaunchRecord {
    /// The segment launched (its index in the graph).
    pub segment: u32,
    /// Host time the segment's node spent reading earlier launches' events (the probe's
    /// cost), just before `begin`.
    pub read_before: Duration,
    /// Host: the segment's node began the launch (before the start event's record).
    pub begin: Instant,
    /// Host time inside `cuGraphLaunch`.
    pub launch_call: Duration,
    /// Host time inside the probe's two `cuEventRecord` calls around the launch (the probe's
    /// own cost; a driver call that waits for the driver's locks waits here too).
    pub record_calls: Duration,
    /// Host: the end event's record returned (the launch is enqueued).
    pub launched: Instant,
    /// When the device reached the start event, recorded on the node's stream just before the
    /// launch, on the host's clock. Before `launched` when the device took the launch's work
    /// while the call was still in the driver.
    pub device_start: Instant,
    /// When the device reached the end event, recorded right after the launch: the launched
    /// work done. `device_end - device_start` is the work's time on the device, plus any time
    /// the stream sat idle waiting for the launch call to hand it the work.
    pub device_end: Instant,
    /// Host: the first poll of the segment node's completion (its worker enqueues the
    /// completion word's write there). None where the node's completion is not deferred
    /// (no host successor, not a sink).
    pub first_poll: Option<Instant>,
    /// Host: the start of the poll that found the work done.
    pub seen: Option<Instant>,
    /// Polls of the node's completion, the one that found it done included.
    pub polls: u32,
    /// Host time inside those polls (the completion word's write and the stream's queries are
    /// driver calls made there).
    pub poll_time: Duration,
    /// From the end of the poll before the one that found the work done to its start: long
    /// when the worker was not polling then (running another node, parked, preempted).
    pub gap_before_seen: Duration,
}

/// A launch whose events are not read yet.
struct Pending {
    segment: u32,
    read_before: Duration,
    begin: Instant,
    launch_call: Duration,
    record_calls: Duration,
    launched: Instant,
    start: Event,
    end: Event,
    stamp: Arc<CompletionStamp>,
}

#[derive(Default)]
struct ProbeState {
    /// The device whose worker made the probe's events (the first probed launch's); launches
    /// on another device are not probed.
    home: Option<Arc<DeviceShared>>,
    /// The reference event and its host time.
    reference: Option<(Event, Instant)>,
    /// A fresh reference is due (the probe was turned on).
    calibrate: bool,
    free: Vec<Event>,
    pending: VecDeque<Pending>,
    done: Vec<LaunchRecord>,
}

impl ProbeState {
    /// Gives a read or discarded launch's events back to the spares.
    fn recycle(&mut self, p: Pending) {
        self.free.push(p.start);
        self.free.push(p.end);
    }
}

/// A replayable's launch probe, made when it is first turned on.
#[derive(Default)]
pub(super) struct LaunchProbe {
    on: AtomicBool,
    created: AtomicUsize,
    state: Mutex<ProbeState>,
}

impl Drop for LaunchProbe {
    fn drop(&mut self) {
        let st = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        let Some(home) = st.home.take() else {
            return;
        };
        // Destroyed by a bound worker of their device: its table takes them (no driver call).
        let events = std::mem::take(&mut st.free)
            .into_iter()
            .chain(st.reference.take().map(|(e, _)| e))
            .chain(st.pending.drain(..).flat_map(|p| [p.start, p.end]));
        for e in events {
            home.put_event(e);
        }
    }
}

impl LaunchProbe {
    fn lock(&self) -> std::sync::MutexGuard<'_, ProbeState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn is_on(&self) -> bool {
        self.on.load(Ordering::Acquire)
    }

    /// Turns the probe on (a fresh reference at the next launch; launches not read yet are
    /// dropped) or off.
    pub(super) fn set(&self, on: bool) {
        if on {
            let mut st = self.lock();
            st.calibrate = true;
            while let Some(p) = st.pending.pop_front() {
                st.recycle(p);
            }
        }
        self.on.store(on, Ordering::Release);
    }

    /// The launches read so far, oldest first; they are not returned again.
    pub(super) fn take_records(&self) -> Vec<LaunchRecord> {
        std::mem::take(&mut self.lock().done)
    }

    /// Launches segment `segment` with `launch` (the `cuGraphLaunch` on the node's stream),
    /// between timing events, and reads the launches before it whose work is done.
    pub(super) fn launch(
        &self,
        gctx: &GpuCtx<'_, '_>,
        segment: u32,
        launch: impl FnOnce() -> Result<(), BoxError>,
    ) -> Result<(), BoxError> {
        let fail = |call: &str, e| Box::new(gctx.fail_call(call, e)) as BoxError;
        let (ctx, stream) = (gctx.b.ctx, gctx.stream);
        let (start, end, read_before) = {
            let mut st = self.lock();
            let home = st.home.get_or_insert_with(|| gctx.b.device.clone());
            if !Arc::ptr_eq(home, &gctx.b.device) {
                drop(st);
                return launch();
            }
            if st.calibrate || st.reference.is_none() {
                // The single client this probe is for leaves the stream idle between runs.
                let fresh = timing::calibrate(ctx, stream, &mut st.free, &self.created)
                    .map_err(|e| fail("cuEventSynchronize", e))?;
                if let Some((old, _)) = st.reference.replace(fresh) {
                    st.free.push(old);
                }
                st.calibrate = false;
            }
            let t = Instant::now();
            self.read_done(ctx, &mut st);
            let read = t.elapsed();
            let start = self
                .take(ctx, &mut st.free)
                .map_err(|e| fail("cuEventCreate", e))?;
            match self.take(ctx, &mut st.free) {
                Ok(end) => (start, end, read),
                Err(e) => {
                    st.free.push(start);
                    return Err(fail("cuEventCreate", e));
                }
            }
        };
        let stamp = Arc::new(CompletionStamp::default());
        let begin = Instant::now();
        let r0 = driver::event_record(ctx, &start, stream);
        let t0 = Instant::now();
        let launched = r0.is_ok().then(launch);
        let t1 = Instant::now();
        let r1 = match launched {
            Some(Ok(())) => driver::event_record(ctx, &end, stream),
            _ => Ok(()),
        };
        let t2 = Instant::now();
        let mut st = self.lock();
        let failed = match (r0, launched, r1) {
            (Err(e), ..) => Some(fail("cuEventRecord", e)),
            (_, Some(Err(e)), _) => Some(e),
            (.., Err(e)) => Some(fail("cuEventRecord", e)),
            _ => None,
        };
        if let Some(e) = failed {
            st.free.push(start);
            st.free.push(end);
            return Err(e);
        }
        gctx.completion_stamp.set(Some(stamp.clone()));
        st.pending.push_back(Pending {
            segment,
            read_before,
            begin,
            launch_call: t1 - t0,
            record_calls: (t0 - begin) + (t2 - t1),
            launched: t2,
            start,
            end,
            stamp,
        });
        Ok(())
    }

    fn take(&self, ctx: driver::Ctx, free: &mut Vec<Event>) -> DResult<Event> {
        match free.pop() {
            Some(e) => Ok(e),
            None => {
                let e = driver::event_create_timed(ctx)?;
                self.created.fetch_add(1, Ordering::Relaxed);
                Ok(e)
            }
        }
    }

    /// Reads the oldest launches whose completion's polls are over (found done, or never to
    /// come: the stamp's only holder is this probe) and whose end event is done, in order.
    fn read_done(&self, ctx: driver::Ctx, st: &mut ProbeState) {
        let Some((reference, ref_host)) = st.reference.take() else {
            return;
        };
        while let Some(p) = st.pending.front() {
            let polls = p.stamp.times();
            let settled = polls.seen.is_some() || Arc::strong_count(&p.stamp) == 1;
            if !settled || !matches!(driver::event_query(ctx, &p.end), Ok(true)) {
                break;
            }
            let p = st.pending.pop_front().expect("front exists");
            let times = driver::event_elapsed_ms(ctx, &reference, &p.start)
                .and_then(|a| driver::event_elapsed_ms(ctx, &reference, &p.end).map(|b| (a, b)));
            // A launch whose times cannot be read is left out.
            if let Ok((a, b)) = times {
                st.done.push(LaunchRecord {
                    segment: p.segment,
                    read_before: p.read_before,
                    begin: p.begin,
                    launch_call: p.launch_call,
                    record_calls: p.record_calls,
                    launched: p.launched,
                    device_start: timing::at(ref_host, a),
                    device_end: timing::at(ref_host, b),
                    first_poll: polls.first,
                    seen: polls.seen,
                    polls: polls.polls,
                    poll_time: polls.inside,
                    gap_before_seen: polls.gap_before_seen,
                });
            }
            st.recycle(p);
        }
        st.reference = Some((reference, ref_host));
    }
}
