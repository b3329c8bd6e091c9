//! Capture on a bound worker: a segment's node captures its members' bodies into a CUDA graph
//! when the instance's segment is stale, instantiates (or updates) its executable, and
//! launches it.

use std::any::Any;
use std::cell::RefCell;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use boundpool_scheduler::{BoxError, NodeRef};
use cudarc::driver::CudaStream;

use crate::buffer;
use crate::capture::Capture;
use crate::driver::{self, CudaGraphNode, GraphExec, StreamRef};
use crate::error::{GpuError, GpuErrorKind, GpuResult};
use crate::gate::GateHold;
use crate::node::GpuCtx;

use super::check::{self, NodeOwners};
use super::desc::{Out, ReplayCtx, Source};
use super::instance::{InstanceState, ReplayStats, SegState};

/// Body of a segment's node: capture when the instance's segment is not captured for the
/// current generation, then launch the executable on the node's stream.
pub(super) fn run_segment(
    st: &InstanceState,
    k: u32,
    gctx: &GpuCtx<'_, '_>,
    refs: &[Option<NodeRef<Out>>],
) -> Result<(), BoxError> {
    let mut seg = st.segs[k as usize]
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let generation = st.shared.generation.load(Ordering::Acquire);
    if seg.generation != Some(generation) {
        seg.generation = None;
        // A run submitted before another instance's capture of this generation failed: the
        // same error, no second attempt.
        if let Some(why) = st.shared.failure_of(generation) {
            return Err(Box::new(GpuError::new(GpuErrorKind::Capture, why)));
        }
        match capture_segment(st, k, gctx, refs, &mut seg) {
            Ok(()) => seg.generation = Some(generation),
            Err(e) => {
                forget_drop_errors(gctx);
                if check::curand_refused(&e) {
                    forget_curand_error(gctx);
                }
                // Later runs go eager until `update` asks for a new capture: one attempt per
                // generation, not one per run.
                st.shared.capture_failed(generation, e.message());
                gctx.b.device.metrics().capture_failures.increment(1);
                return Err(Box::new(e));
            }
        }
    }
    let exec = seg.slot.exec.lock().unwrap_or_else(|e| e.into_inner());
    match exec.as_ref() {
        Some(e) => {
            let launch = || {
                driver::graph_launch(gctx.b.ctx, e, gctx.stream)
                    .map_err(|e| Box::new(gctx.fail_call("cuGraphLaunch", e)) as BoxError)
            };
            match st.shared.probe_on() {
                None => launch()?,
                Some(p) => p.launch(gctx, k, launch)?,
            }
            gctx.b.device.metrics().replays.increment(1);
        }
        // The capture recorded no work (hoisted allocations were waited for): none to order.
        None => gctx.no_work.set(true),
    }
    Ok(())
}

/// After a failed capture: cudarc slices its bodies made under it and dropped (a refused
/// output, a body's clean-up after its error) may have failed their frees in cudarc's `Drop`,
/// which records the error for the context's next cudarc call, in whatever node makes it. The
/// failure is this capture's, reported by its error: forgotten here, unless sticky (then the
/// device is marked failed, as for a body's error).
fn forget_drop_errors(gctx: &GpuCtx<'_, '_>) {
    if let Err(d) = gctx.b.cuda.check_err() {
        if driver::is_sticky(d) {
            let _ = gctx.b.device.body_error(&gctx.what(), Box::new(d));
        }
    }
}

/// After a capture that cuRAND's calls failed: cuRAND keeps the error of its refused call
/// (its own CUDA runtime's last error, on this thread) and fails its next call on this worker
/// with `CURAND_STATUS_PREEXISTING_FAILURE`, once (measured: the next eager fill failed, the
/// one after worked). One throwaway generator's fill, on the worker's own stream now that the
/// capture has ended, takes that failure, so that the graph's eager runs work.
fn forget_curand_error(gctx: &GpuCtx<'_, '_>) {
    // The generator's destroy frees with a synchronise: not during another thread's capture.
    let _gate = gctx.b.device.gate.sync();
    let stream = gctx.b.normal_stream();
    let Ok(rng) = cudarc::curand::CudaRng::new(0, stream.clone()) else {
        return;
    };
    if let Ok(mut one) = stream.alloc_zeros::<f32>(1) {
        let _ = rng.fill_with_uniform(&mut one);
    }
}

