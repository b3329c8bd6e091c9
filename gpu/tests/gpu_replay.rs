//! Replay tests: a graph's GPU work captured once into CUDA graphs and replayed. Run on a GPU
//! machine with `BOUNDPOOL_REQUIRE_GPU=1`; skipped (with a notice) without a GPU.

use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use boundpool_gpu::{
    builtin, BoxError, DeviceBuffer, GpuErrorKind, GpuGraphBuilder, GpuGraphExt, GpuPool, Kernel,
    LaunchConfig, Module, RNode, ReplayBuilder, ReplayCtx, Replayable,
};
use boundpool_test_support::{chain, replay_pool as pool, GpuTest};

#[derive(Clone)]
struct Kernels {
    set: Kernel,
    add: Kernel,
    spin: Kernel,
}

fn kernels() -> Kernels {
    let m = Module::builtin();
    Kernels {
        set: m.kernel(builtin::SET_I64).unwrap(),
        add: m.kernel(builtin::ADD_I64).unwrap(),
        spin: m.kernel(builtin::SPIN).unwrap(),
    }
}

/// A seeded random DAG: node `i` after up to 3 of the 16 nodes before it.
fn random_preds(n: usize, seed: u64) -> Vec<Vec<usize>> {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut next = move || {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (x >> 33) as usize
    };
    (0..n)
        .map(|i| {
            let mut ps = Vec::new();
            if i > 0 {
                for _ in 0..next() % 4 {
                    let p = i - 1 - next() % i.min(16);
                    if !ps.contains(&p) {
                        ps.push(p);
                    }
                }
            }
            ps
        })
        .collect()
}

fn constant(i: usize) -> i64 {
    (i as i64 + 1) * 1_000_003
}

/// Host reference: node `i` = constant(i) + its predecessors' values, + `v` for a root.
fn expected(preds: &[Vec<usize>], v: i64) -> Vec<i64> {
    let mut val = vec![0i64; preds.len()];
    for i in 0..preds.len() {
        let mut x = constant(i);
        for &p in &preds[i] {
            x = x.wrapping_add(val[p]);
        }
        if preds[i].is_empty() {
            x = x.wrapping_add(v);
        }
        val[i] = x;
    }
    val
}

/// The test graph: `input` (captured: allocates the per-run input buffer) -> `value` (host:
/// this run's value, from `next_value`) -> `upload` (eager GPU node: copies it into the input
/// buffer) -> a random DAG of captured nodes (each: spin, set its constant, add its
/// predecessors; roots add the input) -> `read` (eager GPU node: downloads every node's value,
/// returns them with the run's value).
struct TestGraph {
    replay: Replayable,
    read: RNode<(i64, Vec<i64>)>,
    preds: Vec<Vec<usize>>,
    body_calls: Arc<AtomicUsize>,
}

fn test_graph(
    pool: &GpuPool,
    name: &str,
    n: usize,
    seed: u64,
    instances: usize,
    next_value: Arc<dyn Fn() -> i64 + Send + Sync>,
    body_sleep: Duration,
) -> TestGraph {
    test_graph_with(pool, name, n, seed, instances, next_value, body_sleep, None)
}

