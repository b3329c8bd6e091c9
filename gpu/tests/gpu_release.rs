//! Buffers dropped on foreign threads into an idle pool are released by the device's workers
//! on their own, without any later submission: within 100 ms `live_allocations()` is back to 0
//! and the device's free memory is back where it was. The drops are staggered over the first
//! ~100 µs after the graph returned, so some land while the workers still spin before parking,
//! some while they run the idle hook, some after they parked. (Own test binary: it reads the
//! whole device's free memory.)

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use boundpool_gpu::{DeviceBuffer, GpuGraphBuilder, GpuGraphExt, MemoryProbe};
use boundpool_test_support::{gpu_pool, GpuTest};

const BUFFERS: usize = 1600;
/// 256 KiB each: 400 MiB in all, far above the free-memory tolerance.
const ELEMS: usize = 64 * 1024;
const THREADS: usize = 16;
const ROUNDS: usize = 12;
const LIMIT: Duration = Duration::from_millis(100);
const TOLERANCE: usize = 32 << 20;

fn wait_for(what: &str, limit: Duration, since: Instant, mut f: impl FnMut() -> bool) -> Duration {
    loop {
        if f() {
            return since.elapsed();
        }
        assert!(
            since.elapsed() < limit,
            "{what} not within {limit:?} of the drops"
        );
        std::thread::sleep(Duration::from_micros(200));
    }
}

#[test]
fn drops_on_foreign_threads_into_an_idle_pool_are_released() {
    let Some(_t) = GpuTest::start(
        "drops_on_foreign_threads_into_an_idle_pool_are_released",
        300,
    ) else {
        return;
    };
    let probe = MemoryProbe::new(0).unwrap();
    // Several groups: the release is the device's business, whichever group is idle.
    let pool = gpu_pool("gpu", 8, 4);
    let d = pool.devices()[0].clone();
    let mut g = GpuGraphBuilder::new("buffers");
    let nodes: Vec<_> = (0..BUFFERS)
        .map(|i| {
            g.gpu_node(&d, &format!("alloc{i}"), |ctx| {
                Ok(ctx.alloc_zeros::<f32>(ELEMS)?)
            })
        })
        .collect();
    let graph = g.build().unwrap();
    let take_all = || {
        let mut out = pool.submit(&graph).unwrap().wait().unwrap();
        nodes
            .iter()
            .map(|&n| out.take(n).unwrap())
            .collect::<Vec<DeviceBuffer<f32>>>()
    };
    // Warm-up: the pool's streams, events and modules exist, the memory pool has been used.
    drop(take_all());
    wait_for(
        "warm-up release",
        Duration::from_secs(10),
        Instant::now(),
        || d.live_allocations() == 0,
    );
    std::thread::sleep(Duration::from_millis(20));
    let baseline = probe.free_memory().unwrap();
    let held_bytes = BUFFERS * ELEMS * 4;
    let mut worst_live = Duration::ZERO;
    let mut worst_free = Duration::ZERO;
    for round in 0..ROUNDS {
        let bufs = take_all();
        assert_eq!(d.live_allocations(), BUFFERS);
        let held = probe.free_memory().unwrap();
        assert!(
            baseline.saturating_sub(held) >= held_bytes / 2,
            "round {round}: the buffers hold device memory ({baseline} free before, {held} now)"
        );
        // Hand each thread its share, then drop them all at once from the foreign threads.
        let mut shares: Vec<Vec<DeviceBuffer<f32>>> = (0..THREADS).map(|_| Vec::new()).collect();
        for (i, b) in bufs.into_iter().enumerate() {
            shares[i % THREADS].push(b);
        }
        let go = Arc::new(Barrier::new(THREADS + 1));
        let threads: Vec<_> = shares
            .into_iter()
            .enumerate()
            .map(|(t, share)| {
                let go = go.clone();
                std::thread::spawn(move || {
                    go.wait();
                    // Staggered by thread and round across ~100 µs.
                    let delay = Duration::from_micros(((t * 7 + round * 11) % 100) as u64);
                    let t0 = Instant::now();
                    while t0.elapsed() < delay {
                        std::hint::spin_loop();
                    }
                    drop(share);
                })
            })
            .collect();
        go.wait();
        for t in threads {
            t.join().unwrap();
        }
        let dropped = Instant::now();
        let live = wait_for("live_allocations() == 0", LIMIT, dropped, || {
            d.live_allocations() == 0
        });
        let free = wait_for("device free memory back", LIMIT, dropped, || {
            probe.free_memory().unwrap() + TOLERANCE >= baseline
        });
        worst_live = worst_live.max(live);
        worst_free = worst_free.max(free);
    }
    eprintln!(
        "{ROUNDS} rounds of {BUFFERS} buffers dropped on {THREADS} threads: all released within \
         {worst_live:?}, free memory back within {worst_free:?} (limit {LIMIT:?})"
    );
    drop(pool);
}
