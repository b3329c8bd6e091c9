//! Runs of a replay graph as a server makes them: each run brings its own inputs (input nodes)
//! and gets its own outputs, runs are submitted without blocking and waited or awaited, runs
//! beyond the graph's instances wait for one in order, a failing run fails alone, and a graph's
//! priority level holds for its replayed runs. Run on a GPU machine with
//! `BOUNDPOOL_REQUIRE_GPU=1`; skipped (with a notice) without a GPU.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use boundpool_gpu::{
    builtin, BoxError, DeviceBuffer, GpuErrorKind, GpuPool, LaunchConfig, Module, Priority, RNode,
    ReplayBuilder, ReplayCtx, Replayable, RunInputs,
};
use boundpool_test_support::{chain, replay_pool as pool, GpuTest};

const N: usize = 1024;

/// `x` (an input) uploaded into a captured static buffer, scaled by 2 in a captured kernel,
/// downloaded: the output is `2 * x`. A NaN first element fails the upload node.
struct Doubler {
    replay: Replayable,
    x: RNode<Vec<f32>>,
    out: RNode<Vec<f32>>,
}

fn doubler(p: &GpuPool, instances: usize, priority: Priority) -> Doubler {
    let dev = p.device(0).unwrap().clone();
    let scale = Module::builtin().kernel(builtin::SCALE_F32).unwrap();
    let mut b = ReplayBuilder::new("doubler");
    b.instances(instances).priority(priority);
    let x = b.input::<Vec<f32>>("x");
    let buf = b.gpu_node(&dev, "buf", |c: &ReplayCtx<'_, '_>| {
        Ok(c.gpu()?.alloc::<f32>(N)?)
    });
    let up = b.eager_gpu_node(&dev, "upload", move |c: &ReplayCtx<'_, '_>| {
        let x = c.input(x)?;
        if x[0].is_nan() {
            return Err::<(), BoxError>("a NaN request".into());
        }
        c.copy_into(&x, &*c.input(buf)?)?;
        Ok(())
    });
    let sc = b.gpu_node(&dev, "scale", move |c: &ReplayCtx<'_, '_>| {
        let buf: Arc<DeviceBuffer<f32>> = c.input(buf)?;
        // SAFETY: `bp_scale_f32(f32* x, f32 a, u32 n)` over the buffer's `N` elements; the
        // buffer is a captured node's output, alive as long as the instance.
        unsafe {
            c.gpu()?
                .launch(&scale, LaunchConfig::for_elements(N))
                .arg(&*buf)
                .arg(2.0f32)
                .arg(N as u32)
                .launch()?;
        }
        Ok(())
    });
    let out = b.eager_gpu_node(&dev, "download", move |c: &ReplayCtx<'_, '_>| {
        Ok(c.gpu()?.download(&*c.input(buf)?)?)
    });
    b.edge(x, up).edge(buf, up).edge(up, sc).edge(buf, sc);
    b.edge(sc, out).edge(buf, out);
    Doubler {
        replay: b.build().expect("builds"),
        x,
        out,
    }
}

/// Request `k`'s input: distinct for every `k`.
fn request(k: usize) -> Vec<f32> {
    (0..N).map(|i| (k * N + i) as f32).collect()
}

fn check(k: usize, got: &[f32]) {
    let want: Vec<f32> = request(k).iter().map(|v| 2.0 * v).collect();
    assert!(
        got == want.as_slice(),
        "request {k} got another request's data or a wrong value"
    );
}

#[test]
fn concurrent_runs_each_bring_their_input_and_get_their_output() {
    let Some(_t) = GpuTest::start("replay_runs_concurrent", 240) else {
        return;
    };
    let p = pool(4);
    let d = doubler(&p, 4, Priority::Normal);
    std::thread::scope(|s| {
        for t in 0..8 {
            let (d, p) = (&d, &p);
            s.spawn(move || {
                for i in 0..60 {
                    let k = t * 1000 + i;
                    let inputs = RunInputs::new().set(d.x, request(k));
                    let out = if i % 10 == 9 {
                        d.replay.run_eager_with(p, inputs)
                    } else {
                        d.replay.run_with(p, inputs)
                    }
                    .unwrap_or_else(|e| panic!("request {k}: {}", chain(&e)));
                    check(k, &out.get(d.out).expect("download output"));
                    assert_eq!(out.get(d.x).as_deref(), Some(&request(k)));
                }
            });
        }
    });
    assert!(d.replay.instances() >= 1 && d.replay.instances() <= 4);
    let st = d.replay.stats();
    assert_eq!(d.replay.segments(), 2, "buf, then scale after the upload");
    assert_eq!(
        st.captures as usize,
        d.replay.instances() * d.replay.segments(),
        "each instance captured once"
    );
    assert_eq!(st.failed_captures, 0);
}

