//! A GPU node's run on its worker (`run_gpu_node`, what `GpuGraphExt::gpu_node` wraps every
//! body in): the stream it enqueues on, the waits for its GPU predecessors, its body, what its
//! work joins afterwards, and what its successors and the graph's completion wait for.

use std::sync::Arc;
use std::task::Poll;

use boundpool_scheduler::backend::{InputsExt, NodeCtxExt};
use boundpool_scheduler::{BoxError, NodeCtx, Placement};

use super::{CompletionStamp, GpuCtx, GpuMarker};
use crate::device::ReaderFence;
use crate::driver::{self, Event, StreamRef};
use crate::error::{GpuError, GpuErrorKind};
use crate::worker::{Bound, GpuWorker, Lane, PendingEvent};

/// Runs `body` as the body of a GPU node, on the worker running `node` (which must be a worker
/// of a device): what [`GpuGraphExt::gpu_node`](super::GpuGraphExt::gpu_node) wraps every body in (the waits for GPU
/// predecessors, the marker for successors, the deferred completion). For a layer that adds
/// nodes through the scheduler's own `GraphBuilder::node` and places them on a device itself
/// (`boundpool-ranks` does, to see every error its GPU nodes return): it must also mark the node
/// (`backend::GraphBuilderExt::mark_device_node`), or its successors wait for its work as a
/// host node's would. Other code uses `gpu_node`.
pub fn run_gpu_body<T, F>(node: &NodeCtx<'_, GpuWorker>, body: F) -> Result<T, BoxError>
where
    F: Fn(&GpuCtx<'_, '_>) -> Result<T, BoxError>,
{
    run_gpu_node(node, &body)
}

/// Records an event of the node's worker on `stream`, right after the node's work.
fn record(ctx: &GpuCtx<'_, '_>, stream: StreamRef) -> Result<Event, BoxError> {
    ctx.b
        .record_event(stream)
        .map_err(|(call, e)| Box::new(ctx.fail(call, e)) as BoxError)
}

/// A GPU node's run on its worker: the stream it enqueues on, the waits for its GPU
/// predecessors, its body (timed and in an NVTX range where asked), what its work joins
/// afterwards (another stream an NCCL operation moved it to, the fences of other devices'
/// buffers it read), and what its successors and the graph's completion wait for.
pub(super) fn run_gpu_node<T, F>(node: &NodeCtx<'_, GpuWorker>, body: &F) -> Result<T, BoxError>
where
    F: Fn(&GpuCtx<'_, '_>) -> Result<T, BoxError>,
{
    let b = bound_worker(node)?;
    // A predecessor that handed its stream over (this is its one GPU successor, of its level):
    // enqueue on that stream, so the edge needs no event. Otherwise this worker's own stream of
    // this node's level (made here at the level's first node on this worker).
    let lane = b
        .lane(node.priority())
        .map_err(|e| Box::new(e.prefixed(&format!("node '{}'", node.node_name()))) as BoxError)?;
    let handed = handed_stream(node);
    let ctx = GpuCtx::new(node, b, handed.unwrap_or(lane.stream), None, None);
    let event_edges = wait_for_predecessors(&ctx)?;
    b.edges
        .node(event_edges, handed.is_some(), b.device.metrics());
    let out = run_body(&ctx, body)?;
    let stream = join_moved_work(&ctx)?;
    // Buffers of other devices read: their releases wait for this work (also when the body
    // failed after enqueueing a read).
    let fenced = fence_peer_reads(&ctx, stream);
    // A sticky driver error from the body (a cudarc call in it) marks the device failed, as
    // boundpool's own calls' do.
    let out = out.map_err(|e| b.device.body_error(&ctx.what(), e))?;
    fenced.map_err(|(call, e)| Box::new(ctx.fail(call, e)) as BoxError)?;
    // Nothing enqueued and no GPU predecessor: no event for successors, no wait for the device.
    if ctx.no_work.get() && !node.predecessor_markers().any(|(_, m)| m.is::<GpuMarker>()) {
        return Ok(out);
    }
    publish(&ctx, lane, stream)?;
    Ok(out)
}

/// The bound state of the device worker running `node`: an error naming the node on a host
/// worker, or on a device that failed.
fn bound_worker<'w>(node: &NodeCtx<'w, GpuWorker>) -> Result<&'w Bound, BoxError> {
    let Some(b) = node.worker_state().bound.as_ref() else {
        return Err(Box::new(GpuError::new(
            GpuErrorKind::InvalidArgument,
            format!(
                "GPU node '{}' ran on host worker {} (place GPU nodes on a device group)",
                node.node_name(),
                node.worker_info().name
            ),
        )));
    };
    if let Err(e) = b.device.check_usable() {
        return Err(Box::new(
            e.prefixed(&format!("node '{}'", node.node_name())),
        ));
    }
    Ok(b)
}

