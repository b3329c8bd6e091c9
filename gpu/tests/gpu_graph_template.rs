//! `CudaGraphTemplate` and `CaptureExt`, the CUDA graph template calls cudarc lacks (the ones
//! the replay's capture makes, and the raw baselines of `boundpool-workloads`): a graph
//! built node by node, read (nodes, edges, kernel parameters, description), edited (a node
//! removed, a copy) and run; a DAG captured from one stream with its dependencies set, a root
//! removed, and run; each graph's work counted on the device. Run on a GPU machine with
//! `BOUNDPOOL_REQUIRE_GPU=1`.

use std::collections::HashSet;
use std::ffi::c_void;
use std::sync::Arc;

use boundpool_gpu::cudarc::driver::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
use boundpool_gpu::cudarc::driver::{
    result, sys, CudaFunction, CudaSlice, CudaStream, DevicePtr, LaunchConfig, PushKernelArg,
};
use boundpool_gpu::cudarc::nvrtc::Ptx;
use boundpool_gpu::{
    builtin, BoxError, CaptureExt, CudaGraphNode, CudaGraphTemplate, GpuCtx, GpuErrorKind, GpuPool,
};
use boundpool_test_support::{gpu_pool_builder, GpuTest};

/// Each worker's `bp_count(u32* counter)`, loaded at start (outside any capture).
struct Count(CudaFunction);

fn pool() -> GpuPool {
    gpu_pool_builder(1, 1)
        .name("graph-template")
        .worker_state(|s| {
            let m = s.context().load_module(Ptx::from_src(builtin::PTX))?;
            Ok(Count(m.load_function(builtin::COUNT)?))
        })
        .build()
        .expect("GPU pool")
}

/// Without a driver, `new` is an error saying so, not a panic; with one, an empty template
/// has no nodes and no edges (an empty array is an invalid argument to the driver: the
/// template must not pass one).
#[test]
fn empty_template_or_no_driver_error() {
    if let Some(why) = boundpool_gpu::gpu_unavailable_reason() {
        let e = CudaGraphTemplate::new().expect_err("no GPU: new must fail");
        assert!(
            matches!(e.kind(), GpuErrorKind::NoDriver | GpuErrorKind::NoDevice),
            "{e}"
        );
        // The guard skips visibly here, or fails under BOUNDPOOL_REQUIRE_GPU=1.
        assert!(
            GpuTest::start("empty_template_or_no_driver_error", 60).is_none(),
            "{why}"
        );
        return;
    }
    let Some(_t) = GpuTest::start("empty_template_or_no_driver_error", 60) else {
        return;
    };
    // On a bound worker, as the guard's context check asks of every GPU test.
    let p = pool();
    let d = p.devices()[0].clone();
    p.call(&d, |_| -> Result<(), BoxError> {
        let t = CudaGraphTemplate::new()?;
        assert_eq!(t.node_count()?, 0);
        assert_eq!(t.edge_count()?, 0);
        assert!(t.nodes()?.is_empty());
        assert!(t.edges()?.is_empty());
        assert!(t.describe(4)?.is_empty());
        let c = t.try_clone()?;
        assert_eq!(c.node_count()?, 0);
        Ok(())
    })
    .unwrap();
}

/// One thread: `bp_count` adds 1 per thread.
const ONE_THREAD: LaunchConfig = LaunchConfig {
    grid_dim: (1, 1, 1),
    block_dim: (1, 1, 1),
    shared_mem_bytes: 0,
};

/// The kernel node parameters of launching `f` with `cfg` and the arguments `args` points at.
fn node_params(
    f: &CudaFunction,
    cfg: LaunchConfig,
    args: &mut [*mut c_void],
) -> sys::CUDA_KERNEL_NODE_PARAMS {
    let ((gx, gy, gz), (bx, by, bz)) = (cfg.grid_dim, cfg.block_dim);
    sys::CUDA_KERNEL_NODE_PARAMS {
        func: f.cu_function(),
        gridDimX: gx,
        gridDimY: gy,
        gridDimZ: gz,
        blockDimX: bx,
        blockDimY: by,
        blockDimZ: bz,
        sharedMemBytes: cfg.shared_mem_bytes,
        kernelParams: args.as_mut_ptr(),
        extra: std::ptr::null_mut(),
        kern: std::ptr::null_mut(),
        ctx: std::ptr::null_mut(),
    }
}

/// Instantiates `t`, launches it once on `s` and waits for it.
fn run_once(t: &CudaGraphTemplate, s: &CudaStream) -> Result<(), BoxError> {
    // SAFETY: `t` is live while borrowed; the executable is destroyed below, after the stream
    // synchronise that waits for its one launch.
    unsafe {
        let exec = result::graph::instantiate(t.cu_graph(), sys::CUgraphInstantiate_flags(0))?;
        let launched = result::graph::launch(exec, s.cu_stream());
        let waited = s.synchronize();
        result::graph::exec_destroy(exec)?;
        launched?;
        waited?;
    }
    Ok(())
}

