//! `boundpool sim check-cholesky DIR`: the GPU tiled Cholesky recorded at several N against
//! its simulation. Each N's costs come from its one-stream trace; the kernels' occupancies
//! from their rates alone (`SmShare`), with the held share calibrated on one N's 8-worker
//! time (the smallest by default) and used unchanged for the others, which are predictions.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use boundpool_sim::workload::{cholesky as cholesky_graph, tile_flops, CholeskySpec};
use boundpool_sim::{
    kind_of, simulate, CostModel, GpuTransfer, Machine, Network, SimGraph, SimOptions, SimReport,
    SmShare,
};
use boundpool_workloads::median;
use clap::Args;
use serde_json::Value;

use super::{node_spans, read_json, recorded};
use crate::sim::usage;

#[derive(Args, Debug)]
pub(crate) struct CheckCholeskyArgs {
    /// The folder `sim_call.sh` filled (`chol_N.json`, `chol_N_1w.json`, `chol_N_8w.json`).
    dir: PathBuf,
    /// The N whose 8-worker time calibrates the held share (default: the smallest recorded).
    #[arg(long, value_name = "N")]
    calibrate_on: Option<usize>,
    /// Use this held share (0 to 1) instead of calibrating one.
    #[arg(long, conflicts_with = "calibrate_on")]
    held: Option<f64>,
}

/// One N's recording.
struct Recording {
    n: usize,
    tile: usize,
    card: String,
    /// The 8-worker runs, ms.
    ms: Vec<f64>,
    /// Their median, seconds.
    measured_s: f64,
    /// From the one-stream trace (occupancy 1).
    costs: CostModel,
    graph: SimGraph,
}

fn load(dir: &Path, n: usize) -> Result<Recording, String> {
    let meta = read_json(&dir.join(format!("chol_{n}.json")))?;
    let tile = meta["tile"]
        .as_u64()
        .ok_or(format!("chol_{n}.json: no tile"))? as usize;
    let ms: Vec<f64> = meta["ms"]
        .as_array()
        .ok_or(format!("chol_{n}.json: no ms"))?
        .iter()
        .filter_map(Value::as_f64)
        .collect();
    if ms.is_empty() {
        return Err(format!("chol_{n}.json: no runs"));
    }
    let path = dir.join(format!("chol_{n}_1w.json"));
    let costs = CostModel::from_chrome_trace(
        &read_json(&path)?,
        &|n| kind_of(n).to_owned(),
        &path.display().to_string(),
    )
    .map_err(|e| e.to_string())?;
    let graph = cholesky_graph(&CholeskySpec::new(n, tile, 1)).map_err(|e| e.to_string())?;
    Ok(Recording {
        n,
        tile,
        card: meta["card"].as_str().unwrap_or("?").to_owned(),
        measured_s: median(ms.clone()) / 1e3,
        ms,
        costs,
        graph,
    })
}

/// The bench's one GPU: 4 panel workers, 4 update workers.
fn machine() -> Machine {
    Machine::h100_cluster(1, Network::InfiniBand4x200, GpuTransfer::Direct)
}

/// The costs with every kind's occupancy from its rate by `share`; `None`: every kernel
/// filling the GPU.
fn costs_with(rec: &Recording, share: Option<&SmShare>) -> CostModel {
    let mut c = rec.costs.clone();
    if let Some(s) = share {
        c.occupancy_from_rates(&tile_flops(rec.tile), s);
    }
    c
}

fn run(rec: &Recording, share: Option<&SmShare>, trace: bool) -> Result<SimReport, String> {
    let opts = SimOptions {
        trace,
        ..SimOptions::default()
    };
    simulate(&rec.graph, &machine(), &costs_with(rec, share), &opts).map_err(|e| e.to_string())
}

/// The sharing model with `held`, its peak at the recording's fastest kind alone.
fn share(rec: &Recording, held: f64) -> SmShare {
    SmShare::fastest(
        rec.costs
            .rates(&tile_flops(rec.tile))
            .into_iter()
            .map(|(_, r)| r),
        held,
    )
}

/// The held share (in steps of 0.01) whose simulation of `rec` comes closest to its
/// measured time.
fn calibrate(rec: &Recording) -> Result<f64, String> {
    let mut best = (f64::INFINITY, 1.0);
    for k in 0..=100 {
        let share = share(rec, f64::from(k) / 100.0);
        let miss = (run(rec, Some(&share), false)?.makespan_s / rec.measured_s - 1.0).abs();
        if miss < best.0 {
            best = (miss, share.held);
        }
    }
    Ok(best.1)
}

