//! GPU work in rank graphs, ranks as threads of one process (the in-process network), each
//! rank a pool of its own on device 0: device values staged through page-locked memory both
//! ways between two ranks (several sizes, chunk sizes and runs: the first lands in ordinary
//! memory, later ones in the page-locked pool; runs in flight that share the pool's memory), a received value read by a host node and
//! downloaded, no driver call off a bound worker (the guard's context check: the communication
//! threads only read host memory), a GPU node's failure on every rank; with the `nccl` feature,
//! a one-rank communicator's collectives against the host, and the error of a missing libnccl
//! (which runs without a GPU). Two processes with NCCL on one GPU need distinct `NCCL_HOSTID`s:
//! they run under mpirun (`examples/ranks_gpu.rs`, `benches/device/ranks_gpu_call.sh`).

use boundpool_gpu::{builtin, DeviceBuffer, Devices, GpuPoolBuilder, LaunchConfig, Module};
use boundpool_ranks::{
    ErrorKind, GpuRanks, GpuRanksBuilder, LocalNetwork, RankGraphBuilder, RanksBuilder,
};
use boundpool_test_support::GpuTest;

fn pool() -> GpuPoolBuilder {
    GpuPoolBuilder::new()
        .devices(Devices::List(vec![0]))
        .workers_per_device(2)
        .unpinned()
}

fn world(n: usize) -> (LocalNetwork, Vec<GpuRanks>) {
    let net = LocalNetwork::new(n);
    let ranks = (0..n)
        .map(|r| {
            GpuRanksBuilder::new(RanksBuilder::new().name(format!("gpu-rank{r}")), pool())
                .build_local(&net, r)
                .unwrap()
        })
        .collect();
    (net, ranks)
}