fn counter_value(counter: &CudaSlice<u32>, s: &Arc<CudaStream>) -> Result<u32, BoxError> {
    s.synchronize()?;
    Ok(s.clone_dtoh(counter)?[0])
}

/// A graph built node by node: `a`, then an empty node `e`, `b` after `e`, `c` after `a` and
/// `b` (three count kernels): read back as built, one kernel node's parameters naming the
/// count kernel, the empty node none; a copy with nodes of its own; `e` removed (its edges
/// with it); the graph and its copy run, each count kernel once per run.
fn built_node_by_node(g: &GpuCtx<'_, '_>) -> Result<(), BoxError> {
    let count = &g.state::<Count>()?.0;
    let s = g.context().new_stream()?;
    let counter = s.alloc_zeros::<u32>(1)?;
    let mut addr: u64 = counter.device_ptr(&s).0;
    let mut args = [(&mut addr as *mut u64).cast::<c_void>()];
    let p = node_params(count, ONE_THREAD, &mut args);
    let mut t = CudaGraphTemplate::new()?;
    // SAFETY: every dependency was added to `t` just before; `p` launches bp_count(u32*) with
    // one argument, the counter's address (alive until the end of this function, after every
    // run), from a module the worker keeps loaded.
    let (a, e, b, c) = unsafe {
        let a = t.add_kernel_node(&[], &p)?;
        let e = t.add_empty_node(&[a])?;
        let b = t.add_kernel_node(&[e], &p)?;
        let c = t.add_kernel_node(&[a, b], &p)?;
        (a, e, b, c)
    };
    assert_eq!(t.node_count()?, 4);
    assert_eq!(
        t.nodes()?,
        vec![a, e, b, c],
        "the driver's order is the order added"
    );
    assert_eq!(t.edge_count()?, 4);
    let edges: HashSet<(CudaGraphNode, CudaGraphNode)> = t.edges()?.into_iter().collect();
    assert_eq!(edges, HashSet::from([(a, e), (e, b), (a, c), (b, c)]));
    let lines = t.describe(8)?;
    assert_eq!(lines.len(), 4, "{lines:?}");
    assert!(
        lines[0].starts_with("CU_GRAPH_NODE_TYPE_KERNEL func=")
            && lines[0].contains("grid=1x1x1 block=1x1x1 smem=0"),
        "{lines:?}"
    );
    assert_eq!(lines[1], "CU_GRAPH_NODE_TYPE_EMPTY", "{lines:?}");
    assert!(
        lines.iter().all(|l| !l.contains("=err")),
        "the description reads only attributes the driver reports for graph nodes: {lines:?}"
    );
    assert_eq!(t.describe(2)?.len(), 2);
    // SAFETY: `a` and `e` are nodes `t` holds.
    let (pa, pe) = unsafe { (t.kernel_node_params(a)?, t.kernel_node_params(e)?) };
    let pa = pa.expect("a kernel node has parameters");
    assert_eq!(pa.func, count.cu_function());
    assert_eq!((pa.gridDimX, pa.blockDimX), (1, 1));
    assert!(pe.is_none(), "an empty node has no kernel parameters");

    let copy = t.try_clone()?;
    assert_eq!((copy.node_count()?, copy.edge_count()?), (4, 4));
    let mine: HashSet<CudaGraphNode> = t.nodes()?.into_iter().collect();
    assert!(copy.nodes()?.iter().all(|n| !mine.contains(n)));

    // SAFETY: `e` is a node `t` holds; not used after.
    unsafe { t.remove_node(e)? };
    assert_eq!(t.nodes()?, vec![a, b, c]);
    let edges: HashSet<(CudaGraphNode, CudaGraphNode)> = t.edges()?.into_iter().collect();
    assert_eq!(edges, HashSet::from([(a, c), (b, c)]));

    run_once(&t, &s)?;
    assert_eq!(counter_value(&counter, &s)?, 3, "three count kernels ran");
    run_once(&copy, &s)?;
    assert_eq!(counter_value(&counter, &s)?, 6, "the copy's three ran too");
    Ok(())
}

/// Launches bp_count on `s` (captured when `s` captures).
fn launch_count(
    s: &CudaStream,
    count: &CudaFunction,
    counter: &mut CudaSlice<u32>,
) -> Result<(), BoxError> {
    // SAFETY: bp_count(u32* counter), one thread, on a live one-element buffer.
    unsafe {
        s.launch_builder(count).arg(counter).launch(ONE_THREAD)?;
    }
    Ok(())
}

