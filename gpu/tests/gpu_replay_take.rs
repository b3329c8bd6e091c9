//! `ReplayCtx::take` under replay: captured nodes of one segment write their predecessor's
//! buffer in place (a memset, a cuBLAS GEMM accumulating with `beta = 1`, a kernel), the
//! instance keeps the buffer once (the last taker's output: the same allocation the first node
//! made, every replay), values right run after run with new inputs, eagerly, on two instances
//! at once and after `Replayable::update`; host and eager nodes take each run's values; every
//! take outside the rules refused by name, at `build` where declared with `hand_on`, at the
//! take otherwise (replayed and eager alike). Run on a GPU machine with
//! `BOUNDPOOL_REQUIRE_GPU=1`; skipped (with a notice) without a GPU.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use boundpool_gpu::cudarc::cublas::sys::cublasOperation_t;
use boundpool_gpu::cudarc::cublas::{Gemm, GemmConfig};
use boundpool_gpu::{
    builtin, BoxError, DeviceBuffer, GpuCtx, GpuDevice, GpuErrorKind, GpuPool, LaunchConfig,
    Module, RNode, ReplayBuilder, ReplayCtx, Replayable, RunInputs,
};
use boundpool_test_support::{chain, replay_pool, GpuTest};

const N: usize = 4096;

/// The graph: `x` (input) -> `load` (eager: copies it into `static`'s buffer) -> a captured
/// segment of four nodes that hand one buffer on: `zeros` (allocates it, zeroed), `add` (a
/// GEMM `acc = x · 1 + acc`), `scale` (`acc *= 3`, a kernel), `plus` (`acc = x · 1 + acc`
/// again), so `plus` leaves `4x` (any write that is not replayed in place, or replayed out of
/// order, leaves something else: a missing zeroing accumulates over runs) -> `read` (eager:
/// downloads it) -> `quarter` (host: takes the download and scales it by 0.25 in place).
struct Chain {
    r: Replayable,
    x: RNode<Vec<f32>>,
    zeros: RNode<DeviceBuffer<f32>>,
    add: RNode<DeviceBuffer<f32>>,
    scale: RNode<DeviceBuffer<f32>>,
    plus: RNode<DeviceBuffer<f32>>,
    read: RNode<Vec<f32>>,
    quarter: RNode<Vec<f32>>,
    /// The address of every buffer `zeros` made (one per capture).
    made: Arc<Mutex<Vec<u64>>>,
    /// Calls of the GPU bodies `zeros` .. `plus` (captures and eager runs).
    calls: Arc<AtomicUsize>,
}

/// `c = a · 1 + c` over N elements: `a` N×1, `one` 1×1, `c` N×1, column-major.
fn accumulate(
    g: &GpuCtx<'_, '_>,
    (a, one): &(DeviceBuffer<f32>, DeviceBuffer<f32>),
    c: &mut DeviceBuffer<f32>,
) -> Result<(), BoxError> {
    let cfg = GemmConfig {
        transa: cublasOperation_t::CUBLAS_OP_N,
        transb: cublasOperation_t::CUBLAS_OP_N,
        m: N as i32,
        n: 1,
        k: 1,
        alpha: 1.0f32,
        lda: N as i32,
        ldb: 1,
        beta: 1.0f32,
        ldc: N as i32,
    };
    // SAFETY: `a` and `c` hold N elements, `one` one, as the configuration says; `c` is this
    // node's (taken), the others are only read.
    unsafe { g.cublas()?.gemm(cfg, a, one, c)? };
    Ok(())
}