/// Ends a capture however the capturing code leaves (error or panic): the stream stops
/// capturing, the partial graph and the stream are destroyed, the thread's flag is cleared,
/// and the device's capture gate is let go (a field: dropped after the capture has ended).
struct CaptureGuard {
    ctx: driver::Ctx,
    /// Dropped (destroyed, unless a body kept a clone) when the capture ends.
    stream: Option<Arc<CudaStream>>,
    _gate: GateHold,
}

impl CaptureGuard {
    fn finish(mut self) -> driver::DResult<Option<driver::CudaGraph>> {
        let s = self.stream.take().expect("finished once");
        buffer::watch_frees(false);
        driver::stream_end_capture(self.ctx, StreamRef::of(&s))
    }
}

impl Drop for CaptureGuard {
    fn drop(&mut self) {
        if let Some(s) = self.stream.take() {
            buffer::watch_frees(false);
            if let Ok(Some(g)) = driver::stream_end_capture(self.ctx, StreamRef::of(&s)) {
                let _ = g.destroy(self.ctx);
            }
        }
    }
}

fn capture_error(st: &InstanceState, node: Option<u32>, why: String) -> GpuError {
    let at = match node {
        Some(i) => format!(" at node '{}'", st.desc.names[i as usize]),
        None => String::new(),
    };
    GpuError::new(
        GpuErrorKind::Capture,
        format!(
            "replay capture of graph '{}' failed{at}: {why} (its later runs run eagerly until Replayable::update asks for a new capture)",
            st.desc.name
        ),
    )
}

/// Captures segment `k` of instance `st` on this worker into a CUDA graph, makes or updates
/// its executable, and keeps the members' outputs and the capture's buffers with the instance.
fn capture_segment(
    st: &InstanceState,
    k: u32,
    gctx: &GpuCtx<'_, '_>,
    refs: &[Option<NodeRef<Out>>],
    seg: &mut SegState,
) -> GpuResult<()> {
    let b = gctx.b;
    let desc = &*st.desc;
    if !driver::has_capture_v3() {
        return Err(capture_error(
            st,
            None,
            format!(
                "replay needs a CUDA 12.3 driver or newer (this one reports {})",
                driver::driver_version().unwrap_or(0)
            ),
        ));
    }
    let t0 = Instant::now();
    let (guard, cap) = begin_capture(st, gctx)?;
    let local: RefCell<Vec<Option<Out>>> = RefCell::new(vec![None; desc.names.len()]);
    let mut owners = NodeOwners::default();
    let empty_root = capture_members(st, k, gctx, refs, &cap, &local, &mut owners)?;
    let graph = end_capture(st, gctx, guard, empty_root, &owners)?;
    let capture_time = t0.elapsed();
    let (graph, nodes, edges) = graph_size(st, gctx, graph)?;
    let mut stats = ReplayStats::default();
    install_exec(st, gctx, seg, graph, nodes, &mut stats)?;
    // The new outputs replace the old ones (whose buffers go to the release queue, freed after
    // the work already enqueued on the device).
    st.outputs
        .replace(&desc.segments[k as usize], local.into_inner());
    seg.kept = cap.into_kept();
    let m = b.device.metrics();
    m.captures.increment(1);
    m.exec_instantiations.increment(stats.instantiations);
    m.exec_updates.increment(stats.updates);
    let mut s = st.shared.stats.lock().unwrap_or_else(|e| e.into_inner());
    s.captures += 1;
    s.capture_time += capture_time;
    s.instantiations += stats.instantiations;
    s.instantiate_time += stats.instantiate_time;
    s.updates += stats.updates;
    s.update_fallbacks += stats.update_fallbacks;
    s.update_time += stats.update_time;
    s.captured_nodes += nodes as u64;
    s.captured_edges += edges as u64;
    s.stand_in_roots += u64::from(empty_root.is_some());
    Ok(())
}