/// Polls every future until all are ready, on this thread.
fn join_all<F: Future + Unpin>(mut fs: Vec<F>) -> Vec<F::Output> {
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut out: Vec<Option<F::Output>> = fs.iter().map(|_| None).collect();
    loop {
        for (f, o) in fs.iter_mut().zip(out.iter_mut()) {
            if o.is_none() {
                if let Poll::Ready(v) = Pin::new(f).poll(&mut cx) {
                    *o = Some(v);
                }
            }
        }
        if out.iter().all(Option::is_some) {
            return out.into_iter().map(Option::unwrap).collect();
        }
        std::thread::park_timeout(std::time::Duration::from_millis(50));
    }
}

#[test]
fn submitted_runs_wait_for_instances_in_order_and_await_without_blocking() {
    let Some(_t) = GpuTest::start("replay_runs_submitted", 240) else {
        return;
    };
    let p = pool(2);
    let d = doubler(&p, 2, Priority::Normal);
    for round in 0..5 {
        let base = round * 100;
        let mut handles = Vec::new();
        for k in 0..16 {
            handles.push(
                d.replay
                    .submit(&p, RunInputs::new().set(d.x, request(base + k)))
                    .expect("submits without blocking"),
            );
        }
        assert_eq!(d.replay.instances(), 2, "16 runs on 2 instances");
        // Dropping waiting runs withdraws them; their places go to the next ones.
        let dropped: Vec<usize> = vec![3, 7, 8, 15];
        let mut kept = Vec::new();
        for (k, h) in handles.into_iter().enumerate() {
            if dropped.contains(&k) {
                drop(h);
            } else {
                kept.push((k, h));
            }
        }
        let (ks, hs): (Vec<usize>, Vec<_>) = kept.into_iter().unzip();
        let outs = if round % 2 == 0 {
            join_all(hs)
        } else {
            hs.into_iter().map(|h| h.wait()).collect()
        };
        for (k, out) in ks.into_iter().zip(outs) {
            let out = out.unwrap_or_else(|e| panic!("request {}: {}", base + k, chain(&e)));
            check(base + k, &out.get(d.out).unwrap());
        }
    }
    assert_eq!(d.replay.instances(), 2);
    assert_eq!(
        d.replay.stats().captures,
        4,
        "2 instances x 2 segments, captured once"
    );
}

#[test]
fn a_failing_run_fails_alone_naming_its_node() {
    let Some(_t) = GpuTest::start("replay_runs_failing", 240) else {
        return;
    };
    let p = pool(4);
    let d = doubler(&p, 3, Priority::Normal);
    std::thread::scope(|s| {
        for t in 0..6 {
            let (d, p) = (&d, &p);
            s.spawn(move || {
                for i in 0..40 {
                    let k = t * 1000 + i;
                    let mut x = request(k);
                    let bad = (t + i) % 5 == 0;
                    if bad {
                        x[0] = f32::NAN;
                    }
                    let r = d.replay.run_with(p, RunInputs::new().set(d.x, x));
                    match (bad, r) {
                        (false, Ok(out)) => check(k, &out.get(d.out).unwrap()),
                        (true, Err(e)) => {
                            let msg = chain(&e);
                            assert!(
                                msg.contains("upload") && msg.contains("a NaN request"),
                                "the error names the node and why: {msg}"
                            );
                        }
                        (false, Err(e)) => panic!("request {k} failed: {}", chain(&e)),
                        (true, Ok(_)) => panic!("request {k} with a NaN succeeded"),
                    }
                }
            });
        }
    });
    assert_eq!(d.replay.stats().failed_captures, 0);
}

