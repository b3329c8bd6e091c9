//! Serving bench: the model of `examples/serve` (4 linear layers, 1024 x 1024, bias, GELU,
//! batch 8) served to client threads, each request a run with its own input (upload, forward
//! pass, download, its output checked against the host reference), replayed and eager, bf16
//! and f32, at 1, 8 and 32 clients; then a latency-critical client (a graph at
//! `Priority::High`, one request every 200 us) alone and beside 8 batch clients. The same
//! requests through PyTorch (`benches/serve/torch_serve.py`, run as a subprocess in this
//! process's device call) when `python3` has torch; the table prints ratios.
//!
//! `cargo bench -p boundpool-bench --bench serve [-- --seconds S --clients 1,8,32 --workers W
//! --spin-us U --idle-spin-us U --no-torch --json]` (`--spin-us`: the pool's `wait_spin`,
//! default 200 us, about a request; `--idle-spin-us`: its `idle_spin`, default 200 us, a pool
//! tuned for latency: `--spin-us 0 --idle-spin-us 20` is a default pool; `--paced-spin-us`:
//! its `paced_spin`, default the library's (on where the pool leaves two cores to its clients); `--gemm
//! cublas`: cuBLAS GEMMs and a bias + GELU kernel instead of cuBLASLt with the bias in its
//! epilogue and a GELU kernel; `--no-tune`: the heuristic's first cuBLASLt algorithm, not the
//! fastest of its offers timed at start (`CublasLt::tune`); `--eager-copies`: the copies in and out as eager nodes around a
//! copy-free graph; `--copy-nodes`: in the graph, copy nodes instead of the default copy kernels
//! reading and writing the mapped pinned buffers). `-- --breakdown`: instead, one client's requests on a traced
//! pool, cut into phases from the timeline (median µs each). from a packed binary, run it from the repository root (the script's
//! path). `--high-partition S`: the priority scenario once more on a pool whose device is split,
//! S SMs (2 workers) for the latency-critical client and the rest for the batch clients (with
//! `--priority-only`, every round on that pool). `--priority-only --rounds R --batch-clients
//! 8,16,32 [--slices N]`: the latency-critical client's rounds alone and loaded, each phase
//! in N alternated slices (`serve/tail.rs`, with
//! `--tail-probe` and `--tail-trace`); `--isolate workers|high`: the clients' threads kept off
//! the workers' cores (`serve/placement.rs`), and `--batch-cores LIST` the batch clients on
//! LIST; `--inject-stalls WHERE:MS:PER_S` holds chosen cores off their threads at random
//! (`boundpool_bench::stalls`). Without a GPU it says why and exits (status 1 with `BOUNDPOOL_REQUIRE_GPU=1`).

#[path = "../../examples/serve/model.rs"]
mod model;
#[path = "serve/placement.rs"]
mod placement;
#[path = "serve/tail.rs"]
mod tail;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use boundpool::gpu::cudarc::cublas::{CudaBlas, Gemm};
use boundpool::gpu::half::bf16;
use boundpool::gpu::{
    gpu_unavailable_reason, Devices, GpuDevice, GpuPool, GpuPoolBuilder, Priority, SmPartition,
};
use boundpool_bench::stalls::{self, StallSpec};
use boundpool_workloads::{median, percentile};
use clap::ArgAction;
use model::{check, Elem, GemmPath, ServeOptions, ServedModel, Shape, Weights};
use serde_json::{json, Value};

const SHAPE: Shape = Shape {
    batch: 8,
    dim: 1024,
};
const INPUTS: u64 = 8;

