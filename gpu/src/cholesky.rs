//! A tiled right-looking Cholesky factorization (f64, lower) as a graph of library calls:
//! POTRF on diagonal tiles (cuSOLVER), TRSM, SYRK and GEMM (cuBLAS), one node per tile
//! operation, edges from the tiles each one reads and writes. The matrix stays in one
//! column-major allocation (leading dimension `n`); a tile is an offset into it.

use std::sync::Arc;

use boundpool_scheduler::{GraphBuilder, GroupId, NodeRef};

use crate::blas::{potrf_info_error, Diag, Side, Trans, Uplo};
use crate::buffer::DeviceBuffer;
use crate::error::{GpuError, GpuErrorKind, GpuResult};
use crate::node::GpuGraphExt;
use crate::pool::GpuGraph;

/// How to tile and place a factorization of an `n`×`n` matrix.
///
/// The *panel* work (POTRF of tile column `k`, its TRSMs, and the look-ahead: the updates of
/// column `k + 1` by column `k`) goes to group `panel`, the other updates to `update`. Give the
/// panel group a high stream priority ([`GpuPoolBuilder::stream_priority`]) and turn the
/// stream hand-off off ([`GpuPoolBuilder::stream_handoff`]) so that the critical path runs on
/// the panel workers' streams ahead of the bulk updates; with one group for both, the graph is
/// the same and only the placement differs.
///
/// [`GpuPoolBuilder::stream_priority`]: crate::GpuPoolBuilder::stream_priority
/// [`GpuPoolBuilder::stream_handoff`]: crate::GpuPoolBuilder::stream_handoff
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
}

