//! SM-partition bench (issue "SM partitions"): a latency-critical client of the served model
//! of `examples/serve` (bf16, replayed, `Priority::High`, one request every `--gap-us`) alone,
//! then beside a background that fills the GPU (`--bg gemm,wave`): large bf16 GEMMs (cuBLAS,
//! `--bg-n` square) or one wave of long blocks (two 1024-thread blocks per SM, each spinning
//! `--wave-us`: every SM held by a running block, which no stream priority pre-empts), with
//! `--bg-inflight` graphs in flight. First on a pool without partitions (stream priority
//! only), then with a partition of S SMs reserved for the client (S in `--sms`) and the
//! background on the rest. Each row: the client's p50/p99 alone and loaded, loaded p99 over
//! alone, and the background's TFLOP/s loaded against what its share of the SMs predicts
//! (the full device's background alone times rest/all). PyTorch's same experiment
//! (`benches/partition/torch_partition.py`) runs as a subprocess in the same device call when
//! `python3` has torch (`--no-torch` skips it).
//!
//! `cargo bench -p boundpool-bench --bench partition [-- --seconds S --gap-us U --sms 8,16,32
//! --bg gemm,wave --bg-n N --wave-us U --bg-inflight K --json --no-torch]`; from a packed binary, run it from the
//! repository root (the script's path). Without a GPU it says why and exits (status 1 with
//! `BOUNDPOOL_REQUIRE_GPU=1`).

#[path = "../../examples/serve/model.rs"]
mod model;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use boundpool::gpu::cudarc::cublas::sys::cublasOperation_t;
use boundpool::gpu::cudarc::cublas::{Gemm, GemmConfig};
use boundpool::gpu::half::bf16;
use boundpool::gpu::{
    builtin, gpu_unavailable_reason, BoxError, DeviceBuffer, Devices, GpuCtx, GpuDevice,
    GpuGraphBuilder, GpuGraphExt, GpuPool, GpuPoolBuilder, LaunchConfig, Module, Priority,
    SmPartition,
};
use boundpool_workloads::percentile;
use model::{check, GemmPath, ServeOptions, ServedModel, Shape, Weights};
use serde_json::{json, Value};

const SHAPE: Shape = Shape {
    batch: 8,
    dim: 1024,
};

/// A served model beside a full GPU, with and without an SM partition (see the top of this
/// file).
#[derive(clap::Parser, Debug)]
struct Args {
    /// Seconds per scenario.
    #[arg(long, default_value_t = 2.0)]
    seconds: f64,
    /// µs between the client's requests.
    #[arg(long, default_value_t = 200)]
    gap_us: u64,
    /// The client's partition sizes, in SMs.
    #[arg(long, value_delimiter = ',', default_values_t = [8, 16, 32])]
    sms: Vec<u32>,
    /// The background GEMMs' size (square).
    #[arg(long, default_value_t = 8192)]
    bg_n: usize,
    /// Background graphs in flight.
    #[arg(long, default_value_t = 2)]
    bg_inflight: usize,
    /// The backgrounds, in order.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [BgKind::Gemm, BgKind::Wave])]
    bg: Vec<BgKind>,
    /// How long each block of the wave background spins, µs.
    #[arg(long, default_value_t = 1000)]
    wave_us: u64,
    /// Skip the PyTorch peer.
    #[arg(long = "no-torch", action = clap::ArgAction::SetFalse)]
    torch: bool,
    /// JSON lines.
    #[arg(long)]
    json: bool,
}

/// The `q`-quantile of `lat`, µs.
fn pct(lat: &[Duration], q: f64) -> f64 {
    percentile(lat.iter().map(|d| d.as_secs_f64() * 1e6), q)
}

/// The latency-critical client: the served model on `device` at `Priority::High`.
struct Client {
    model: ServedModel<bf16>,
    input: Arc<Vec<bf16>>,
    want: Vec<bf16>,
}

impl Client {
    fn new(pool: &GpuPool, device: &GpuDevice) -> Self {
        let host = Weights::<bf16>::new(SHAPE, 1);
        let w = model::upload_weights(pool, device, &host).expect("weights upload");
        let opts = ServeOptions {
            instances: 1,
            priority: Priority::High,
            gemm: GemmPath::Lt,
            copies_in_graph: true,
            zero_copy: true,
            host_on_device: true,
        };
        let model = ServedModel::new(device, SHAPE, w, opts).expect("model");
        let input = Arc::new(host.request(0));
        let want = host.reference(&input);
        let c = Self { model, input, want };
        // Capture, and check the output once.
        let y = c
            .model
            .serve(pool, c.input.clone(), false)
            .expect("request");
        check(&y, &c.want).expect("the served output");
        c
    }

