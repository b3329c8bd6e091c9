//! Tiled Cholesky (f64) on boundpool against one cuSOLVER `potrf` call, in the same process.
//!
//! For each N and tile size: boundpool's tiled DAG on a pool of W workers (panel group with a
//! high stream priority, update group, event edges), the same DAG on W workers in one group
//! with the default stream hand-off (for comparison), the same DAG on a one-worker pool, and
//! one `cusolverDnDpotrf` call on the whole matrix (a node of the first pool). GFLOP/s count
//! N³/3 per factorization; the time is from submit to the graph's end (which includes the one
//! read-back of the POTRF infos). The matrix is reloaded from a device copy before every run
//! (not timed), and every configuration's last result is spot-checked on the device.
//!
//! `--partition-sms S1,S2,..` (issue "SM partitions") adds, after each N's rows, a sweep of SM
//! partitions: for each S, a pool whose panel group is an SM partition of S SMs
//! (`SmPartition::new("panel", S)`, W/2 workers, stream priority -5, as the first DAG column's
//! panel group) and whose update group is the rest (`SmPartition::rest("updates")`, W - W/2
//! workers), runs the same DAGs (same N, tiles, plan flags and runs, the same spot check) and
//! prints a row per S and tile beside the first DAG column, with both ratios to the cuSOLVER
//! call of the rows above. Each S a multiple of 8 (the Hopper step); a bare `--partition-sms`
//! sweeps 16,32,48,64,96. A size the device or driver cannot give (green contexts need a CUDA
//! 12.5 driver) prints a `skipped` row and the sweep goes on. Without the flag the output is
//! the same as before it existed.
//!
//! `cargo bench -p boundpool-bench --bench cholesky [-- --n 4096,8192 --tiles 512,1024 --runs 3 --workers 8 --merge --partition-sms 16,32,48,64,96]`
//! (`--merge`: every DAG with `CholeskyPlan::merge_columns`, one TRSM and one GEMM per column;
//! `--no-critical`: the critical path's nodes at normal priority (`CholeskyPlan::critical_high`);
//! `--probe`: GEMM, TRSM, TRMM and SYRK calls of the tile shapes, each alone on the GPU).
//! Without a GPU it says why and exits.

use std::sync::Arc;
use std::time::Instant;

use boundpool_bench::cholesky::{
    potrf, potrf_info_error, spd_matrix, spot_check_on_device, CholeskyPlan, Diag, Mat, Side,
    TileBlas, Trans, Uplo, Vector,
};
use boundpool_gpu::{
    DeviceBuffer, Devices, GpuDevice, GpuErrorKind, GpuGraph, GpuGraphBuilder, GpuGraphExt,
    GpuPool, GpuPoolBuilder, ShutdownMode, SmPartition,
};
use boundpool_workloads::median;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn arg_str(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
}

fn list(name: &str, default: &[usize]) -> Vec<usize> {
    arg_str(name)
        .map(|s| s.split(',').filter_map(|x| x.trim().parse().ok()).collect())
        .unwrap_or_else(|| default.to_vec())
}

/// The SMs of the panel's partition that a bare `--partition-sms` sweeps: from a partition
/// about the critical path's size (16 of 132 SMs) to one near the panel group's share of the
/// flops with few tiles (the panel group does about 26% of them with 16 tiles a side, 47% with
/// 8, 77% with 4).
const DEFAULT_PARTITION_SMS: [u32; 5] = [16, 32, 48, 64, 96];

/// `--partition-sms`: `None` without the flag, else the sizes listed after it (the default
/// sweep when no list follows it), each a positive multiple of 8.
fn partition_sms() -> Res<Option<Vec<u32>>> {
    let args: Vec<String> = std::env::args().collect();
    let Some(i) = args.iter().position(|a| a == "--partition-sms") else {
        return Ok(None);
    };
    let sms = match args.get(i + 1).filter(|v| !v.starts_with("--")) {
        None => DEFAULT_PARTITION_SMS.to_vec(),
        Some(v) => v
            .split(',')
            .map(|x| {
                x.trim()
                    .parse::<u32>()
                    .map_err(|_| format!("--partition-sms {v}: {x:?} is not a number of SMs"))
            })
            .collect::<Result<Vec<u32>, String>>()?,
    };
    if let Some(bad) = sms.iter().find(|&&s| s == 0 || s % 8 != 0) {
        return Err(format!("--partition-sms: {bad} SMs is not a positive multiple of 8").into());
    }
    Ok(Some(sms))
}

