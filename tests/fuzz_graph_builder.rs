//! Property tests of `GraphBuilder` driven by arbitrary call sequences: nodes (host and CPU
//! nodes), edges forward and backward, self-loops, repeated edges, edges to another graph's nodes,
//! placements on the pool's groups, on a group it lacks and on one no pool can have, and inlined
//! subgraphs. Whatever the sequence: no panic, no hang; `build` or `submit` either fails with a
//! kind the sequence explains and a short message, or the graph runs every node exactly once,
//! after its predecessors, on a worker of its placement.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use boundpool::backend::FromIndex;
use boundpool::{ErrorKind, GraphBuilder, GroupId, GroupSpec, NodeId, Pool, PoolBuilder};
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Op {
    Node,
    CpuNode,
    /// An edge between the nodes at these positions (mod the node count).
    Edge(usize, usize),
    /// The same, from the earlier of the two to the later (skipped when they are one node).
    Forward(usize, usize),
    SelfLoop(usize),
    /// An edge from or to a node of another builder.
    Foreign(usize, bool),
    /// A placement on group index `1`: 0 and 1 exist, 2 does not, `u32::MAX - 1` no pool has.
    Place(usize, u32),
    /// Inlines a built two-node chain.
    Subgraph,
}

fn op() -> impl Strategy<Value = Op> {
    // Weighted so that a sequence of 40 calls is often valid: most edges go forward (from an
    // earlier node to a later one), a few backward (cycles), and self-loops, foreign edges and
    // bad placements are rare.
    let forward = (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Op::Forward(a, b));
    let any_edge = (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Op::Edge(a, b));
    let group = prop_oneof![4 => Just(0u32), 4 => Just(1), 1 => Just(2), 1 => Just(u32::MAX - 1)];
    prop_oneof![
        30 => Just(Op::Node),
        3 => Just(Op::CpuNode),
        30 => forward,
        2 => any_edge,
        1 => any::<usize>().prop_map(Op::SelfLoop),
        1 => (any::<usize>(), any::<bool>()).prop_map(|(a, d)| Op::Foreign(a, d)),
        8 => (any::<usize>(), group).prop_map(|(a, g)| Op::Place(a, g)),
        3 => Just(Op::Subgraph),
    ]
}

/// One pool for every case: two groups of one worker each.
fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| {
        PoolBuilder::new()
            .name("prop")
            .groups(vec![GroupSpec::new("a", 1), GroupSpec::new("b", 1)])
            .build()
            .expect("the pool starts")
    })
}

/// Run counts and start/finish numbers of one run, and the group each node ran on.
struct Record {
    seq: AtomicU64,
    runs: Vec<AtomicU32>,
    start: Vec<AtomicU64>,
    finish: Vec<AtomicU64>,
    group: Vec<AtomicU32>,
}

/// Aborts the process unless dropped within 30 s: a hang is a failure, not a stuck CI job.
struct HangGuard(std::sync::mpsc::Sender<()>);

fn hang_guard(what: String) -> HangGuard {
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
            rx.recv_timeout(Duration::from_secs(30))
        {
            eprintln!("HUNG: {what}");
            std::process::abort();
        }
    });
    HangGuard(tx)
}

impl Drop for HangGuard {
    fn drop(&mut self) {
        let _ = self.0.send(());
    }
}

/// How a sequence ended.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    Rejected,
    RejectedAtSubmit,
    Ran,
}