/// Mean device time per kind of node spans, seconds.
fn device_means(spans: impl Iterator<Item = (String, f64)>) -> BTreeMap<String, f64> {
    let mut sums: BTreeMap<String, (f64, usize)> = BTreeMap::new();
    for (name, secs) in spans {
        let s = sums.entry(kind_of(&name).to_owned()).or_default();
        s.0 += secs;
        s.1 += 1;
    }
    sums.into_iter()
        .map(|(k, (s, n))| (k, s / n.max(1) as f64))
        .collect()
}

/// Per kind: its occupancy, and its device time beside the others over its time alone,
/// measured (the 8-worker trace) and simulated.
fn stretches(dir: &Path, rec: &Recording, share: &SmShare) -> Result<String, String> {
    let real = device_means(
        node_spans(&read_json(&dir.join(format!("chol_{}_8w.json", rec.n)))?)
            .into_iter()
            .map(|(n, a, b)| (n, (b - a) / 1e6)),
    );
    let r = run(rec, Some(share), true)?;
    let sim = device_means(
        r.trace
            .iter()
            .flat_map(|t| &t.slices)
            .filter(|s| s.kind == boundpool::SliceKind::Span && s.node.is_some())
            .map(|s| (s.name.clone(), (s.end_ns - s.start_ns) as f64 / 1e9)),
    );
    let costs = costs_with(rec, Some(share));
    let notes: Vec<String> = tile_flops(rec.tile)
        .iter()
        .filter_map(|&(k, _)| {
            let c = costs.kinds.get(k)?;
            let alone = c.gpu.as_ref()?.mean();
            Some(format!(
                "{k} {:.2} ({:.2}x, simulated {:.2}x)",
                c.occupancy,
                real.get(k).copied().unwrap_or(f64::NAN) / alone,
                sim.get(k).copied().unwrap_or(f64::NAN) / alone
            ))
        })
        .collect();
    Ok(notes.join(", "))
}

fn row(rec: &Recording, share: &SmShare, role: &str) -> Result<String, String> {
    let r = run(rec, Some(share), false)?;
    let full = run(rec, None, false)?;
    let ratio = r.makespan_s / rec.measured_s;
    let runs: Vec<String> = rec.ms.iter().map(|v| format!("{v:.1}")).collect();
    Ok(format!(
        "| {} | {} | {} | {:.1} ({}) | {:.1} | {ratio:.2} | {} | {role} | {:.2} | {} |",
        rec.n,
        rec.tile,
        rec.card,
        rec.measured_s * 1e3,
        runs.join(", "),
        r.makespan_s * 1e3,
        if (ratio - 1.0).abs() <= 0.10 {
            "yes"
        } else {
            "**no**"
        },
        full.makespan_s / rec.measured_s,
        r.limit()
    ))
}

fn check(a: &CheckCholeskyArgs) -> Result<(), String> {
    let ns = recorded(&a.dir, "chol_", ".json")?;
    let recs: Vec<Recording> = ns
        .iter()
        .map(|&n| load(&a.dir, n))
        .collect::<Result<_, _>>()?;
    let (held, on) = match (a.held, a.calibrate_on) {
        (Some(h), _) if (0.0..=1.0).contains(&h) => (h, None),
        (Some(h), _) => return Err(format!("--held {h} is not in 0..1")),
        (None, on) => {
            let n = on.unwrap_or(ns[0]);
            let rec = recs
                .iter()
                .find(|r| r.n == n)
                .ok_or(format!("--calibrate-on {n}: no chol_{n}.json"))?;
            (calibrate(rec)?, Some(n))
        }
    };
    match on {
        Some(n) => println!(
            "held share {held:.2}, calibrated on N = {n} (its 8-worker time); every other N is predicted"
        ),
        None => println!("held share {held:.2}, given; every N is predicted"),
    }
    println!(
        "occupancy = busy + (1 - busy) x held, busy = rate alone / the fastest kind's rate alone\n"
    );
    println!("| N | tile | card | measured ms (runs) | predicted ms | predicted / measured | within 10% | role | every kernel filling the GPU: predicted / measured | limit (simulated) |");
    println!("| ---: | ---: | --- | ---: | ---: | ---: | --- | --- | ---: | --- |");
    for rec in &recs {
        let role = if on == Some(rec.n) {
            "calibration"
        } else {
            "prediction"
        };
        let share = share(rec, held);
        println!("{}", row(rec, &share, role)?);
        println!(
            "|  | occupancy (device time beside others / alone, measured and simulated), fastest {:.1} TFLOP/s: {} | | | | | | | | |",
            share.peak_tflops,
            stretches(&a.dir, rec, &share)?
        );
    }
    Ok(())
}

pub(crate) fn cholesky(a: CheckCholeskyArgs) -> ExitCode {
    match check(&a) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => usage(e),
    }
}