    /// Requests one at a time, `gap` apart, for `secs`: their latencies.
    fn run(&self, pool: &GpuPool, gap: Duration, secs: f64) -> Vec<Duration> {
        let mut lat = Vec::new();
        let end = Instant::now() + Duration::from_secs_f64(secs);
        let mut next = Instant::now();
        while Instant::now() < end {
            while Instant::now() < next {
                std::hint::spin_loop();
            }
            let t0 = Instant::now();
            let y = self
                .model
                .serve(pool, self.input.clone(), false)
                .expect("request");
            lat.push(t0.elapsed());
            debug_assert_eq!(y.len(), self.want.len());
            next = t0 + lat.last().copied().unwrap_or_default() + gap;
        }
        lat
    }
}

/// What fills the GPU beside the client.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum BgKind {
    /// bf16 GEMMs (cuBLAS) of `--bg-n`, `GEMMS` a graph.
    Gemm,
    /// One wave of long blocks: two 1024-thread blocks per SM of the background's device or
    /// partition, each spinning `--wave-us`, a kernel a graph (the case no stream priority
    /// helps: every SM is held by a running block).
    Wave,
}

impl BgKind {
    fn name(self) -> &'static str {
        match self {
            BgKind::Gemm => "GEMMs",
            BgKind::Wave => "wave of long blocks",
        }
    }
    fn unit(self) -> &'static str {
        match self {
            BgKind::Gemm => "TFLOP/s",
            BgKind::Wave => "busy SMs",
        }
    }
}

/// The background: `inflight` graphs kept in flight, each one node of GPU work.
struct Background {
    graphs: Vec<boundpool::gpu::GpuGraph>,
    /// Work units a graph does (FLOPs, or SM-seconds of blocks).
    per_graph: f64,
}

const GEMMS: usize = 4;

/// A slot's matrices: A and B, and its output (one graph of a slot in flight at a time: the
/// lock is never contended).
type Mats = Arc<(
    DeviceBuffer<bf16>,
    DeviceBuffer<bf16>,
    Mutex<DeviceBuffer<bf16>>,
)>;

impl Background {
    fn new(pool: &GpuPool, device: &GpuDevice, sms: u32, kind: BgKind, a: &Args) -> Self {
        let (n, wave_us) = (a.bg_n, a.wave_us);
        let graphs = (0..a.bg_inflight)
            .map(|_| {
                let mut g = GpuGraphBuilder::new("background");
                match kind {
                    BgKind::Gemm => {
                        let mats = gemm_mats(pool, device, n);
                        g.gpu_node(device, "gemms", move |c| gemms(c, &mats, n));
                    }
                    BgKind::Wave => {
                        let spin = Module::builtin().kernel(builtin::SPIN).expect("bp_spin");
                        // Cycles at the H100's 1.98 GHz boost clock.
                        let cycles = (wave_us as f64 * 1980.0) as i64;
                        g.gpu_node(device, "wave", move |c| {
                            let cfg = LaunchConfig {
                                grid: (2 * sms, 1, 1),
                                block: (1024, 1, 1),
                                shared_mem_bytes: 0,
                            };
                            // SAFETY: `bp_spin` takes one i64.
                            unsafe { c.launch(&spin, cfg).arg(cycles).launch()? };
                            Ok(())
                        });
                    }
                }
                g.build().expect("background graph")
            })
            .collect();
        let per_graph = match kind {
            BgKind::Gemm => 2.0 * (n as f64).powi(3) * GEMMS as f64 / 1e12,
            // Two blocks per SM, each `wave_us`: `sms` SMs busy for `wave_us`.
            BgKind::Wave => f64::from(sms) * wave_us as f64 * 1e-6,
        };
        Self { graphs, per_graph }
    }

