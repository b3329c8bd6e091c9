//! A distributed tiled Cholesky factorization (f64, lower) over ranks, under `mpirun`: the
//! tiles dealt 2D block-cyclically to a `p × q` grid of ranks (tile `(i, j)` owned by rank
//! `(i mod p) q + (j mod q)`), every tile operation of the bench crate's factorization
//! (`CholeskyPlan::tasks`: POTRF, TRSM, SYRK, GEMM, on the same `TileBlas` and `potrf`) a
//! device node that writes a new version of its tile on the tile's owner (owner computes),
//! tiles crossing ranks as device values: staged through page-locked host memory, or with
//! `--nccl` over NCCL. Rank 0 then gathers the factor and checks it against the one-rank
//! factor (the bench crate's graph on its own GPU, same tiles and routines) and its residual
//! `‖A − L Lᵀ‖_F / ‖A‖_F` on the host.
//!
//! `mpirun -np 2 target/release/examples/ranks_cholesky [--n N] [--tile B] [--runs R] [--nccl]`
//! (built with `cargo build --release -p boundpool-bench --features mpi --example
//! ranks_cholesky`; `--nccl` needs the `nccl` feature and, with two ranks on one GPU, a distinct
//! `NCCL_HOSTID` per rank). Without a GPU it says so and exits 0 (1 under
//! `BOUNDPOOL_REQUIRE_GPU=1`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use boundpool_bench::cholesky::{
    potrf, potrf_info_error, spd_entry, CholeskyError, CholeskyPlan, Diag, Mat, Side, TileBlas,
    TileOp, Trans, Uplo,
};
use boundpool_gpu::{BoxError, DeviceBuffer, Devices, GpuDevice, GpuPoolBuilder, GpuWorker};
use boundpool_ranks::{GpuRanks, GpuRanksBuilder, NodeRef, RankGraphBuilder, RanksBuilder};

#[derive(clap::Parser, Debug)]
struct Args {
    /// Order of the matrix.
    #[arg(long, default_value_t = 1536)]
    n: usize,
    /// Tile size (the last tile row and column may be smaller).
    #[arg(long, default_value_t = 256)]
    tile: usize,
    /// Timed runs after the first.
    #[arg(long, default_value_t = 2)]
    runs: usize,
    /// Tiles cross ranks over NCCL (needs the `nccl` feature).
    #[arg(long)]
    nccl: bool,
}

/// The grid of `size` ranks: `p × q`, `p ≤ q`, as square as it divides.
fn grid(size: usize) -> (usize, usize) {
    let p = (1..=size)
        .take_while(|p| p * p <= size)
        .filter(|p| size % p == 0)
        .last()
        .unwrap_or(1);
    (p, size / p)
}

/// Tiles an operation reads (besides the one it writes), and the one it writes.
fn touches(op: TileOp) -> (Vec<(usize, usize)>, (usize, usize)) {
    match op {
        TileOp::Potrf { k } => (vec![], (k, k)),
        TileOp::Trsm { i, k } => (vec![(k, k)], (i, k)),
        TileOp::Syrk { j, k } => (vec![(j, k)], (j, j)),
        TileOp::Gemm { i, j, k } => (vec![(i, k), (j, k)], (i, j)),
        TileOp::TrsmBelow { .. } | TileOp::GemmBelow { .. } => {
            unreachable!("one operation per tile: merge_columns is off")
        }
    }
}

fn main() {
    let a: Args = boundpool_bench::flags::parse();
    if let Some(why) = boundpool_gpu::gpu_unavailable_reason() {
        eprintln!("SKIPPED ranks_cholesky: no GPU: {why}");
        let required = std::env::var("BOUNDPOOL_REQUIRE_GPU").is_ok_and(|v| v == "1");
        std::process::exit(i32::from(required));
    }
    #[cfg(not(feature = "nccl"))]
    if a.nccl {
        eprintln!("--nccl needs the nccl feature");
        std::process::exit(1);
    }
    let builder = GpuRanksBuilder::new(
        RanksBuilder::new(),
        GpuPoolBuilder::new()
            .devices(Devices::All)
            .workers_per_device(4)
            .blas(true)
            .solver(true),
    )
    .device_by_local_rank(true);
    #[cfg(feature = "nccl")]
    let builder = builder.nccl(a.nccl);
    let ranks = builder.build_mpi().expect("the GPU ranks runtime starts");
    match factor(&ranks, &a) {
        Ok(line) => println!("rank {}/{}: {line}", ranks.rank(), ranks.size()),
        Err(e) => {
            eprintln!("rank {}/{}: FAILED: {e}", ranks.rank(), ranks.size());
            drop(ranks);
            std::process::exit(1);
        }
    }
}

/// A tile as a matrix (its own allocation, leading dimension its rows).
fn m(b: &DeviceBuffer<f64>, rows: usize, cols: usize) -> Result<Mat<'_>, CholeskyError> {
    Mat::new(b.as_cuda_slice(), 0, rows, cols, rows.max(1))
}

