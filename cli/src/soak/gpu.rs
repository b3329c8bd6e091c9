//! The soak's GPU side (`--gpu`): a GPU pool of device 0 whose workers load the built-in kernels
//! through cudarc at start, and the GPU scenario: a random DAG of GPU nodes (spin, set, add on
//! one-element device buffers), half of them through cudarc's types, at times with a node made
//! to fail or panic; the sinks and one other node downloaded and checked, and every buffer
//! dropped on the submitter's thread.

use std::process::ExitCode;
use std::sync::Arc;

use boundpool::gpu::cudarc::driver::{CudaFunction, LaunchConfig as CuLaunch, PushKernelArg};
use boundpool::gpu::cudarc::nvrtc::Ptx;
use boundpool::gpu::{
    builtin, DeviceBuffer, Devices, GpuCtx, GpuDevice, GpuError, GpuGraphBuilder, GpuGraphExt,
    GpuPool, GpuPoolBuilder, Kernel, LaunchConfig, Module,
};
use boundpool::{BoxError, ErrorKind, NodeRef};

use super::graphs::{Fault, Rng, Shape, PANIC_TAG};
use super::tally::{check_failure, Tally};
use super::SoakArgs;
use crate::gpu_pool::{self, DeviceSplit};

/// What the GPU scenario needs.
pub(super) struct GpuSide {
    pub(super) pool: GpuPool,
    pub(super) device: GpuDevice,
    kernels: Arc<(Kernel, Kernel, Kernel)>,
}

/// The GPU side of `a`: its pool (`threads` workers, or `--partitions`' on device 0), the
/// built-in kernels, and one graph run before anything is counted (the driver starts threads
/// of its own and loads the module lazily, and those belong to the levels the soak starts
/// from). What each SM partition got is printed unless `--json`.
pub(super) fn start(a: &SoakArgs, threads: usize) -> Result<(GpuSide, Vec<DeviceSplit>), ExitCode> {
    if let Some(why) = boundpool::gpu::gpu_unavailable_reason() {
        eprintln!("boundpool soak: --gpu, but no GPU: {why}");
        return Err(ExitCode::from(2));
    }
    let b = GpuPoolBuilder::new()
        .name("soak-gpu")
        .devices(Devices::List(vec![0]))
        .workers_per_device(threads)
        .worker_state(|s| -> Result<CudarcKernels, BoxError> {
            let m = s.context().load_module(Ptx::from_src(builtin::PTX))?;
            Ok(CudarcKernels {
                set: m.load_function(builtin::SET_I64)?,
                add: m.load_function(builtin::ADD_I64)?,
                spin: m.load_function(builtin::SPIN)?,
            })
        });
    // With --partitions, the partitions' workers; the nodes are still placed on the device.
    let partitions = a.part.list();
    let b = if partitions.is_empty() {
        b
    } else {
        b.sm_partitions(partitions)
    };
    let pool = b.build().map_err(|e| {
        eprintln!("boundpool soak: the GPU pool did not start: {e}");
        gpu_pool::build_failure(&e)
    })?;
    let splits = gpu_pool::splits(&pool);
    if !a.json {
        gpu_pool::print_lines(&splits);
    }
    let device = pool.devices()[0].clone();
    let m = Module::builtin();
    let kernels = (|| {
        Ok::<_, GpuError>((
            m.kernel(builtin::SET_I64)?,
            m.kernel(builtin::ADD_I64)?,
            m.kernel(builtin::SPIN)?,
        ))
    })()
    .map_err(|e| {
        eprintln!("boundpool soak: the built-in kernels did not load: {e}");
        ExitCode::from(1)
    })?;
    let side = GpuSide {
        pool,
        device,
        kernels: Arc::new(kernels),
    };
    if let Err(e) = warm_up(&side) {
        eprintln!("boundpool soak: the GPU warm-up failed: {e}");
        return Err(ExitCode::from(1));
    }
    Ok((side, splits))
}

