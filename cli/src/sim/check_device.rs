//! `boundpool sim check-cholesky` and `check-serve`: what the GPU machine recorded
//! (`benches/device/sim_call.sh`, `sim_record`) against its simulation. Only the recorded
//! files are needed; the costs come from the one-stream (Cholesky) or one-client (serving)
//! trace, the measurements from the other runs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use boundpool_sim::workload::{cholesky as cholesky_graph, CholeskySpec};
use boundpool_sim::{
    kind_of, simulate, CostModel, GpuTransfer, GroupDesc, KindCost, Machine, Network, NodeSpec,
    SimGraph, SimOptions,
};
use boundpool_workloads::median;
use clap::Args;
use serde_json::Value;

use super::usage;

#[derive(Args, Debug)]
pub(crate) struct CheckCholeskyArgs {
    /// The folder `sim_call.sh` filled (`chol_N.json`, `chol_N_1w.json`, `chol_N_8w.json`).
    dir: PathBuf,
}

#[derive(Args, Debug)]
pub(crate) struct CheckServeArgs {
    /// The folder `sim_call.sh` filled (`serve_C.json`, `serve_C_measured.json`).
    dir: PathBuf,
}

fn read_json(path: &Path) -> Result<Value, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{} is not JSON: {e}", path.display()))
}

fn costs_of(path: &Path) -> Result<CostModel, String> {
    CostModel::from_chrome_trace(
        &read_json(path)?,
        &|n| kind_of(n).to_owned(),
        &path.display().to_string(),
    )
    .map_err(|e| e.to_string())
}

/// Mean device time per kind in a Chrome trace (seconds).
fn device_means(trace: &Value) -> BTreeMap<String, f64> {
    let mut sums: BTreeMap<String, (f64, usize)> = BTreeMap::new();
    for e in trace["traceEvents"].as_array().into_iter().flatten() {
        if e["ph"] == "X" && e["args"]["kind"] == "span" && !e["args"]["node"].is_null() {
            if let (Some(n), Some(d)) = (e["name"].as_str(), e["dur"].as_f64()) {
                let s = sums.entry(kind_of(n).to_owned()).or_default();
                s.0 += d / 1e6;
                s.1 += 1;
            }
        }
    }
    sums.into_iter()
        .map(|(k, (s, n))| (k, s / n.max(1) as f64))
        .collect()
}

/// The simulated trace's mean kernel time per kind.
fn sim_device_means(trace: &boundpool::Trace) -> BTreeMap<String, f64> {
    let mut sums: BTreeMap<String, (f64, usize)> = BTreeMap::new();
    for s in &trace.slices {
        if s.kind == boundpool::SliceKind::Span && s.node.is_some() {
            let e = sums.entry(kind_of(&s.name).to_owned()).or_default();
            e.0 += (s.end_ns - s.start_ns) as f64 / 1e9;
            e.1 += 1;
        }
    }
    sums.into_iter()
        .map(|(k, (s, n))| (k, s / n.max(1) as f64))
        .collect()
}

fn cholesky_row(dir: &Path, n: usize) -> Result<(), String> {
    let meta = read_json(&dir.join(format!("chol_{n}.json")))?;
    let tile = meta["tile"].as_u64().ok_or("chol_N.json: no tile")? as usize;
    let ms: Vec<f64> = meta["ms"]
        .as_array()
        .ok_or("chol_N.json: no ms")?
        .iter()
        .filter_map(Value::as_f64)
        .collect();
    let measured = median(ms.clone()) / 1e3;
    let costs = costs_of(&dir.join(format!("chol_{n}_1w.json")))?;
    let m = Machine::h100_cluster(1, Network::InfiniBand4x200, GpuTransfer::Direct);
    let g = cholesky_graph(&CholeskySpec::new(n, tile, 1)).map_err(|e| e.to_string())?;
    let opts = SimOptions {
        trace: true,
        ..SimOptions::default()
    };
    let r = simulate(&g, &m, &costs, &opts).map_err(|e| e.to_string())?;
    let ratio = r.makespan_s / measured;
    println!(
        "| {n} | {tile} | {} | {:.1} ({}) | {:.1} | {ratio:.2} | {} | {} |",
        meta["card"].as_str().unwrap_or("?"),
        measured * 1e3,
        ms.iter()
            .map(|v| format!("{v:.1}"))
            .collect::<Vec<_>>()
            .join(", "),
        r.makespan_s * 1e3,
        if (ratio - 1.0).abs() <= 0.10 {
            "yes"
        } else {
            "**no**"
        },
        r.limit()
    );
    // Where a miss comes from: each kind's device time beside the others (the 8-worker
    // trace, and the simulation) over its time alone (the one-worker trace).
    let real = device_means(&read_json(&dir.join(format!("chol_{n}_8w.json")))?);
    let sim = r.trace.as_ref().map(sim_device_means).unwrap_or_default();
    let notes: Vec<String> = costs
        .kinds
        .iter()
        .filter_map(|(k, c)| {
            let alone = c.gpu.as_ref()?.mean();
            Some(format!(
                "{k} {:.2}x (simulated {:.2}x)",
                real.get(k).copied().unwrap_or(f64::NAN) / alone,
                sim.get(k).copied().unwrap_or(f64::NAN) / alone
            ))
        })
        .collect();
    println!(
        "|  | device time beside others / alone: {} | | | | | |",
        notes.join(", ")
    );
    Ok(())
}

