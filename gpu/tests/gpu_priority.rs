//! Priority levels on the GPU: a node enqueues on its worker's stream of its level (high: the
//! device's greatest stream priority, normal: its group's, low: the least), the library handles
//! follow, and values stay right across edges between levels (event edges; a hand-off only
//! within a level). Run on a GPU machine with `BOUNDPOOL_REQUIRE_GPU=1`.

use boundpool_gpu::{
    BoxError, DeviceBuffer, GpuCtx, GpuGraphBuilder, GpuGraphExt, GpuPool, GroupId, Kernel,
    NodeRef, Priority, StreamPriorityRange,
};
use boundpool_test_support::{
    cublas_stream, gpu_pool_builder, set_add_spin, solver_stream, spin_set_add, GpuTest,
};

const LEVELS: [Priority; 3] = [Priority::High, Priority::Normal, Priority::Low];

/// What a node saw of its stream.
#[derive(Clone, Copy, Debug)]
struct Seen {
    level: Priority,
    prio: i32,
    range: StreamPriorityRange,
    stream: u64,
    group: GroupId,
}

fn seen(ctx: &GpuCtx<'_, '_>) -> Result<Seen, BoxError> {
    Ok(Seen {
        level: ctx.node().priority(),
        prio: ctx.stream_priority()?,
        range: ctx.stream_priority_range()?,
        stream: ctx.raw_stream(),
        group: ctx.node().worker_info().group,
    })
}

/// The priority a stream of `level` must have on a group of priority `group` (0: default).
fn expected(level: Priority, group: i32, r: StreamPriorityRange) -> i32 {
    match level {
        Priority::High => r.greatest,
        Priority::Normal => group.clamp(r.greatest, r.least),
        Priority::Low => r.least,
    }
}

fn pool(workers: usize, groups: usize, group_prio: i32, handoff: bool) -> GpuPool {
    gpu_pool_builder(workers, groups)
        .name("prio")
        .stream_priority(0, group_prio)
        .stream_handoff(handoff)
        .build()
        .expect("GPU pool")
}

/// One worker, one node of each level (twice, so the lazily made streams are reused): each
/// level's stream has its priority, and the three are distinct streams.
#[test]
fn each_level_enqueues_on_a_stream_of_its_priority() {
    let Some(_t) = GpuTest::start("each_level_enqueues_on_a_stream_of_its_priority", 120) else {
        return;
    };
    for group_prio in [0, -1] {
        let p = pool(1, 1, group_prio, true);
        let d = p.devices()[0].clone();
        let mut g = GpuGraphBuilder::new("levels");
        let mut refs = Vec::new();
        for round in 0..2 {
            for level in LEVELS {
                let r = g.gpu_node(&d, &format!("{level:?}{round}"), seen);
                g.node_priority(r, level);
                refs.push(r);
            }
        }
        let out = p.submit(&g.build().unwrap()).unwrap().wait().unwrap();
        let s: Vec<Seen> = refs.iter().map(|r| *out.get(*r).unwrap()).collect();
        let range = s[0].range;
        assert!(
            range.greatest < range.least,
            "the device offers no stream priorities: {range:?}"
        );
        for x in &s {
            assert_eq!(
                x.prio,
                expected(x.level, group_prio, range),
                "group priority {group_prio}: {x:?}"
            );
        }
        assert_eq!(s[0].prio, range.greatest);
        assert_eq!(s[2].prio, range.least);
        // One worker: three streams, one per level, the same in both rounds.
        for i in 0..3 {
            assert_eq!(s[i].stream, s[i + 3].stream, "{:?}", s[i].level);
            for j in 0..3 {
                if i != j {
                    assert_ne!(
                        s[i].stream, s[j].stream,
                        "{:?} / {:?}",
                        s[i].level, s[j].level
                    );
                }
            }
        }
        drop(p);
    }
}