/// The served model of examples/serve to client threads, against PyTorch (see the top of this
/// file).
#[derive(clap::Parser, Debug)]
struct Args {
    /// Seconds per configuration.
    #[arg(long, default_value_t = 2.0)]
    seconds: f64,
    /// Batch client counts.
    #[arg(long, value_delimiter = ',', default_values_t = [1, 8, 32])]
    clients: Vec<usize>,
    /// Device workers.
    #[arg(long, default_value_t = 8)]
    workers: usize,
    /// The pool's `wait_spin`, µs.
    #[arg(long, default_value_t = 200)]
    spin_us: u64,
    /// The pool's `idle_spin`, µs.
    #[arg(long, default_value_t = 200)]
    idle_spin_us: u64,
    /// The pool's `paced_spin`, µs (default: the library's: 1 ms where the pool leaves two cores or more to other threads).
    #[arg(long)]
    paced_spin_us: Option<u64>,
    /// The pool's `spinning_waiters` (default: the library's).
    #[arg(long)]
    spinning_waiters: Option<usize>,
    /// The GEMMs: `lt` (cuBLASLt, the bias in the epilogue) or `cublas` (and a bias + GELU
    /// kernel).
    #[arg(long, default_value = "lt", value_parser = gemm_path)]
    gemm: GemmPath,
    /// The copies in and out as eager nodes around a copy-free graph.
    #[arg(long = "eager-copies", action = ArgAction::SetFalse)]
    copies_in_graph: bool,
    /// In the graph, copy nodes instead of copy kernels on the mapped pinned buffers.
    #[arg(long = "copy-nodes", action = ArgAction::SetFalse)]
    zero_copy: bool,
    /// The heuristic's first cuBLASLt algorithm, not the fastest of its offers.
    #[arg(long = "no-tune", action = ArgAction::SetFalse)]
    tune: bool,
    /// Instead, one client's requests on a traced pool, cut into phases.
    #[arg(long)]
    breakdown: bool,
    /// The priority scenario once more with S SMs for the latency-critical client.
    #[arg(long, value_name = "S")]
    high_partition: Option<u32>,
    /// The model's host nodes (staging, reading out) on any worker rather than on its
    /// device's (`ReplayBuilder::host_node_on`): on a split device, the batch's then run on the
    /// latency partition's workers too.
    #[arg(long)]
    host_nodes_anywhere: bool,
    /// Skip the PyTorch peer.
    #[arg(long = "no-torch", action = ArgAction::SetFalse)]
    torch: bool,
    /// JSON lines.
    #[arg(long)]
    json: bool,
    /// Instead, the priority scenario only (the high client alone, the batch alone, both),
    /// `--rounds` times for each of `--batch-clients`.
    #[arg(long)]
    priority_only: bool,
    /// Batch client counts of `--priority-only`, `--tail-probe` and `--tail-trace`.
    #[arg(long, value_delimiter = ',', default_values_t = [8])]
    batch_clients: Vec<usize>,
    /// Rounds of `--priority-only`.
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// Each `--priority-only` round's three phases (the high client alone, the batch alone,
    /// both) cut into this many slices of `--seconds`/N and alternated, so that a drift in the
    /// host's or the GPU's speed falls on the three alike; the batch alone and both swap places
    /// every other slice, and each round prints its slices' range of the batch's share kept.
    /// 1: one after another.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100))]
    slices: u32,
    /// Instead, the high client's requests read around by the host's scheduler counters
    /// (run delay, involuntary switches) and cut at their GPU segment's launch (the driver's
    /// launch call, the device's time, the worker seeing it done: `Replayable::probe_launches`):
    /// the median against the slowest 1%.
    #[arg(long)]
    tail_probe: bool,
    /// Instead, the high client's requests on a traced pool cut into phases: the median
    /// against the slowest 1%.
    #[arg(long)]
    tail_trace: bool,
    /// Where the client threads run (`--priority-only`, `--tail-probe`): `workers` keeps
    /// them off the pool's worker cores; `high` also gives the latency-critical client a core
    /// of its own. Default: wherever the OS puts them.
    #[arg(long, value_parser = ["workers", "high"])]
    isolate: Option<String>,
    /// With `--isolate`: the batch clients' cores, instead of every core free of the workers
    /// (and of the latency-critical client's).
    #[arg(long, value_delimiter = ',')]
    batch_cores: Vec<usize>,
    /// With `--isolate high --high-partition S`: on each core of WHERE (`batch-workers`,
    /// `batch-clients`, `high-path`, or of the high path only `latency-workers` or
    /// `high-client`) a thread at SCHED_FIFO spins MS ms at random instants, PER_S times a
    /// second on average, for the whole run (`boundpool_bench::stalls`): the hypervisor's
    /// steal, placed and dosed. Each round prints the stalls' ms in each phase.
    #[arg(long, value_name = "WHERE:MS:PER_S", value_parser = boundpool_bench::stalls::parse)]
    inject_stalls: Option<StallSpec>,
}

