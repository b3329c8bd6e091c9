//! Property tests: random DAGs of up to 10,000 nodes on pools of 1 to 8 workers. Every node
//! records its run count and a global sequence number at start and finish; every node must run
//! exactly once, and start only after all its predecessors finished. A second property injects a
//! failure and checks that nodes run + nodes cancelled = nodes, and that nothing after the failing
//! node runs. A third places nodes on three worker groups of 1 to 3 workers and checks each ran
//! on a worker of its group. Proptest draws sizes skewed small (a few cases of 4,000 to 10,000 nodes per run);
//! `largest_dags_on_one_and_eight_workers` runs the bounds, 10,000 nodes on 1 and on 8 workers,
//! every time.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use boundpool_scheduler::backend::FromIndex;
use boundpool_scheduler::{BoxError, Cores, ErrorKind, GraphBuilder, NodeRef, PoolBuilder};
use proptest::prelude::*;

#[cfg(not(miri))]
const CASES: u32 = 48;
#[cfg(miri)]
const CASES: u32 = 2;

/// Node counts, skewed small with a few large.
fn size() -> impl Strategy<Value = usize> {
    #[cfg(not(miri))]
    {
        prop_oneof![6 => 1usize..64, 4 => 64usize..1000, 2 => 1000usize..4000, 1 => 4000usize..=10_000]
    }
    #[cfg(miri)]
    {
        1usize..24
    }
}

/// A random DAG on `n` nodes: edges go from a lower to a higher position of a random
/// permutation (so node ids are not already in topological order). Shapes vary with `shape`.
fn dag(n: usize, shape: u8, seed: u64) -> Vec<(usize, usize)> {
    let mut rng = seed | 1;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut perm: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        perm.swap(i, (next() % (i as u64 + 1)) as usize);
    }
    let mut edges = Vec::new();
    for j in 1..n {
        let k = match shape % 4 {
            0 => next() % 3,            // sparse: 0..2 predecessors
            1 => 1,                     // a random tree
            2 => 1 + next() % 6,        // dense
            _ => u64::from(j % 7 != 0), // mostly chains with local edges, some fresh sources
        };
        for _ in 0..k {
            let i = match shape % 4 {
                3 => j - 1 - (next() % (j as u64).min(4)) as usize,
                _ => (next() % j as u64) as usize,
            };
            edges.push((perm[i], perm[j]));
        }
    }
    // Duplicate edges are allowed (a node may depend twice on the same predecessor).
    edges
}

struct Record {
    runs: Vec<AtomicUsize>,
    start: Vec<AtomicU64>,
    finish: Vec<AtomicU64>,
    clock: AtomicU64,
}

impl Record {
    fn new(n: usize) -> Arc<Self> {
        Arc::new(Record {
            runs: (0..n).map(|_| AtomicUsize::new(0)).collect(),
            start: (0..n).map(|_| AtomicU64::new(0)).collect(),
            finish: (0..n).map(|_| AtomicU64::new(0)).collect(),
            clock: AtomicU64::new(1),
        })
    }
    fn reset(&self) {
        for i in 0..self.runs.len() {
            self.runs[i].store(0, Ordering::SeqCst);
            self.start[i].store(0, Ordering::SeqCst);
            self.finish[i].store(0, Ordering::SeqCst);
        }
    }
    fn enter(&self, i: usize) {
        self.runs[i].fetch_add(1, Ordering::SeqCst);
        self.start[i].store(self.clock.fetch_add(1, Ordering::SeqCst), Ordering::SeqCst);
    }
    fn leave(&self, i: usize) {
        self.finish[i].store(self.clock.fetch_add(1, Ordering::SeqCst), Ordering::SeqCst);
    }
}

/// Builds the graph; node `fail` (if any) returns an error. Some nodes are cpu nodes, some
/// return values their successors check.
fn build(
    n: usize,
    edges: &[(usize, usize)],
    rec: &Arc<Record>,
    fail: Option<usize>,
) -> (boundpool_scheduler::Graph, Vec<NodeRef<u64>>) {
    let mut preds: Vec<Vec<usize>> = vec![Vec::new(); n];
    for &(a, b) in edges {
        preds[b].push(a);
    }
    let mut g = GraphBuilder::<()>::with_capacity("random", n, edges.len());
    // Nodes are added in id order, so a node's predecessors may not exist yet: bodies find
    // their inputs through a table filled after all nodes are created.
    let refs: Arc<std::sync::OnceLock<Vec<NodeRef<u64>>>> = Arc::new(std::sync::OnceLock::new());
    let mut out = Vec::with_capacity(n);
    for (i, p) in preds.iter().enumerate() {
        let rec = rec.clone();
        let refs = refs.clone();
        let p = p.clone();
        let failing = fail == Some(i);
        let body = move |inputs: &boundpool_scheduler::Inputs<'_>| -> Result<u64, BoxError> {
            rec.enter(i);
            // Each input is its predecessor's id: check they flowed through.
            let refs = refs.get().expect("refs set before submit");
            for &q in &p {
                let v = *inputs.input(refs[q])?;
                if v != q as u64 {
                    return Err(format!("node {i} read {v} from {q}").into());
                }
            }
            rec.leave(i);
            if failing {
                return Err("injected".into());
            }
            Ok(i as u64)
        };
        let r = if i % 5 == 4 {
            g.cpu_node(format!("c{i}"), body)
        } else {
            g.node(format!("w{i}"), move |ctx| body(ctx))
        };
        out.push(r);
    }
    for &(a, b) in edges {
        g.edge(out[a], out[b]);
    }
    assert!(refs.set(out.clone()).is_ok(), "refs are set once");
    (g.build().expect("a DAG builds"), out)
}