/// The graph's priority applies to every node without one of its own; a node's own wins.
#[test]
fn graph_priority_and_node_override() {
    let Some(_t) = GpuTest::start("graph_priority_and_node_override", 120) else {
        return;
    };
    let p = pool(2, 1, 0, true);
    let d = p.devices()[0].clone();
    let mut g = GpuGraphBuilder::new("low graph");
    let a = g.gpu_node(&d, "a", seen);
    let b = g.gpu_node(&d, "b", seen);
    let c = g.gpu_node(&d, "c", seen);
    g.edge(a, b).edge(b, c);
    g.priority(Priority::Low);
    g.node_priority(b, Priority::High);
    let out = p.submit(&g.build().unwrap()).unwrap().wait().unwrap();
    let (sa, sb, sc) = (
        *out.get(a).unwrap(),
        *out.get(b).unwrap(),
        *out.get(c).unwrap(),
    );
    assert_eq!(
        (sa.level, sb.level, sc.level),
        (Priority::Low, Priority::High, Priority::Low)
    );
    assert_eq!(sa.prio, sa.range.least, "{sa:?}");
    // b is a's one GPU successor on the same device, but of another level: no hand-off, b
    // enqueues on a high stream, not on a's low one.
    assert_eq!(sb.prio, sb.range.greatest, "{sb:?}");
    assert_ne!(sb.stream, sa.stream);
    assert_eq!(sc.prio, sc.range.least, "{sc:?}");
    drop(p);
}

/// cuBLAS and cuSOLVER handles are set to the stream of the node's level.
#[test]
fn library_handles_follow_the_level_stream() {
    let Some(_t) = GpuTest::start("library_handles_follow_the_level_stream", 120) else {
        return;
    };
    let p = pool(1, 1, 0, true);
    let d = p.devices()[0].clone();
    let mut g = GpuGraphBuilder::new("libs");
    let mut refs = Vec::new();
    for level in [
        Priority::Low,
        Priority::High,
        Priority::Normal,
        Priority::High,
    ] {
        let r = g.gpu_node(&d, &format!("{level:?}"), |ctx| -> Result<_, BoxError> {
            let blas = cublas_stream(&*ctx.cublas()?)?;
            let solver = solver_stream(&*ctx.solver()?)?;
            Ok((ctx.raw_stream(), blas, solver, ctx.stream_priority()?))
        });
        g.node_priority(r, level);
        if let Some(&prev) = refs.last() {
            g.edge(prev, r);
        }
        refs.push(r);
    }
    let out = p.submit(&g.build().unwrap()).unwrap().wait().unwrap();
    let mut streams = Vec::new();
    for r in &refs {
        let (stream, blas, solver, _) = *out.get(*r).unwrap();
        assert_eq!(blas, stream, "cuBLAS handle on another stream");
        assert_eq!(solver, stream, "cuSOLVER handle on another stream");
        streams.push(stream);
    }
    // Low, high, normal: three streams; the second high node is on the first one's.
    assert_ne!(streams[0], streams[1]);
    assert_ne!(streams[1], streams[2]);
    assert_ne!(streams[0], streams[2]);
    assert_eq!(streams[1], streams[3]);
    let (_, _, _, high) = *out.get(refs[1]).unwrap();
    let (_, _, _, low) = *out.get(refs[0]).unwrap();
    assert!(high < low, "high {high}, low {low}");
    drop(p);
}

/// A node's output: its value on the device, and what it saw of its stream.
struct Out {
    buf: DeviceBuffer<i64>,
    seen: Seen,
}

/// Spin `cycles`, then set a new one-element buffer to `value` plus each input's value
/// (`boundpool_test_support::spin_set_add`), with what the node saw of its stream.
fn spin_set_add_seen(
    ctx: &GpuCtx<'_, '_>,
    kernels: (&Kernel, &Kernel, &Kernel),
    cycles: i64,
    value: i64,
    inputs: &[NodeRef<Out>],
) -> Result<Out, BoxError> {
    let inputs = inputs.iter().map(|p| ctx.input(*p).map(|o: &Out| &o.buf));
    Ok(Out {
        buf: spin_set_add(ctx, kernels, cycles, value, inputs)?,
        seen: seen(ctx)?,
    })
}