/// [`test_graph`], captured with at most `max_width` branches per segment when given.
#[allow(clippy::too_many_arguments)]
fn test_graph_with(
    pool: &GpuPool,
    name: &str,
    n: usize,
    seed: u64,
    instances: usize,
    next_value: Arc<dyn Fn() -> i64 + Send + Sync>,
    body_sleep: Duration,
    max_width: Option<usize>,
) -> TestGraph {
    let dev = pool.devices()[0].clone();
    let k = kernels();
    let preds = random_preds(n, seed);
    let body_calls = Arc::new(AtomicUsize::new(0));
    let mut b = ReplayBuilder::new(name);
    b.instances(instances);
    if let Some(w) = max_width {
        b.max_width(w);
    }
    // Zeroed, so that its segment records work (a memset) and has an executable.
    let input = b.gpu_node(&dev, "input", |c: &ReplayCtx<'_, '_>| {
        Ok(c.gpu()?.alloc_zeros::<i64>(1)?)
    });
    let value = b.host_node("value", move |_c: &ReplayCtx<'_, '_>| Ok(next_value()));
    let upload = b.eager_gpu_node(&dev, "upload", move |c: &ReplayCtx<'_, '_>| {
        let v = c.input(value)?;
        let buf = c.input(input)?;
        // The input node's output, shared: a copy into it by reference, every run.
        c.copy_into(&[*v], &buf)?;
        Ok(())
    });
    b.edge(input, value);
    b.edge(value, upload);
    b.edge(input, upload);
    let mut nodes: Vec<RNode<DeviceBuffer<i64>>> = Vec::with_capacity(n);
    for (i, ps) in preds.iter().enumerate() {
        let ins: Vec<RNode<DeviceBuffer<i64>>> = ps.iter().map(|&p| nodes[p]).collect();
        let k = k.clone();
        let calls = body_calls.clone();
        let root = ps.is_empty();
        let r = b.gpu_node(
            &dev,
            &format!("n{i}"),
            move |c: &ReplayCtx<'_, '_>| -> Result<DeviceBuffer<i64>, BoxError> {
                calls.fetch_add(1, Ordering::SeqCst);
                if !body_sleep.is_zero() {
                    std::thread::sleep(body_sleep);
                }
                let g = c.gpu()?;
                let mut out = g.alloc::<i64>(1)?;
                // SAFETY: the kernels get the argument types they declare; every buffer is a
                // node output, which lives as long as the replay's instance.
                unsafe {
                    g.launch(&k.spin, LaunchConfig::single())
                        .arg(2_000i64)
                        .launch()?;
                    g.launch(&k.set, LaunchConfig::single())
                        .arg(&mut out)
                        .arg(constant(i))
                        .launch()?;
                    for p in &ins {
                        let src = c.input(*p)?;
                        g.launch(&k.add, LaunchConfig::single())
                            .arg(&mut out)
                            .arg(&*src)
                            .launch()?;
                    }
                    if root {
                        let src = c.input(input)?;
                        g.launch(&k.add, LaunchConfig::single())
                            .arg(&mut out)
                            .arg(&*src)
                            .launch()?;
                    }
                }
                Ok(out)
            },
        );
        for &p in ps {
            b.edge(nodes[p], r);
        }
        if root {
            b.edge(upload, r);
            b.edge(input, r);
        }
        nodes.push(r);
    }
    let all = nodes.clone();
    let read = b.eager_gpu_node(&dev, "read", move |c: &ReplayCtx<'_, '_>| {
        let g = c.gpu()?;
        let v = *c.input(value)?;
        let mut vals = Vec::with_capacity(all.len());
        for r in &all {
            vals.push(g.download(&*c.input(*r)?)?[0]);
        }
        Ok((v, vals))
    });
    for r in &nodes {
        b.edge(*r, read);
    }
    b.edge(value, read);
    TestGraph {
        replay: b.build().expect("replay graph builds"),
        read,
        preds,
        body_calls,
    }
}

fn check_run(t: &TestGraph, what: &str, out: &boundpool_gpu::ReplayOutput) -> i64 {
    let got = out.get(t.read).expect("read node output");
    let (v, vals) = &*got;
    let want = expected(&t.preds, *v);
    if vals != &want {
        let first = (0..want.len()).find(|&i| vals[i] != want[i]).unwrap();
        panic!(
            "{what}: value {v}: node n{first} = {} but should be {} (preds {:?}); {} of {} nodes wrong",
            vals[first],
            want[first],
            t.preds[first],
            (0..want.len()).filter(|&i| vals[i] != want[i]).count(),
            want.len()
        );
    }
    *v
}

/// `runs` times: sets the per-run input to `value(run)`, runs `t` eagerly and replayed, and
/// checks that both computed it and that every node's value is the same in both.
fn replay_matches_eager(
    p: &GpuPool,
    t: &TestGraph,
    next: &AtomicI64,
    runs: i64,
    value: impl Fn(i64) -> i64,
    what: &str,
) {
    for run in 0..runs {
        let v = value(run);
        next.store(v, Ordering::SeqCst);
        let eager = t.replay.run_eager(p).unwrap_or_else(|e| {
            panic!("eager run {run}: {}", chain(&e));
        });
        let replayed = t.replay.run(p).unwrap_or_else(|e| {
            panic!("{what} run {run}: {}", chain(&e));
        });
        assert_eq!(check_run(t, &format!("eager run {run}"), &eager), v);
        assert_eq!(check_run(t, &format!("{what} run {run}"), &replayed), v);
        assert_eq!(
            eager.get(t.read).unwrap().1,
            replayed.get(t.read).unwrap().1,
            "run {run}: {what} differs from eager"
        );
    }
}