fn check_order(rec: &Record, edges: &[(usize, usize)]) -> Result<(), TestCaseError> {
    for &(a, b) in edges {
        let (fa, sb) = (
            rec.finish[a].load(Ordering::SeqCst),
            rec.start[b].load(Ordering::SeqCst),
        );
        if sb != 0 {
            prop_assert!(
                fa != 0 && fa < sb,
                "node {b} started at {sb} before its predecessor {a} finished ({fa})"
            );
        }
    }
    Ok(())
}

/// Every node ran exactly once, and after all its predecessors.
fn check_once_in_order(rec: &Record, edges: &[(usize, usize)]) -> Result<(), TestCaseError> {
    for (i, r) in rec.runs.iter().enumerate() {
        let runs = r.load(Ordering::SeqCst);
        prop_assert_eq!(runs, 1, "node {} ran {} times", i, runs);
    }
    check_order(rec, edges)
}

/// The exactly-once-after-predecessors property for one DAG on one pool (two runs of the graph).
fn run_every_node_once(
    n: usize,
    shape: u8,
    seed: u64,
    workers: usize,
    lane: bool,
) -> Result<(), TestCaseError> {
    let edges = dag(n, shape, seed);
    let rec = Record::new(n);
    let (graph, refs) = build(n, &edges, &rec, None);
    let mut b = PoolBuilder::new()
        .name("prop")
        .workers(workers)
        .cores(if seed % 2 == 0 {
            Cores::All
        } else {
            Cores::Unpinned
        });
    if lane {
        b = b.cpu_lane_threads(2);
    }
    let pool = b.build().unwrap();
    prop_assert_eq!(pool.workers().len(), workers);
    for round in 0..2 {
        rec.reset();
        let out = pool
            .run(&graph)
            .map_err(|e| TestCaseError::fail(format!("round {round}: {e}")))?;
        check_once_in_order(&rec, &edges)?;
        prop_assert_eq!(out.get(refs[n - 1]), Some(&(n as u64 - 1)));
    }
    let st = pool.stats();
    prop_assert_eq!(st.nodes_run(), 2 * n as u64);
    prop_assert_eq!(st.graphs_completed, 2);
    Ok(())
}

/// Random DAGs whose nodes are placed on one of three worker groups, on the domain of groups 0
/// and 1, or left anywhere: every node runs exactly once, after its predecessors, on a worker
/// of its group (of one of its domain's groups). Edges between placements hand ready nodes
/// over through the group and domain injectors.
fn run_placed(n: usize, shape: u8, seed: u64, sizes: [usize; 3]) -> Result<(), TestCaseError> {
    use boundpool_scheduler::{DomainId, GroupId, GroupSpec};
    /// Placement 4 of `place`: the domain of groups 0 and 1.
    const DOMAIN: usize = 4;
    let edges = dag(n, shape, seed);
    let rec = Record::new(n);
    let ran_on: Arc<Vec<AtomicUsize>> =
        Arc::new((0..n).map(|_| AtomicUsize::new(usize::MAX)).collect());
    let place: Vec<Option<usize>> = (0..n)
        .map(|i| match (seed.rotate_left(i as u32 % 64) ^ i as u64) % 5 {
            3 => None,
            g => Some(g as usize),
        })
        .collect();
    let mut g = GraphBuilder::<()>::with_capacity("placed", n, edges.len());
    let refs: Vec<NodeRef<()>> = (0..n)
        .map(|i| {
            let (rec, ran_on) = (rec.clone(), ran_on.clone());
            let r = g.node(format!("p{i}"), move |ctx| {
                rec.enter(i);
                ran_on[i].store(ctx.worker_info().group.index(), Ordering::SeqCst);
                rec.leave(i);
                Ok(())
            });
            match place[i] {
                Some(DOMAIN) => {
                    g.place(r, DomainId::from_index(0));
                }
                Some(grp) => {
                    g.place(r, GroupId::from_index(grp));
                }
                None => {}
            }
            r
        })
        .collect();
    for &(a, b) in &edges {
        g.edge(refs[a], refs[b]);
    }
    let graph = g.build().expect("a DAG builds");
    let pool = PoolBuilder::new()
        .name("placed")
        .groups(
            sizes
                .iter()
                .enumerate()
                .map(|(i, &w)| {
                    let mut s = GroupSpec::new(format!("g{i}"), w);
                    s.cores = Cores::Unpinned;
                    s
                })
                .collect(),
        )
        .domain("g0+g1", [GroupId::from_index(0), GroupId::from_index(1)])
        .build()
        .unwrap();
    for round in 0..3 {
        rec.reset();
        pool.run(&graph)
            .map_err(|e| TestCaseError::fail(format!("round {round}: {e}")))?;
        check_once_in_order(&rec, &edges)?;
        for i in 0..n {
            let on = ran_on[i].load(Ordering::SeqCst);
            match place[i] {
                Some(DOMAIN) => prop_assert!(
                    on <= 1,
                    "node {} ran on group {}, outside its domain",
                    i,
                    on
                ),
                Some(grp) => prop_assert_eq!(on, grp, "node {} ran outside its group", i),
                None => {}
            }
        }
    }
    prop_assert_eq!(pool.stats().nodes_run(), 3 * n as u64);
    Ok(())
}

