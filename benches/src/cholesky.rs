//! A tiled right-looking Cholesky factorization (f64, lower) as a graph of library calls:
//! POTRF on diagonal tiles (cuSOLVER), TRSM, SYRK and GEMM (cuBLAS), one node per tile
//! operation, edges from the tiles each one reads and writes.
//!
//! `CholeskyPlan { n, tile, panel, update, .. }.build(name, &a, &info)` makes the graph that
//! factors the column-major `n`×`n` matrix `a` in place, with an edge from the last writer of
//! every tile a node reads or writes ([`CholeskyPlan::tasks`] lists them; unit tests check that
//! every two operations touching a tile, one writing, are ordered, and factor a matrix on the
//! host in that order). The matrix stays in one allocation (leading dimension `n`); a tile is
//! a [`Mat`] view into it, and a ragged last tile is allowed. A node writes only the block it
//! holds: its output is the version of the block it wrote, which the block's next writer takes
//! (`GpuCtx::take` along an edge declared with `hand_on`, so the graph's build checks that a
//! block's versions are each read by that one writer only, until the last, which many read).
//! Panel work (POTRF, TRSM and the updates of the next tile column: the look-ahead) goes to
//! group `panel`, the other updates to `update`: with `stream_priority(0, -5)`,
//! `groups_per_device(2)` and `stream_handoff(false)`, the panel runs on high-priority streams of its own, ahead of bulk
//! GEMMs queued on the update streams (with the hand-off, a POTRF would run on the stream of the
//! update chain that fed it). No host synchronise inside the factorization; the graph's sink
//! downloads the POTRF infos and fails naming the first POTRF node whose tile was not positive
//! definite (`node 'potrf(2)': cusolverDnDpotrf: info = 3: ...`). [`residual_on_device`]
//! computes ‖A − LLᵀ‖_F/‖A‖_F with cuBLAS (TRMM, GEMM, NRM2; about 3n² doubles of scratch) and
//! [`spot_check_on_device`] checks sampled entries of LLᵀ for larger n.
//!
//! The tile operations and their order ([`TileOp`], [`TileTask`], `tile_tasks`) are
//! `boundpool-workloads`' (device-free, so the simulator lowers the same tasks over ranks).
//! The library calls (`cholesky/dense.rs`: [`TileBlas`], [`potrf`]) are made on the handles a
//! node is lent by `boundpool-gpu` (cudarc's `CudaBlas` and `DnHandle`, set to the node's
//! stream, with the worker's workspaces) over typed views of the matrix, each checked against
//! its slice; `cholesky/error.rs` holds [`CholeskyError`]. Tests: `benches/tests/gpu_cholesky.rs`
//! (a 1000×1000 factorization with ragged tiles in every placement, verified; a non-SPD tile's
//! named error; the views' and routines' checks) and the unit tests here. Example:
//! `examples/cholesky.rs`; bench: `benches/benches/cholesky.rs` (figures: docs/benchmarks.md,
//! "Tiled Cholesky").

use std::sync::Arc;

use boundpool_gpu::{
    DeviceBuffer, GpuCtx, GpuDevice, GpuErrorKind, GpuGraph, GpuGraphExt, GpuPool, GpuResult,
};
use boundpool_scheduler::{GraphBuilder, GroupId, NodeRef, Priority};
use boundpool_workloads::tile_tasks;

mod dense;
mod error;

pub use boundpool_workloads::{TileOp, TileTask};
pub use dense::{potrf, potrf_info_error, Diag, Mat, Side, TileBlas, Trans, Uplo, Vector};
pub use error::CholeskyError;