/// Begins a capture, in thread-local mode, on a new stream of the worker's context (of its SM
/// partition, if it has one); the guard ends it however the capturing code leaves.
fn begin_capture(st: &InstanceState, gctx: &GpuCtx<'_, '_>) -> GpuResult<(CaptureGuard, Capture)> {
    let b = gctx.b;
    let ctx = b.ctx;
    let drv = |call: &str, e| capture_error(st, None, gctx.fail_call(call, e).to_string());
    let owned = b.capture_stream().map_err(|e| drv("cuStreamCreate", e))?;
    // The capturing stream: a view of `owned`, which the guard drops when the capture ends
    // (`finish` consumes the guard, after the last use of a view of it in `capture_members`).
    let cs = StreamRef::of(&owned);
    // Held until the capture ends: no call of another thread synchronises the device
    // meanwhile (which would invalidate this capture), and this capture waits for those under
    // way.
    let gate = b.device.gate.capture();
    driver::stream_begin_capture(ctx, cs).map_err(|e| drv("cuStreamBeginCapture", e))?;
    let guard = CaptureGuard {
        ctx,
        stream: Some(owned.clone()),
        _gate: gate,
    };
    buffer::watch_frees(true);
    let cap = Capture::new(b.stream, owned);
    Ok((guard, cap))
}

/// Calls the segment's members' bodies under the capture, in their order, each with its own
/// dependencies set on the capture (the union of its segment predecessors' last captured
/// nodes), their outputs into `local`. Returns the empty node that stood in for an empty
/// dependency set, if the driver refused one.
fn capture_members(
    st: &InstanceState,
    k: u32,
    gctx: &GpuCtx<'_, '_>,
    refs: &[Option<NodeRef<Out>>],
    cap: &Capture,
    local: &RefCell<Vec<Option<Out>>>,
    owners: &mut NodeOwners,
) -> GpuResult<Option<CudaGraphNode>> {
    let ctx = gctx.b.ctx;
    let desc = &*st.desc;
    let drv = |call: &str, e| capture_error(st, None, gctx.fail_call(call, e).to_string());
    let cs = StreamRef::of(cap.stream());
    let mut tails: Vec<Vec<CudaGraphNode>> = vec![Vec::new(); desc.names.len()];
    // The capture's current dependency set (empty at the start).
    let mut current: Vec<CudaGraphNode> = Vec::new();
    let mut empty_root: Option<CudaGraphNode> = None;
    for &m in &desc.segments[k as usize] {
        let mut deps: Vec<CudaGraphNode> = Vec::new();
        for &p in desc.preds[m as usize].iter().chain(&desc.after[m as usize]) {
            if desc.seg_of[p as usize] == Some(k) {
                for d in &tails[p as usize] {
                    if !deps.contains(d) {
                        deps.push(*d);
                    }
                }
            }
        }
        // The capture's tail is the last member's: a chain needs no update at all.
        if let (true, Some(root)) = (deps.is_empty(), empty_root) {
            // The driver refused an empty set before: don't ask again.
            deps.push(root);
        }
        if current != deps {
            let set = driver::capture_set_dependencies(ctx, cs, &deps);
            match set {
                Ok(()) => {}
                // A driver that refuses an empty dependency set: the roots depend on one empty
                // node instead (made once per capture).
                Err(_) if deps.is_empty() => {
                    let root = match empty_root {
                        Some(r) => r,
                        None => {
                            let r = driver::capture_add_root(ctx, cs)
                                .map_err(|e| drv("cuGraphAddEmptyNode", e))?;
                            empty_root = Some(r);
                            r
                        }
                    };
                    driver::capture_set_dependencies(ctx, cs, &[root])
                        .map_err(|e| drv("cuStreamUpdateCaptureDependencies", e))?;
                }
                Err(e) => return Err(drv("cuStreamUpdateCaptureDependencies", e)),
            }
        }
        call_member(st, k, m, gctx, refs, cap, local)?;
        // Every member's tail is read back: its successors in the segment depend on it, and
        // `check.rs` names the member a refused node belongs to by the first tail after it.
        current =
            driver::capture_dependencies(ctx, cs).map_err(|e| drv("cuStreamGetCaptureInfo", e))?;
        owners.member_done(m, &current);
        tails[m as usize] = current.clone();
    }
    Ok(empty_root)
}

