//! The trace's GPU stream tracks: every GPU node once on its stream's track with a positive
//! device time, no overlap on a stream, tracks named after device and stream, no timing events
//! when tracing is off. Run on a GPU machine with `BOUNDPOOL_REQUIRE_GPU=1`.

use std::collections::HashMap;

use boundpool_gpu::{
    builtin, GpuGraph, GpuGraphBuilder, GpuGraphExt, GpuPool, Kernel, LaunchConfig, Module, NodeRef,
};
use boundpool_scheduler::{SliceKind, Trace};
use boundpool_test_support::{gpu_pool_builder, GpuTest};

const WORKERS: usize = 4;

fn pool(trace: bool) -> GpuPool {
    gpu_pool_builder(WORKERS, 2)
        .name("trace")
        .trace(trace)
        .build()
        .expect("GPU pool")
}

/// Four layers of six nodes, each spinning ~20k cycles; each node after two nodes of the layer
/// before, alternating groups so that edges cross workers and streams.
fn graph(p: &GpuPool, name: &'static str, k: &Kernel) -> (GpuGraph, usize) {
    let d = &p.devices()[0];
    let groups = d.groups().to_vec();
    let mut g = GpuGraphBuilder::new(name);
    let mut prev: Vec<NodeRef<()>> = Vec::new();
    let mut n = 0;
    for layer in 0..4 {
        let mut cur = Vec::new();
        for i in 0..6 {
            let k = k.clone();
            let r = g.gpu_node_in(
                groups[(layer + i) % groups.len()],
                &format!("l{layer}n{i}"),
                move |ctx| {
                    // SAFETY: bp_spin takes one i64 (cycles) and touches no memory.
                    unsafe {
                        ctx.launch(&k, LaunchConfig::single())
                            .arg(20_000i64)
                            .launch()?
                    };
                    Ok(())
                },
            );
            if !prev.is_empty() {
                g.edge(prev[i], r);
                g.edge(prev[(i + 1) % prev.len()], r);
            }
            cur.push(r);
            n += 1;
        }
        prev = cur;
    }
    (g.build().unwrap(), n)
}

/// Checks the stream tracks of `trace` for graph `graph_name` of `nodes` GPU nodes.
fn check(trace: &Trace, graph_name: &str, nodes: usize, device_name: &str) {
    let stream_track = |i: usize| -> Option<usize> {
        let name = &trace.tracks[i].name;
        let prefix = format!("GPU 0 ({device_name}) stream ");
        let idx = name.strip_prefix(&prefix)?.parse::<usize>().ok()?;
        assert!(idx < WORKERS, "stream index of track '{name}'");
        assert_eq!(trace.tracks[i].worker, None, "track '{name}'");
        Some(i)
    };
    let tracks: Vec<usize> = (0..trace.tracks.len()).filter_map(stream_track).collect();
    assert!(
        !tracks.is_empty(),
        "no GPU stream track among {:?}",
        trace.tracks.iter().map(|t| &t.name).collect::<Vec<_>>()
    );
    // Every GPU node of the graph exactly once on a stream track, with a positive duration.
    let mut seen: HashMap<u32, usize> = HashMap::new();
    let mut host_start: HashMap<u32, u64> = HashMap::new();
    for s in &trace.slices {
        if s.graph != graph_name {
            continue;
        }
        if let SliceKind::Node { .. } = s.kind {
            host_start.insert(s.node.unwrap(), s.start_ns);
        }
        if !tracks.contains(&s.track) {
            continue;
        }
        assert_eq!(s.kind, SliceKind::Span, "{s:?}");
        assert!(s.end_ns > s.start_ns, "GPU slice without duration: {s:?}");
        *seen
            .entry(s.node.expect("GPU slice names its node"))
            .or_default() += 1;
    }
    assert_eq!(seen.len(), nodes, "GPU nodes on stream tracks: {seen:?}");
    assert!(seen.values().all(|&c| c == 1), "a node twice: {seen:?}");
    // A node's device work starts after its body started on the host (allowing for the
    // reference's calibration error), so the two clocks agree.
    for s in trace.slices.iter().filter(|s| tracks.contains(&s.track)) {
        if s.graph != graph_name {
            continue;
        }
        let h = host_start[&s.node.unwrap()];
        assert!(
            s.start_ns + 1_000_000 > h,
            "GPU slice {s:?} starts more than 1 ms before its node ran on the host ({h} ns)"
        );
    }
    // No overlap on one stream.
    for &t in &tracks {
        let mut v: Vec<(u64, u64)> = trace
            .slices
            .iter()
            .filter(|s| s.track == t)
            .map(|s| (s.start_ns, s.end_ns))
            .collect();
        v.sort();
        for w in v.windows(2) {
            assert!(
                w[0].1 <= w[1].0,
                "overlap on '{}': {:?} and {:?}",
                trace.tracks[t].name,
                w[0],
                w[1]
            );
        }
    }
}

