//! `boundpool sim check-serve DIR`: the served model recorded at several client counts
//! against its simulation.
//!
//! From the one-client trace: the request's nodes and their order, each node's host and
//! device time (by its name: the two replay segments are different work), and the request
//! gap, the time from a request's last node to the next one's first (the client's return
//! from its wait, its own work, the next submission and a worker taking it), which no
//! node's slice holds. From one multi-client trace (the smallest by default): how the GPU's
//! kernels shared it, as an occupancy (kernels that overlapped with gain) or an interference
//! (kernels that lost time to each other). Every client count is then predicted.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use boundpool_sim::workload::{serve as serve_graph, RequestStep, ServeSpec};
use boundpool_sim::{
    simulate, CostModel, Dist, GpuTransfer, GroupDesc, KindCost, Machine, Network, SimOptions,
};
use clap::Args;
use serde_json::Value;

use super::{busy_time, node_spans, read_json, recorded};
use crate::sim::usage;

#[derive(Args, Debug)]
pub(crate) struct CheckServeArgs {
    /// The folder `sim_call.sh` filled (`serve_C.json`, `serve_C_measured.json`).
    dir: PathBuf,
    /// The client count whose trace gives the GPU's occupancy and interference (default:
    /// the smallest above one).
    #[arg(long, value_name = "C")]
    calibrate_on: Option<usize>,
}

/// The kind of the request gap (the simulation's client node).
const GAP: &str = "request gap";

/// One node's slice in a run: host start and end, device start and end (µs).
#[derive(Clone, Copy, Default)]
struct Times {
    host: Option<(f64, f64)>,
    span: Option<(f64, f64)>,
}

/// A one-client trace's request: its nodes in order (node id, name, GPU or not), and its
/// runs, each node's times by id.
struct Requests {
    order: Vec<(u64, String, bool)>,
    runs: Vec<BTreeMap<u64, Times>>,
}

/// A request's first node in a one-client trace's slices (start, end, node, name, span),
/// sorted by start: the host node after the longest mean idle time (nothing of the graph
/// running, host or device: the request gap), among the pairs of host nodes that follow each
/// other in a tenth of the slices at least.
fn first_node(ev: &[(f64, f64, u64, &str, bool)]) -> Option<u64> {
    let mut waits: BTreeMap<(u64, u64), (f64, usize)> = BTreeMap::new();
    let (mut ended, mut prev, mut hosts) = (f64::NEG_INFINITY, None, 0usize);
    for &(a, b, node, _, span) in ev {
        if !span {
            if let Some(p) = prev {
                let e = waits.entry((p, node)).or_default();
                e.0 += (a - ended).max(0.0);
                e.1 += 1;
            }
            prev = Some(node);
            hosts += 1;
        }
        ended = ended.max(b);
    }
    waits
        .into_iter()
        .filter(|(_, (_, n))| *n * 10 >= hosts)
        .max_by(|a, b| (a.1 .0 / a.1 .1 as f64).total_cmp(&(b.1 .0 / b.1 .1 as f64)))
        .map(|((_, next), _)| next)
}