/// What [`capture_fan_in`] read during its capture.
struct Read {
    first: Vec<CudaGraphNode>,
    second: Vec<CudaGraphNode>,
    root: CudaGraphNode,
    joined: Vec<CudaGraphNode>,
}

/// Captured on `s`: `k1`; `k2` after a root of its own (not after `k1`); `k3` after both.
fn capture_fan_in(
    s: &CudaStream,
    count: &CudaFunction,
    counter: &mut CudaSlice<u32>,
) -> Result<Read, BoxError> {
    launch_count(s, count, counter)?;
    let first = s.capture_dependencies()?;
    let root = s.add_capture_root()?;
    // SAFETY: `root` was just added to this capture's graph.
    unsafe { s.set_capture_dependencies(&[root])? };
    launch_count(s, count, counter)?;
    let second = s.capture_dependencies()?;
    let both: Vec<CudaGraphNode> = first.iter().chain(&second).copied().collect();
    // SAFETY: both tails were read back from this capture.
    unsafe { s.set_capture_dependencies(&both)? };
    launch_count(s, count, counter)?;
    let joined = s.capture_dependencies()?;
    Ok(Read {
        first,
        second,
        root,
        joined,
    })
}

/// A DAG captured from one stream: the tails read back, the dependencies set, a root added;
/// the template as captured (4 nodes, 3 edges), then without the root (3 kernels, 2 edges), run
/// once.
fn captured_from_one_stream(g: &GpuCtx<'_, '_>) -> Result<(), BoxError> {
    let count = &g.state::<Count>()?.0;
    let s = g.context().new_stream()?;
    let mut counter = s.alloc_zeros::<u32>(1)?;
    s.synchronize()?;
    s.begin_capture(CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
    let read = capture_fan_in(&s, count, &mut counter);
    let ended = s.end_capture_template();
    let read = read?;
    let mut t = ended?.expect("the capture made a graph");
    assert_eq!(read.first.len(), 1);
    assert_eq!(read.second.len(), 1);
    assert_eq!(read.joined.len(), 1);
    assert_ne!(read.first, read.second);
    let kernels = [read.first[0], read.second[0], read.joined[0]];
    let nodes: HashSet<CudaGraphNode> = t.nodes()?.into_iter().collect();
    assert_eq!(
        nodes,
        HashSet::from([kernels[0], kernels[1], kernels[2], read.root])
    );
    let edges: HashSet<(CudaGraphNode, CudaGraphNode)> = t.edges()?.into_iter().collect();
    let want = [
        (read.root, kernels[1]),
        (kernels[0], kernels[2]),
        (kernels[1], kernels[2]),
    ];
    assert_eq!(edges, HashSet::from(want));
    // SAFETY: the root is a node of the captured graph, `t`.
    unsafe { t.remove_node(read.root)? };
    assert_eq!((t.node_count()?, t.edge_count()?), (3, 2));
    for n in kernels {
        // SAFETY: each is a node `t` holds.
        let p = unsafe { t.kernel_node_params(n)? };
        assert_eq!(p.map(|p| p.func), Some(count.cu_function()));
    }
    assert_eq!(counter_value(&counter, &s)?, 0, "captured, not run");
    run_once(&t, &s)?;
    assert_eq!(counter_value(&counter, &s)?, 3);
    Ok(())
}

/// A stream that is not capturing refuses the end of a capture and a dependency set, naming
/// the call. Apart from the other cases: the driver's refusals are API errors that
/// compute-sanitizer reports, so the device scripts run memcheck over the others only.
#[test]
fn capture_calls_on_a_stream_not_capturing_are_refused() {
    let Some(_t) = GpuTest::start("capture_calls_on_a_stream_not_capturing_are_refused", 60) else {
        return;
    };
    let p = pool();
    let d = p.devices()[0].clone();
    p.call(&d, |g| -> Result<(), BoxError> {
        let s = g.context().new_stream()?;
        let e = s.end_capture_template().expect_err("not capturing");
        assert!(e.to_string().contains("cuStreamEndCapture"), "{e}");
        // SAFETY: no nodes.
        let e = unsafe { s.set_capture_dependencies(&[]) }.expect_err("not capturing");
        assert!(
            e.to_string().contains("cuStreamUpdateCaptureDependencies"),
            "{e}"
        );
        Ok(())
    })
    .unwrap();
}

/// Both cases in one test, on one pool, one after the other: a capture in thread-local mode
/// is still invalidated by a device-wide synchronise from any thread (another test's pool
/// starting or stopping, in parallel).
#[test]
fn template_built_or_captured_is_read_edited_and_run() {
    let Some(_t) = GpuTest::start("template_built_or_captured_is_read_edited_and_run", 120) else {
        return;
    };
    let p = pool();
    let d = p.devices()[0].clone();
    p.call(&d, built_node_by_node).unwrap();
    p.call(&d, captured_from_one_stream).unwrap();
}
