//! NCCL as GPU node work (feature `nccl`), on a one-rank communicator of device 0: made on a
//! bound worker from an id (`GpuCtx::nccl_init`), its all-reduce, broadcast, reduce-scatter and
//! all-gather against the host, successors of an NCCL node (GPU and host) ordered after its
//! work on the communicator's stream, and an operation on a device without a communicator
//! refused by name. Skipped visibly without a GPU, or without libnccl unless
//! `BOUNDPOOL_REQUIRE_NCCL=1` (the device scripts set it). Two ranks run under mpirun
//! (`benches/device/ranks_gpu_call.sh`).

use boundpool_gpu::{nccl_library_check, GpuGraphBuilder, GpuGraphExt, GpuPool, NcclId, ReduceOp};
use boundpool_test_support::{chain, gpu_pool_builder, uncaptured_notice, GpuTest};

fn nccl_or_skip(test: &str) -> bool {
    match nccl_library_check() {
        Ok(()) => true,
        Err(e) if std::env::var("BOUNDPOOL_REQUIRE_NCCL").is_ok_and(|v| v == "1") => {
            panic!("{test}: BOUNDPOOL_REQUIRE_NCCL=1 but {e}")
        }
        Err(e) => {
            uncaptured_notice(&format!("SKIPPED {test}: {e}"));
            false
        }
    }
}

fn pool_with_comm() -> GpuPool {
    let pool = gpu_pool_builder(2, 1)
        .name("nccl")
        .nccl(true)
        .build()
        .expect("GPU pool");
    let d = pool.devices()[0].clone();
    pool.call(&d, |ctx| {
        let id = NcclId::new()?;
        ctx.nccl_init(&id, 0, 1)?;
        ctx.nccl_connect()?;
        Ok(())
    })
    .unwrap();
    let info = d.nccl().expect("a communicator");
    assert_eq!((info.rank, info.world), (0, 1));
    pool
}

#[test]
fn one_rank_collectives_match_the_host() {
    let Some(_t) = GpuTest::start("gpu_nccl::one_rank_collectives", 120) else {
        return;
    };
    if !nccl_or_skip("gpu_nccl::one_rank_collectives") {
        return;
    }
    let pool = pool_with_comm();
    let d = pool.devices()[0].clone();
    let x: Vec<f32> = (0..1000).map(|i| i as f32 * 0.5 - 7.0).collect();
    let mut g = GpuGraphBuilder::new("collectives");
    let host = x.clone();
    let input = g.gpu_node(&d, "input", move |ctx| Ok(ctx.upload(&host)?));
    let reduced = g.gpu_node(&d, "all-reduce", move |ctx| {
        let src = ctx.input(input)?;
        let mut out = ctx.alloc::<f32>(src.len())?;
        ctx.nccl_all_reduce(src, &mut out, &ReduceOp::Sum)?;
        Ok(out)
    });
    let bcast = g.gpu_node(&d, "broadcast", move |ctx| {
        let src = ctx.input(reduced)?;
        let mut out = ctx.alloc::<f32>(src.len())?;
        ctx.nccl_broadcast(Some(src), &mut out, 0)?;
        Ok(out)
    });
    let gathered = g.gpu_node(&d, "all-gather", move |ctx| {
        let src = ctx.input(bcast)?;
        let mut out = ctx.alloc::<f32>(src.len())?;
        ctx.nccl_all_gather(src, &mut out)?;
        Ok(out)
    });
    let scattered = g.gpu_node(&d, "reduce-scatter", move |ctx| {
        let src = ctx.input(gathered)?;
        let mut out = ctx.alloc::<f32>(src.len())?;
        ctx.nccl_reduce_scatter(src, &mut out, &ReduceOp::Max)?;
        // Work after the operation, on the node's own stream: joined before successors.
        ctx.memset_zero(&mut ctx.alloc::<f32>(16)?)?;
        Ok(out)
    });
    // A GPU successor (waits on the communicator's stream) and a host one (the device's done).
    let doubled = g.gpu_node(&d, "copy after", move |ctx| {
        let src = ctx.input(scattered)?;
        let mut out = ctx.alloc::<f32>(src.len())?;
        ctx.copy_device(src, &mut out)?;
        Ok(ctx.download(&out)?)
    });
    g.edge(input, reduced)
        .edge(reduced, bcast)
        .edge(bcast, gathered)
        .edge(gathered, scattered)
        .edge(scattered, doubled);
    let graph = g.build().unwrap();
    for run in 0..20 {
        let out = pool.submit(&graph).unwrap().wait().unwrap();
        assert_eq!(out.get(doubled).unwrap(), &x, "run {run}");
    }
}

#[test]
fn an_operation_without_a_communicator_is_refused_by_name() {
    let Some(_t) = GpuTest::start("gpu_nccl::no_communicator", 60) else {
        return;
    };
    if !nccl_or_skip("gpu_nccl::no_communicator") {
        return;
    }
    let pool = gpu_pool_builder(1, 1).name("no-comm").build().unwrap();
    let d = pool.devices()[0].clone();
    assert!(d.nccl().is_none());
    let e = pool
        .call(&d, |ctx| {
            let a = ctx.alloc_zeros::<f32>(4)?;
            let mut b = ctx.alloc::<f32>(4)?;
            ctx.nccl_all_reduce(&a, &mut b, &ReduceOp::Sum)?;
            Ok(())
        })
        .unwrap_err();
    let s = chain(&e);
    assert!(s.contains("has no NCCL communicator"), "{s}");
    assert!(s.contains("device 0"), "{s}");
}