/// A pool of `workers` workers on device 0 whose panel group is an SM partition of `sms` SMs
/// (`workers / 2` workers, stream priority -5) and whose update group is the rest of the SMs
/// (the other workers): the first DAG column's pool with the two groups on disjoint SMs.
fn partitioned_pool(sms: u32, workers: usize) -> boundpool_gpu::GpuResult<GpuPool> {
    GpuPoolBuilder::new()
        .devices(Devices::List(vec![0]))
        .sm_partitions(vec![
            SmPartition::new("panel", sms).workers(workers / 2),
            SmPartition::rest("updates").workers(workers - workers / 2),
        ])
        .stream_priority(0, -5)
        .stream_handoff(false)
        .blas(true)
        .solver(true)
        .build()
}

/// A pool, its device, and the matrix (original and work copy) on it.
struct Setup {
    pool: GpuPool,
    dev: GpuDevice,
    a: Arc<DeviceBuffer<f64>>,
    reload: GpuGraph,
}

impl Setup {
    fn new(pool: GpuPool, host: &Arc<Vec<f64>>, n: usize) -> Res<Self> {
        let dev = pool.devices()[0].clone();
        let h = host.clone();
        let a0 = Arc::new(pool.call(&dev, move |ctx| Ok(ctx.upload(&h)?))?);
        let a = Arc::new(pool.call(&dev, move |ctx| Ok(ctx.alloc::<f64>(n * n)?))?);
        let mut g = GpuGraphBuilder::new("reload");
        let (src, dst) = (a0.clone(), a.clone());
        g.gpu_node(&dev, "reload", move |ctx| {
            // SAFETY: both hold n² doubles of this device (the views check it); no factorization
            // runs meanwhile (`time` waits for each graph before the next reload).
            unsafe { TileBlas::new(ctx)?.copy(&Vector::all(&src), &Vector::all(&dst))? };
            Ok(())
        });
        let reload = g.build()?;
        Ok(Self {
            pool,
            dev,
            a,
            reload,
        })
    }

    /// Median seconds of `runs` runs of `graph`, each after a reload.
    fn time(&self, graph: &GpuGraph, runs: usize) -> Res<f64> {
        let mut v = Vec::new();
        for _ in 0..runs {
            self.pool.submit(&self.reload)?.wait()?;
            let t = Instant::now();
            self.pool.submit(graph)?.wait()?;
            v.push(t.elapsed().as_secs_f64());
        }
        Ok(median(v))
    }

    fn check(&self, n: usize, what: &str) -> Res<()> {
        let worst = spot_check_on_device(&self.pool, &self.dev, &self.a, n, 32)?;
        if worst.is_nan() || worst > 1e-12 {
            return Err(format!("{what}: spot check {worst:e} above 1e-12").into());
        }
        Ok(())
    }
}

fn cusolver_graph(s: &Setup, n: usize) -> Res<GpuGraph> {
    let mut g = GpuGraphBuilder::new("cusolver potrf");
    let a = s.a.clone();
    let info = Arc::new(s.pool.call(&s.dev, |ctx| Ok(ctx.alloc_zeros::<i32>(1)?))?);
    g.gpu_node(&s.dev, "potrf", move |ctx| {
        // SAFETY: `a` holds n² doubles and `info` one i32 (the views check it), both alive in
        // this closure and used by no other node meanwhile.
        unsafe {
            potrf(
                ctx,
                Uplo::Lower,
                &Mat::square(&a, n)?,
                &info.as_cuda_slice().slice(0..1),
            )?
        };
        let v = ctx.download(&info)?;
        if v[0] != 0 {
            return Err(Box::new(potrf_info_error("potrf", v[0])));
        }
        Ok(())
    });
    Ok(g.build()?)
}

