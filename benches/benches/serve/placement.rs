//! Where the bench's client threads run (`--isolate`): by default wherever the OS puts them;
//! `workers` keeps every client off the pool's worker cores (`Pool::keep_off_workers`'s set),
//! so that a worker never waits behind a client for its core; `high` also gives the
//! latency-critical client a core that no other client uses. Both through the scheduler's
//! `pin_current_thread`, as a server would place its own request threads.

use std::sync::OnceLock;

use boundpool::gpu::GpuPool;
use boundpool::pin_current_thread;

/// The batch clients' cores, and the latency-critical client's own core (with `high`).
static CORES: OnceLock<(Vec<usize>, Option<usize>)> = OnceLock::new();

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
        pin_current_thread(free).expect("batch client placed");
    }
}

/// Called first on the latency-critical client's thread.
pub(super) fn high_thread() {
    match CORES.get() {
        Some((_, Some(h))) => pin_current_thread(&[*h]).expect("latency-critical client placed"),
        Some((free, None)) => pin_current_thread(free).expect("latency-critical client placed"),
        None => {}
    }
}
