//! The GPU backend's metrics on the Prometheus endpoint (own process: the recorder is global).
//! Skips visibly without a GPU; fails instead under `BOUNDPOOL_REQUIRE_GPU=1` (the GPU guard
//! of `boundpool-test-support`, which also checks the pools' driver calls' contexts).

use std::net::{SocketAddr, TcpListener};
use std::time::{Duration, Instant};

use boundpool::gpu::{
    builtin, DeviceBuffer, Devices, GpuGraphBuilder, GpuGraphExt, GpuPoolBuilder, LaunchConfig,
    Module, ReplayBuilder, ReplayCtx, SmPartition, GPU_METRICS,
};
use boundpool_test_support::{gpu_pool, GpuTest};

fn scrape(addr: SocketAddr) -> String {
    let agent = ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(5))
        .build();
    agent
        .get(&format!("http://{addr}/metrics"))
        .call()
        .expect("the endpoint answers")
        .into_string()
        .unwrap()
}

/// The sample of `name` for device 0 of pool `pool`, if it appears.
fn sample(text: &str, name: &str, pool: &str) -> Option<f64> {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .filter(|l| l.contains(&format!("pool=\"{pool}\"")) && l.contains("device=\"0\""))
        .find_map(|l| l.rsplit(' ').next()?.parse().ok())
}

