//! Tiled right-looking Cholesky factorization (f64, lower, column-major) as a task graph:
//! POTRF on diagonal tiles (cuSOLVER), TRSM, SYRK and GEMM (cuBLAS), one node per tile
//! operation, edges from tile dependencies, GPU-side edges only (no host synchronise inside the
//! factorization). Each bound worker uses its own library handles, set to its node's stream.
//!
//! `cargo run --release --example cholesky [-- --n N --tile B --workers W --merge --no-critical --warm --trace FILE.json]`
//! (`--warm`: factor once first, untimed and untraced, then time and trace a second run)
//! (`--merge`: one TRSM and one GEMM per column instead of one per tile, `CholeskyPlan::merge_columns`;
//! `--no-critical`: the critical path's nodes at normal priority, `CholeskyPlan::critical_high`)
//!
//! The panel work (POTRF, TRSM and the look-ahead updates of the next tile column) runs on
//! half of the device's workers, whose streams have a high priority, the bulk updates on the
//! other half. Verified: `‖A − L Lᵀ‖_F / ‖A‖_F ≤ 1e-12` computed on the GPU for `N ≤ 16384`;
//! above, spot checks of entries of `L Lᵀ`. Without a GPU it runs the same graph of host
//! nodes on a host pool at a small `N` and checks the same residual on the host (and says so).

use std::sync::{Arc, RwLock};
use std::time::Instant;