/// The runs of the trace's busiest graph, in order (one client: no two overlap), each from
/// its first node's host slice on, and the request's order: its runs' most frequent order of
/// host nodes.
fn requests(trace: &Value) -> Result<Requests, String> {
    let events: Vec<&Value> = trace["traceEvents"]
        .as_array()
        .ok_or("the one-client trace has no traceEvents")?
        .iter()
        .filter(|e| e["ph"] == "X" && e["args"]["node"].is_u64() && e["args"]["graph"].is_string())
        .collect();
    let mut count: BTreeMap<&str, usize> = BTreeMap::new();
    for e in &events {
        *count
            .entry(e["args"]["graph"].as_str().unwrap_or(""))
            .or_default() += 1;
    }
    let graph = count
        .iter()
        .max_by_key(|(_, c)| **c)
        .map(|(g, _)| *g)
        .ok_or("the one-client trace has no node")?;
    let mut ev: Vec<(f64, f64, u64, &str, bool)> = events
        .iter()
        .filter(|e| e["args"]["graph"] == graph)
        .filter_map(|e| {
            let ts = e["ts"].as_f64()?;
            Some((
                ts,
                ts + e["dur"].as_f64()?,
                e["args"]["node"].as_u64()?,
                e["name"].as_str()?,
                e["args"]["kind"] == "span",
            ))
        })
        .collect();
    ev.sort_by(|a, b| a.0.total_cmp(&b.0));
    let first = first_node(&ev).ok_or("the one-client trace has no request")?;
    let mut names: BTreeMap<u64, (String, bool)> = BTreeMap::new();
    let mut runs: Vec<BTreeMap<u64, Times>> = Vec::new();
    let mut orders: Vec<Vec<u64>> = Vec::new();
    for (a, b, node, name, span) in ev {
        let e = names.entry(node).or_insert((name.to_owned(), false));
        e.1 |= span;
        if !span && node == first {
            runs.push(BTreeMap::new());
            orders.push(Vec::new());
        }
        let (Some(run), Some(order)) = (runs.last_mut(), orders.last_mut()) else {
            continue; // before the first whole request
        };
        let t = run.entry(node).or_default();
        if span {
            t.span = Some((a, b));
        } else {
            t.host = Some((a, b));
            order.push(node);
        }
    }
    let mut freq: BTreeMap<&Vec<u64>, usize> = BTreeMap::new();
    for o in &orders {
        *freq.entry(o).or_default() += 1;
    }
    let order = (*freq
        .iter()
        .max_by_key(|(_, c)| **c)
        .ok_or("the one-client trace has no request")?
        .0)
        .clone();
    let order: Vec<(u64, String, bool)> = order
        .into_iter()
        .map(|n| (n, names[&n].0.clone(), names[&n].1))
        .collect();
    // Whole runs only: every node's host slice, and its span for a GPU node.
    let runs = runs
        .into_iter()
        .zip(&orders)
        .filter(|(r, o)| {
            o.len() == order.len()
                && order
                    .iter()
                    .all(|(n, _, gpu)| r.get(n).is_some_and(|t| !*gpu || t.span.is_some()))
        })
        .map(|(r, _)| r)
        .collect();
    Ok(Requests { order, runs })
}

/// The request as the simulation's steps: in order, except that a host node which starts
/// before the device work of the GPU node just before it (it did not wait for it: a replay's
/// host node needs only that node's host side) goes before that node.
fn steps(req: &Requests) -> Vec<RequestStep> {
    let mut order = req.order.clone();
    let started_before = |x: u64, y: u64| {
        let ahead = req
            .runs
            .iter()
            .filter(|r| match (r[&y].host, r[&x].span) {
                (Some(h), Some(s)) => h.0 < s.0,
                _ => false,
            })
            .count();
        2 * ahead > req.runs.len()
    };
    let mut moved = true;
    while moved {
        moved = false;
        for i in 1..order.len() {
            let (x, y) = (&order[i - 1], &order[i]);
            if x.2 && !y.2 && started_before(x.0, y.0) {
                order.swap(i - 1, i);
                moved = true;
            }
        }
    }
    order
        .into_iter()
        .map(|(_, name, gpu)| RequestStep::new(name, gpu))
        .collect()
}

