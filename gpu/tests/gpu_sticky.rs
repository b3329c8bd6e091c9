//! A sticky error (illegal address) marks the device failed: its graph fails naming the node
//! and the driver error, nothing hangs, later submissions to the device say why, host graphs
//! go on. (Own test binary: it poisons the device's context for this process.)

use boundpool_gpu::{
    builtin, Cores, GpuErrorKind, GpuGraphBuilder, GpuGraphExt, LaunchConfig, Module,
};
use boundpool_test_support::{chain, gpu_pool_builder, GpuTest};

/// `poke(u64 addr)`: `*(u32*)addr = 1` with a raw address (given a bad one, an illegal
/// address). The test's own module: the library's built-in kernels have no use for it.
const POKE_PTX: &str = "
.version 7.0
.target sm_70
.address_size 64
.visible .entry poke(.param .u64 poke_p0)
{
    .reg .b64 %rd<2>;
    .reg .b32 %r<2>;
    ld.param.u64 %rd1, [poke_p0];
    mov.u32 %r1, 1;
    st.global.u32 [%rd1], %r1;
    ret;
}
";

#[test]
fn illegal_address_marks_device_failed() {
    let Some(_t) = GpuTest::start("illegal_address_marks_device_failed", 120) else {
        return;
    };
    let pool = gpu_pool_builder(4, 1)
        .host_workers(2, Cores::Unpinned)
        .build()
        .unwrap();
    let d = pool.devices()[0].clone();
    let (poke, spin) = (
        Module::from_ptx("poke", POKE_PTX)
            .unwrap()
            .kernel("poke")
            .unwrap(),
        Module::builtin().kernel(builtin::SPIN).unwrap(),
    );
    // A long graph running beside the bad one (its work fails too: same context).
    let mut g = GpuGraphBuilder::new("bystander");
    let mut prev = None;
    for i in 0..50 {
        let k = spin.clone();
        let n = g.gpu_node(&d, &format!("s{i}"), move |ctx| {
            // SAFETY: bp_spin takes one i64.
            unsafe {
                ctx.launch(&k, LaunchConfig::single())
                    .arg(2_000_000i64)
                    .launch()?
            };
            Ok(())
        });
        if let Some(p) = prev {
            g.edge(p, n);
        }
        prev = Some(n);
    }
    let bystander = pool.submit(&g.build().unwrap()).unwrap();

    let mut g = GpuGraphBuilder::new("bad-graph");
    g.gpu_node(&d, "poke-null", move |ctx| {
        // SAFETY: deliberately stores to address 8 to provoke CUDA_ERROR_ILLEGAL_ADDRESS.
        unsafe {
            ctx.launch(&poke, LaunchConfig::single())
                .arg(8u64)
                .launch()?
        };
        Ok(())
    });
    let e = pool
        .submit(&g.build().unwrap())
        .unwrap()
        .wait()
        .expect_err("illegal address must fail the graph");
    let s = chain(&e);
    eprintln!("bad graph: {s}");
    assert!(s.contains("poke-null"), "error must name the node: {s}");
    assert!(
        s.contains("CUDA_ERROR_ILLEGAL_ADDRESS"),
        "error must carry the driver error: {s}"
    );
    let why = d.failure().expect("device marked failed");
    eprintln!("device failure: {why}");
    let b = bystander.wait();
    eprintln!(
        "bystander: {:?}",
        b.as_ref().map(|_| ()).map_err(|e| chain(e))
    );

    // Later submissions to the device say why.
    let mut g = GpuGraphBuilder::new("later");
    g.gpu_node(&d, "later-node", |_| Ok(()));
    let e = pool
        .submit(&g.build().unwrap())
        .expect_err("submission to a failed device");
    eprintln!("later submission: {e}");
    assert_eq!(e.kind(), GpuErrorKind::DeviceFailed);
    assert!(e.to_string().contains("ILLEGAL_ADDRESS"), "{e}");

    // Host work goes on.
    let mut g = GpuGraphBuilder::new("host-only");
    let h = g.node("h", |_| Ok(42u32));
    g.place(h, pool.host_group().unwrap());
    let out = pool.submit(&g.build().unwrap()).unwrap().wait().unwrap();
    assert_eq!(out.get(h), Some(&42));
    drop(pool); // must not hang
}
