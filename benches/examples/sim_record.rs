//! Records on the GPU machine what `boundpool sim check-cholesky` and `check-serve` compare
//! the simulator with (run by `benches/device/sim_call.sh`):
//!
//! * `sim_record cholesky --n 8192,16384,32768 --tile 2048 --out DIR`: per N, the tiled
//!   Cholesky on a one-worker pool (every node at normal priority: one stream, every kernel
//!   alone on the GPU), warm, traced:
//!   `chol_N_1w.json`, the costs; then the bench's configuration (8 workers: 4 panel workers
//!   on priority -5 streams, 4 update workers, no stream hand-off), warm, `--runs` timed runs
//!   untraced: `chol_N.json` (`{"n", "tile", "workers", "ms": [...], "card"}`), and one
//!   traced run of it: `chol_N_8w.json`, for the diagnosis of a miss.
//! * `sim_record serve --clients 1,8,32 --seconds 2 --out DIR`: the served model of
//!   `examples/serve` (bf16, replayed) on a traced pool of 8 workers (the bench's spins), per
//!   client count: its Chrome trace `serve_C.json` and `serve_C_measured.json` (`{"clients",
//!   "requests", "seconds", "rps", "p50_us", "think_us"}`: `think_us` is the median time a
//!   client spends between a request's return and the next one's submission).
//!
//! Without a GPU it says so and exits (status 1 under `BOUNDPOOL_REQUIRE_GPU=1`).

#[path = "../../examples/serve/model.rs"]
mod model;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use boundpool::gpu::half::bf16;
use boundpool::gpu::{gpu_unavailable_reason, Devices, GpuPool, GpuPoolBuilder, Priority};
use boundpool_bench::cholesky::{spd_matrix, CholeskyPlan, TileBlas, Vector};
use boundpool_workloads::median;
use model::{check, GemmPath, ServeOptions, ServedModel, Shape, Weights};
use serde_json::json;

#[derive(clap::Parser, Debug)]
struct Args {
    /// `cholesky` or `serve`.
    what: String,
    /// Orders of the matrix (cholesky).
    #[arg(long, value_delimiter = ',', default_values_t = [8192, 16384, 32768])]
    n: Vec<usize>,
    /// Tile size (cholesky).
    #[arg(long, default_value_t = 2048)]
    tile: usize,
    /// Timed runs (cholesky).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Client counts (serve).
    #[arg(long, value_delimiter = ',', default_values_t = [1, 8, 32])]
    clients: Vec<usize>,
    /// Seconds per client count (serve).
    #[arg(long, default_value_t = 2.0)]
    seconds: f64,
    /// Where to write.
    #[arg(long)]
    out: PathBuf,
}

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn write(path: &Path, v: &serde_json::Value) -> Res<()> {
    std::fs::write(path, serde_json::to_string(v)?)?;
    println!("wrote {}", path.display());
    Ok(())
}

/// A pool for the factorization: one worker (one stream), or the bench's 8.
fn chol_pool(workers: usize, trace: bool) -> Res<GpuPool> {
    let b = GpuPoolBuilder::new()
        .devices(Devices::List(vec![0]))
        .workers_per_device(workers)
        .blas(true)
        .solver(true)
        .trace(trace);
    let b = if workers > 1 {
        b.groups_per_device(2)
            .stream_priority(0, -5)
            .stream_handoff(false)
    } else {
        b
    };
    Ok(b.build()?)
}