use boundpool::backend::FromIndex;
use boundpool::gpu::{Devices, GpuPoolBuilder};
use boundpool::{GraphBuilder, PoolBuilder};
use boundpool_bench::cholesky::{
    residual_on_device, spd_entry, spd_matrix, spot_check_on_device, CholeskyPlan, TileBlas,
    TileOp, Vector,
};

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let num = |name: &str| -> Result<Option<usize>, Box<dyn std::error::Error>> {
        match arg(&args, name) {
            Some(v) => Ok(Some(
                v.parse()
                    .map_err(|_| format!("{name}: not a number: {v}"))?,
            )),
            None => Ok(None),
        }
    };
    let trace = arg(&args, "--trace");
    if let Some(why) = boundpool::gpu::gpu_unavailable_reason() {
        let n = num("--n")?.unwrap_or(384);
        let tile = num("--tile")?.unwrap_or(64);
        println!("no GPU ({why}): running the host version at N = {n}, tile {tile}");
        return host_version(n, tile);
    }
    let n = num("--n")?.unwrap_or(8192);
    let tile = num("--tile")?.unwrap_or(1024);
    let workers = num("--workers")?.unwrap_or(8).max(2);
    let pool = GpuPoolBuilder::new()
        .devices(Devices::List(vec![0]))
        .workers_per_device(workers)
        .groups_per_device(2)
        .stream_priority(0, -5)
        .stream_handoff(false)
        .blas(true)
        .solver(true)
        .trace(trace.is_some())
        .build()?;
    let dev = pool.devices()[0].clone();
    let (panel, update) = (dev.groups()[0], dev.groups()[1]);
    println!(
        "device 0: {}; N = {n}, tile {tile}, {workers} workers (panel {}, updates {})",
        dev.info().name,
        workers / 2,
        workers - workers / 2
    );

    let t0 = Instant::now();
    let host = Arc::new(spd_matrix(n));
    let h = host.clone();
    let a0 = Arc::new(pool.call(&dev, move |ctx| Ok(ctx.upload(&h)?))?);
    drop(host);
    let a0c = a0.clone();
    let a = Arc::new(pool.call(&dev, move |ctx| {
        let mut a = ctx.alloc::<f64>(n * n)?;
        ctx.copy_device(&a0c, &mut a)?;
        Ok(a)
    })?);
    let info = Arc::new(pool.call(&dev, move |ctx| {
        Ok(ctx.alloc_zeros::<i32>(n.div_ceil(tile))?)
    })?);
    println!("matrix made and uploaded in {:.2?}", t0.elapsed());

    let plan = CholeskyPlan {
        n,
        tile,
        panel,
        update,
        merge_columns: args.iter().any(|a| a == "--merge"),
        critical_high: !args.iter().any(|a| a == "--no-critical"),
        critical_only_panel: false,
    };
    let chol = plan.build("cholesky", &a, &info)?;
    let [p, t, s, g] = chol.counts;
    println!("graph: {p} POTRF, {t} TRSM, {s} SYRK, {g} GEMM nodes");
    if args.iter().any(|a| a == "--warm") {
        // One factorization first (library handles, workspaces and kernels loaded), then the
        // matrix reloaded and the trace so far dropped: what follows is a warm run.
        pool.submit(&chol.graph)?.wait()?;
        let (a0c, ac) = (a0.clone(), a.clone());
        pool.call(&dev, move |ctx| {
            // SAFETY: both hold n² doubles of this device (the views check it); the
            // factorization that wrote `a` has completed.
            unsafe { TileBlas::new(ctx)?.copy(&Vector::all(&a0c), &Vector::all(&ac))? };
            Ok(())
        })?;
        if trace.is_some() {
            drop(pool.take_trace());
        }
        println!("warm-up factorization done; timing the second");
    }
    let t1 = Instant::now();
    pool.submit(&chol.graph)?.wait()?;
    let secs = t1.elapsed().as_secs_f64();
    println!(
        "factored in {:.2} ms: {:.1} GFLOP/s (N³/3)",
        secs * 1e3,
        plan.flops() / secs / 1e9
    );

    if n <= 16384 {
        let r = residual_on_device(&pool, &dev, &a0, &a, n)?;
        println!("residual ‖A − LLᵀ‖/‖A‖ = {r:.3e} (on the GPU; must be ≤ 1e-12)");
        if r.is_nan() || r > 1e-12 {
            return Err(format!("residual {r:e} above 1e-12").into());
        }
    } else {
        let worst = spot_check_on_device(&pool, &dev, &a, n, 256)?;
        println!(
            "spot checks: 257 entries of LLᵀ, worst |A_ij − (LLᵀ)_ij|/sqrt(A_ii A_jj) = {worst:.3e} (must be ≤ 1e-12)"
        );
        if worst.is_nan() || worst > 1e-12 {
            return Err(format!("spot check {worst:e} above 1e-12").into());
        }
    }
    if let Some(file) = trace {
        let t = pool.take_trace();
        let json = boundpool::observe::chrome_trace(&t, |_, _| {});
        std::fs::write(&file, serde_json::to_string(&json)?)?;
        println!(
            "trace: {} slices on {} tracks written to {file}",
            t.slices.len(),
            t.tracks.len()
        );
    }
    Ok(())
}