    /// Runs until `stop`; returns its throughput (TFLOP/s, or SMs kept busy).
    fn run(&self, pool: &GpuPool, stop: &AtomicBool) -> f64 {
        let t0 = Instant::now();
        let mut inflight = VecDeque::new();
        let mut done = 0u64;
        let mut slot = 0;
        while !stop.load(Ordering::Relaxed) {
            if inflight.len() == self.graphs.len() {
                let h: boundpool::gpu::GraphHandle = inflight.pop_front().expect("in flight");
                h.wait().expect("background graph");
                done += 1;
            }
            inflight.push_back(pool.submit(&self.graphs[slot]).expect("background submit"));
            slot = (slot + 1) % self.graphs.len();
        }
        for h in inflight {
            h.wait().expect("background graph");
            done += 1;
        }
        done as f64 * self.per_graph / t0.elapsed().as_secs_f64()
    }
}

fn gemm_mats(pool: &GpuPool, device: &GpuDevice, n: usize) -> Mats {
    Arc::new(
        pool.call(device, move |c| {
            let a = c.upload(&vec![bf16::from_f32(0.01); n * n])?;
            Ok((a, c.alloc_zeros(n * n)?, c.alloc_zeros(n * n)?))
        })
        .map(|(a, b, out)| (a, b, Mutex::new(out)))
        .expect("background matrices"),
    )
}

fn gemms(c: &GpuCtx<'_, '_>, mats: &Mats, n: usize) -> Result<(), BoxError> {
    let (a, b, out) = &**mats;
    let cfg = GemmConfig {
        transa: cublasOperation_t::CUBLAS_OP_N,
        transb: cublasOperation_t::CUBLAS_OP_N,
        m: n as i32,
        n: n as i32,
        k: n as i32,
        alpha: bf16::from_f32(1.0),
        lda: n as i32,
        ldb: n as i32,
        beta: bf16::from_f32(0.0),
        ldc: n as i32,
    };
    let blas = c.cublas()?;
    let mut out = out.lock().unwrap_or_else(|e| e.into_inner());
    for _ in 0..GEMMS {
        // SAFETY: three n×n column-major matrices.
        unsafe { blas.gemm(cfg, a.as_cuda_slice(), b.as_cuda_slice(), &mut *out)? };
    }
    Ok(())
}

/// One configuration's figures beside one background.
struct Row {
    name: String,
    kind: BgKind,
    lat_sms: Option<u32>,
    bg_sms: u32,
    alone: Vec<Duration>,
    loaded: Vec<Duration>,
    bg_alone: f64,
    bg_loaded: f64,
}

/// The client alone, then for each background kind: the background alone and both together.
fn measure(
    pool: &GpuPool,
    (lat_dev, lat_sms): (&GpuDevice, Option<u32>),
    (bg_dev, bg_sms): (&GpuDevice, u32),
    name: &str,
    a: &Args,
) -> Vec<Row> {
    let client = Client::new(pool, lat_dev);
    let gap = Duration::from_micros(a.gap_us);
    let alone = client.run(pool, gap, a.seconds);
    let mut rows = Vec::new();
    for &kind in &a.bg {
        let bg = Background::new(pool, bg_dev, bg_sms, kind, a);
        let run_bg = |with_client: bool| {
            let stop = AtomicBool::new(false);
            std::thread::scope(|s| {
                let h = s.spawn(|| bg.run(pool, &stop));
                // Let the background fill the GPU first.
                std::thread::sleep(Duration::from_millis(100));
                let lat = if with_client {
                    client.run(pool, gap, a.seconds)
                } else {
                    std::thread::sleep(Duration::from_secs_f64(a.seconds));
                    Vec::new()
                };
                stop.store(true, Ordering::Relaxed);
                (lat, h.join().expect("background thread"))
            })
        };
        let (_, bg_alone) = run_bg(false);
        let (loaded, bg_loaded) = run_bg(true);
        rows.push(Row {
            name: name.to_owned(),
            kind,
            lat_sms,
            bg_sms,
            alone: alone.clone(),
            loaded,
            bg_alone,
            bg_loaded,
        });
    }
    rows
}

fn pool(parts: Option<u32>) -> GpuPool {
    let b = GpuPoolBuilder::new()
        .name("partition-bench")
        .devices(Devices::List(vec![0]))
        .wait_spin(Duration::from_micros(200))
        .idle_spin(Duration::from_micros(200));
    match parts {
        None => b.workers_per_device(4),
        Some(s) => b.sm_partitions(vec![
            SmPartition::new("latency", s).workers(2),
            SmPartition::rest("bulk").workers(2),
        ]),
    }
    .build()
    .expect("GPU pool")
}

