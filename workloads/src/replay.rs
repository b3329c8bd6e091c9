//! The replay bench: graphs of empty-kernel GPU nodes (`<<<1,1>>>`) run eagerly on a boundpool
//! GPU pool, replayed as CUDA graphs ([`boundpool_gpu::Replayable`]), and launched as a raw CUDA
//! graph of the same topology built with the driver API
//! ([`crate::baselines::raw_graph`]), all in one process, interleaved round by round.
//! Each round times a fresh instantiation of both the replay and the raw graph (an executable's
//! speed varies from one instantiation to the next). Used by `cargo bench -p boundpool-bench --bench replay` and `boundpool bench --gpu`.
//! [`bench_variants`] is the bench's `--variants` experiment: the same graphs made six ways on one
//! bound thread ([`baselines::graph_variants`]), to find why a captured graph launches slower
//! than one built node by node.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use boundpool_gpu::{
    builtin, BoxError, DeviceBuffer, Devices, GpuDevice, GpuGraph, GpuGraphBuilder, GpuGraphExt,
    GpuPool, GpuPoolBuilder, GpuResult, Kernel, LaunchConfig, Module, RNode, ReplayBuilder,
    ReplayCtx, Replayable, SmPartition,
};

use crate::baselines;
use crate::shapes::{Dag, Shape};
use crate::stats::median;

/// A shape of the replay bench: the three of the issue, plus the command line's built-ins.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuShape {
    /// `n` nodes, no edges.
    Independent,
    /// One of the built-in shapes ([`Shape`]).
    Builtin(Shape),
}

impl GpuShape {
    /// The name in tables and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            GpuShape::Independent => "independent",
            GpuShape::Builtin(s) => s.name(),
        }
    }

    /// Predecessor lists of the shape with about `n` nodes (each predecessor below its node).
    pub fn preds(self, n: usize) -> Vec<Vec<u32>> {
        match self {
            GpuShape::Independent => vec![Vec::new(); n],
            GpuShape::Builtin(s) => {
                let dag = Dag::shape(s, n);
                let mut preds = vec![Vec::new(); dag.len()];
                for &(a, b) in &dag.edges {
                    preds[b as usize].push(a);
                }
                preds
            }
        }
    }
}

/// Starts the bench's GPU pool on device 0: `workers` bound workers, unpinned. Fails (with the
/// reason) where there is no GPU.
pub fn gpu_pool(workers: usize) -> GpuResult<GpuPool> {
    gpu_pool_with(workers, Vec::new())
}

/// As [`gpu_pool`], with device 0's SMs split into `partitions`
/// ([`GpuPoolBuilder::sm_partitions`]) when there are any: the workers are then the
/// partitions' (`workers` is not used). A size the device cannot give fails
/// ([`GpuErrorKind::Partition`](boundpool_gpu::GpuErrorKind::Partition)).
pub fn gpu_pool_with(workers: usize, partitions: Vec<SmPartition>) -> GpuResult<GpuPool> {
    let b = GpuPoolBuilder::new()
        .name("replay-bench")
        .devices(Devices::List(vec![0]))
        .workers_per_device(workers)
        .unpinned();
    if partitions.is_empty() {
        b.build()
    } else {
        b.sm_partitions(partitions).build()
    }
}

fn empty_kernel() -> GpuResult<Kernel> {
    Module::builtin().kernel(builtin::EMPTY)
}

/// The shape as an ordinary (eager) GPU graph: one `gpu_node` per node, each launching the
/// empty kernel.
pub fn eager_graph(
    dev: &GpuDevice,
    shape: GpuShape,
    preds: &[Vec<u32>],
) -> Result<GpuGraph, BoxError> {
    let k = empty_kernel()?;
    let mut g = GpuGraphBuilder::with_capacity(
        shape.name().to_owned(),
        preds.len(),
        preds.iter().map(Vec::len).sum(),
    );
    let mut refs = Vec::with_capacity(preds.len());
    for (i, ps) in preds.iter().enumerate() {
        let k = k.clone();
        let r = g.gpu_node(dev, &format!("n{i}"), move |ctx| {
            // SAFETY: the empty kernel takes no parameters.
            unsafe { ctx.launch(&k, LaunchConfig::single()).launch()? };
            Ok(())
        });
        for &p in ps {
            g.edge(refs[p as usize], r);
        }
        refs.push(r);
    }
    Ok(g.build()?)
}

