//! GPU benchmarks: boundpool's GPU nodes against baselines measured in the same process.
//!
//! An empty kernel `<<<1,1>>>` per node. Baselines (from `boundpool_workloads`): raw
//! launches from k bound threads with a stream each; an OS thread per task; one server thread
//! fed by a channel from 8 submitters; cross-stream chains with an event edge or a host
//! synchronise per edge. Each figure is the median of several runs. The independent nodes run
//! twice: launching through boundpool's own `Launch`, and through cudarc's `launch_builder` on
//! the node's `CudaStream` (what code written against cudarc pays inside a node).
//!
//! `cargo bench -p boundpool-bench --bench gpu [-- --runs N --nodes N]`. Without a GPU it says why and exits.

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use boundpool_gpu::cudarc::driver::{CudaFunction, LaunchConfig as CuLaunch};
use boundpool_gpu::cudarc::nvrtc::Ptx;
use boundpool_gpu::{
    builtin, Devices, GpuDevice, GpuGraph, GpuGraphBuilder, GpuGraphExt, GpuPool, GpuPoolBuilder,
    GroupId, Kernel, LaunchConfig, Module,
};
use boundpool_workloads as baselines;
use boundpool_workloads::median;

/// GPU nodes against raw-driver baselines, in one process (see the top of this file).
#[derive(clap::Parser, Debug)]
struct Args {
    /// Runs of each measurement (the median is reported).
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Nodes of the independent graphs.
    #[arg(long, default_value_t = 40_000)]
    nodes: usize,
    /// Edges of the chains.
    #[arg(long, default_value_t = 20_000)]
    edges: usize,
    /// Only this part: independent, submitters or chain.
    #[arg(long)]
    only: Option<String>,
}

fn empty_node(
    g: &mut GpuGraphBuilder,
    group: GroupId,
    name: &str,
    k: &Kernel,
) -> boundpool_gpu::NodeRef<()> {
    let k = k.clone();
    g.gpu_node_in(group, name, move |ctx| {
        // SAFETY: the empty kernel takes no arguments.
        unsafe { ctx.launch(&k, LaunchConfig::single()).launch()? };
        Ok(())
    })
}

fn independent_graph(d: &GpuDevice, k: &Kernel, n: usize) -> GpuGraph {
    let mut g = GpuGraphBuilder::with_capacity("independent", n, 0);
    for i in 0..n {
        empty_node(&mut g, d.group(), &format!("e{i}"), k);
    }
    g.build().unwrap()
}

