//! What a run leaves: each task's times, the trace slices, and from them the report: busy
//! fractions, lower bounds, the critical path cut into what its time went to.

use boundpool_scheduler::{SliceKind, Trace, TraceSlice, TraceTrack};

use super::{What, World, NONE};
use crate::error::SimResult;
use crate::report::{Bounds, Busy, PathStep, SimReport};

/// Per task, seconds.
pub(crate) struct Times {
    /// Every predecessor done (released).
    pub(crate) ready: Vec<f64>,
    /// Its body started.
    pub(crate) start: Vec<f64>,
    /// Its body ended (a GPU node's launch).
    pub(crate) end: Vec<f64>,
    pub(crate) dev_start: Vec<f64>,
    pub(crate) dev_end: Vec<f64>,
    /// Its deferred condition met (device done, arrived, sent).
    pub(crate) cond: Vec<f64>,
    /// Its deferred completion seen by a worker.
    pub(crate) seen: Vec<f64>,
    /// Completed: its successors released.
    pub(crate) done: Vec<f64>,
    /// The predecessor whose completion made it ready.
    pub(crate) cause: Vec<u32>,
    /// The worker that ran its body.
    pub(crate) worker: Vec<u32>,
}

impl Times {
    pub(crate) fn new(n: usize) -> Self {
        Times {
            ready: vec![0.0; n],
            start: vec![0.0; n],
            end: vec![0.0; n],
            dev_start: vec![0.0; n],
            dev_end: vec![0.0; n],
            cond: vec![0.0; n],
            seen: vec![0.0; n],
            done: vec![0.0; n],
            cause: vec![NONE; n],
            worker: vec![NONE; n],
        }
    }
}

#[derive(Clone, Copy)]
enum Track {
    Worker(u32),
    Stream(u32),
    Port(u32),
    Comm(u32),
}

#[derive(Clone, Copy)]
enum Kind {
    Node { stolen: bool },
    Park,
    Span,
}

struct Rec {
    track: Track,
    task: u32,
    start: f64,
    end: f64,
    kind: Kind,
}

/// The trace's slices as they happen (only when asked for).
pub(crate) struct Recorder {
    on: bool,
    recs: Vec<Rec>,
}

impl Recorder {
    pub(crate) fn new(on: bool) -> Self {
        Recorder {
            on,
            recs: Vec::new(),
        }
    }

    fn push(&mut self, track: Track, task: u32, start: f64, end: f64, kind: Kind) {
        if self.on && end > start {
            self.recs.push(Rec {
                track,
                task,
                start,
                end,
                kind,
            });
        }
    }

    pub(crate) fn body(&mut self, w: u32, t: u32, start: f64, end: f64, stolen: bool) {
        self.push(Track::Worker(w), t, start, end, Kind::Node { stolen });
    }

    pub(crate) fn park(&mut self, w: u32, since: f64, until: f64) {
        if since.is_finite() {
            self.push(Track::Worker(w), NONE, since, until, Kind::Park);
        }
    }

    pub(crate) fn kernel(&mut self, s: u32, t: u32, start: f64, end: f64) {
        self.push(Track::Stream(s), t, start, end, Kind::Span);
    }

    pub(crate) fn port(&mut self, p: u32, t: u32, start: f64, end: f64) {
        self.push(Track::Port(p), t, start, end, Kind::Span);
    }

    pub(crate) fn comm(&mut self, r: u32, t: u32, start: f64, end: f64) {
        self.push(Track::Comm(r), t, start, end, Kind::Span);
    }
}

fn ns(s: f64) -> u64 {
    (s * 1e9).round().max(0.0) as u64
}

fn overlap(a: f64, b: f64, lo: f64, hi: f64) -> f64 {
    (b.min(hi) - a.max(lo)).max(0.0)
}