pub(crate) fn cholesky(a: CheckCholeskyArgs) -> ExitCode {
    let mut ns: Vec<usize> = match std::fs::read_dir(&a.dir) {
        Ok(d) => d
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                name.strip_prefix("chol_")?
                    .strip_suffix(".json")?
                    .parse()
                    .ok()
            })
            .collect(),
        Err(e) => return usage(format!("cannot read {}: {e}", a.dir.display())),
    };
    ns.sort_unstable();
    if ns.is_empty() {
        return usage(format!("{}: no chol_N.json", a.dir.display()));
    }
    println!("| N | tile | card | measured ms (runs) | predicted ms | predicted / measured | within 10% | limit (simulated) |");
    println!("| ---: | ---: | --- | ---: | ---: | ---: | --- | --- |");
    for n in ns {
        if let Err(e) = cholesky_row(&a.dir, n) {
            return usage(e);
        }
    }
    ExitCode::SUCCESS
}

/// A request's kinds in order (from the one-client trace: each kind whose count is about the
/// number of requests, ordered by its first start), and which run on the GPU.
fn request_kinds(trace: &Value, requests: f64, costs: &CostModel) -> Vec<(String, bool)> {
    let mut first: BTreeMap<String, (f64, usize)> = BTreeMap::new();
    for e in trace["traceEvents"].as_array().into_iter().flatten() {
        let host = e["ph"] == "X" && e["args"]["kind"].is_null();
        if let (true, Some(n), Some(ts)) = (host, e["name"].as_str(), e["ts"].as_f64()) {
            let f = first
                .entry(kind_of(n).to_owned())
                .or_insert((f64::INFINITY, 0));
            f.0 = f.0.min(ts);
            f.1 += 1;
        }
    }
    let mut kinds: Vec<(f64, String)> = first
        .into_iter()
        // (`client` is the check's own kind: a real trace has no client threads' slices.)
        .filter(|(k, (_, c))| (*c as f64) >= 0.8 * requests && k != "client")
        .map(|(k, (ts, _))| (ts, k))
        .collect();
    kinds.sort_by(|a, b| a.0.total_cmp(&b.0));
    kinds
        .into_iter()
        .map(|(_, k)| {
            let gpu = costs.kinds.get(&k).is_some_and(|c| c.gpu.is_some());
            (k, gpu)
        })
        .collect()
}

/// Every client's requests back to back: its own work (`client`, on its thread) and the
/// request's nodes, chained.
fn serve_graph(clients: usize, requests: usize, kinds: &[(String, bool)]) -> SimGraph {
    let mut g = SimGraph::new(format!("served model, {clients} clients"));
    let mut id = 0usize;
    for _ in 0..clients {
        let mut prev: Option<u32> = None;
        for _ in 0..requests {
            let steps = std::iter::once(("client".to_owned(), false, 1usize))
                .chain(kinds.iter().map(|(k, gpu)| (k.clone(), *gpu, 0usize)));
            for (kind, gpu, group) in steps {
                let spec = if gpu {
                    NodeSpec::gpu(&kind)
                } else {
                    NodeSpec::host(&kind)
                };
                let x = g.node(format!("{kind} {id}"), 0, spec.group(group));
                id += 1;
                if let Some(p) = prev {
                    g.edge(p, x);
                }
                prev = Some(x);
            }
        }
    }
    g
}