/// The request gaps: from each run's last host slice's end to the next run's first one's
/// start, seconds.
fn gaps(req: &Requests) -> Vec<f64> {
    let first = |r: &BTreeMap<u64, Times>| {
        r.values()
            .filter_map(|t| t.host.map(|h| h.0))
            .fold(f64::INFINITY, f64::min)
    };
    let last = |r: &BTreeMap<u64, Times>| {
        r.values()
            .filter_map(|t| t.host.map(|h| h.1))
            .fold(f64::NEG_INFINITY, f64::max)
    };
    req.runs
        .windows(2)
        .map(|w| (first(&w[1]) - last(&w[0])) / 1e6)
        .filter(|g| *g >= 0.0)
        .collect()
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

fn predict_rps(clients: usize, steps: &[RequestStep], costs: &CostModel) -> Result<f64, String> {
    let requests = 200;
    let g = serve_graph(&ServeSpec {
        clients,
        requests,
        client_group: 1,
        gpu_group: 0,
        client_kind: GAP.into(),
        steps: steps.to_vec(),
    });
    let r = simulate(&g, &serve_machine(clients), costs, &SimOptions::default())
        .map_err(|e| e.to_string())?;
    Ok((clients * requests) as f64 / r.makespan_s)
}

/// How a multi-client trace's GPU kernels shared the GPU, by the request's GPU nodes'
/// spans: the time one ran alone, the time several ran together, and their summed time
/// alone (the one-client costs), µs.
struct Sharing {
    one: f64,
    more: f64,
    alone: f64,
}

impl Sharing {
    fn of(trace: &Value, costs: &CostModel) -> Self {
        let (mut alone, mut spans) = (0.0, Vec::new());
        for (name, a, b) in node_spans(trace) {
            if let Some(d) = costs.kinds.get(&name).and_then(|c| c.gpu.as_ref()) {
                alone += d.mean() * 1e6;
                spans.push((a, b));
            }
        }
        let (one, more) = busy_time(&spans);
        Sharing { one, more, alone }
    }

    /// The kernels' occupancy and interference that explain it. Kernels that got through
    /// more work than the GPU was busy overlapped with gain: occupancy = busy / alone. Those
    /// that got through less lost time to each other: each fills the GPU, and while several
    /// run the GPU's rate is 1 / interference, so alone = one + more / interference.
    fn model(&self) -> (f64, f64) {
        let busy = self.one + self.more;
        if self.alone >= busy {
            ((busy / self.alone.max(1e-9)).clamp(0.01, 1.0), 1.0)
        } else if self.alone > self.one && self.more > 0.0 {
            (1.0, self.more / (self.alone - self.one))
        } else {
            (1.0, 1.0)
        }
    }
}

/// What the check finds.
struct ServeCheck {
    steps: Vec<RequestStep>,
    gap: Dist,
    think_s: f64,
    calibration: usize,
    sharing: Sharing,
    /// Per client count: clients, measured, predicted, predicted without the request gap
    /// (the client's own think time instead), requests a second.
    rows: Vec<(usize, f64, f64, f64)>,
}

fn serve_check(a: &CheckServeArgs) -> Result<ServeCheck, String> {
    let dir: &Path = &a.dir;
    let cs = recorded(dir, "serve_", "_measured.json")?;
    let one = cs[0];
    let m1 = read_json(&dir.join(format!("serve_{one}_measured.json")))?;
    let t1 = read_json(&dir.join(format!("serve_{one}.json")))?;
    let mut costs = CostModel::from_chrome_trace(&t1, &|n| n.to_owned(), "serve, 1 client")
        .map_err(|e| e.to_string())?;
    let req = requests(&t1)?;
    let steps = steps(&req);
    if !steps.iter().any(|s| s.gpu) {
        return Err("the one-client trace's request has no GPU node".into());
    }
    let gap = Dist::from_samples(&gaps(&req)).ok_or("the one-client trace has one request")?;
    costs.set(
        GAP,
        KindCost {
            host: gap.clone(),
            gpu: None,
            occupancy: 1.0,
            interference: 1.0,
            samples: req.runs.len().saturating_sub(1),
            note: "measured: from a request's last node to the next one's first, one client".into(),
        },
    );
    let calibration = a
        .calibrate_on
        .or_else(|| cs.iter().copied().find(|&c| c > one))
        .unwrap_or(one);
    let sharing = Sharing::of(
        &read_json(&dir.join(format!("serve_{calibration}.json")))?,
        &costs,
    );
    let (occupancy, interference) = sharing.model();
    for s in steps.iter().filter(|s| s.gpu) {
        if let Some(c) = costs.kinds.get_mut(&s.kind) {
            c.occupancy = occupancy;
            c.interference = interference;
        }
    }
    // The previous model's request: the client's own time instead of the gap.
    let think_s = m1["think_us"].as_f64().unwrap_or(0.0) * 1e-6;
    let mut thinking = costs.clone();
    thinking.set(GAP, KindCost::host(think_s));
    let mut rows = Vec::new();
    for &c in &cs {
        let mc = read_json(&dir.join(format!("serve_{c}_measured.json")))?;
        rows.push((
            c,
            mc["rps"].as_f64().unwrap_or(f64::NAN),
            predict_rps(c, &steps, &costs)?,
            predict_rps(c, &steps, &thinking)?,
        ));
    }
    Ok(ServeCheck {
        steps,
        gap,
        think_s,
        calibration,
        sharing,
        rows,
    })
}

fn print_serve(s: &ServeCheck) {
    println!(
        "request: {GAP} (median {:.1} us, mean {:.1}; the client's own time alone: {:.1} us) -> {}",
        s.gap.median() * 1e6,
        s.gap.mean() * 1e6,
        s.think_s * 1e6,
        s.steps
            .iter()
            .map(|st| format!("{}{}", st.kind, if st.gpu { " (GPU)" } else { "" }))
            .collect::<Vec<_>>()
            .join(" -> ")
    );
    let sh = &s.sharing;
    let (occupancy, interference) = sh.model();
    println!(
        "{} clients' trace: the GPU ran one kernel {:.1} ms and several {:.1} ms, for {:.1} ms of its kernels' time alone: occupancy {occupancy:.2}, interference {interference:.2}",
        s.calibration,
        sh.one / 1e3,
        sh.more / 1e3,
        sh.alone / 1e3
    );
    println!(
        "\n| clients | measured req/s | predicted req/s | predicted / measured | within 20% | without the request gap: predicted / measured |"
    );
    println!("| ---: | ---: | ---: | ---: | --- | ---: |");
    for &(c, rps, p, think) in &s.rows {
        let ratio = p / rps;
        println!(
            "| {c} | {rps:.0} | {p:.0} | {ratio:.2} | {} | {:.2} |",
            if (ratio - 1.0).abs() <= 0.2 {
                "yes"
            } else {
                "**no**"
            },
            think / rps
        );
    }
}

pub(crate) fn serve(a: CheckServeArgs) -> ExitCode {
    match serve_check(&a) {
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
    use serde_json::json;

    fn host(name: &str, node: u64, ts: f64, dur: f64) -> Value {
        json!({"ph": "X", "name": name, "ts": ts, "dur": dur, "cat": "serve",
               "args": {"graph": "serve", "node": node, "stolen": false}})
    }

    fn span(name: &str, node: u64, ts: f64, dur: f64) -> Value {
        json!({"ph": "X", "name": name, "ts": ts, "dur": dur, "cat": "serve",
               "args": {"graph": "serve", "kind": "span", "node": node}})
    }

    /// A replay's requests at one client, as `sim_record serve` traces them: segment 0 and
    /// the staging node, segment 1, the read after segment 1's device work, then a 20 µs gap
    /// (every request 67 µs). The trace starts in a request's last node.
    fn one_client(requests: usize) -> Value {
        let mut ev = vec![
            json!({"ph": "X", "name": "park", "ts": 0.0, "dur": 9.0, "args": {"kind": "park"}}),
            host("read", 3, 1.0, 2.0),
        ];
        for r in 0..requests {
            let t = 23.0 + 67.0 * r as f64;
            ev.push(host("seg 0", 0, t, 5.0));
            ev.push(host("stage", 2, t + 5.0, 2.0));
            ev.push(host("seg 1", 1, t + 7.0, 10.0));
            ev.push(span("seg 0", 0, t + 10.0, 2.0));
            ev.push(span("seg 1", 1, t + 17.0, 28.0));
            ev.push(host("read", 3, t + 45.0, 2.0));
        }
        json!({ "traceEvents": ev })
    }

    #[test]
    fn a_request_its_order_and_its_gap_from_one_client() {
        let req = requests(&one_client(50)).unwrap();
        let names: Vec<&str> = req.order.iter().map(|o| o.1.as_str()).collect();
        assert_eq!(names, ["seg 0", "stage", "seg 1", "read"]);
        assert_eq!(req.runs.len(), 50);
        // The staging node does not wait for segment 0's device work: it goes first.
        let st: Vec<(String, bool)> = steps(&req).into_iter().map(|s| (s.kind, s.gpu)).collect();
        let want = [
            ("stage", false),
            ("seg 0", true),
            ("seg 1", true),
            ("read", false),
        ];
        assert_eq!(st, want.map(|(k, g)| (k.to_owned(), g)));
        let g = gaps(&req);
        assert_eq!(g.len(), 49);
        assert!(g.iter().all(|v| (v - 20e-6).abs() < 1e-12), "{g:?}");
    }

    #[test]
    fn sharing_with_gain_and_with_interference() {
        let mut costs = CostModel::default();
        costs.set("seg 1", KindCost::gpu(10e-6, 28e-6, 1.0));
        // Two kernels of 28 µs alone overlapping over 30 µs: they gained.
        let gain =
            json!({"traceEvents": [span("seg 1", 1, 0.0, 30.0), span("seg 1", 1, 0.0, 30.0)]});
        let s = Sharing::of(&gain, &costs);
        assert_eq!((s.one, s.more), (0.0, 30.0));
        let (occ, i) = s.model();
        assert!((occ - 30.0 / 56.0).abs() < 1e-9 && i == 1.0, "{occ} {i}");
        // Alone for 28 µs, then two together over 70 µs: 56 µs of work in 70, interference
        // 70 / 56.
        let lost = json!({"traceEvents": [
            span("seg 1", 1, 0.0, 28.0), span("seg 1", 1, 100.0, 70.0), span("seg 1", 1, 100.0, 70.0),
            span("other", 7, 0.0, 500.0),
        ]});
        let s = Sharing::of(&lost, &costs);
        assert_eq!((s.one, s.more), (28.0, 70.0));
        let (occ, i) = s.model();
        assert!(occ == 1.0 && (i - 70.0 / 56.0).abs() < 1e-9, "{occ} {i}");
    }

    /// The whole check on recordings whose multi-client run is the simulation itself with
    /// the one-client costs and a known interference: it finds the interference again and
    /// predicts that run's rate.
    #[test]
    fn the_check_predicts_a_run_made_with_its_own_model() {
        let dir =
            std::env::temp_dir().join(format!("boundpool-serve-check-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let t1 = one_client(400);
        std::fs::write(dir.join("serve_1.json"), t1.to_string()).unwrap();
        let m1 = json!({"clients": 1, "requests": 400, "rps": 1e6 / 67.0, "think_us": 15.0});
        std::fs::write(dir.join("serve_1_measured.json"), m1.to_string()).unwrap();
        // The 8-client run: simulated with the check's own costs, interference 1.3.
        let mut costs = CostModel::from_chrome_trace(&t1, &|n| n.to_owned(), "t").unwrap();
        costs.set(GAP, KindCost::host(20e-6));
        for k in ["seg 0", "seg 1"] {
            costs.kinds.get_mut(k).unwrap().interference = 1.3;
        }
        let st = steps(&requests(&t1).unwrap());
        let g = serve_graph(&ServeSpec {
            clients: 8,
            requests: 200,
            client_group: 1,
            gpu_group: 0,
            client_kind: GAP.into(),
            steps: st,
        });
        let opts = SimOptions {
            trace: true,
            ..SimOptions::default()
        };
        let r = simulate(&g, &serve_machine(8), &costs, &opts).unwrap();
        let trace = boundpool::observe::chrome_trace(r.trace.as_ref().unwrap(), |_, _| {});
        // The simulated trace names nodes "seg 1 17": as the real one, by the node's name.
        let mut trace = trace;
        for e in trace["traceEvents"].as_array_mut().unwrap() {
            if let Some(n) = e["name"].as_str().map(str::to_owned) {
                if let Some((k, _)) = n.rsplit_once(' ').filter(|_| e["args"]["node"].is_u64()) {
                    e["name"] = Value::from(k);
                }
            }
        }
        std::fs::write(dir.join("serve_8.json"), trace.to_string()).unwrap();
        let rps = 8.0 * 200.0 / r.makespan_s;
        let m8 = json!({"clients": 8, "requests": 1600, "rps": rps, "think_us": 15.0});
        std::fs::write(dir.join("serve_8_measured.json"), m8.to_string()).unwrap();
        let s = serve_check(&CheckServeArgs {
            dir: dir.clone(),
            calibrate_on: None,
        })
        .unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(s.calibration, 8);
        let (occ, i) = s.sharing.model();
        assert_eq!(occ, 1.0);
        assert!((i - 1.3).abs() < 0.1, "interference {i}");
        let (c, measured, predicted, _) = s.rows[1];
        assert_eq!(c, 8);
        assert!(
            (predicted / measured - 1.0).abs() < 0.05,
            "{predicted} vs {measured}"
        );
    }
}