#[test]
fn gpu_metrics_are_exported_per_device() {
    let Some(_t) = GpuTest::start("gpu_metrics_are_exported_per_device", 300) else {
        return;
    };
    let addr = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let _h = boundpool::observe::install_prometheus(addr).expect("the endpoint starts");
    let pool = gpu_pool("gpu-metrics", 2, 2);
    let d = pool.devices()[0].clone();
    // Every series is there before any work: at zero, but the device's SM count (one
    // partition, `all`, without SM partitions) and each worker's partition (1, `all`).
    let text = scrape(addr);
    let sms = d.info().sms;
    assert!(sms > 0);
    for &(name, ..) in GPU_METRICS {
        let want = match name {
            "boundpool_gpu_partition_sms" => f64::from(sms),
            // An info gauge: 1 for each worker, naming its partition.
            "boundpool_gpu_worker_partition" => 1.0,
            _ => 0.0,
        };
        assert_eq!(
            sample(&text, name, "gpu-metrics"),
            Some(want),
            "{name} not exported at {want}"
        );
    }
    let set = Module::builtin().kernel(builtin::SET_I64).unwrap();
    // a -> b and a -> x on another group (two GPU successors: no hand-off, so event edges),
    // b -> c (b's one GPU successor: a hand-off).
    let mut g = GpuGraphBuilder::new("edges");
    let (s1, s2) = (set.clone(), set.clone());
    let a = g.gpu_node_in(d.groups()[0], "a", move |ctx| {
        let mut b = ctx.alloc::<i64>(1)?;
        // SAFETY: bp_set_i64(i64*, i64) on a one-element buffer.
        unsafe {
            ctx.launch(&s1, LaunchConfig::single())
                .arg(&mut b)
                .arg(1i64)
                .launch()?
        };
        Ok(b)
    });
    let b = g.gpu_node_in(d.groups()[1], "b", move |ctx| {
        let _ = ctx.input(a)?;
        let mut b = ctx.alloc::<i64>(1)?;
        // SAFETY: as above.
        unsafe {
            ctx.launch(&s2, LaunchConfig::single())
                .arg(&mut b)
                .arg(2i64)
                .launch()?
        };
        Ok(b)
    });
    let c = g.gpu_node_in(d.groups()[1], "c", move |ctx| {
        let v: &DeviceBuffer<i64> = ctx.input(b)?;
        Ok(ctx.download(v)?)
    });
    let x = g.gpu_node_in(d.groups()[1], "x", move |ctx| Ok(ctx.input(a)?.len()));
    g.edge(a, b).edge(a, x).edge(b, c);
    let graph = g.build().unwrap();
    for _ in 0..20 {
        let out = pool.submit(&graph).unwrap().wait().unwrap();
        assert_eq!(out.get(c).unwrap(), &vec![2]);
    }
    // A replay: one capture, then replays.
    let mut rb = ReplayBuilder::new("replayed");
    let s3 = set.clone();
    let buf = pool.call(&d, |ctx| Ok(ctx.alloc::<i64>(1)?)).unwrap();
    let buf = std::sync::Arc::new(buf);
    let kb = buf.clone();
    rb.gpu_node(&d, "set", move |c: &ReplayCtx<'_, '_>| {
        // SAFETY: bp_set_i64(i64*, i64) on a one-element buffer that outlives the replay.
        unsafe {
            c.gpu()?
                .launch(&s3, LaunchConfig::single())
                .arg(&*kb)
                .arg(3i64)
                .launch()?
        };
        Ok(())
    });
    let r = rb.build().unwrap();
    for _ in 0..5 {
        r.run(&pool).unwrap();
    }
    drop(r);
    drop(buf);
    // A replay whose capture fails (a download under a capture): counted once, its later runs
    // go eager.
    let mut fb = ReplayBuilder::new("uncapturable");
    fb.gpu_node(&d, "download", |c: &ReplayCtx<'_, '_>| {
        let g = c.gpu()?;
        let b = g.alloc_zeros::<i64>(1)?;
        Ok(g.download(&b)?)
    });
    let f = fb.build().unwrap();
    let e = f.run(&pool).expect_err("a download cannot be captured");
    let msg = std::iter::successors(Some(&e as &dyn std::error::Error), |x| x.source())
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(" <- ");
    assert!(
        msg.contains("graph 'uncapturable' failed at node 'download'"),
        "{msg}"
    );
    for _ in 0..3 {
        f.run(&pool).expect("later runs go eager");
    }
    drop(f);
    // Workers push their edge counts when they go idle; drops are released by them.
    let t0 = Instant::now();
    let ok = |t: &str| {
        let v = |n| sample(t, n, "gpu-metrics").unwrap_or(-1.0);
        v("boundpool_gpu_event_edges_total") >= 20.0
            && v("boundpool_gpu_stream_handoffs_total") >= 20.0
            && v("boundpool_gpu_captures_total") >= 1.0
            && v("boundpool_gpu_replays_total") >= 4.0
            && v("boundpool_gpu_exec_instantiations_total") >= 1.0
            && v("boundpool_gpu_capture_failures_total") == 1.0
            && v("boundpool_gpu_live_buffers") == 0.0
            && v("boundpool_gpu_releases_queued_total") >= 41.0
            && v("boundpool_gpu_releases_done_total") == v("boundpool_gpu_releases_queued_total")
    };
    let mut text = scrape(addr);
    while !ok(&text) && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
        text = scrape(addr);
    }
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("boundpool_gpu_"))
        .collect();
    assert!(
        ok(&text),
        "GPU metrics after the work:\n{}",
        lines.join("\n")
    );
    assert_eq!(
        sample(&text, "boundpool_gpu_sticky_failures_total", "gpu-metrics"),
        Some(0.0)
    );
    drop(pool);
    // A pool of SM partitions exports what each got and each worker's partition.
    let parts = GpuPoolBuilder::new()
        .name("gpu-metrics-parts")
        .devices(Devices::List(vec![0]))
        .sm_partitions(vec![
            SmPartition::new("lat", 8),
            SmPartition::rest("bulk").workers(2),
        ])
        .build()
        .unwrap();
    let d = parts.devices()[0].clone();
    let text = scrape(addr);
    let series = |name: &str, partition: &str| -> Vec<f64> {
        text.lines()
            .filter(|l| l.starts_with(&format!("{name}{{")))
            .filter(|l| l.contains("pool=\"gpu-metrics-parts\""))
            .filter(|l| l.contains(&format!("partition=\"{partition}\"")))
            .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
            .collect()
    };
    assert_eq!(series("boundpool_gpu_partition_sms", "lat"), [8.0]);
    let bulk = f64::from(d.partition("bulk").unwrap().sms);
    assert_eq!(series("boundpool_gpu_partition_sms", "bulk"), [bulk]);
    assert_eq!(series("boundpool_gpu_worker_partition", "lat"), [1.0]);
    assert_eq!(series("boundpool_gpu_worker_partition", "bulk"), [1.0, 1.0]);
}
