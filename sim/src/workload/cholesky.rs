//! The tiled Cholesky factorization on P ranks: `boundpool-workloads`' tile tasks (those the
//! GPU factorization runs), tile (i, j) owned by rank `(i mod p) q + (j mod q)` of a p × q
//! grid, each task running on the owner of the tile it writes.

use boundpool_scheduler::Priority;
use boundpool_workloads::{tile_tasks, TileOp};

use crate::cost::{CostModel, KindCost};
use crate::error::{SimError, SimErrorKind, SimResult};
use crate::graph::{NodeSpec, SimGraph};
use crate::sharing::SmShare;

/// A factorization to simulate.
#[derive(Clone, Debug, PartialEq)]
pub struct CholeskySpec {
    /// Order of the matrix.
    pub n: usize,
    /// Tile size.
    pub tile: usize,
    /// Ranks, dealt the tiles 2D block-cyclic over [`grid`]`(ranks)`.
    pub ranks: usize,
    /// GPU nodes (else host nodes).
    pub gpu: bool,
    /// The group of POTRF, TRSM and the look-ahead updates (`CholeskyPlan::panel`).
    pub panel_group: usize,
    /// The group of the other updates (`CholeskyPlan::update`).
    pub update_group: usize,
    /// The critical path's nodes at high priority (`CholeskyPlan::critical_high`).
    pub critical_high: bool,
}

impl CholeskySpec {
    /// N, tile, ranks; GPU nodes, panel on group 0 and updates on group 1, the critical
    /// path high (the bench's configuration).
    pub fn new(n: usize, tile: usize, ranks: usize) -> Self {
        CholeskySpec {
            n,
            tile,
            ranks,
            gpu: true,
            panel_group: 0,
            update_group: 1,
            critical_high: true,
        }
    }
}

/// The squarest grid p × q = `ranks` with p <= q.
pub fn grid(ranks: usize) -> (usize, usize) {
    let mut p = (ranks as f64).sqrt().floor() as usize;
    while p > 1 && ranks % p != 0 {
        p -= 1;
    }
    let p = p.max(1);
    (p, ranks / p)
}

/// The kinds of the factorization's nodes and the floating-point operations of a whole tile
/// of each (POTRF, TRSM, SYRK, GEMM): what a cost model's time per kind is for.
pub fn tile_flops(tile: usize) -> [(&'static str, f64); 4] {
    [
        TileOp::Potrf { k: 0 },
        TileOp::Trsm { i: 1, k: 0 },
        TileOp::Syrk { j: 1, k: 0 },
        TileOp::Gemm { i: 2, j: 1, k: 0 },
    ]
    .map(|op| (op.kind_name(), op.flops(tile * 3, tile)))
}

/// A whole tile's operation of the same kind (the cost model's unit).
fn whole(op: &TileOp) -> TileOp {
    match op.kind() {
        0 => TileOp::Potrf { k: 0 },
        1 => TileOp::Trsm { i: 1, k: 0 },
        2 => TileOp::Syrk { j: 1, k: 0 },
        _ => TileOp::Gemm { i: 2, j: 1, k: 0 },
    }
}

/// The factorization's graph: one node per tile task, named as the GPU factorization names
/// it (`gemm(i,j,k)`), of kind `potrf`, `trsm`, `syrk` or `gemm`, its costs scaled by its
/// share of a whole tile's flops (ragged last tiles), its output the tile it writes.
pub fn cholesky(spec: &CholeskySpec) -> SimResult<SimGraph> {
    let (n, b) = (spec.n, spec.tile);
    if n == 0 || b == 0 || spec.ranks == 0 {
        return Err(SimError::new(
            SimErrorKind::InvalidArgument,
            format!(
                "cholesky: n = {n}, tile = {b} and ranks = {} must be positive",
                spec.ranks
            ),
        ));
    }
    let t = n.div_ceil(b);
    let (p, q) = grid(spec.ranks);
    let mut g = SimGraph::new(format!("cholesky n={n} tile={b}"));
    // One datum per lower tile, owned 2D block-cyclic.
    let mut datum = vec![None; t * t];
    for i in 0..t {
        for j in 0..=i {
            let owner = (i % p) * q + (j % q);
            datum[i * t + j] = Some(g.datum(format!("A({i},{j})"), owner));
        }
    }
    let size = |i: usize| b.min(n - i * b) as u64;
    let tasks = tile_tasks(n, b, false);
    for task in &tasks {
        let op = task.op;
        let (wi, wj) = op.writes();
        let group = if task.panel {
            spec.panel_group
        } else {
            spec.update_group
        };
        let priority = if spec.critical_high && task.critical() {
            Priority::High
        } else {
            Priority::Normal
        };
        let kind = op.kind_name();
        let base = if spec.gpu {
            NodeSpec::gpu(kind)
        } else {
            NodeSpec::host(kind)
        };
        let scale = op.flops(n, b) / whole(&op).flops(b * 3, b);
        let node = g.node(
            op.name(),
            datum[wi * t + wj].expect("a lower tile"),
            base.group(group)
                .priority(priority)
                .bytes(size(wi) * size(wj) * 8)
                .scale(scale),
        );
        for &d in &task.deps {
            g.edge(d as u32, node);
        }
        g.flops += op.flops(n, b);
    }
    Ok(g)
}

/// Alone-on-the-GPU rates of the tile kernels at one tile size, and their launch cost.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelRates {
    /// POTRF, TRSM, SYRK, GEMM, TFLOP/s.
    pub tflops: [f64; 4],
    /// The share of the GPU's SMs each holds while it runs (POTRF, TRSM, SYRK, GEMM): from its
    /// rate by [`SmShare`] (the crate docs).
    pub occupancy: [f64; 4],
    /// Host time of a node's body (the library call returning), seconds.
    pub launch_s: f64,
    /// Where the figures come from.
    pub source: String,
}