fn gemm_path(s: &str) -> Result<GemmPath, String> {
    match s {
        "lt" => Ok(GemmPath::Lt),
        "cublas" => Ok(GemmPath::Cublas),
        _ => Err(format!("`{s}` is neither lt nor cublas")),
    }
}

/// Latencies of one configuration.
struct Run {
    lat: Vec<Duration>,
    /// Each request's start, in the order of `lat` (the high client's only; empty for the batch).
    starts: Vec<Instant>,
    secs: f64,
}

impl Run {
    /// No requests yet.
    fn empty() -> Self {
        Run {
            lat: Vec::new(),
            starts: Vec::new(),
            secs: 0.0,
        }
    }

    /// `other`'s requests and time added to these.
    fn extend(&mut self, other: Run) {
        self.lat.extend(other.lat);
        self.starts.extend(other.starts);
        self.secs += other.secs;
    }

    /// The `q`-quantile of the latencies, µs.
    fn pct(&self, q: f64) -> f64 {
        percentile(self.lat.iter().map(|d| d.as_secs_f64() * 1e6), q)
    }
    fn rps(&self) -> f64 {
        self.lat.len() as f64 / self.secs
    }
}

/// The model in `T` with its inputs and their references.
struct Bench<T: Elem> {
    normal: ServedModel<T>,
    high: ServedModel<T>,
    inputs: Vec<Arc<Vec<T>>>,
    want: Vec<Vec<T>>,
}

