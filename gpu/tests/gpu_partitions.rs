//! SM partitions: a device split into green-context partitions, each a worker group whose work
//! runs on its SMs only. Which SMs ran a kernel is read from the blocks themselves (`%smid`),
//! for nodes, for cudarc code in a node, for a cuBLAS call's neighbours and for a replayed
//! graph (captured on the partition's stream, its executable keeps the partition). The guard's
//! context check also counts work enqueued on another partition's stream as wrong. Run on a
//! GPU machine with `BOUNDPOOL_REQUIRE_GPU=1`.

use std::sync::Arc;

use boundpool_gpu::cudarc::cublas::{sys::cublasOperation_t, Gemm, GemmConfig};
use boundpool_gpu::cudarc::driver::{sys, LaunchConfig as CudarcLaunch, PushKernelArg};
use boundpool_gpu::{
    BoxError, DeviceBuffer, Devices, GpuCtx, GpuDevice, GpuErrorKind, GpuGraphBuilder, GpuGraphExt,
    GpuPool, GpuPoolBuilder, Kernel, LaunchConfig, Module, Priority, ReplayBuilder, SmPartition,
};
use boundpool_test_support::GpuTest;

/// Each block's first thread marks its SM; every thread then spins `spin` cycles, so that a
/// grid of many blocks spreads over every SM it may use.
const SMID_SRC: &str = r#"
extern "C" __global__ void bp_smid(unsigned int* seen, long long spin) {
    unsigned int id;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
    if (threadIdx.x == 0 && id < 1024) seen[id] = 1;
    long long t0 = clock64();
    while (clock64() - t0 < spin) {}
}
"#;

/// Marks for up to 1024 SMs.
const MARKS: usize = 1024;

/// Blocks of a launch: several per SM of the largest device.
const BLOCKS: u32 = 1056;

fn smid_kernel() -> Kernel {
    Module::from_cuda_source("smid", SMID_SRC)
        .unwrap()
        .kernel("bp_smid")
        .unwrap()
}

/// 8 SMs for `lat` (one worker), the rest for `bulk` (two workers).
fn partitioned_pool() -> GpuPool {
    GpuPoolBuilder::new()
        .name("parts")
        .devices(Devices::List(vec![0]))
        .sm_partitions(vec![
            SmPartition::new("lat", 8),
            SmPartition::rest("bulk").workers(2),
        ])
        .build()
        .expect("partitioned GPU pool")
}

/// Launches the SM-id kernel over `BLOCKS` blocks into a new zeroed buffer of marks.
fn mark_sms(ctx: &GpuCtx<'_, '_>, k: &Kernel) -> Result<DeviceBuffer<u32>, BoxError> {
    mark_sms_spinning(ctx, k, 20_000)
}

