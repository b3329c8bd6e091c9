//! `boundpool soak`: many submitter threads run random graphs with injected faults for a while,
//! and every outcome and every resource is checked.
//!
//! Each submitter loops over scenarios picked by its own seeded generator:
//!
//! * **plain**: a random DAG of host nodes, each returning `base(i) + Σ inputs` (wrapping); every
//!   node's output is compared with the same sum computed on the host.
//! * **error** / **panic**: the same with one node made to return an error or to panic; the graph
//!   must fail with an error whose kind says so and whose message names that node.
//! * **cancel**: a chain on a separate, short-lived one-worker pool, shut down with
//!   `ShutdownMode::Cancel` while it runs: the graph either finished (values checked) or failed
//!   as cancelled; a submit after the shutdown must fail as shut down.
//! * **nested**: a node that submits a subgraph to the pool from inside and waits on it (with a
//!   fault in the subgraph at times: the outer error must name both nodes).
//! * **dropped**: a graph whose handle is dropped without waiting; it must still run every node,
//!   and release everything it holds (a sentinel it captures must be freed) within 10 s.
//! * **gpu** (with `--gpu`): a random DAG of GPU nodes (spin, set, add on one-element device
//!   buffers), half of them through cudarc's types (the node's `CudaStream`, `launch_builder`,
//!   `alloc_zeros`, the slice adopted into a `DeviceBuffer`); the sinks and one other node are
//!   downloaded and compared with the host's sums, and the buffers are dropped on the submitter
//!   thread (not a worker).
//!
//! Meanwhile the main thread samples the process's OS threads (`/proc/self/task`, `watch.rs`):
//! they must stay at main + workers + submitters, plus the workers of the short-lived pools
//! alive at that moment. At the end it checks that resident memory, and with `--gpu` the
//! device's free memory, its live allocations and its event table, are back to their level
//! after the warm-up (`levels.rs`).
//!
//! Files: the random graphs and faults (`graphs.rs`), the submitters and their host scenarios
//! (`submitter.rs`), the GPU side (`gpu.rs`), the counts and checks (`tally.rs`), the thread
//! watch (`watch.rs`), the levels (`levels.rs`) and the output (`report.rs`).

use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use boundpool::gpu::GpuWorker;
use boundpool::{default_workers, Pool, PoolBuilder};
use clap::Args;

use self::gpu::GpuSide;
use self::levels::Levels;
use self::submitter::{submitter, Env};
use self::tally::Tally;
use self::watch::{ExtraThreads, ThreadWatch, Watcher};
use crate::gpu_pool::{DeviceSplit, PartitionArg};
use crate::process::{os_threads, thread_ids};

mod gpu;
mod graphs;
mod levels;
mod report;
mod submitter;
mod tally;
mod watch;

#[derive(Args, Debug)]
pub(crate) struct SoakArgs {
    /// How long to run, in seconds.
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// Also run GPU graphs, on a GPU pool of device 0 (exit 2 when there is no GPU).
    #[arg(long)]
    gpu: bool,
    #[command(flatten)]
    part: PartitionArg,
    /// Submitter threads.
    #[arg(long, default_value_t = 64)]
    submitters: usize,
    /// Worker threads (default: the cores this process may use; with --gpu, per device).
    #[arg(long)]
    threads: Option<usize>,
    /// Seed of the submitters' random choices.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print the figures as one JSON object.
    #[arg(long)]
    json: bool,
    /// Test only: make the checker expect a wrong value once (a violation must be reported).
    #[arg(long, hide = true)]
    inject_wrong_value: bool,
}

pub(crate) fn main(a: SoakArgs) -> ExitCode {
    if !(a.seconds > 0.0 && a.seconds.is_finite()) {
        eprintln!("boundpool soak: --seconds must be a positive number");
        return ExitCode::from(2);
    }
    if a.submitters == 0 {
        eprintln!("boundpool soak: --submitters must be at least 1");
        return ExitCode::from(2);
    }
    let threads = a.threads.unwrap_or_else(default_workers);
    if threads == 0 {
        eprintln!("boundpool soak: --threads must be at least 1");
        return ExitCode::from(2);
    }
    let (gpu, splits) = if a.gpu {
        match gpu::start(&a, threads) {
            Ok((side, splits)) => (Some(side), splits),
            Err(code) => return code,
        }
    } else {
        (None, Vec::new())
    };
    graphs::quiet_injected_panics();
    let host_pool = match &gpu {
        Some(_) => None,
        None => match PoolBuilder::new().name("soak").workers(threads).build() {
            Ok(p) => Some(p),
            Err(e) => {
                eprintln!("boundpool soak: {e}");
                return ExitCode::from(2);
            }
        },
    };
    soak(&a, host_pool, gpu, &splits)
}