/// One tile operation writing `out` (a copy of the tile's last version) from the tiles it reads.
fn run_op(
    ctx: &boundpool_ranks::RankGpuCtx<'_, '_>,
    op: TileOp,
    reads: &[&DeviceBuffer<f64>],
    out: &DeviceBuffer<f64>,
    size: impl Fn(usize) -> usize,
) -> Result<(), BoxError> {
    let gpu = ctx.gpu();
    let (lower, t, right, non_unit) = (Uplo::Lower, Trans::T, Side::Right, Diag::NonUnit);
    // SAFETY: `out` is this node's own new buffer, written only here; the tiles read are this
    // node's inputs (the versions the graph's edges give it), which no node writes: every
    // operation writes a new version. All live until the node's GPU work is done (inputs and
    // output of the run).
    unsafe {
        match op {
            TileOp::Potrf { k } => {
                let info = gpu.alloc_zeros::<i32>(1)?;
                potrf(
                    gpu,
                    lower,
                    &m(out, size(k), size(k))?,
                    &info.as_cuda_slice().slice(0..1),
                )?;
                let v = gpu.download(&info)?;
                if v[0] != 0 {
                    return Err(Box::new(potrf_info_error(&op.name(), v[0])));
                }
            }
            TileOp::Trsm { i, k } => TileBlas::new(gpu)?.trsm(
                right,
                lower,
                t,
                non_unit,
                1.0,
                &m(reads[0], size(k), size(k))?,
                &m(out, size(i), size(k))?,
            )?,
            TileOp::Syrk { j, k } => TileBlas::new(gpu)?.syrk(
                lower,
                Trans::No,
                -1.0,
                &m(reads[0], size(j), size(k))?,
                1.0,
                &m(out, size(j), size(j))?,
            )?,
            TileOp::Gemm { i, j, k } => TileBlas::new(gpu)?.gemm(
                Trans::No,
                t,
                -1.0,
                &m(reads[0], size(i), size(k))?,
                &m(reads[1], size(j), size(k))?,
                1.0,
                &m(out, size(i), size(j))?,
            )?,
            TileOp::TrsmBelow { .. } | TileOp::GemmBelow { .. } => unreachable!(),
        }
    }
    Ok(())
}

/// A tile's node: a version of tile `(i, j)`.
type TileNode = ((usize, usize), NodeRef<DeviceBuffer<f64>>);

/// The distributed factorization's graph: tile loads, operations, and rank 0's gather of `L`
/// (column-major, `n × n`, zero above the diagonal); with its gather node and operation count.
struct Factorization {
    graph: RankGraphBuilder<GpuWorker>,
    gather: NodeRef<Vec<f64>>,
    ops: usize,
}

fn graph(ranks: &GpuRanks, d: &GpuDevice, n: usize, b: usize) -> Factorization {
    let t = n.div_ceil(b);
    let (p, q) = grid(ranks.size());
    let size = move |i: usize| b.min(n - i * b);
    let mut g = RankGraphBuilder::new(format!("cholesky {n}/{b} on {p}x{q}"));
    let mut latest: BTreeMap<(usize, usize), NodeRef<DeviceBuffer<f64>>> = BTreeMap::new();
    let mut owner = BTreeMap::new();
    for j in 0..t {
        for i in j..t {
            let datum = g.datum(format!("A{i},{j}"), (i % p) * q + (j % q));
            owner.insert((i, j), datum);
            let load = g.device_node(datum, d, format!("load({i},{j})"), move |ctx| {
                let (rows, cols) = (size(i), size(j));
                let mut tile = Vec::with_capacity(rows * cols);
                for c in 0..cols {
                    tile.extend((0..rows).map(|r| spd_entry(n, i * b + r, j * b + c)));
                }
                Ok(ctx.gpu().upload(&tile)?)
            });
            latest.insert((i, j), load);
        }
    }
    let plan = CholeskyPlan::new(n, b, d.group());
    let tasks = plan.tasks();
    for task in &tasks {
        let op = task.op;
        let (reads, writes) = touches(op);
        let prev = latest[&writes];
        let inputs: Vec<_> = reads.iter().map(|tile| latest[tile]).collect();
        let ins = inputs.clone();
        let node = g.device_node(owner[&writes], d, op.name(), move |ctx| {
            let gpu = ctx.gpu();
            let last = ctx.input(prev)?;
            let mut out = gpu.alloc::<f64>(last.len())?;
            gpu.copy_device(last, &mut out)?;
            let reads = ins
                .iter()
                .map(|&r| ctx.input(r))
                .collect::<Result<Vec<_>, _>>()?;
            run_op(ctx, op, &reads, &out, size)?;
            Ok(out)
        });
        g.edge(prev, node);
        for r in inputs {
            g.edge(r, node);
        }
        latest.insert(writes, node);
    }
    let finals: Vec<TileNode> = latest.iter().map(|(&k, &v)| (k, v)).collect();
    let gathered = finals.clone();
    let gather = g.gpu_node(0, d, "gather L", move |ctx| {
        let mut l = vec![0.0f64; n * n];
        for &((i, j), node) in &gathered {
            let tile = ctx.gpu().download(ctx.input(node)?)?;
            let rows = size(i);
            for c in 0..size(j) {
                for r in 0..rows {
                    // Only the lower triangle is L (POTRF leaves the rest of the tile as it was).
                    if i * b + r >= j * b + c {
                        l[(j * b + c) * n + i * b + r] = tile[c * rows + r];
                    }
                }
            }
        }
        Ok(l)
    });
    for &(_, node) in &finals {
        g.edge(node, gather);
    }
    Factorization {
        graph: g,
        gather,
        ops: tasks.len(),
    }
}