/// Factors the matrix on `pool` once untimed, then `runs` times timed (reloaded between
/// runs); returns the times and, when traced, the last run's Chrome trace.
fn factor(
    pool: &GpuPool,
    host: &Arc<Vec<f64>>,
    n: usize,
    tile: usize,
    runs: usize,
    critical_high: bool,
) -> Res<(Vec<f64>, serde_json::Value)> {
    let dev = pool.devices()[0].clone();
    let groups = dev.groups();
    let (panel, update) = (groups[0], *groups.get(1).unwrap_or(&groups[0]));
    let h = host.clone();
    let a0 = Arc::new(pool.call(&dev, move |ctx| Ok(ctx.upload(&h)?))?);
    let a0c = a0.clone();
    let a = Arc::new(pool.call(&dev, move |ctx| {
        let mut a = ctx.alloc::<f64>(n * n)?;
        ctx.copy_device(&a0c, &mut a)?;
        Ok(a)
    })?);
    let info = Arc::new(pool.call(&dev, move |ctx| {
        Ok(ctx.alloc_zeros::<i32>(n.div_ceil(tile))?)
    })?);
    let plan = CholeskyPlan {
        panel,
        update,
        critical_high,
        ..CholeskyPlan::new(n, tile, panel)
    };
    let chol = plan.build("cholesky", &a, &info)?;
    let reload = || -> Res<()> {
        let (a0c, ac) = (a0.clone(), a.clone());
        pool.call(&dev, move |ctx| {
            // SAFETY: both hold n² doubles of this device; no factorization is running.
            unsafe { TileBlas::new(ctx)?.copy(&Vector::all(&a0c), &Vector::all(&ac))? };
            Ok(())
        })?;
        Ok(())
    };
    pool.submit(&chol.graph)?.wait()?;
    let mut ms = Vec::new();
    for _ in 0..runs {
        reload()?;
        drop(pool.take_trace());
        let t = Instant::now();
        pool.submit(&chol.graph)?.wait()?;
        ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let trace = boundpool::observe::chrome_trace(&pool.take_trace(), |_, _| {});
    Ok((ms, trace))
}

fn cholesky(a: &Args) -> Res<()> {
    for &n in &a.n {
        let host = Arc::new(spd_matrix(n));
        let card = {
            let pool = chol_pool(1, true)?;
            let card = pool.devices()[0].info().name.clone();
            // Every node normal: the one worker's one stream (a high node would go to its
            // high-priority stream, beside the other).
            let (ms, trace) = factor(&pool, &host, n, a.tile, 1, false)?;
            println!("N = {n}, one worker: {:.1} ms", ms[0]);
            write(&a.out.join(format!("chol_{n}_1w.json")), &trace)?;
            card
        };
        {
            let pool = chol_pool(8, false)?;
            let (ms, _) = factor(&pool, &host, n, a.tile, a.runs, true)?;
            println!("N = {n}, 8 workers: {ms:.1?} ms");
            write(
                &a.out.join(format!("chol_{n}.json")),
                &json!({"n": n, "tile": a.tile, "workers": 8, "ms": ms, "card": card}),
            )?;
        }
        let pool = chol_pool(8, true)?;
        let (ms, trace) = factor(&pool, &host, n, a.tile, 1, true)?;
        println!("N = {n}, 8 workers traced: {:.1} ms", ms[0]);
        write(&a.out.join(format!("chol_{n}_8w.json")), &trace)?;
    }
    Ok(())
}

const SHAPE: Shape = Shape {
    batch: 8,
    dim: 1024,
};

fn serve(a: &Args) -> Res<()> {
    let pool = GpuPoolBuilder::new()
        .name("serve")
        .devices(Devices::List(vec![0]))
        .workers_per_device(8)
        .wait_spin(Duration::from_micros(200))
        .idle_spin(Duration::from_micros(200))
        .trace(true)
        .build()?;
    let dev = pool.device(0).expect("device 0").clone();
    let host = Weights::<bf16>::new(SHAPE, 1);
    let w = model::upload_weights(&pool, &dev, &host).map_err(|e| e.to_string())?;
    let most = a.clients.iter().copied().max().unwrap_or(1);
    let m = ServedModel::new(
        &dev,
        SHAPE,
        w,
        ServeOptions {
            instances: most,
            priority: Priority::Normal,
            gemm: GemmPath::Lt,
            copies_in_graph: true,
            zero_copy: true,
            host_on_device: true,
        },
    )?;
    let inputs: Vec<Arc<Vec<bf16>>> = (0..8).map(|k| Arc::new(host.request(k))).collect();
    let want: Vec<Vec<bf16>> = inputs.iter().map(|x| host.reference(x)).collect();
    for &c in &a.clients {
        let stop = AtomicBool::new(false);
        let start = Barrier::new(c + 1);
        let (lat, think, secs) = std::thread::scope(|s| -> Res<(Vec<f64>, Vec<f64>, f64)> {
            let hs: Vec<_> = (0..c)
                .map(|k| {
                    let (stop, start, m, inputs, want, pool) =
                        (&stop, &start, &m, &inputs, &want, &pool);
                    s.spawn(move || -> Result<(Vec<f64>, Vec<f64>), String> {
                        for r in 0..20 {
                            m.serve(pool, inputs[(k + r) % 8].clone(), false)
                                .map_err(|e| e.to_string())?;
                        }
                        start.wait();
                        let (mut lat, mut think) = (Vec::new(), Vec::new());
                        let mut back: Option<Instant> = None;
                        let mut r = 0;
                        while !stop.load(Ordering::Relaxed) {
                            let i = (k * 7 + r) % 8;
                            let t = Instant::now();
                            if let Some(b) = back {
                                think.push((t - b).as_secs_f64() * 1e6);
                            }
                            let y = m
                                .serve(pool, inputs[i].clone(), false)
                                .map_err(|e| e.to_string())?;
                            let done = Instant::now();
                            lat.push((done - t).as_secs_f64() * 1e6);
                            check(&y, &want[i])?;
                            back = Some(done);
                            r += 1;
                        }
                        Ok((lat, think))
                    })
                })
                .collect();
            start.wait();
            drop(pool.take_trace());
            let t0 = Instant::now();
            std::thread::sleep(Duration::from_secs_f64(a.seconds));
            stop.store(true, Ordering::Relaxed);
            let (mut lat, mut think) = (Vec::new(), Vec::new());
            for h in hs {
                let (l, t) = h.join().map_err(|_| "a client panicked")??;
                lat.extend(l);
                think.extend(t);
            }
            Ok((lat, think, t0.elapsed().as_secs_f64()))
        })?;
        let trace = boundpool::observe::chrome_trace(&pool.take_trace(), |_, _| {});
        write(&a.out.join(format!("serve_{c}.json")), &trace)?;
        let v = json!({"clients": c, "requests": lat.len(), "seconds": secs,
            "rps": lat.len() as f64 / secs, "p50_us": median(lat.clone()),
            "think_us": median(think), "card": dev.info().name});
        println!("{v}");
        write(&a.out.join(format!("serve_{c}_measured.json")), &v)?;
    }
    Ok(())
}

fn main() {
    let a: Args = boundpool_bench::flags::parse();
    if let Some(why) = gpu_unavailable_reason() {
        eprintln!("SKIPPED sim_record: no GPU: {why}");
        if std::env::var("BOUNDPOOL_REQUIRE_GPU").is_ok_and(|v| v == "1") {
            std::process::exit(1);
        }
        return;
    }
    if let Err(e) = std::fs::create_dir_all(&a.out) {
        eprintln!("sim_record: cannot make {}: {e}", a.out.display());
        std::process::exit(1);
    }
    let r = match a.what.as_str() {
        "cholesky" => cholesky(&a),
        "serve" => serve(&a),
        w => Err(format!("`{w}` is neither cholesky nor serve").into()),
    };
    if let Err(e) = r {
        eprintln!("sim_record: {e}");
        std::process::exit(1);
    }
}
