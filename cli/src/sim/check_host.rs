//! `boundpool sim check-host`: random host DAGs (`boundpool_sim::workload::RandomDag`) run
//! here over the in-process network on 1, 2 and 4 ranks, against their simulation.
//!
//! What the simulation is given, all measured in the same process just before: the node
//! kinds' costs from the one-rank run's trace; the link's latency from a chain of 8-byte
//! values hopping between two ranks (what the chain takes beyond its simulation without
//! latency) and its bandwidth from the same chain with 1 MiB values; this machine's cores.
//! Nothing is fitted to the DAG runs themselves.

use std::process::ExitCode;
use std::sync::Barrier;
use std::time::Instant;

use boundpool::Cores;
use boundpool_ranks::{LocalNetwork, RankGraphBuilder, Ranks, RanksBuilder};
use boundpool_sim::workload::RandomDag;
use boundpool_sim::{
    kind_of, simulate, CostModel, KindCost, Machine, NodeSpec, SimGraph, SimOptions,
};
use boundpool_workloads::median;
use clap::Args;

use super::usage;

#[derive(Args, Debug)]
pub(crate) struct CheckHostArgs {
    /// Rank counts.
    #[arg(long, value_delimiter = ',', default_values_t = [1, 2, 4])]
    ranks: Vec<usize>,
    /// Nodes of each DAG.
    #[arg(long, default_value_t = 2000)]
    nodes: usize,
    /// Workers a rank.
    #[arg(long, default_value_t = 1)]
    workers: usize,
    /// Work of a light node, µs (a heavy one does 4 times as much).
    #[arg(long, default_value_t = 50)]
    work_us: u64,
    /// Timed runs of each (after one untimed).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Seeds the DAG.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Rounds (each measures the free cores, the costs, the link and every rank count).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Write the first round's one-rank cost model here.
    #[arg(long, value_name = "OUT.json")]
    costs_out: Option<std::path::PathBuf>,
}

/// CPU work: `iters` rounds of xorshift (a fixed amount of work, not a wall-clock spin, so
/// that threads sharing a core take longer, as the simulator's processor sharing says).
fn work(iters: u64) -> u64 {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..iters {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
    }
    std::hint::black_box(x)
}

/// Iterations of [`work`] a microsecond, best of five.
fn calibrate() -> f64 {
    let n = 2_000_000;
    (0..5)
        .map(|_| {
            let t = Instant::now();
            work(n);
            n as f64 / (t.elapsed().as_secs_f64() * 1e6)
        })
        .fold(0.0, f64::max)
}

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// A graph every rank builds: `(name, rank, iterations, bytes, preds)` per node.
type Nodes = Vec<(String, usize, u64, u64, Vec<u32>)>;

/// A real run's timed runs (seconds) and, when traced, rank 0's timeline.
type Measured = (Vec<f64>, Option<boundpool::Trace>);

/// One comparison: ranks, transfers, measured and predicted seconds.
type Row = (usize, usize, f64, f64);