/// Runs `f` on every rank at once (a thread each), like an SPMD program.
fn on_all<R: Send>(ranks: &[GpuRanks], f: impl Fn(&GpuRanks) -> R + Sync) -> Vec<R> {
    std::thread::scope(|s| {
        let hs: Vec<_> = ranks.iter().map(|r| s.spawn(|| f(r))).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| ((i as u32).wrapping_mul(2_654_435_761) ^ seed) as f32 / 4096.0)
        .collect()
}

#[test]
fn device_values_cross_ranks_staged_both_ways() {
    let Some(_t) = GpuTest::start("gpu_ranks::staged_both_ways", 300) else {
        return;
    };
    let (_net, ranks) = world(2);
    let scale = Module::builtin().kernel(builtin::SCALE_F32).unwrap();
    // (elements, chunk bytes): empty, one element, one chunk, many chunks with a short last,
    // chunks larger than a message (8 MiB chunks in 4 MiB messages).
    let cases = [
        (0usize, 1 << 20),
        (1, 1 << 20),
        (1000, 1 << 20),
        ((1 << 20) + 3, 256 << 10),
        ((3 << 20) + 5, 8 << 20),
    ];
    let checked = on_all(&ranks, |r| {
        let d = r.devices()[0].clone();
        let mut checked = 0;
        for &(n, chunk) in &cases {
            let mut g = RankGraphBuilder::new(format!("ping-pong {n}"));
            g.staging_chunk_bytes(chunk);
            let host = values(n, n as u32);
            // Rank 0 makes the buffer; rank 1 doubles it and sends it back.
            let h = host.clone();
            let a = g.device_node(0, &d, "make", move |ctx| {
                Ok(match h.len() {
                    0 => ctx.gpu().alloc::<f32>(0)?,
                    _ => ctx.gpu().upload(&h)?,
                })
            });
            let k = scale.clone();
            let b = g.device_node(1, &d, "double", move |ctx| {
                let x = ctx.input(a)?;
                let gpu = ctx.gpu();
                let mut y = gpu.alloc::<f32>(x.len())?;
                if n > 0 {
                    gpu.copy_device(x, &mut y)?;
                    // SAFETY: bp_scale_f32(f32* x, f32 a, u32 n) over the whole buffer.
                    unsafe {
                        gpu.launch(&k, LaunchConfig::for_elements(n))
                            .arg(&mut y)
                            .arg(2.0f32)
                            .arg(n as u32)
                            .launch()?;
                    }
                }
                Ok(y)
            });
            let c = g.gpu_node(0, &d, "read back", move |ctx| {
                let x = ctx.input(b)?;
                Ok(match x.len() {
                    0 => Vec::new(),
                    _ => ctx.gpu().download(x)?,
                })
            });
            g.edge(a, b).edge(b, c);
            let graph = g.build(r).unwrap();
            for run in 0..3 {
                let out = r.run(&graph).unwrap();
                if r.rank() == 0 {
                    let got = out.get(c).unwrap();
                    let want: Vec<f32> = host.iter().map(|x| x * 2.0).collect();
                    assert!(got == &want, "{n} elements, run {run}: wrong values back");
                    // The received value is rank 0's too, on its device.
                    let back: &DeviceBuffer<f32> = out.get(b).unwrap();
                    assert_eq!(back.len(), n);
                    if n > 0 {
                        assert_eq!(r.download(back).unwrap(), want);
                    }
                    checked += 1;
                }
            }
        }
        checked
    });
    assert_eq!(checked[0], cases.len() * 3);
}

#[test]
fn staging_memory_is_reused_by_runs_in_flight_without_mixing_their_values() {
    let Some(_t) = GpuTest::start("gpu_ranks::staging_reuse", 300) else {
        return;
    };
    let (_net, ranks) = world(2);
    // A value whose length and contents change with the run (large and small alternating, so
    // a small value lands in memory a large one left), 12 runs with 4 in flight at once: every
    // run's value must arrive as its own.
    let len = |seq: u64| {
        if seq % 2 == 0 {
            (1 << 20) + 7
        } else {
            1000 + seq as usize
        }
    };
    let runs = 12u64;
    let results = on_all(&ranks, |r| {
        let d = r.devices()[0].clone();
        let mut g = RankGraphBuilder::new("reuse");
        g.staging_chunk_bytes(256 << 10);
        let a = g.device_node(0, &d, "make", move |ctx| {
            let seq = ctx.run_seq();
            Ok(ctx.gpu().upload(&values(len(seq), seq as u32))?)
        });
        let b = g.gpu_node(1, &d, "check", move |ctx| {
            let seq = ctx.run_seq();
            let got = ctx.gpu().download(ctx.input(a)?)?;
            Ok(got == values(len(seq), seq as u32))
        });
        g.edge(a, b);
        let graph = g.build(r).unwrap();
        let mut handles = std::collections::VecDeque::new();
        let mut ok = Vec::new();
        for _ in 0..runs {
            if handles.len() == 4 {
                let out = handles
                    .pop_front()
                    .map(|h: boundpool_ranks::RunHandle| h.wait());
                ok.push(out.unwrap().unwrap().get(b).copied());
            }
            handles.push_back(r.submit(&graph).unwrap());
        }
        for h in handles {
            ok.push(h.wait().unwrap().get(b).copied());
        }
        ok
    });
    assert!(
        results[0].iter().all(Option::is_none),
        "rank 0 checks nothing"
    );
    let on_1 = &results[1];
    assert_eq!(on_1.len(), runs as usize);
    let bad: Vec<usize> = (0..on_1.len()).filter(|&i| on_1[i] != Some(true)).collect();
    assert!(bad.is_empty(), "runs whose value arrived wrong: {bad:?}");
}

#[test]
fn a_failing_gpu_node_fails_the_run_on_every_rank() {
    let Some(_t) = GpuTest::start("gpu_ranks::failure", 120) else {
        return;
    };
    let (_net, ranks) = world(2);
    let errs = on_all(&ranks, |r| {
        let d = r.devices()[0].clone();
        let mut g = RankGraphBuilder::new("fails");
        let a = g.device_node(0, &d, "bad", |ctx| {
            // A copy between buffers of different lengths: refused by the GPU crate.
            let gpu = ctx.gpu();
            let x = gpu.alloc_zeros::<f32>(4)?;
            let mut y = gpu.alloc::<f32>(5)?;
            gpu.copy_device(&x, &mut y)?;
            Ok(y)
        });
        let b = g.gpu_node(1, &d, "after", move |ctx| Ok(ctx.input(a)?.len()));
        g.edge(a, b);
        r.run(&g.build(r).unwrap()).unwrap_err()
    });
    for e in errs {
        assert_eq!(e.kind(), ErrorKind::NodeFailed, "{e}");
        assert_eq!(e.rank(), Some(0), "{e}");
        assert!(e.to_string().contains("node 'bad'"), "{e}");
        assert!(e.to_string().contains("copy of 4 elements into 5"), "{e}");
    }
}

#[cfg(feature = "nccl")]
mod nccl {
    use super::*;
    use boundpool_gpu::{nccl_library_check, ReduceOp};

    fn nccl_or_skip(test: &str) -> bool {
        match nccl_library_check() {
            Ok(()) => true,
            Err(e) if std::env::var("BOUNDPOOL_REQUIRE_NCCL").is_ok_and(|v| v == "1") => {
                panic!("{test}: BOUNDPOOL_REQUIRE_NCCL=1 but {e}")
            }
            Err(e) => {
                boundpool_test_support::uncaptured_notice(&format!("SKIPPED {test}: {e}"));
                false
            }
        }
    }

    #[test]
    fn a_missing_libnccl_fails_the_build_naming_the_files_tried() {
        // No GPU needed: the library is checked before the devices.
        if nccl_library_check().is_ok() {
            boundpool_test_support::uncaptured_notice(
                "SKIPPED gpu_ranks::missing_libnccl: libnccl is installed here",
            );
            return;
        }
        let net = LocalNetwork::new(1);
        let e = GpuRanksBuilder::new(RanksBuilder::new(), pool())
            .nccl(true)
            .build_local(&net, 0)
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Gpu, "{e}");
        let m = e.to_string();
        for name in [
            "libnccl.so",
            "libnccl.so.13",
            "libnccl.so.12",
            "libnccl.so.2 only",
        ] {
            assert!(m.contains(name), "{name} not in: {m}");
        }
        assert!(m.contains("building GPU pool"), "{m}");
    }

    #[test]
    fn one_rank_collectives_match_the_host() {
        let Some(_t) = GpuTest::start("gpu_ranks::nccl_one_rank", 180) else {
            return;
        };
        if !nccl_or_skip("gpu_ranks::nccl_one_rank") {
            return;
        }
        let net = LocalNetwork::new(1);
        let r = GpuRanksBuilder::new(RanksBuilder::new(), pool())
            .nccl(true)
            .build_local(&net, 0)
            .unwrap();
        let d = r.nccl_device().expect("the NCCL device").clone();
        assert_eq!(d.nccl().map(|i| (i.rank, i.world)), Some((0, 1)));
        let host = values(4096, 3);
        let mut g = RankGraphBuilder::new("collectives");
        let h = host.clone();
        let x = g.device_node(0, &d, "x", move |ctx| Ok(ctx.gpu().upload(&h)?));
        let sum = g.all_reduce("sum", &d, &[x], ReduceOp::Sum);
        let bc = g.broadcast("bcast", &d, &[sum.on(0)], 0);
        let all = g.all_gather("gather", &d, &[bc.on(0)]);
        let rs = g
            .reduce_scatter("scatter", &d, &[all.on(0)], ReduceOp::Max)
            .on(0);
        let back = g.gpu_node(0, &d, "back", move |ctx| {
            Ok(ctx.gpu().download(ctx.input(rs)?)?)
        });
        g.edge(rs, back);
        let graph = g.build(&r).unwrap();
        // Every member is an NCCL operation of rank 0, in the order of the graph.
        assert_eq!(graph.lowering().nccl_order.len(), 4);
        for _ in 0..5 {
            let out = r.run(&graph).unwrap();
            assert_eq!(out.get(back).unwrap(), &host);
        }
    }
}