/// How to tile and place a factorization of an `n`×`n` matrix.
///
/// The *panel* work (POTRF of tile column `k`, its TRSMs, and the look-ahead: the updates of
/// column `k + 1` by column `k`) goes to group `panel`, the other updates to `update`. Give the
/// panel group a high stream priority ([`GpuPoolBuilder::stream_priority`]) and turn the
/// stream hand-off off ([`GpuPoolBuilder::stream_handoff`]) so that the critical path runs on
/// the panel workers' streams ahead of the bulk updates; with one group for both, the graph is
/// the same and only the placement differs.
///
/// [`GpuPoolBuilder::stream_priority`]: boundpool_gpu::GpuPoolBuilder::stream_priority
/// [`GpuPoolBuilder::stream_handoff`]: boundpool_gpu::GpuPoolBuilder::stream_handoff
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CholeskyPlan {
    /// Order of the matrix.
    pub n: usize,
    /// Tile size (the last tile row/column may be smaller).
    pub tile: usize,
    /// Where POTRF, TRSM and the look-ahead updates run.
    pub panel: GroupId,
    /// Where the other SYRK and GEMM updates run.
    pub update: GroupId,
    /// One TRSM for all the tiles below each diagonal tile, and one tall GEMM for all the
    /// tiles below the diagonal of each column an update reaches ([`TileOp::TrsmBelow`],
    /// [`TileOp::GemmBelow`]), instead of one call per tile: fewer, larger library calls
    /// (a column of `t` tiles takes 2 + 2 (t - 1) nodes a step, not about t² / 2), at the
    /// price of fewer independent nodes. `false` by default ([`new`](Self::new)).
    pub merge_columns: bool,
    /// The critical path's nodes at [`Priority::High`] ([`TileTask::critical`]): workers take
    /// them before other ready nodes, and enqueue them on their high-priority stream, where
    /// they do not queue behind other panel work (the TRSMs of a column's farther tiles, say)
    /// already enqueued on the group's streams. `true` by default ([`new`](Self::new)).
    pub critical_high: bool,
    /// Only the critical path's tasks ([`TileTask::critical`]) to `panel`; the rest of the
    /// panel work (the farther TRSMs, the next column's other updates) to `update`. For a
    /// panel group that is a small SM partition, which the whole panel work would starve.
    /// `false` by default ([`new`](Self::new)).
    pub critical_only_panel: bool,
}

/// A factorization graph and its last node, which checks every POTRF's `info`.
#[derive(Debug)]
pub struct CholeskyGraph {
    /// The graph (run it any number of times, on a matrix reloaded between runs).
    pub graph: GpuGraph,
    /// The node that reads back the POTRF infos after the factorization (the graph's sink).
    pub check: NodeRef<()>,
    /// Nodes of each kind: POTRF, TRSM, SYRK, GEMM (a merged TRSM or GEMM counts once).
    pub counts: [usize; 4],
}

impl CholeskyPlan {
    /// Every node on `group`.
    pub fn new(n: usize, tile: usize, group: GroupId) -> Self {
        Self {
            n,
            tile,
            panel: group,
            update: group,
            merge_columns: false,
            critical_high: true,
            critical_only_panel: false,
        }
    }

    /// Number of tile rows (and columns).
    pub fn tiles(&self) -> usize {
        self.n.div_ceil(self.tile.max(1))
    }

    /// Floating-point operations of one factorization (`n³/3`, the usual count).
    pub fn flops(&self) -> f64 {
        let n = self.n as f64;
        n * n * n / 3.0
    }

    /// The factorization's tile operations in an order that respects their dependencies,
    /// each with the indices (into this list) of the operations it must follow: the last
    /// writer of every tile it reads or writes. No GPU needed; [`build`](Self::build) makes
    /// one node per operation with these edges.
    pub fn tasks(&self) -> Vec<TileTask> {
        tile_tasks(self.n, self.tile, self.merge_columns)
    }

