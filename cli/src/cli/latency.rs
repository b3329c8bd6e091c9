//! `boundpool bench --latency`: what priorities buy a latency-critical graph on a full pool.
//!
//! Background: low-priority wide graphs (a source, `width` nodes of ~20 µs busy work, a sink),
//! kept in flight by a feeder thread so that every worker is always busy. Foreground: a
//! 20-node chain submitted every millisecond and waited for; its latency is submit → `wait`
//! returned. Five phases on one pool: the foreground alone (high, then normal), the background
//! alone, both with the foreground at high priority, both with it at normal priority. With
//! `--gpu` the nodes are GPU nodes on one device's workers: background kernels of ~20 µs that
//! fill the device (`BG_GRID` blocks of `BG_BLOCK` threads, each spinning ~20 µs: with only a
//! block or two, the device would have free SMs for anyone and stream priorities would decide
//! nothing), foreground empty one-thread kernels. The background is low (its nodes enqueue on
//! each worker's low-priority stream), the foreground high (the high-priority stream) or normal
//! (the worker's normal stream, of the default priority, which is also the least).
//!
//! Targets (same process): host foreground p99 under load ≤ 1.5 × alone + 50 µs (GPU: 2 × alone
//! + 50 µs); background ≥ 80 % of its alone throughput.

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use boundpool::gpu::{
    builtin, Devices, GpuGraphBuilder, GpuGraphExt, GpuPool, GpuPoolBuilder, GpuWorker, Kernel,
    LaunchConfig, Module,
};
use boundpool::{default_workers, Graph, GraphBuilder, GraphHandle, Pool, PoolBuilder, Priority};

use crate::BenchArgs;

/// Nodes of the foreground chain.
const CHAIN: usize = 20;
/// Busy time of a background node.
const BUSY: Duration = Duration::from_micros(20);
/// Foreground submissions are this far apart.
const PERIOD: Duration = Duration::from_millis(1);
/// Blocks of a GPU background kernel: with `BG_BLOCK` threads each, about one full wave of an
/// H100 / H200 (132 SMs × 2,048 resident threads = 2,112 such blocks).
const BG_GRID: u32 = 2048;
/// Threads per block of a GPU background kernel.
const BG_BLOCK: u32 = 128;
/// Spin of a GPU background kernel's blocks: ~20 µs at the H100's / H200's ~1.98 GHz boost
/// clock.
const BG_CYCLES: i64 = 40_000;

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
    fn workers(&self) -> usize;
    fn submit_fg(&self, high: bool) -> Result<GraphHandle, String>;
    fn submit_bg(&self) -> Result<GraphHandle, String>;
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
    fn workers(&self) -> usize {
        self.pool.workers().len()
    }
    fn submit_fg(&self, high: bool) -> Result<GraphHandle, String> {
        let g = if high { &self.fg_high } else { &self.fg_normal };
        self.pool.submit(g).map_err(|e| e.to_string())
    }
    fn submit_bg(&self) -> Result<GraphHandle, String> {
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
    width: usize,
}

