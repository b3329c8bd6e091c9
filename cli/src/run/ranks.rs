//! `boundpool run --graph FILE --ranks` under `mpirun` (feature `mpi`): the graph file's nodes
//! run on the ranks they name (`"rank": r`; none: rank 0), every edge that crosses ranks a
//! message. Each node's value is 1 plus the sum of its inputs' values; every rank checks its
//! nodes' values against the same sums computed here, so a node that ran before an input, or
//! twice, or read the wrong value, is found. Rank 0 prints the summary.

use std::path::Path;
use std::process::ExitCode;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use boundpool::graph_file::GraphFile;
use boundpool::ranks::{NodeRef, RankGraph, RankGraphBuilder, RankOutput, Ranks, RanksBuilder};
use boundpool_workloads::busy_work;

/// Runs the file's graph `repeat` times on this rank with `threads` workers.
pub(crate) fn run(path: &Path, threads: usize, repeat: usize, quiet: bool) -> ExitCode {
    match run_checked(path, threads, repeat, quiet) {
        Ok(()) => ExitCode::SUCCESS,
        Err((code, m)) => {
            eprintln!("boundpool run: {m}");
            ExitCode::from(code)
        }
    }
}

/// What a run of the command fails with: the exit status (2: the graph file; 1: the run) and
/// the message.
type Failure = (u8, String);

fn run_checked(path: &Path, threads: usize, repeat: usize, quiet: bool) -> Result<(), Failure> {
    let f = read_graph_file(path)?;
    let ranks = RanksBuilder::new()
        .workers(threads)
        .build_mpi()
        .map_err(|e| (1, e.to_string()))?;
    let preds = predecessors(&f);
    let (graph, refs) = rank_graph(&f, &preds, &ranks)
        .map_err(|e| (2, format!("bad graph file {}: {e}", path.display())))?;
    let want = expected_values(&f, &preds);
    let mut times = Vec::with_capacity(repeat);
    for _ in 0..repeat.max(1) {
        let t = Instant::now();
        let out = ranks.run(&graph).map_err(|e| (1, e.to_string()))?;
        times.push(t.elapsed().as_secs_f64());
        check_values(&f, &ranks, &graph, &refs, &out, &want)?;
    }
    times.sort_by(f64::total_cmp);
    if ranks.rank() == 0 {
        if !quiet {
            eprintln!(
                "every node of every rank ran once, after its inputs ({} runs)",
                times.len()
            );
        }
        print_summary(&f, &ranks, &graph, threads, times[times.len() / 2]);
    }
    Ok(())
}

/// The graph file at `path`, read and parsed (named after the file where it names nothing).
fn read_graph_file(path: &Path) -> Result<GraphFile, Failure> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| (2, format!("cannot read graph file {}: {e}", path.display())))?;
    let stem = path
        .file_stem()
        .map_or_else(|| "graph".into(), |s| s.to_string_lossy().into_owned());
    boundpool::graph_file::parse(&text, &stem)
        .map_err(|e| (2, format!("bad graph file {}: {e}", path.display())))
}

/// Each node's predecessors, in the file's edge order.
fn predecessors(f: &GraphFile) -> Vec<Vec<usize>> {
    let mut preds: Vec<Vec<usize>> = vec![Vec::new(); f.names.len()];
    for &(a, b) in &f.edges {
        preds[b as usize].push(a as usize);
    }
    preds
}

/// The file's graph over `ranks`: nodes in file order (so that messages number them as the file
/// does), each spinning its `work_ns` and returning 1 plus the sum of its inputs' values (read
/// through refs set once every node exists), on the rank it names (none: rank 0).
fn rank_graph(
    f: &GraphFile,
    preds: &[Vec<usize>],
    ranks: &Ranks,
) -> Result<(RankGraph, Vec<NodeRef<u64>>), boundpool::ranks::Error> {
    let n = f.names.len();
    let mut g = RankGraphBuilder::new(f.name.clone());
    let inputs: Vec<Arc<OnceLock<Vec<NodeRef<u64>>>>> =
        (0..n).map(|_| Arc::new(OnceLock::new())).collect();
    let refs: Vec<NodeRef<u64>> = (0..n)
        .map(|i| {
            let work = f.work_ns[i];
            let mine = inputs[i].clone();
            g.plain_node(
                f.ranks[i].unwrap_or(0) as usize,
                f.names[i].clone(),
                move |ctx| {
                    busy_work(work);
                    let mut v = 1u64;
                    for &r in mine.get().expect("set before the graph is built") {
                        v = v.wrapping_add(*ctx.input(r)?);
                    }
                    Ok(v)
                },
            )
        })
        .collect();
    for (i, cell) in inputs.iter().enumerate() {
        let _ = cell.set(preds[i].iter().map(|&p| refs[p]).collect());
    }
    for &(a, b) in &f.edges {
        g.edge(refs[a as usize], refs[b as usize]);
    }
    Ok((g.build(ranks)?, refs))
}

/// Each node's value, computed here: 1 plus the sum of its inputs' (wrapping), in an order
/// where inputs come first (a node on a cycle keeps 0: the graph's build rejects a cycle).
fn expected_values(f: &GraphFile, preds: &[Vec<usize>]) -> Vec<u64> {
    let mut want = vec![0u64; f.names.len()];
    for i in topological(f.names.len(), &f.edges) {
        want[i] = preds[i].iter().fold(1u64, |v, &p| v.wrapping_add(want[p]));
    }
    want
}

/// Fails naming the first node of this rank whose value in `out` is not the expected one.
fn check_values(
    f: &GraphFile,
    ranks: &Ranks,
    graph: &RankGraph,
    refs: &[NodeRef<u64>],
    out: &RankOutput,
    want: &[u64],
) -> Result<(), Failure> {
    for (i, &r) in refs.iter().enumerate() {
        if graph.rank_of(r) != ranks.rank() {
            continue;
        }
        match out.get(r) {
            Some(&v) if v == want[i] => {}
            other => {
                return Err((
                    1,
                    format!(
                        "rank {}: node '{}' has {other:?}, expected {}",
                        ranks.rank(),
                        f.names[i],
                        want[i]
                    ),
                ))
            }
        }
    }
    Ok(())
}

/// Rank 0's summary: the graph, the ranks, the transfers and the median run.
fn print_summary(f: &GraphFile, ranks: &Ranks, graph: &RankGraph, threads: usize, median: f64) {
    let n = f.names.len();
    println!(
        "graph            {} ({n} nodes, {} edges)",
        f.name,
        f.edges.len()
    );
    println!(
        "ranks            {} ({threads} workers + 1 communication thread each)",
        ranks.size()
    );
    println!("transfers        {}", graph.lowering().transfers.len());
    println!("median run       {:.3} ms", median * 1e3);
    if n > 0 {
        println!("ns per node      {:.1}", median * 1e9 / n as f64);
    }
}

/// Kahn's order of the nodes (those on a cycle are left out).
fn topological(n: usize, edges: &[(u32, u32)]) -> Vec<usize> {
    let mut indeg = vec![0usize; n];
    let mut succ: Vec<Vec<usize>> = vec![Vec::new(); n];
    for &(a, b) in edges {
        indeg[b as usize] += 1;
        succ[a as usize].push(b as usize);
    }
    let mut ready: Vec<usize> = (0..n).filter(|&i| indeg[i] == 0).collect();
    let mut order = Vec::with_capacity(n);
    while let Some(v) = ready.pop() {
        order.push(v);
        for &s in &succ[v] {
            indeg[s] -= 1;
            if indeg[s] == 0 {
                ready.push(s);
            }
        }
    }
    order
}