fn chain_graph(d: &GpuDevice, instances: usize) -> Chain {
    let made = Arc::new(Mutex::new(Vec::new()));
    let calls = Arc::new(AtomicUsize::new(0));
    let scale_kernel = Module::builtin().kernel(builtin::SCALE_F32).unwrap();
    let mut b = ReplayBuilder::new("take chain");
    b.instances(instances);
    let x = b.input::<Vec<f32>>("x");
    let stat = b.gpu_node(d, "static", |c: &ReplayCtx<'_, '_>| {
        let g = c.gpu()?;
        Ok((g.alloc::<f32>(N)?, g.upload(&[1.0f32])?))
    });
    let load = b.eager_gpu_node(d, "load", move |c: &ReplayCtx<'_, '_>| {
        c.copy_into(&c.input(x)?, &c.input(stat)?.0)?;
        Ok(())
    });
    let (m, k) = (made.clone(), calls.clone());
    let zeros = b.gpu_node(d, "zeros", move |c: &ReplayCtx<'_, '_>| {
        k.fetch_add(1, Ordering::SeqCst);
        let buf = c.gpu()?.alloc_zeros::<f32>(N)?;
        if c.is_capturing() {
            m.lock().unwrap().push(buf.device_ptr());
        }
        Ok(buf)
    });
    let k = calls.clone();
    let add = b.gpu_node(d, "add", move |c: &ReplayCtx<'_, '_>| {
        k.fetch_add(1, Ordering::SeqCst);
        let mut acc = c.take(zeros)?;
        accumulate(c.gpu()?, &*c.input(stat)?, &mut acc)?;
        Ok(acc)
    });
    let k = calls.clone();
    let scale = b.gpu_node(d, "scale", move |c: &ReplayCtx<'_, '_>| {
        k.fetch_add(1, Ordering::SeqCst);
        let mut acc = c.take(add)?;
        // SAFETY: bp_scale_f32(f32* x, f32 a, u32 n) over the N elements of `acc`, which
        // this node returns (the instance keeps it as long as the graph that writes it).
        unsafe {
            c.gpu()?
                .launch(&scale_kernel, LaunchConfig::for_elements(N))
                .arg(&mut acc)
                .arg(3.0f32)
                .arg(N as u32)
                .launch()?;
        }
        Ok(acc)
    });
    let k = calls.clone();
    let plus = b.gpu_node(d, "plus", move |c: &ReplayCtx<'_, '_>| {
        k.fetch_add(1, Ordering::SeqCst);
        let mut acc = c.take(scale)?;
        accumulate(c.gpu()?, &*c.input(stat)?, &mut acc)?;
        Ok(acc)
    });
    let read = b.eager_gpu_node(d, "read", move |c: &ReplayCtx<'_, '_>| {
        Ok(c.gpu()?.download(&*c.input(plus)?)?)
    });
    let quarter = b.host_node("quarter", move |c: &ReplayCtx<'_, '_>| {
        let mut v = c.take(read)?;
        v.iter_mut().for_each(|e| *e *= 0.25);
        Ok(v)
    });
    b.edge(x, load).edge(stat, load).edge(load, zeros);
    b.hand_on(zeros, add)
        .hand_on(add, scale)
        .hand_on(scale, plus);
    b.edge(stat, add).edge(stat, plus);
    b.edge(plus, read).hand_on(read, quarter);
    Chain {
        r: b.build().unwrap(),
        x,
        zeros,
        add,
        scale,
        plus,
        read,
        quarter,
        made,
        calls,
    }
}

fn input(k: u64) -> Vec<f32> {
    let mut s = k
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..N)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// What `plus` leaves for input `x`: `3x + x` in f32, as the device rounds it.
fn want(x: &[f32]) -> Vec<f32> {
    x.iter().map(|&v| v * 3.0 + v).collect()
}

fn assert_close(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-6 * (1.0 + w.abs()),
            "{what}: element {i}: {g}, want {w}"
        );
    }
}

/// Runs `c` with input `k` (replayed or eagerly) and checks everything a run shows: the
/// downloaded `4x`, the host taker's quarter of it, the taken outputs gone, the kept one there.
/// Returns the kept buffer's address.
fn run_and_check(c: &Chain, p: &GpuPool, k: u64, eager: bool) -> u64 {
    let x = input(k);
    let inputs = RunInputs::new().set(c.x, x.clone());
    let out = if eager {
        c.r.run_eager_with(p, inputs)
    } else {
        c.r.run_with(p, inputs)
    }
    .unwrap_or_else(|e| panic!("run {k} (eager {eager}): {}", chain(&e)));
    let w = want(&x);
    let q: Vec<f32> = w.iter().map(|v| v * 0.25).collect();
    assert_close(&out.get(c.quarter).unwrap(), &q, &format!("run {k}"));
    assert!(
        out.get(c.zeros).is_none()
            && out.get(c.add).is_none()
            && out.get(c.scale).is_none()
            && out.get(c.read).is_none(),
        "run {k}: a taken output is gone for the submitter"
    );
    out.get(c.plus)
        .expect("the last taker's output")
        .device_ptr()
}