    /// Builds the graph factoring, in place, the lower triangle of the column-major `n`×`n`
    /// matrix `a` (the upper triangle is not touched), writing each POTRF's `info` to
    /// `info[k]` (`info` needs [`tiles`](Self::tiles) elements). The sink node downloads the
    /// infos (the only host wait, after everything) and fails naming the first POTRF node whose
    /// tile was not positive definite.
    pub fn build(
        &self,
        name: &str,
        a: &Arc<DeviceBuffer<f64>>,
        info: &Arc<DeviceBuffer<i32>>,
    ) -> Result<CholeskyGraph, CholeskyError> {
        let (n, b, t) = (self.n, self.tile, self.tiles());
        if n == 0 || b == 0 {
            return Err(CholeskyError::new(
                GpuErrorKind::InvalidArgument,
                format!("cholesky '{name}': n = {n} and tile = {b} must be positive"),
            ));
        }
        if a.len() < n * n || info.len() < t {
            return Err(CholeskyError::new(
                GpuErrorKind::InvalidArgument,
                format!(
                    "cholesky '{name}': the matrix needs {} elements (has {}), info {t} (has {})",
                    n * n,
                    a.len(),
                    info.len()
                ),
            ));
        }
        let tasks = self.tasks();
        let mut g = GraphBuilder::with_capacity(name.to_owned(), tasks.len() + 1, 3 * tasks.len());
        let prevs = previous_writers(&tasks);
        let mut refs: Vec<NodeRef<BlockVersion>> = Vec::with_capacity(tasks.len());
        let mut counts = [0usize; 4];
        for (task, &prev) in tasks.iter().zip(&prevs) {
            let on_panel = if self.critical_only_panel {
                task.critical()
            } else {
                task.panel
            };
            let group = if on_panel { self.panel } else { self.update };
            counts[task.op.kind()] += 1;
            let block = Block::written_by(task.op);
            let prev_node = prev.map(|d| refs[d]);
            // The closures keep the matrix (and infos) alive as long as the graph.
            let (a, info, op) = (a.clone(), info.clone(), task.op);
            let node = g.gpu_node_in(group, &op.name(), move |ctx| {
                let version = match prev_node {
                    Some(p) => ctx.take(p)?,
                    None => BlockVersion(block),
                };
                run_tile_op(ctx, op, &version, &a, &info, n, b)?;
                Ok(version)
            });
            for &d in &task.deps {
                if Some(d) == prev {
                    // The block's only reader until this writer: `build` checks it.
                    g.hand_on(refs[d], node);
                } else {
                    g.edge(refs[d], node);
                }
            }
            if self.critical_high && task.critical() {
                g.node_priority(node, Priority::High);
            }
            refs.push(node);
        }
        let potrf_names: Vec<String> = (0..t).map(|k| TileOp::Potrf { k }.name()).collect();
        let keep = info.clone();
        let check = g.gpu_node_in(self.panel, "check potrf info", move |ctx| {
            let infos = ctx.download(&keep)?;
            for (k, &v) in infos.iter().take(t).enumerate() {
                if v != 0 {
                    let e = potrf_info_error(&potrf_names[k], v);
                    let order = k * b + v.max(0) as usize;
                    return Err(Box::new(CholeskyError::new(
                        e.kind(),
                        format!(
                            "{} (tile {k}; order {order} of the whole matrix)",
                            e.message()
                        ),
                    )));
                }
            }
            Ok(())
        });
        // The last POTRF follows every other operation (each tile's updates end in the
        // panels below it, which all feed the last diagonal tile).
        if let Some(&sink) = refs.last() {
            g.edge(sink, check);
        }
        let graph = g.build().map_err(|e| {
            CholeskyError::new(GpuErrorKind::Scheduler, format!("cholesky '{name}': {e}"))
                .with_source(e)
        })?;
        Ok(CholeskyGraph {
            graph,
            check,
            counts,
        })
    }
}

/// The part of the matrix one operation writes: a tile, or (merged columns) the tiles below
/// diagonal tile `j` (rows `(j + 1) b ..` of tile column `j`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Block {
    Tile(usize, usize),
    Below(usize),
}

impl Block {
    fn written_by(op: TileOp) -> Self {
        match op {
            TileOp::Potrf { k } => Block::Tile(k, k),
            TileOp::Trsm { i, k } => Block::Tile(i, k),
            TileOp::Syrk { j, .. } => Block::Tile(j, j),
            TileOp::Gemm { i, j, .. } => Block::Tile(i, j),
            TileOp::TrsmBelow { k } => Block::Below(k),
            TileOp::GemmBelow { j, .. } => Block::Below(j),
        }
    }
}

/// For each task, the block's previous writer, whose version of the block the task takes (none
/// for the block's first writer): among the last writers of what it touches, the one that wrote
/// the same block.
fn previous_writers(tasks: &[TileTask]) -> Vec<Option<usize>> {
    tasks
        .iter()
        .map(|task| {
            let block = Block::written_by(task.op);
            (task.deps.iter().copied()).find(|&d| Block::written_by(tasks[d].op) == block)
        })
        .collect()
}

/// A version of a block of the matrix, what a tile operation's node leaves: the block's next
/// writer takes it ([`GpuCtx::take`]: it is this version's only reader, an edge `build`
/// declares with `hand_on`, so the graph's build checks it), so a block's successive versions
/// pass from writer to writer and a node writes only the block it holds; the last version
/// (POTRF's, TRSM's) is read by many, through the matrix. Not `Clone`: one holder at a time.
#[derive(Debug, PartialEq, Eq)]
struct BlockVersion(Block);

