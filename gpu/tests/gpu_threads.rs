//! Thread cap: 1,000 submitter threads each submitting GPU graphs; the process's OS threads
//! stay at what it had + the pool's workers + the submitters. (Own test binary: counts the
//! whole process's threads.)

use std::sync::{Arc, Barrier};

use boundpool_gpu::{builtin, GpuGraphBuilder, GpuGraphExt, LaunchConfig, Module};
use boundpool_test_support::{gpu_pool, os_threads, GpuTest};

#[test]
fn thousand_submitters_do_not_grow_the_pool() {
    let Some(_t) = GpuTest::start("thousand_submitters_do_not_grow_the_pool", 300) else {
        return;
    };
    // Let the driver start its own helper threads first (it starts some with the first context).
    let probe = boundpool_gpu::MemoryProbe::new(0).unwrap();
    probe.free_memory().unwrap();
    let base = os_threads();
    let pool = Arc::new(gpu_pool("gpu", 8, 1));
    let with_pool = os_threads();
    let workers = pool.pool().workers().len();
    eprintln!("threads: {base} before, {with_pool} with the pool ({workers} workers)");
    assert_eq!(
        with_pool,
        base + workers,
        "the pool made other threads than its workers"
    );
    let d = pool.devices()[0].clone();
    let empty = Module::builtin().kernel(builtin::EMPTY).unwrap();
    let mut g = GpuGraphBuilder::new("small");
    let a = g.gpu_node(&d, "a", {
        let k = empty.clone();
        move |ctx| {
            // SAFETY: the empty kernel takes no arguments.
            unsafe { ctx.launch(&k, LaunchConfig::single()).launch()? };
            Ok(())
        }
    });
    let b = g.gpu_node_in(d.group(), "b", {
        let k = empty.clone();
        move |ctx| {
            // SAFETY: the empty kernel takes no arguments.
            unsafe { ctx.launch(&k, LaunchConfig::single()).launch()? };
            Ok(())
        }
    });
    g.edge(a, b);
    let graph = Arc::new(g.build().unwrap());
    let n = 1000;
    let inside = Arc::new(Barrier::new(n + 1));
    let leave = Arc::new(Barrier::new(n + 1));
    let hs: Vec<_> = (0..n)
        .map(|_| {
            let (pool, graph, inside, leave) =
                (pool.clone(), graph.clone(), inside.clone(), leave.clone());
            std::thread::Builder::new()
                .stack_size(256 * 1024)
                .spawn(move || {
                    for _ in 0..5 {
                        pool.submit(&graph).unwrap().wait().unwrap();
                    }
                    inside.wait();
                    for _ in 0..5 {
                        pool.submit(&graph).unwrap().wait().unwrap();
                    }
                    leave.wait();
                })
                .unwrap()
        })
        .collect();
    inside.wait();
    let peak = os_threads();
    leave.wait();
    for h in hs {
        h.join().unwrap();
    }
    // A joined thread can stay listed in /proc for a moment after `join` returns (the kernel
    // wakes the joiner before it reaps the thread): give the count a few seconds to settle.
    let settle = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let mut after = os_threads();
    while after > with_pool + 1 && std::time::Instant::now() < settle {
        std::thread::sleep(std::time::Duration::from_millis(1));
        after = os_threads();
    }
    eprintln!("threads: {peak} with {n} submitters alive, {after} after they ended");
    assert!(
        peak <= with_pool + n + 1,
        "{peak} threads > pool {with_pool} + {n} submitters (+1 watchdog)"
    );
    assert!(after <= with_pool + 1);
    let stats = pool.pool().stats();
    eprintln!("stats: {stats:?}");
    drop(pool);
    drop(probe);
}