/// The stream a GPU predecessor handed over to `node`, if one did.
fn handed_stream(node: &NodeCtx<'_, GpuWorker>) -> Option<StreamRef> {
    node.predecessor_markers()
        .filter_map(|(_, m)| m.downcast_ref::<GpuMarker>())
        .find(|m| m.handoff)
        .map(|m| m.stream)
}

/// Orders the node's stream after its GPU predecessors on other streams: one wait per other
/// stream of this device suffices (an event recorded on it now follows everything its
/// predecessors enqueued). Returns the number of event waits.
fn wait_for_predecessors(ctx: &GpuCtx<'_, '_>) -> Result<u64, BoxError> {
    let (b, stream) = (ctx.b, ctx.stream);
    let mut waited: Vec<StreamRef> = Vec::new();
    let mut event_edges = 0u64;
    for (_, m) in ctx.node.predecessor_markers() {
        let Some(m) = m.downcast_ref::<GpuMarker>() else {
            continue;
        };
        if m.stream == stream {
            continue;
        }
        if m.event.is_none() {
            if waited.contains(&m.stream) {
                continue;
            }
            waited.push(m.stream);
        }
        let r = match &m.event {
            Some(e) => driver::stream_wait_event(b.ctx, stream, e),
            None => b.take_event().and_then(|e| {
                let r = b.device.wait_for_stream(stream, m.stream, &e);
                b.put_event(e);
                r
            }),
        };
        r.map_err(|e| Box::new(ctx.fail("cuStreamWaitEvent", e)) as BoxError)?;
        event_edges += 1;
    }
    Ok(event_edges)
}

/// Runs the node's body, between the trace's timing events where the device keeps a trace
/// and in an NVTX range with the `nvtx` feature. The outer error is a timing event's.
fn run_body<T, F>(ctx: &GpuCtx<'_, '_>, body: &F) -> Result<Result<T, BoxError>, BoxError>
where
    F: Fn(&GpuCtx<'_, '_>) -> Result<T, BoxError>,
{
    let (node, b, stream) = (ctx.node, ctx.b, ctx.stream);
    let started = match &b.device.timing {
        Some(t) => Some(
            t.begin(b.ctx, stream)
                .map_err(|e| Box::new(ctx.fail("cuEventRecord", e)) as BoxError)?,
        ),
        None => None,
    };
    #[cfg(feature = "nvtx")]
    let range = crate::nvtx::node_range(node.node_name(), node.graph_name());
    let out = body(ctx);
    #[cfg(feature = "nvtx")]
    drop(range);
    if let (Some(t), Some(s)) = (&b.device.timing, started) {
        let who = (
            node.node_name(),
            node.graph_name(),
            node.node_id().index() as u32,
        );
        t.end(b.ctx, stream, s, out.is_ok(), who)
            .map_err(|e| Box::new(ctx.fail("cuEventRecord", e)) as BoxError)?;
    }
    Ok(out)
}

/// Where the node's work went: its stream, or the one an NCCL operation moved it to. Work the
/// body enqueued on its own stream after the operation joins that stream (an event wait: local
/// work only, never a peer's), so successors that follow it see all of it.
fn join_moved_work(ctx: &GpuCtx<'_, '_>) -> Result<StreamRef, BoxError> {
    let Some(m) = ctx.moved_to.get() else {
        return Ok(ctx.stream);
    };
    if m != ctx.stream {
        let e = record(ctx, ctx.stream)?;
        let joined = driver::stream_wait_event(ctx.b.ctx, m, &e);
        ctx.b.put_event(e);
        joined.map_err(|e| Box::new(ctx.fail("cuStreamWaitEvent", e)) as BoxError)?;
    }
    Ok(m)
}

/// Who depends on a GPU node, as far as its marker and completion need.
#[derive(Default)]
struct Successors {
    /// GPU successors, on any device.
    gpu: usize,
    /// GPU successors on this node's device.
    gpu_here: usize,
    /// A GPU successor surely runs on another worker (another group or device) or level: the
    /// event is recorded now, right after the work.
    eager: bool,
    /// A GPU successor of another priority level (runs on its level's stream: no hand-off).
    other_level: bool,
    /// A GPU successor placed off this worker's SM partition (no hand-off).
    other_partition: bool,
    /// A host successor (waits for the device's work).
    host: bool,
}