fn check(ops: &[Op]) -> Result<Outcome, TestCaseError> {
    let nodes = ops
        .iter()
        .map(|o| match o {
            Op::Node | Op::CpuNode => 1,
            Op::Subgraph => 2,
            _ => 0,
        })
        .sum::<usize>();
    let rec = Arc::new(Record {
        seq: AtomicU64::new(0),
        runs: (0..nodes).map(|_| AtomicU32::new(0)).collect(),
        start: (0..nodes).map(|_| AtomicU64::new(0)).collect(),
        finish: (0..nodes).map(|_| AtomicU64::new(0)).collect(),
        group: (0..nodes).map(|_| AtomicU32::new(u32::MAX)).collect(),
    });
    let inner = {
        let mut g = GraphBuilder::<()>::new("inner");
        let a = g.node("i0", |_| Ok(()));
        let b = g.node("i1", |_| Ok(()));
        g.edge(a, b);
        g.build().unwrap()
    };
    let mut other = GraphBuilder::<()>::new("other");
    let foreign = other.node("f", |_| Ok(()));

    let mut g = GraphBuilder::<()>::new("prop");
    let mut ids: Vec<NodeId> = Vec::new();
    // What the sequence did that `build` or `submit` must reject, and the edges and placements
    // the run must respect.
    let (mut foreign_edge, mut self_loop, mut impossible_group) = (false, false, false);
    let mut edges: Vec<(usize, usize)> = Vec::new();
    let mut placed: Vec<Option<u32>> = Vec::new();
    let pick = |ids: &[NodeId], i: usize| ids[i % ids.len()];
    for o in ops {
        match o {
            Op::Node | Op::CpuNode => {
                let k = ids.len();
                let r = rec.clone();
                let body = move |ctx: &boundpool::NodeCtx<'_, ()>| {
                    r.runs[k].fetch_add(1, Relaxed);
                    r.start[k].store(r.seq.fetch_add(1, Relaxed) + 1, Relaxed);
                    r.group[k].store(ctx.worker_info().group.index() as u32, Relaxed);
                    r.finish[k].store(r.seq.fetch_add(1, Relaxed) + 1, Relaxed);
                    Ok(())
                };
                let id = if matches!(o, Op::Node) {
                    g.node(format!("n{k}"), body).id()
                } else {
                    // A CPU node sees no worker state; without a CPU lane it runs on a worker.
                    let r = rec.clone();
                    g.cpu_node(format!("n{k}"), move |_| {
                        r.runs[k].fetch_add(1, Relaxed);
                        r.start[k].store(r.seq.fetch_add(1, Relaxed) + 1, Relaxed);
                        r.finish[k].store(r.seq.fetch_add(1, Relaxed) + 1, Relaxed);
                        Ok(())
                    })
                    .id()
                };
                ids.push(id);
                placed.push(None);
            }
            Op::Subgraph => {
                let s = g.subgraph(&inner);
                // Inlined nodes run the inner graph's bodies: counted as run, not recorded.
                let k = ids.len();
                rec.runs[k].store(1, Relaxed);
                rec.runs[k + 1].store(1, Relaxed);
                let src: Vec<NodeId> = s.sources().collect();
                let snk: Vec<NodeId> = s.sinks().collect();
                ids.push(src[0]);
                ids.push(snk[0]);
                placed.push(None);
                placed.push(None);
            }
            Op::Edge(a, b) if !ids.is_empty() => {
                let (x, y) = (a % ids.len(), b % ids.len());
                self_loop |= x == y;
                g.edge(ids[x], ids[y]);
                edges.push((x, y));
            }
            Op::Forward(a, b) if !ids.is_empty() => {
                let (x, y) = (a % ids.len(), b % ids.len());
                if x != y {
                    g.edge(ids[x.min(y)], ids[x.max(y)]);
                    edges.push((x.min(y), x.max(y)));
                }
            }
            Op::SelfLoop(a) if !ids.is_empty() => {
                let x = pick(&ids, *a);
                g.edge(x, x);
                self_loop = true;
            }
            Op::Foreign(a, from_foreign) if !ids.is_empty() => {
                let x = pick(&ids, *a);
                if *from_foreign {
                    g.edge(foreign, x);
                } else {
                    g.edge(x, foreign);
                }
                foreign_edge = true;
            }
            Op::Place(a, grp) if !ids.is_empty() => {
                let x = a % ids.len();
                g.place(ids[x], GroupId::from_index(*grp as usize));
                // A later placement replaces an earlier one; one no pool can have is an error
                // of the builder whatever follows.
                impossible_group |= *grp > 2;
                if *grp <= 2 {
                    placed[x] = Some(*grp);
                }
            }
            _ => {}
        }
    }
    let missing_group = placed.contains(&Some(2));
    let _guard = hang_guard(format!("{ops:?}"));
    let graph = match g.build() {
        Ok(graph) => graph,
        Err(e) => {
            let m = e.to_string();
            prop_assert!(m.len() < 2000, "a {}-byte message", m.len());
            let explained = match e.kind() {
                ErrorKind::ForeignNode => foreign_edge,
                ErrorKind::UnknownGroup => impossible_group,
                // A self-loop is a cycle; so is any backward edge closing one.
                ErrorKind::Cycle => true,
                _ => false,
            };
            prop_assert!(explained, "{:?}: {m} ({ops:?})", e.kind());
            return Ok(Outcome::Rejected);
        }
    };
    prop_assert!(
        !foreign_edge && !self_loop && !impossible_group,
        "build accepted {ops:?}"
    );
    let res = pool().submit(&graph).and_then(|h| h.wait());
    if missing_group {
        let e = res.expect_err("a placement on a group the pool lacks");
        prop_assert_eq!(e.kind(), ErrorKind::UnknownGroup, "{}", e);
        prop_assert!(rec.seq.load(Relaxed) == 0, "nothing ran");
        return Ok(Outcome::RejectedAtSubmit);
    }
    if let Err(e) = res {
        return Err(TestCaseError::fail(format!(
            "a valid graph failed: {e} ({ops:?})"
        )));
    }
    for (k, place) in placed.iter().enumerate() {
        prop_assert_eq!(
            rec.runs[k].load(Relaxed),
            1,
            "node n{} ran {} times",
            k,
            rec.runs[k].load(Relaxed)
        );
        if let Some(grp) = *place {
            let on = rec.group[k].load(Relaxed);
            // Inlined and CPU nodes record no group.
            prop_assert!(
                on == u32::MAX || on == grp,
                "n{k} placed on {grp} ran on {on}"
            );
        }
    }
    for &(x, y) in &edges {
        let (f, s) = (rec.finish[x].load(Relaxed), rec.start[y].load(Relaxed));
        // Inlined nodes record no numbers (0): order is only checked between recorded ones.
        if f != 0 && s != 0 {
            prop_assert!(f < s, "n{y} started before its predecessor n{x} finished");
        }
    }
    Ok(Outcome::Ran)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn any_call_sequence_builds_runs_or_fails_clearly(ops in prop::collection::vec(op(), 0..40)) {
        check(&ops)?;
    }
}

/// The generator reaches every outcome: of 300 sequences, some run, some fail to build, some
/// are rejected at submit.
#[test]
fn call_sequences_reach_every_outcome() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let mut seen = std::collections::HashMap::new();
    for _ in 0..300 {
        let ops = prop::collection::vec(op(), 0..40)
            .new_tree(&mut runner)
            .unwrap()
            .current();
        *seen
            .entry(format!("{:?}", check(&ops).unwrap()))
            .or_insert(0) += 1;
    }
    eprintln!("{seen:?}");
    for k in ["Rejected", "RejectedAtSubmit", "Ran"] {
        assert!(seen.get(k).copied().unwrap_or(0) >= 10, "{k}: {seen:?}");
    }
}