#[test]
fn run_inputs_are_checked_before_the_run_starts() {
    let Some(_t) = GpuTest::start("replay_runs_inputs", 120) else {
        return;
    };
    let p = pool(1);
    let d = doubler(&p, 1, Priority::Normal);
    let e = d.replay.run_with(&p, RunInputs::new()).unwrap_err();
    assert_eq!(e.kind(), GpuErrorKind::InvalidArgument);
    assert!(e.to_string().contains("input node 'x'"), "{e}");
    let other = doubler(&p, 1, Priority::Normal);
    let e = d
        .replay
        .run_with(&p, RunInputs::new().set(other.x, request(0)))
        .unwrap_err();
    assert!(e.to_string().contains("another replay graph"), "{e}");
    let e = d
        .replay
        .run_with(&p, RunInputs::new().set(d.out, request(0)))
        .unwrap_err();
    assert!(
        e.to_string().contains("'download'") && e.to_string().contains("not an input node"),
        "{e}"
    );
    assert_eq!(d.replay.instances(), 0, "a refused run takes no instance");
    let out = d
        .replay
        .run_with(&p, RunInputs::new().set(d.x, request(5)))
        .unwrap();
    check(5, &out.get(d.out).unwrap());
}

#[test]
fn a_graph_priority_holds_for_its_replayed_runs() {
    let Some(_t) = GpuTest::start("replay_runs_priority", 120) else {
        return;
    };
    let p = pool(2);
    let dev = p.device(0).unwrap().clone();
    let level = |priority: Priority| {
        let mut b = ReplayBuilder::new("level");
        b.priority(priority);
        let k = b.gpu_node(&dev, "captured", |c: &ReplayCtx<'_, '_>| {
            Ok(c.gpu()?.alloc_zeros::<u8>(8)?)
        });
        let s = b.eager_gpu_node(&dev, "stream", |c: &ReplayCtx<'_, '_>| {
            let g = c.gpu()?;
            Ok((g.stream_priority()?, g.stream_priority_range()?))
        });
        b.edge(k, s);
        let r = b.build().unwrap();
        let eager = r.run_eager(&p).unwrap().get(s).map(|v| *v).unwrap();
        let replayed = r.run(&p).unwrap().get(s).map(|v| *v).unwrap();
        assert_eq!(eager, replayed);
        eager
    };
    let (high, range) = level(Priority::High);
    assert_eq!(
        high, range.greatest,
        "a high graph's GPU nodes use the most urgent stream"
    );
    let (normal, _) = level(Priority::Normal);
    assert_ne!(normal, range.greatest);
}