#[test]
fn gpu_nodes_on_stream_tracks() {
    let Some(_t) = GpuTest::start("gpu_nodes_on_stream_tracks", 120) else {
        return;
    };
    let k = Module::builtin().kernel(builtin::SPIN).unwrap();

    // Off: no timing event at all.
    let p = pool(false);
    let (g, _) = graph(&p, "untraced", &k);
    p.submit(&g).unwrap().wait().unwrap();
    assert!(!p.pool().is_tracing());
    assert_eq!(p.devices()[0].timing_events_created(), 0);
    assert!(p.take_trace().slices.is_empty());
    drop(p);

    // On.
    let p = pool(true);
    let device_name = p.devices()[0].info().name.clone();
    let (g, n) = graph(&p, "traced", &k);
    p.submit(&g).unwrap().wait().unwrap();
    let t = p.take_trace();
    check(&t, "traced", n, &device_name);
    let first = p.devices()[0].timing_events_created();
    assert!(first > 0);

    // Again, twice at once: the timing events are recycled, both graphs are complete.
    let (g1, _) = graph(&p, "traced-1", &k);
    let (g2, _) = graph(&p, "traced-2", &k);
    let h1 = p.submit(&g1).unwrap();
    let h2 = p.submit(&g2).unwrap();
    h1.wait().unwrap();
    h2.wait().unwrap();
    let t = p.take_trace();
    check(&t, "traced-1", n, &device_name);
    check(&t, "traced-2", n, &device_name);
    let second = p.devices()[0].timing_events_created();
    assert!(
        second <= first + 2 * n,
        "timing events are not recycled: {first} then {second}"
    );
    eprintln!(
        "gpu_trace: {} tracks, {} slices, {second} timing events created",
        t.tracks.len(),
        t.slices.len()
    );

    // A chain alternating between the two groups: each node hands its stream over to the
    // next, so the whole chain is on one stream track, in chain order, though its nodes ran on
    // different workers.
    let groups = p.devices()[0].groups().to_vec();
    let mut g = GpuGraphBuilder::new("handoff");
    let mut prev: Option<NodeRef<()>> = None;
    let links = 8;
    for i in 0..links {
        let k = k.clone();
        let r = g.gpu_node_in(groups[i % 2], &format!("h{i}"), move |ctx| {
            // SAFETY: bp_spin takes one i64 (cycles) and touches no memory.
            unsafe {
                ctx.launch(&k, LaunchConfig::single())
                    .arg(20_000i64)
                    .launch()?
            };
            Ok(())
        });
        if let Some(p) = prev {
            g.edge(p, r);
        }
        prev = Some(r);
    }
    p.submit(&g.build().unwrap()).unwrap().wait().unwrap();
    let t = p.take_trace();
    let mut gpu: Vec<(u32, usize, u64, u64)> = Vec::new();
    let mut workers = std::collections::HashSet::new();
    for s in t.slices.iter().filter(|s| s.graph == "handoff") {
        match s.kind {
            SliceKind::Node { .. } => {
                workers.insert(t.tracks[s.track].worker);
            }
            _ => gpu.push((s.node.unwrap(), s.track, s.start_ns, s.end_ns)),
        }
    }
    assert!(
        workers.len() >= 2,
        "the chain ran on one worker: {workers:?}"
    );
    assert_eq!(gpu.len(), links, "GPU slices of the chain: {gpu:?}");
    assert!(
        gpu.iter().all(|x| x.1 == gpu[0].1),
        "the chain's GPU work is on several streams: {gpu:?}"
    );
    gpu.sort();
    for w in gpu.windows(2) {
        assert!(w[0].3 <= w[1].2, "chain slices out of order: {w:?}");
    }
    drop(p);
}
