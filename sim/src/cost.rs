//! Costs per node kind, from the timelines of real runs: the time a node's body holds its
//! worker, and for a GPU node the time its work holds the device, each a distribution; saved
//! to and read from JSON.

use std::collections::BTreeMap;
use std::path::Path;

use boundpool_scheduler::{SliceKind, Trace};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::dist::Dist;
use crate::error::{SimError, SimErrorKind, SimResult};
use crate::sharing::SmShare;

/// The cost of one node kind.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KindCost {
    /// The time the node's body holds its worker: all of a host node's work; a GPU node's
    /// launch (its library call returning, the event recorded).
    pub host: Dist,
    /// A GPU node's time on the device, as when its kernels had the GPU to themselves (record
    /// it from a run on one stream).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<Dist>,
    /// The share of the GPU's SMs the node's kernels hold while they run (1: every SM).
    /// Kernels of several streams share the GPU in proportion to it (see the crate docs); 1
    /// by default, [`CostModel::occupancy_from_rates`] derives it from the kind's rate alone.
    #[serde(default = "one")]
    pub occupancy: f64,
    /// How much longer the node's kernels take while other kernels share the GPU, beyond
    /// their share of it (1: no more; kernels that evict each other's data or wait on each
    /// other's launches: above 1). 1 by default.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub interference: f64,
    /// How many recorded runs of the kind the distributions come from (0: written by hand).
    #[serde(default)]
    pub samples: usize,
    /// Where the figures come from ("measured: …" or "assumed: …").
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub note: String,
}

fn one() -> f64 {
    1.0
}

fn is_one(v: &f64) -> bool {
    *v == 1.0
}

impl KindCost {
    /// A host node of `seconds`, always.
    pub fn host(seconds: f64) -> Self {
        KindCost {
            host: Dist::constant(seconds),
            gpu: None,
            occupancy: 1.0,
            interference: 1.0,
            samples: 0,
            note: String::new(),
        }
    }

    /// A GPU node: `launch` seconds on its worker, `device` seconds on the GPU, occupying
    /// `occupancy` of it.
    pub fn gpu(launch: f64, device: f64, occupancy: f64) -> Self {
        KindCost {
            host: Dist::constant(launch),
            gpu: Some(Dist::constant(device)),
            occupancy,
            interference: 1.0,
            samples: 0,
            note: String::new(),
        }
    }

    /// With a note saying where the figures come from.
    pub fn noted(mut self, note: impl Into<String>) -> Self {
        self.note = note.into();
        self
    }
}

/// Costs per node kind: what [`simulate`](crate::simulate) samples for each node.
///
/// A node's kind is its label ([`kind_of`] of its name by default: `gemm(3,1,0)` is `gemm`,
/// `d117` is `d`), so one recorded run at one size gives the costs of every node of a kind.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CostModel {
    /// What the costs were recorded from: command, card, date.
    #[serde(default)]
    pub source: String,
    /// Costs by kind.
    pub kinds: BTreeMap<String, KindCost>,
}

/// A node kind from a node name: the name up to its first `(`, without trailing digits,
/// spaces, `_` or `-` (`gemm(3,1,0)` → `gemm`, `d117` → `d`, `layer 3` → `layer`); the
/// ranks runtime's own nodes are `send` and `receive`. A name that would come out empty is
/// its own kind.
pub fn kind_of(name: &str) -> &str {
    if name.starts_with("send '") {
        return "send";
    }
    if name.starts_with("receive '") || name.starts_with("receive of '") {
        return "receive";
    }
    let head = name.split('(').next().unwrap_or(name);
    let k = head
        .trim_end_matches(|c: char| c.is_ascii_digit())
        .trim_end_matches([' ', '_', '-']);
    if k.is_empty() {
        name
    } else {
        k
    }
}

/// Durations (seconds) recorded per kind: host and device.
#[derive(Default)]
struct Samples {
    host: BTreeMap<String, Vec<f64>>,
    gpu: BTreeMap<String, Vec<f64>>,
}

impl Samples {
    fn into_model(self, source: String) -> CostModel {
        let mut kinds = BTreeMap::new();
        let names: std::collections::BTreeSet<&String> =
            self.host.keys().chain(self.gpu.keys()).collect();
        for k in names {
            let host = self.host.get(k).map(Vec::as_slice).unwrap_or(&[]);
            let gpu = self.gpu.get(k).map(Vec::as_slice).unwrap_or(&[]);
            kinds.insert(
                k.clone(),
                KindCost {
                    host: Dist::from_samples(host).unwrap_or_else(|| Dist::constant(0.0)),
                    gpu: Dist::from_samples(gpu),
                    occupancy: 1.0,
                    interference: 1.0,
                    samples: host.len().max(gpu.len()),
                    note: format!("measured: {source}"),
                },
            );
        }
        CostModel { source, kinds }
    }
}