/// Calls member `m`'s body under the capture (its dependencies set), then checks that the
/// capture may go on: nothing refused, the body succeeded, no buffer freed, the capture valid.
fn call_member(
    st: &InstanceState,
    k: u32,
    m: u32,
    gctx: &GpuCtx<'_, '_>,
    refs: &[Option<NodeRef<Out>>],
    cap: &Capture,
    local: &RefCell<Vec<Option<Out>>>,
) -> GpuResult<()> {
    let b = gctx.b;
    let ctx = b.ctx;
    let desc = &*st.desc;
    let drv = |call: &str, e| capture_error(st, None, gctx.fail_call(call, e).to_string());
    let cs = StreamRef::of(cap.stream());
    // Reads of other devices and NCCL operations are refused under a capture: its peer reads
    // and moved stream stay empty.
    let mctx = GpuCtx::new(gctx.node(), b, cs, Some(cap), Some(&desc.names[m as usize]));
    let rctx = ReplayCtx {
        gpu: Some(&mctx),
        node: gctx.node(),
        me: m,
        desc,
        src: Source::Replay {
            refs,
            outputs: &st.outputs,
            capture: Some((k, local)),
        },
        feeds: &st.feeds,
    };
    // A panic (a cudarc handle's drop that fails under the capture unwraps, for one) fails the
    // capture like an error, so that it counts and later runs go eager.
    let r = panic::catch_unwind(AssertUnwindSafe(|| (desc.bodies[m as usize])(&rctx)));
    if let Some(why) = cap.take_refused() {
        return Err(capture_error(st, Some(m), why));
    }
    let r = r.map_err(|p| {
        let text = panic_text(&*p);
        let hint = check::refused_call_in_panic(text)
            .map(|h| format!(" ({h})"))
            .unwrap_or_default();
        capture_error(st, Some(m), format!("its body panicked: {text}{hint}"))
    })?;
    match r {
        Ok(v) => local.borrow_mut()[m as usize] = Some(v),
        // The body's own error first: it names the call that failed (a free noted below
        // may only be its clean-up).
        Err(e) => {
            // A sticky driver error from a cudarc call in the body marks the device failed.
            let e = gctx.b.device.body_error(&gctx.what(), e);
            let hint = check::refused_call(&*e)
                .map(|h| format!(" ({h})"))
                .unwrap_or_default();
            return Err(
                capture_error(st, Some(m), format!("its body failed: {e}{hint}")).with_source(e),
            );
        }
    }
    if buffer::take_freed() {
        return Err(capture_error(
            st,
            Some(m),
            "a free (a DeviceBuffer dropped during the body) cannot be captured: the graph would replay on freed memory (return the buffer as an output instead)".into(),
        ));
    }
    match driver::stream_capture_status(ctx, cs) {
        Ok(Some(true)) => {}
        Ok(_) => {
            return Err(capture_error(
                st,
                Some(m),
                "the driver invalidated the capture during this body (an operation a CUDA graph cannot capture: a synchronise, an event query, a copy from or to pageable host memory; from cudarc: load_module (a module unloaded in the body too), clone_htod / memcpy_htod / memcpy_dtoh with a Vec, a CudaBlas, CudaBlasLT or CudaRng made or dropped in the body; use modules loaded once per worker (GpuPoolBuilder::worker_state), GpuCtx::upload, GpuCtx::cublas / cublaslt)".into(),
            ))
        }
        Err(e) => return Err(drv("cuStreamIsCapturing", e)),
    }
    Ok(())
}