/// The H100 (80GB HBM3) tile kernels' rates of docs/benchmarks.md ("Tiled Cholesky",
/// 2026-12-05, `bench_cholesky --probe`: each call alone on the GPU) for tiles of 1024, 2048
/// and 4096: GEMM 53-56 TFLOP/s, TRSM 13 / 21 / 31, POTRF 0.7 / 3 / 11.5. Assumed, not
/// measured: SYRK at 32 TFLOP/s (the one DSYRK figure there, a 14,336-wide trailing update)
/// and a node's launch at 8 µs on its worker. Occupancies from the rates by [`SmShare`]
/// with [`SmShare::H100_HELD`].
pub fn h100_rates(tile: usize) -> Option<KernelRates> {
    let (trsm, potrf) = match tile {
        1024 => (13.0, 0.7),
        2048 => (21.0, 3.0),
        4096 => (31.0, 11.5),
        _ => return None,
    };
    let tflops = [potrf, trsm, 32.0, 54.5];
    let share = SmShare::fastest(tflops, SmShare::H100_HELD);
    Some(KernelRates {
        tflops,
        occupancy: tflops.map(|r| share.occupancy(r)),
        launch_s: 8e-6,
        source: format!(
            "H100 tile {tile}: GEMM, TRSM, POTRF measured (docs/benchmarks.md, bench_cholesky --probe, 2026-12-05); SYRK 32 TFLOP/s and 8 us launches assumed; occupancies from the rates (held share {})", share.held
        ),
    })
}

/// A cost model for whole tiles of `tile` from kernel rates.
pub fn cholesky_costs(tile: usize, rates: &KernelRates) -> CostModel {
    let mut m = CostModel {
        source: rates.source.clone(),
        ..CostModel::default()
    };
    for (k, (kind, flops)) in tile_flops(tile).into_iter().enumerate() {
        let rate = rates.tflops[k];
        let secs = flops / (rate * 1e12);
        let occ = rates.occupancy[k];
        m.set(
            kind,
            KindCost::gpu(rates.launch_s, secs, occ)
                .noted(format!("{rate} TFLOP/s at tile {tile}: {}", rates.source)),
        );
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grids_are_square_where_they_can_be() {
        assert_eq!(grid(1), (1, 1));
        assert_eq!(grid(2), (1, 2));
        assert_eq!(grid(8), (2, 4));
        assert_eq!(grid(16), (4, 4));
        assert_eq!(grid(64), (8, 8));
        assert_eq!(grid(7), (1, 7));
    }

    #[test]
    fn owners_and_scales() {
        let g = cholesky(&CholeskySpec::new(4 * 100 + 50, 100, 4)).unwrap();
        let l = boundpool_ranks::lower(&g.desc, 4).unwrap();
        // gemm(i,j,k) runs on the owner of (i, j): (i mod 2) * 2 + (j mod 2).
        for (x, node) in g.desc.nodes.iter().enumerate() {
            if let Some(rest) = node.name.strip_prefix("gemm(") {
                let v: Vec<usize> = rest
                    .trim_end_matches(')')
                    .split(',')
                    .map(|s| s.parse().unwrap())
                    .collect();
                assert_eq!(l.rank_of[x], (v[0] % 2) * 2 + v[1] % 2);
            }
        }
        // The last tile is half a tile: its potrf an eighth of a whole one's flops.
        let last = g
            .desc
            .nodes
            .iter()
            .position(|n| n.name == "potrf(4)")
            .unwrap();
        assert!((g.nodes[last].scale - 0.125).abs() < 1e-12);
        let want = (450f64).powi(3) / 3.0;
        assert!((g.flops / want - 1.0).abs() < 0.05, "{}", g.flops);
    }

    #[test]
    fn costs_from_rates() {
        let m = cholesky_costs(
            1000,
            &KernelRates {
                tflops: [1.0, 10.0, 20.0, 50.0],
                occupancy: [0.02, 1.0, 1.0, 1.0],
                launch_s: 5e-6,
                source: "test".into(),
            },
        );
        let gemm = m.get("gemm").unwrap();
        assert!((gemm.gpu.as_ref().unwrap().mean() - 2e9 / 50e12).abs() < 1e-15);
        assert_eq!(gemm.occupancy, 1.0);
        assert!((m.get("potrf").unwrap().occupancy - 0.02).abs() < 1e-12);
    }
}