/// Runs tile operation `op` of the factorization of the column-major `n`×`n` matrix `a` (tiles
/// of `b`, the last ones ragged) on the node's library handles, writing the block `held` (the
/// one `op` writes, which this node holds); a POTRF of tile `k` writes its `info` to `info[k]`.
fn run_tile_op(
    ctx: &GpuCtx<'_, '_>,
    op: TileOp,
    held: &BlockVersion,
    a: &DeviceBuffer<f64>,
    info: &DeviceBuffer<i32>,
    n: usize,
    b: usize,
) -> Result<(), CholeskyError> {
    if held.0 != Block::written_by(op) {
        return Err(CholeskyError::new(
            GpuErrorKind::InvalidArgument,
            format!(
                "node '{}': holds {:?}, not the block it writes",
                op.name(),
                held.0
            ),
        ));
    }
    let size = |i: usize| b.min(n - i * b);
    let data = a.as_cuda_slice();
    // `rows` × `cols` from the top left of tile (i, j).
    let at = |i: usize, j: usize, rows: usize, cols: usize| {
        Mat::new(data, j * b * n + i * b, rows, cols, n)
    };
    // The view this node writes: the block it holds.
    let w = match held.0 {
        Block::Tile(i, j) => at(i, j, size(i), size(j))?,
        Block::Below(j) => at(j + 1, j, n - (j + 1) * b, size(j))?,
    };
    let (lower, t, right, non_unit) = (Uplo::Lower, Trans::T, Side::Right, Diag::NonUnit);
    // SAFETY: every view lies inside `a` (`Mat::new` checks it) or is `info[k]` (`build`
    // checked `info`'s length). This node writes only `w`, the block it holds: taken from the
    // block's previous writer, whose only successor it is (`hand_on`, checked by the graph's
    // build), or, for the block's first writer, not written before in this run (one run of a
    // matrix at a time: it is reloaded between runs); every tile it reads is a final version,
    // whose last writer precedes this node and which no node writes after
    // (`CholeskyPlan::tasks` orders every two operations on one tile, one of them writing it).
    // So no other node's work touches what this one writes meanwhile. The raw cuBLAS and
    // cuSOLVER calls stay (`dense.rs`): cudarc's safe layer has no TRSM, SYRK or POTRF, and a
    // block is a strided part of the one matrix, which no `&mut` view can lend while other
    // nodes read the rest. The graph's closures keep `a` and `info` alive as long as the graph.
    unsafe {
        match op {
            TileOp::Potrf { k } => {
                let info_k = info.as_cuda_slice().slice(k..k + 1);
                potrf(ctx, lower, &w, &info_k)
            }
            // A_ik := A_ik L_kk^-T.
            TileOp::Trsm { k, .. } => TileBlas::new(ctx)?.trsm(
                right,
                lower,
                t,
                non_unit,
                1.0,
                &at(k, k, size(k), size(k))?,
                &w,
            ),
            // A_(k+1..,k) := A_(k+1..,k) L_kk^-T: rows (k + 1) b .. n of tile column k.
            TileOp::TrsmBelow { k } => TileBlas::new(ctx)?.trsm(
                right,
                lower,
                t,
                non_unit,
                1.0,
                &at(k, k, size(k), size(k))?,
                &w,
            ),
            // A_(j+1..,j) -= A_(j+1..,k) A_jk^T.
            TileOp::GemmBelow { j, k } => {
                let rows = n - (j + 1) * b;
                TileBlas::new(ctx)?.gemm(
                    Trans::No,
                    t,
                    -1.0,
                    &at(j + 1, k, rows, size(k))?,
                    &at(j, k, size(j), size(k))?,
                    1.0,
                    &w,
                )
            }
            // A_jj -= A_jk A_jk^T (lower triangle).
            TileOp::Syrk { j, k } => TileBlas::new(ctx)?.syrk(
                lower,
                Trans::No,
                -1.0,
                &at(j, k, size(j), size(k))?,
                1.0,
                &w,
            ),
            // A_ij -= A_ik A_jk^T.
            TileOp::Gemm { i, j, k } => TileBlas::new(ctx)?.gemm(
                Trans::No,
                t,
                -1.0,
                &at(i, k, size(i), size(k))?,
                &at(j, k, size(j), size(k))?,
                1.0,
                &w,
            ),
        }
    }
}

/// Entry `(i, j)` of the symmetric positive definite test matrix of order `n`: off the
/// diagonal a pseudo-random value in [-0.5, 0.5) (a hash of the unordered pair), on it `n`
/// plus such a value, so each row is strictly diagonally dominant.
pub fn spd_entry(n: usize, i: usize, j: usize) -> f64 {
    let (lo, hi) = if i <= j { (i, j) } else { (j, i) };
    let mut z = (lo as u64)
        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
        .wrapping_add(hi as u64)
        .wrapping_add(0x2545_f491_4f6c_dd1d);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    let u = (z >> 11) as f64 / (1u64 << 53) as f64 - 0.5;
    if i == j {
        n as f64 + u
    } else {
        u
    }
}