/// The shape as a replay graph: one captured node per node, each launching the empty kernel.
pub fn replay_graph(dev: &GpuDevice, shape: GpuShape, preds: &[Vec<u32>]) -> GpuResult<Replayable> {
    replay_graph_with(dev, shape, preds, None)
}

/// [`replay_graph`], captured with [`ReplayBuilder::max_width`] `w` when given.
pub fn replay_graph_with(
    dev: &GpuDevice,
    shape: GpuShape,
    preds: &[Vec<u32>],
    max_width: Option<usize>,
) -> GpuResult<Replayable> {
    let k = empty_kernel()?;
    let mut b = ReplayBuilder::new(shape.name());
    if let Some(w) = max_width {
        b.max_width(w);
    }
    let mut refs: Vec<RNode<()>> = Vec::with_capacity(preds.len());
    for (i, ps) in preds.iter().enumerate() {
        let k = k.clone();
        let r = b.gpu_node(dev, &format!("n{i}"), move |c: &ReplayCtx<'_, '_>| {
            // SAFETY: the empty kernel takes no parameters.
            unsafe { c.gpu()?.launch(&k, LaunchConfig::single()).launch()? };
            Ok(())
        });
        for &p in ps {
            b.edge(refs[p as usize], r);
        }
        refs.push(r);
    }
    b.build()
}

/// Settings of [`bench_replay`].
#[derive(Clone, Debug)]
pub struct ReplayBenchConfig {
    /// Nodes per graph (the wavefront is rounded down to a square: 1,000 gives 31x31; the
    /// issue's 32x32 is 1,024).
    pub nodes: usize,
    /// Rounds; each round times `per_round` runs of each implementation.
    pub rounds: usize,
    /// Timed runs per implementation and round.
    pub per_round: usize,
    /// Bound workers of the pool ([`bench_replay`]'s; [`bench_replay_on`] runs on the pool it is given).
    pub workers: usize,
    /// The shapes.
    pub shapes: Vec<(GpuShape, usize)>,
    /// For each `w` here, one more row of the independent shape replayed with
    /// [`ReplayBuilder::max_width`] `w`; its raw graph has the same lane edges (node `i` after
    /// node `i - w`).
    pub widths: Vec<usize>,
}

impl Default for ReplayBenchConfig {
    fn default() -> Self {
        Self {
            nodes: 1000,
            rounds: 5,
            per_round: 20,
            workers: 4,
            shapes: vec![
                (GpuShape::Independent, 1000),
                (GpuShape::Builtin(Shape::Chain), 1000),
                (GpuShape::Builtin(Shape::Wavefront), 1024),
            ],
            widths: vec![8],
        }
    }
}

/// One shape's figures (medians of every timed run; times per graph run, each run waited for).
#[derive(Clone, Debug, PartialEq)]
pub struct ReplayRow {
    /// Shape name.
    pub shape: String,
    /// Nodes of the graph.
    pub nodes: usize,
    /// Edges of the graph.
    pub edges: usize,
    /// boundpool, eager (every GPU node a scheduler node), microseconds per run.
    pub eager_us: f64,
    /// boundpool replay, microseconds per run.
    pub replay_us: f64,
    /// The raw CUDA graph (launch + stream synchronise), microseconds per run.
    pub raw_us: f64,
    /// Segments (CUDA graphs) of the replay.
    pub segments: usize,
    /// Replay's first capture, microseconds per node (bodies called under capture).
    pub capture_us_per_node: f64,
    /// Replay's instantiation, microseconds per node.
    pub instantiate_us_per_node: f64,
    /// The raw graph's instantiation, microseconds per node.
    pub raw_instantiate_us_per_node: f64,
    /// The same graph captured from a stream on one bound thread as a replay segment is
    /// ([`baselines::captured_graph`]), launched + stream synchronise, microseconds per run.
    pub captured_us: f64,
    /// The same, each launch waited for by polling an event (as a worker waits).
    pub captured_polled_us: f64,
    /// That captured graph's instantiation, microseconds per node.
    pub captured_instantiate_us_per_node: f64,
    /// What the capture and the node-by-node build record for the first nodes (types,
    /// parameters, non-zero launch attributes), and the captured graph's node and edge counts.
    pub captured_notes: Vec<String>,
}

