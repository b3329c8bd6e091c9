//! Property: on random graphs (host and GPU nodes, 1 to 4 ranks, 1 to 3 workers a group),
//! the simulated run runs every node once, on a worker of its rank and group, after every
//! predecessor (its body after a host
//! predecessor's body, its kernel after a GPU predecessor's kernel, any node on another rank
//! after its producer's work), never two bodies at once on one worker nor two kernels at
//! once on one stream.

use std::collections::HashMap;

use boundpool_scheduler::{Priority, SliceKind};
use boundpool_sim::{
    simulate, CostModel, GpuTransfer, KindCost, Machine, Network, NodeSpec, SimGraph, SimOptions,
};
use proptest::prelude::*;

#[derive(Clone, Debug)]
struct Spec {
    ranks: usize,
    workers: usize,
    gpu: bool,
    nodes: Vec<(usize, bool, u8, u8, Vec<usize>)>, // rank, gpu, kind, level, preds
}

fn spec() -> impl Strategy<Value = Spec> {
    (1usize..=4, 1usize..=3, any::<bool>(), 1usize..50).prop_flat_map(|(ranks, workers, gpu, n)| {
        let node = (
            0..ranks,
            any::<bool>(),
            0u8..3,
            0u8..3,
            prop::collection::vec(0usize..1000, 0..4),
        );
        prop::collection::vec(node, n).prop_map(move |raw| Spec {
            ranks,
            workers,
            gpu,
            nodes: raw
                .into_iter()
                .enumerate()
                .map(|(i, (r, g, k, l, p))| {
                    let mut preds: Vec<usize> = if i == 0 {
                        vec![]
                    } else {
                        p.into_iter().map(|x| x % i).collect()
                    };
                    preds.sort_unstable();
                    preds.dedup();
                    (r, gpu && g, k, l, preds)
                })
                .collect(),
        })
    })
}

fn machine(s: &Spec) -> Machine {
    if s.gpu {
        let mut m = Machine::h100_cluster(s.ranks, Network::InfiniBand4x200, GpuTransfer::Staged);
        for g in &mut m.groups {
            g.workers = s.workers;
        }
        m.gpu.as_mut().unwrap().stream_handoff = true;
        m
    } else {
        Machine::dev_host(s.ranks, s.workers)
    }
}

fn costs() -> CostModel {
    let mut m = CostModel::default();
    for (k, host, dev, occ) in [
        ("k0", 5e-6, 50e-6, 1.0),
        ("k1", 20e-6, 10e-6, 0.3),
        ("k2", 1e-6, 200e-6, 0.6),
    ] {
        m.set(k, KindCost::gpu(host, dev, occ));
    }
    m
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]
    #[test]
    fn runs_respect_edges_and_never_overlap(s in spec(), seed in any::<u64>()) {
        let mut g = SimGraph::new("random");
        for (i, (r, gpu, k, l, preds)) in s.nodes.iter().enumerate() {
            let kind = format!("k{k}");
            let level = [Priority::Normal, Priority::High, Priority::Low][*l as usize];
            let spec = if *gpu { NodeSpec::gpu(kind) } else { NodeSpec::host(kind) };
            let x = g.node(format!("n{i}"), *r, spec.group(i % 2 * usize::from(s.gpu)).priority(level).bytes(1 << (i % 20)));
            for &p in preds {
                g.edge(p as u32, x);
            }
        }
        let opts = SimOptions { seed, trace: true, ..SimOptions::default() };
        let m = machine(&s);
        let rep = simulate(&g, &m, &costs(), &opts).unwrap();
        let trace = rep.trace.unwrap();
        let mut body: HashMap<u32, (u64, u64)> = HashMap::new();
        let mut track_of: HashMap<u32, usize> = HashMap::new();
        let mut kernel: HashMap<u32, (u64, u64)> = HashMap::new();
        for sl in &trace.slices {
            match (sl.kind, sl.node) {
                (SliceKind::Node { .. }, Some(i)) => {
                    prop_assert!(body.insert(i, (sl.start_ns, sl.end_ns)).is_none(), "node {} ran twice", i);
                    track_of.insert(i, sl.track);
                }
                (SliceKind::Span, Some(i)) => {
                    prop_assert!(kernel.insert(i, (sl.start_ns, sl.end_ns)).is_none(), "kernel {} ran twice", i);
                }
                _ => {}
            }
        }
        prop_assert_eq!(body.len(), s.nodes.len());
        // On its rank, on a worker of its group.
        for (i, n) in s.nodes.iter().enumerate() {
            let track = &trace.tracks[track_of[&(i as u32)]];
            let group = &m.groups[i % 2 * usize::from(s.gpu)].name;
            prop_assert!(track.name.starts_with(&format!("rank {} ", n.0)), "{} on {}", i, track.name);
            prop_assert_eq!(&track.group, group);
        }
        for (i, (r, gpu, _, _, preds)) in s.nodes.iter().enumerate() {
            let me = body[&(i as u32)];
            if *gpu {
                prop_assert!(kernel[&(i as u32)].0 >= me.1, "kernel {} before its launch", i);
            }
            for &p in preds {
                let pb = body[&(p as u32)];
                let (pg, pr) = (s.nodes[p].1, s.nodes[p].0);
                // A GPU successor on the same rank waits for the kernel on the device; any
                // other waits for it on the host.
                let ready = if pg { kernel[&(p as u32)].1 } else { pb.1 };
                if pg && *gpu && pr == *r {
                    prop_assert!(kernel[&(i as u32)].0 >= ready, "kernel {} before kernel {}", i, p);
                    prop_assert!(me.0 >= pb.1, "{} before {}", i, p);
                } else {
                    prop_assert!(me.0 >= ready, "{} started before {} was done", i, p);
                }
            }
        }
        // One body at a time a worker, one kernel at a time a stream.
        let mut per_track: HashMap<usize, Vec<(u64, u64)>> = HashMap::new();
        for sl in &trace.slices {
            if matches!(sl.kind, SliceKind::Node { .. }) || (sl.kind == SliceKind::Span && sl.node.is_some()) {
                per_track.entry(sl.track).or_default().push((sl.start_ns, sl.end_ns));
            }
        }
        for (track, mut v) in per_track {
            v.sort_unstable();
            for w in v.windows(2) {
                prop_assert!(w[1].0 >= w[0].1, "overlap on track {}: {:?}", trace.tracks[track].name, w);
            }
        }
    }
}
