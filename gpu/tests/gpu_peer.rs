//! Nodes reading buffers of another device's table (`GpuCtx::on_device`, `GpuCtx::copy_peer`),
//! on one GPU: a buffer of the node's own device is read as it is; one of another pool's
//! table of the same device (one context, two release queues: the case two devices reduce to
//! on one GPU) is read in place or copied with `cuMemcpyPeerAsync`, and its release waits for
//! the reader even when it is dropped while the read is still queued behind other work. Two
//! physical GPUs (peer access, or copies through the host) are not exercised here.

use std::sync::{Arc, Mutex};

use boundpool_gpu::{builtin, DeviceBuffer, GpuGraphBuilder, GpuGraphExt, GpuPool, Module};
use boundpool_test_support::{gpu_pool, GpuTest};

fn values(n: usize, seed: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| i.wrapping_mul(2_654_435_761).wrapping_add(seed))
        .collect()
}

fn upload(pool: &GpuPool, data: Vec<u32>) -> DeviceBuffer<u32> {
    let d = pool.devices()[0].clone();
    pool.call(&d, move |ctx| Ok(ctx.upload(&data)?)).unwrap()
}

#[test]
fn a_buffer_of_the_nodes_own_device_is_read_as_it_is() {
    let Some(_t) = GpuTest::start("gpu_peer::own_device", 60) else {
        return;
    };
    let pool = gpu_pool("peer-own", 2, 1);
    let d = pool.devices()[0].clone();
    let data = values(4096, 1);
    let mut g = GpuGraphBuilder::new("own");
    let host = data.clone();
    let a = g.gpu_node(&d, "make", move |ctx| Ok(ctx.upload(&host)?));
    let b = g.gpu_node(&d, "read", move |ctx| {
        let src = ctx.input(a)?;
        let here = ctx.on_device(src)?;
        assert!(!here.is_copy());
        assert_eq!(here.device_ptr(), src.device_ptr());
        let mut copy = ctx.alloc::<u32>(src.len())?;
        ctx.copy_peer(src, &mut copy)?;
        Ok(ctx.download(&copy)?)
    });
    g.edge(a, b);
    let out = pool.submit(&g.build().unwrap()).unwrap().wait().unwrap();
    assert_eq!(out.get(b).unwrap(), &data);
    assert_eq!(out.get(a).unwrap().peer_reads_pending(), 0);
}

#[test]
fn another_tables_buffer_dropped_while_its_copy_is_queued_is_freed_after_it() {
    let Some(_t) = GpuTest::start("gpu_peer::release_waits_for_the_reader", 120) else {
        return;
    };
    // Two pools on device 0: two tables (two release queues) of one context.
    let owner = gpu_pool("peer-owner", 1, 1);
    let reader = gpu_pool("peer-reader", 1, 1);
    let spin = Module::builtin().kernel(builtin::SPIN).unwrap();
    let n = 1 << 20;
    for round in 0..5u32 {
        let data = values(n, round);
        let src = Arc::new(Mutex::new(Some(upload(&owner, data.clone()))));
        let rd = reader.devices()[0].clone();
        let (s, k) = (src.clone(), spin.clone());
        let copied = reader
            .call(&rd, move |ctx| {
                // Hold the reader's stream for ~50 ms, so the copy below is still queued when
                // the source is dropped and the owner's workers drain their release queue.
                // SAFETY: bp_spin(i64 cycles).
                unsafe {
                    ctx.launch(&k, boundpool_gpu::LaunchConfig::single())
                        .arg(100_000_000i64)
                        .launch()?;
                }
                let x = s.lock().unwrap().take().expect("the source");
                let mut dst = ctx.alloc::<u32>(x.len())?;
                ctx.copy_peer(&x, &mut dst)?;
                assert_eq!(x.peer_reads_pending(), 1, "the copy's fence");
                drop(x); // to the owner's queue, with the fence
                Ok(dst)
            })
            .unwrap();
        // Meanwhile the owner reuses the memory it may have freed: zeroed buffers of the
        // same size. Had the free not waited for the fence, the copy would read zeros.
        let od = owner.devices()[0].clone();
        for _ in 0..4 {
            let z = owner
                .call(&od, move |ctx| Ok(ctx.alloc_zeros::<u32>(n)?))
                .unwrap();
            drop(z);
        }
        let got = reader.download(&copied).unwrap();
        assert!(
            got == data,
            "round {round}: the copy read memory freed under it"
        );
    }
}

#[test]
fn a_buffer_read_in_place_at_every_run_keeps_only_fences_in_flight() {
    let Some(_t) = GpuTest::start("gpu_peer::fences_pruned", 120) else {
        return;
    };
    let owner = gpu_pool("peer-weights", 1, 1);
    let reader = gpu_pool("peer-runs", 2, 1);
    let data = values(1 << 16, 7);
    let weights = Arc::new(upload(&owner, data.clone()));
    let d = reader.devices()[0].clone();
    let mut g = GpuGraphBuilder::new("read weights");
    let w = weights.clone();
    let sum = g.gpu_node(&d, "read", move |ctx| {
        // Another table's buffer, read in place (one device: one context), by cudarc code on
        // the node's stream: its fence is recorded after the body.
        let here = ctx.on_device(&w)?;
        assert!(!here.is_copy());
        let mut copy = ctx.alloc::<u32>(here.len())?;
        ctx.stream().memcpy_dtod(&*here, &mut copy)?;
        Ok(copy)
    });
    let check = g.gpu_node(&d, "check", move |ctx| {
        Ok(ctx
            .download(ctx.input(sum)?)?
            .iter()
            .map(|&x| x as u64)
            .sum::<u64>())
    });
    g.edge(sum, check);
    let graph = g.build().unwrap();
    let want: u64 = data.iter().map(|&x| x as u64).sum();
    for _ in 0..50 {
        let out = reader.submit(&graph).unwrap().wait().unwrap();
        assert_eq!(out.get(check), Some(&want));
    }
    // Each run added a fence and gave back its completed ones: at most the last is left.
    assert!(
        weights.peer_reads_pending() <= 1,
        "{} fences held after 50 runs",
        weights.peer_reads_pending()
    );
    drop(graph);
    drop(reader);
    drop(weights);
    drop(owner);
}
