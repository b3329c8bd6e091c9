//! An idle pool parks its workers (its own binary, so no other test's CPU use is measured):
//! parks are counted and the process uses almost no CPU while the pool waits for work.

use std::time::{Duration, Instant};

use boundpool_scheduler::{GraphBuilder, PoolBuilder};

/// The process's user + system CPU time, from /proc/self/stat (fields 14 and 15, in clock ticks).
fn process_cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    // The command name (field 2) may hold spaces; fields after its closing parenthesis are plain.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3, so field n is f[n - 3].
    let ticks: u64 = f[14 - 3].parse::<u64>().unwrap() + f[15 - 3].parse::<u64>().unwrap();
    // SC_CLK_TCK is 100 on every Linux this runs on.
    Duration::from_millis(ticks * 10)
}

/// CPU time of this process's threads whose name starts with `prefix`, from schedstat
/// (nanosecond resolution), if the kernel provides it.
fn threads_cpu(prefix: &str) -> Option<Duration> {
    let mut total = 0u64;
    for e in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
        let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
        if comm.trim_end().starts_with(prefix) {
            let s = std::fs::read_to_string(e.path().join("schedstat")).ok()?;
            total += s.split_whitespace().next()?.parse::<u64>().ok()?;
        }
    }
    Some(Duration::from_nanos(total))
}

#[test]
fn idle_pool_parks_and_uses_almost_no_cpu() {
    let pool = PoolBuilder::new().name("idle").workers(2).build().unwrap();
    // Work first, so the workers have been awake and gone idle again.
    let mut g = GraphBuilder::<()>::new("burst");
    let src = g.node("src", |_| Ok(()));
    for i in 0..2000 {
        let n = g.node(format!("n{i}"), |_| Ok(()));
        g.edge(src, n);
    }
    let graph = g.build().unwrap();
    let parks_before = pool.stats().parks();
    for _ in 0..5 {
        pool.run(&graph).unwrap();
    }
    std::thread::sleep(Duration::from_millis(100));
    let parks_after_work = pool.stats().parks();
    assert!(
        parks_after_work >= 2,
        "idle workers park: {parks_after_work} parks"
    );
    assert!(
        parks_after_work > parks_before,
        "workers parked again after the work: {parks_before} -> {parks_after_work}"
    );

    let window = Duration::from_millis(400);
    let (cpu0, thr0, t0) = (process_cpu(), threads_cpu("idle-"), Instant::now());
    std::thread::sleep(window);
    let (cpu1, thr1, elapsed) = (process_cpu(), threads_cpu("idle-"), t0.elapsed());
    let used = cpu1 - cpu0;
    let share = used.as_secs_f64() / elapsed.as_secs_f64();
    assert!(
        share < 0.05,
        "idle process used {used:?} CPU over {elapsed:?} ({:.1}% of a core)",
        share * 100.0
    );
    if let (Some(a), Some(b)) = (thr0, thr1) {
        let share = (b - a).as_secs_f64() / elapsed.as_secs_f64();
        assert!(
            share < 0.01,
            "idle workers used {:?} over {elapsed:?} ({:.2}% of a core)",
            b - a,
            share * 100.0
        );
    }
    // Parked workers stay parked: no periodic wake-ups while nothing happens.
    let parks_idle = pool.stats().parks() - parks_after_work;
    assert!(
        parks_idle <= 2,
        "{parks_idle} parks while idle: workers wake up without work"
    );
    // And they wake up for new work.
    pool.run(&graph).unwrap();
}