/// As [`mark_sms`], each thread spinning `spin` cycles.
fn mark_sms_spinning(
    ctx: &GpuCtx<'_, '_>,
    k: &Kernel,
    spin: i64,
) -> Result<DeviceBuffer<u32>, BoxError> {
    let mut seen = ctx.alloc_zeros::<u32>(MARKS)?;
    let cfg = LaunchConfig {
        grid: (BLOCKS, 1, 1),
        block: (64, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: `bp_smid` takes (unsigned int*, long long); `seen` has MARKS elements.
    unsafe { ctx.launch(k, cfg).arg(&mut seen).arg(spin).launch()? };
    Ok(seen)
}

fn count(marks: &[u32]) -> u32 {
    marks.iter().filter(|&&m| m != 0).count() as u32
}

/// The device's SM count, read in a node.
fn device_sms(pool: &GpuPool, d: &GpuDevice) -> u32 {
    pool.call(d, |ctx| {
        Ok(ctx
            .context()
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?
            as u32)
    })
    .unwrap()
}

#[test]
fn partitions_report_the_sizes_the_driver_gave_and_their_groups() {
    let Some(_t) = GpuTest::start(
        "partitions_report_the_sizes_the_driver_gave_and_their_groups",
        120,
    ) else {
        return;
    };
    let pool = partitioned_pool();
    let d = pool.devices()[0].clone();
    let total = device_sms(&pool, &d);
    let parts = d.partitions();
    assert_eq!(parts.len(), 2);
    assert_eq!((parts[0].name.as_str(), parts[0].sms), ("lat", 8));
    assert_eq!(parts[1].name, "bulk");
    assert_eq!(total, d.info().sms);
    assert_eq!(
        parts[1].sms + d.unused_sms(),
        total - 8,
        "the rest has every SM the first left but a remainder the driver keeps apart"
    );
    assert!(
        d.unused_sms() < 8,
        "at most a remainder under one group is unused"
    );
    assert_eq!((parts[0].workers, parts[1].workers), (1, 2));
    assert_ne!(parts[0].group, parts[1].group);
    assert_eq!(d.groups(), &[parts[0].group, parts[1].group]);
    let lat = d.on_partition("lat").unwrap();
    assert_eq!(lat.placement(), parts[0].placement());
    assert!(d.on_partition("nope").is_none());
    // Without a rest partition, the SMs left are reported unused.
    drop(pool);
    let pool = GpuPoolBuilder::new()
        .name("parts-unused")
        .devices(Devices::List(vec![0]))
        .sm_partitions(vec![SmPartition::new("a", 16), SmPartition::new("b", 8)])
        .build()
        .unwrap();
    let d = &pool.devices()[0];
    assert_eq!(d.unused_sms(), total - 24);
    assert_eq!(
        d.partitions().iter().map(|p| p.sms).collect::<Vec<_>>(),
        [16, 8]
    );
}

#[test]
fn a_partition_runs_its_nodes_own_and_cudarc_work_on_its_sms_only() {
    let Some(_t) = GpuTest::start(
        "a_partition_runs_its_nodes_own_and_cudarc_work_on_its_sms_only",
        120,
    ) else {
        return;
    };
    let pool = partitioned_pool();
    let d = pool.devices()[0].clone();
    let (lat, bulk) = (
        d.on_partition("lat").unwrap(),
        d.on_partition("bulk").unwrap(),
    );
    let bulk_sms = d.partition("bulk").unwrap().sms;
    let k = Arc::new(smid_kernel());
    let mut g = GpuGraphBuilder::new("where");
    let k1 = k.clone();
    let on_lat = g.gpu_node(&lat, "on_lat", move |c| mark_sms(c, &k1));
    let k2 = k.clone();
    let on_bulk = g.gpu_node(&bulk, "on_bulk", move |c| mark_sms(c, &k2));
    // cudarc code in a node: its own module, launched through cudarc's builder on the
    // node's stream. The module's load and unload (at the body's end) go outside any other
    // graph's capture, as the crate docs ask (a replay test of this binary may be capturing).
    let via_cudarc = g.gpu_node(&lat, "via_cudarc", move |c| {
        let ptx = boundpool_gpu::cudarc::nvrtc::compile_ptx(SMID_SRC)?;
        let seen = c.outside_captures(|| -> Result<_, BoxError> {
            let m = c.context().load_module(ptx)?;
            let f = m.load_function("bp_smid")?;
            let stream = c.stream();
            let mut seen = stream.alloc_zeros::<u32>(MARKS)?;
            let spin = 20_000i64;
            let cfg = CudarcLaunch {
                grid_dim: (BLOCKS, 1, 1),
                block_dim: (64, 1, 1),
                shared_mem_bytes: 0,
            };
            let mut launch = stream.launch_builder(&f);
            launch.arg(&mut seen).arg(&spin);
            // SAFETY: `bp_smid` takes (unsigned int*, long long).
            unsafe { launch.launch(cfg)? };
            Ok(seen)
        })?;
        Ok(c.adopt(seen)?)
    });
    // An edge between partitions (an event wait), and a download on the bulk side.
    let read = g.gpu_node(&bulk, "read", move |c| {
        Ok([
            c.download(c.input(on_lat)?)?,
            c.download(c.input(on_bulk)?)?,
            c.download(c.input(via_cudarc)?)?,
        ])
    });
    g.edge(on_lat, read);
    g.edge(on_bulk, read);
    g.edge(via_cudarc, read);
    let out = pool.submit(&g.build().unwrap()).unwrap().wait().unwrap();
    let [lat_marks, bulk_marks, cudarc_marks] = out.get(read).unwrap();
    assert_eq!(
        count(lat_marks),
        8,
        "a node on 'lat' ran on exactly its 8 SMs"
    );
    assert_eq!(
        count(cudarc_marks),
        8,
        "cudarc's launch on the node's stream too"
    );
    let b = count(bulk_marks);
    assert!(
        b > 8 && b <= bulk_sms,
        "a node on 'bulk' ran on {b} SMs (of its {bulk_sms})"
    );
    let disjoint = lat_marks
        .iter()
        .zip(bulk_marks)
        .all(|(a, b)| !(*a != 0 && *b != 0));
    assert!(disjoint, "no SM ran both partitions' kernels");
    drop(out);
    pool.shutdown(boundpool_gpu::ShutdownMode::Finish);
    assert_eq!(d.live_allocations(), 0, "every buffer released at shutdown");
}

#[test]
fn a_replayed_graph_keeps_its_partition_and_library_calls_run_there() {
    let Some(_t) = GpuTest::start(
        "a_replayed_graph_keeps_its_partition_and_library_calls_run_there",
        120,
    ) else {
        return;
    };
    let pool = partitioned_pool();
    let d = pool.devices()[0].clone();
    let lat = d.on_partition("lat").unwrap();
    let k = Arc::new(smid_kernel());
    let mut b = ReplayBuilder::new("replayed-on-lat");
    let k1 = k.clone();
    let marks = b.gpu_node(&lat, "marks", move |c| mark_sms(c.gpu()?, &k1));
    // A cuBLAS GEMM in the captured graph, on the partition's stream.
    let gemm = b.gpu_node(&lat, "gemm", move |c| {
        let g = c.gpu()?;
        let n = 64usize;
        let a = g.upload(&vec![1.0f32; n * n])?;
        let mut y = g.alloc_zeros::<f32>(n * n)?;
        let cfg = GemmConfig {
            transa: cublasOperation_t::CUBLAS_OP_N,
            transb: cublasOperation_t::CUBLAS_OP_N,
            m: n as i32,
            n: n as i32,
            k: n as i32,
            alpha: 1.0f32,
            lda: n as i32,
            ldb: n as i32,
            beta: 0.0,
            ldc: n as i32,
        };
        // SAFETY: three n×n column-major matrices.
        unsafe {
            g.cublas()?
                .gemm(cfg, a.as_cuda_slice(), a.as_cuda_slice(), &mut y)?
        };
        Ok((a, y))
    });
    let read = b.eager_gpu_node(&lat, "read", move |c| {
        let g = c.gpu()?;
        Ok((
            g.download(&*c.input(marks)?)?,
            g.download(&c.input(gemm)?.1)?,
        ))
    });
    b.edge(marks, read);
    b.edge(gemm, read);
    let graph = b.build().unwrap();
    for run in 0..5 {
        let out = graph.run(&pool).unwrap();
        let (m, y) = &*out.get(read).unwrap();
        assert_eq!(
            count(m),
            8,
            "run {run}: the replayed kernel ran on the 8 SMs of 'lat'"
        );
        assert!(y.iter().all(|&v| v == 64.0), "run {run}: the GEMM's result");
    }
    let stats = graph.stats();
    assert_eq!(
        stats.captures, 1,
        "captured once, replayed after: {stats:?}"
    );
}

#[test]
fn sizes_the_device_cannot_give_fail_the_build_naming_the_partition() {
    let Some(_t) = GpuTest::start_without_context_check(
        "sizes_the_device_cannot_give_fail_the_build_naming_the_partition",
        60,
    ) else {
        return;
    };
    let build = |parts: Vec<SmPartition>| {
        GpuPoolBuilder::new()
            .name("bad-parts")
            .devices(Devices::List(vec![0]))
            .sm_partitions(parts)
            .build()
            .map(|_| ())
            .unwrap_err()
    };
    let e = build(vec![SmPartition::new("tiny", 4)]);
    assert_eq!(e.kind(), GpuErrorKind::Partition);
    assert!(
        e.to_string().contains("'tiny' asks for 4 SMs") && e.to_string().contains("at least"),
        "{e}"
    );
    let e = build(vec![SmPartition::new("huge", 4096)]);
    assert!(e.to_string().contains("ask for 4096 SMs"), "{e}");
    let e = build(vec![SmPartition::new("x", 8), SmPartition::new("x", 8)]);
    assert!(e.to_string().contains("'x' is named twice"), "{e}");
    let e = GpuPoolBuilder::new()
        .devices(Devices::List(vec![0]))
        .groups_per_device(2)
        .sm_partitions(vec![SmPartition::new("a", 8)])
        .build()
        .map(|_| ())
        .unwrap_err();
    assert_eq!(e.kind(), GpuErrorKind::InvalidArgument, "{e}");
}

#[test]
fn the_timeline_names_each_partition_s_workers_and_streams() {
    let Some(_t) = GpuTest::start(
        "the_timeline_names_each_partition_s_workers_and_streams",
        60,
    ) else {
        return;
    };
    let pool = GpuPoolBuilder::new()
        .name("parts-trace")
        .devices(Devices::List(vec![0]))
        .sm_partitions(vec![SmPartition::new("lat", 8), SmPartition::rest("bulk")])
        .trace(true)
        .build()
        .unwrap();
    let d = pool.devices()[0].clone();
    let k = Arc::new(smid_kernel());
    let mut g = GpuGraphBuilder::new("traced");
    for part in ["lat", "bulk"] {
        let (dev, k) = (d.on_partition(part).unwrap(), k.clone());
        g.gpu_node(&dev, part, move |c| mark_sms(c, &k));
    }
    pool.submit(&g.build().unwrap()).unwrap().wait().unwrap();
    let trace = pool.take_trace();
    let names: Vec<&str> = trace.tracks.iter().map(|t| t.name.as_str()).collect();
    for part in ["lat", "bulk"] {
        assert!(
            names.iter().any(|n| n.contains(&format!("gpu0.{part}"))),
            "a worker track of partition {part}: {names:?}"
        );
        assert!(
            names
                .iter()
                .any(|n| n.contains(&format!("partition {part} stream"))),
            "a stream track of partition {part}: {names:?}"
        );
    }
}

#[test]
fn every_priority_level_of_a_partition_s_workers_runs_on_its_sms() {
    let Some(_t) = GpuTest::start(
        "every_priority_level_of_a_partition_s_workers_runs_on_its_sms",
        60,
    ) else {
        return;
    };
    let pool = partitioned_pool();
    let d = pool.devices()[0].clone();
    let lat = d.on_partition("lat").unwrap();
    let k = Arc::new(smid_kernel());
    let mut g = GpuGraphBuilder::new("levels");
    let mut nodes = Vec::new();
    for level in [Priority::High, Priority::Normal, Priority::Low] {
        let k = k.clone();
        let n = g.gpu_node(&lat, &format!("{level:?}"), move |c| {
            Ok((c.node().priority(), c.download(&mark_sms(c, &k)?)?))
        });
        g.node_priority(n, level);
        nodes.push(n);
    }
    let out = pool.submit(&g.build().unwrap()).unwrap().wait().unwrap();
    for n in nodes {
        let (level, marks) = out.get(n).unwrap();
        assert_eq!(
            count(marks),
            8,
            "a {level:?} node on 'lat' ran on its 8 SMs"
        );
    }
}

/// `ReplayBuilder::host_node_on`: a host node placed on a partition runs on that partition's
/// workers only, eager and replayed, however many are ready at once; a plain host node may
/// run on any worker.
#[test]
fn host_nodes_on_a_partition_run_on_its_workers_only() {
    let Some(_t) = GpuTest::start("host_nodes_on_a_partition_run_on_its_workers_only", 120) else {
        return;
    };
    let pool = partitioned_pool();
    let d = pool.devices()[0].clone();
    let parts = d.partitions();
    let (lat_group, bulk_group) = (parts[0].group, parts[1].group);
    let (lat, bulk) = (
        d.on_partition("lat").unwrap(),
        d.on_partition("bulk").unwrap(),
    );
    let mut b = ReplayBuilder::new("host nodes placed");
    let group_of = |c: &boundpool_gpu::ReplayCtx<'_, '_>| Ok(c.node().worker_info().group);
    // Eight of each, all ready at once, so that idle workers of the other group would take
    // some if they could.
    let on_bulk: Vec<_> = (0..8)
        .map(|i| b.host_node_on(&bulk, &format!("bulk {i}"), group_of))
        .collect();
    let on_lat: Vec<_> = (0..8)
        .map(|i| b.host_node_on(&lat, &format!("lat {i}"), group_of))
        .collect();
    let marks = b.gpu_node(&lat, "marks", |c| Ok(c.gpu()?.alloc_zeros::<u32>(4)?));
    let after = b.host_node_on(&bulk, "after the segment", group_of);
    b.edge(marks, after);
    let graph = b.build().unwrap();
    for run in 0..6 {
        let out = if run % 2 == 0 {
            graph.run(&pool).unwrap()
        } else {
            graph.run_eager(&pool).unwrap()
        };
        for n in on_bulk.iter().chain([&after]) {
            assert_eq!(*out.get(*n).unwrap(), bulk_group, "run {run}");
        }
        for n in &on_lat {
            assert_eq!(*out.get(*n).unwrap(), lat_group, "run {run}");
        }
    }
}

/// A host node placed on a device's workers (here a partition's: `GraphBuilder::place`, as
/// `ReplayBuilder::host_node_on` does) is still a host successor: it runs once its GPU
/// predecessor's work is done, and reads what that work copied to pinned memory (a kernel of
/// a few milliseconds, then the copy). Before GPU nodes were marked as such, a node placed on
/// a device counted as a GPU successor, and ran as soon as the work was enqueued.
#[test]
fn a_host_node_placed_on_a_device_waits_for_its_gpu_predecessors_work() {
    let Some(_t) = GpuTest::start(
        "a_host_node_placed_on_a_device_waits_for_its_gpu_predecessors_work",
        120,
    ) else {
        return;
    };
    let pool = partitioned_pool();
    let d = pool.devices()[0].clone();
    let lat = d.on_partition("lat").unwrap();
    let k = Arc::new(smid_kernel());
    for run in 0..3 {
        let mut g = GpuGraphBuilder::new("host node after a slow kernel");
        let k1 = k.clone();
        let fill = g.gpu_node(&lat, "fill", move |ctx| {
            // A few milliseconds of work before the copy the host node reads.
            let seen = mark_sms_spinning(ctx, &k1, 2_000_000)?;
            let pinned = ctx.alloc_pinned::<u32>(MARKS)?;
            ctx.copy_to_pinned(&seen, &pinned)?;
            Ok((seen, pinned))
        });
        let read = g.node("read", move |node| {
            let out = node.input(fill)?;
            // SAFETY: a host node after the node whose work copies into the buffer.
            Ok(count(&unsafe { out.1.to_vec() }))
        });
        g.place(read, lat.placement()).edge(fill, read);
        let out = pool.submit(&g.build().unwrap()).unwrap().wait().unwrap();
        assert_eq!(
            out.get(read),
            Some(&8),
            "run {run}: the host node read the marks of the 8 SMs of 'lat'"
        );
    }
}