/// One device with 8 workers (the bench's pool: 200 µs spins) and a thread per client.
fn serve_machine(clients: usize) -> Machine {
    let mut m = Machine::h100_cluster(1, Network::InfiniBand4x200, GpuTransfer::Direct);
    m.cores_per_host = 16;
    m.groups = vec![
        GroupDesc {
            name: "workers".into(),
            workers: 8,
            gpu: true,
            high_streams: false,
        },
        GroupDesc {
            name: "clients".into(),
            workers: clients,
            gpu: false,
            high_streams: false,
        },
    ];
    m.sched.spin_s = 200e-6;
    m
}

fn predict_rps(clients: usize, kinds: &[(String, bool)], costs: &CostModel) -> Result<f64, String> {
    let requests = 200;
    let g = serve_graph(clients, requests, kinds);
    let r = simulate(&g, &serve_machine(clients), costs, &SimOptions::default())
        .map_err(|e| e.to_string())?;
    Ok((clients * requests) as f64 / r.makespan_s)
}

/// The GPU kinds' concurrency in a trace (their summed time over the time any ran) and their
/// mean time.
fn concurrency(trace: &Value, gpu_kinds: &[String]) -> (f64, f64) {
    let mut spans: Vec<(f64, f64)> = trace["traceEvents"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["ph"] == "X" && e["args"]["kind"] == "span" && !e["args"]["node"].is_null())
        .filter(|e| {
            e["name"]
                .as_str()
                .is_some_and(|n| gpu_kinds.iter().any(|k| k == kind_of(n)))
        })
        .filter_map(|e| Some((e["ts"].as_f64()?, e["ts"].as_f64()? + e["dur"].as_f64()?)))
        .collect();
    spans.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total: f64 = spans.iter().map(|s| s.1 - s.0).sum();
    let (mut union, mut end) = (0.0, f64::NEG_INFINITY);
    for &(s, e) in &spans {
        if s > end {
            union += e - s;
            end = e;
        } else if e > end {
            union += e - end;
            end = e;
        }
    }
    (
        total / union.max(1e-9),
        total / spans.len().max(1) as f64 / 1e6,
    )
}

/// What `check-serve` finds: the request's kinds, the occupancy the largest client count
/// implies, and per client count (clients, measured, predicted with occupancy 1, predicted
/// with the implied one) in requests a second.
struct ServeCheck {
    think_s: f64,
    kinds: Vec<(String, bool)>,
    largest: usize,
    concurrency: f64,
    stretch: f64,
    implied: f64,
    rows: Vec<(usize, f64, f64, f64)>,
}

fn serve_check(dir: &Path) -> Result<ServeCheck, String> {
    let mut cs: Vec<usize> = std::fs::read_dir(dir)
        .map_err(|e| format!("cannot read {}: {e}", dir.display()))?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.strip_prefix("serve_")?
                .strip_suffix("_measured.json")?
                .parse()
                .ok()
        })
        .collect();
    cs.sort_unstable();
    let one = *cs.first().ok_or("no serve_C_measured.json")?;
    let m1 = read_json(&dir.join(format!("serve_{one}_measured.json")))?;
    let t1 = read_json(&dir.join(format!("serve_{one}.json")))?;
    let mut costs =
        CostModel::from_chrome_trace(&t1, &|n| kind_of(n).to_owned(), "serve, 1 client")
            .map_err(|e| e.to_string())?;
    let think_s = m1["think_us"].as_f64().unwrap_or(0.0) * 1e-6;
    costs.set(
        "client",
        KindCost::host(think_s).noted("measured: the client's time between requests"),
    );
    let requests = m1["requests"].as_f64().unwrap_or(0.0);
    let kinds = request_kinds(&t1, requests, &costs);
    let gpu_kinds: Vec<String> = kinds.iter().filter(|k| k.1).map(|k| k.0.clone()).collect();
    if gpu_kinds.is_empty() {
        return Err("the one-client trace has no GPU node in every request".into());
    }
    // The GPU kinds' occupancy as the largest client count's trace implies it: concurrent
    // kernels stretched by `stretch` at concurrency `c` share the GPU as if each took
    // stretch / c of it (the fluid model's speed 1 / (c × occupancy)).
    let largest = *cs.last().expect("one at least");
    let (concurrency, mean_busy) = self::concurrency(
        &read_json(&dir.join(format!("serve_{largest}.json")))?,
        &gpu_kinds,
    );
    let alone: f64 = gpu_kinds
        .iter()
        .filter_map(|k| costs.kinds.get(k)?.gpu.as_ref().map(|d| d.mean()))
        .sum::<f64>()
        / gpu_kinds.len() as f64;
    let stretch = mean_busy / alone.max(1e-12);
    let implied = (stretch / concurrency.max(1.0)).clamp(0.01, 1.0);
    let mut fitted = costs.clone();
    for k in &gpu_kinds {
        if let Some(c) = fitted.kinds.get_mut(k) {
            c.occupancy = implied;
        }
    }
    let mut rows = Vec::new();
    for &c in &cs {
        let mc = read_json(&dir.join(format!("serve_{c}_measured.json")))?;
        let rps = mc["rps"].as_f64().unwrap_or(f64::NAN);
        rows.push((
            c,
            rps,
            predict_rps(c, &kinds, &costs)?,
            predict_rps(c, &kinds, &fitted)?,
        ));
    }
    Ok(ServeCheck {
        think_s,
        kinds,
        largest,
        concurrency,
        stretch,
        implied,
        rows,
    })
}

