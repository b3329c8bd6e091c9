//! GPU graph tests: binding, drops from foreign threads, counting, random DAGs, host
//! successors, OOM, panics, bad kernels. Run on a GPU machine with `BOUNDPOOL_REQUIRE_GPU=1`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use boundpool_gpu::{
    builtin, context_check, DeviceBuffer, Devices, GpuErrorKind, GpuGraphBuilder, GpuGraphExt,
    GpuPoolBuilder, LaunchConfig, Module,
};
use boundpool_test_support::{chain, gpu_pool_with_host, set_add_spin, spin_set_add, GpuTest};

#[test]
fn no_gpu_is_an_error_not_a_panic() {
    if boundpool_gpu::gpu_unavailable_reason().is_some() {
        let e = GpuPoolBuilder::new()
            .build()
            .expect_err("no GPU: build must fail");
        assert!(
            matches!(e.kind(), GpuErrorKind::NoDriver | GpuErrorKind::NoDevice),
            "{e}"
        );
        eprintln!("no GPU here; build() said: {e}");
        if std::env::var("BOUNDPOOL_REQUIRE_GPU").is_ok_and(|v| v == "1") {
            panic!("BOUNDPOOL_REQUIRE_GPU=1 but no GPU: {e}");
        }
        return;
    }
    let n = boundpool_gpu::device_count().unwrap();
    let e = GpuPoolBuilder::new()
        .devices(Devices::List(vec![n as i32 + 3]))
        .build()
        .expect_err("a missing device must fail build()");
    assert_eq!(e.kind(), GpuErrorKind::NoDevice, "{e}");
    assert!(e.to_string().contains("does not exist"), "{e}");
}

#[test]
fn workers_are_bound_and_call_returns_values() {
    let Some(_t) = GpuTest::start("workers_are_bound_and_call_returns_values", 120) else {
        return;
    };
    let p = gpu_pool_with_host("t", 4, 1);
    let d = p.devices()[0].clone();
    // "call and get a result": a device query.
    let (free, total) = p.call(&d, |ctx| Ok(ctx.memory_info()?)).unwrap();
    // A body that returns nothing: `call` gives `()` back (it failed with "call produced no
    // output": a node returning `()` stores no output).
    p.call(&d, |ctx| {
        ctx.memory_info()?;
        Ok(())
    })
    .unwrap();
    assert!(free > 0 && free <= total);
    // an allocation handed to the submitter, then downloaded
    let buf: DeviceBuffer<u32> = p
        .call(&d, |ctx| Ok(ctx.upload(&(0..1000u32).collect::<Vec<_>>())?))
        .unwrap();
    assert_eq!(buf.len(), 1000);
    let back = p.download(&buf).unwrap();
    assert_eq!(back, (0..1000u32).collect::<Vec<_>>());
    drop(buf);
    drop(p);
}