/// A factorization graph and its last node, which checks every POTRF's `info`.
#[derive(Debug)]
pub struct CholeskyGraph {
    /// The graph (run it any number of times, on a matrix reloaded between runs).
    pub graph: GpuGraph,
    /// The node that reads back the POTRF infos after the factorization (the graph's sink).
    pub check: NodeRef<()>,
    /// Nodes of each kind: POTRF, TRSM, SYRK, GEMM.
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
    ) -> GpuResult<CholeskyGraph> {
        let (n, b, t) = (self.n, self.tile, self.tiles());
        if n == 0 || b == 0 {
            return Err(GpuError::new(
                GpuErrorKind::InvalidArgument,
                format!("cholesky '{name}': n = {n} and tile = {b} must be positive"),
            ));
        }
        if a.len() < n * n || info.len() < t {
            return Err(GpuError::new(
                GpuErrorKind::InvalidArgument,
                format!(
                    "cholesky '{name}': the matrix needs {} elements (has {}), info {t} (has {})",
                    n * n,
                    a.len(),
                    info.len()
                ),
            ));
        }
        let size = move |i: usize| b.min(n - i * b);
        let base = a.device_ptr();
        let tile_ptr = move |i: usize, j: usize| base + ((j * b * n + i * b) * 8) as u64;
        let info_base = info.device_ptr();
        let mut g = GraphBuilder::with_capacity(name.to_owned(), t * t * t / 6 + 2 * t * t, 0);
        // last[i][j]: the node that last wrote tile (i, j), i >= j.
        let mut last: Vec<Vec<Option<boundpool_scheduler::NodeId>>> = vec![vec![None; t]; t];
        let mut counts = [0usize; 4];
        let mut potrf_names = Vec::with_capacity(t);
        let mut sink = None;
        for k in 0..t {
            let keep = (a.clone(), info.clone());
            let nk = size(k);
            let pname = format!("potrf({k})");
            potrf_names.push(pname.clone());
            let p = g.gpu_node_in(self.panel, &pname, move |ctx| {
                let _alive = &keep;
                // SAFETY: tile (k, k) lies inside `a` (kept alive by this closure, which the
                // graph owns), and info[k] inside `info`.
                unsafe {
                    ctx.solver()?.dpotrf(
                        Uplo::Lower,
                        nk,
                        tile_ptr(k, k),
                        n,
                        info_base + 4 * k as u64,
                    )?
                };
                Ok(())
            });
            counts[0] += 1;
            if let Some(prev) = last[k][k] {
                g.edge(prev, p);
            }
            last[k][k] = Some(p.id());
            sink = Some(p.id());
            for i in k + 1..t {
                let keep = a.clone();
                let ni = size(i);
                let r = g.gpu_node_in(self.panel, &format!("trsm({i},{k})"), move |ctx| {
                    let _alive = &keep;
                    // SAFETY: tiles (k, k) and (i, k) lie inside `a`, alive (see above).
                    unsafe {
                        ctx.blas()?.dtrsm(
                            Side::Right,
                            Uplo::Lower,
                            Trans::T,
                            Diag::NonUnit,
                            ni,
                            nk,
                            1.0,
                            tile_ptr(k, k),
                            n,
                            tile_ptr(i, k),
                            n,
                        )?
                    };
                    Ok(())
                });
                counts[1] += 1;
                g.edge(p, r);
                if let Some(prev) = last[i][k] {
                    g.edge(prev, r);
                }
                last[i][k] = Some(r.id());
            }
            for j in k + 1..t {
                let nj = size(j);
                // The updates of column k + 1 are on the critical path: with the panel.
                let group = if j == k + 1 { self.panel } else { self.update };
                let keep = a.clone();
                let s = g.gpu_node_in(group, &format!("syrk({j},{k})"), move |ctx| {
                    let _alive = &keep;
                    // SAFETY: tiles (j, k) and (j, j) lie inside `a`, alive (see above).
                    unsafe {
                        ctx.blas()?.dsyrk(
                            Uplo::Lower,
                            Trans::No,
                            nj,
                            nk,
                            -1.0,
                            tile_ptr(j, k),
                            n,
                            1.0,
                            tile_ptr(j, j),
                            n,
                        )?
                    };
                    Ok(())
                });
                counts[2] += 1;
                g.edge(last[j][k].expect("trsm of (j, k)"), s);
                if let Some(prev) = last[j][j] {
                    g.edge(prev, s);
                }
                last[j][j] = Some(s.id());
                for i in j + 1..t {
                    let ni = size(i);
                    let keep = a.clone();
                    let m = g.gpu_node_in(group, &format!("gemm({i},{j},{k})"), move |ctx| {
                        let _alive = &keep;
                        // SAFETY: tiles (i, k), (j, k) and (i, j) lie inside `a` (see above).
                        unsafe {
                            ctx.blas()?.dgemm(
                                Trans::No,
                                Trans::T,
                                ni,
                                nj,
                                nk,
                                -1.0,
                                tile_ptr(i, k),
                                n,
                                tile_ptr(j, k),
                                n,
                                1.0,
                                tile_ptr(i, j),
                                n,
                            )?
                        };
                        Ok(())
                    });
                    counts[3] += 1;
                    g.edge(last[i][k].expect("trsm of (i, k)"), m);
                    g.edge(last[j][k].expect("trsm of (j, k)"), m);
                    if let Some(prev) = last[i][j] {
                        g.edge(prev, m);
                    }
                    last[i][j] = Some(m.id());
                }
            }
        }
        let keep = info.clone();
        let tile = b;
        let check = g.gpu_node_in(self.panel, "check potrf info", move |ctx| {
            let infos = ctx.download(&keep)?;
            for (k, &v) in infos.iter().take(t).enumerate() {
                if v != 0 {
                    let e = potrf_info_error(&potrf_names[k], v);
                    let order = k * tile + v.max(0) as usize;
                    return Err(Box::new(GpuError::new(
                        e.kind(),
                        format!("{} (tile {k}; order {order} of the whole matrix)", e.message()),
                    )));
                }
            }
            Ok(())
        });
        if let Some(s) = sink {
            g.edge(s, check);
        }
        let graph = g.build().map_err(|e| {
            GpuError::new(GpuErrorKind::Scheduler, format!("cholesky '{name}': {e}")).with_source(e)
        })?;
        Ok(CholeskyGraph {
            graph,
            check,
            counts,
        })
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
    let threads = std::thread::available_parallelism().map_or(1, |p| p.get()).min(16);
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
    pool: &crate::GpuPool,
    device: &crate::GpuDevice,
    a0: &Arc<DeviceBuffer<f64>>,
    l: &Arc<DeviceBuffer<f64>>,
    n: usize,
) -> GpuResult<f64> {
    let (a0, l) = (a0.clone(), l.clone());
    pool.call(device, move |ctx| {
        let blas = ctx.blas()?;
        let eye = ctx.alloc_zeros::<f64>(n * n)?;
        let ones = ctx.upload(&vec![1.0f64; n])?;
        let lower = ctx.alloc::<f64>(n * n)?;
        let mut r = ctx.alloc::<f64>(n * n)?;
        ctx.copy_device(&a0, &mut r)?;
        // SAFETY: every address is a live allocation of this device of the size used (n or
        // n² doubles), kept alive until this node's synchronous norms below have returned.
        unsafe {
            blas.dcopy(n, ones.device_ptr(), 1, eye.device_ptr(), n + 1)?;
            // lower = tril(l) · I, the factor with zeros above the diagonal.
            blas.dtrmm(
                Side::Left,
                Uplo::Lower,
                Trans::No,
                Diag::NonUnit,
                n,
                n,
                1.0,
                l.device_ptr(),
                n,
                eye.device_ptr(),
                n,
                lower.device_ptr(),
                n,
            )?;
            blas.dgemm(
                Trans::No,
                Trans::T,
                n,
                n,
                n,
                -1.0,
                lower.device_ptr(),
                n,
                lower.device_ptr(),
                n,
                1.0,
                r.device_ptr(),
                n,
            )?;
            let nr = blas.dnrm2(n * n, r.device_ptr(), 1)?;
            let na = blas.dnrm2(n * n, a0.device_ptr(), 1)?;
            Ok(nr / na)
        }
    })
}

/// Spot checks of a factorization too large for [`residual_on_device`]: for `samples`
/// pseudo-random entries `(i, j)` of the lower triangle (and the last diagonal entry), the
/// largest `|A_ij − (L Lᵀ)_ij| / sqrt(A_ii A_jj)`, with `(L Lᵀ)_ij` a dot product of two rows
/// of `L` on the device and `A_ij` from [`spd_entry`].
pub fn spot_check_on_device(
    pool: &crate::GpuPool,
    device: &crate::GpuDevice,
    l: &Arc<DeviceBuffer<f64>>,
    n: usize,
    samples: usize,
) -> GpuResult<f64> {
    let l = l.clone();
    pool.call(device, move |ctx| {
        let blas = ctx.blas()?;
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
            let base = l.device_ptr();
            // SAFETY: rows i and j of L, elements 0..=j (j <= i < n), with stride n, lie
            // inside `l` (n² doubles), alive for this synchronous call.
            let dot = unsafe {
                blas.ddot(j + 1, base + 8 * i as u64, n, base + 8 * j as u64, n)?
            };
            let scale = (spd_entry(n, i, i) * spd_entry(n, j, j)).sqrt();
            worst = worst.max((spd_entry(n, i, j) - dot).abs() / scale);
        }
        Ok(worst)
    })
}