/// The serving shape: each run's input written by a host node into its instance's pinned
/// buffer, the copy in, a kernel and the copy out captured in one segment, the output read by a
/// host node after it; eager runs the same graph with every body called.
#[test]
fn pinned_buffers_carry_each_run_in_and_out_of_a_replayed_segment() {
    let Some(_t) = GpuTest::start("replay_runs_pinned", 240) else {
        return;
    };
    let p = pool(4);
    let dev = p.device(0).unwrap().clone();
    let scale = Module::builtin().kernel(builtin::SCALE_F32).unwrap();
    let mut b = ReplayBuilder::new("pinned");
    b.instances(4);
    let x = b.input::<Vec<f32>>("x");
    let io = b.gpu_node(&dev, "io", |c: &ReplayCtx<'_, '_>| {
        let g = c.gpu()?;
        Ok((
            g.alloc_pinned::<f32>(N)?,
            g.alloc::<f32>(N)?,
            g.alloc_pinned::<f32>(N)?,
        ))
    });
    let stage = b.host_node("stage", move |c: &ReplayCtx<'_, '_>| {
        // SAFETY: one run holds the instance; the last run's copies ended before its read.
        unsafe { c.input(io)?.0.write(&c.input(x)?)? };
        Ok(())
    });
    let k = b.gpu_node(&dev, "scale", move |c: &ReplayCtx<'_, '_>| {
        let g = c.gpu()?;
        let io = c.input(io)?;
        let (pin_in, dev, pin_out) = &*io;
        let short = g.alloc_pinned::<f32>(N - 1)?;
        let e = g.copy_to_pinned(dev, &short).unwrap_err();
        assert_eq!(e.kind(), GpuErrorKind::InvalidArgument, "{e}");
        g.copy_from_pinned(pin_in, dev)?;
        // SAFETY: `bp_scale_f32(f32* x, f32 a, u32 n)` over the device buffer's `N` elements.
        unsafe {
            g.launch(&scale, LaunchConfig::for_elements(N))
                .arg(dev)
                .arg(2.0f32)
                .arg(N as u32)
                .launch()?;
        }
        g.copy_to_pinned(dev, pin_out)?;
        Ok(())
    });
    let read = b.host_node("read", move |c: &ReplayCtx<'_, '_>| {
        // SAFETY: a host node after `scale` runs once its copy out is done.
        Ok(unsafe { c.input(io)?.2.to_vec() })
    });
    b.edge(x, stage).edge(io, stage).edge(stage, k).edge(io, k);
    b.edge(k, read).edge(io, read);
    let r = b.build().unwrap();
    assert_eq!(r.segments(), 2);
    std::thread::scope(|s| {
        for t in 0..8 {
            let r = &r;
            let p = &p;
            s.spawn(move || {
                for i in 0..50 {
                    let k = 50_000 + t * 1000 + i;
                    let inputs = RunInputs::new().set(x, request(k));
                    let out = if i % 10 == 9 {
                        r.run_eager_with(p, inputs)
                    } else {
                        r.run_with(p, inputs)
                    }
                    .unwrap_or_else(|e| panic!("request {k}: {}", chain(&e)));
                    check(k, &out.get(read).unwrap());
                }
            });
        }
    });
    assert_eq!(r.stats().captures as usize, r.instances() * 2);
    // Dropping the graph drops every instance's pinned buffers: freed by bound workers.
    drop(r);
}

/// Zero-copy I/O: a replayed segment's kernels read the run's input from, and write its output
/// to, the instance's pinned buffers through their device addresses
/// (`PinnedBuffer::device_ptr`), no copy node; every run from four threads sees its own value.
#[test]
fn kernels_read_and_write_pinned_buffers_directly_in_a_replayed_segment() {
    let Some(_t) = GpuTest::start("replay_runs_zero_copy", 240) else {
        return;
    };
    let p = pool(4);
    let dev = p.device(0).unwrap().clone();
    let m = Module::builtin();
    let (set, add) = (
        m.kernel(builtin::SET_I64).unwrap(),
        m.kernel(builtin::ADD_I64).unwrap(),
    );
    let mut b = ReplayBuilder::new("zero-copy");
    b.instances(2);
    let x = b.input::<i64>("x");
    let io = b.gpu_node(&dev, "io", |c: &ReplayCtx<'_, '_>| {
        let g = c.gpu()?;
        Ok((
            g.alloc_pinned::<i64>(1)?,
            g.alloc::<i64>(1)?,
            g.alloc_pinned::<i64>(1)?,
        ))
    });
    let stage = b.host_node("stage", move |c: &ReplayCtx<'_, '_>| {
        // SAFETY: one run holds the instance; the last run's kernels ended before its read.
        unsafe { c.input(io)?.0.write(&[*c.input(x)?])? };
        Ok(())
    });
    let k = b.gpu_node(&dev, "double", move |c: &ReplayCtx<'_, '_>| {
        let g = c.gpu()?;
        let io = c.input(io)?;
        let (pin_in, d, pin_out) = &*io;
        let one = LaunchConfig::single();
        // SAFETY: `bp_set_i64(i64*, i64)` and `bp_add_i64(i64*, const i64*)` on one element
        // each: the device buffer, or a pinned buffer through its mapped address.
        unsafe {
            g.launch(&set, one).arg(d).arg(0i64).launch()?;
            g.launch(&add, one).arg(d).arg(pin_in).launch()?;
            g.launch(&add, one).arg(d).arg(pin_in).launch()?;
            g.launch(&set, one).arg(pin_out).arg(0i64).launch()?;
            g.launch(&add, one).arg(pin_out).arg(d).launch()?;
        }
        Ok(())
    });
    let read = b.host_node("read", move |c: &ReplayCtx<'_, '_>| {
        // SAFETY: a host node after `double` runs once its kernels are done.
        Ok(unsafe { c.input(io)?.2.to_vec() }[0])
    });
    b.edge(x, stage).edge(io, stage).edge(stage, k).edge(io, k);
    b.edge(k, read).edge(io, read);
    let r = b.build().unwrap();
    std::thread::scope(|s| {
        for t in 0..4i64 {
            let (r, p) = (&r, &p);
            s.spawn(move || {
                for i in 0..50i64 {
                    let v = t * 1_000_003 + i * 7 - 100;
                    let out = r
                        .run_with(p, RunInputs::new().set(x, v))
                        .unwrap_or_else(|e| panic!("run {t}/{i}: {}", chain(&e)));
                    assert_eq!(*out.get(read).unwrap(), 2 * v, "run {t}/{i}");
                }
            });
        }
    });
    assert_eq!(r.stats().captures as usize, r.instances() * 2);
}