/// The test matrix of order `n` ([`spd_entry`]), column-major, filled by a few threads.
pub fn spd_matrix(n: usize) -> Vec<f64> {
    let mut a = vec![0.0f64; n * n];
    let threads = std::thread::available_parallelism()
        .map_or(1, |p| p.get())
        .min(16);
    let cols_per = n.div_ceil(threads).max(1);
    std::thread::scope(|s| {
        for (c, chunk) in a.chunks_mut(cols_per * n).enumerate() {
            s.spawn(move || {
                for (jj, col) in chunk.chunks_mut(n).enumerate() {
                    let j = c * cols_per + jj;
                    for (i, v) in col.iter_mut().enumerate() {
                        *v = spd_entry(n, i, j);
                    }
                }
            });
        }
    });
    a
}

/// `‖A − L Lᵀ‖_F / ‖A‖_F` computed on the device, one node on a worker of `device`: `a0` the
/// original matrix, `l` the factored one (its lower triangle is `L`; the upper is ignored),
/// both `n`×`n` column-major. Uses about `3 n²` doubles of scratch device memory.
pub fn residual_on_device(
    pool: &GpuPool,
    device: &GpuDevice,
    a0: &Arc<DeviceBuffer<f64>>,
    l: &Arc<DeviceBuffer<f64>>,
    n: usize,
) -> GpuResult<f64> {
    let (a0, l) = (a0.clone(), l.clone());
    pool.call(device, move |ctx| {
        let eye = ctx.alloc_zeros::<f64>(n * n)?;
        let ones = ctx.upload(&vec![1.0f64; n])?;
        let lower = ctx.alloc::<f64>(n * n)?;
        let mut r = ctx.alloc::<f64>(n * n)?;
        ctx.copy_device(&a0, &mut r)?;
        let blas = TileBlas::new(ctx)?;
        // SAFETY: `eye`, `ones`, `lower` and `r` are this node's own buffers, written only here;
        // `l` and `a0` are only read (n² doubles each: the views check it), and no graph
        // writes them meanwhile (the caller's factorization has ended); all of them are on
        // this node's device and live until its synchronous norms below have returned.
        unsafe {
            let diagonal = Vector::new(eye.as_cuda_slice(), 0, n, n + 1)?;
            blas.copy(&Vector::all(&ones), &diagonal)?;
            // lower = tril(l) · I, the factor with zeros above the diagonal.
            blas.trmm(
                Side::Left,
                Uplo::Lower,
                Trans::No,
                Diag::NonUnit,
                1.0,
                &Mat::square(&l, n)?,
                &Mat::square(&eye, n)?,
                &Mat::square(&lower, n)?,
            )?;
            // r = a0 - lower lowerᵀ.
            blas.gemm_into(
                Trans::No,
                Trans::T,
                (n, n, n),
                -1.0,
                &lower,
                &lower,
                1.0,
                &mut r,
            )?;
        }
        // SAFETY: as above.
        let (nr, na) = unsafe {
            (
                blas.nrm2(&Vector::new(r.as_cuda_slice(), 0, n * n, 1)?)?,
                blas.nrm2(&Vector::new(a0.as_cuda_slice(), 0, n * n, 1)?)?,
            )
        };
        Ok(nr / na)
    })
}

