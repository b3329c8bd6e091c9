//! A distributed tiled matrix-vector product, y = A·x, host only: every rank builds the same
//! graph; the tiles of A are data dealt 2D block-cyclic over a grid of ranks, and each node
//! runs on the rank that owns what it writes (owner computes). A tile's partial product is
//! made where the tile lives; x's tiles travel to the ranks that need them, once per rank; the
//! partial products travel to the owner of y's tile, which sums them. Rank 0 gathers a summary
//! (a serde value) and checks y against a one-process product.
//!
//! ```sh
//! cargo build --release --features mpi --example ranks_matvec
//! mpirun -np 4 target/release/examples/ranks_matvec        # or: srun -n 4 …
//! ```

use boundpool::ranks::{RankGraphBuilder, RanksBuilder};
use serde::{Deserialize, Serialize};

/// Tiles per side, and tile size.
const T: usize = 8;
const B: usize = 128;

fn a(i: usize, j: usize) -> f64 {
    ((i * 31 + j * 17) % 97) as f64 / 97.0 - 0.5
}

fn x(j: usize) -> f64 {
    (j % 13) as f64 / 13.0
}

/// What rank 0 gathers.
#[derive(Serialize, Deserialize, Debug)]
struct Summary {
    tiles: usize,
    norm2: f64,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let ranks = RanksBuilder::new().workers(2).build_mpi()?;
    let p = ranks.size();
    // A near-square grid of ranks: pr × pc.
    let pr = (1..=p)
        .rev()
        .find(|d| p % d == 0 && d * d <= p)
        .unwrap_or(1);
    let pc = p / pr;
    let owner = |i: usize, j: usize| (i % pr) * pc + (j % pc);

    let mut g = RankGraphBuilder::new("matvec");
    // x's tiles, one per column of tiles, on the ranks of grid row 0.
    let xs: Vec<_> = (0..T)
        .map(|j| {
            let d = g.datum(format!("x[{j}]"), owner(0, j));
            g.plain_node(d, format!("x[{j}]"), move |_| {
                Ok((0..B).map(|k| x(j * B + k)).collect::<Vec<f64>>())
            })
        })
        .collect();
    // Partial products on the owners of A's tiles (made there: A never moves).
    let mut partial = vec![Vec::new(); T];
    for (i, row) in partial.iter_mut().enumerate() {
        for (j, &xj) in xs.iter().enumerate() {
            let d = g.datum(format!("A[{i},{j}]"), owner(i, j));
            let n = g.plain_node(d, format!("A[{i},{j}]·x[{j}]"), move |ctx| {
                let x = ctx.input(xj)?;
                let y: Vec<f64> = (0..B)
                    .map(|r| (0..B).map(|c| a(i * B + r, j * B + c) * x[c]).sum())
                    .collect();
                Ok(y)
            });
            g.edge(xj, n);
            row.push(n);
        }
    }
    // y's tiles, summed on the owner of the diagonal tile of their row.
    let ys: Vec<_> = partial
        .iter()
        .enumerate()
        .map(|(i, parts)| {
            let d = g.datum(format!("y[{i}]"), owner(i, i));
            let inputs = parts.clone();
            let y = g.plain_node(d, format!("y[{i}]"), move |ctx| {
                let mut y = vec![0.0f64; B];
                for &part in &inputs {
                    for (acc, v) in y.iter_mut().zip(ctx.input(part)?) {
                        *acc += v;
                    }
                }
                Ok(y)
            });
            for &part in parts {
                g.edge(part, y);
            }
            y
        })
        .collect();
    // A serde summary on rank 0, and the y tiles gathered there for the check.
    let inputs = ys.clone();
    let summary = g.serde_node(0, "summary", move |ctx| {
        let mut norm2 = 0.0;
        for &y in &inputs {
            norm2 += ctx.input(y)?.iter().map(|v| v * v).sum::<f64>();
        }
        Ok(Summary { tiles: T, norm2 })
    });
    for &y in &ys {
        g.edge(y, summary);
    }
    let graph = g.build(&ranks)?;
    let out = ranks.run(&graph)?;
    let transfers = graph.lowering().transfers.len();
    if ranks.rank() == 0 {
        let s = out.get(summary).expect("the summary ran on rank 0");
        let mut max_err = 0f64;
        for (i, &y) in ys.iter().enumerate() {
            let got = out.get(y).expect("every y tile reaches rank 0");
            for (r, v) in got.iter().enumerate() {
                let want: f64 = (0..T * B).map(|c| a(i * B + r, c) * x(c)).sum();
                max_err = max_err.max((v - want).abs());
            }
        }
        assert!(
            max_err < 1e-9,
            "y differs from the one-process product by {max_err}"
        );
        println!(
            "y = A·x on {p} ranks ({pr}×{pc} grid, {T}×{T} tiles of {B}): |y|² = {:.6}, {} tiles, \
             {transfers} transfers, max error against one process {max_err:.1e}",
            s.norm2, s.tiles
        );
    }
    Ok(())
}