/// The built-in kernels as cudarc functions, loaded by each worker of the soak's GPU pool.
struct CudarcKernels {
    set: CudaFunction,
    add: CudaFunction,
    spin: CudaFunction,
}

/// As [`spin_set_add`], through cudarc: its launches (`launch_builder` on the node's stream) and
/// allocation (`alloc_zeros`), the slice adopted into a `DeviceBuffer` to leave the node.
fn spin_set_add_cudarc(
    ctx: &GpuCtx<'_, '_>,
    cycles: i64,
    value: i64,
    inputs: &[NodeRef<DeviceBuffer<i64>>],
) -> Result<DeviceBuffer<i64>, BoxError> {
    let k = ctx.state::<CudarcKernels>()?;
    let s = ctx.stream();
    let one = CuLaunch {
        grid_dim: (1, 1, 1),
        block_dim: (1, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut out = s.alloc_zeros::<i64>(1)?;
    // SAFETY: the built-in kernels get the argument types they declare (bp_spin(i64),
    // bp_set_i64(i64*, i64), bp_add_i64(i64*, const i64*)); the inputs are node outputs, which
    // outlive the graph's GPU work, and `out` is adopted below (freed after the node's work).
    unsafe {
        s.launch_builder(&k.spin).arg(&cycles).launch(one)?;
        s.launch_builder(&k.set)
            .arg(&mut out)
            .arg(&value)
            .launch(one)?;
        for p in inputs {
            let src: &DeviceBuffer<i64> = ctx.input(*p)?;
            s.launch_builder(&k.add)
                .arg(&mut out)
                .arg(src.as_cuda_slice())
                .launch(one)?;
        }
    }
    Ok(ctx.adopt(out)?)
}

/// One GPU node: spin, then a new one-element buffer set to `value` plus each input's.
fn spin_set_add(
    ctx: &GpuCtx<'_, '_>,
    (set, add, spin): &(Kernel, Kernel, Kernel),
    cycles: i64,
    value: i64,
    inputs: &[NodeRef<DeviceBuffer<i64>>],
) -> Result<DeviceBuffer<i64>, BoxError> {
    let mut out = ctx.alloc::<i64>(1)?;
    // SAFETY: the built-in kernels get the argument types they declare (bp_spin(i64),
    // bp_set_i64(i64*, i64), bp_add_i64(i64*, const i64*)); the buffers are node outputs, which
    // outlive the graph's GPU work.
    unsafe {
        ctx.launch(spin, LaunchConfig::single())
            .arg(cycles)
            .launch()?;
        ctx.launch(set, LaunchConfig::single())
            .arg(&mut out)
            .arg(value)
            .launch()?;
        for p in inputs {
            let src: &DeviceBuffer<i64> = ctx.input(*p)?;
            ctx.launch(add, LaunchConfig::single())
                .arg(&mut out)
                .arg(src)
                .launch()?;
        }
    }
    Ok(out)
}

/// A random DAG of GPU nodes, at times with a node made to fail or panic.
pub(super) fn scenario(rng: &mut Rng, what: &str, gpu: &GpuSide, tally: &Tally) {
    let shape = Shape::random(rng, 16);
    let fault = match rng.below(10) {
        0 => Some((Fault::Error, rng.below(shape.len() as u64) as usize)),
        1 => Some((Fault::Panic, rng.below(shape.len() as u64) as usize)),
        _ => None,
    };
    let mut g = GpuGraphBuilder::new("gpu");
    let mut refs: Vec<NodeRef<DeviceBuffer<i64>>> = Vec::with_capacity(shape.len());
    for i in 0..shape.len() {
        let inputs: Vec<_> = shape.preds[i].iter().map(|&p| refs[p as usize]).collect();
        let value = shape.base[i] as i64;
        let cycles = rng.below(2_000) as i64;
        let kernels = gpu.kernels.clone();
        let f = fault.and_then(|(f, at)| (at == i).then_some(f));
        // Half the nodes through cudarc's types (the same kernels, loaded by cudarc).
        let cudarc = rng.below(2) == 0;
        if cudarc {
            Tally::add(&tally.cudarc_nodes, 1);
        }
        let r = g.gpu_node(&gpu.device, &format!("n{i}"), move |ctx| {
            match f {
                Some(Fault::Error) => return Err(format!("injected error in n{i}").into()),
                Some(Fault::Panic) => panic!("{PANIC_TAG} in n{i}"),
                None => {}
            }
            if cudarc {
                spin_set_add_cudarc(ctx, cycles, value, &inputs)
            } else {
                spin_set_add(ctx, &kernels, cycles, value, &inputs)
            }
        });
        for &p in &shape.preds[i] {
            g.edge(refs[p as usize], r);
        }
        refs.push(r);
    }
    let g = g.build().expect("a soak graph is acyclic");
    Tally::add(&tally.nodes, shape.len() as u64);
    Tally::add(&tally.gpu_graphs, 1);
    let res = match gpu.pool.submit(&g) {
        Ok(h) => h.wait(),
        Err(e) => return tally.violation(format!("{what}: GPU submit failed: {e}")),
    };
    if let Some((f, at)) = fault {
        let (kind, counter) = match f {
            Fault::Error => (ErrorKind::NodeFailed, &tally.errors),
            Fault::Panic => (ErrorKind::NodePanicked, &tally.panics),
        };
        Tally::add(counter, 1);
        return check_failure(tally, what, res, kind, &[format!("n{at}")]);
    }
    let mut out = match res {
        Ok(out) => out,
        Err(e) => return tally.violation(format!("{what}: a fault-free GPU graph failed: {e}")),
    };
    // The sinks and one other node are downloaded; their host sums cover every node above them.
    let probe = rng.below(shape.len() as u64) as usize;
    let want = shape.expected();
    let mut buffers = Vec::new();
    for (i, &w) in want.iter().enumerate() {
        if !shape.is_sink(i) && i != probe {
            continue;
        }
        let Some(buf) = out.take(refs[i]) else {
            return tally.violation(format!("{what}: GPU node n{i} has no output"));
        };
        match gpu.pool.download(&buf) {
            Ok(v) if v == [w as i64] => {}
            Ok(v) => tally.violation(format!("{what}: GPU node n{i} gave {v:?}, expected {w}")),
            Err(e) => tally.violation(format!("{what}: downloading n{i}: {e}")),
        }
        buffers.push(buf);
    }
    // Every buffer (taken or still in the output) is dropped here, on the submitter's thread.
    Tally::add(&tally.foreign_buffer_drops, shape.len() as u64);
    drop(buffers);
    drop(out);
    Tally::add(&tally.ok, 1);
}

/// Runs one small GPU graph on every worker's stream and downloads its result.
fn warm_up(gpu: &GpuSide) -> Result<(), BoxError> {
    let workers = gpu.pool.pool().workers().len();
    let mut g = GpuGraphBuilder::new("warm-up");
    let refs: Vec<NodeRef<DeviceBuffer<i64>>> = (0..workers.max(1) * 2)
        .map(|i| {
            let kernels = gpu.kernels.clone();
            g.gpu_node(&gpu.device, &format!("w{i}"), move |ctx| {
                spin_set_add(ctx, &kernels, 1_000, i as i64, &[])
            })
        })
        .collect();
    let g = g.build()?;
    let mut out = gpu.pool.submit(&g)?.wait()?;
    for (i, r) in refs.iter().enumerate() {
        let buf = out.take(*r).ok_or("a warm-up node has no output")?;
        if gpu.pool.download(&buf)? != [i as i64] {
            return Err(format!("warm-up node w{i} gave a wrong value").into());
        }
    }
    Ok(())
}