/// Spot checks of a factorization too large for [`residual_on_device`]: for `samples`
/// pseudo-random entries `(i, j)` of the lower triangle (and the last diagonal entry), the
/// largest `|A_ij − (L Lᵀ)_ij| / sqrt(A_ii A_jj)`, with `(L Lᵀ)_ij` a dot product of two rows
/// of `L` on the device and `A_ij` from [`spd_entry`].
pub fn spot_check_on_device(
    pool: &GpuPool,
    device: &GpuDevice,
    l: &Arc<DeviceBuffer<f64>>,
    n: usize,
    samples: usize,
) -> GpuResult<f64> {
    let l = l.clone();
    pool.call(device, move |ctx| {
        let blas = TileBlas::new(ctx)?;
        let data = l.as_cuda_slice();
        let mut worst = 0.0f64;
        let mut z = 0x1234_5678_9abc_def1u64;
        for s in 0..=samples {
            let (i, j) = if s == samples {
                (n - 1, n - 1)
            } else {
                z ^= z << 13;
                z ^= z >> 7;
                z ^= z << 17;
                let i = (z % n as u64) as usize;
                let j = ((z >> 32) % (i as u64 + 1)) as usize;
                (i, j)
            };
            // Rows i and j of L, elements 0..=j (j <= i < n), with stride n.
            let (row_i, row_j) = (
                Vector::new(data, i, j + 1, n)?,
                Vector::new(data, j, j + 1, n)?,
            );
            // SAFETY: `l` is only read, and lives for this synchronous call.
            let dot = unsafe { blas.dot(&row_i, &row_j)? };
            let scale = (spd_entry(n, i, i) * spd_entry(n, j, j)).sqrt();
            worst = worst.max((spd_entry(n, i, j) - dot).abs() / scale);
        }
        Ok(worst)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use boundpool_scheduler::backend::FromIndex;

    /// Tiles (row, column) an operation reads and those it writes, in a matrix of `t` tiles.
    type Tiles = Vec<(usize, usize)>;

    fn touches(op: TileOp, t: usize) -> (Tiles, Tiles) {
        match op {
            TileOp::Potrf { k } => (vec![], vec![(k, k)]),
            TileOp::Trsm { i, k } => (vec![(k, k)], vec![(i, k)]),
            TileOp::Syrk { j, k } => (vec![(j, k)], vec![(j, j)]),
            TileOp::Gemm { i, j, k } => (vec![(i, k), (j, k)], vec![(i, j)]),
            TileOp::TrsmBelow { k } => (vec![(k, k)], (k + 1..t).map(|i| (i, k)).collect()),
            TileOp::GemmBelow { j, k } => (
                (j..t).map(|i| (i, k)).collect(),
                (j + 1..t).map(|i| (i, j)).collect(),
            ),
        }
    }

    /// Runs one operation on the host on the column-major `n`×`n` matrix `a`.
    fn run_op(a: &mut [f64], n: usize, b: usize, op: TileOp) {
        let size = |i: usize| b.min(n - i * b);
        let at = |r: usize, c: usize| c * n + r;
        match op {
            TileOp::Potrf { k } => {
                let (o, m) = (k * b, size(k));
                for j in 0..m {
                    let mut d = a[at(o + j, o + j)];
                    for q in 0..j {
                        d -= a[at(o + j, o + q)].powi(2);
                    }
                    let d = d.sqrt();
                    a[at(o + j, o + j)] = d;
                    for i in j + 1..m {
                        let mut s = a[at(o + i, o + j)];
                        for q in 0..j {
                            s -= a[at(o + i, o + q)] * a[at(o + j, o + q)];
                        }
                        a[at(o + i, o + j)] = s / d;
                    }
                }
            }
            TileOp::Trsm { i, k } => {
                let (ro, co, m, nk) = (i * b, k * b, size(i), size(k));
                for r in 0..m {
                    for j in 0..nk {
                        let mut s = a[at(ro + r, co + j)];
                        for q in 0..j {
                            s -= a[at(ro + r, co + q)] * a[at(co + j, co + q)];
                        }
                        a[at(ro + r, co + j)] = s / a[at(co + j, co + j)];
                    }
                }
            }
            TileOp::Syrk { j, k } => run_op(a, n, b, TileOp::Gemm { i: j, j, k }),
            TileOp::TrsmBelow { k } => {
                for i in k + 1..n.div_ceil(b) {
                    run_op(a, n, b, TileOp::Trsm { i, k });
                }
            }
            TileOp::GemmBelow { j, k } => {
                for i in j + 1..n.div_ceil(b) {
                    run_op(a, n, b, TileOp::Gemm { i, j, k });
                }
            }
            TileOp::Gemm { i, j, k } => {
                let (ro, cj, ck) = (i * b, j * b, k * b);
                for c in 0..size(j) {
                    for r in 0..size(i) {
                        let mut s = 0.0;
                        for q in 0..size(k) {
                            s += a[at(ro + r, ck + q)] * a[at(cj + c, ck + q)];
                        }
                        a[at(ro + r, cj + c)] -= s;
                    }
                }
            }
        }
    }

    #[test]
    fn merged_tasks_have_the_expected_counts_and_order() {
        for (n, b) in [(64, 64), (200, 48), (512, 64)] {
            let plan = CholeskyPlan {
                merge_columns: true,
                ..CholeskyPlan::new(n, b, GroupId::from_index(0))
            };
            let t = plan.tiles();
            let tasks = plan.tasks();
            let count = |f: fn(&TileOp) -> bool| tasks.iter().filter(|x| f(&x.op)).count();
            assert_eq!(count(|o| matches!(o, TileOp::Potrf { .. })), t);
            assert_eq!(count(|o| matches!(o, TileOp::TrsmBelow { .. })), t - 1);
            assert_eq!(count(|o| matches!(o, TileOp::Syrk { .. })), t * (t - 1) / 2);
            assert_eq!(
                count(|o| matches!(o, TileOp::GemmBelow { .. })),
                (t - 1) * (t.max(2) - 2) / 2
            );
            assert_eq!(
                count(|o| matches!(o, TileOp::Trsm { .. } | TileOp::Gemm { .. })),
                0
            );
            for (x, task) in tasks.iter().enumerate() {
                assert!(task.deps.iter().all(|&d| d < x), "{:?}", task.op);
            }
            assert_eq!(tasks.last().unwrap().op, TileOp::Potrf { k: t - 1 });
        }
    }

    /// The critical path's tasks: every POTRF, the two TRSMs below each, the next diagonal
    /// tile's SYRK and the GEMM below it; merged: every TRSM below and the next column's two
    /// updates.
    #[test]
    fn critical_tasks_are_the_path_between_potrfs() {
        let t = 6;
        let plan = CholeskyPlan::new(6 * 16, 16, GroupId::from_index(0));
        let crit: Vec<TileOp> = plan
            .tasks()
            .into_iter()
            .filter(TileTask::critical)
            .map(|x| x.op)
            .collect();
        let count = |f: fn(&TileOp) -> bool| crit.iter().filter(|o| f(o)).count();
        assert_eq!(count(|o| matches!(o, TileOp::Potrf { .. })), t);
        assert_eq!(count(|o| matches!(o, TileOp::Trsm { .. })), 2 * (t - 2) + 1);
        assert_eq!(count(|o| matches!(o, TileOp::Syrk { .. })), t - 1);
        assert_eq!(count(|o| matches!(o, TileOp::Gemm { .. })), t - 2);
        assert!(crit.contains(&TileOp::Trsm { i: 2, k: 0 }));
        assert!(!crit.contains(&TileOp::Trsm { i: 3, k: 0 }));
        assert!(crit.contains(&TileOp::Gemm { i: 2, j: 1, k: 0 }));
        assert!(!crit.contains(&TileOp::Gemm { i: 3, j: 1, k: 0 }));
        let merged = CholeskyPlan {
            merge_columns: true,
            ..plan
        };
        let crit = merged
            .tasks()
            .into_iter()
            .filter(TileTask::critical)
            .count();
        // POTRF and TRSM below: t and t - 1; the next column's SYRK and GEMM below: t - 1, t - 2.
        assert_eq!(crit, t + (t - 1) + (t - 1) + (t - 2));
    }

    #[test]
    fn tasks_have_the_expected_counts_and_order() {
        for (n, b) in [(64, 64), (200, 48), (512, 64)] {
            let plan = CholeskyPlan::new(n, b, GroupId::from_index(0));
            let t = plan.tiles();
            let tasks = plan.tasks();
            let count = |f: fn(&TileOp) -> bool| tasks.iter().filter(|x| f(&x.op)).count();
            assert_eq!(count(|o| matches!(o, TileOp::Potrf { .. })), t);
            assert_eq!(count(|o| matches!(o, TileOp::Trsm { .. })), t * (t - 1) / 2);
            assert_eq!(count(|o| matches!(o, TileOp::Syrk { .. })), t * (t - 1) / 2);
            assert_eq!(
                count(|o| matches!(o, TileOp::Gemm { .. })),
                t * (t - 1) * (t.max(2) - 2) / 6
            );
            for (x, task) in tasks.iter().enumerate() {
                assert!(task.deps.iter().all(|&d| d < x), "{:?}", task.op);
            }
            assert_eq!(tasks.last().unwrap().op, TileOp::Potrf { k: t - 1 });
        }
    }

    /// Every two operations that touch one tile, one of them writing it, are ordered by the
    /// graph's edges (one is an ancestor of the other), and every operation is an ancestor
    /// of the last POTRF (the graph's single sink before the info check).
    #[test]
    fn tasks_order_every_conflicting_pair() {
        for merge_columns in [false, true] {
            let plan = CholeskyPlan {
                merge_columns,
                ..CholeskyPlan::new(7 * 32 + 5, 32, GroupId::from_index(0))
            };
            order_every_conflicting_pair(&plan.tasks(), plan.tiles());
        }
    }

    fn order_every_conflicting_pair(tasks: &[TileTask], t: usize) {
        let m = tasks.len();
        let mut anc: Vec<Vec<bool>> = vec![vec![false; m]; m];
        for x in 0..m {
            for &d in &tasks[x].deps {
                anc[x][d] = true;
                let (lo, hi) = anc.split_at_mut(x);
                for (y, v) in lo[d].iter().enumerate() {
                    if *v {
                        hi[0][y] = true;
                    }
                }
            }
        }
        for x in 0..m {
            let (rx, wx) = touches(tasks[x].op, t);
            for y in 0..x {
                let (ry, wy) = touches(tasks[y].op, t);
                let meets =
                    |a: &[(usize, usize)], b: &[(usize, usize)]| a.iter().any(|p| b.contains(p));
                let conflict = meets(&wx, &wy) || meets(&rx, &wy) || meets(&ry, &wx);
                if conflict {
                    assert!(
                        anc[x][y],
                        "{:?} and {:?} touch a tile unordered",
                        tasks[y].op, tasks[x].op
                    );
                }
            }
        }
        for y in 0..m - 1 {
            assert!(anc[m - 1][y], "{:?} does not reach the sink", tasks[y].op);
        }
    }

    /// What `build` declares with `hand_on` holds for both plans: each operation's previous
    /// writer of the block it writes is that block's writer just before it (so it takes the
    /// block's latest version), and this operation is its only successor (so no other node
    /// reads a version that is written again); a scheduler graph with those edges builds, and
    /// one more reader of a handed-on version makes its build fail.
    #[test]
    fn each_block_version_but_the_last_has_one_reader() {
        for merge_columns in [false, true] {
            let plan = CholeskyPlan {
                merge_columns,
                ..CholeskyPlan::new(7 * 32 + 5, 32, GroupId::from_index(0))
            };
            let tasks = plan.tasks();
            let prevs = previous_writers(&tasks);
            let mut succs = vec![Vec::new(); tasks.len()];
            for (x, task) in tasks.iter().enumerate() {
                for &d in &task.deps {
                    succs[d].push(x);
                }
            }
            let mut last = std::collections::HashMap::new();
            for (x, task) in tasks.iter().enumerate() {
                let block = Block::written_by(task.op);
                assert_eq!(prevs[x], last.get(&block).copied(), "{:?}", task.op);
                if let Some(p) = prevs[x] {
                    assert_eq!(succs[p], [x], "{:?} has other readers", tasks[p].op);
                }
                last.insert(block, x);
            }
            // Every write but each block's first is handed on.
            let handed = prevs.iter().flatten().count();
            assert_eq!(handed, tasks.len() - last.len(), "merge {merge_columns}");

            let graph = |spy: Option<usize>| {
                let mut g = GraphBuilder::<()>::new("plan");
                let refs: Vec<_> = (tasks.iter())
                    .map(|t| g.node(t.op.name(), |_| Ok(())))
                    .collect();
                for (x, task) in tasks.iter().enumerate() {
                    for &d in &task.deps {
                        if Some(d) == prevs[x] {
                            g.hand_on(refs[d], refs[x]);
                        } else {
                            g.edge(refs[d], refs[x]);
                        }
                    }
                }
                if let Some(p) = spy {
                    let reader = g.node("spy", |_| Ok(()));
                    g.edge(refs[p], reader);
                }
                g.build().map(drop)
            };
            graph(None).expect("every handed-on version has one reader");
            let some_prev = prevs.iter().flatten().next().copied();
            let err = graph(some_prev).expect_err("a second reader of a handed-on version");
            assert!(err.to_string().contains("'spy'"), "{err}");
        }
    }

    #[test]
    fn tasks_in_order_factor_the_matrix() {
        for merge_columns in [false, true] {
            factor_in_order(merge_columns);
        }
    }

    fn factor_in_order(merge_columns: bool) {
        let (n, b) = (200, 48);
        let mut a = spd_matrix(n);
        let plan = CholeskyPlan {
            merge_columns,
            ..CholeskyPlan::new(n, b, GroupId::from_index(0))
        };
        for task in plan.tasks() {
            run_op(&mut a, n, b, task.op);
        }
        let (mut num, mut den) = (0.0f64, 0.0f64);
        for j in 0..n {
            for i in 0..n {
                let mut s = 0.0;
                for q in 0..=i.min(j) {
                    s += a[q * n + i] * a[q * n + j];
                }
                let v = spd_entry(n, i, j);
                num += (v - s).powi(2);
                den += v * v;
            }
        }
        let r = (num / den).sqrt();
        assert!(r <= 1e-12, "residual {r:e} (merge_columns {merge_columns})");
        // The upper triangle is not touched.
        assert_eq!(a[5 * n + 1], spd_entry(n, 1, 5));
    }

    #[test]
    fn spd_entry_is_symmetric_and_dominant() {
        let n = 300;
        for i in 0..n {
            let off: f64 = (0..n)
                .filter(|&j| j != i)
                .map(|j| spd_entry(n, i, j).abs())
                .sum();
            assert!(spd_entry(n, i, i) > off);
            for j in 0..n {
                assert_eq!(spd_entry(n, i, j), spd_entry(n, j, i));
            }
        }
        let m = spd_matrix(37);
        assert_eq!(m[3 * 37 + 5], spd_entry(37, 5, 3));
    }
}