/// The largest DAGs on the smallest and the largest pools, every shape, whatever proptest's
/// random draws: the strategy below reaches 10,000 nodes and 8 workers only by chance.
#[test]
fn largest_dags_on_one_and_eight_workers() {
    #[cfg(not(miri))]
    const N: usize = 10_000;
    #[cfg(miri)]
    const N: usize = 24;
    for shape in 0u8..4 {
        for (workers, lane) in [(1, false), (8, true)] {
            let seed = 0x9E37_79B9_7F4A_7C15 ^ u64::from(shape) ^ workers as u64;
            if let Err(e) = run_every_node_once(N, shape, seed, workers, lane) {
                panic!("{N} nodes, shape {shape}, {workers} workers: {e}");
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: CASES, max_shrink_iters: 64, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn random_dags_run_every_node_once_after_its_predecessors(
        n in size(),
        shape in 0u8..4,
        seed in any::<u64>(),
        workers in 1usize..=8,
        lane in any::<bool>(),
    ) {
        run_every_node_once(n, shape, seed, workers, lane)?;
    }

    #[test]
    fn random_placed_dags_run_every_node_once_in_its_group(
        n in size(),
        shape in 0u8..4,
        seed in any::<u64>(),
        sizes in [1usize..=3, 1usize..=3, 1usize..=3],
    ) {
        run_placed(n, shape, seed, sizes)?;
    }

    #[test]
    fn random_dags_with_a_failing_node(
        n in size(),
        shape in 0u8..4,
        seed in any::<u64>(),
        workers in 1usize..=8,
        fail_at in any::<prop::sample::Index>(),
    ) {
        let edges = dag(n, shape, seed);
        let rec = Record::new(n);
        let fail = fail_at.index(n);
        let (graph, _) = build(n, &edges, &rec, Some(fail));
        let pool = PoolBuilder::new().name("propfail").workers(workers).cores(Cores::Unpinned).build().unwrap();
        let err = pool.run(&graph).unwrap_err();
        prop_assert_eq!(err.kind(), ErrorKind::NodeFailed);
        let want = format!("'w{fail}'");
        let want_cpu = format!("'c{fail}'");
        let msg = err.to_string();
        prop_assert!(msg.contains(&want) || msg.contains(&want_cpu), "{}", msg);
        let ran: usize = rec.runs.iter().map(|r| r.load(Ordering::SeqCst)).sum();
        prop_assert!(rec.runs.iter().all(|r| r.load(Ordering::SeqCst) <= 1));
        prop_assert_eq!(ran + err.cancelled_nodes(), n, "ran {} + cancelled {} != {} nodes", ran, err.cancelled_nodes(), n);
        prop_assert_eq!(pool.stats().nodes_cancelled, err.cancelled_nodes() as u64);
        check_order(&rec, &edges)?;
        // Nothing downstream of the failing node ran.
        let mut succ: Vec<Vec<usize>> = vec![Vec::new(); n];
        for &(a, b) in &edges {
            succ[a].push(b);
        }
        let mut stack = succ[fail].clone();
        let mut seen = vec![false; n];
        while let Some(x) = stack.pop() {
            if !std::mem::replace(&mut seen[x], true) {
                prop_assert_eq!(rec.runs[x].load(Ordering::SeqCst), 0, "node {} after the failing node {} ran", x, fail);
                stack.extend(succ[x].iter().copied());
            }
        }
    }
}
