//! What a simulation says: the makespan, busy fractions per worker, GPU, link and
//! communication thread, the critical path and what it is made of, lower bounds, and the
//! trace of the virtual run.

use std::fmt::Write as _;

use boundpool_scheduler::Trace;
use serde_json::{json, Value};

/// A resource's busy fraction over the makespan.
#[derive(Clone, Debug, PartialEq)]
pub struct Busy {
    /// The resource (`rank 3 worker 2 (panel)`, `GPU 5`, `host 1 rail 0 network, out`).
    pub name: String,
    /// Busy time over the makespan (a GPU: time with a kernel running).
    pub fraction: f64,
    /// A GPU: its SMs' use over the makespan (Σ occupancy × speed of its kernels, ≤ 1);
    /// a port: bytes it sent.
    pub amount: f64,
}

/// One step of the critical path, latest first.
#[derive(Clone, Debug, PartialEq)]
pub struct PathStep {
    /// The node (or `send`/`receive` of a value) on the path.
    pub name: String,
    /// Its rank.
    pub rank: usize,
    /// The interval of the path it covers, seconds.
    pub start_s: f64,
    /// Its end.
    pub end_s: f64,
    /// That interval cut by what happened in it: (`gpu gemm`, `host potrf`, `transfer`,
    /// `waiting for a worker`, `stream wait`, `completion seen`, …; seconds).
    pub parts: Vec<(String, f64)>,
}

/// Lower bounds of the makespan.
#[derive(Clone, Debug, PartialEq)]
pub struct Bounds {
    /// The longest path through the graph with every node's sampled cost and every transfer
    /// alone on its link (no waiting).
    pub path_s: f64,
    /// All device work over the GPUs (or all host work over the workers, for host graphs).
    pub work_s: f64,
}

/// The result of [`simulate`](crate::simulate).
#[derive(Debug)]
pub struct SimReport {
    /// The graph's name.
    pub graph: String,
    /// The machine's name.
    pub machine: String,
    /// Ranks.
    pub ranks: usize,
    /// Nodes of the graph.
    pub nodes: usize,
    /// Transfers (one per value and receiving rank).
    pub transfers: usize,
    /// Bytes that crossed ranks.
    pub bytes_moved: f64,
    /// From the submission on every rank to the last rank's end, seconds.
    pub makespan_s: f64,
    /// The graph's floating-point operations (0 when not known).
    pub flops: f64,
    /// Peak FP64 rate of all GPUs, TFLOP/s (0 without GPUs).
    pub peak_tflops: f64,
    /// Events processed.
    pub events: u64,
    /// Per worker.
    pub workers: Vec<Busy>,
    /// Per GPU.
    pub gpus: Vec<Busy>,
    /// Per link port that carried anything.
    pub links: Vec<Busy>,
    /// Per communication thread.
    pub comm: Vec<Busy>,
    /// The critical path of the run, latest step first.
    pub critical_path: Vec<PathStep>,
    /// The critical path's time by part, largest first (sums to the makespan).
    pub path_parts: Vec<(String, f64)>,
    /// Lower bounds.
    pub bounds: Bounds,
    /// The virtual run as a boundpool trace (with `SimOptions::trace`): worker tracks, one
    /// per GPU stream, link port and communication thread.
    pub trace: Option<Trace>,
}

fn mean(v: &[Busy]) -> f64 {
    if v.is_empty() {
        0.0
    } else {
        v.iter().map(|b| b.fraction).sum::<f64>() / v.len() as f64
    }
}

impl SimReport {
    /// Achieved TFLOP/s (`flops / makespan`).
    pub fn tflops(&self) -> f64 {
        if self.makespan_s > 0.0 {
            self.flops / self.makespan_s / 1e12
        } else {
            0.0
        }
    }

    /// Achieved over peak (0 without a peak).
    pub fn efficiency(&self) -> f64 {
        if self.peak_tflops > 0.0 {
            self.tflops() / self.peak_tflops
        } else {
            0.0
        }
    }