#[test]
fn random_dag_replayed_100_times_matches_eager() {
    let Some(_t) = GpuTest::start("random_dag_replayed_100_times_matches_eager", 180) else {
        return;
    };
    let p = pool(4);
    let next = Arc::new(AtomicI64::new(0));
    let n2 = next.clone();
    let t = test_graph(
        &p,
        "random",
        120,
        7,
        1,
        Arc::new(move || n2.load(Ordering::SeqCst)),
        Duration::ZERO,
    );
    assert!(t.replay.segments() >= 1, "the captured nodes form segments");
    replay_matches_eager(&p, &t, &next, 100, |run| run * 7919 - 300, "replay");
    // The eager runs called the bodies 100 times each; the replays once (one capture).
    let calls = t.body_calls.load(Ordering::SeqCst);
    assert_eq!(
        calls,
        (100 + 1) * 120,
        "GPU bodies called {calls} times: 100 eager runs and one capture expected"
    );
    let s = t.replay.stats();
    assert_eq!(s.captures as usize, t.replay.segments(), "{s:?}");
    assert_eq!(s.instantiations as usize, t.replay.segments(), "{s:?}");
    assert_eq!(t.replay.executables(), t.replay.segments());
    eprintln!(
        "random DAG: {} segments, {} CUDA graph nodes, capture {:?}, instantiate {:?}",
        t.replay.segments(),
        s.captured_nodes,
        s.capture_time,
        s.instantiate_time
    );
}

#[test]
fn eager_graphs_run_on_other_workers_during_a_capture() {
    let Some(_t) = GpuTest::start("eager_graphs_run_on_other_workers_during_a_capture", 180) else {
        return;
    };
    let p = Arc::new(pool(4));
    // 200 bodies sleeping 1 ms each: the capture takes about 200 ms on one worker.
    let t = test_graph(
        &p,
        "slow capture",
        200,
        11,
        1,
        Arc::new(|| 42),
        Duration::from_millis(1),
    );
    let capturing = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let eager_done = Arc::new(AtomicUsize::new(0));
    let dev = p.devices()[0].clone();
    let threads: Vec<_> = (0..3)
        .map(|th| {
            let (p, capturing, eager_done, dev) = (
                p.clone(),
                capturing.clone(),
                eager_done.clone(),
                dev.clone(),
            );
            std::thread::spawn(move || {
                let k = kernels();
                let mut i = 0i64;
                while capturing.load(Ordering::SeqCst) {
                    let v = th * 1_000_000 + i;
                    let kk = k.clone();
                    // A small eager graph: allocate (stream-ordered), set, download.
                    let mut g = GpuGraphBuilder::new("eager during capture");
                    let a = g.gpu_node(&dev, "set", move |ctx| {
                        let mut b = ctx.alloc::<i64>(1)?;
                        // SAFETY: bp_set_i64(i64*, i64) on a live one-element buffer.
                        unsafe {
                            ctx.launch(&kk.set, LaunchConfig::single())
                                .arg(&mut b)
                                .arg(v)
                                .launch()?;
                        }
                        Ok(b)
                    });
                    let r = g.gpu_node(&dev, "get", move |ctx| Ok(ctx.download(ctx.input(a)?)?));
                    g.edge(a, r);
                    let graph = g.build().unwrap();
                    let h = p
                        .submit(&graph)
                        .unwrap_or_else(|e| panic!("eager graph during a capture: {}", chain(&e)));
                    let mut out = h
                        .wait()
                        .unwrap_or_else(|e| panic!("eager graph during a capture: {}", chain(&e)));
                    assert_eq!(
                        out.take(r).unwrap(),
                        vec![v],
                        "eager graph during a capture"
                    );
                    eager_done.fetch_add(1, Ordering::SeqCst);
                    i += 1;
                }
            })
        })
        .collect();
    let out = t
        .replay
        .run(&p)
        .unwrap_or_else(|e| panic!("capturing run with eager graphs beside it: {}", chain(&e)));
    capturing.store(false, Ordering::SeqCst);
    for h in threads {
        h.join().expect("eager submitter");
    }
    check_run(&t, "capturing run", &out);
    let during = eager_done.load(Ordering::SeqCst);
    assert!(
        during >= 3,
        "only {during} eager graphs completed during a ~200 ms capture: the other workers did not keep running"
    );
    for run in 0..5 {
        let out = t.replay.run(&p).unwrap();
        check_run(&t, &format!("replay {run} after the capture"), &out);
    }
    eprintln!("{during} eager graphs completed during the capture");
}