impl CostModel {
    /// The costs recorded in `trace` (from `Pool::take_trace()` or `GpuPool::take_trace()`):
    /// every node slice of a worker track is a host sample of `label(name)`, every span that
    /// stands for a node (a GPU node's time on its stream's track) a device sample. Parks are
    /// ignored.
    pub fn from_trace(trace: &Trace, label: &dyn Fn(&str) -> String, source: &str) -> Self {
        let mut s = Samples::default();
        for sl in &trace.slices {
            let secs = sl.end_ns.saturating_sub(sl.start_ns) as f64 / 1e9;
            match sl.kind {
                SliceKind::Node { .. } => {
                    s.host.entry(label(&sl.name)).or_default().push(secs);
                }
                SliceKind::Span if sl.node.is_some() => {
                    s.gpu.entry(label(&sl.name)).or_default().push(secs);
                }
                _ => {}
            }
        }
        s.into_model(source.to_owned())
    }

    /// The costs recorded in a Chrome trace as `boundpool::observe::chrome_trace` writes it
    /// (`boundpool run --trace`, the examples' `--trace`): a complete event without
    /// `args.kind` is a node's host time, one with `args.kind == "span"` and `args.node` its
    /// device time; parks are ignored.
    pub fn from_chrome_trace(
        trace: &Value,
        label: &dyn Fn(&str) -> String,
        source: &str,
    ) -> SimResult<Self> {
        let events = trace
            .get("traceEvents")
            .and_then(Value::as_array)
            .ok_or_else(|| {
                SimError::new(
                    SimErrorKind::Parse,
                    format!("{source}: not a Chrome trace (no traceEvents array)"),
                )
            })?;
        let mut s = Samples::default();
        for e in events {
            if e.get("ph").and_then(Value::as_str) != Some("X") {
                continue;
            }
            let (Some(name), Some(dur)) = (
                e.get("name").and_then(Value::as_str),
                e.get("dur").and_then(Value::as_f64),
            ) else {
                continue;
            };
            let args = e.get("args");
            let kind = args.and_then(|a| a.get("kind")).and_then(Value::as_str);
            let node = args
                .and_then(|a| a.get("node"))
                .is_some_and(|n| !n.is_null());
            let secs = dur / 1e6;
            match kind {
                None => s.host.entry(label(name)).or_default().push(secs),
                Some("span") if node => s.gpu.entry(label(name)).or_default().push(secs),
                _ => {}
            }
        }
        Ok(s.into_model(source.to_owned()))
    }

    /// Reads a cost model written by [`save`](Self::save).
    pub fn load(path: &Path) -> SimResult<Self> {
        let m: CostModel = crate::json_file::read(path, "a cost model")?;
        m.check()?;
        Ok(m)
    }

    /// Writes the model as pretty JSON.
    pub fn save(&self, path: &Path) -> SimResult<()> {
        let text = serde_json::to_string_pretty(self).expect("a cost model serializes");
        std::fs::write(path, text).map_err(|e| {
            SimError::new(
                SimErrorKind::Io,
                format!("cannot write {}: {e}", path.display()),
            )
            .with_source(e)
        })
    }

    /// The rate alone (TFLOP/s) of each GPU kind of `flops` (a kind and the floating-point
    /// operations of one of its nodes): those operations over its mean device time. Kinds
    /// without device time, or not in the model, are left out.
    pub fn rates(&self, flops: &[(&str, f64)]) -> Vec<(String, f64)> {
        flops
            .iter()
            .filter_map(|&(kind, f)| {
                let mean = self.kinds.get(kind)?.gpu.as_ref()?.mean();
                (mean > 0.0).then(|| (kind.to_owned(), f / mean / 1e12))
            })
            .collect()
    }

    /// Sets each GPU kind of `flops` to the occupancy `share` gives its rate alone
    /// ([`rates`](Self::rates)); the others are left as they are.
    pub fn occupancy_from_rates(&mut self, flops: &[(&str, f64)], share: &SmShare) {
        for (kind, rate) in self.rates(flops) {
            if let Some(c) = self.kinds.get_mut(&kind) {
                c.occupancy = share.occupancy(rate);
            }
        }
    }

