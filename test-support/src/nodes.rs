//! Test pools on device 0, and the spin node's GPU work.

use boundpool_gpu::{
    builtin, BoxError, Cores, DeviceBuffer, Devices, GpuCtx, GpuPool, GpuPoolBuilder, Kernel,
    LaunchConfig, Module,
};

/// A pool builder on device 0 with `workers` workers in `groups` groups (name and every other
/// setting the builder's defaults), for a test to add its own settings to.
pub fn gpu_pool_builder(workers: usize, groups: usize) -> GpuPoolBuilder {
    GpuPoolBuilder::new()
        .devices(Devices::List(vec![0]))
        .workers_per_device(workers)
        .groups_per_device(groups)
}

/// [`gpu_pool_builder`] named `name`, built (panics if the pool does not start).
pub fn gpu_pool(name: &str, workers: usize, groups: usize) -> GpuPool {
    gpu_pool_builder(workers, groups)
        .name(name)
        .build()
        .expect("GPU pool")
}

/// [`gpu_pool`] with one (unpinned) host worker too.
pub fn gpu_pool_with_host(name: &str, workers: usize, groups: usize) -> GpuPool {
    gpu_pool_builder(workers, groups)
        .name(name)
        .host_workers(1, Cores::Unpinned)
        .build()
        .expect("GPU pool")
}

/// The replay tests' pool: `workers` workers on device 0 (one group) and one host worker.
pub fn replay_pool(workers: usize) -> GpuPool {
    gpu_pool_with_host("replay", workers, 1)
}

/// The built-in kernels `bp_set_i64`, `bp_add_i64` and `bp_spin`.
pub fn set_add_spin() -> (Kernel, Kernel, Kernel) {
    let m = Module::builtin();
    (
        m.kernel(builtin::SET_I64).unwrap(),
        m.kernel(builtin::ADD_I64).unwrap(),
        m.kernel(builtin::SPIN).unwrap(),
    )
}

/// A node body's GPU work: spin `cycles`, then a new one-element buffer set to `value` plus each
/// input's value. `inputs` is read lazily, one input before its add (after the spin and the set
/// are enqueued), as a body reading `ctx.input` in the loop would.
pub fn spin_set_add<'n, E>(
    ctx: &GpuCtx<'_, 'n>,
    (set, add, spin): (&Kernel, &Kernel, &Kernel),
    cycles: i64,
    value: i64,
    inputs: impl IntoIterator<Item = Result<&'n DeviceBuffer<i64>, E>>,
) -> Result<DeviceBuffer<i64>, BoxError>
where
    BoxError: From<E>,
{
    let mut out = ctx.alloc::<i64>(1)?;
    // SAFETY: kernels get the argument types they declare; buffers are node outputs, which
    // outlive the graph's GPU work.
    unsafe {
        ctx.launch(spin, LaunchConfig::single())
            .arg(cycles)
            .launch()?;
        ctx.launch(set, LaunchConfig::single())
            .arg(&mut out)
            .arg(value)
            .launch()?;
        for src in inputs {
            let src = src?;
            ctx.launch(add, LaunchConfig::single())
                .arg(&mut out)
                .arg(src)
                .launch()?;
        }
    }
    Ok(out)
}