fn gpu_chain(pool: &GpuPool, empty: &Arc<Kernel>, p: Priority) -> Result<Graph<GpuWorker>, String> {
    let device = pool.devices()[0].clone();
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
    cycles: i64,
) -> Result<Graph<GpuWorker>, String> {
    let device = pool.devices()[0].clone();
    let mut g = GpuGraphBuilder::new("background");
    let src = g.gpu_node(&device, "src", |_| Ok(()));
    let sink = g.gpu_node(&device, "sink", |_| Ok(()));
    let cfg = LaunchConfig {
        grid: (BG_GRID, 1, 1),
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
    fn workers(&self) -> usize {
        self.pool.pool().workers().len()
    }
    fn submit_fg(&self, high: bool) -> Result<GraphHandle, String> {
        let g = if high { &self.fg_high } else { &self.fg_normal };
        self.pool.submit(g).map_err(|e| e.to_string())
    }
    fn submit_bg(&self) -> Result<GraphHandle, String> {
        self.pool.submit(&self.bg).map_err(|e| e.to_string())
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
    in_flight: usize,
    stop: &AtomicBool,
    nodes: &AtomicU64,
) -> Result<(), String> {
    let mut q = std::collections::VecDeque::new();
    while !stop.load(Ordering::Relaxed) {
        while q.len() < in_flight {
            q.push_back(side.submit_bg()?);
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

/// One phase: the background (if `bg`) and the foreground (if `fg`: `Some(high)`) for `dur`.
/// Returns (foreground latencies, background nodes per second).
fn phase(
    side: &dyn Side,
    fg: Option<bool>,
    bg: bool,
    dur: Duration,
) -> Result<(Vec<f64>, f64), String> {
    let stop = AtomicBool::new(false);
    let nodes = AtomicU64::new(0);
    thread::scope(|s| {
        let feeder = bg.then(|| s.spawn(|| feeder(side, 3, &stop, &nodes)));
        // Let the background fill the pool before measuring.
        if bg {
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
    let workers = a
        .threads
        .unwrap_or_else(|| default_workers().saturating_sub(1).max(1));
    if workers == 0 {
        eprintln!("boundpool bench --latency: --threads must be at least 1");
        return ExitCode::from(2);
    }
    // Enough background nodes per graph that every worker has several queued.
    let width = (workers * 8).max(16);
    let side: Box<dyn Side> = if a.gpu {
        if let Some(why) = boundpool::gpu::gpu_unavailable_reason() {
            eprintln!("boundpool bench --latency --gpu: no GPU: {why}");
            return ExitCode::from(2);
        }
        match gpu_side(workers, width) {
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
    match measure(&*side, Duration::from_secs_f64(a.seconds)) {
        Ok(r) => {
            let json = report(&r, a.gpu, workers);
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

fn gpu_side(workers: usize, width: usize) -> Result<GpuSide, String> {
    let pool = GpuPoolBuilder::new()
        .name("latency-gpu")
        .devices(Devices::List(vec![0]))
        .workers_per_device(workers)
        .build()
        .map_err(|e| format!("the GPU pool did not start: {e}"))?;
    let m = Module::builtin();
    let spin_k = Arc::new(m.kernel(builtin::SPIN).map_err(|e| e.to_string())?);
    Ok(GpuSide {
        fg_high: gpu_chain(&pool, &spin_k, Priority::High)?,
        fg_normal: gpu_chain(&pool, &spin_k, Priority::Normal)?,
        bg: gpu_wide(&pool, &spin_k, width, BG_CYCLES)?,
        pool,
        width,
    })
}

struct Results {
    alone: Lat,
    normal_alone: Lat,
    loaded: Lat,
    normal_loaded: Lat,
    bg_alone: f64,
    bg_loaded: f64,
    bg_loaded_normal: f64,
    samples: usize,
}

fn measure(side: &dyn Side, dur: Duration) -> Result<Results, String> {
    // Warm-up: one of each graph (module load, first allocations, the priority switch).
    phase(side, Some(true), false, Duration::from_millis(50))?;
    let (alone, _) = phase(side, Some(true), false, dur)?;
    let (normal_alone, _) = phase(side, Some(false), false, dur)?;
    let (_, bg_alone) = phase(side, None, true, dur)?;
    let (loaded, bg_loaded) = phase(side, Some(true), true, dur)?;
    let (normal_loaded, bg_loaded_normal) = phase(side, Some(false), true, dur)?;
    let _ = side.workers();
    Ok(Results {
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
            "grid": BG_GRID,
            "block": BG_BLOCK,
            "cycles": BG_CYCLES,
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
            format!(" (kernels of {BG_GRID} blocks × {BG_BLOCK} threads, filling the device)")
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
    s
}
