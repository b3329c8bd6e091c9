//! Leak check: free device memory after dropping a pool that allocated, launched, loaded
//! modules and recycled events equals the value before it. (Own test binary: it reads the
//! whole device's free memory.)

use boundpool_gpu::{
    builtin, DeviceBuffer, GpuGraphBuilder, GpuGraphExt, LaunchConfig, MemoryProbe, Module,
};
use boundpool_test_support::{gpu_pool, GpuTest};

fn workload() {
    let pool = gpu_pool("gpu", 4, 2);
    let d = pool.devices()[0].clone();
    let scale = Module::builtin().kernel(builtin::SCALE_F32).unwrap();
    let mut g = GpuGraphBuilder::new("leak");
    let mut kept = Vec::new();
    for i in 0..64 {
        let k = scale.clone();
        let a = g.gpu_node_in(d.groups()[i % 2], &format!("a{i}"), move |ctx| {
            let mut b = ctx.alloc_zeros::<f32>(1 << 20)?; // 4 MiB
                                                          // SAFETY: bp_scale_f32(f32*, f32, u32) over the buffer's length.
            unsafe {
                ctx.launch(&k, LaunchConfig::for_elements(1 << 20))
                    .arg(&mut b)
                    .arg(2.0f32)
                    .arg(1u32 << 20)
                    .launch()?
            };
            Ok(b)
        });
        let b = g.gpu_node_in(d.groups()[(i + 1) % 2], &format!("b{i}"), move |ctx| {
            let src: &DeviceBuffer<f32> = ctx.input(a)?;
            let mut dst = ctx.alloc::<f32>(src.len())?;
            ctx.copy_device(src, &mut dst)?;
            Ok(dst)
        });
        g.edge(a, b);
        kept.push(b);
    }
    let graph = g.build().unwrap();
    let mut outs = Vec::new();
    for _ in 0..4 {
        let mut out = pool.submit(&graph).unwrap().wait().unwrap();
        // keep some buffers past the pool's end, dropped on another thread
        outs.push(out.take(kept[0]).unwrap());
    }
    let t = std::thread::spawn(move || drop(outs));
    drop(pool);
    t.join().unwrap();
}

#[test]
fn free_memory_returns_after_pool_drop() {
    let Some(_t) = GpuTest::start("free_memory_returns_after_pool_drop", 300) else {
        return;
    };
    let probe = MemoryProbe::new(0).unwrap();
    let start = probe.free_memory().unwrap();
    workload();
    let after1 = probe.free_memory().unwrap();
    workload();
    let after2 = probe.free_memory().unwrap();
    let mib = |x: usize| x as f64 / (1 << 20) as f64;
    eprintln!(
        "free memory: start {:.1} MiB, after pool 1 {:.1} MiB (diff {:+.1}), after pool 2 {:.1} MiB (diff {:+.1})",
        mib(start), mib(after1), mib(after1) - mib(start), mib(after2), mib(after2) - mib(start)
    );
    let tol = 2 << 20;
    assert!(
        start.abs_diff(after1) <= tol,
        "pool 1 leaked {} bytes",
        start as i64 - after1 as i64
    );
    assert!(
        start.abs_diff(after2) <= tol,
        "pool 2 leaked {} bytes",
        start as i64 - after2 as i64
    );
    drop(probe);
}