/// The soak on one pool (the host pool, or the GPU pool's host scenarios and GPU graphs): the
/// submitters run while the main thread watches, then the checks at the end and the report.
fn soak(
    a: &SoakArgs,
    host_pool: Option<Pool>,
    gpu: Option<GpuSide>,
    splits: &[DeviceSplit],
) -> ExitCode {
    let tally = Tally::default();
    let workers = match (&host_pool, &gpu) {
        (Some(p), _) => p.workers().len(),
        (None, Some(g)) => g.pool.pool().workers().len(),
        (None, None) => unreachable!("one pool or the other"),
    };
    // Main + workers, and with a GPU the driver's own threads: counted once, before any submitter.
    let base_threads = os_threads().unwrap_or(0);
    let start = Levels::now(gpu.as_ref());
    let (elapsed, threads, warm) = drive(
        a,
        host_pool.as_ref(),
        gpu.as_ref(),
        &tally,
        base_threads,
        workers,
    );
    let warm = warm.unwrap_or(start);
    let end = levels::check_end(&tally, base_threads, workers, gpu.as_ref(), &start, &warm);
    drop(host_pool);
    drop(gpu);
    let figures = report::Figures {
        elapsed,
        workers,
        base_threads,
        end_threads: end.threads,
        threads,
        levels: [start, warm, end.levels],
        splits,
    };
    if report::print(a, &tally, &figures) == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// Runs the submitters for `--seconds` while this thread samples the OS threads every 20 ms;
/// returns the time it took (the submitters joined), what the watch saw, and the levels read
/// after the warm-up (the first 10% of the run, at most 10 s).
fn drive(
    a: &SoakArgs,
    host_pool: Option<&Pool>,
    gpu: Option<&GpuSide>,
    tally: &Tally,
    base_threads: usize,
    workers: usize,
) -> (Duration, ThreadWatch, Option<Levels>) {
    let extra = Arc::new(ExtraThreads::default());
    let stop = AtomicBool::new(false);
    let wrong_value = AtomicBool::new(a.inject_wrong_value);
    let env = Env {
        gpu,
        tally,
        extra: &extra,
        stop: &stop,
        wrong_value: &wrong_value,
    };
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs_f64(a.seconds);
    let warm_at = t0 + Duration::from_secs_f64((a.seconds * 0.1).min(10.0));
    let start = Barrier::new(a.submitters + 1);
    let mut warm = None;
    let threads = std::thread::scope(|s| {
        let (env, start) = (&env, &start);
        let gpu_pool: Option<&Pool<GpuWorker>> = gpu.map(|g| g.pool.pool());
        for id in 0..a.submitters {
            let seed = a.seed;
            // The host scenarios are the same code on a plain pool and on the GPU pool's.
            std::thread::Builder::new()
                .name(format!("soak-submitter-{id}"))
                .spawn_scoped(s, move || match (host_pool, gpu_pool) {
                    (Some(p), _) => submitter(id, seed, p, env, start),
                    (None, Some(p)) => submitter(id, seed, p, env, start),
                    (None, None) => unreachable!("one pool or the other"),
                })
                .expect("a submitter thread starts");
        }
        // The submitters wait at the barrier: no short-lived pool exists yet, so every thread
        // listed now is main, a worker, the driver's, or a submitter.
        let core_tids = thread_ids();
        if core_tids.len() != base_threads + a.submitters {
            tally.violation(format!(
                "{} OS threads with the submitters started, expected {}",
                core_tids.len(),
                base_threads + a.submitters
            ));
        }
        let who = format!(
            "main + {workers} workers + {} submitters{}",
            a.submitters,
            if base_threads > 1 + workers {
                " + the driver's"
            } else {
                ""
            }
        );
        let mut watcher = Watcher::new(core_tids, &extra, tally, who);
        start.wait();
        while Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20).min(deadline - Instant::now()));
            watcher.sample();
            if warm.is_none() && Instant::now() >= warm_at {
                warm = Some(Levels::now(gpu));
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        watcher.seen
    });
    (t0.elapsed(), threads, warm)
}