    /// Checks every distribution and occupancy.
    pub fn check(&self) -> SimResult<()> {
        for (k, c) in &self.kinds {
            c.host.check(&format!("kind '{k}' (host)"))?;
            if let Some(g) = &c.gpu {
                g.check(&format!("kind '{k}' (gpu)"))?;
            }
            if !(c.occupancy > 0.0 && c.occupancy <= 1.0) {
                return Err(SimError::new(
                    SimErrorKind::MissingCost,
                    format!("kind '{k}': occupancy {} is not in (0, 1]", c.occupancy),
                ));
            }
            if !(c.interference >= 1.0 && c.interference.is_finite()) {
                return Err(SimError::new(
                    SimErrorKind::MissingCost,
                    format!(
                        "kind '{k}': interference {} is not 1 or more",
                        c.interference
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The cost of `kind`, or an error naming it and the kinds the model has.
    pub fn get(&self, kind: &str) -> SimResult<&KindCost> {
        self.kinds.get(kind).ok_or_else(|| {
            let known: Vec<&str> = self.kinds.keys().map(String::as_str).take(10).collect();
            SimError::new(
                SimErrorKind::MissingCost,
                format!(
                    "the cost model has no kind '{kind}' (it has: {}{})",
                    known.join(", "),
                    if self.kinds.len() > 10 { ", …" } else { "" }
                ),
            )
        })
    }

    /// Sets (or replaces) the cost of `kind`.
    pub fn set(&mut self, kind: impl Into<String>, cost: KindCost) -> &mut Self {
        self.kinds.insert(kind.into(), cost);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use boundpool_scheduler::{TraceSlice, TraceTrack};

    #[test]
    fn kinds_from_names() {
        assert_eq!(kind_of("gemm(3,1,0)"), "gemm");
        assert_eq!(kind_of("trsm(4..,3)"), "trsm");
        assert_eq!(kind_of("d117"), "d");
        assert_eq!(kind_of("layer 3"), "layer");
        assert_eq!(kind_of("send 'd3' to rank 1"), "send");
        assert_eq!(kind_of("receive 'd3' from rank 0"), "receive");
        assert_eq!(kind_of("42"), "42");
    }

    fn slice(track: usize, name: &str, ns: (u64, u64), kind: SliceKind) -> TraceSlice {
        TraceSlice {
            track,
            name: name.into(),
            graph: "g".into(),
            node: Some(0),
            start_ns: ns.0,
            end_ns: ns.1,
            kind,
        }
    }

    #[test]
    fn host_and_device_times_from_a_trace() {
        let track = |name: &str, worker| TraceTrack {
            name: name.into(),
            worker,
            core: None,
            group: String::new(),
        };
        let trace = Trace {
            epoch: std::time::Instant::now(),
            tracks: vec![track("worker 0", Some(0)), track("GPU 0 stream 0", None)],
            slices: vec![
                slice(
                    0,
                    "gemm(1,0,0)",
                    (0, 4_000),
                    SliceKind::Node { stolen: false },
                ),
                slice(
                    0,
                    "gemm(2,0,0)",
                    (5_000, 11_000),
                    SliceKind::Node { stolen: true },
                ),
                slice(0, "park", (11_000, 20_000), SliceKind::Park),
                slice(1, "gemm(1,0,0)", (4_000, 104_000), SliceKind::Span),
            ],
            dropped: 0,
        };
        let m = CostModel::from_trace(&trace, &|n| kind_of(n).to_owned(), "test");
        assert_eq!(m.kinds.len(), 1);
        let g = m.get("gemm").unwrap();
        assert_eq!(g.samples, 2);
        assert_eq!(g.host.quantiles_s, vec![4e-6, 6e-6]);
        assert_eq!(g.gpu.as_ref().unwrap().quantiles_s, vec![100e-6]);
        let e = m.get("potrf").unwrap_err();
        assert_eq!(e.kind(), SimErrorKind::MissingCost);
        assert!(e.to_string().contains("'potrf'") && e.to_string().contains("gemm"));

        // The same through its Chrome trace.
        let json = serde_json::json!({"traceEvents": [
            {"ph": "X", "name": "gemm(1,0,0)", "dur": 4.0, "args": {"graph": "g", "node": 0}},
            {"ph": "X", "name": "gemm(2,0,0)", "dur": 6.0, "args": {"graph": "g", "node": 1}},
            {"ph": "X", "name": "park", "dur": 9.0, "args": {"kind": "park"}},
            {"ph": "X", "name": "gemm(1,0,0)", "dur": 100.0, "args": {"kind": "span", "node": 0}},
        ]});
        let c = CostModel::from_chrome_trace(&json, &|n| kind_of(n).to_owned(), "test").unwrap();
        assert_eq!(c.kinds, m.kinds);
    }

    #[test]
    fn save_and_load() {
        let mut m = CostModel::default();
        m.set("potrf", KindCost::gpu(8e-6, 2e-3, 0.25).noted("assumed"));
        let path = std::env::temp_dir().join(format!("sim-costs-{}.json", std::process::id()));
        m.save(&path).unwrap();
        assert_eq!(CostModel::load(&path).unwrap(), m);
        std::fs::write(
            &path,
            "{\"kinds\": {\"x\": {\"host\": {\"quantiles_s\": [1.0]}, \"occupancy\": 2.0}}}",
        )
        .unwrap();
        let e = CostModel::load(&path).unwrap_err();
        assert!(e.to_string().contains("kind 'x': occupancy 2"), "{e}");
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn occupancy_from_the_rate_alone() {
        let mut m = CostModel::default();
        // 2 GFLOP in 100 us: 20 TFLOP/s, against a peak of 40.
        m.set("gemm", KindCost::gpu(5e-6, 100e-6, 1.0));
        m.set("stage", KindCost::host(3e-6));
        let share = SmShare {
            peak_tflops: 40.0,
            held: 0.2,
        };
        m.occupancy_from_rates(&[("gemm", 2e9), ("stage", 1e9), ("absent", 1e9)], &share);
        assert!((m.get("gemm").unwrap().occupancy - 0.6).abs() < 1e-12);
        assert_eq!(m.get("stage").unwrap().occupancy, 1.0);
        assert_eq!(m.kinds.len(), 2);
    }
}