/// `--probe`: each kind of tile operation alone on the whole GPU, for tile sizes `tiles` in a
/// matrix of order `n` (the merged shapes: `m = n - b` rows below a diagonal tile), median
/// of 5 calls each after one warm-up: what each library call reaches without contention.
fn probe(n: usize, tiles: &[usize]) -> Res<()> {
    let pool = GpuPoolBuilder::new()
        .devices(Devices::List(vec![0]))
        .workers_per_device(1)
        .blas(true)
        .solver(true)
        .build()?;
    let dev = pool.devices()[0].clone();
    let host = Arc::new(spd_matrix(n));
    let h = host.clone();
    let a = Arc::new(pool.call(&dev, move |ctx| Ok(ctx.upload(&h)?))?);
    let bmax = tiles.iter().copied().max().unwrap_or(1);
    let w = Arc::new(pool.call(&dev, move |ctx| Ok(ctx.alloc_zeros::<f64>(n * bmax)?))?);
    println!("probe: N = {n}, each call alone, median of 5, GFLOP/s");
    println!(
        "{:>5} {:>6} | {:>9} {:>9} {:>9} {:>9}",
        "tile", "m", "gemm", "trsm", "trmm", "syrk"
    );
    for &b in tiles {
        let m = n - b;
        // Seconds per call: 5 calls in one node.
        let time = |op: u8| -> Res<f64> {
            let mut v = Vec::new();
            for i in 0..4 {
                let (a, w) = (a.clone(), w.clone());
                let t = Instant::now();
                pool.call(&dev, move |ctx| {
                    let blas = TileBlas::new(ctx)?;
                    let (a, w) = (a.as_cuda_slice(), w.as_cuda_slice());
                    // The diagonal block at the top left of `a`, the rows below it, and the
                    // `m`×`b` (or `b`×`b`) block at the start of `w` (leading dimension its rows).
                    let diag = Mat::new(a, 0, b, b, n)?;
                    let below = Mat::new(a, b, m, b, n)?;
                    let wm = Mat::new(w, 0, m, b, m)?;
                    let wb = Mat::new(w, 0, b, b, b)?;
                    for _ in 0..5 {
                        // SAFETY: every view lies inside `a` (n² doubles) or `w` (n·bmax
                        // doubles), both alive in this closure; only `w` is written, by this
                        // node alone.
                        unsafe {
                            match op {
                                0 => {
                                    blas.gemm(Trans::No, Trans::T, -1.0, &below, &diag, 1.0, &wm)?
                                }
                                1 => blas.trsm(
                                    Side::Right,
                                    Uplo::Lower,
                                    Trans::T,
                                    Diag::NonUnit,
                                    1.0,
                                    &diag,
                                    &wm,
                                )?,
                                2 => blas.trmm(
                                    Side::Right,
                                    Uplo::Lower,
                                    Trans::T,
                                    Diag::NonUnit,
                                    1.0,
                                    &diag,
                                    &wm,
                                    &wm,
                                )?,
                                _ => blas.syrk(Uplo::Lower, Trans::No, -1.0, &diag, 1.0, &wb)?,
                            }
                        }
                    }
                    Ok(())
                })?;
                if i > 0 {
                    v.push(t.elapsed().as_secs_f64() / 5.0);
                }
            }
            Ok(median(v))
        };
        let (mf, bf) = (m as f64, b as f64);
        let g = |secs: f64, flops: f64| flops / secs / 1e9;
        println!(
            "{:>5} {:>6} | {:>9.0} {:>9.0} {:>9.0} {:>9.0}",
            b,
            m,
            g(time(0)?, 2.0 * mf * bf * bf),
            g(time(1)?, mf * bf * bf),
            g(time(2)?, mf * bf * bf),
            g(time(3)?, bf * bf * bf),
        );
    }
    pool.shutdown(ShutdownMode::Finish);
    Ok(())
}