/// Waits up to 10 s for the device's live allocations to come down to `n`.
fn wait_for_allocations(p: &GpuPool, n: usize) {
    let d = &p.devices()[0];
    let t0 = Instant::now();
    while d.live_allocations() > n && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(d.live_allocations(), n, "buffers not freed by the workers");
}

#[test]
fn a_captured_chain_writes_one_buffer_in_place_replay_after_replay() {
    let name = "a_captured_chain_writes_one_buffer_in_place_replay_after_replay";
    let Some(_t) = GpuTest::start(name, 180) else {
        return;
    };
    let p = replay_pool(2);
    let c = chain_graph(&p.devices()[0], 1);
    assert_eq!(c.r.segments(), 2, "static, then the chain after the load");
    let mut kept = HashSet::new();
    for k in 0..12 {
        kept.insert(run_and_check(&c, &p, k, false));
    }
    let first = c.made.lock().unwrap().clone();
    assert_eq!(first.len(), 1, "one capture");
    assert_eq!(
        kept,
        HashSet::from([first[0]]),
        "every replay wrote the buffer `zeros` made, kept as `plus`'s output"
    );
    assert_eq!(
        c.calls.load(Ordering::SeqCst),
        4,
        "bodies called once, at the capture"
    );
    let s = c.r.stats();
    assert_eq!((s.captures, s.failed_captures), (2, 0), "{s:?}");
    // What the instance keeps (a replayed run allocates nothing).
    let live = p.devices()[0].live_allocations();

    // Eager runs take along the same edges, every run (each its own buffer).
    for k in 100..104 {
        run_and_check(&c, &p, k, true);
    }
    assert_eq!(c.calls.load(Ordering::SeqCst), 4 + 4 * 4);

    // An update captures both bodies again: the taker gets the new buffer, the old one is
    // freed, replays go on in place in the new one.
    c.r.update();
    let mut kept = HashSet::new();
    for k in 200..208 {
        kept.insert(run_and_check(&c, &p, k, false));
    }
    let made = c.made.lock().unwrap().clone();
    assert_eq!(made.len(), 2, "captured again once");
    assert_eq!(
        kept,
        HashSet::from([made[1]]),
        "the new buffer, every replay"
    );
    let s = c.r.stats();
    assert_eq!((s.captures, s.failed_captures), (4, 0), "{s:?}");
    assert_eq!(s.eager_fallbacks, 0, "{s:?}");
    wait_for_allocations(&p, live);
    drop(c);
    wait_for_allocations(&p, 0);
}

#[test]
fn each_instance_keeps_its_own_taken_buffer() {
    let Some(_t) = GpuTest::start("each_instance_keeps_its_own_taken_buffer", 240) else {
        return;
    };
    let p = replay_pool(4);
    let c = chain_graph(&p.devices()[0], 2);
    let kept = Mutex::new(HashSet::new());
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let (c, p, kept) = (&c, &p, &kept);
            s.spawn(move || {
                for i in 0..25u64 {
                    let ptr = run_and_check(c, p, t * 1000 + i, i % 8 == 7);
                    if i % 8 != 7 {
                        kept.lock().unwrap().insert(ptr);
                    }
                }
            });
        }
    });
    let made: HashSet<u64> = c.made.lock().unwrap().iter().copied().collect();
    assert_eq!(made.len(), c.r.instances(), "one buffer per instance");
    assert_eq!(
        *kept.lock().unwrap(),
        made,
        "replays wrote their instance's buffer"
    );
    let s = c.r.stats();
    assert_eq!(s.captures as usize, 2 * c.r.instances(), "{s:?}");
    assert_eq!(s.failed_captures, 0, "{s:?}");
    drop(c);
    wait_for_allocations(&p, 0);
}

