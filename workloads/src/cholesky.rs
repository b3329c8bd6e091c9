//! The tiled right-looking Cholesky factorization (lower) as tile operations, without a
//! device: which operations there are, the earlier ones each must follow (the last writer of
//! every tile it reads or writes), which are panel work and which lie on the critical path.
//! The GPU factorization (`boundpool-bench`'s `CholeskyPlan`) makes one node per task; the
//! simulator (`boundpool-sim`) places the same tasks on ranks (2D block-cyclic, owner
//! computes) and lowers them with `boundpool-ranks`' `plan::lower`.

/// One tile operation of the factorization (tile indices, row `i` >= column `j`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TileOp {
    /// `L_kk = chol(A_kk)` (cuSOLVER `potrf`).
    Potrf {
        /// The diagonal tile.
        k: usize,
    },
    /// `A_ik := A_ik L_kk^-T` (cuBLAS `trsm`).
    Trsm {
        /// Tile row.
        i: usize,
        /// Tile column (the panel).
        k: usize,
    },
    /// `A_jj -= A_jk A_jk^T` (cuBLAS `syrk`, lower triangle).
    Syrk {
        /// The diagonal tile updated.
        j: usize,
        /// The panel column read.
        k: usize,
    },
    /// `A_ij -= A_ik A_jk^T` (cuBLAS `gemm`).
    Gemm {
        /// Tile row.
        i: usize,
        /// Tile column updated.
        j: usize,
        /// The panel column read.
        k: usize,
    },
    /// `A_ik := A_ik L_kk^-T` for every tile row `i > k` at once (one cuBLAS `trsm`; with
    /// `merge_columns`).
    TrsmBelow {
        /// Tile column (the panel).
        k: usize,
    },
    /// `A_ij -= A_ik A_jk^T` for every tile row `i > j` at once (one cuBLAS `gemm`; with
    /// `merge_columns`).
    GemmBelow {
        /// Tile column updated.
        j: usize,
        /// The panel column read.
        k: usize,
    },
}

impl TileOp {
    /// POTRF 0, TRSM 1, SYRK 2, GEMM 3 (merged ones with their kind).
    pub fn kind(&self) -> usize {
        match self {
            TileOp::Potrf { .. } => 0,
            TileOp::Trsm { .. } | TileOp::TrsmBelow { .. } => 1,
            TileOp::Syrk { .. } => 2,
            TileOp::Gemm { .. } | TileOp::GemmBelow { .. } => 3,
        }
    }

    /// The kind's name: `potrf`, `trsm`, `syrk` or `gemm` (what [`name`](Self::name) starts
    /// with, up to the parenthesis).
    pub fn kind_name(&self) -> &'static str {
        ["potrf", "trsm", "syrk", "gemm"][self.kind()]
    }

    /// The node name: `potrf(k)`, `trsm(i,k)`, `syrk(j,k)`, `gemm(i,j,k)`, and for the merged
    /// operations `trsm(k+1..,k)`, `gemm(j+1..,j,k)`.
    pub fn name(&self) -> String {
        match *self {
            TileOp::TrsmBelow { k } => format!("trsm({}..,{k})", k + 1),
            TileOp::GemmBelow { j, k } => format!("gemm({}..,{j},{k})", j + 1),
            TileOp::Potrf { k } => format!("potrf({k})"),
            TileOp::Trsm { i, k } => format!("trsm({i},{k})"),
            TileOp::Syrk { j, k } => format!("syrk({j},{k})"),
            TileOp::Gemm { i, j, k } => format!("gemm({i},{j},{k})"),
        }
    }

    /// The tile it writes (row, column); a merged operation names the first of its column.
    pub fn writes(&self) -> (usize, usize) {
        match *self {
            TileOp::Potrf { k } => (k, k),
            TileOp::Trsm { i, k } => (i, k),
            TileOp::Syrk { j, .. } => (j, j),
            TileOp::Gemm { i, j, .. } => (i, j),
            TileOp::TrsmBelow { k } => (k + 1, k),
            TileOp::GemmBelow { j, .. } => (j + 1, j),
        }
    }

    /// Its floating-point operations in a matrix of order `n` cut in tiles of `tile` (the
    /// last ones ragged): `b³/3` for POTRF, `b³` for TRSM and SYRK, `2b³` for GEMM, with each
    /// dimension the tile's own.
    pub fn flops(&self, n: usize, tile: usize) -> f64 {
        let size = |i: usize| tile.min(n.saturating_sub(i * tile)) as f64;
        let below = |k: usize| n.saturating_sub((k + 1) * tile) as f64;
        match *self {
            TileOp::Potrf { k } => size(k).powi(3) / 3.0,
            TileOp::Trsm { i, k } => size(i) * size(k) * size(k),
            TileOp::Syrk { j, k } => size(j) * size(j) * size(k),
            TileOp::Gemm { i, j, k } => 2.0 * size(i) * size(j) * size(k),
            TileOp::TrsmBelow { k } => below(k) * size(k) * size(k),
            TileOp::GemmBelow { j, k } => 2.0 * below(j) * size(j) * size(k),
        }
    }
}

/// A tile operation, the earlier operations it follows, and whether it is panel work.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TileTask {
    /// What it does.
    pub op: TileOp,
    /// Indices (into the task list) of the operations it must follow.
    pub deps: Vec<usize>,
    /// Panel work: POTRF, TRSM, and the updates of the next tile column.
    pub panel: bool,
}