/// Runs `nodes` on `ranks` ranks of `workers` over the in-process network, once untimed and
/// `runs` times timed (each the slowest rank's time); with `trace`, rank 0's timeline of
/// the timed runs.
fn real(
    nodes: &Nodes,
    ranks: usize,
    workers: usize,
    runs: usize,
    trace: bool,
) -> Result<Measured, String> {
    let net = LocalNetwork::new(ranks);
    let rts: Vec<Ranks> = (0..ranks)
        .map(|r| {
            RanksBuilder::new()
                .workers(workers)
                .cores(Cores::Unpinned)
                .trace(trace)
                .build_local(&net, r)
        })
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let barrier = Barrier::new(ranks);
    let out: Vec<Result<Measured, String>> = std::thread::scope(|s| {
        let hs: Vec<_> = rts
            .iter()
            .map(|rt| {
                let barrier = &barrier;
                s.spawn(move || {
                    let mut g = RankGraphBuilder::new("check");
                    let mut refs = Vec::with_capacity(nodes.len());
                    for (name, rank, iters, bytes, preds) in nodes {
                        let inputs: Vec<_> = preds.iter().map(|&p| refs[p as usize]).collect();
                        let (iters, bytes) = (*iters, *bytes as usize);
                        let r = g.plain_node(*rank, name.clone(), move |ctx| {
                            let mut acc = work(iters);
                            for &i in &inputs {
                                let v: &Vec<u8> = ctx.input(i)?;
                                acc = acc.wrapping_add(v.first().copied().unwrap_or(0) as u64);
                            }
                            Ok(vec![acc as u8; bytes])
                        });
                        for &p in preds {
                            g.edge(refs[p as usize], r);
                        }
                        refs.push(r);
                    }
                    g.runs_in_flight(1);
                    let graph = g.build(rt).map_err(|e| e.to_string())?;
                    let mut times = Vec::new();
                    for k in 0..=runs {
                        barrier.wait();
                        if k == 1 && trace {
                            drop(rt.pool().take_trace());
                        }
                        let t = Instant::now();
                        rt.run(&graph).map_err(|e| e.to_string())?;
                        times.push(t.elapsed().as_secs_f64());
                    }
                    let tr = (trace && rt.rank() == 0).then(|| rt.pool().take_trace());
                    Ok((times[1..].to_vec(), tr))
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("a rank panicked".into())))
            .collect()
    });
    let mut slowest = vec![0.0f64; runs];
    let mut trace_out = None;
    for r in out {
        let (times, tr) = r?;
        for (s, t) in slowest.iter_mut().zip(times) {
            *s = s.max(t);
        }
        trace_out = trace_out.or(tr);
    }
    Ok((slowest, trace_out))
}

/// A chain of `len` nodes alternating between ranks 0 and 1, each passing `bytes` on.
fn chain(len: usize, bytes: u64) -> Nodes {
    (0..len)
        .map(|i| {
            let preds = if i == 0 { vec![] } else { vec![i as u32 - 1] };
            (format!("hop {i}"), i % 2, 0, bytes, preds)
        })
        .collect()
}

fn sim_graph(nodes: &Nodes, name: &str) -> SimGraph {
    let mut g = SimGraph::new(name);
    for (n, rank, _, bytes, preds) in nodes {
        let x = g.node(n.clone(), *rank, NodeSpec::host(kind_of(n)).bytes(*bytes));
        for &p in preds {
            g.edge(p, x);
        }
    }
    g
}

/// The link's latency and bandwidth: the 8-byte chain's time beyond its simulation without
/// latency, and the 1 MiB chain's extra time per byte.
fn calibrate_link(workers: usize, runs: usize, hop: f64) -> Result<(f64, f64), String> {
    let (small, big, hops) = (chain(400, 8), chain(40, 1 << 20), 399.0);
    let t_small = median(real(&small, 2, workers, runs, false)?.0);
    let t_big = median(real(&big, 2, workers, runs, false)?.0);
    let mut m = Machine::dev_host(2, workers);
    m.cores_per_host = cores();
    m.links.shm.latency_s = 0.0;
    m.links.shm.bandwidth_gb_s = 1e6;
    let mut c = CostModel::default();
    c.set("hop", KindCost::host(hop));
    let sim = simulate(&sim_graph(&small, "chain"), &m, &c, &SimOptions::default())
        .map_err(|e| e.to_string())?;
    let latency = ((t_small - sim.makespan_s) / hops).max(0.0);
    let per_byte = ((t_big - t_small * 39.0 / hops) / 39.0 / (1 << 20) as f64).max(1e-12);
    Ok((latency, 1.0 / per_byte / 1e9))
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get())
}

/// The cores this process gets now: one thread's fixed work against two threads' at once
/// (another process on the machine takes its share). Printed with each round: the check is
/// only meaningful on a machine nobody else loads.
fn effective_cores() -> f64 {
    let n = 20_000_000;
    let t = Instant::now();
    work(n);
    let one = t.elapsed().as_secs_f64();
    let t = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| work(n));
        }
    });
    let two = t.elapsed().as_secs_f64();
    (2.0 * one / two).clamp(0.5, cores() as f64)
}