/// A buffer of 16 zeros (a captured node's body).
fn zeros16(c: &ReplayCtx<'_, '_>) -> Result<DeviceBuffer<u32>, BoxError> {
    Ok(c.gpu()?.alloc_zeros::<u32>(16)?)
}

/// A taker's body: takes `a`, zeroes it again, hands it on.
fn rezero(
    c: &ReplayCtx<'_, '_>,
    a: RNode<DeviceBuffer<u32>>,
) -> Result<DeviceBuffer<u32>, BoxError> {
    let mut buf = c.take(a)?;
    c.gpu()?.memset_zero(&mut buf)?;
    Ok(buf)
}

fn build_error(b: ReplayBuilder) -> String {
    let e = b.build().expect_err("the hand-on edge must be refused");
    assert_eq!(e.kind(), GpuErrorKind::InvalidArgument);
    e.to_string()
}

#[test]
fn declared_takes_outside_the_rules_fail_the_build_naming_both_nodes() {
    let name = "declared_takes_outside_the_rules_fail_the_build_naming_both_nodes";
    let Some(_t) = GpuTest::start(name, 60) else {
        return;
    };
    let p = replay_pool(1);
    let d = p.devices()[0].clone();

    // Another reader.
    let mut b = ReplayBuilder::new("two readers");
    let a = b.gpu_node(&d, "a", zeros16);
    let t = b.gpu_node(&d, "taker", move |c: &ReplayCtx<'_, '_>| rezero(c, a));
    let r = b.gpu_node(&d, "reader", move |c: &ReplayCtx<'_, '_>| {
        Ok(c.input(a)?.len())
    });
    b.hand_on(a, t).edge(a, r);
    let m = build_error(b);
    assert!(
        m.contains("replay graph 'two readers': node 'taker' takes the output of node 'a' (`hand_on`), which node 'reader' may also read (of 2 successors)"),
        "{m}"
    );

    // From an input node.
    let mut b = ReplayBuilder::new("input");
    let x = b.input::<Vec<u32>>("x");
    let h = b.host_node("h", move |c: &ReplayCtx<'_, '_>| Ok(c.take(x)?.len()));
    b.hand_on(x, h);
    let m = build_error(b);
    assert!(
        m.contains("node 'h' takes the output of node 'x' (`hand_on`), an input node"),
        "{m}"
    );

    // A captured taker of a host node's output.
    let mut b = ReplayBuilder::new("captured from host");
    let h = b.host_node("h", |_: &ReplayCtx<'_, '_>| Ok(7u32));
    let g = b.gpu_node(&d, "g", move |c: &ReplayCtx<'_, '_>| Ok(c.take(h)?));
    b.hand_on(h, g);
    let m = build_error(b);
    assert!(
        m.contains("node 'g' takes the output of node 'h' (`hand_on`), a host or eager node")
            && m.contains("while node 'g' is captured"),
        "{m}"
    );

    // An eager taker of a captured node's output.
    let mut b = ReplayBuilder::new("eager from captured");
    let a = b.gpu_node(&d, "a", zeros16);
    let e = b.eager_gpu_node(&d, "e", move |c: &ReplayCtx<'_, '_>| rezero(c, a));
    b.hand_on(a, e);
    let m = build_error(b);
    assert!(
        m.contains("node 'e' takes the output of node 'a' (`hand_on`), a captured node, whose output the replay instance keeps"),
        "{m}"
    );

    // Captured nodes of two segments (a host node on a path into the taker cuts them apart).
    let mut b = ReplayBuilder::new("two segments");
    let a = b.gpu_node(&d, "a", zeros16);
    let h = b.host_node("h", |_: &ReplayCtx<'_, '_>| Ok(()));
    let t = b.gpu_node(&d, "taker", move |c: &ReplayCtx<'_, '_>| rezero(c, a));
    b.hand_on(a, t).edge(h, t);
    let m = build_error(b);
    assert!(
        m.contains("node 'taker' takes the output of node 'a' (`hand_on`), captured in segment 0, node 'taker' in segment 1"),
        "{m}"
    );
}

