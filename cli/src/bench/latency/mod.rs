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
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use boundpool::gpu::{
    builtin, Devices, GpuDevice, GpuError, GpuGraphBuilder, GpuGraphExt, GpuPool, GpuPoolBuilder,
    GpuWorker, Kernel, LaunchConfig, Module, SmPartition,
};
use boundpool::{default_workers, Graph, GraphBuilder, GraphHandle, Pool, PoolBuilder, Priority};

use crate::BenchArgs;

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

fn percentiles(mut v: Vec<f64>) -> Lat {
    if v.is_empty() {
        return Lat::default();
    }
    v.sort_by(f64::total_cmp);
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    Lat {
        p50: at(0.50),
        p99: at(0.99),
        max: v[v.len() - 1],
    }
}

/// What the bench drives: a host pool or a GPU pool, and how it builds its two graphs.
trait Side: Sync {
    fn submit_fg(&self, high: bool) -> Result<GraphHandle, String>;
    /// Submits a background graph; `worst` asks for the worst-case GPU shape (one wave of long
    /// blocks), which the host side does not have.
    fn submit_bg(&self, worst: bool) -> Result<GraphHandle, String>;
    /// Nodes in one background graph.
    fn bg_nodes(&self) -> u64;
}

struct HostSide {
    pool: Pool,
    fg_high: Graph,
    fg_normal: Graph,
    bg: Graph,
    width: usize,
}

fn spin(d: Duration) {
    let t = Instant::now();
    while t.elapsed() < d {
        std::hint::spin_loop();
    }
}

fn host_chain(p: Priority) -> Graph {
    let mut g = GraphBuilder::new("foreground");
    let mut prev = None;
    for _ in 0..CHAIN {
        let n = g.node("link", |_| Ok(()));
        if let Some(p) = prev {
            g.edge(p, n);
        }
        prev = Some(n);
    }
    g.priority(p);
    g.build().expect("a chain is acyclic")
}

fn host_wide(width: usize) -> Graph {
    let mut g = GraphBuilder::new("background");
    let src = g.node("src", |_| Ok(()));
    let sink = g.node("sink", |_| Ok(()));
    for _ in 0..width {
        let n = g.node("busy", |_| {
            spin(BUSY);
            Ok(())
        });
        g.edge(src, n).edge(n, sink);
    }
    g.priority(Priority::Low);
    g.build().expect("a fan-out is acyclic")
}

impl Side for HostSide {
    fn submit_fg(&self, high: bool) -> Result<GraphHandle, String> {
        let g = if high { &self.fg_high } else { &self.fg_normal };
        self.pool.submit(g).map_err(|e| e.to_string())
    }
    fn submit_bg(&self, _worst: bool) -> Result<GraphHandle, String> {
        self.pool.submit(&self.bg).map_err(|e| e.to_string())
    }
    fn bg_nodes(&self) -> u64 {
        self.width as u64 + 2
    }
}

struct GpuSide {
    pool: GpuPool,
    fg_high: Graph<GpuWorker>,
    fg_normal: Graph<GpuWorker>,
    bg: Graph<GpuWorker>,
    bg_one_wave: Graph<GpuWorker>,
    width: usize,
}

/// Device 0 as the foreground sees it: with SM partitions, the first one (the latency-critical
/// path's reservation); else the whole device.
fn fg_device(pool: &GpuPool) -> GpuDevice {
    let d = &pool.devices()[0];
    d.partitions()
        .first()
        .and_then(|p| d.on_partition(&p.name))
        .unwrap_or_else(|| d.clone())
}

/// Device 0 as the background sees it: with two SM partitions or more, the last one; else the
/// whole device.
fn bg_device(pool: &GpuPool) -> GpuDevice {
    let d = &pool.devices()[0];
    match d.partitions() {
        [_, .., last] => d.on_partition(&last.name).unwrap_or_else(|| d.clone()),
        _ => d.clone(),
    }
}