fn main() -> Res<()> {
    // Checked first, so that a bad list is found without a GPU too.
    let sweep = partition_sms()?.unwrap_or_default();
    if let Some(why) = boundpool_gpu::gpu_unavailable_reason() {
        println!("cholesky bench skipped: no GPU: {why}");
        return Ok(());
    }
    if std::env::args().any(|a| a == "--probe") {
        let n = list("--n", &[16384])[0];
        return probe(n, &list("--tiles", &[1024, 2048, 4096]));
    }
    let ns = list("--n", &[4096, 8192, 16384, 32768]);
    let tiles = list("--tiles", &[512, 1024, 2048]);
    let runs = list("--runs", &[3]).first().copied().unwrap_or(3).max(1);
    let workers = list("--workers", &[8]).first().copied().unwrap_or(8).max(2);
    let merge_columns = std::env::args().any(|a| a == "--merge");
    let critical_high = !std::env::args().any(|a| a == "--no-critical");
    let name = boundpool_gpu::device_info(0)
        .map(|d| d.name)
        .unwrap_or_default();
    println!(
        "tiled Cholesky f64 on {name}: medians of {runs} runs; DAG on {workers} workers \
         ({} panel at stream priority -5, {} updates, event edges){}",
        workers / 2,
        workers - workers / 2,
        if merge_columns {
            "; one TRSM and one GEMM per column (--merge)"
        } else {
            ""
        },
    );
    println!(
        "critical path (POTRF, the next two TRSMs, the next column's first updates) at {} priority",
        if critical_high {
            "high"
        } else {
            "normal (--no-critical)"
        }
    );
    if !sweep.is_empty() {
        let list: Vec<String> = sweep.iter().map(u32::to_string).collect();
        println!(
            "SM partition sweep (--partition-sms {}): after each N, the same DAGs with the panel \
             group on a partition of S SMs ({} workers, stream priority -5) and the updates on \
             the rest ({} workers)",
            list.join(","),
            workers / 2,
            workers - workers / 2,
        );
    }
    println!(
        "{:>6} {:>5} {:>7} | {:>10} {:>10} {:>10} {:>10} | {:>8} {:>8}",
        "N", "tile", "nodes", "DAG", "DAG 1grp", "1 worker", "cuSOLVER", "DAG/cuS", "DAG/1w"
    );
    for &n in &ns {
        let host = Arc::new(spd_matrix(n));
        let multi = Setup::new(
            GpuPoolBuilder::new()
                .devices(Devices::List(vec![0]))
                .workers_per_device(workers)
                .groups_per_device(2)
                .stream_priority(0, -5)
                .stream_handoff(false)
                .blas(true)
                .solver(true)
                .build()?,
            &host,
            n,
        )?;
        let flat = Setup::new(
            GpuPoolBuilder::new()
                .devices(Devices::List(vec![0]))
                .workers_per_device(workers)
                .blas(true)
                .solver(true)
                .build()?,
            &host,
            n,
        )?;
        let one = Setup::new(
            GpuPoolBuilder::new()
                .devices(Devices::List(vec![0]))
                .workers_per_device(1)
                .blas(true)
                .solver(true)
                .build()?,
            &host,
            n,
        )?;
        // Kept for the sweep's pools, made after these go.
        let host = if sweep.is_empty() {
            drop(host);
            None
        } else {
            Some(host)
        };
        let flops = (n as f64).powi(3) / 3.0;
        let cus = cusolver_graph(&multi, n)?;
        let t_cus = multi.time(&cus, runs)?;
        multi.check(n, "cuSOLVER")?;
        // The first DAG column's GFLOP/s of each tile, for the sweep's rows.
        let mut dag_rates: Vec<(usize, f64)> = Vec::new();
        for &b in &tiles {
            if b >= n {
                continue;
            }
            let mut rates = Vec::new();
            let mut nodes = 0;
            for s in [&multi, &flat, &one] {
                let g = s.dev.groups();
                let plan = CholeskyPlan {
                    n,
                    tile: b,
                    panel: g[0],
                    update: *g.last().unwrap(),
                    merge_columns,
                    critical_high,
                    critical_only_panel: false,
                };
                let info = Arc::new(s.pool.call(&s.dev, move |ctx| {
                    Ok(ctx.alloc_zeros::<i32>(n.div_ceil(b))?)
                })?);
                let chol = plan.build("cholesky", &s.a, &info)?;
                nodes = chol.graph.len();
                let t = s.time(&chol.graph, runs)?;
                s.check(n, &format!("DAG N={n} tile={b}"))?;
                rates.push(flops / t / 1e9);
            }
            let cus_rate = flops / t_cus / 1e9;
            dag_rates.push((b, rates[0]));
            println!(
                "{n:>6} {b:>5} {nodes:>7} | {:>10.0} {:>10.0} {:>10.0} {:>10.0} | {:>7.2}x {:>7.2}x",
                rates[0],
                rates[1],
                rates[2],
                cus_rate,
                rates[0] / cus_rate,
                rates[0] / rates[2]
            );
        }
        // The pools (and their buffers) go before the next N's allocations.
        drop((multi, flat, one));
        if let Some(host) = host {
            let cus_rate = flops / t_cus / 1e9;
            let opts = SweepOptions {
                workers,
                runs,
                merge_columns,
                critical_high,
            };
            partition_sweep(n, &host, &sweep, &dag_rates, cus_rate, &opts)?;
        }
    }
    println!("(GFLOP/s; DAG/cuS and DAG/1w are ratios of the first DAG column)");
    if !sweep.is_empty() {
        println!(
            "(partition rows: SMs = the panel's partition + the updates' as the driver gave them, \
             `c`: only the critical path on the panel's partition; DAG and cuSOLVER from the rows \
             above; part/DAG = DAG part / DAG)"
        );
    }
    Ok(())
}

