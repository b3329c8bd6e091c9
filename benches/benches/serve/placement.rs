//! Where the bench's client threads run (`--isolate`): by default wherever the OS puts them;
//! `workers` keeps every client off the pool's worker cores, so that a worker never waits
//! behind a client for its core; `high` also gives the latency-critical client a core that no
//! other client uses. A server does what `workers` does with `Pool::keep_off_workers` on the
//! thread that starts its request threads.

use std::sync::OnceLock;

use boundpool::gpu::GpuPool;

/// The batch clients' cores, and the latency-critical client's own core (with `high`).
static CORES: OnceLock<(Vec<usize>, Option<usize>)> = OnceLock::new();

/// Pins the calling thread to `cores`.
fn pin_to(cores: &[usize]) {
    // SAFETY: a zeroed cpu_set_t is a valid empty set, CPU_SET writes bits inside it, and
    // sched_setaffinity reads it for the calling thread (0).
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &c in cores {
            libc::CPU_SET(c, &mut set);
        }
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    assert_eq!(
        rc,
        0,
        "sched_setaffinity to {cores:?}: {}",
        std::io::Error::last_os_error()
    );
}

/// Chooses the clients' cores from `mode` (`None`: no placement) and the cores `pool`'s
/// workers are pinned to, and prints them.
pub(super) fn init(mode: Option<&str>, pool: &GpuPool) {
    let Some(mode) = mode else { return };
    let worker_cores: Vec<usize> = pool
        .pool()
        .workers()
        .iter()
        .filter_map(|w| w.core)
        .collect();
    let mut free = pool.pool().free_cores();
    let high = if mode == "high" && free.len() > 1 {
        free.pop()
    } else {
        None
    };
    println!(
        "clients placed ({mode}): workers on {worker_cores:?}, batch clients on {free:?}, the latency-critical client on {}",
        high.map_or_else(|| format!("{free:?}"), |h| format!("[{h}]"))
    );
    let _ = CORES.set((free, high));
}

/// Called first on each batch client's thread.
pub(super) fn batch_thread() {
    if let Some((free, _)) = CORES.get() {
        pin_to(free);
    }
}

/// Called first on the latency-critical client's thread.
pub(super) fn high_thread() {
    match CORES.get() {
        Some((_, Some(h))) => pin_to(&[*h]),
        Some((free, None)) => pin_to(free),
        None => {}
    }
}