fn gpu_chain(pool: &GpuPool, empty: &Arc<Kernel>, p: Priority) -> Result<Graph<GpuWorker>, String> {
    let device = fg_device(pool);
    let mut g = GpuGraphBuilder::new("foreground");
    let mut prev = None;
    for i in 0..CHAIN {
        let k = empty.clone();
        let n = g.gpu_node(&device, &format!("link{i}"), move |ctx| {
            // SAFETY: bp_spin takes one i64 (a cycle count); 0 returns at once.
            unsafe { ctx.launch(&k, LaunchConfig::single()).arg(0i64).launch()? };
            Ok(())
        });
        if let Some(p) = prev {
            g.edge(p, n);
        }
        prev = Some(n);
    }
    g.priority(p);
    g.build().map_err(|e| e.to_string())
}

fn gpu_wide(
    pool: &GpuPool,
    spin_k: &Arc<Kernel>,
    width: usize,
    (waves, cycles): (u32, i64),
) -> Result<Graph<GpuWorker>, String> {
    let device = bg_device(pool);
    let mut g = GpuGraphBuilder::new("background");
    let src = g.gpu_node(&device, "src", |_| Ok(()));
    let sink = g.gpu_node(&device, "sink", |_| Ok(()));
    let cfg = LaunchConfig {
        grid: (BG_WAVE * waves, 1, 1),
        block: (BG_BLOCK, 1, 1),
        shared_mem_bytes: 0,
    };
    for i in 0..width {
        let k = spin_k.clone();
        let n = g.gpu_node(&device, &format!("busy{i}"), move |ctx| {
            // SAFETY: bp_spin takes one i64, the cycles every thread busy-waits; it touches no
            // memory.
            unsafe { ctx.launch(&k, cfg).arg(cycles).launch()? };
            Ok(())
        });
        g.edge(src, n).edge(n, sink);
    }
    g.priority(Priority::Low);
    g.build().map_err(|e| e.to_string())
}