fn main() {
    let a: Args = boundpool_bench::flags::parse();
    if let Some(why) = gpu_unavailable_reason() {
        println!("no GPU: {why}");
        if std::env::var("BOUNDPOOL_REQUIRE_GPU").as_deref() == Ok("1") {
            std::process::exit(1);
        }
        return;
    }
    let mut rows = Vec::new();
    let total = {
        let p = pool(None);
        let d = p.devices()[0].clone();
        let total = d.info().sms;
        rows.extend(measure(
            &p,
            (&d, None),
            (&d, total),
            "stream priority only",
            &a,
        ));
        total
    };
    for &s in &a.sms {
        let p = pool(Some(s));
        let d = p.devices()[0].clone();
        let (lat, bulk) = (
            d.on_partition("latency").expect("latency partition"),
            d.on_partition("bulk").expect("bulk partition"),
        );
        let (lat_sms, bg_sms) = (
            d.partition("latency").expect("latency").sms,
            d.partition("bulk").expect("bulk").sms,
        );
        let name = format!("partition of {s} SMs");
        rows.extend(measure(
            &p,
            (&lat, Some(lat_sms)),
            (&bulk, bg_sms),
            &name,
            &a,
        ));
    }
    println!(
        "\nSM partitions: a bf16 served model (1 client, one request every {} us) beside a background ({} in flight), {} s each; background alone and loaded in its units, and loaded over its share of the full device's alone\n",
        a.gap_us, a.bg_inflight, a.seconds
    );
    println!("| background | configuration | client SMs | p50 alone | p99 alone | p50 loaded | p99 loaded | p99 loaded / alone | background alone | loaded | loaded / its SM share |");
    println!("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for r in &rows {
        let full = rows
            .iter()
            .find(|f| f.kind == r.kind && f.lat_sms.is_none())
            .map_or(f64::NAN, |f| f.bg_alone);
        let share = full * f64::from(r.bg_sms) / f64::from(total);
        let v = json!({"impl": "boundpool", "background": r.kind.name(), "config": r.name,
            "client_sms": r.lat_sms, "bg_sms": r.bg_sms,
            "p50_alone_us": pct(&r.alone, 0.5), "p99_alone_us": pct(&r.alone, 0.99),
            "p50_loaded_us": pct(&r.loaded, 0.5), "p99_loaded_us": pct(&r.loaded, 0.99),
            "bg_unit": r.kind.unit(), "bg_alone": r.bg_alone, "bg_loaded": r.bg_loaded, "bg_share": share});
        if a.json {
            println!("{v}");
        }
        println!(
            "| {} | {} | {} | {:.0} us | {:.0} us | {:.0} us | {:.0} us | {:.2}x | {:.0} {} | {:.0} | {:.2} |",
            r.kind.name(),
            r.name,
            r.lat_sms.map_or("all".into(), |s| s.to_string()),
            pct(&r.alone, 0.5),
            pct(&r.alone, 0.99),
            pct(&r.loaded, 0.5),
            pct(&r.loaded, 0.99),
            pct(&r.loaded, 0.99) / pct(&r.alone, 0.99),
            r.bg_alone,
            r.kind.unit(),
            r.bg_loaded,
            r.bg_loaded / share,
        );
    }
    if a.torch {
        torch(&a);
    }
}

/// PyTorch's same experiment, from the script beside this bench: its JSON lines, printed.
fn torch(a: &Args) {
    let script = [
        "benches/partition/torch_partition.py",
        "partition/torch_partition.py",
    ]
    .into_iter()
    .find(|p| std::path::Path::new(p).exists());
    let Some(script) = script else {
        eprintln!("PyTorch peer not run: benches/partition/torch_partition.py not found from this directory");
        return;
    };
    let sms: Vec<String> = a.sms.iter().map(|s| s.to_string()).collect();
    let mut cmd = std::process::Command::new("python3");
    cmd.arg(script)
        .args(["--seconds", &a.seconds.to_string()])
        .args(["--gap-us", &a.gap_us.to_string()])
        .args(["--bg-n", &a.bg_n.to_string()])
        .arg("--sms")
        .args(&sms);
    println!("\nPyTorch, same call:\n");
    match cmd.output() {
        Ok(o) => {
            for l in String::from_utf8_lossy(&o.stdout).lines() {
                if let Ok(v) = serde_json::from_str::<Value>(l) {
                    println!("{v}");
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
