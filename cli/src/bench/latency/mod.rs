//! `boundpool bench --latency`: what priorities buy a latency-critical graph on a full pool.
//!
//! Background: low-priority wide graphs (a source, `width` nodes of ~20 µs busy work, a sink),
//! kept in flight by a feeder thread so that every worker is always busy. Foreground: a
//! 20-node chain submitted every millisecond and waited for; its latency is submit → `wait`
//! returned. Five phases on one pool: the foreground alone (high, then normal), the background
//! alone, both with the foreground at high priority, both with it at normal priority. With
//! `--gpu` the nodes are GPU nodes on one device's workers: background kernels of ~20 µs that
//! fill the device, foreground empty one-thread kernels. The background is low (its nodes
//! enqueue on each worker's low-priority stream), the foreground high (the high-priority stream)
//! or normal (the worker's normal stream, of the default priority, which is also the least).
//!
//! A stream's priority decides which *waiting* blocks the device starts next; it never stops a
//! running block. So what a high-priority kernel waits for on a full device is the rest of the
//! running blocks' time, and that depends on the background's shape. The main GPU background is
//! shaped as most kernels are: `BG_WAVES` waves of short blocks (~2.5 µs each) filling every SM.
//! A worst case is measured beside it: one wave of blocks that each spin the whole ~20 µs, so a
//! foreground kernel may wait up to 20 µs at every one of its 20 links. Both fill the device
//! (with only a block or two, the device would have free SMs for anyone and priorities would
//! decide nothing).
//!
//! Stream priorities order only what reaches the device on separate hardware queues: with the
//! default 8 (`CUDA_DEVICE_MAX_CONNECTIONS`), the high stream of one worker shares a queue with
//! the background streams of others and waits behind their kernels. So `--gpu` sets
//! `CUDA_DEVICE_MAX_CONNECTIONS=32` (the most) unless the environment sets it, as a service that
//! uses priorities should; the JSON reports the value used.
//!
//! Targets (same process): host foreground p99 under load ≤ 1.5 × alone + 50 µs (GPU: 2 × alone
//! + 50 µs); background ≥ 80 % of its alone throughput.

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use boundpool::default_workers;
use boundpool_workloads::Sorted;

use self::sides::{GpuSide, HostSide, Side};
use super::BenchArgs;
use crate::gpu_pool::{self, DeviceSplit};

mod report;
mod sides;

/// Nodes of the foreground chain.
const CHAIN: usize = 20;
/// Busy time of a background node.
const BUSY: Duration = Duration::from_micros(20);
/// Foreground submissions are this far apart.
const PERIOD: Duration = Duration::from_millis(1);
/// Blocks in one wave of a GPU background kernel: with `BG_BLOCK` threads each, an H100's or
/// H200's resident threads (132 SMs × 2,048 = 2,112 such blocks).
const BG_WAVE: u32 = 2112;
/// Threads per block of a GPU background kernel.
const BG_BLOCK: u32 = 128;
/// The GPU background kernels: (waves, cycles each block spins). Both run ~20 µs at the H100's /
/// H200's ~1.98 GHz boost clock: 8 waves of ~2.5 µs blocks (the main one), or one wave of ~20 µs
/// blocks (the worst case).
const BG_SHORT_BLOCKS: (u32, i64) = (BG_WAVES, 5_000);
const BG_ONE_WAVE: (u32, i64) = (1, 40_000);
/// Waves of short blocks in the main GPU background kernel.
const BG_WAVES: u32 = 8;

/// Latency percentiles of one phase, in µs.
#[derive(Clone, Copy, Debug, Default)]
struct Lat {
    p50: f64,
    p99: f64,
    max: f64,
}

fn percentiles(v: Vec<f64>) -> Lat {
    let s = Sorted::new(v);
    Lat {
        p50: s.percentile(0.5),
        p99: s.percentile(0.99),
        max: s.percentile(1.0),
    }
}