impl<T: Elem> Bench<T>
where
    CudaBlas: Gemm<T>,
{
    /// The batch clients' model on `device`, the latency-critical client's on `high_device`
    /// (both device 0 of `pool`, or two of its SM partitions).
    fn new(
        pool: &GpuPool,
        (device, high_device): (&GpuDevice, &GpuDevice),
        instances: usize,
        a: &Args,
    ) -> Self {
        let host = Weights::<T>::new(SHAPE, 1);
        let w = model::upload_weights(pool, device, &host).expect("weights upload");
        if a.tune && a.gemm == GemmPath::Lt {
            let t = model::tune_layers(pool, device, SHAPE, &w).expect("tuning");
            println!("{} layers, cuBLASLt tuned: {t}", T::NAME);
        }
        let inputs: Vec<Arc<Vec<T>>> = (0..INPUTS).map(|k| Arc::new(host.request(k))).collect();
        let want = inputs.iter().map(|x| host.reference(x)).collect();
        let opts = |instances, priority| ServeOptions {
            instances,
            priority,
            gemm: a.gemm,
            copies_in_graph: a.copies_in_graph,
            zero_copy: a.zero_copy,
            host_on_device: !a.host_nodes_anywhere,
        };
        Self {
            normal: ServedModel::new(device, SHAPE, w.clone(), opts(instances, Priority::Normal))
                .expect("model"),
            high: ServedModel::new(high_device, SHAPE, w, opts(1, Priority::High)).expect("model"),
            inputs,
            want,
        }
    }

    /// One client's loop: requests back to back (or `gap` apart, each read by `probe`) until
    /// `stop`.
    fn client(
        &self,
        pool: &GpuPool,
        m: &ServedModel<T>,
        c: usize,
        eager: bool,
        (gap, probe): (Option<Duration>, Option<&tail::TailProbe>),
        stop: &AtomicBool,
    ) -> (Vec<Duration>, Vec<Instant>) {
        let mut lat = Vec::with_capacity(1 << 16);
        let mut starts = Vec::with_capacity(1 << 16);
        let mut r = 0usize;
        while !stop.load(Ordering::Relaxed) {
            let k = (c * 7 + r) % INPUTS as usize;
            let before = probe.and_then(|p| p.before());
            let t = Instant::now();
            let y = m
                .serve(pool, self.inputs[k].clone(), eager)
                .unwrap_or_else(|e| panic!("client {c} request {r}: {e}"));
            let took = t.elapsed();
            lat.push(took);
            starts.push(t);
            if let Some(p) = probe {
                p.after(before, t, took);
            }
            if let Err(e) = check(&y, &self.want[k]) {
                panic!("{} client {c} request {r}: {e}", T::NAME);
            }
            r += 1;
            if let Some(g) = gap {
                std::thread::sleep(g);
            }
        }
        (lat, starts)
    }

    /// `clients` clients for `secs` after a warm-up (every instance captured): all requests'
    /// latencies, and with `high`, the high client's apart (its requests read by `probe`).
    fn serve(
        &self,
        pool: &GpuPool,
        clients: usize,
        eager: bool,
        high: bool,
        secs: f64,
        probe: Option<&tail::TailProbe>,
    ) -> (Run, Option<Run>) {
        let stop = AtomicBool::new(false);
        let n = clients + usize::from(high);
        let start = Barrier::new(n + 1);
        std::thread::scope(|s| {
            let batch: Vec<_> = (0..clients)
                .map(|c| {
                    let (stop, start) = (&stop, &start);
                    s.spawn(move || {
                        placement::batch_thread();
                        for w in 0..20 {
                            let k = (c + w) % INPUTS as usize;
                            let _ = self
                                .normal
                                .serve(pool, self.inputs[k].clone(), eager)
                                .expect("warm-up");
                        }
                        start.wait();
                        self.client(pool, &self.normal, c, eager, (None, None), stop)
                    })
                })
                .collect();
            let hi = high.then(|| {
                let (stop, start) = (&stop, &start);
                s.spawn(move || {
                    placement::high_thread();
                    for w in 0..20 {
                        let _ = self
                            .high
                            .serve(pool, self.inputs[w % 8].clone(), eager)
                            .expect("warm-up");
                    }
                    start.wait();
                    self.client(
                        pool,
                        &self.high,
                        99,
                        eager,
                        (Some(Duration::from_micros(200)), probe),
                        stop,
                    )
                })
            });
            start.wait();
            let t0 = Instant::now();
            std::thread::sleep(Duration::from_secs_f64(secs));
            stop.store(true, Ordering::Relaxed);
            let lat: Vec<Duration> = batch
                .into_iter()
                .flat_map(|h| h.join().expect("client").0)
                .collect();
            let secs = t0.elapsed().as_secs_f64();
            let hi = hi.map(|h| {
                let (lat, starts) = h.join().expect("high client");
                Run { lat, starts, secs }
            });
            let starts = Vec::new();
            (Run { lat, starts, secs }, hi)
        })
    }
}

fn line(v: &Value, json: bool) {
    if json {
        println!("{v}");
    }
}

fn run_dtype<T: Elem>(pool: &GpuPool, a: &Args, out: &mut Vec<Value>)
where
    CudaBlas: Gemm<T>,
{
    let d = pool.device(0).expect("device 0").clone();
    let b = Bench::<T>::new(
        pool,
        (&d, &d),
        a.clients.iter().copied().max().unwrap_or(8),
        a,
    );
    for &eager in &[false, true] {
        for &c in &a.clients {
            let (r, _) = b.serve(pool, c, eager, false, a.seconds, None);
            let v = json!({"impl": "boundpool", "dtype": T::NAME, "mode": if eager {"eager"} else {"graph"},
                "clients": c, "spin_us": a.spin_us, "idle_spin_us": a.idle_spin_us, "paced_spin_us": a.paced_spin_us, "gemm": format!("{:?}", a.gemm), "copies_in_graph": a.copies_in_graph, "zero_copy": a.zero_copy, "tuned": a.tune && a.gemm == GemmPath::Lt, "requests": r.lat.len(), "seconds": r.secs, "rps": r.rps(),
                "p50_us": r.pct(0.5), "p99_us": r.pct(0.99)});
            line(&v, a.json);
            out.push(v);
        }
    }
    out.push(priority_scenario(pool, &b, a, None));
}