#[test]
fn thirty_two_threads_replay_one_graph() {
    let Some(_t) = GpuTest::start("thirty_two_threads_replay_one_graph", 240) else {
        return;
    };
    let p = Arc::new(pool(4));
    for instances in [1usize, 4] {
        let counter = Arc::new(AtomicI64::new(1));
        let c2 = counter.clone();
        // Each run takes its own value in its host node; the read node returns it with the
        // results, so a run that saw another run's input (a race between runs) is caught.
        let t = Arc::new(test_graph(
            &p,
            &format!("shared by 32 threads ({instances} instances)"),
            48,
            3,
            instances,
            Arc::new(move || c2.fetch_add(1, Ordering::SeqCst) * 1_000_033),
            Duration::ZERO,
        ));
        let runs_per_thread = 10;
        let seen = Arc::new(Mutex::new(Vec::new()));
        let hs: Vec<_> = (0..32)
            .map(|th| {
                let (t, p, seen) = (t.clone(), p.clone(), seen.clone());
                std::thread::spawn(move || {
                    for r in 0..runs_per_thread {
                        let out = t.replay.run(&p).unwrap_or_else(|e| {
                            panic!("thread {th} run {r}: {}", chain(&e));
                        });
                        let v = check_run(&t, &format!("thread {th} run {r}"), &out);
                        seen.lock().unwrap().push(v);
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().expect("replaying thread");
        }
        let mut seen = seen.lock().unwrap().clone();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(
            seen.len(),
            32 * runs_per_thread,
            "every run had its own value"
        );
        assert!(
            t.replay.instances() <= instances,
            "{} instances made, at most {instances} allowed",
            t.replay.instances()
        );
        assert_eq!(
            t.replay.executables(),
            t.replay.instances() * t.replay.segments(),
            "one executable per segment and instance"
        );
        eprintln!(
            "{instances} instance(s) allowed: {} made, {} executables",
            t.replay.instances(),
            t.replay.executables()
        );
    }
}

#[test]
fn host_nodes_run_every_time_between_segments() {
    let Some(_t) = GpuTest::start("host_nodes_run_every_time_between_segments", 120) else {
        return;
    };
    let p = pool(4);
    let dev = p.devices()[0].clone();
    let k = kernels();
    // a (GPU) -> h1 (host) -> b (GPU) -> h2 (host) -> c (GPU) -> read (eager GPU)
    let log: Arc<Mutex<Vec<String>>> = Arc::new(Mutex::new(Vec::new()));
    let gpu_calls = Arc::new(AtomicUsize::new(0));
    let mut bld = ReplayBuilder::new("segments");
    let mk = |name: &'static str, add_from: Option<RNode<DeviceBuffer<i64>>>, value: i64| {
        let (k, calls) = (k.clone(), gpu_calls.clone());
        move |c: &ReplayCtx<'_, '_>| -> Result<DeviceBuffer<i64>, BoxError> {
            calls.fetch_add(1, Ordering::SeqCst);
            let g = c.gpu()?;
            let mut out = g.alloc::<i64>(1)?;
            // SAFETY: kernels get the argument types they declare; buffers are node outputs.
            unsafe {
                // A long spin first: a host successor that did not wait for the segment would
                // run while it spins (checked through the order of the log below only when
                // the device is slow; the values check the GPU-side order).
                g.launch(&k.spin, LaunchConfig::single())
                    .arg(200_000i64)
                    .launch()?;
                g.launch(&k.set, LaunchConfig::single())
                    .arg(&mut out)
                    .arg(value)
                    .launch()?;
                if let Some(f) = add_from {
                    let src = c.input(f)?;
                    g.launch(&k.add, LaunchConfig::single())
                        .arg(&mut out)
                        .arg(&*src)
                        .launch()?;
                }
            }
            let _ = name;
            Ok(out)
        }
    };
    let a = bld.gpu_node(&dev, "a", mk("a", None, 1));
    let l1 = log.clone();
    let h1 = bld.host_node("h1", move |_c: &ReplayCtx<'_, '_>| {
        l1.lock().unwrap().push("h1".into());
        Ok(())
    });
    let b = bld.gpu_node(&dev, "b", mk("b", Some(a), 10));
    let l2 = log.clone();
    let h2 = bld.host_node("h2", move |_c: &ReplayCtx<'_, '_>| {
        l2.lock().unwrap().push("h2".into());
        Ok(())
    });
    let c = bld.gpu_node(&dev, "c", mk("c", Some(b), 100));
    let read = bld.eager_gpu_node(&dev, "read", move |cx: &ReplayCtx<'_, '_>| {
        let g = cx.gpu()?;
        Ok(g.download(&*cx.input(c)?)?[0])
    });
    bld.edge(a, h1)
        .edge(h1, b)
        .edge(a, b)
        .edge(b, h2)
        .edge(h2, c)
        .edge(b, c);
    bld.edge(c, read);
    let r = bld.build().unwrap();
    assert_eq!(r.segments(), 3, "a, b and c are separate segments");
    assert_ne!(r.segment_of(a), r.segment_of(b));
    assert_eq!(r.segment_of(h1), None);
    for run in 0..50 {
        let out = r
            .run(&p)
            .unwrap_or_else(|e| panic!("run {run}: {}", chain(&e)));
        assert_eq!(
            *out.get(read).unwrap(),
            111,
            "run {run}: c = 100 + (10 + 1)"
        );
    }
    let log = log.lock().unwrap();
    assert_eq!(log.len(), 100, "h1 and h2 ran every time: {log:?}");
    for (i, pair) in log.chunks(2).enumerate() {
        assert_eq!(pair, ["h1", "h2"], "run {i}: host nodes out of DAG order");
    }
    assert_eq!(
        gpu_calls.load(Ordering::SeqCst),
        3,
        "GPU bodies are called once, at the capture"
    );
}

#[test]
fn a_non_capturable_operation_names_the_node_and_eager_still_works() {
    let Some(_t) = GpuTest::start(
        "a_non_capturable_operation_names_the_node_and_eager_still_works",
        120,
    ) else {
        return;
    };
    let p = pool(4);
    let dev = p.devices()[0].clone();
    let k = kernels();
    for case in ["download", "free"] {
        let mut bld = ReplayBuilder::new(&format!("uncapturable {case}"));
        let k2 = k.clone();
        let a = bld.gpu_node(&dev, "fine", move |c: &ReplayCtx<'_, '_>| {
            let g = c.gpu()?;
            let mut out = g.alloc::<i64>(1)?;
            // SAFETY: bp_set_i64(i64*, i64) on a live one-element buffer.
            unsafe {
                g.launch(&k2.set, LaunchConfig::single())
                    .arg(&mut out)
                    .arg(5i64)
                    .launch()?;
            }
            Ok(out)
        });
        let bad = bld.gpu_node(&dev, "the bad one", move |c: &ReplayCtx<'_, '_>| {
            let g = c.gpu()?;
            let src = c.input(a)?;
            if case == "download" {
                Ok(g.download(&*src)?[0])
            } else {
                let tmp = g.alloc::<i64>(4)?;
                drop(tmp);
                Ok(5)
            }
        });
        bld.edge(a, bad);
        let r = bld.build().unwrap();
        // Each generation tries one capture: the run that makes it fails, naming the graph,
        // the node and why; later runs go eager; `update` asks for a new capture.
        for generation in 0..2 {
            let e = r.run(&p).expect_err("the capture must fail");
            let msg = chain(&e);
            assert!(
                msg.contains("'the bad one'") && msg.contains(&format!("'uncapturable {case}'")),
                "{case} generation {generation}: the error names the graph and the node: {msg}"
            );
            let reason = if case == "download" {
                "download"
            } else {
                "a free"
            };
            assert!(
                msg.contains(reason) && msg.contains("capture"),
                "{case} generation {generation}: the error says why ({reason}): {msg}"
            );
            assert_eq!(r.stats().failed_captures, generation + 1, "{:?}", r.stats());
            assert!(r
                .capture_failure()
                .is_some_and(|m| m.contains("'the bad one'")));
            for run in 0..3 {
                let out = r.run(&p).unwrap_or_else(|e| {
                    panic!(
                        "{case}: run {run} after a failed capture goes eager: {}",
                        chain(&e)
                    )
                });
                assert_eq!(*out.get(bad).unwrap(), 5, "{case}: eager value");
            }
            assert_eq!(
                r.stats().failed_captures,
                generation + 1,
                "no capture retried"
            );
            assert_eq!(r.stats().eager_fallbacks, 3 * (generation + 1));
            r.update();
            assert_eq!(r.capture_failure(), None);
        }
        // Eagerly the same graph works.
        let out = r
            .run_eager(&p)
            .unwrap_or_else(|e| panic!("{case}: eager run after a failed capture: {}", chain(&e)));
        assert_eq!(*out.get(bad).unwrap(), 5, "{case}: eager value");
    }
    // The kind survives in the scheduler error's chain.
    let _ = GpuErrorKind::Capture;
}

#[test]
fn a_thousand_replays_keep_memory_and_executables_stable() {
    let Some(_t) = GpuTest::start("a_thousand_replays_keep_memory_and_executables_stable", 300)
    else {
        return;
    };
    let p = pool(4);
    let dev = p.devices()[0].clone();
    let next = Arc::new(AtomicI64::new(0));
    let n2 = next.clone();
    let t = test_graph(
        &p,
        "1000 replays",
        64,
        5,
        1,
        Arc::new(move || n2.fetch_add(3, Ordering::SeqCst)),
        Duration::ZERO,
    );
    let free = |p: &GpuPool| -> usize {
        p.call(&p.devices()[0].clone(), |c| Ok(c.memory_info()?.0))
            .expect("memory info")
    };
    let mut at10 = None;
    for run in 0..1000 {
        let out = t
            .replay
            .run(&p)
            .unwrap_or_else(|e| panic!("run {run}: {}", chain(&e)));
        check_run(&t, &format!("run {run}"), &out);
        if run == 9 {
            at10 = Some((
                dev.live_allocations(),
                dev.replay_executables(),
                t.replay.executables(),
                free(&p),
            ));
        }
    }
    let (allocs10, dexec10, exec10, free10) = at10.unwrap();
    assert_eq!(
        t.replay.executables(),
        exec10,
        "executables grew over 1000 replays"
    );
    assert_eq!(dev.replay_executables(), dexec10, "device executables grew");
    // Release of the eager nodes' temporaries is asynchronous: allow the queue to drain.
    let t0 = Instant::now();
    while dev.live_allocations() > allocs10 && t0.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        dev.live_allocations() <= allocs10,
        "live allocations grew from {allocs10} to {}",
        dev.live_allocations()
    );
    let free1000 = free(&p);
    assert!(
        free1000 + (64 << 20) >= free10,
        "device free memory fell by {} MiB over 990 replays",
        (free10 - free1000) >> 20
    );
    assert_eq!(t.replay.stats().captures as usize, t.replay.segments());
}

#[test]
fn drops_on_foreign_threads_release_executables() {
    let Some(_t) = GpuTest::start("drops_on_foreign_threads_release_executables", 120) else {
        return;
    };
    let p = Arc::new(pool(4));
    let dev = p.devices()[0].clone();
    let before = dev.live_allocations();
    let t = Arc::new(test_graph(
        &p,
        "dropped elsewhere",
        32,
        9,
        2,
        Arc::new(|| 5),
        Duration::ZERO,
    ));
    // Two threads at once, so that both instances are made.
    let hs: Vec<_> = (0..2)
        .map(|_| {
            let (t, p) = (t.clone(), p.clone());
            std::thread::spawn(move || {
                for _ in 0..20 {
                    let out = t.replay.run(&p).unwrap();
                    check_run(&t, "before the drop", &out);
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    let held = dev.replay_executables();
    assert!(held >= t.replay.segments(), "executables held: {held}");
    let out = t.replay.run(&p).unwrap();
    let segments = t.replay.segments();
    // The graph on one foreign thread, a run's output (holding its instance) on another.
    let t = Arc::try_unwrap(t).ok().expect("last reference");
    std::thread::spawn(move || drop(t)).join().unwrap();
    let t0 = Instant::now();
    while dev.replay_executables() > segments && t0.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(
        dev.replay_executables(),
        segments,
        "after the graph's drop, only the instance an output still holds keeps executables ({held} before)"
    );
    std::thread::spawn(move || drop(out)).join().unwrap();
    let t0 = Instant::now();
    while (dev.replay_executables() > 0 || dev.live_allocations() > before)
        && t0.elapsed() < Duration::from_secs(5)
    {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(
        dev.replay_executables(),
        0,
        "executables dropped on foreign threads not destroyed within 5 s"
    );
    assert!(
        dev.live_allocations() <= before,
        "captured outputs not freed: {} live, {before} before",
        dev.live_allocations()
    );
    // Shutdown destroys what a live graph still holds.
    let next = Arc::new(AtomicU64::new(0));
    let t2 = test_graph(
        &p,
        "alive at shutdown",
        16,
        2,
        1,
        Arc::new(move || next.fetch_add(1, Ordering::SeqCst) as i64),
        Duration::ZERO,
    );
    t2.replay.run(&p).unwrap();
    assert!(dev.replay_executables() > 0);
    p.shutdown(boundpool_gpu::ShutdownMode::Finish);
    assert_eq!(
        dev.replay_executables(),
        0,
        "shutdown left executables of a live graph"
    );
    drop(t2);
}

#[test]
fn update_changes_arguments_in_place_and_reinstantiates_on_new_topology() {
    let Some(_t) = GpuTest::start(
        "update_changes_arguments_in_place_and_reinstantiates_on_new_topology",
        120,
    ) else {
        return;
    };
    let p = pool(4);
    let dev = p.devices()[0].clone();
    let k = kernels();
    let param = Arc::new(AtomicI64::new(3));
    let launches = Arc::new(AtomicI64::new(1));
    let mut bld = ReplayBuilder::new("update");
    let (p2, l2) = (param.clone(), launches.clone());
    let a = bld.gpu_node(&dev, "a", move |c: &ReplayCtx<'_, '_>| {
        let g = c.gpu()?;
        let mut out = g.alloc::<i64>(1)?;
        let v = p2.load(Ordering::SeqCst);
        // SAFETY: bp_set_i64(i64*, i64) on a live one-element buffer.
        unsafe {
            for _ in 0..l2.load(Ordering::SeqCst) {
                g.launch(&k.set, LaunchConfig::single())
                    .arg(&mut out)
                    .arg(v)
                    .launch()?;
            }
        }
        Ok(out)
    });
    let read = bld.eager_gpu_node(&dev, "read", move |c: &ReplayCtx<'_, '_>| {
        Ok(c.gpu()?.download(&*c.input(a)?)?[0])
    });
    bld.edge(a, read);
    let r = bld.build().unwrap();
    assert_eq!(*r.run(&p).unwrap().get(read).unwrap(), 3);
    param.store(4, Ordering::SeqCst);
    assert_eq!(
        *r.run(&p).unwrap().get(read).unwrap(),
        3,
        "without update the capture's argument is replayed"
    );
    r.update();
    assert_eq!(*r.run(&p).unwrap().get(read).unwrap(), 4, "after update");
    let s = r.stats();
    assert_eq!(
        (s.instantiations, s.updates, s.update_fallbacks),
        (1, 1, 0),
        "{s:?}"
    );
    // Another topology (two launches): the driver refuses the update; re-instantiated.
    launches.store(2, Ordering::SeqCst);
    param.store(9, Ordering::SeqCst);
    r.update();
    assert_eq!(
        *r.run(&p).unwrap().get(read).unwrap(),
        9,
        "after a topology change"
    );
    let s = r.stats();
    assert_eq!(
        (s.instantiations, s.updates, s.update_fallbacks),
        (2, 1, 1),
        "{s:?}"
    );
    assert_eq!(r.executables(), 1);
    assert_eq!(
        dev.replay_executables(),
        1,
        "the refused executable was destroyed"
    );
}

#[test]
fn a_captured_upload_is_repeated_by_every_replay() {
    let Some(_t) = GpuTest::start("a_captured_upload_is_repeated_by_every_replay", 120) else {
        return;
    };
    let p = pool(4);
    let dev = p.devices()[0].clone();
    let k = kernels();
    // a: upload [5] (staged: a device-to-device copy is captured); b: buf += buf. Eagerly,
    // every run gives 10; a replay that uploaded only once would give 10, 20, 40, ...
    let mut bld = ReplayBuilder::new("captured upload");
    let a = bld.gpu_node(&dev, "a", |c: &ReplayCtx<'_, '_>| {
        Ok(c.gpu()?.upload(&[5i64])?)
    });
    let b = bld.gpu_node(&dev, "b", move |c: &ReplayCtx<'_, '_>| {
        let g = c.gpu()?;
        let buf = c.input(a)?;
        // SAFETY: bp_add_i64(i64*, const i64*) on a live one-element buffer (in place).
        unsafe {
            g.launch(&k.add, LaunchConfig::single())
                .arg(&*buf)
                .arg(&*buf)
                .launch()?;
        }
        Ok(())
    });
    let read = bld.eager_gpu_node(&dev, "read", move |c: &ReplayCtx<'_, '_>| {
        Ok(c.gpu()?.download(&*c.input(a)?)?[0])
    });
    bld.edge(a, b).edge(b, read).edge(a, read);
    let r = bld.build().unwrap();
    for run in 0..10 {
        let out = r
            .run(&p)
            .unwrap_or_else(|e| panic!("run {run}: {}", chain(&e)));
        assert_eq!(
            *out.get(read).unwrap(),
            10,
            "run {run}: the upload was not replayed"
        );
    }
    assert_eq!(*r.run_eager(&p).unwrap().get(read).unwrap(), 10, "eager");
}

/// `n` nodes in a chain: node `i` after node `i - 1`.
fn chain_preds(n: usize) -> Vec<Vec<usize>> {
    (0..n)
        .map(|i| if i == 0 { vec![] } else { vec![i - 1] })
        .collect()
}

/// A replay graph of one captured node per entry of `preds` (node `i` after each node in
/// `preds[i]`), each launching the empty kernel, captured with `max_width` lanes when given.
fn empty_kernel_graph(
    dev: &boundpool_gpu::GpuDevice,
    name: &str,
    preds: &[Vec<usize>],
    max_width: Option<usize>,
) -> Replayable {
    let empty = Module::builtin().kernel(builtin::EMPTY).unwrap();
    let mut b = ReplayBuilder::new(name);
    if let Some(w) = max_width {
        b.max_width(w);
    }
    let mut refs: Vec<RNode<()>> = Vec::new();
    for (i, ps) in preds.iter().enumerate() {
        let k = empty.clone();
        let r = b.gpu_node(dev, &format!("n{i}"), move |c: &ReplayCtx<'_, '_>| {
            // SAFETY: the empty kernel takes no parameters.
            unsafe { c.gpu()?.launch(&k, LaunchConfig::single()).launch()? };
            Ok(())
        });
        for &q in ps {
            b.edge(refs[q], r);
        }
        refs.push(r);
    }
    b.build().unwrap()
}

#[test]
fn the_captured_graph_keeps_the_dags_edges() {
    let Some(_t) = GpuTest::start("the_captured_graph_keeps_the_dags_edges", 120) else {
        return;
    };
    let p = pool(4);
    let dev = p.devices()[0].clone();
    // One empty kernel per node: the CUDA graph must have exactly the DAG's nodes and edges
    // (not one serial chain), whichever the shape.
    let side = 8usize;
    let shapes: Vec<(&str, Vec<Vec<usize>>)> = vec![
        ("independent", vec![Vec::new(); 64]),
        ("chain", chain_preds(64)),
        (
            "wavefront 8x8",
            (0..side * side)
                .map(|i| {
                    let (r, c) = (i / side, i % side);
                    let mut ps = Vec::new();
                    if c > 0 {
                        ps.push(i - 1);
                    }
                    if r > 0 {
                        ps.push(i - side);
                    }
                    ps
                })
                .collect(),
        ),
        ("random", random_preds(64, 13)),
    ];
    for (name, preds) in shapes {
        let r = empty_kernel_graph(&dev, name, &preds, None);
        assert_eq!(r.segments(), 1, "{name}");
        r.run(&p)
            .unwrap_or_else(|e| panic!("{name}: {}", chain(&e)));
        let s = r.stats();
        let edges: usize = preds.iter().map(Vec::len).sum();
        // Exactly the DAG: no stand-in root (a driver refusing an empty dependency set gets one
        // during the capture, removed after it).
        assert!(
            (s.captured_nodes, s.captured_edges) == (preds.len() as u64, edges as u64),
            "{name}: captured {} nodes and {} edges; the DAG has {} nodes and {edges} edges",
            s.captured_nodes,
            s.captured_edges,
            preds.len()
        );
        for run in 0..3 {
            r.run(&p)
                .unwrap_or_else(|e| panic!("{name} replay {run}: {}", chain(&e)));
        }
    }
}

/// `max_width`: the captured graph has the DAG's edges plus lane edges, so that no more than
/// `w` nodes are unordered (independent nodes: `n - w` lane edges; a chain: none), and a
/// random DAG captured with 3 lanes still computes what the eager run computes.
#[test]
fn max_width_adds_lane_edges_and_keeps_results() {
    let Some(_t) = GpuTest::start("max_width_adds_lane_edges_and_keeps_results", 180) else {
        return;
    };
    let p = pool(4);
    let dev = p.devices()[0].clone();
    let cases: Vec<(&str, Vec<Vec<usize>>, usize, usize)> = vec![
        ("independent w4", vec![Vec::new(); 64], 4, 60),
        ("independent w1", vec![Vec::new(); 64], 1, 63),
        ("chain w1", chain_preds(64), 1, 63),
        ("chain w4", chain_preds(64), 4, 63),
    ];
    for (name, preds, w, edges) in cases {
        let r = empty_kernel_graph(&dev, name, &preds, Some(w));
        r.run(&p)
            .unwrap_or_else(|e| panic!("{name}: {}", chain(&e)));
        let s = r.stats();
        assert_eq!(
            (s.captured_nodes, s.captured_edges),
            (preds.len() as u64, edges as u64),
            "{name}: captured nodes and edges"
        );
    }
    let next = Arc::new(AtomicI64::new(0));
    let n2 = next.clone();
    let t = test_graph_with(
        &p,
        "random w3",
        120,
        11,
        1,
        Arc::new(move || n2.load(Ordering::SeqCst)),
        Duration::ZERO,
        Some(3),
    );
    replay_matches_eager(
        &p,
        &t,
        &next,
        20,
        |run| run * 104_729 - 77,
        "replay with 3 lanes",
    );
}