/// One round: the cores this process gets, the one-rank run (traced: the costs), the link,
/// then each rank count's real run and its simulation.
fn round(a: &CheckHostArgs, unit: u64, k: usize) -> Result<Vec<Row>, String> {
    let cores_now = effective_cores();
    let dag_of = |ranks: usize| RandomDag::new(a.nodes, ranks, a.seed);
    let nodes_of = |dag: &RandomDag| -> Nodes {
        dag.draw()
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let units = dag.classes[n.class].1 as u64;
                (
                    dag.name(i, n),
                    n.rank,
                    units * unit,
                    n.bytes,
                    n.preds.clone(),
                )
            })
            .collect()
    };
    let (t1, trace) = real(&nodes_of(&dag_of(1)), 1, a.workers, a.runs, true)?;
    let trace = trace.ok_or("no trace from rank 0")?;
    let costs = CostModel::from_trace(&trace, &|n| kind_of(n).to_owned(), "check-host, 1 rank");
    if let (Some(p), 0) = (&a.costs_out, k) {
        costs.save(p).map_err(|e| e.to_string())?;
    }
    let (latency, gb_s) = if a.ranks.iter().any(|&r| r > 1) {
        calibrate_link(a.workers, a.runs, 0.5e-6)?
    } else {
        (0.0, 1.0)
    };
    let kinds: Vec<String> = costs
        .kinds
        .iter()
        .map(|(k, c)| format!("{k} {:.1} us", c.host.mean() * 1e6))
        .collect();
    println!(
        "round {k}: {cores_now:.2} cores free, load {}; costs (means) {}; link {:.1} us, {:.2} GB/s",
        load(),
        kinds.join(", "),
        latency * 1e6,
        gb_s
    );
    let mut rows = Vec::new();
    for &ranks in &a.ranks {
        let dag = dag_of(ranks);
        let measured = if ranks == 1 {
            t1.clone()
        } else {
            real(&nodes_of(&dag), ranks, a.workers, a.runs, false)?.0
        };
        let mut m = Machine::dev_host(ranks, a.workers);
        m.cores_per_host = cores();
        m.links.shm.latency_s = latency;
        m.links.shm.bandwidth_gb_s = gb_s;
        let g = dag.sim_graph();
        let mut predicted = Vec::new();
        for seed in 0..3 {
            let o = SimOptions {
                seed: a.seed + seed,
                ..SimOptions::default()
            };
            predicted.push(
                simulate(&g, &m, &costs, &o)
                    .map_err(|e| e.to_string())?
                    .makespan_s,
            );
        }
        let transfers = boundpool_ranks::lower(&g.desc, ranks)
            .map_err(|e| e.to_string())?
            .transfers
            .len();
        rows.push((ranks, transfers, median(measured), median(predicted)));
    }
    Ok(rows)
}

pub(crate) fn main(a: CheckHostArgs) -> ExitCode {
    if a.ranks.is_empty() || a.ranks.contains(&0) || a.workers == 0 || a.runs == 0 {
        return usage("--ranks, --workers and --runs must be positive");
    }
    let per_us = calibrate();
    println!(
        "{} cores, load {}; light node {} us of work ({:.0} iterations/us), {} rounds",
        cores(),
        load(),
        a.work_us,
        per_us,
        a.rounds
    );
    let unit = (per_us * a.work_us as f64) as u64;
    let mut all: Vec<Vec<Row>> = Vec::new();
    for k in 0..a.rounds {
        match round(&a, unit, k) {
            Ok(rows) => all.push(rows),
            Err(e) => {
                eprintln!("boundpool sim check-host: {e}");
                return ExitCode::from(1);
            }
        }
    }
    println!("\n| ranks | workers | nodes | transfers | measured ms (each round) | predicted ms | predicted / measured (each round) | median |");
    println!("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for (i, &ranks) in a.ranks.iter().enumerate() {
        let rows: Vec<_> = all.iter().map(|r| r[i]).collect();
        let list = |f: &dyn Fn(&Row) -> f64, scale: f64, prec: usize| {
            rows.iter()
                .map(|r| format!("{:.*}", prec, f(r) * scale))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let ratios: Vec<f64> = rows.iter().map(|r| r.3 / r.2).collect();
        println!(
            "| {ranks} | {} | {} | {} | {} | {} | {} | {:.2} |",
            a.workers,
            a.nodes,
            rows[0].1,
            list(&|r| r.2, 1e3, 1),
            list(&|r| r.3, 1e3, 1),
            list(&|r| r.3 / r.2, 1.0, 2),
            median(ratios)
        );
    }
    println!("\nload after: {}", load());
    ExitCode::SUCCESS
}