/// The latency-critical client alone, then beside 8 batch clients; the batch alone. With
/// `partition`, the client's model is on an SM partition of that many SMs and the batch's on
/// the rest.
fn priority_scenario<T: Elem>(
    pool: &GpuPool,
    b: &Bench<T>,
    a: &Args,
    partition: Option<u32>,
) -> Value
where
    CudaBlas: Gemm<T>,
{
    let (_, alone) = b.serve(pool, 0, false, true, a.seconds, None);
    let (batch_alone, _) = b.serve(pool, 8, false, false, a.seconds, None);
    let (batch, loaded) = b.serve(pool, 8, false, true, a.seconds, None);
    let (alone, loaded) = (alone.expect("high"), loaded.expect("high"));
    let v = json!({"impl": "boundpool", "scenario": "priority", "dtype": T::NAME, "mode": "graph",
        "batch_clients": 8, "high_alone_p50_us": alone.pct(0.5), "high_alone_p99_us": alone.pct(0.99),
        "high_loaded_p50_us": loaded.pct(0.5), "high_loaded_p99_us": loaded.pct(0.99),
        "batch_rps": batch.rps(), "batch_alone_rps": batch_alone.rps(), "partition_sms": partition});
    line(&v, a.json);
    v
}

/// `--paced-spin-us` on the pool, where given (the library's default otherwise).
fn paced_spin(b: GpuPoolBuilder, a: &Args) -> GpuPoolBuilder {
    match a.paced_spin_us {
        Some(us) => b.paced_spin(Duration::from_micros(us)),
        None => b,
    }
}

/// A pool whose device 0 is split: `sms` SMs (2 workers) for the latency-critical client, the
/// rest (the other workers) for the batch clients.
fn partitioned_pool(a: &Args, sms: u32, trace: bool) -> GpuPool {
    let b = GpuPoolBuilder::new()
        .name("serve-partitioned")
        .trace(trace)
        .devices(Devices::List(vec![0]))
        .wait_spin(Duration::from_micros(a.spin_us))
        .idle_spin(Duration::from_micros(a.idle_spin_us));
    paced_spin(b, a)
        .sm_partitions(vec![
            SmPartition::new("latency", sms).workers(2),
            SmPartition::rest("batch").workers(a.workers.saturating_sub(2).max(1)),
        ])
        .build()
        .expect("partitioned GPU pool")
}

/// The batch clients' device and the latency-critical client's: the two SM partitions of a
/// `partitioned_pool`.
fn partitions(pool: &GpuPool) -> (GpuDevice, GpuDevice) {
    let d = pool.device(0).expect("device 0");
    (
        d.on_partition("batch").expect("batch partition"),
        d.on_partition("latency").expect("latency partition"),
    )
}

/// The priority scenario on a pool whose device 0 is split: `sms` SMs (2 workers) for the
/// latency-critical client, the rest (the other workers) for the batch clients.
fn partitioned_priority<T: Elem>(a: &Args, sms: u32, out: &mut Vec<Value>)
where
    CudaBlas: Gemm<T>,
{
    let pool = partitioned_pool(a, sms, false);
    let (batch, lat) = partitions(&pool);
    let b = Bench::<T>::new(&pool, (&batch, &lat), 8, a);
    out.push(priority_scenario(&pool, &b, a, Some(sms)));
}

/// PyTorch's figures for the same configurations, from the script beside this bench.
fn torch(a: &Args) -> Vec<Value> {
    let script = ["benches/serve/torch_serve.py", "serve/torch_serve.py"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists());
    let Some(script) = script else {
        eprintln!(
            "PyTorch peer not run: benches/serve/torch_serve.py not found from this directory"
        );
        return Vec::new();
    };
    let clients: Vec<String> = a.clients.iter().map(|c| c.to_string()).collect();
    let secs = a.seconds.to_string();
    let mut out = Vec::new();
    for extra in [
        vec!["--clients"],
        vec!["--high", "--mode", "graph", "--clients"],
    ] {
        let mut cmd = std::process::Command::new("python3");
        cmd.arg(script).args(["--seconds", &secs]).args(&extra);
        if extra.len() > 1 {
            cmd.arg("8");
        } else {
            cmd.args(&clients);
        }
        match cmd.output() {
            Ok(o) => {
                for l in String::from_utf8_lossy(&o.stdout).lines() {
                    if let Ok(v) = serde_json::from_str::<Value>(l) {
                        line(&v, a.json);
                        out.push(v);
                    }
                }
                if !o.status.success() {
                    eprintln!(
                        "PyTorch peer failed: {}",
                        String::from_utf8_lossy(&o.stderr)
                    );
                }
            }
            Err(e) => eprintln!("PyTorch peer not run: python3: {e}"),
        }
    }
    out
}