impl ReplayRow {
    /// Raw time over replay time: 1.0 is as fast as the raw CUDA graph (target >= 0.9).
    pub fn replay_vs_raw(&self) -> f64 {
        self.raw_us / self.replay_us
    }
    /// Eager time over replay time (the replay's speed-up).
    pub fn replay_speedup(&self) -> f64 {
        self.eager_us / self.replay_us
    }
    /// Nodes per second replayed.
    pub fn replay_nodes_per_s(&self) -> f64 {
        self.nodes as f64 / (self.replay_us * 1e-6)
    }
    /// Microseconds per edge of a chain (`replay_us / (nodes - 1)`).
    pub fn replay_us_per_edge(&self) -> f64 {
        self.replay_us / (self.nodes.max(2) - 1) as f64
    }

    /// One JSON object.
    pub fn to_json(&self) -> String {
        format!(
            "{{\"shape\":\"{}\",\"nodes\":{},\"edges\":{},\"eager_us\":{:.3},\"replay_us\":{:.3},\"raw_us\":{:.3},\"replay_vs_raw\":{:.4},\"replay_speedup\":{:.3},\"replay_nodes_per_s\":{:.0},\"replay_us_per_edge\":{:.4},\"segments\":{},\"capture_us_per_node\":{:.4},\"instantiate_us_per_node\":{:.4},\"raw_instantiate_us_per_node\":{:.4},\"captured_us\":{:.3},\"captured_polled_us\":{:.3},\"captured_instantiate_us_per_node\":{:.4}}}",
            self.shape,
            self.nodes,
            self.edges,
            self.eager_us,
            self.replay_us,
            self.raw_us,
            self.replay_vs_raw(),
            self.replay_speedup(),
            self.replay_nodes_per_s(),
            self.replay_us_per_edge(),
            self.segments,
            self.capture_us_per_node,
            self.instantiate_us_per_node,
            self.raw_instantiate_us_per_node,
            self.captured_us,
            self.captured_polled_us,
            self.captured_instantiate_us_per_node
        )
    }
}

/// What an update that changes only kernel arguments costs, against a fresh capture.
#[derive(Clone, Debug, PartialEq)]
pub struct UpdateRow {
    /// Nodes of the graph (independent, each `bp_set_i64(slot, v)`).
    pub nodes: usize,
    /// First capture + instantiation, microseconds (median over the rounds).
    pub fresh_us: f64,
    /// Re-capture + `cuGraphExecUpdate`, microseconds (median).
    pub update_us: f64,
    /// Of which `cuGraphExecUpdate` alone.
    pub exec_update_us: f64,
    /// Every update was applied in place (none re-instantiated).
    pub in_place: bool,
}

impl UpdateRow {
    /// Update over fresh (target <= 0.30).
    pub fn ratio(&self) -> f64 {
        self.update_us / self.fresh_us
    }