/// Random DAGs whose nodes have random levels and placements (device or one group), so edges
/// go between levels, streams and workers, with and without the stream hand-off: every value,
/// downloaded, matches the host's, and every node ran on a stream of its level's priority.
#[test]
fn values_are_right_across_levels() {
    let Some(_t) = GpuTest::start("values_are_right_across_levels", 300) else {
        return;
    };
    let kernels = set_add_spin();
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    for (round, handoff) in [true, false, true].into_iter().enumerate() {
        let group_prio = -(round as i32);
        let p = pool(4, 2, group_prio, handoff);
        let d = p.devices()[0].clone();
        let n = 300usize;
        let mut preds: Vec<Vec<usize>> = Vec::new();
        for i in 0..n {
            let mut ps = Vec::new();
            if i > 0 {
                // Often one predecessor, the previous node: chains, where hand-offs happen.
                if next() % 2 == 0 {
                    ps.push(i - 1);
                } else {
                    for _ in 0..(next() % 4) {
                        let q = (next() as usize) % i;
                        if !ps.contains(&q) {
                            ps.push(q);
                        }
                    }
                }
            }
            preds.push(ps);
        }
        let mut expect = vec![0i64; n];
        #[allow(clippy::needless_range_loop)]
        for i in 0..n {
            let mut v = i as i64 + 1;
            for &q in &preds[i] {
                v = v.wrapping_add(expect[q]);
            }
            expect[i] = v;
        }
        let mut g = GpuGraphBuilder::new(format!("levels{round}"));
        let mut refs: Vec<NodeRef<Out>> = Vec::with_capacity(n);
        let mut placed_group = Vec::with_capacity(n);
        for (i, ps) in preds.iter().enumerate() {
            let pr: Vec<_> = ps.iter().map(|&q| refs[q]).collect();
            let k = kernels.clone();
            // Long predecessors: a successor that did not wait would read a stale value.
            let cycles = (next() % 40_000) as i64;
            let pr2 = pr.clone();
            let body = move |ctx: &GpuCtx<'_, '_>| {
                spin_set_add_seen(ctx, (&k.0, &k.1, &k.2), cycles, i as i64 + 1, &pr2)
            };
            let pick = next() % 3;
            let r = if pick == 0 {
                g.gpu_node(&d, &format!("n{i}"), body)
            } else {
                let gi = (pick - 1) as usize;
                g.gpu_node_in(d.groups()[gi], &format!("n{i}"), body)
            };
            placed_group.push(pick);
            g.node_priority(r, LEVELS[(next() % 3) as usize]);
            for &q in &pr {
                g.edge(q, r);
            }
            refs.push(r);
        }
        let all = refs.clone();
        let collect = g.gpu_node(&d, "collect", move |ctx| {
            let mut v = Vec::with_capacity(all.len());
            for r in &all {
                v.push(ctx.download(&ctx.input(*r)?.buf)?[0]);
            }
            Ok(v)
        });
        for &r in &refs {
            g.edge(r, collect);
        }
        let graph = g.build().unwrap();
        let hs: Vec<_> = (0..3).map(|_| p.submit(&graph).unwrap()).collect();
        for h in hs {
            let out = h.wait().unwrap();
            assert_eq!(
                out.get(collect).unwrap(),
                &expect,
                "round {round} (hand-off {handoff})"
            );
            let mut levels_seen = [0usize; 3];
            for (i, r) in refs.iter().enumerate() {
                let s = out.get(*r).unwrap().seen;
                // Group 0's normal streams have the group priority, group 1's the default (0).
                // With the hand-off, a normal node may enqueue on the normal stream of a
                // predecessor's worker of the other group (a hand-off stays within a level,
                // not within a group); without it, always on its own worker's.
                let own = if s.group == d.groups()[0] {
                    group_prio
                } else {
                    0
                };
                let ok = s.prio == expected(s.level, own, s.range)
                    || (handoff
                        && s.level == Priority::Normal
                        && [expected(s.level, group_prio, s.range), 0].contains(&s.prio));
                assert!(
                    ok,
                    "round {round} node n{i} (placed {}, preds {:?}): {s:?}",
                    placed_group[i], preds[i]
                );
                levels_seen[LEVELS.iter().position(|&l| l == s.level).unwrap()] += 1;
            }
            assert!(levels_seen.iter().all(|&c| c > 0), "{levels_seen:?}");
        }
        drop(p);
    }
}
