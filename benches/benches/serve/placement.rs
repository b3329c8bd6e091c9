//! Where the bench's client threads run (`--isolate`): by default wherever the OS puts them;
//! `workers` keeps every client off the pool's worker cores (`Pool::keep_off_workers`'s set),
//! so that a worker never waits behind a client for its core; `high` also gives the
//! latency-critical client a core of its own (`Pool::reserve_core`). `--batch-cores` puts the
//! batch clients on a list of cores instead (e.g. away from the latency workers' SMT
//! siblings). All through the scheduler's `pin_current_thread`, as a server would place its
//! own request threads. Each worker group's cores and each core's SMT siblings are printed, and
//! `--inject-stalls` finds its cores here.

use std::sync::OnceLock;

use boundpool::gpu::GpuPool;
use boundpool::pin_current_thread;
use boundpool_bench::stalls::Place;

/// The batch clients' cores, and the latency-critical client's own core (with `high`).
static CORES: OnceLock<(Vec<usize>, Option<usize>)> = OnceLock::new();

/// The cores the latency-critical client's requests run on: its own and its partition's
/// workers' (`--isolate high` on a split device; empty otherwise).
static HIGH_PATH: OnceLock<Vec<usize>> = OnceLock::new();

/// The cores of the workers outside the latency partition, and of those inside it
/// (`--isolate high` on a split device; empty otherwise).
static BATCH_WORKERS: OnceLock<Vec<usize>> = OnceLock::new();
static LATENCY_WORKERS: OnceLock<Vec<usize>> = OnceLock::new();

/// Chooses the clients' cores from `mode` (`None`: no placement), `batch_cores` (where given)
/// and the cores `pool`'s workers are pinned to, and prints them.
pub(super) fn init(mode: Option<&str>, batch_cores: &[usize], pool: &GpuPool) {
    let Some(mode) = mode else { return };
    let mut groups: Vec<(String, Vec<usize>)> = Vec::new();
    for w in pool.pool().workers() {
        let Some(core) = w.core else { continue };
        match groups.iter_mut().find(|(g, _)| *g == w.group_name) {
            Some((_, cores)) => cores.push(core),
            None => groups.push((w.group_name.clone(), vec![core])),
        }
    }
    let high = if mode == "high" {
        match pool.pool().reserve_core() {
            Ok(c) => Some(c),
            Err(e) => {
                println!("no core of its own for the latency-critical client: {e}");
                None
            }
        }
    } else {
        None
    };
    let free = if batch_cores.is_empty() {
        pool.pool().free_cores()
    } else {
        batch_cores.to_vec()
    };
    println!(
        "clients placed ({mode}): workers on {groups:?}, batch clients on {free:?}, the latency-critical client on {}",
        high.map_or_else(|| format!("{free:?}"), |h| format!("[{h}]"))
    );
    println!("SMT siblings: {}", siblings());
    if let (Some(h), Some((_, cores))) =
        (high, groups.iter().find(|(g, _)| g.ends_with(".latency")))
    {
        let _ = HIGH_PATH.set(cores.iter().copied().chain([h]).collect());
        let _ = LATENCY_WORKERS.set(cores.clone());
        let batch = groups.iter().filter(|(g, _)| !g.ends_with(".latency"));
        let _ = BATCH_WORKERS.set(batch.flat_map(|(_, c)| c.iter().copied()).collect());
    }
    let _ = CORES.set((free, high));
}

/// The cores the latency-critical client's requests run on (its own and its partition's
/// workers'), where both are placed; empty otherwise.
pub(super) fn high_path_cores() -> &'static [usize] {
    HIGH_PATH.get().map_or(&[], Vec::as_slice)
}

/// The cores of `place` for `--inject-stalls`: the batch workers', the batch clients', the
/// high path's, the latency workers' or the high client's, where `--isolate high` placed them
/// on a split device (empty otherwise).
pub(super) fn stall_cores(place: Place) -> Vec<usize> {
    match place {
        Place::BatchWorkers => BATCH_WORKERS.get().cloned().unwrap_or_default(),
        Place::BatchClients if !high_path_cores().is_empty() => CORES
            .get()
            .map(|(free, _)| free.clone())
            .unwrap_or_default(),
        Place::BatchClients => Vec::new(),
        Place::HighPath => high_path_cores().to_vec(),
        Place::LatencyWorkers => LATENCY_WORKERS.get().cloned().unwrap_or_default(),
        Place::HighClient => match CORES.get() {
            Some((_, Some(h))) if !high_path_cores().is_empty() => vec![*h],
            _ => Vec::new(),
        },
    }
}

/// Each core's SMT siblings as the kernel lists them (`cpuN/topology/thread_siblings_list`),
/// the cores without one left out.
fn siblings() -> String {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let paired: Vec<String> = (0..cores)
        .filter_map(|c| {
            let path = format!("/sys/devices/system/cpu/cpu{c}/topology/thread_siblings_list");
            let list = std::fs::read_to_string(path).ok()?;
            let list = list.trim();
            (list != c.to_string()).then(|| format!("{c}: {list}"))
        })
        .collect();
    if paired.is_empty() {
        "none".into()
    } else {
        paired.join(", ")
    }
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
