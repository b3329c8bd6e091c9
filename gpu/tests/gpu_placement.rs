//! "On the device" means any worker of the device: with `groups_per_device(4)`, nodes placed
//! with `gpu_node(&device, …)` run on workers of more than one of its groups (all of them, on a
//! wide enough graph), never on the host group, and their GPU edges still order their work.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use boundpool_gpu::{
    builtin, Cores, DeviceBuffer, GpuGraphBuilder, GpuGraphExt, LaunchConfig, Module, Placement,
};
use boundpool_test_support::{gpu_pool, gpu_pool_builder, GpuTest};

#[test]
fn device_placement_spans_every_group_of_the_device() {
    let Some(_t) = GpuTest::start("device_placement_spans_every_group_of_the_device", 300) else {
        return;
    };
    let pool = gpu_pool_builder(8, 4)
        .host_workers(1, Cores::Unpinned)
        .build()
        .unwrap();
    let d = pool.devices()[0].clone();
    assert_eq!(d.groups().len(), 4);
    assert!(
        matches!(d.placement(), Placement::Domain(_)),
        "{:?}",
        d.placement()
    );
    let host = pool.host_group().unwrap();
    let empty = Module::builtin().kernel(builtin::EMPTY).unwrap();
    let seen: Arc<Mutex<Vec<usize>>> = Arc::new(Mutex::new(Vec::new()));
    let mut g = GpuGraphBuilder::new("wide");
    let src = g.gpu_node(&d, "src", |_| Ok(()));
    let sink = g.gpu_node(&d, "sink", |_| Ok(()));
    for i in 0..800 {
        let (k, seen) = (empty.clone(), seen.clone());
        let n = g.gpu_node(&d, &format!("n{i}"), move |ctx| {
            seen.lock()
                .unwrap()
                .push(ctx.node().worker_info().group.index());
            // SAFETY: the empty kernel takes no parameters.
            unsafe { ctx.launch(&k, LaunchConfig::single()).launch()? };
            // Host time per node, so one worker cannot drain the graph alone.
            let t0 = Instant::now();
            while t0.elapsed() < Duration::from_micros(20) {
                std::hint::spin_loop();
            }
            Ok(())
        });
        g.edge(src, n).edge(n, sink);
    }
    let graph = g.build().unwrap();
    let device_groups: HashSet<usize> = d.groups().iter().map(|g| g.index()).collect();
    let mut groups_seen = HashSet::new();
    for run in 0..10 {
        seen.lock().unwrap().clear();
        pool.submit(&graph).unwrap().wait().unwrap();
        let s = std::mem::take(&mut *seen.lock().unwrap());
        assert_eq!(s.len(), 800);
        for &grp in &s {
            assert!(
                device_groups.contains(&grp) && grp != host.index(),
                "run {run}: a device node ran on group {grp}, not one of the device's {device_groups:?}"
            );
        }
        groups_seen.extend(s);
        if groups_seen.len() == 4 {
            break;
        }
    }
    eprintln!("device nodes ran on groups {groups_seen:?} of {device_groups:?}");
    assert!(
        groups_seen.len() > 1,
        "device-placed nodes ran on one group only: {groups_seen:?}"
    );
    drop(pool);
}

/// Device-placed chains whose nodes may land on any worker of the device still order their
/// GPU work: each chain sets a value and adds to it 50 times, checked on the host.
#[test]
fn device_placed_chains_stay_ordered_across_groups() {
    let Some(_t) = GpuTest::start("device_placed_chains_stay_ordered_across_groups", 300) else {
        return;
    };
    let pool = gpu_pool("gpu", 8, 4);
    let d = pool.devices()[0].clone();
    let m = Module::builtin();
    let set = m.kernel(builtin::SET_I64).unwrap();
    let add = m.kernel(builtin::ADD_I64).unwrap();
    let mut g = GpuGraphBuilder::new("chains");
    let mut ends = Vec::new();
    for c in 0..16i64 {
        let k = set.clone();
        let first = g.gpu_node(&d, &format!("c{c}.set"), move |ctx| {
            let mut b = ctx.alloc::<i64>(1)?;
            // SAFETY: bp_set_i64(i64*, i64) writes one element of a one-element buffer.
            unsafe {
                ctx.launch(&k, LaunchConfig::single())
                    .arg(&mut b)
                    .arg(c)
                    .launch()?
            };
            Ok(b)
        });
        let mut prev = first;
        for s in 0..50 {
            let (set, add) = (set.clone(), add.clone());
            let n = g.gpu_node(&d, &format!("c{c}.add{s}"), move |ctx| {
                let src: &DeviceBuffer<i64> = ctx.input(prev)?;
                let mut b = ctx.alloc::<i64>(1)?;
                // SAFETY: bp_set_i64(i64*, i64) writes one element of a one-element buffer;
                // bp_add_i64(i64* dst, const i64* src) adds one element of `src` to it.
                unsafe {
                    ctx.launch(&set, LaunchConfig::single())
                        .arg(&mut b)
                        .arg(1i64)
                        .launch()?;
                    ctx.launch(&add, LaunchConfig::single())
                        .arg(&mut b)
                        .arg(src)
                        .launch()?;
                }
                Ok(b)
            });
            g.edge(prev, n);
            prev = n;
        }
        ends.push((c, prev));
    }
    let graph = g.build().unwrap();
    for _ in 0..5 {
        let out = pool.submit(&graph).unwrap().wait().unwrap();
        for &(c, end) in &ends {
            let v = pool.download(out.get(end).unwrap()).unwrap();
            assert_eq!(v, vec![c + 50], "chain {c}");
        }
    }
    drop(pool);
}