    /// What limits this run, in a phrase: the busiest resource where one is nearly always
    /// busy, else the largest part of the critical path.
    pub fn limit(&self) -> String {
        let gpu_sm = if self.gpus.is_empty() {
            0.0
        } else {
            self.gpus.iter().map(|g| g.amount).sum::<f64>() / self.gpus.len() as f64
        };
        let busiest_link = self
            .links
            .iter()
            .max_by(|a, b| a.fraction.total_cmp(&b.fraction));
        if gpu_sm >= 0.85 {
            return format!("GPU compute (SMs {:.0}% used)", gpu_sm * 100.0);
        }
        if let Some(l) = busiest_link.filter(|l| l.fraction >= 0.8) {
            return format!("link {} ({:.0}% busy)", l.name, l.fraction * 100.0);
        }
        let total: f64 = self.path_parts.iter().map(|p| p.1).sum();
        let top: Vec<String> = self
            .path_parts
            .iter()
            .take(2)
            .map(|(k, s)| format!("{k} {:.0}%", 100.0 * s / total.max(1e-30)))
            .collect();
        format!("critical path: {}", top.join(", "))
    }

    /// A few lines for people.
    pub fn summary(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "graph '{}' on {}: {} nodes, {} transfers ({:.1} MB) over {} rank(s)",
            self.graph,
            self.machine,
            self.nodes,
            self.transfers,
            self.bytes_moved / 1e6,
            self.ranks
        );
        let _ = write!(s, "makespan {:.3} ms", self.makespan_s * 1e3);
        if self.flops > 0.0 {
            let _ = write!(s, ", {:.1} TFLOP/s", self.tflops());
            if self.peak_tflops > 0.0 {
                let _ = write!(s, " ({:.0}% of peak)", self.efficiency() * 100.0);
            }
        }
        let _ = writeln!(
            s,
            "; bounds: path {:.3} ms, work {:.3} ms",
            self.bounds.path_s * 1e3,
            self.bounds.work_s * 1e3
        );
        let _ = writeln!(
            s,
            "busy: workers {:.0}% (mean), GPUs {:.0}% active, communication threads {:.0}%",
            mean(&self.workers) * 100.0,
            mean(&self.gpus) * 100.0,
            mean(&self.comm) * 100.0
        );
        if let Some(l) = self
            .links
            .iter()
            .max_by(|a, b| a.fraction.total_cmp(&b.fraction))
        {
            let _ = writeln!(
                s,
                "busiest link port: {} {:.0}% ({:.1} MB)",
                l.name,
                l.fraction * 100.0,
                l.amount / 1e6
            );
        }
        let parts: Vec<String> = self
            .path_parts
            .iter()
            .take(6)
            .map(|(k, v)| format!("{k} {:.3} ms", v * 1e3))
            .collect();
        let _ = writeln!(
            s,
            "critical path ({} steps): {}",
            self.critical_path.len(),
            parts.join(", ")
        );
        let _ = writeln!(s, "limit: {}", self.limit());
        s
    }

    /// The figures as JSON (no trace).
    pub fn to_json(&self) -> Value {
        let busy = |v: &[Busy]| -> Value {
            v.iter()
                .map(|b| json!({"name": b.name, "fraction": b.fraction, "amount": b.amount}))
                .collect()
        };
        json!({
            "graph": self.graph,
            "machine": self.machine,
            "ranks": self.ranks,
            "nodes": self.nodes,
            "transfers": self.transfers,
            "bytes_moved": self.bytes_moved,
            "makespan_s": self.makespan_s,
            "flops": self.flops,
            "tflops": self.tflops(),
            "efficiency": self.efficiency(),
            "events": self.events,
            "limit": self.limit(),
            "bounds": {"path_s": self.bounds.path_s, "work_s": self.bounds.work_s},
            "path_parts": self.path_parts.iter().map(|(k, v)| json!([k, v])).collect::<Vec<_>>(),
            "workers": busy(&self.workers),
            "gpus": busy(&self.gpus),
            "links": busy(&self.links),
            "comm": busy(&self.comm),
        })
    }
}