fn f(v: &Value, k: &str) -> f64 {
    v.get(k).and_then(Value::as_f64).unwrap_or(f64::NAN)
}

fn find<'a>(
    vs: &'a [Value],
    imp: &str,
    dtype: &str,
    mode: &str,
    clients: u64,
) -> Option<&'a Value> {
    vs.iter().find(|v| {
        v["impl"] == imp && v["dtype"] == dtype && v["mode"] == mode && v["clients"] == clients
    })
}

fn table(ours: &[Value], theirs: &[Value], a: &Args) {
    println!("| dtype | mode | clients | boundpool req/s | p50 us | p99 us | PyTorch req/s | p50 us | p99 us | req/s ratio | p50 ratio |");
    println!("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for dtype in ["bf16", "f32"] {
        for mode in ["graph", "eager"] {
            for &c in &a.clients {
                let Some(o) = find(ours, "boundpool", dtype, mode, c as u64) else {
                    continue;
                };
                let t = find(theirs, "pytorch", dtype, mode, c as u64);
                let tf = |k| t.map_or(f64::NAN, |t| f(t, k));
                println!(
                    "| {dtype} | {mode} | {c} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.2} | {:.2} |",
                    f(o, "rps"), f(o, "p50_us"), f(o, "p99_us"), tf("rps"), tf("p50_us"), tf("p99_us"),
                    f(o, "rps") / tf("rps"), f(o, "p50_us") / tf("p50_us")
                );
            }
        }
        let best = theirs
            .iter()
            .filter(|v| v["dtype"] == dtype && v.get("rps").is_some())
            .map(|v| f(v, "rps"))
            .fold(f64::NAN, f64::max);
        if let Some(o) = find(ours, "boundpool", dtype, "graph", 8) {
            println!(
                "{dtype}: replayed boundpool at 8 clients {:.0} req/s = {:.2}x PyTorch's best ({best:.0} req/s); p99 {:.0} us",
                f(o, "rps"), f(o, "rps") / best, f(o, "p99_us")
            );
        }
        let priority = ours
            .iter()
            .chain(theirs)
            .filter(|v| v["scenario"] == "priority" && v["dtype"] == dtype);
        for p in priority {
            let imp = p["impl"].as_str().unwrap_or("?");
            let on = match p.get("partition_sms").and_then(Value::as_u64) {
                Some(s) => format!(" (on a partition of {s} SMs, the batch on the rest)"),
                None => String::new(),
            };
            println!(
                "{dtype} {imp}{on}: high-priority client p99 alone {:.0} us, beside 8 batch clients {:.0} us ({:.2}x); batch {:.0} req/s ({:.2}x of alone)",
                f(p, "high_alone_p99_us"), f(p, "high_loaded_p99_us"),
                f(p, "high_loaded_p99_us") / f(p, "high_alone_p99_us"),
                f(p, "batch_rps"), f(p, "batch_rps") / f(p, "batch_alone_rps")
            );
        }
    }
}