impl Side for GpuSide {
    fn submit_fg(&self, high: bool) -> Result<GraphHandle, String> {
        let g = if high { &self.fg_high } else { &self.fg_normal };
        self.pool.submit(g).map_err(|e| e.to_string())
    }
    fn submit_bg(&self, worst: bool) -> Result<GraphHandle, String> {
        let g = if worst { &self.bg_one_wave } else { &self.bg };
        self.pool.submit(g).map_err(|e| e.to_string())
    }
    fn bg_nodes(&self) -> u64 {
        self.width as u64 + 2
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

pub(crate) fn main(a: &BenchArgs) -> ExitCode {
    if !(a.seconds > 0.0 && a.seconds.is_finite()) {
        eprintln!("boundpool bench --latency: --seconds must be a positive number");
        return ExitCode::from(2);
    }
    // One core is left to the submitting threads (the foreground's and the feeder's): with
    // every core taken by a busy worker, their wake-ups would wait for the OS, not the pool.
    // With --partitions (--gpu only), the partitions' workers.
    let workers = super::partitions::workers(&a.part.partitions).unwrap_or_else(|| {
        a.threads
            .unwrap_or_else(|| default_workers().saturating_sub(1).max(1))
    });
    if workers == 0 {
        eprintln!("boundpool bench --latency: --threads must be at least 1");
        return ExitCode::from(2);
    }
    // Enough background nodes per graph that every worker has several queued.
    let width = (workers * 8).max(16);
    let mut splits = Vec::new();
    let side: Box<dyn Side> = if a.gpu {
        // Read by the driver when it makes the context, so before any GPU call; this thread is
        // still the process's only one.
        if std::env::var_os("CUDA_DEVICE_MAX_CONNECTIONS").is_none() {
            std::env::set_var("CUDA_DEVICE_MAX_CONNECTIONS", "32");
        }
        if let Some(why) = boundpool::gpu::gpu_unavailable_reason() {
            eprintln!("boundpool bench --latency --gpu: no GPU: {why}");
            return ExitCode::from(2);
        }
        let pool = match gpu_pool(workers, super::partitions::of(&a.part.partitions)) {
            Ok(p) => p,
            Err(e) => {
                eprintln!("boundpool bench --latency --gpu: the GPU pool did not start: {e}");
                return super::partitions::build_failure(&e);
            }
        };
        splits = super::partitions::splits(&pool);
        if !a.json {
            super::partitions::print_lines(&splits);
        }
        match gpu_side(pool, width) {
            Ok(s) => Box::new(s),
            Err(e) => {
                eprintln!("boundpool bench --latency --gpu: {e}");
                return ExitCode::from(1);
            }
        }
    } else {
        match PoolBuilder::new().name("latency").workers(workers).build() {
            Ok(pool) => Box::new(HostSide {
                pool,
                fg_high: host_chain(Priority::High),
                fg_normal: host_chain(Priority::Normal),
                bg: host_wide(width),
                width,
            }),
            Err(e) => {
                eprintln!("boundpool bench --latency: {e}");
                return ExitCode::from(2);
            }
        }
    };
    match measure(&*side, a.gpu, Duration::from_secs_f64(a.seconds)) {
        Ok(r) => {
            let mut json = report(&r, a.gpu, workers);
            if !splits.is_empty() {
                json["partitions"] = super::partitions::json_of(&splits);
            }
            if a.json {
                println!("{json}");
            } else {
                print!("{}", table(&r, a.gpu, workers));
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("boundpool bench --latency: {e}");
            ExitCode::from(1)
        }
    }
}

/// The bench's GPU pool on device 0: `workers` workers, or the `partitions`' when there are
/// any (every node is still placed on the device: any partition's worker runs it).
fn gpu_pool(workers: usize, partitions: Vec<SmPartition>) -> Result<GpuPool, GpuError> {
    let b = GpuPoolBuilder::new()
        .name("latency-gpu")
        .devices(Devices::List(vec![0]))
        .workers_per_device(workers);
    if partitions.is_empty() {
        b.build()
    } else {
        b.sm_partitions(partitions).build()
    }
}

fn gpu_side(pool: GpuPool, width: usize) -> Result<GpuSide, String> {
    let m = Module::builtin();
    let spin_k = Arc::new(m.kernel(builtin::SPIN).map_err(|e| e.to_string())?);
    Ok(GpuSide {
        fg_high: gpu_chain(&pool, &spin_k, Priority::High)?,
        fg_normal: gpu_chain(&pool, &spin_k, Priority::Normal)?,
        bg: gpu_wide(&pool, &spin_k, width, BG_SHORT_BLOCKS)?,
        bg_one_wave: gpu_wide(&pool, &spin_k, width, BG_ONE_WAVE)?,
        pool,
        width,
    })
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

/// The foreground p99 bound under load: 1.5 × alone + 50 µs on the host, 2 × on the GPU.
fn p99_limit(r: &Results, gpu: bool) -> f64 {
    (if gpu { 2.0 } else { 1.5 }) * r.alone.p99 + 50.0
}

fn report(r: &Results, gpu: bool, workers: usize) -> serde_json::Value {
    let limit = p99_limit(r, gpu);
    let mut v = serde_json::json!({
        "pool": if gpu { "gpu" } else { "host" },
        "workers": workers,
        "samples_per_phase": r.samples,
        "p50_alone_us": r.alone.p50,
        "p99_alone_us": r.alone.p99,
        "p50_loaded_us": r.loaded.p50,
        "p99_loaded_us": r.loaded.p99,
        "max_loaded_us": r.loaded.max,
        "background_alone_nodes_per_s": r.bg_alone,
        "background_loaded_nodes_per_s": r.bg_loaded,
        "normal": {
            "p50_alone_us": r.normal_alone.p50,
            "p99_alone_us": r.normal_alone.p99,
            "p50_loaded_us": r.normal_loaded.p50,
            "p99_loaded_us": r.normal_loaded.p99,
            "max_loaded_us": r.normal_loaded.max,
            "background_alone_nodes_per_s": r.bg_alone,
            "background_loaded_nodes_per_s": r.bg_loaded_normal,
        },
        "targets": {
            "p99_loaded_limit_us": limit,
            "p99_met": r.loaded.p99 <= limit,
            "background_ratio": r.bg_loaded / r.bg_alone.max(f64::MIN_POSITIVE),
            "background_met": r.bg_loaded >= 0.8 * r.bg_alone,
        },
    });
    if gpu {
        v["gpu_background_kernel"] = serde_json::json!({
            "grid": BG_WAVE * BG_SHORT_BLOCKS.0,
            "block": BG_BLOCK,
            "waves": BG_SHORT_BLOCKS.0,
            "cycles_per_block": BG_SHORT_BLOCKS.1,
        });
        v["cuda_device_max_connections"] = std::env::var("CUDA_DEVICE_MAX_CONNECTIONS")
            .unwrap_or_default()
            .into();
    }
    if let Some(w) = &r.one_wave {
        v["one_wave_background"] = serde_json::json!({
            "grid": BG_WAVE * BG_ONE_WAVE.0,
            "block": BG_BLOCK,
            "cycles_per_block": BG_ONE_WAVE.1,
            "p50_loaded_us": w.loaded.p50,
            "p99_loaded_us": w.loaded.p99,
            "max_loaded_us": w.loaded.max,
            "background_alone_nodes_per_s": w.bg_alone,
            "background_loaded_nodes_per_s": w.bg_loaded,
            "p99_met": w.loaded.p99 <= limit,
        });
    }
    v
}

fn table(r: &Results, gpu: bool, workers: usize) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{} pool, {workers} workers; foreground: a {CHAIN}-node chain every ms; background: low-priority wide graphs of 20 µs nodes{}",
        if gpu { "GPU" } else { "host" },
        if gpu {
            format!(
                " (kernels of {} waves of {BG_WAVE} blocks × {BG_BLOCK} threads, filling the device)",
                BG_SHORT_BLOCKS.0
            )
        } else {
            String::new()
        }
    );
    let _ = writeln!(
        s,
        "{:<26} {:>9} {:>9} {:>9} {:>14}",
        "foreground", "p50 µs", "p99 µs", "max µs", "bg nodes/s"
    );
    let _ = writeln!(
        s,
        "{:<26} {:>9.1} {:>9.1} {:>9.1} {:>14}",
        "alone (high)", r.alone.p50, r.alone.p99, r.alone.max, "-"
    );
    let _ = writeln!(
        s,
        "{:<26} {:>9.1} {:>9.1} {:>9.1} {:>14}",
        "alone (normal)", r.normal_alone.p50, r.normal_alone.p99, r.normal_alone.max, "-"
    );
    let _ = writeln!(
        s,
        "{:<26} {:>9} {:>9} {:>9} {:>14.0}",
        "background alone", "-", "-", "-", r.bg_alone
    );
    let _ = writeln!(
        s,
        "{:<26} {:>9.1} {:>9.1} {:>9.1} {:>14.0}",
        "loaded, high priority", r.loaded.p50, r.loaded.p99, r.loaded.max, r.bg_loaded
    );
    let _ = writeln!(
        s,
        "{:<26} {:>9.1} {:>9.1} {:>9.1} {:>14.0}",
        "loaded, normal priority",
        r.normal_loaded.p50,
        r.normal_loaded.p99,
        r.normal_loaded.max,
        r.bg_loaded_normal
    );
    let _ = writeln!(
        s,
        "target p99 under load ≤ {:.1} µs: {}; background ≥ 80% of alone: {:.0}%",
        p99_limit(r, gpu),
        if r.loaded.p99 <= p99_limit(r, gpu) {
            "met"
        } else {
            "MISSED"
        },
        100.0 * r.bg_loaded / r.bg_alone.max(f64::MIN_POSITIVE)
    );
    if let Some(w) = &r.one_wave {
        let _ = writeln!(
            s,
            "worst case, one wave of ~20 µs blocks: loaded high p99 {:.1} µs ({}), max {:.1}; background {:.0}% of its alone {:.0}/s",
            w.loaded.p99,
            if w.loaded.p99 <= p99_limit(r, gpu) { "met" } else { "missed" },
            w.loaded.max,
            100.0 * w.bg_loaded / w.bg_alone.max(f64::MIN_POSITIVE),
            w.bg_alone
        );
    }
    s
}