/// What the sweep's DAGs share with the rows above them.
struct SweepOptions {
    workers: usize,
    runs: usize,
    merge_columns: bool,
    critical_high: bool,
}

/// `--partition-sms`: for each size in `sweep`, a [`partitioned_pool`] (one at a time, so
/// that no more than one extra copy of the matrix is on the device), the DAG of each tile of
/// `dag_rates` (the first DAG column's GFLOP/s at that tile) timed and checked as above, a row
/// each beside that column and the cuSOLVER call's `cus_rate`.
fn partition_sweep(
    n: usize,
    host: &Arc<Vec<f64>>,
    sweep: &[u32],
    dag_rates: &[(usize, f64)],
    cus_rate: f64,
    o: &SweepOptions,
) -> Res<()> {
    println!(
        "{:>6} {:>5} {:>8} | {:>10} {:>10} {:>10} | {:>8} {:>8} {:>8}",
        "N", "tile", "SMs", "DAG part", "DAG", "cuSOLVER", "part/cuS", "DAG/cuS", "part/DAG"
    );
    let flops = (n as f64).powi(3) / 3.0;
    for &sms in sweep {
        let pool = match partitioned_pool(sms, o.workers) {
            Ok(p) => p,
            Err(e) if e.kind() == GpuErrorKind::Partition => {
                println!("{n:>6} {:>5} {sms:>7} | skipped: {e}", "-");
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        let s = Setup::new(pool, host, n)?;
        let (panel, update) = match (s.dev.partition("panel"), s.dev.partition("updates")) {
            (Some(p), Some(u)) => (p.clone(), u.clone()),
            _ => return Err("the partitioned pool has no 'panel' or 'updates' partition".into()),
        };
        for (&(b, dag), critical_only) in dag_rates.iter().flat_map(|r| [(r, false), (r, true)]) {
            // `c`: only the critical path on the partition, the rest of the panel work with
            // the updates.
            let split = format!(
                "{}+{}{}",
                panel.sms,
                update.sms,
                if critical_only { "c" } else { "" }
            );
            let plan = CholeskyPlan {
                n,
                tile: b,
                panel: panel.group,
                update: update.group,
                merge_columns: o.merge_columns,
                critical_high: o.critical_high,
                critical_only_panel: critical_only,
            };
            let info = Arc::new(s.pool.call(&s.dev, move |ctx| {
                Ok(ctx.alloc_zeros::<i32>(n.div_ceil(b))?)
            })?);
            let chol = plan.build("cholesky", &s.a, &info)?;
            let t = s.time(&chol.graph, o.runs)?;
            s.check(n, &format!("DAG N={n} tile={b} panel on {sms} SMs"))?;
            let rate = flops / t / 1e9;
            println!(
                "{n:>6} {b:>5} {split:>8} | {rate:>10.0} {dag:>10.0} {cus_rate:>10.0} | {:>7.2}x {:>7.2}x {:>7.2}x",
                rate / cus_rate,
                dag / cus_rate,
                rate / dag
            );
        }
        // Its buffers go before the next size's pool.
        drop(s);
    }
    Ok(())
}