/// Runs `r` replayed, then eagerly: both fail; the messages (whole chains).
fn both_fail(r: &Replayable, p: &GpuPool) -> (String, String) {
    let replayed = r.run(p).expect_err("the replayed run must fail");
    assert!(
        r.capture_failure()
            .is_some_and(|m| m.contains("failed at node 'taker'")),
        "a failed capture: {}",
        chain(&replayed)
    );
    let eager = r.run_eager(p).expect_err("the eager run must fail");
    (chain(&replayed), chain(&eager))
}

#[test]
fn undeclared_takes_outside_the_rules_fail_the_run_replayed_and_eager() {
    let name = "undeclared_takes_outside_the_rules_fail_the_run_replayed_and_eager";
    let Some(_t) = GpuTest::start(name, 60) else {
        return;
    };
    let p = replay_pool(1);
    let d = p.devices()[0].clone();

    // Another reader, along plain edges.
    let mut b = ReplayBuilder::new("two readers");
    let a = b.gpu_node(&d, "a", zeros16);
    let t = b.gpu_node(&d, "taker", move |c: &ReplayCtx<'_, '_>| rezero(c, a));
    let r = b.gpu_node(&d, "reader", move |c: &ReplayCtx<'_, '_>| {
        Ok(c.input(a)?.len())
    });
    b.edge(a, t).edge(a, r);
    let g = b.build().expect("undeclared: built");
    for m in <[String; 2]>::from(both_fail(&g, &p)) {
        assert!(
            m.contains("node 'taker' of replay graph 'two readers' takes the output of node 'a', which node 'reader' may also read"),
            "{m}"
        );
    }

    // Captured nodes of two segments.
    let mut b = ReplayBuilder::new("two segments");
    let a = b.gpu_node(&d, "a", zeros16);
    let h = b.host_node("h", |_: &ReplayCtx<'_, '_>| Ok(()));
    let t = b.gpu_node(&d, "taker", move |c: &ReplayCtx<'_, '_>| rezero(c, a));
    b.edge(a, t).edge(h, t);
    let g = b.build().expect("undeclared: built");
    for m in <[String; 2]>::from(both_fail(&g, &p)) {
        assert!(
            m.contains(
                "takes the output of node 'a', captured in segment 0, node 'taker' in segment 1"
            ),
            "{m}"
        );
    }

    // Taking twice, and reading what it took, under a capture.
    let mut b = ReplayBuilder::new("twice");
    let a = b.gpu_node(&d, "a", zeros16);
    let t = b.gpu_node(&d, "taker", move |c: &ReplayCtx<'_, '_>| {
        let first = c.take(a)?;
        let again = c.take(a).map(|_| ());
        Ok((first, again.map_err(|e| e.to_string()).unwrap_err()))
    });
    b.hand_on(a, t);
    let g = b.build().unwrap();
    let out = g.run(&p).unwrap_or_else(|e| panic!("{}", chain(&e)));
    let m = &out.get(t).unwrap().1;
    assert!(
        m.contains("node 'taker' of replay graph 'twice' takes the output of node 'a', which it took before"),
        "{m}"
    );
    let mut b = ReplayBuilder::new("read after take");
    let a = b.gpu_node(&d, "a", zeros16);
    let t = b.gpu_node(&d, "taker", move |c: &ReplayCtx<'_, '_>| {
        let first = c.take(a)?;
        let read = c.input(a).map(|_| ());
        Ok((first, read.map_err(|e| e.to_string()).unwrap_err()))
    });
    b.hand_on(a, t);
    let g = b.build().unwrap();
    let out = g.run(&p).unwrap_or_else(|e| panic!("{}", chain(&e)));
    let m = &out.get(t).unwrap().1;
    assert!(m.contains("this node took it"), "{m}");
    // Eagerly the scheduler refuses the same (its own words, inside ours).
    let out = g.run_eager(&p).unwrap_or_else(|e| panic!("{}", chain(&e)));
    let m = &out.get(t).unwrap().1;
    assert!(m.contains("which it took"), "{m}");
}