fn print_serve(s: &ServeCheck) {
    println!(
        "request: client ({:.1} us) -> {}",
        s.think_s * 1e6,
        s.kinds
            .iter()
            .map(|(k, g)| format!("{k}{}", if *g { " (GPU)" } else { "" }))
            .collect::<Vec<_>>()
            .join(" -> ")
    );
    println!(
        "{} clients' trace: GPU work {:.2} deep on average, each {:.2}x its time alone: implied \
         occupancy {:.2}",
        s.largest, s.concurrency, s.stretch, s.implied
    );
    println!(
        "\n| clients | measured req/s | predicted, occupancy 1 | ratio | predicted, occupancy {:.2} (from {} clients) | ratio |",
        s.implied, s.largest
    );
    println!("| ---: | ---: | ---: | ---: | ---: | ---: |");
    for &(c, rps, p1, p2) in &s.rows {
        println!(
            "| {c} | {rps:.0} | {p1:.0} | {:.2} | {p2:.0} | {:.2} |",
            p1 / rps,
            p2 / rps
        );
    }
}

pub(crate) fn serve(a: CheckServeArgs) -> ExitCode {
    match serve_check(&a.dir) {
        Ok(s) => {
            print_serve(&s);
            ExitCode::SUCCESS
        }
        Err(e) => usage(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Recordings made by the simulator (a request: stage, a GPU segment of occupancy 0.25,
    /// read): the check finds the request's kinds and recovers the occupancy from the
    /// 8-client trace, and its predictions with it match.
    #[test]
    fn the_serve_check_reads_recordings() {
        let dir =
            std::env::temp_dir().join(format!("boundpool-serve-check-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut costs = CostModel::default();
        costs.set("stage input", KindCost::host(5e-6));
        costs.set("serve bf16 segment", KindCost::gpu(6e-6, 27e-6, 0.25));
        costs.set("read output", KindCost::host(4e-6));
        costs.set("client", KindCost::host(10e-6));
        let kinds: Vec<(String, bool)> = vec![
            ("stage input".into(), false),
            ("serve bf16 segment".into(), true),
            ("read output".into(), false),
        ];
        for c in [1usize, 8] {
            let requests = 300;
            let g = serve_graph(c, requests, &kinds);
            let opts = SimOptions {
                trace: true,
                ..SimOptions::default()
            };
            let r = simulate(&g, &serve_machine(c), &costs, &opts).unwrap();
            let trace = boundpool::observe::chrome_trace(r.trace.as_ref().unwrap(), |_, _| {});
            std::fs::write(dir.join(format!("serve_{c}.json")), trace.to_string()).unwrap();
            let rps = (c * requests) as f64 / r.makespan_s;
            let m = serde_json::json!({"clients": c, "requests": c * requests, "rps": rps, "think_us": 10.0});
            std::fs::write(dir.join(format!("serve_{c}_measured.json")), m.to_string()).unwrap();
        }
        let s = serve_check(&dir).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        let names: Vec<&str> = s.kinds.iter().map(|k| k.0.as_str()).collect();
        assert_eq!(names, ["stage input", "serve bf16 segment", "read output"]);
        assert!(s.concurrency > 1.5, "{}", s.concurrency);
        assert!((s.implied - 0.25).abs() < 0.1, "implied {}", s.implied);
        let (_, rps, _, fitted) = s.rows[1];
        assert!((fitted / rps - 1.0).abs() < 0.1, "{fitted} vs {rps}");
        let (_, rps1, p1, _) = s.rows[0];
        assert!((p1 / rps1 - 1.0).abs() < 0.05, "{p1} vs {rps1}");
    }
}