impl TileTask {
    /// Whether the operation is on the path from one POTRF to the next or to the TRSM after it
    /// (POTRF; the TRSMs of the next two tiles below the diagonal; the update of the next
    /// diagonal tile and of the tile below it; merged: the TRSM below and the next column's
    /// updates).
    pub fn critical(&self) -> bool {
        match self.op {
            TileOp::Potrf { .. } | TileOp::TrsmBelow { .. } => true,
            TileOp::Trsm { i, k } => i <= k + 2,
            TileOp::Syrk { j, k } | TileOp::GemmBelow { j, k } => j == k + 1,
            TileOp::Gemm { i, j, k } => j == k + 1 && i == k + 2,
        }
    }
}

/// The factorization of an `n`×`n` matrix in tiles of `tile` as tile operations in an order
/// that respects their dependencies, each with the indices of the operations it must follow.
/// With `merge_columns`: per step `k`, POTRF, one TRSM below it, and for each later column `j`
/// a SYRK of its diagonal tile and one GEMM of the tiles below it.
pub fn tile_tasks(n: usize, tile: usize, merge_columns: bool) -> Vec<TileTask> {
    let t = n.div_ceil(tile.max(1));
    if merge_columns {
        return merged_tasks(t);
    }
    let mut out: Vec<TileTask> = Vec::with_capacity(t * (t + 1) * (t + 2) / 6);
    // last[i * t + j]: the task that last wrote tile (i, j), i >= j.
    let mut last: Vec<Option<usize>> = vec![None; t * t];
    let push = |out: &mut Vec<TileTask>,
                last: &mut [Option<usize>],
                op: TileOp,
                deps: Vec<usize>,
                writes: (usize, usize),
                panel: bool| {
        out.push(TileTask { op, deps, panel });
        last[writes.0 * t + writes.1] = Some(out.len() - 1);
    };
    for k in 0..t {
        let deps = last[k * t + k].into_iter().collect();
        push(&mut out, &mut last, TileOp::Potrf { k }, deps, (k, k), true);
        let potrf = last[k * t + k].expect("just written");
        for i in k + 1..t {
            let deps = std::iter::once(potrf).chain(last[i * t + k]).collect();
            push(
                &mut out,
                &mut last,
                TileOp::Trsm { i, k },
                deps,
                (i, k),
                true,
            );
        }
        for j in k + 1..t {
            // The updates of column k + 1 are on the critical path: with the panel.
            let panel = j == k + 1;
            let trsm_j = last[j * t + k].expect("trsm of (j, k)");
            let deps = std::iter::once(trsm_j).chain(last[j * t + j]).collect();
            push(
                &mut out,
                &mut last,
                TileOp::Syrk { j, k },
                deps,
                (j, j),
                panel,
            );
            for i in j + 1..t {
                let trsm_i = last[i * t + k].expect("trsm of (i, k)");
                let deps = [trsm_i, trsm_j]
                    .into_iter()
                    .chain(last[i * t + j])
                    .collect();
                push(
                    &mut out,
                    &mut last,
                    TileOp::Gemm { i, j, k },
                    deps,
                    (i, j),
                    panel,
                );
            }
        }
    }
    out
}

/// [`tile_tasks`] with `merge_columns`, for `t` tiles a side.
fn merged_tasks(t: usize) -> Vec<TileTask> {
    let mut out: Vec<TileTask> = Vec::with_capacity(t * t + t);
    // The last writers of diagonal tile j, and of the tiles below it in column j.
    let mut diag: Vec<Option<usize>> = vec![None; t];
    let mut below: Vec<Option<usize>> = vec![None; t];
    for k in 0..t {
        let deps = diag[k].into_iter().collect();
        out.push(TileTask {
            op: TileOp::Potrf { k },
            deps,
            panel: true,
        });
        let potrf = out.len() - 1;
        diag[k] = Some(potrf);
        if k + 1 == t {
            break;
        }
        let deps = std::iter::once(potrf).chain(below[k]).collect();
        out.push(TileTask {
            op: TileOp::TrsmBelow { k },
            deps,
            panel: true,
        });
        let trsm = out.len() - 1;
        below[k] = Some(trsm);
        for j in k + 1..t {
            // The updates of column k + 1 are on the critical path: with the panel.
            let panel = j == k + 1;
            let deps = std::iter::once(trsm).chain(diag[j]).collect();
            out.push(TileTask {
                op: TileOp::Syrk { j, k },
                deps,
                panel,
            });
            diag[j] = Some(out.len() - 1);
            if j + 1 < t {
                let deps = std::iter::once(trsm).chain(below[j]).collect();
                out.push(TileTask {
                    op: TileOp::GemmBelow { j, k },
                    deps,
                    panel,
                });
                below[j] = Some(out.len() - 1);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flops_add_up_to_a_third_of_n_cubed() {
        for (n, b) in [(1024, 256), (4096, 512), (4096, 4096)] {
            let total: f64 = tile_tasks(n, b, false)
                .iter()
                .map(|t| t.op.flops(n, b))
                .sum();
            // With whole tiles the counts add up to the usual n³/3 exactly.
            let want = (n as f64).powi(3) / 3.0;
            assert!((total / want - 1.0).abs() < 1e-12, "{total} vs {want}");
            let merged: f64 = tile_tasks(n, b, true)
                .iter()
                .map(|t| t.op.flops(n, b))
                .sum();
            assert!((merged / total - 1.0).abs() < 1e-12, "{merged} vs {total}");
        }
    }

    #[test]
    fn kinds_and_written_tiles() {
        let tasks = tile_tasks(4 * 8, 8, false);
        assert_eq!(tasks[0].op.kind_name(), "potrf");
        assert_eq!(tasks[1].op, TileOp::Trsm { i: 1, k: 0 });
        assert_eq!(tasks[1].op.writes(), (1, 0));
        for t in &tasks {
            assert!(t.op.name().starts_with(t.op.kind_name()));
            let (i, j) = t.op.writes();
            assert!(i >= j);
        }
    }
}