/// The one-rank factor: the bench crate's graph on this rank's device (the whole matrix in one
/// allocation, the same tile operations and routines), downloaded, lower triangle only.
fn one_rank_factor(
    ranks: &GpuRanks,
    d: &GpuDevice,
    n: usize,
    b: usize,
) -> Result<Vec<f64>, String> {
    let host = Arc::new(boundpool_bench::cholesky::spd_matrix(n));
    let h = host.clone();
    let a = Arc::new(
        ranks
            .call(d, move |ctx| Ok(ctx.upload(&h)?))
            .map_err(|e| e.to_string())?,
    );
    let plan = CholeskyPlan::new(n, b, d.group());
    let info = Arc::new(
        ranks
            .call(d, move |ctx| Ok(ctx.alloc_zeros::<i32>(n.div_ceil(b))?))
            .map_err(|e| e.to_string())?,
    );
    let graph = plan
        .build("one-rank cholesky", &a, &info)
        .map_err(|e| e.to_string())?;
    ranks
        .pool()
        .submit(&graph.graph)
        .and_then(|h| h.wait())
        .map_err(|e| e.to_string())?;
    let mut l = ranks.download(&a).map_err(|e| e.to_string())?;
    for j in 0..n {
        for i in 0..j {
            l[j * n + i] = 0.0;
        }
    }
    Ok(l)
}

/// `‖A − L Lᵀ‖_F / ‖A‖_F` on the host (`L` lower, column-major), over the lower triangle and
/// doubled off the diagonal (both are symmetric).
fn residual(l: &[f64], n: usize) -> f64 {
    let threads = std::thread::available_parallelism()
        .map_or(1, |p| p.get())
        .min(16);
    let parts: Vec<(f64, f64)> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|th| {
                s.spawn(move || {
                    let (mut r2, mut a2) = (0.0f64, 0.0f64);
                    for j in (th..n).step_by(threads) {
                        for i in j..n {
                            let mut llt = 0.0;
                            for k in 0..=j {
                                llt += l[k * n + i] * l[k * n + j];
                            }
                            let a = spd_entry(n, i, j);
                            let w = if i == j { 1.0 } else { 2.0 };
                            r2 += w * (a - llt).powi(2);
                            a2 += w * a * a;
                        }
                    }
                    (r2, a2)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let (r2, a2) = parts
        .iter()
        .fold((0.0, 0.0), |(x, y), (r, a)| (x + r, y + a));
    (r2 / a2).sqrt()
}

fn factor(ranks: &GpuRanks, a: &Args) -> Result<String, String> {
    let (n, b) = (a.n, a.tile.max(1));
    let d = ranks.devices()[0].clone();
    let Factorization {
        graph: g,
        gather,
        ops,
    } = graph(ranks, &d, n, b);
    let graph = g.build(ranks).map_err(|e| e.to_string())?;
    let transfers = graph.lowering().transfers.len();
    let mut times = Vec::new();
    let mut l = None;
    for run in 0..=a.runs {
        let t0 = Instant::now();
        let out = ranks.run(&graph).map_err(|e| format!("run {run}: {e}"))?;
        if run > 0 {
            times.push(t0.elapsed().as_secs_f64());
        }
        if let Some(x) = out.get(gather) {
            l = Some(x.clone());
        }
    }
    let wire = if a.nccl { "over NCCL" } else { "staged" };
    let (p, q) = grid(ranks.size());
    let best = times.iter().copied().fold(f64::INFINITY, f64::min);
    let Some(l) = l else {
        return Ok(format!(
            "{ops} tile operations, {transfers} tile transfers {wire}, {p}x{q} grid; best {:.1} ms",
            best * 1e3
        ));
    };
    let reference = one_rank_factor(ranks, &d, n, b)?;
    let scale = reference.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    let diff = l
        .iter()
        .zip(&reference)
        .fold(0.0f64, |m, (x, y)| m.max((x - y).abs()))
        / scale;
    let res = residual(&l, n);
    let within = |x: f64, limit: f64| x.partial_cmp(&limit).is_some_and(|o| o.is_le());
    if !within(diff, 1e-10) || !within(res, 1e-12) {
        return Err(format!(
            "N = {n}, tile {b}: max |L - L_one_rank| / max |L| = {diff:.2e} (limit 1e-10), \
             residual {res:.2e} (limit 1e-12)"
        ));
    }
    Ok(format!(
        "N = {n}, tile {b}, {p}x{q} grid: {ops} tile operations, {transfers} tile transfers \
         {wire}; equal to the one-rank factor (max diff {diff:.1e} of max |L|), residual \
         {res:.2e}; best of {} runs {:.1} ms",
        a.runs,
        best * 1e3
    ))
}