impl World<'_> {
    fn transfer_of(&self, t: usize) -> Option<(u32, bool)> {
        match self.what[t] {
            What::Send(tr) => Some((tr, true)),
            What::Recv(tr) => Some((tr, false)),
            What::Compute(_) => None,
        }
    }

    /// A task's name as the real run's trace names it.
    fn task_name(&self, t: usize) -> String {
        match self.what[t] {
            What::Compute(i) => self.graph.desc.nodes[i as usize].name.clone(),
            What::Send(tr) | What::Recv(tr) => {
                let x = &self.lowering.transfers[tr as usize];
                let p = &self.graph.desc.nodes[x.producer as usize].name;
                if matches!(self.what[t], What::Send(_)) {
                    format!("send '{p}' to rank {}", x.to)
                } else {
                    format!("receive '{p}' from rank {}", x.from)
                }
            }
        }
    }

    fn kind_name(&self, t: usize) -> &str {
        match self.what[t] {
            What::Compute(i) => &self.graph.nodes[i as usize].kind,
            What::Send(_) => "send",
            What::Recv(_) => "receive",
        }
    }

    /// The time a transfer's message takes alone: latencies and its slowest stage.
    fn transfer_alone(&self, tr: u32) -> f64 {
        if self.cpu_copied(tr) {
            let l = &self.machine.links.shm;
            return l.latency_s
                + self.bytes[self.graph.nodes.len() + tr as usize] / (l.bandwidth_gb_s * 1e9);
        }
        let stages = self.path(tr);
        let bytes = self.bytes[self.graph.nodes.len() + tr as usize];
        let lat: f64 = stages.iter().map(|s| s.lat).sum();
        let bw = stages.iter().map(|s| s.bw).fold(f64::INFINITY, f64::min);
        lat + bytes / bw
    }

    /// Each task's longest path to the end (its own cost included; a send adds its
    /// transfer alone and its receive's), seconds.
    pub(crate) fn bottom_levels(&self) -> Vec<f64> {
        let n = self.tasks();
        let nodes = self.graph.nodes.len();
        let nt = self.lowering.transfers.len();
        // Kahn's order over local edges and send -> receive.
        let mut indeg = vec![0u32; n];
        for &s in &self.succ {
            indeg[s as usize] += 1;
        }
        for t in 0..nt {
            indeg[nodes + nt + t] += 1;
        }
        let mut order: Vec<u32> = (0..n as u32).filter(|&t| indeg[t as usize] == 0).collect();
        let mut k = 0;
        while k < order.len() {
            let x = order[k] as usize;
            k += 1;
            let next = |s: usize, indeg: &mut Vec<u32>, order: &mut Vec<u32>| {
                indeg[s] -= 1;
                if indeg[s] == 0 {
                    order.push(s as u32);
                }
            };
            for i in self.succ_start[x]..self.succ_start[x + 1] {
                next(self.succ[i as usize] as usize, &mut indeg, &mut order);
            }
            if let Some((tr, true)) = self.transfer_of(x) {
                next(nodes + nt + tr as usize, &mut indeg, &mut order);
            }
        }
        let mut bl = vec![0.0f64; n];
        for &x in order.iter().rev() {
            let x = x as usize;
            let mut best = 0.0f64;
            for i in self.succ_start[x]..self.succ_start[x + 1] {
                best = best.max(bl[self.succ[i as usize] as usize]);
            }
            if let Some((tr, true)) = self.transfer_of(x) {
                best = best.max(self.transfer_alone(tr) + bl[nodes + nt + tr as usize]);
            }
            bl[x] = self.host_s[x] + self.dev_s[x] + best;
        }
        bl
    }

    /// One step back along the critical path from task `x`, which the path leaves at `exit`:
    /// where it entered `x`, the task before, and what the interval went to.
    fn path_step(&self, x: usize, exit: f64) -> (f64, u32, Vec<(String, f64)>) {
        let t = &self.t;
        let kind = self.kind_name(x).to_owned();
        let mut cuts: Vec<(String, f64, f64)> = Vec::new();
        let (entry, next) = match self.what[x] {
            What::Recv(tr) => {
                let s = self.graph.nodes.len() + tr as usize;
                cuts.push(("transfer".into(), t.end[s], t.cond[x]));
                cuts.push(("completion seen".into(), t.cond[x], exit));
                (t.end[s], s as u32)
            }
            What::Compute(_) if self.is_gpu[x] => {
                let q = (self.dpred_start[x]..self.dpred_start[x + 1])
                    .map(|i| self.dpred[i as usize])
                    .max_by(|&a, &b| t.dev_end[a as usize].total_cmp(&t.dev_end[b as usize]));
                let gpu = format!("gpu {kind}");
                match q.filter(|&q| t.dev_end[q as usize] > t.end[x]) {
                    Some(q) => {
                        let e = t.dev_end[q as usize];
                        cuts.push(("stream wait".into(), e, t.dev_start[x]));
                        cuts.push((gpu, t.dev_start[x], t.dev_end[x]));
                        cuts.push(("completion seen".into(), t.dev_end[x], exit));
                        (e, q)
                    }
                    None => {
                        cuts.push(("waiting for a worker".into(), t.ready[x], t.start[x]));
                        cuts.push((format!("host {kind}"), t.start[x], t.end[x]));
                        cuts.push(("stream wait".into(), t.end[x], t.dev_start[x]));
                        cuts.push((gpu, t.dev_start[x], t.dev_end[x]));
                        cuts.push(("completion seen".into(), t.dev_end[x], exit));
                        (t.ready[x], t.cause[x])
                    }
                }
            }
            _ => {
                cuts.push(("waiting for a worker".into(), t.ready[x], t.start[x]));
                let body = match self.what[x] {
                    What::Compute(_) => format!("host {kind}"),
                    _ => kind.clone(),
                };
                cuts.push((body, t.start[x], t.end[x]));
                cuts.push(("completion seen".into(), t.end[x], exit));
                (t.ready[x], t.cause[x])
            }
        };
        let mut parts: Vec<(String, f64)> = cuts
            .into_iter()
            .map(|(k, a, b)| (k, overlap(a, b, entry, exit)))
            .filter(|p| p.1 > 0.0)
            .collect();
        let covered: f64 = parts.iter().map(|p| p.1).sum();
        if exit - entry - covered > 1e-12 {
            parts.push(("other".into(), exit - entry - covered));
        }
        (entry, next, parts)
    }

    fn critical_path(&self, makespan: f64) -> Vec<PathStep> {
        let mut steps = Vec::new();
        let last = (0..self.tasks()).max_by(|&a, &b| self.t.done[a].total_cmp(&self.t.done[b]));
        let Some(mut x) = last else {
            return steps;
        };
        let mut exit = self.t.done[x];
        if makespan > exit {
            steps.push(PathStep {
                name: "statuses of every rank".into(),
                rank: 0,
                start_s: exit,
                end_s: makespan,
                parts: vec![("status exchange".into(), makespan - exit)],
            });
        }
        for _ in 0..=self.tasks() {
            let (entry, next, parts) = self.path_step(x, exit);
            steps.push(PathStep {
                name: self.task_name(x),
                rank: self.rank_of[x] as usize,
                start_s: entry,
                end_s: exit,
                parts,
            });
            if next == NONE {
                break;
            }
            exit = entry;
            x = next as usize;
        }
        steps
    }

    fn busy_lists(&mut self, makespan: f64) -> (Vec<Busy>, Vec<Busy>, Vec<Busy>, Vec<Busy>) {
        let span = makespan.max(1e-30);
        let workers = self
            .workers
            .iter()
            .enumerate()
            .map(|(w, wk)| Busy {
                name: format!(
                    "rank {} worker {w} ({})",
                    wk.rank, self.machine.groups[wk.group as usize].name
                ),
                fraction: wk.busy_s / span,
                amount: 0.0,
            })
            .collect();
        for g in &mut self.gpus {
            g.close(makespan);
        }
        let gpus = self
            .gpus
            .iter()
            .enumerate()
            .map(|(g, f)| Busy {
                name: format!("GPU {g}"),
                fraction: f.active / span,
                amount: f.used / span,
            })
            .collect();
        let links = self
            .ports
            .iter()
            .filter(|p| p.bytes > 0.0)
            .map(|p| Busy {
                name: p.name.clone(),
                fraction: p.busy_s / span,
                amount: p.bytes,
            })
            .collect();
        let comm = self
            .ranks
            .iter()
            .enumerate()
            .map(|(r, rk)| Busy {
                name: format!("rank {r} communication thread"),
                fraction: rk.comm.busy_s / span,
                amount: 0.0,
            })
            .collect();
        (workers, gpus, links, comm)
    }

    fn bounds(&self) -> Bounds {
        let path_s = self.bottom_levels().into_iter().fold(0.0, f64::max);
        let n = self.graph.nodes.len();
        let dev: f64 = self.dev_s[..n].iter().sum();
        let work_s = if dev > 0.0 {
            dev / self.gpus.len().max(1) as f64
        } else {
            let host: f64 = self.host_s[..n].iter().sum();
            let lanes = (self.workers.len()).min(self.machine.hosts * self.machine.cores_per_host);
            host / lanes.max(1) as f64
        };
        Bounds { path_s, work_s }
    }

    fn trace(&self) -> Trace {
        let mut tracks: Vec<TraceTrack> = Vec::new();
        let mut index = std::collections::HashMap::new();
        let mut slices = Vec::with_capacity(self.rec.recs.len());
        let graph = self.graph.desc.name.clone();
        for rec in &self.rec.recs {
            let key = match rec.track {
                Track::Worker(w) => (0, w),
                Track::Stream(s) => (1, s),
                Track::Port(p) => (2, p),
                Track::Comm(r) => (3, r),
            };
            let track = *index.entry(key).or_insert_with(|| {
                tracks.push(self.track(rec.track));
                tracks.len() - 1
            });
            let t = rec.task as usize;
            let (name, node) = if rec.task == NONE {
                ("park".to_owned(), None)
            } else {
                let node = match self.what[t] {
                    What::Compute(i) => Some(i),
                    _ => None,
                };
                (self.task_name(t), node)
            };
            slices.push(TraceSlice {
                track,
                name,
                graph: if rec.task == NONE {
                    String::new()
                } else {
                    graph.clone()
                },
                node,
                start_ns: ns(rec.start),
                end_ns: ns(rec.end),
                kind: match rec.kind {
                    Kind::Node { stolen } => SliceKind::Node { stolen },
                    Kind::Park => SliceKind::Park,
                    Kind::Span => SliceKind::Span,
                },
            });
        }
        // Worker tracks first (in worker order), as a real trace lists them.
        let mut order: Vec<usize> = (0..tracks.len()).collect();
        order.sort_by_key(|&i| (tracks[i].worker.is_none(), tracks[i].worker, i));
        let mut new_of = vec![0; tracks.len()];
        for (new, &old) in order.iter().enumerate() {
            new_of[old] = new;
        }
        for s in &mut slices {
            s.track = new_of[s.track];
        }
        let tracks = order.into_iter().map(|i| tracks[i].clone()).collect();
        Trace {
            epoch: std::time::Instant::now(),
            tracks,
            slices,
            dropped: 0,
        }
    }

    fn track(&self, t: Track) -> TraceTrack {
        let m = self.machine;
        match t {
            Track::Worker(w) => {
                let wk = &self.workers[w as usize];
                let group = m.groups[wk.group as usize].name.clone();
                TraceTrack {
                    name: format!("rank {} worker {w} ({group})", wk.rank),
                    worker: Some(w as usize),
                    core: None,
                    group,
                }
            }
            Track::Stream(s) => {
                let st = &self.streams[s as usize];
                let wk = &self.workers[st.worker as usize];
                TraceTrack {
                    name: format!(
                        "rank {} GPU {} stream {s}{}",
                        wk.rank,
                        st.gpu,
                        if st.high { " (high)" } else { "" }
                    ),
                    worker: None,
                    core: None,
                    group: String::new(),
                }
            }
            Track::Port(p) => TraceTrack {
                name: self.ports[p as usize].name.clone(),
                worker: None,
                core: None,
                group: String::new(),
            },
            Track::Comm(r) => TraceTrack {
                name: format!("rank {r} communication thread"),
                worker: None,
                core: None,
                group: String::new(),
            },
        }
    }

    pub(crate) fn report(mut self) -> SimResult<SimReport> {
        let m = self.machine;
        let end = self.ranks.iter().map(|r| r.end).fold(0.0, f64::max);
        // Every rank's status reaches every other before `wait` returns.
        let status = if m.ranks() > 1 {
            if m.hosts > 1 {
                m.links.network.latency_s
            } else {
                m.links.shm.latency_s
            }
        } else {
            0.0
        };
        let makespan = end + status;
        let (workers, gpus, links, comm) = self.busy_lists(makespan);
        let critical_path = self.critical_path(makespan);
        let mut parts: Vec<(String, f64)> = Vec::new();
        for p in critical_path.iter().flat_map(|s| s.parts.iter()) {
            match parts.iter_mut().find(|x| x.0 == p.0) {
                Some(x) => x.1 += p.1,
                None => parts.push(p.clone()),
            }
        }
        parts.sort_by(|a, b| b.1.total_cmp(&a.1));
        let n = self.graph.nodes.len();
        let bytes_moved = self.bytes[n..n + self.lowering.transfers.len()]
            .iter()
            .sum();
        let peak = m.gpu.as_ref().map_or(0.0, |g| g.fp64_tflops) * self.gpus.len() as f64;
        Ok(SimReport {
            graph: self.graph.desc.name.clone(),
            machine: m.name.clone(),
            ranks: m.ranks(),
            nodes: n,
            transfers: self.lowering.transfers.len(),
            bytes_moved,
            makespan_s: makespan,
            flops: self.graph.flops,
            peak_tflops: peak,
            events: self.events,
            workers,
            gpus,
            links,
            comm,
            bounds: self.bounds(),
            trace: self.rec.on.then(|| self.trace()),
            critical_path,
            path_parts: parts,
        })
    }
}