/// Runs the foreground every `PERIOD` for `dur`; returns the latencies in µs.
fn foreground(side: &dyn Side, high: bool, dur: Duration) -> Result<Vec<f64>, String> {
    let mut lat = Vec::new();
    let start = Instant::now();
    let mut next = start;
    while start.elapsed() < dur {
        let now = Instant::now();
        if next > now {
            thread::sleep(next - now);
        }
        next += PERIOD;
        let t = Instant::now();
        side.submit_fg(high)?.wait().map_err(|e| e.to_string())?;
        lat.push(t.elapsed().as_secs_f64() * 1e6);
    }
    Ok(lat)
}

/// Keeps `in_flight` background graphs running until `stop`; counts the nodes of finished ones.
fn feeder(
    side: &dyn Side,
    worst: bool,
    in_flight: usize,
    stop: &AtomicBool,
    nodes: &AtomicU64,
) -> Result<(), String> {
    let mut q = std::collections::VecDeque::new();
    while !stop.load(Ordering::Relaxed) {
        while q.len() < in_flight {
            q.push_back(side.submit_bg(worst)?);
        }
        if let Some(h) = q.pop_front() {
            h.wait().map_err(|e| e.to_string())?;
            nodes.fetch_add(side.bg_nodes(), Ordering::Relaxed);
        }
    }
    for h in q {
        h.wait().map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Which background a phase runs.
#[derive(Clone, Copy, PartialEq)]
enum Bg {
    None,
    /// The main background (on the GPU: waves of short blocks).
    Main,
    /// The GPU's worst case: one wave of long blocks.
    OneWave,
}

/// One phase: the background `bg` and the foreground (if `fg`: `Some(high)`) for `dur`.
/// Returns (foreground latencies, background nodes per second).
fn phase(
    side: &dyn Side,
    fg: Option<bool>,
    bg: Bg,
    dur: Duration,
) -> Result<(Vec<f64>, f64), String> {
    let stop = AtomicBool::new(false);
    let nodes = AtomicU64::new(0);
    thread::scope(|s| {
        let feeder =
            (bg != Bg::None).then(|| s.spawn(|| feeder(side, bg == Bg::OneWave, 3, &stop, &nodes)));
        // Let the background fill the pool before measuring.
        if bg != Bg::None {
            thread::sleep(Duration::from_millis(50));
        }
        let n0 = nodes.load(Ordering::Relaxed);
        let t0 = Instant::now();
        let lat = match fg {
            Some(high) => foreground(side, high, dur),
            None => {
                thread::sleep(dur);
                Ok(Vec::new())
            }
        };
        let rate = (nodes.load(Ordering::Relaxed) - n0) as f64 / t0.elapsed().as_secs_f64();
        stop.store(true, Ordering::Relaxed);
        if let Some(f) = feeder {
            f.join().map_err(|_| "the feeder panicked".to_string())??;
        }
        Ok((lat?, rate))
    })
}

pub(super) fn main(a: &BenchArgs) -> ExitCode {
    if !(a.seconds > 0.0 && a.seconds.is_finite()) {
        eprintln!("boundpool bench --latency: --seconds must be a positive number");
        return ExitCode::from(2);
    }
    // One core is left to the submitting threads (the foreground's and the feeder's): with
    // every core taken by a busy worker, their wake-ups would wait for the OS, not the pool.
    // With --partitions (--gpu only), the partitions' workers.
    let workers = a.part.workers().unwrap_or_else(|| {
        a.threads
            .unwrap_or_else(|| default_workers().saturating_sub(1).max(1))
    });
    if workers == 0 {
        eprintln!("boundpool bench --latency: --threads must be at least 1");
        return ExitCode::from(2);
    }
    let (side, splits) = match open_side(a, workers) {
        Ok(s) => s,
        Err(code) => return code,
    };
    match measure(&*side, a.gpu, Duration::from_secs_f64(a.seconds)) {
        Ok(r) => {
            let mut json = report::json(&r, a.gpu, workers);
            if !splits.is_empty() {
                json["partitions"] = gpu_pool::json_of(&splits);
            }
            if a.json {
                println!("{json}");
            } else {
                print!("{}", report::table(&r, a.gpu, workers));
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("boundpool bench --latency: {e}");
            ExitCode::from(1)
        }
    }
}

/// The pool the bench drives, with its graphs: a host pool of `workers`, or with `--gpu` a GPU
/// pool of device 0 (and what each SM partition got, printed unless `--json`).
fn open_side(a: &BenchArgs, workers: usize) -> Result<(Box<dyn Side>, Vec<DeviceSplit>), ExitCode> {
    // Enough background nodes per graph that every worker has several queued.
    let width = (workers * 8).max(16);
    if !a.gpu {
        return match HostSide::new(workers, width) {
            Ok(s) => Ok((Box::new(s), Vec::new())),
            Err(e) => {
                eprintln!("boundpool bench --latency: {e}");
                Err(ExitCode::from(2))
            }
        };
    }
    // Read by the driver when it makes the context, so before any GPU call; this thread is
    // still the process's only one.
    if std::env::var_os("CUDA_DEVICE_MAX_CONNECTIONS").is_none() {
        std::env::set_var("CUDA_DEVICE_MAX_CONNECTIONS", "32");
    }
    if let Some(code) = gpu_pool::no_gpu("bench --latency") {
        return Err(code);
    }
    let pool = sides::gpu_pool(workers, a.part.list()).map_err(|e| {
        eprintln!("boundpool bench --latency --gpu: the GPU pool did not start: {e}");
        gpu_pool::build_failure(&e)
    })?;
    let splits = gpu_pool::splits(&pool);
    if !a.json {
        gpu_pool::print_lines(&splits);
    }
    match GpuSide::new(pool, width) {
        Ok(s) => Ok((Box::new(s), splits)),
        Err(e) => {
            eprintln!("boundpool bench --latency --gpu: {e}");
            Err(ExitCode::from(1))
        }
    }
}

/// The worst-case GPU background's phases.
struct OneWave {
    loaded: Lat,
    bg_alone: f64,
    bg_loaded: f64,
}

struct Results {
    one_wave: Option<OneWave>,
    alone: Lat,
    normal_alone: Lat,
    loaded: Lat,
    normal_loaded: Lat,
    bg_alone: f64,
    bg_loaded: f64,
    bg_loaded_normal: f64,
    samples: usize,
}

fn measure(side: &dyn Side, gpu: bool, dur: Duration) -> Result<Results, String> {
    // Warm-up: one of each graph (module load, first allocations, the priority switch).
    phase(side, Some(true), Bg::None, Duration::from_millis(50))?;
    let (alone, _) = phase(side, Some(true), Bg::None, dur)?;
    let (normal_alone, _) = phase(side, Some(false), Bg::None, dur)?;
    let (_, bg_alone) = phase(side, None, Bg::Main, dur)?;
    let (loaded, bg_loaded) = phase(side, Some(true), Bg::Main, dur)?;
    let (normal_loaded, bg_loaded_normal) = phase(side, Some(false), Bg::Main, dur)?;
    let one_wave = if gpu {
        let (_, bg_alone) = phase(side, None, Bg::OneWave, dur)?;
        let (loaded, bg_loaded) = phase(side, Some(true), Bg::OneWave, dur)?;
        Some(OneWave {
            loaded: percentiles(loaded),
            bg_alone,
            bg_loaded,
        })
    } else {
        None
    };
    Ok(Results {
        one_wave,
        samples: loaded.len(),
        alone: percentiles(alone),
        normal_alone: percentiles(normal_alone),
        loaded: percentiles(loaded),
        normal_loaded: percentiles(normal_loaded),
        bg_alone,
        bg_loaded,
        bg_loaded_normal,
    })
}