/// One client's requests on a traced pool, each cut into phases from the timeline
/// ([`tail::PHASES`]): median µs of each.
fn breakdown<T: Elem>(pool: &GpuPool, a: &Args)
where
    CudaBlas: Gemm<T>,
{
    let d = pool.device(0).expect("device 0").clone();
    let b = Bench::<T>::new(pool, (&d, &d), 1, a);
    let m = &b.normal;
    for k in 0..50 {
        m.serve(pool, b.inputs[k % 8].clone(), false)
            .expect("warm-up");
    }
    let _ = pool.take_trace();
    let epoch_probe = pool.take_trace().epoch;
    let mut windows = Vec::new();
    for k in 0..300 {
        let t0 = epoch_probe.elapsed().as_nanos() as u64;
        let y = m
            .serve(pool, b.inputs[k % 8].clone(), false)
            .expect("request");
        let t1 = epoch_probe.elapsed().as_nanos() as u64;
        check(&y, &b.want[k % 8]).expect("checked");
        windows.push((t0, t1));
        std::thread::sleep(Duration::from_micros(20));
    }
    let tr = pool.take_trace();
    let rows = tail::cut_phases(&tr, &windows, &format!("serve {}", T::NAME));
    println!(
        "{} 1 client, {} requests traced ({} not matched): median us per phase",
        T::NAME,
        rows.len(),
        windows.len() - rows.len()
    );
    for (i, n) in tail::PHASES.iter().enumerate() {
        println!("| {n} | {:.1} |", median(rows.iter().map(|r| r[i])));
    }
}

fn main() {
    let a: Args = boundpool_bench::flags::parse();
    if let Some(why) = gpu_unavailable_reason() {
        eprintln!("SKIPPED serve bench: no GPU: {why}");
        if std::env::var("BOUNDPOOL_REQUIRE_GPU").is_ok_and(|v| v == "1") {
            std::process::exit(1);
        }
        return;
    }
    let pool = GpuPoolBuilder::new()
        .name("serve")
        .devices(Devices::List(vec![0]))
        .workers_per_device(a.workers)
        .wait_spin(Duration::from_micros(a.spin_us))
        .idle_spin(Duration::from_micros(a.idle_spin_us));
    let pool = paced_spin(pool, &a);
    let pool = match a.spinning_waiters {
        Some(n) => pool.spinning_waiters(n),
        None => pool,
    };
    if a.breakdown {
        let pool = pool.trace(true).build().expect("GPU pool");
        breakdown::<bf16>(&pool, &a);
        breakdown::<f32>(&pool, &a);
        return;
    }
    let pool = match a.tail_trace {
        true => pool.trace(true),
        false => pool,
    };
    if a.tail_trace || a.tail_probe || a.priority_only {
        // With `--high-partition S`: on a partitioned pool instead (traced too, for
        // `--tail-trace`).
        let pool = match a.high_partition {
            Some(sms) => partitioned_pool(&a, sms, a.tail_trace),
            None => pool.build().expect("GPU pool"),
        };
        let (batch, lat) = match a.high_partition {
            Some(_) => partitions(&pool),
            None => {
                let d = pool.device(0).expect("device 0").clone();
                (d.clone(), d)
            }
        };
        placement::init(a.isolate.as_deref(), &a.batch_cores, &pool);
        if let Some(spec) = a.inject_stalls {
            let cores = placement::stall_cores(spec.place);
            if let Err(e) = stalls::start(spec, &cores) {
                eprintln!("serve bench: --inject-stalls: {e} (it needs --isolate high and --high-partition)");
                std::process::exit(2);
            }
        }
        let devices = (&batch, &lat);
        if a.tail_trace {
            tail::traced::<bf16>(&pool, devices, &a);
            tail::traced::<f32>(&pool, devices, &a);
        } else if a.tail_probe {
            tail::probe::<bf16>(&pool, devices, &a);
            tail::probe::<f32>(&pool, devices, &a);
        } else {
            let mut ours = Vec::new();
            tail::priority_rounds::<bf16>(&pool, devices, &a, &mut ours);
            tail::priority_rounds::<f32>(&pool, devices, &a, &mut ours);
        }
        return;
    }
    let pool = pool.build().expect("GPU pool");
    let mut ours = Vec::new();
    run_dtype::<bf16>(&pool, &a, &mut ours);
    run_dtype::<f32>(&pool, &a, &mut ours);
    drop(pool);
    if let Some(sms) = a.high_partition {
        partitioned_priority::<bf16>(&a, sms, &mut ours);
        partitioned_priority::<f32>(&a, sms, &mut ours);
    }
    let theirs = if a.torch { torch(&a) } else { Vec::new() };
    table(&ours, &theirs, &a);
}