/// 10,000 device buffers made by GPU nodes and dropped on 16 foreign threads: no driver call
/// on those threads (the context check would count it), and all are freed by workers.
#[test]
fn buffers_dropped_on_foreign_threads() {
    let Some(_t) = GpuTest::start("buffers_dropped_on_foreign_threads", 300) else {
        return;
    };
    let p = gpu_pool_with_host("t", 4, 1);
    let d = p.devices()[0].clone();
    let mut g = GpuGraphBuilder::new("make-buffers");
    let nodes: Vec<_> = (0..16)
        .map(|i| {
            g.gpu_node(&d, &format!("make{i}"), move |ctx| {
                let mut v = Vec::with_capacity(625);
                for k in 0..625u32 {
                    v.push(ctx.upload(&[k, i])?);
                }
                Ok(v)
            })
        })
        .collect();
    let graph = g.build().unwrap();
    let mut out = p.submit(&graph).unwrap().wait().unwrap();
    let batches: Vec<Vec<DeviceBuffer<u32>>> =
        nodes.iter().map(|n| out.take(*n).unwrap()).collect();
    assert_eq!(d.live_allocations(), 10_000);
    let before_wrong = context_check::wrong_context_calls();
    let barrier = Arc::new(std::sync::Barrier::new(16));
    let hs: Vec<_> = batches
        .into_iter()
        .map(|b| {
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                barrier.wait();
                drop(b);
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    assert_eq!(context_check::wrong_context_calls(), before_wrong);
    // Workers free them (woken for it, or at their next idle point).
    let t0 = Instant::now();
    while d.live_allocations() > 0 && t0.elapsed() < Duration::from_secs(20) {
        let _ = p.call(&d, |_| Ok(()));
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(d.live_allocations(), 0, "buffers not freed by the workers");
    drop(p);
}

/// A counting kernel launched from 100,000 nodes across all workers counts 100,000.
#[test]
fn counting_kernel_from_100k_nodes() {
    let Some(_t) = GpuTest::start("counting_kernel_from_100k_nodes", 300) else {
        return;
    };
    let p = gpu_pool_with_host("t", 8, 2);
    let d = p.devices()[0].clone();
    let m = Module::builtin();
    let count = m.kernel(builtin::COUNT).unwrap();
    let mut g = GpuGraphBuilder::with_capacity("count", 100_002, 200_000);
    let root = g.gpu_node(&d, "zero", |ctx| Ok(ctx.alloc_zeros::<u32>(1)?));
    let mut leaves = Vec::with_capacity(100_000);
    for i in 0..100_000usize {
        let k = count.clone();
        let group = d.groups()[i % d.groups().len()];
        let n = g.gpu_node_in(group, &format!("count{i}"), move |ctx| {
            let c = ctx.input(root)?;
            // SAFETY: bp_count takes one u32 pointer; `c` outlives the graph's GPU work.
            unsafe { ctx.launch(&k, LaunchConfig::single()).arg(c).launch()? };
            Ok(())
        });
        g.edge(root, n);
        leaves.push(n);
    }
    let read = g.gpu_node(
        &d,
        "read",
        move |ctx| Ok(ctx.download(ctx.input(root)?)?[0]),
    );
    for &l in &leaves {
        g.edge(l, read);
    }
    g.edge(root, read);
    let graph = g.build().unwrap();
    let t0 = Instant::now();
    let out = p.submit(&graph).unwrap().wait().unwrap();
    let el = t0.elapsed();
    assert_eq!(*out.get(read).unwrap(), 100_000);
    let stats = p.pool().stats();
    eprintln!("100,000 counting nodes in {el:?}; stats: {stats:?}");
    drop(out);
    drop(p);
}

/// Random DAGs of GPU nodes across groups (so edges span workers and streams): each node sets
/// its value to i+1 after a spin, then adds its predecessors' values, on the device. The host
/// computes the same; a missing device-side wait shows up as a wrong sum.
#[test]
fn random_dag_matches_host() {
    let Some(_t) = GpuTest::start("random_dag_matches_host", 300) else {
        return;
    };
    let p = gpu_pool_with_host("t", 6, 3);
    let d = p.devices()[0].clone();
    let (set, add, spin) = set_add_spin();
    let mut rng = 0x2545_F491_4F6C_DD1Du64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    for round in 0..3 {
        let n = 400usize;
        let mut preds: Vec<Vec<usize>> = Vec::new();
        for i in 0..n {
            let mut ps = Vec::new();
            if i > 0 {
                for _ in 0..(next() % 4) {
                    let p = (next() as usize) % i;
                    if !ps.contains(&p) {
                        ps.push(p);
                    }
                }
            }
            preds.push(ps);
        }
        let mut expect = vec![0i64; n];
        #[allow(clippy::needless_range_loop)]
        for i in 0..n {
            let mut v = i as i64 + 1;
            for &p in &preds[i] {
                v = v.wrapping_add(expect[p]);
            }
            expect[i] = v;
        }
        let mut g = GpuGraphBuilder::new(format!("dag{round}"));
        let mut refs = Vec::with_capacity(n);
        for (i, ps) in preds.iter().enumerate() {
            let pr: Vec<_> = ps.iter().map(|&p| refs[p]).collect();
            let (set, add, spin) = (set.clone(), add.clone(), spin.clone());
            let group = d.groups()[(next() as usize) % d.groups().len()];
            let cycles = (next() % 20_000) as i64;
            let pr2 = pr.clone();
            let r = g.gpu_node_in(group, &format!("n{i}"), move |ctx| {
                spin_set_add(
                    ctx,
                    (&set, &add, &spin),
                    cycles,
                    i as i64 + 1,
                    pr2.iter().map(|p| ctx.input(*p)),
                )
            });
            for &p in &pr {
                g.edge(p, r);
            }
            refs.push(r);
        }
        let all = refs.clone();
        let collect = g.gpu_node(&d, "collect", move |ctx| {
            let mut v = Vec::with_capacity(all.len());
            for r in &all {
                v.push(ctx.download(ctx.input(*r)?)?[0]);
            }
            Ok(v)
        });
        for &r in &refs {
            g.edge(r, collect);
        }
        let graph = g.build().unwrap();
        // The same graph, submitted several times at once.
        let hs: Vec<_> = (0..4).map(|_| p.submit(&graph).unwrap()).collect();
        for h in hs {
            let out = h.wait().unwrap();
            assert_eq!(out.get(collect).unwrap(), &expect, "round {round}");
        }
    }
    drop(p);
}

/// A host node after GPU nodes runs only once their work has completed on the device.
#[test]
fn host_successor_waits_for_device_work() {
    let Some(_t) = GpuTest::start("host_successor_waits_for_device_work", 120) else {
        return;
    };
    let p = gpu_pool_with_host("t", 2, 1);
    let d = p.devices()[0].clone();
    let spin = Module::builtin().kernel(builtin::SPIN).unwrap();
    let mut g = GpuGraphBuilder::new("host-after-gpu");
    let a = g.gpu_node(&d, "spin", move |ctx| {
        // ~100 ms at ~2 GHz.
        // SAFETY: bp_spin takes one i64.
        unsafe {
            ctx.launch(&spin, LaunchConfig::single())
                .arg(200_000_000i64)
                .launch()?
        };
        Ok(Instant::now())
    });
    let b = g.node("host", move |ctx| Ok(ctx.input(a)?.elapsed()));
    g.edge(a, b);
    if let Some(h) = p.host_group() {
        g.place(b, h);
    }
    let graph = g.build().unwrap();
    let out = p.submit(&graph).unwrap().wait().unwrap();
    let waited = *out.get(b).unwrap();
    eprintln!("host successor ran {waited:?} after the spin was enqueued");
    assert!(
        waited >= Duration::from_millis(30),
        "host node ran before the GPU finished: {waited:?}"
    );
    // A sink's completion also waits: the graph takes the spin's time.
    let mut g = GpuGraphBuilder::new("sink");
    let spin = Module::builtin().kernel(builtin::SPIN).unwrap();
    g.gpu_node(&d, "spin-sink", move |ctx| {
        // SAFETY: bp_spin takes one i64.
        unsafe {
            ctx.launch(&spin, LaunchConfig::single())
                .arg(200_000_000i64)
                .launch()?
        };
        Ok(())
    });
    let graph = g.build().unwrap();
    let t0 = Instant::now();
    p.submit(&graph).unwrap().wait().unwrap();
    assert!(
        t0.elapsed() >= Duration::from_millis(30),
        "graph completed before its sink's GPU work"
    );
    drop(p);
}

/// Out of memory fails the node (and its graph, naming it), not the pool; a panic in a GPU
/// node likewise; an unknown kernel names the kernel.
#[test]
fn oom_panic_and_bad_kernel_fail_only_their_graph() {
    let Some(_t) = GpuTest::start("oom_panic_and_bad_kernel_fail_only_their_graph", 120) else {
        return;
    };
    let p = gpu_pool_with_host("t", 2, 1);
    let d = p.devices()[0].clone();

    let mut g = GpuGraphBuilder::new("oom");
    let big = g.gpu_node(&d, "huge-alloc", |ctx| Ok(ctx.alloc::<u8>(1usize << 50)?));
    let after = g.gpu_node(&d, "after", |_| Ok(()));
    g.edge(big, after);
    let e = p
        .submit(&g.build().unwrap())
        .unwrap()
        .wait()
        .expect_err("OOM must fail");
    let s = chain(&e);
    eprintln!("oom: {s}");
    assert!(
        s.contains("huge-alloc") && s.contains("CUDA_ERROR_OUT_OF_MEMORY"),
        "{s}"
    );
    assert!(d.failure().is_none(), "OOM must not mark the device failed");

    let mut g = GpuGraphBuilder::new("panic");
    g.gpu_node(&d, "panicker", |_| -> Result<(), boundpool_gpu::BoxError> {
        panic!("boom in a GPU node")
    });
    let e = p
        .submit(&g.build().unwrap())
        .unwrap()
        .wait()
        .expect_err("panic must fail");
    let s = chain(&e);
    eprintln!("panic: {s}");
    assert!(s.contains("panicker"), "{s}");

    let mut g = GpuGraphBuilder::new("bad-kernel");
    let k = Module::builtin().kernel("no_such_kernel").unwrap();
    g.gpu_node(&d, "launcher", move |ctx| {
        // SAFETY: never launched: the lookup fails.
        unsafe { ctx.launch(&k, LaunchConfig::single()).launch()? };
        Ok(())
    });
    let e = p
        .submit(&g.build().unwrap())
        .unwrap()
        .wait()
        .expect_err("unknown kernel");
    let s = chain(&e);
    eprintln!("bad kernel: {s}");
    assert!(
        s.contains("launcher") && s.contains("no_such_kernel"),
        "{s}"
    );

    // The pool still works.
    let v = p
        .call(&d, |ctx| Ok(ctx.download(&ctx.upload(&[1u64, 2, 3])?)?))
        .unwrap();
    assert_eq!(v, vec![1, 2, 3]);
    drop(p);
}

/// A chain whose consecutive nodes are placed on two groups (so on different workers): each
/// node hands its stream over to the next, which adds 1 to its predecessor's device value after
/// a random spin. A missing order between two nodes would read a value not yet written. Then a
/// chain whose last node, a sink on a handed-over stream, has its completion tracked there.
#[test]
fn chain_across_workers_hands_its_stream_over() {
    let Some(_t) = GpuTest::start("chain_across_workers_hands_its_stream_over", 180) else {
        return;
    };
    let p = gpu_pool_with_host("t", 2, 2);
    let d = p.devices()[0].clone();
    let (set, add, spin) = set_add_spin();
    let n = 300usize;
    let mut g = GpuGraphBuilder::new("handoff-chain");
    let mut prev: Option<boundpool_gpu::NodeRef<DeviceBuffer<i64>>> = None;
    for i in 0..n {
        let (set, add, spin) = (set.clone(), add.clone(), spin.clone());
        let before = prev;
        let cycles = ((i * 7919) % 50_000) as i64;
        let r = g.gpu_node_in(d.groups()[i % 2], &format!("c{i}"), move |ctx| {
            let inputs: Vec<_> = before.into_iter().collect();
            spin_set_add(
                ctx,
                (&set, &add, &spin),
                cycles,
                1,
                inputs.iter().map(|p| ctx.input(*p)),
            )
        });
        if let Some(b) = prev {
            g.edge(b, r);
        }
        prev = Some(r);
    }
    let last = prev.unwrap();
    // Two GPU successors of the last node (so no hand-off: an event), one of which downloads.
    let sink = g.gpu_node_in(d.groups()[n % 2], "sink", move |ctx| {
        let v: &DeviceBuffer<i64> = ctx.input(last)?;
        Ok(v.len())
    });
    g.edge(last, sink);
    let read = g.gpu_node_in(d.groups()[(n + 1) % 2], "read", move |ctx| {
        Ok(ctx.download(ctx.input(last)?)?[0])
    });
    g.edge(last, read);
    let graph = g.build().unwrap();
    for round in 0..3 {
        let out = p.submit(&graph).unwrap().wait().unwrap();
        assert_eq!(out.get(read), Some(&(n as i64)), "round {round}");
        assert_eq!(out.get(sink), Some(&1));
    }
    // Without a host reader: the graph's completion waits for the chain's GPU work, tracked
    // on the handed-over stream of its last node.
    let mut g = GpuGraphBuilder::new("handoff-sink");
    let mut prev = None;
    for i in 0..4 {
        let spin = spin.clone();
        let r = g.gpu_node_in(d.groups()[i % 2], &format!("s{i}"), move |ctx| {
            // SAFETY: bp_spin takes one i64; ~25 ms at ~2 GHz.
            unsafe {
                ctx.launch(&spin, LaunchConfig::single())
                    .arg(50_000_000i64)
                    .launch()?
            };
            Ok(())
        });
        if let Some(b) = prev {
            g.edge(b, r);
        }
        prev = Some(r);
    }
    let graph = g.build().unwrap();
    let t0 = Instant::now();
    p.submit(&graph).unwrap().wait().unwrap();
    assert!(
        t0.elapsed() >= Duration::from_millis(40),
        "graph completed before its chain's GPU work: {:?}",
        t0.elapsed()
    );
    drop(p);
}