fn panic_text(p: &(dyn Any + Send)) -> &str {
    p.downcast_ref::<&str>()
        .copied()
        .or_else(|| p.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(not a string)")
}

/// Ends the capture and returns its graph, without the empty root if one stood in, once
/// `check.rs` found nothing in it a replay cannot hold.
fn end_capture(
    st: &InstanceState,
    gctx: &GpuCtx<'_, '_>,
    guard: CaptureGuard,
    empty_root: Option<CudaGraphNode>,
    owners: &NodeOwners,
) -> GpuResult<driver::CudaGraph> {
    let ctx = gctx.b.ctx;
    let drv = |call: &str, e| capture_error(st, None, gctx.fail_call(call, e).to_string());
    let mut graph = guard
        .finish()
        .map_err(|e| drv("cuStreamEndCapture", e))?
        .ok_or_else(|| capture_error(st, None, "cuStreamEndCapture returned no graph".into()))?;
    // Before the empty root goes: members' tails may name it.
    let refused = match check::refused_node(gctx, &graph, owners) {
        Ok(None) => None,
        Ok(Some(r)) => Some(capture_error(st, r.member, r.why())),
        Err(e) => Some(drv(
            "reading the captured graph (cuGraphGetNodes and its nodes)",
            e,
        )),
    };
    if let Some(e) = refused {
        let _ = graph.destroy(ctx);
        return Err(e);
    }
    // The empty root stood in for an empty dependency set only during the capture: without it
    // the roots are roots again, and the executable has the DAG's topology exactly (a fan-out
    // from one node instantiated several times slower per node than the same roots).
    if let Some(root) = empty_root {
        if let Err(e) = driver::graph_remove_node(ctx, &mut graph, root) {
            let _ = graph.destroy(ctx);
            return Err(drv("cuGraphDestroyNode", e));
        }
    }
    Ok(graph)
}

/// The graph's numbers of nodes and edges (the graph is destroyed on an error).
fn graph_size(
    st: &InstanceState,
    gctx: &GpuCtx<'_, '_>,
    graph: driver::CudaGraph,
) -> GpuResult<(driver::CudaGraph, usize, usize)> {
    let ctx = gctx.b.ctx;
    let drv = |call: &str, e| capture_error(st, None, gctx.fail_call(call, e).to_string());
    let counted = driver::graph_node_count(ctx, &graph);
    let nodes = match counted {
        Ok(n) => n,
        Err(e) => {
            let _ = graph.destroy(ctx);
            return Err(drv("cuGraphGetNodes", e));
        }
    };
    let edges = match driver::graph_edge_count(ctx, &graph) {
        Ok(n) => n,
        Err(e) => {
            let _ = graph.destroy(ctx);
            return Err(drv("cuGraphGetEdges", e));
        }
    };
    Ok((graph, nodes, edges))
}

/// Updates the segment's executable in place from `graph` (re-instantiated where the driver
/// refuses), or instantiates one (none for an empty graph); destroys the graph.
fn install_exec(
    st: &InstanceState,
    gctx: &GpuCtx<'_, '_>,
    seg: &mut SegState,
    graph: driver::CudaGraph,
    nodes: usize,
    stats: &mut ReplayStats,
) -> GpuResult<()> {
    let ctx = gctx.b.ctx;
    let drv = |call: &str, e| capture_error(st, None, gctx.fail_call(call, e).to_string());
    let device = &seg.slot.device;
    let old = seg.slot.take();
    let made: GpuResult<Option<GraphExec>> = if nodes == 0 {
        if let Some(e) = old {
            device.destroy_exec(ctx, e);
        }
        Ok(None)
    } else {
        let updated = match old {
            Some(mut e) => {
                let t = Instant::now();
                let r = driver::graph_exec_update(ctx, &mut e, &graph);
                stats.update_time = t.elapsed();
                match r {
                    Ok(true) => {
                        stats.updates = 1;
                        Some(e)
                    }
                    Ok(false) | Err(_) => {
                        stats.update_fallbacks = 1;
                        device.destroy_exec(ctx, e);
                        None
                    }
                }
            }
            None => None,
        };
        match updated {
            Some(e) => Ok(Some(e)),
            None => {
                let t = Instant::now();
                let r = driver::graph_instantiate(ctx, &graph);
                stats.instantiate_time = t.elapsed();
                stats.instantiations = 1;
                r.map(|e| {
                    device.exec_created();
                    Some(e)
                })
                .map_err(|e| drv("cuGraphInstantiateWithFlags", e))
            }
        }
    };
    let _ = graph.destroy(ctx);
    let exec = made?;
    if let Some(e) = exec {
        *seg.slot.exec.lock().unwrap_or_else(|e| e.into_inner()) = Some(e);
        st.shared.execs.fetch_add(1, Ordering::Relaxed);
    }
    Ok(())
}