/// As [`independent_graph`], each node launching the empty kernel through cudarc
/// (`launch_builder` on the node's `CudaStream`, the worker's `CudaFunction` from its state).
fn independent_cudarc_graph(d: &GpuDevice, n: usize) -> GpuGraph {
    let mut g = GpuGraphBuilder::with_capacity("independent cudarc", n, 0);
    for i in 0..n {
        g.gpu_node_in(d.group(), &format!("e{i}"), |ctx| {
            let f = ctx.state::<CudaFunction>()?;
            let one = CuLaunch {
                grid_dim: (1, 1, 1),
                block_dim: (1, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: the empty kernel takes no parameters.
            unsafe { ctx.stream().launch_builder(f).launch(one)? };
            Ok(())
        });
    }
    g.build().unwrap()
}

/// A pool whose workers load the empty kernel through cudarc at start.
fn cudarc_pool(workers: usize) -> GpuPool {
    GpuPoolBuilder::new()
        .name("bench-cudarc")
        .devices(Devices::List(vec![0]))
        .workers_per_device(workers)
        .worker_state(|s| -> Result<CudaFunction, boundpool_gpu::BoxError> {
            let m = s.context().load_module(Ptx::from_src(builtin::PTX))?;
            Ok(m.load_function(builtin::EMPTY)?)
        })
        .build()
        .unwrap()
}

fn chain_graph(groups: &[GroupId], k: &Kernel, edges: usize) -> GpuGraph {
    let mut g = GpuGraphBuilder::with_capacity("chain", edges + 1, edges);
    let mut prev = empty_node(&mut g, groups[0], "c0", k);
    for i in 1..=edges {
        let n = empty_node(&mut g, groups[i % groups.len()], &format!("c{i}"), k);
        g.edge(prev, n);
        prev = n;
    }
    g.build().unwrap()
}

/// The chain's shape with host nodes that do nothing (the scheduler's handoff alone), or GPU
/// nodes that enqueue nothing (the handoff plus the GPU edge's record and wait).
fn bare_chain_graph(groups: &[GroupId], edges: usize, gpu: bool) -> GpuGraph {
    let mut g = GpuGraphBuilder::with_capacity("bare chain", edges + 1, edges);
    let mut prev = None;
    for i in 0..=edges {
        let group = groups[i % groups.len()];
        let n = if gpu {
            g.gpu_node_in(group, "b", |_| Ok(()))
        } else {
            let n = g.node("b", |_: &boundpool_scheduler::NodeCtx<'_, _>| Ok(()));
            g.place(n, group);
            n
        };
        if let Some(p) = prev {
            g.edge(p, n);
        }
        prev = Some(n);
    }
    g.build().unwrap()
}

fn pool(workers: usize, groups: usize) -> GpuPool {
    pool_traced(workers, groups, false)
}

fn pool_traced(workers: usize, groups: usize, trace: bool) -> GpuPool {
    pool_with(workers, groups, trace, true)
}

fn pool_with(workers: usize, groups: usize, trace: bool, handoff: bool) -> GpuPool {
    GpuPoolBuilder::new()
        .name("bench")
        .devices(Devices::List(vec![0]))
        .workers_per_device(workers)
        .groups_per_device(groups)
        .trace(trace)
        .stream_handoff(handoff)
        .build()
        .unwrap()
}

/// Runs a short chain on a traced pool of two one-worker groups and counts the consecutive
/// pairs whose nodes ran on different workers (read from the worker tracks).
fn chain_placement(k: &Kernel) -> (usize, usize) {
    let p = pool_traced(2, 2, true);
    let d = p.devices()[0].clone();
    let edges = 200;
    let g = chain_graph(d.groups(), k, edges);
    p.submit(&g).unwrap().wait().unwrap();
    let t = p.take_trace();
    let mut worker_of = vec![None; edges + 1];
    for s in &t.slices {
        if s.graph == "chain" && matches!(s.kind, boundpool_scheduler::SliceKind::Node { .. }) {
            worker_of[s.node.unwrap() as usize] = t.tracks[s.track].worker;
        }
    }
    let apart = worker_of
        .windows(2)
        .filter(|w| w[0].is_some() && w[1].is_some() && w[0] != w[1])
        .count();
    (apart, edges)
}

fn time_graph(p: &GpuPool, g: &GpuGraph) -> Duration {
    let t0 = Instant::now();
    p.submit(g).unwrap().wait().unwrap();
    t0.elapsed()
}

fn main() {
    let a: Args = boundpool_bench::flags::parse();
    if let Some(why) = boundpool_gpu::gpu_unavailable_reason() {
        eprintln!("SKIPPED gpu bench: no GPU: {why}");
        if std::env::var("BOUNDPOOL_REQUIRE_GPU").is_ok_and(|v| v == "1") {
            std::process::exit(1);
        }
        return;
    }
    let Args {
        runs,
        nodes,
        edges,
        only,
    } = a;
    let want = |what: &str| only.as_deref().is_none_or(|o| o == what);
    let k_empty = Module::builtin().kernel(builtin::EMPTY).unwrap();
    let mut verdicts: Vec<(String, bool)> = Vec::new();
    println!(
        "# boundpool GPU bench: {runs} runs each, medians; {nodes} nodes, {edges} chain edges"
    );

    // 1. Independent nodes vs raw launches from k bound threads.
    for k in [1usize, 2, 4, 8, 16] {
        if !want("independent") {
            break;
        }
        let p = pool(k, 1);
        let d = p.devices()[0].clone();
        let g = independent_graph(&d, &k_empty, nodes);
        time_graph(&p, &g); // warm-up: modules, events
        let mut ours = Vec::new();
        let mut raw = Vec::new();
        for _ in 0..runs {
            ours.push(nodes as f64 / time_graph(&p, &g).as_secs_f64());
            raw.push(baselines::raw_launches(0, k, nodes / k).unwrap().rate());
        }
        drop(p);
        // The same nodes launching through cudarc's safe layer, timed right after.
        let pc = cudarc_pool(k);
        let dc = pc.devices()[0].clone();
        let gc = independent_cudarc_graph(&dc, nodes);
        time_graph(&pc, &gc);
        let mut cud = Vec::new();
        for _ in 0..runs {
            cud.push(nodes as f64 / time_graph(&pc, &gc).as_secs_f64());
        }
        drop(pc);
        let (o, r, c) = (median(ours), median(raw), median(cud));
        let ratio = o / r;
        println!("independent k={k:2}: boundpool {o:9.0} nodes/s, raw {r:9.0} launches/s, ratio {ratio:.3} (target >= 0.85)");
        println!(
            "cudarc launch k={k:2}: boundpool nodes through cudarc's launch_builder {c:9.0} nodes/s, {:.3}x raw, {:.3}x boundpool's own launch",
            c / r,
            c / o
        );
        verdicts.push((format!("independent k={k} >= 0.85x raw"), ratio >= 0.85));
    }

    // 2. Against thread-per-task and the server thread, with 8 submitters.
    if want("submitters") {
        let p = Arc::new(pool(8, 1));
        let d = p.devices()[0].clone();
        let per = nodes / 8 / 4;
        let g = Arc::new(independent_graph(&d, &k_empty, per));
        time_graph(&p, &g);
        let mut ours = Vec::new();
        let mut tpt = Vec::new();
        let mut server = Vec::new();
        for _ in 0..runs {
            let barrier = Arc::new(Barrier::new(9));
            let hs: Vec<_> = (0..8)
                .map(|_| {
                    let (p, g, b) = (p.clone(), g.clone(), barrier.clone());
                    std::thread::spawn(move || {
                        b.wait();
                        let handles: Vec<_> = (0..4).map(|_| p.submit(&g).unwrap()).collect();
                        for h in handles {
                            h.wait().unwrap();
                        }
                    })
                })
                .collect();
            barrier.wait();
            let t0 = Instant::now();
            for h in hs {
                h.join().unwrap();
            }
            ours.push((per * 32) as f64 / t0.elapsed().as_secs_f64());
            tpt.push(baselines::thread_per_task(0, 2000).unwrap().rate());
            server.push(baselines::server_thread(0, 8, nodes).unwrap().rate());
        }
        let (o, t, s) = (median(ours), median(tpt), median(server));
        println!("8 submitters: boundpool {o:9.0} nodes/s; thread per task {t:8.0}/s ({:.1}x, target >= 30x); server thread {s:8.0}/s ({:.2}x, target >= 3x)", o / t, o / s);
        verdicts.push(("8 submitters >= 30x thread-per-task".into(), o / t >= 30.0));
        verdicts.push(("8 submitters >= 3x server thread".into(), o / s >= 3.0));
    }

    // 3. A chain whose consecutive nodes run on different workers (two groups of one worker).
    if want("chain") {
        let (apart, pairs) = chain_placement(&k_empty);
        println!("chain placement: {apart} of {pairs} consecutive pairs ran on different workers");
        verdicts.push(("chain nodes alternate workers".into(), apart == pairs));
        let p = pool(2, 2);
        let d = p.devices()[0].clone();
        let g = chain_graph(d.groups(), &k_empty, edges);
        let same = chain_graph(&d.groups()[..1], &k_empty, edges);
        time_graph(&p, &g);
        let mut ours = Vec::new();
        let mut ours_same = Vec::new();
        let mut ev = Vec::new();
        let mut host = Vec::new();
        let mut ev2 = Vec::new();
        let mut sh2 = Vec::new();
        let bare_host = bare_chain_graph(d.groups(), edges, false);
        let bare_gpu = bare_chain_graph(d.groups(), edges, true);
        let (mut bh, mut bg) = (Vec::new(), Vec::new());
        let p_ev = pool_with(2, 2, false, false);
        let g_ev = chain_graph(p_ev.devices()[0].groups(), &k_empty, edges);
        time_graph(&p_ev, &g_ev);
        let mut ours_ev = Vec::new();
        for _ in 0..runs {
            ours_ev.push(time_graph(&p_ev, &g_ev).as_secs_f64() * 1e6 / edges as f64);
            bh.push(time_graph(&p, &bare_host).as_secs_f64() * 1e6 / edges as f64);
            bg.push(time_graph(&p, &bare_gpu).as_secs_f64() * 1e6 / edges as f64);
            ours.push(time_graph(&p, &g).as_secs_f64() * 1e6 / edges as f64);
            ours_same.push(time_graph(&p, &same).as_secs_f64() * 1e6 / edges as f64);
            let us = |m: Result<baselines::Measurement, baselines::BaselineError>| {
                m.unwrap().micros_per_op()
            };
            ev.push(us(baselines::event_edge_chain(0, edges)));
            host.push(us(baselines::host_sync_edge_chain(0, edges)));
            ev2.push(us(baselines::event_edge_chain_two_threads(0, edges)));
            sh2.push(us(baselines::shared_stream_chain_two_threads(0, edges)));
        }
        println!("chain runs (us/edge): boundpool {ours:.2?}; raw event edge {ev:.2?}; raw two-thread event edge {ev2:.2?}; raw two-thread shared stream {sh2:.2?}; host sync {host:.2?}");
        let (o, s, e, h) = (median(ours), median(ours_same), median(ev), median(host));
        let (e2, s2) = (median(ev2), median(sh2));
        println!("chain diagnostics (us/edge, across the two workers): host nodes doing nothing {:.2}; GPU nodes enqueuing nothing (the GPU node path, stream handed over) {:.2}", median(bh), median(bg));
        println!(
            "two spinning raw threads: event edge {e2:.2} us/edge, one shared stream {s2:.2} us/edge (boundpool {:.2}x of the shared-stream floor)",
            o / s2
        );
        let oe = median(ours_ev.clone());
        println!(
            "boundpool without stream hand-off (event edges): {oe:.2} us/edge ({:.2}x raw event edge; {:.2}x the two-thread event floor); runs {ours_ev:.2?}",
            oe / e,
            oe / e2
        );
        println!("chain across workers: boundpool {o:.2} us/edge; raw event edge {e:.2} us ({:.2}x, target <= 1.2x); host-synchronised edge {h:.2} us ({:.2}x cheaper, target >= 1.8x); same-worker chain {s:.2} us/edge", o / e, h / o);
        verdicts.push(("chain edge <= 1.2x raw event edge".into(), o / e <= 1.2));
        verdicts.push((
            "chain edge >= 1.8x cheaper than host sync".into(),
            h / o >= 1.8,
        ));
        let stats = p.pool().stats();
        println!("chain pool stats: {stats:?}");
    }

    println!("# verdicts");
    for (what, ok) in &verdicts {
        println!("{} {what}", if *ok { "PASS" } else { "MISS" });
    }
}