#[test]
fn the_launch_probe_times_each_replayed_launch_once_its_worker_saw_it_done() {
    let Some(_t) = GpuTest::start(
        "the_launch_probe_times_each_replayed_launch_once_its_worker_saw_it_done",
        120,
    ) else {
        return;
    };
    let p = pool(2);
    let dev = p.device(0).unwrap().clone();
    let spin = Module::builtin().kernel(builtin::SPIN).unwrap();
    // One segment (a spin of a million cycles: over 250 µs at any clock below 4 GHz), then a
    // host node, so the segment's node completes when its worker sees the device done.
    let mut b = ReplayBuilder::new("probed");
    let s = b.gpu_node(&dev, "spin", move |c: &ReplayCtx<'_, '_>| {
        // SAFETY: `bp_spin` takes one i64.
        unsafe {
            c.gpu()?
                .launch(&spin, LaunchConfig::single())
                .arg(1_000_000i64)
                .launch()?
        };
        Ok(())
    });
    let h = b.host_node("after", |_c: &ReplayCtx<'_, '_>| Ok(()));
    b.edge(s, h);
    let r = b.build().unwrap();
    let run = |n: usize| {
        for i in 0..n {
            r.run(&p)
                .unwrap_or_else(|e| panic!("run {i}: {}", chain(&e)));
        }
    };
    run(3);
    assert!(r.take_launch_records().is_empty(), "the probe is off");
    r.probe_launches(true);
    let t0 = std::time::Instant::now();
    run(20);
    let recs = r.take_launch_records();
    assert_eq!(recs.len(), 19, "every probed launch but the last is read");
    let us = |d: std::time::Duration| d.as_secs_f64() * 1e6;
    // The device times are the host's clock through a calibrated reference: a few µs off.
    let slack = std::time::Duration::from_micros(50);
    for (i, l) in recs.iter().enumerate() {
        assert_eq!(l.segment, 0);
        assert!(l.begin >= t0 && l.begin < l.launched, "launch {i}: {l:?}");
        assert!(l.launch_call > std::time::Duration::ZERO);
        assert!(l.launch_call + l.record_calls <= l.launched - l.begin);
        if i > 0 {
            assert!(l.begin > recs[i - 1].seen.unwrap(), "launches in run order");
        }
        let device = l.device_end - l.device_start;
        assert!(
            device.as_micros() >= 250,
            "launch {i}: the spin's time on the device, {:.1} µs",
            us(device)
        );
        assert!(
            l.device_start + slack >= l.begin,
            "launch {i}: the device reached the start event before it was recorded: {l:?}"
        );
        let seen = l.seen.expect("the segment's completion was polled");
        let first = l.first_poll.expect("polled");
        assert!(
            l.polls >= 1 && first <= seen && first >= l.launched,
            "{l:?}"
        );
        assert!(
            l.poll_time <= seen - first + slack,
            "the polls before the last fall between the first and the last's start: {l:?}"
        );
        assert!(
            seen + slack >= l.device_end,
            "launch {i}: seen done before the device's end: {l:?}"
        );
    }
    r.probe_launches(false);
    run(3);
    assert!(
        r.take_launch_records().is_empty(),
        "off: no launch is probed, the last probed one stays unread"
    );
    r.probe_launches(true);
    run(2);
    assert_eq!(
        r.take_launch_records().len(),
        1,
        "turned on afresh: the launch left unread before is dropped"
    );
}