    /// One JSON object.
    pub fn to_json(&self) -> String {
        format!(
            "{{\"shape\":\"update\",\"nodes\":{},\"fresh_us\":{:.3},\"update_us\":{:.3},\"exec_update_us\":{:.3},\"update_vs_fresh\":{:.4},\"in_place\":{}}}",
            self.nodes,
            self.fresh_us,
            self.update_us,
            self.exec_update_us,
            self.ratio(),
            self.in_place
        )
    }
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// Runs the bench on device 0: for each shape, rounds of eager runs, replays and raw-graph
/// launches (each run waited for), interleaved; then the update row. `progress(done, total)`
/// after each round.
pub fn bench_replay(
    cfg: &ReplayBenchConfig,
    progress: impl FnMut(usize, usize),
) -> Result<(Vec<ReplayRow>, UpdateRow), BoxError> {
    let pool = gpu_pool(cfg.workers)?;
    let r = bench_replay_on(&pool, cfg, progress)?;
    pool.shutdown(boundpool_gpu::ShutdownMode::Finish);
    Ok(r)
}

/// As [`bench_replay`], on `pool` (its device 0; `cfg.workers` is not used), which is left running:
/// for a pool built otherwise, such as one of SM partitions ([`gpu_pool_with`]). Its nodes are
/// placed on the device, so any of its workers runs them; the raw-graph baselines use the
/// whole device.
pub fn bench_replay_on(
    pool: &GpuPool,
    cfg: &ReplayBenchConfig,
    mut progress: impl FnMut(usize, usize),
) -> Result<(Vec<ReplayRow>, UpdateRow), BoxError> {
    let dev = pool.devices()[0].clone();
    let cases = cases(cfg);
    let total = (cases.len() + 1) * cfg.rounds;
    let mut done = 0;
    let mut rows = Vec::new();
    for case in &cases {
        rows.push(case_row(pool, &dev, cfg, case, || {
            done += 1;
            progress(done, total);
        })?);
    }
    let upd = update_row(pool, &dev, cfg.nodes, cfg.rounds, |_| {
        done += 1;
        progress(done, total);
    })?;
    Ok((rows, upd))
}

/// One row of the replay bench: a shape, and with lanes the most branches a segment captures.
struct Case {
    label: String,
    shape: GpuShape,
    nodes: usize,
    width: Option<usize>,
}

/// The configuration's shapes, then the independent one again for each width.
fn cases(cfg: &ReplayBenchConfig) -> Vec<Case> {
    let mut cases: Vec<Case> = cfg
        .shapes
        .iter()
        .map(|&(shape, nodes)| Case {
            label: shape.name().to_owned(),
            shape,
            nodes,
            width: None,
        })
        .collect();
    if let Some(&(_, nodes)) = cfg.shapes.iter().find(|s| s.0 == GpuShape::Independent) {
        for &w in &cfg.widths {
            cases.push(Case {
                label: format!("independent w{w}"),
                shape: GpuShape::Independent,
                nodes,
                width: Some(w.max(1)),
            });
        }
    }
    cases
}

/// The raw graph of what a replay with `width` lanes captures: node i also after i - w.
fn lane_preds(preds: &[Vec<u32>], width: Option<usize>) -> Vec<Vec<u32>> {
    match width {
        None => preds.to_vec(),
        Some(w) => (0..preds.len())
            .map(|i| {
                let mut ps = preds[i].clone();
                if i >= w {
                    ps.push((i - w) as u32);
                }
                ps
            })
            .collect(),
    }
}

/// The timed runs of one case, in µs (instantiations per node).
#[derive(Default)]
struct Samples {
    eager: Vec<f64>,
    replay: Vec<f64>,
    /// Each round's replay median (each round replays an executable of its own).
    replay_rounds: Vec<f64>,
    raw: Vec<f64>,
    raw_instantiate: Vec<f64>,
    captured: Vec<f64>,
    captured_polled: Vec<f64>,
    captured_instantiate: Vec<f64>,
}

/// Measures `case`: after a first replay run (capture and instantiation) and a warm-up of the
/// eager graph, `cfg.rounds` rounds of eager runs, replays, raw-graph and captured-graph
/// launches, interleaved; `tick` after each round.
fn case_row(
    pool: &GpuPool,
    dev: &GpuDevice,
    cfg: &ReplayBenchConfig,
    case: &Case,
    mut tick: impl FnMut(),
) -> Result<ReplayRow, BoxError> {
    let (shape, width) = (case.shape, case.width);
    let preds = shape.preds(case.nodes);
    let eager = eager_graph(dev, shape, &preds)?;
    let replay = replay_graph_with(dev, shape, &preds, width)?;
    let raw_preds = lane_preds(&preds, width);
    // The first run captures and instantiates.
    replay.run(pool)?;
    let s = replay.stats();
    // Warm-up of the eager path.
    for _ in 0..3 {
        pool.submit(&eager)?.wait()?;
    }
    let mut t = Samples::default();
    let mut notes = Vec::new();
    for round in 0..cfg.rounds {
        for _ in 0..cfg.per_round {
            let t0 = Instant::now();
            pool.submit(&eager)?.wait()?;
            t.eager.push(us(t0.elapsed()));
        }
        // Each round replays an executable of its own (captured and instantiated untimed
        // before), as each round's raw graph below is instantiated anew: one instantiation
        // of the same graph can run ~15% slower than the next (1,000 roots, H100), so both
        // sides sample that alike.
        let fresh;
        let this = if round == 0 {
            &replay
        } else {
            fresh = replay_graph_with(dev, shape, &preds, width)?;
            fresh.run(pool)?;
            &fresh
        };
        let mut this_round = Vec::with_capacity(cfg.per_round);
        for _ in 0..cfg.per_round {
            let t0 = Instant::now();
            this.run(pool)?;
            this_round.push(us(t0.elapsed()));
        }
        t.replay_rounds.push(median(&this_round));
        t.replay.extend(this_round);
        let raw = baselines::raw_graph(dev.ordinal(), &raw_preds, cfg.per_round)?;
        t.raw.extend(raw.runs.iter().map(|&d| us(d)));
        t.raw_instantiate
            .push(us(raw.instantiate) / raw.nodes.max(1) as f64);
        let cap = baselines::captured_graph(dev.ordinal(), &raw_preds, cfg.per_round, true)?;
        t.captured.extend(cap.runs.iter().map(|&d| us(d)));
        t.captured_polled
            .extend(cap.polled_runs.iter().map(|&d| us(d)));
        t.captured_instantiate
            .push(us(cap.instantiate) / cap.nodes.max(1) as f64);
        if notes.is_empty() {
            notes = capture_notes(pool, dev, &replay, &cap, &raw_preds, cfg.per_round)?;
        }
        tick();
    }
    notes.insert(
        0,
        format!(
            "replay, each round's own instantiation: {} us (medians of its runs)",
            t.replay_rounds
                .iter()
                .map(|v| format!("{v:.1}"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    );
    let per_node = |d: Duration| us(d) / preds.len().max(1) as f64;
    Ok(ReplayRow {
        shape: case.label.clone(),
        nodes: preds.len(),
        edges: preds.iter().map(Vec::len).sum(),
        eager_us: median(&t.eager),
        replay_us: median(&t.replay),
        raw_us: median(&t.raw),
        segments: replay.segments(),
        capture_us_per_node: per_node(s.capture_time),
        instantiate_us_per_node: per_node(s.instantiate_time),
        raw_instantiate_us_per_node: median(&t.raw_instantiate),
        captured_us: median(&t.captured),
        captured_polled_us: median(&t.captured_polled),
        captured_instantiate_us_per_node: median(&t.captured_instantiate),
        captured_notes: notes,
    })
}

/// What a capture records, told apart from what the scheduler around it costs: the replay's
/// stand-in roots, the captured graph `cap` against the one built node by node, the same
/// capture reading tails back only where needed, and on a worker of `pool` (its thread, its
/// node's stream) with the baseline's and then the worker's function handle.
fn capture_notes(
    pool: &GpuPool,
    dev: &GpuDevice,
    replay: &Replayable,
    cap: &baselines::CapturedGraph,
    raw_preds: &[Vec<u32>],
    runs: usize,
) -> Result<Vec<String>, BoxError> {
    let mut notes = vec![
        format!(
            "replay's captures with a stand-in root: {} of {}",
            replay.stats().stand_in_roots,
            replay.stats().captures
        ),
        format!(
            "captured graph: {} nodes, {} edges{}",
            cap.nodes,
            cap.edges,
            if cap.stand_in_root {
                " (empty dependency set refused: stand-in root, removed)"
            } else {
                ""
            }
        ),
    ];
    notes.extend(
        cap.first_nodes
            .iter()
            .take(1)
            .map(|l| format!("captured: {l}")),
    );
    notes.extend(
        cap.raw_first_nodes
            .iter()
            .take(1)
            .map(|l| format!("built:    {l}")),
    );
    let lean = baselines::captured_graph(dev.ordinal(), raw_preds, runs, false)?;
    notes.push(format!(
        "captured reading tails back only where needed: {:.1} us a run, instantiate {:.3} us/node, {} nodes, {} edges",
        median(lean.runs.iter().map(|&d| us(d))),
        us(lean.instantiate) / lean.nodes.max(1) as f64,
        lean.nodes,
        lean.edges
    ));
    for worker_function in [false, true] {
        let w = baselines::captured_graph_on_worker(pool, dev, raw_preds, runs, worker_function)?;
        notes.push(format!(
            "captured on a pool worker ({} function): {:.1} us a run, instantiate {:.3} us/node, {} nodes, {} edges",
            if worker_function { "its" } else { "baseline" },
            median(w.runs.iter().map(|&d| us(d))),
            us(w.instantiate) / w.nodes.max(1) as f64,
            w.nodes,
            w.edges
        ));
    }
    Ok(notes)
}

/// `nodes` independent nodes, each `bp_set_i64(slot_i, v)` with `v` read by the body: a fresh
/// replay graph per round (capture + instantiate), then `v` changed and an update (re-capture +
/// `cuGraphExecUpdate`), checked on the device.
fn update_row(
    pool: &GpuPool,
    dev: &GpuDevice,
    nodes: usize,
    rounds: usize,
    mut tick: impl FnMut(usize),
) -> Result<UpdateRow, BoxError> {
    let set = Module::builtin().kernel(builtin::SET_I64)?;
    let slots: Arc<DeviceBuffer<i64>> =
        Arc::new(pool.call(dev, move |c| Ok(c.alloc_zeros::<i64>(nodes)?))?);
    let (mut fresh, mut upd, mut exec_upd) = (vec![], vec![], vec![]);
    let mut in_place = true;
    for round in 0..rounds {
        let param = Arc::new(AtomicI64::new(round as i64 * 10));
        let mut b = ReplayBuilder::new("update");
        for i in 0..nodes {
            let (set, slots, param) = (set.clone(), slots.clone(), param.clone());
            b.gpu_node(dev, &format!("n{i}"), move |c: &ReplayCtx<'_, '_>| {
                let v = param.load(Ordering::Relaxed) + i as i64;
                let addr = slots.device_ptr() + 8 * i as u64;
                // SAFETY: bp_set_i64(i64*, i64): `addr` is element i of a live allocation of
                // `nodes` i64 that outlives the graph (held by the closure).
                unsafe {
                    c.gpu()?
                        .launch(&set, LaunchConfig::single())
                        .arg(addr)
                        .arg(v)
                        .launch()?
                };
                Ok(())
            });
        }
        let r = b.build()?;
        r.run(pool)?;
        let s0 = r.stats();
        fresh.push(us(s0.capture_time + s0.instantiate_time));
        param.store(round as i64 * 10 + 5, Ordering::Relaxed);
        r.update();
        r.run(pool)?;
        let s1 = r.stats();
        in_place &= s1.updates == 1 && s1.update_fallbacks == 0;
        upd.push(us(s1.capture_time - s0.capture_time + s1.update_time));
        exec_upd.push(us(s1.update_time));
        let s2 = slots.clone();
        let got = pool.download(&s2)?;
        let want: Vec<i64> = (0..nodes as i64)
            .map(|i| round as i64 * 10 + 5 + i)
            .collect();
        if got != want {
            return Err(format!(
                "update bench round {round}: the updated graph wrote wrong values"
            )
            .into());
        }
        tick(round);
    }
    Ok(UpdateRow {
        nodes,
        fresh_us: median(&fresh),
        update_us: median(&upd),
        exec_update_us: median(&exec_upd),
        in_place,
    })
}

/// The table of [`bench_replay`]'s rows, with the targets.
pub fn replay_table(rows: &[ReplayRow], upd: &UpdateRow) -> String {
    let mut s = String::new();
    s.push_str(&format!(
        "{:<12} {:>6} {:>11} {:>11} {:>11} {:>9} {:>9} {:>12} {:>10} {:>10} {:>10}\n",
        "shape",
        "nodes",
        "eager us",
        "replay us",
        "raw us",
        "vs raw",
        "speedup",
        "nodes/s",
        "capture/n",
        "inst/n",
        "raw inst/n"
    ));
    for r in rows {
        s.push_str(&format!(
            "{:<12} {:>6} {:>11.1} {:>11.1} {:>11.1} {:>8.3}x {:>8.2}x {:>12.0} {:>9.3}us {:>9.3}us {:>9.3}us\n",
            r.shape,
            r.nodes,
            r.eager_us,
            r.replay_us,
            r.raw_us,
            r.replay_vs_raw(),
            r.replay_speedup(),
            r.replay_nodes_per_s(),
            r.capture_us_per_node,
            r.instantiate_us_per_node,
            r.raw_instantiate_us_per_node
        ));
    }
    s.push_str(&format!(
        "update ({} nodes, arguments only): {:.1} us (of which cuGraphExecUpdate {:.1} us) vs fresh capture + instantiate {:.1} us: {:.3} (target <= 0.30){}\n",
        upd.nodes,
        upd.update_us,
        upd.exec_update_us,
        upd.fresh_us,
        upd.ratio(),
        if upd.in_place { "" } else { "; SOME UPDATES RE-INSTANTIATED" }
    ));
    for r in rows {
        match r.shape.as_str() {
            "chain" => s.push_str(&format!(
                "chain edge: {:.3} us (target <= 1.0)\n",
                r.replay_us_per_edge()
            )),
            shape if shape.starts_with("independent") => s.push_str(&format!(
                "{shape}: {:.0} nodes/s (target >= 1,290,000)\n",
                r.replay_nodes_per_s()
            )),
            _ => {}
        }
    }
    s.push_str("replay vs raw CUDA graph: target >= 0.9x on every shape\n");
    for r in rows {
        s.push_str(&format!(
            "{}: the graph captured on one thread as a segment is: {:.1} us a run (synchronise), {:.1} us (event polled), instantiate {:.3} us/node\n",
            r.shape, r.captured_us, r.captured_polled_us, r.captured_instantiate_us_per_node
        ));
        for n in &r.captured_notes {
            s.push_str(&format!("  {n}\n"));
        }
    }
    s
}

/// One variant of one shape in [`bench_variants`]: see [`baselines::graph_variants`].
#[derive(Clone, Debug, PartialEq)]
pub struct VariantRow {
    /// Shape name.
    pub shape: String,
    /// The variant, one of [`baselines::GRAPH_VARIANTS`].
    pub variant: &'static str,
    /// Nodes of its graph (checked against the DAG by the baseline).
    pub nodes: usize,
    /// Edges of its graph (checked likewise).
    pub edges: usize,
    /// Launch + stream synchronise, microseconds: median of every timed run of every round.
    pub us: f64,
    /// Each round's median (each round builds and instantiates every variant anew).
    pub round_us: Vec<f64>,
    /// The `plain` variant's `us` over this one's: 1.0 is as fast as the graph built node by
    /// node, below 1.0 slower.
    pub vs_plain: f64,
    /// `cuGraphInstantiateWithFlags`, microseconds (median over the rounds).
    pub instantiate_us: f64,
}

impl VariantRow {
    /// One JSON object.
    pub fn to_json(&self) -> String {
        format!(
            "{{\"shape\":\"{}\",\"variant\":\"{}\",\"nodes\":{},\"edges\":{},\"us\":{:.3},\"round_us\":[{}],\"vs_plain\":{:.4},\"instantiate_us\":{:.3}}}",
            self.shape,
            self.variant,
            self.nodes,
            self.edges,
            self.us,
            self.round_us
                .iter()
                .map(|v| format!("{v:.3}"))
                .collect::<Vec<_>>()
                .join(","),
            self.vs_plain,
            self.instantiate_us
        )
    }
}

/// The graph-variants experiment on device 0 ([`baselines::graph_variants`]): for each shape,
/// `rounds` rounds, each building, instantiating and timing every variant anew (`runs` timed
/// launches each, interleaved); no pool. Returns the rows (per shape, in the order of
/// [`baselines::GRAPH_VARIANTS`]) and notes: whether a capture used a stand-in root, and the
/// first nodes of the plain, captured and rebuilt graphs as the driver describes them.
pub fn bench_variants(
    shapes: &[(GpuShape, usize)],
    rounds: usize,
    runs: usize,
    mut progress: impl FnMut(usize, usize),
) -> Result<(Vec<VariantRow>, Vec<String>), BoxError> {
    let rounds = rounds.max(1);
    let (mut rows, mut notes) = (Vec::new(), Vec::new());
    let total = shapes.len() * rounds;
    let mut done = 0;
    for &(shape, n) in shapes {
        let preds = shape.preds(n);
        let mut measured = Vec::with_capacity(rounds);
        for _ in 0..rounds {
            measured.push(baselines::graph_variants(0, &preds, runs)?);
            done += 1;
            progress(done, total);
        }
        let roots = measured.iter().filter(|m| m.stand_in_root).count();
        notes.push(format!(
            "{}: captures with a stand-in root (empty dependency set refused): {roots} of {}",
            shape.name(),
            measured.len()
        ));
        if let Some(m) = measured.first() {
            for (name, lines) in &m.described {
                for l in lines {
                    notes.push(format!("{} {name:<16} {l}", shape.name()));
                }
            }
        }
        let per_variant = |k: usize| -> (Vec<f64>, Vec<f64>, Vec<f64>) {
            let (mut all, mut per_round, mut inst) = (vec![], vec![], vec![]);
            for m in &measured {
                let v = &m.variants[k];
                let r: Vec<f64> = v.runs.iter().map(|&d| us(d)).collect();
                per_round.push(median(&r));
                all.extend(r);
                inst.push(us(v.instantiate));
            }
            (all, per_round, inst)
        };
        let plain = baselines::GRAPH_VARIANTS
            .iter()
            .position(|&v| v == "plain")
            .unwrap_or(0);
        let plain_us = median(per_variant(plain).0);
        for (k, &name) in baselines::GRAPH_VARIANTS.iter().enumerate() {
            let (all, round_us, inst) = per_variant(k);
            let v = &measured[0].variants[k];
            debug_assert_eq!(v.name, name);
            let this_us = median(&all);
            rows.push(VariantRow {
                shape: shape.name().to_owned(),
                variant: name,
                nodes: v.nodes,
                edges: v.edges,
                us: this_us,
                round_us,
                vs_plain: plain_us / this_us,
                instantiate_us: median(&inst),
            });
        }
    }
    Ok((rows, notes))
}

/// The table of [`bench_variants`]'s rows, then its notes.
pub fn variants_table(rows: &[VariantRow], notes: &[String]) -> String {
    let mut s = format!(
        "{:<12} {:<17} {:>10} {:>11} {:>12} {:>6} {:>6}  {}\n",
        "shape",
        "variant",
        "us/launch",
        "plain/this",
        "instantiate",
        "nodes",
        "edges",
        "rounds' medians (us)"
    );
    for r in rows {
        s.push_str(&format!(
            "{:<12} {:<17} {:>10.1} {:>10.3}x {:>10.1}us {:>6} {:>6}  {}\n",
            r.shape,
            r.variant,
            r.us,
            r.vs_plain,
            r.instantiate_us,
            r.nodes,
            r.edges,
            r.round_us
                .iter()
                .map(|v| format!("{v:.1}"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    for n in notes {
        s.push_str(&format!("  {n}\n"));
    }
    s
}