impl Successors {
    /// A successor placed on another group surely runs on another worker (another stream, or
    /// another device): the event is recorded here, right after the work, on the stream this
    /// thread just used, unless the stream is handed over. A successor of the same group, or
    /// placed on this device as a whole, may well run here (no event at all); if another
    /// worker runs it, it takes the stream over or records an event on it itself. A successor
    /// of another level runs on another stream (its level's) whichever worker runs it: it gets
    /// the event now, and no hand-off (its work must go to a stream of its own priority). On a
    /// device split into SM partitions, a stream is handed over only to a successor placed on
    /// this worker's own group (its partition): any other worker may be of another one.
    fn of(ctx: &GpuCtx<'_, '_>) -> Self {
        let (node, b) = (ctx.node, ctx.b);
        let shared = &node.worker_state().shared;
        let (level, my_group) = (node.priority(), node.worker_info().group);
        let partitioned = b.device.partitions.is_partitioned();
        let mut s = Successors::default();
        for succ in node.successors() {
            let placed = node.placement_of(succ);
            // A node that is not a GPU node waits for this node's work wherever it is placed
            // (a host node on a device's workers reads what the work wrote).
            let Some(d) = shared
                .device_of(placed)
                .filter(|_| node.is_device_node(succ))
            else {
                s.host = true;
                continue;
            };
            s.gpu += 1;
            if d == b.device_index {
                s.gpu_here += 1;
            }
            let may_run_here = match placed {
                Placement::Group(g) => g == my_group,
                _ => true,
            };
            let same_level = node.priority_of(succ) == level;
            s.other_level |= !same_level;
            s.other_partition |= partitioned && placed != Placement::Group(my_group);
            if d != b.device_index || !may_run_here || !same_level {
                s.eager = true;
            }
        }
        s
    }
}

/// After the node's work is enqueued on `stream` (its lane's, a handed-over one, or one an
/// NCCL operation moved it to): the marker its GPU successors read (the stream, handed over or
/// not, and an event where they need one), and, for host successors or a sink, the completion
/// the graph waits for (on the lane's own stream by sequence number, one event per burst of
/// nodes; on another stream by an event of its own).
fn publish(ctx: &GpuCtx<'_, '_>, lane: &Lane, stream: StreamRef) -> Result<(), BoxError> {
    let (node, b) = (ctx.node, ctx.b);
    let level = node.priority();
    let moved = ctx.moved_to.get().is_some();
    let own = stream == lane.stream;
    let seq = if own {
        let seq = lane.seq.get() + 1;
        lane.seq.set(seq);
        seq
    } else {
        0
    };
    let succ = Successors::of(ctx);
    if succ.gpu > 0 {
        let handoff = node.worker_state().shared.stream_handoff
            && succ.gpu == 1
            && succ.gpu_here == 1
            && !succ.other_level
            && !succ.other_partition
            && !moved;
        let event = if (succ.eager || moved) && !handoff {
            Some(record(ctx, stream)?)
        } else {
            None
        };
        node.set_marker(Box::new(GpuMarker {
            events: event.is_some().then(|| b.returned.clone()),
            stream,
            event,
            handoff,
        }));
    }
    let sink = succ.gpu == 0 && !succ.host;
    if !(succ.host || sink) {
        return Ok(());
    }
    let stamp = ctx.completion_stamp.take();
    if own {
        complete_when(node, stamp, move |w: &GpuWorker| match &w.bound {
            Some(b) => b.poll_done(level, seq),
            None => Poll::Ready(Ok(())),
        });
    } else {
        let mut pending = PendingEvent {
            event: Some(record(ctx, stream)?),
            back: b.returned.clone(),
            last: None,
        };
        complete_when(node, stamp, move |w: &GpuWorker| match &w.bound {
            Some(b) => b.poll_event(&mut pending),
            None => Poll::Ready(Ok(())),
        });
    }
    Ok(())
}

/// Defers `node`'s completion to `poll`; with a probe's `stamp`, each poll timed into it.
fn complete_when(
    node: &NodeCtx<'_, GpuWorker>,
    stamp: Option<Arc<CompletionStamp>>,
    mut poll: impl FnMut(&GpuWorker) -> Poll<Result<(), BoxError>> + Send + 'static,
) {
    match stamp {
        None => node.complete_when(poll),
        Some(s) => node.complete_when(move |w: &GpuWorker| s.poll(|| poll(w))),
    }
}

/// After a node's body: records one event per buffer of another device it read in place, on
/// `stream` (where its work went), and hands it to the buffer's readers. Runs on the node's
/// worker.
fn fence_peer_reads(
    ctx: &GpuCtx<'_, '_>,
    stream: StreamRef,
) -> Result<(), (&'static str, driver::DriverError)> {
    let reads = std::mem::take(&mut *ctx.peer_reads.borrow_mut());
    for readers in reads {
        // An error leaves the read open: the buffer is then never freed, not freed under it.
        let event = ctx.b.record_event(stream)?;
        readers.end_read(ReaderFence {
            event,
            home: ctx.b.device.clone(),
        });
    }
    Ok(())
}