/// The same tile operations and edges ([`CholeskyPlan::tasks`]) as host nodes on a host pool
/// of two workers, each tile in its own column-major buffer, then the residual on the host.
fn host_version(n: usize, b: usize) -> Result<(), Box<dyn std::error::Error>> {
    let plan = CholeskyPlan::new(n, b, boundpool::GroupId::from_index(0));
    let t = plan.tiles();
    let size = move |i: usize| b.min(n - i * b);
    let at = move |i: usize, j: usize| i * t + j;
    // Tile (i, j), i >= j, column-major with leading dimension size(i); unused above.
    let tiles: Arc<Vec<RwLock<Vec<f64>>>> = Arc::new(
        (0..t * t)
            .map(|ij| {
                let (i, j) = (ij / t, ij % t);
                let mut v = Vec::new();
                if j <= i {
                    v = vec![0.0; size(i) * size(j)];
                    for jj in 0..size(j) {
                        for ii in 0..size(i) {
                            v[jj * size(i) + ii] = spd_entry(n, i * b + ii, j * b + jj);
                        }
                    }
                }
                RwLock::new(v)
            })
            .collect(),
    );
    let mut g: GraphBuilder<()> = GraphBuilder::new("host cholesky");
    let mut ids = Vec::new();
    for task in plan.tasks() {
        let tl = tiles.clone();
        let op = task.op;
        let node = g.node(op.name(), move |_| -> Result<(), boundpool::BoxError> {
            match op {
                TileOp::Potrf { k } => {
                    let mut a = tl[at(k, k)].write().unwrap();
                    let m = size(k);
                    for j in 0..m {
                        let mut d = a[j * m + j];
                        for q in 0..j {
                            d -= a[q * m + j] * a[q * m + j];
                        }
                        if d <= 0.0 {
                            return Err(format!("potrf({k}): info = {}", j + 1).into());
                        }
                        let d = d.sqrt();
                        a[j * m + j] = d;
                        for i in j + 1..m {
                            let mut s = a[j * m + i];
                            for q in 0..j {
                                s -= a[q * m + i] * a[q * m + j];
                            }
                            a[j * m + i] = s / d;
                        }
                    }
                }
                TileOp::Trsm { i, k } => {
                    // A_ik := A_ik L_kk^-T
                    let l = tl[at(k, k)].read().unwrap();
                    let mut x = tl[at(i, k)].write().unwrap();
                    let (m, nk) = (size(i), size(k));
                    for row in 0..m {
                        for j in 0..nk {
                            let mut s = x[j * m + row];
                            for q in 0..j {
                                s -= x[q * m + row] * l[q * nk + j];
                            }
                            x[j * m + row] = s / l[j * nk + j];
                        }
                    }
                }
                TileOp::TrsmBelow { .. } | TileOp::GemmBelow { .. } => {
                    unreachable!("the host version's plan keeps one operation per tile")
                }
                TileOp::Syrk { j: i, k } | TileOp::Gemm { i, k, .. } => {
                    // A_ij -= A_ik A_jk^T (the host SYRK updates the whole diagonal tile)
                    let j = match op {
                        TileOp::Gemm { j, .. } => j,
                        _ => i,
                    };
                    let (m, nn, kk) = (size(i), size(j), size(k));
                    let aik = tl[at(i, k)].read().unwrap().clone();
                    let ajk = tl[at(j, k)].read().unwrap().clone();
                    let mut c = tl[at(i, j)].write().unwrap();
                    for col in 0..nn {
                        for q in 0..kk {
                            let bjq = ajk[q * nn + col];
                            for row in 0..m {
                                c[col * m + row] -= aik[q * m + row] * bjq;
                            }
                        }
                    }
                }
            }
            Ok(())
        });
        for &d in &task.deps {
            g.edge(ids[d], node);
        }
        ids.push(node.id());
    }
    let graph = g.build()?;
    let pool = PoolBuilder::new().workers(2).build()?;
    let t0 = Instant::now();
    pool.run(&graph)?;
    println!(
        "host: {} nodes factored in {:.2?} on 2 workers",
        graph.len(),
        t0.elapsed()
    );
    // Residual ‖A − L Lᵀ‖_F / ‖A‖_F over the whole (symmetric) matrix.
    let mut lm = vec![0.0; n * n];
    for j in 0..n {
        for i in j..n {
            let v = tiles[at(i / b, j / b)].read().unwrap();
            lm[j * n + i] = v[(j % b) * size(i / b) + i % b];
        }
    }
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for j in 0..n {
        for i in 0..n {
            let mut s = 0.0;
            for q in 0..=i.min(j) {
                s += lm[q * n + i] * lm[q * n + j];
            }
            let a = spd_entry(n, i, j);
            num += (a - s) * (a - s);
            den += a * a;
        }
    }
    let r = (num / den).sqrt();
    println!("residual ‖A − LLᵀ‖/‖A‖ = {r:.3e} (on the host; must be ≤ 1e-12)");
    if r.is_nan() || r > 1e-12 {
        return Err(format!("residual {r:e} above 1e-12").into());
    }
    Ok(())
}
