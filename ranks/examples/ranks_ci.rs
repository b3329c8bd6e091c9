//! The ranks' CI program, run under `mpirun -np 2` and `-np 4` by `.ci/run`:
//!
//! * `graphs N`: N random graphs with plain and serde values crossing ranks (8 B to 64 MiB, the
//!   largest in 4 MiB chunks), each run's outputs equal to the one-process reference; several
//!   runs and graphs in flight.
//! * `faults`: a failing node, a panicking node and a graph that differs between ranks: every
//!   rank's `wait` returns the same error naming the rank and node.
//! * `relay N`: the ranks faked onto two hosts (`RanksBuilder::hosts`: ranks `0..size/2` on
//!   the first), so values read on several ranks of the other host go there once and are
//!   forwarded (`relay_per_host`): N random graphs equal to the one-process run, fewer
//!   transfers between hosts than flat, and a failing producer whose value a relay forwards
//!   reported the same on every rank.
//! * `die panic|kill`: rank 1 panics outside a node (or kills itself) while the others wait on
//!   it. Under plain `mpirun` the job ends; with `--mca orte_abort_on_non_zero_status 0
//!   --mca orte_enable_recovery 1` the others live and must report rank 1 dead within 10 s.
//!
//! Prints one line per rank and exits non-zero on any mismatch.

#[path = "../tests/common/random.rs"]
mod random;

use std::time::{Duration, Instant};

use boundpool_ranks::plan::{crossing_hosts, lower};
use boundpool_ranks::{ErrorKind, LaunchInfo, RankGraphBuilder, Ranks, RanksBuilder};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mode = args.first().map(String::as_str).unwrap_or("graphs");
    // A 4 MiB message limit: the 64 MiB values go as a header and 16 chunks over MPI.
    let mut settings = RanksBuilder::new()
        .workers(2)
        .peer_timeout(Duration::from_secs(4))
        .max_message_bytes(4 << 20);
    if mode == "relay" {
        // One runtime per process: the host map is set before MPI starts, from the launcher.
        let size = LaunchInfo::from_env().size.unwrap_or(1);
        settings = settings.hosts((0..size).map(|r| r * 2 / size.max(1)).collect());
    }
    let ranks = settings.build_mpi().expect("the ranks runtime starts");
    let count = |d| args.get(1).map_or(d, |n| n.parse().unwrap());
    let res = match mode {
        // The host map MPI gathered at start-up is printed (one machine here: all 0).
        "graphs" => graphs(&ranks, count(200)).map(|l| format!("{l}; hosts {:?}", ranks.hosts())),
        "relay" => relay(&ranks, count(100)),
        "faults" => faults(&ranks),
        "die" => die(&ranks, args.get(1).map_or("panic", String::as_str)),
        other => Err(format!("unknown mode {other}")),
    };
    match res {
        Ok(line) => println!("rank {}/{}: {line}", ranks.rank(), ranks.size()),
        Err(e) => {
            eprintln!("rank {}/{}: FAILED: {e}", ranks.rank(), ranks.size());
            drop(ranks);
            std::process::exit(1);
        }
    }
}

fn graphs(ranks: &Ranks, n: u64) -> Result<String, String> {
    graphs_from(ranks, 0, n)
}

/// `n` random graphs of seeds `first..first + n`, each run twice and checked.
fn graphs_from(ranks: &Ranks, first: u64, n: u64) -> Result<String, String> {
    let start = Instant::now();
    let (mut checked, mut bytes_big) = (0usize, 0usize);
    let mut batch = Vec::new();
    for seed in first..first + n {
        // Every 50th graph carries a 64 MiB value across ranks; every 7th an 8-byte one only.
        let big = match seed % 50 {
            0 => Some(64 << 20),
            _ if seed % 7 == 0 => Some(8),
            _ => None,
        };
        let spec = random::random_spec(seed, ranks.size(), 30 + (seed % 40) as usize, big);
        let reference = random::reference(&spec);
        let (graph, refs) = random::build(&spec, ranks).map_err(|e| e.to_string())?;
        bytes_big += big.unwrap_or(0);
        // Two runs of each graph in flight, and up to four graphs.
        let h1 = ranks.submit(&graph).map_err(|e| e.to_string())?;
        let h2 = ranks.submit(&graph).map_err(|e| e.to_string())?;
        batch.push((spec, reference, refs, graph, vec![h1, h2]));
        if batch.len() == 4 || seed + 1 == first + n {
            for (spec, reference, refs, _graph, hs) in batch.drain(..) {
                for h in hs {
                    let out = h.wait().map_err(|e| format!("graph {}: {e}", spec.seed))?;
                    checked += random::check(&spec, &reference, &out, &refs, ranks.rank())?;
                }
            }
        }
    }
    Ok(format!(
        "{n} random graphs, 2 runs each, {checked} node outputs equal to the one-process run \
         ({} MiB in big values) in {:.1} s",
        bytes_big >> 20,
        start.elapsed().as_secs_f64()
    ))
}

fn relay(ranks: &Ranks, n: u64) -> Result<String, String> {
    if !ranks.relays_per_host() && ranks.size() > 1 {
        return Err(format!("not relaying on hosts {:?}", ranks.hosts()));
    }
    let (mut crossing, mut crossing_flat, mut forwarded) = (0, 0, 0);
    for seed in 0..n {
        let spec = random::random_spec(1000 + seed, ranks.size(), 40, None);
        let (graph, _) = random::build(&spec, ranks).map_err(|e| e.to_string())?;
        let l = graph.lowering();
        crossing += crossing_hosts(l, ranks.hosts());
        let flat = lower(graph.desc(), ranks.size()).map_err(|e| e.to_string())?;
        crossing_flat += crossing_hosts(&flat, ranks.hosts());
        forwarded += l.transfers.iter().filter(|t| t.via.is_some()).count();
    }
    // Each forwarded transfer replaced one between hosts; with two ranks a host, some are.
    if crossing + forwarded != crossing_flat || (ranks.size() >= 4) != (forwarded > 0) {
        return Err(format!(
            "{crossing} transfers between hosts relayed, {crossing_flat} flat, {forwarded} forwarded"
        ));
    }
    // The same graphs run (outputs checked against the one-process run), from seed 1000.
    let ran = graphs_from(ranks, 1000, n)?;
    // A failing producer on rank 0 read on every rank: the relays' receives fail, their
    // forwarded sends are cancelled, every rank reports rank 0's failure.
    let mut g = RankGraphBuilder::new("ci relay fails");
    let a = g.plain_node(0, "a", |_| Err::<Vec<u64>, _>("injected".into()));
    for r in 1..ranks.size() {
        let b = g.plain_node(
            r,
            format!("b{r}"),
            move |ctx| Ok(ctx.input(a)?.len() as u64),
        );
        g.edge(a, b);
    }
    let graph = g.build(ranks).map_err(|e| e.to_string())?;
    let e = ranks
        .run(&graph)
        .err()
        .ok_or("the failing graph succeeded")?;
    let want = "rank 0: node 'a' (#0) of graph 'ci relay fails' failed: injected";
    if e.kind() != ErrorKind::NodeFailed || e.to_string() != want {
        return Err(format!("relayed failure: got {e:?}, want {want}"));
    }
    Ok(format!(
        "hosts {:?}: {ran}; {crossing} transfers between hosts instead of {crossing_flat} \
         ({forwarded} forwarded within a host); a failing producer reported on every rank",
        ranks.hosts()
    ))
}

fn faults(ranks: &Ranks) -> Result<String, String> {
    let last = ranks.size() - 1;
    // A failing node on the last rank: every rank reports it.
    let mut g = RankGraphBuilder::new("ci fails");
    let a = g.plain_node(0, "a", |_| Ok(1u64));
    let bad = g.plain_node(last, "bad", move |ctx| {
        let _ = ctx.input(a)?;
        Err::<u64, _>("injected".into())
    });
    let after = g.plain_node(0, "after", move |ctx| Ok(*ctx.input(bad)?));
    g.edge(a, bad).edge(bad, after);
    let graph = g.build(ranks).map_err(|e| e.to_string())?;
    let e = ranks
        .run(&graph)
        .err()
        .ok_or("the failing graph succeeded")?;
    let want = format!("rank {last}: node 'bad' (#1) of graph 'ci fails' failed: injected");
    if e.kind() != ErrorKind::NodeFailed || e.to_string() != want || e.rank() != Some(last) {
        return Err(format!("failure: got {e:?}, want {want}"));
    }
    // A panic on rank 0 and one on the last rank: the lowest rank's is everyone's.
    let mut g = RankGraphBuilder::<()>::new("ci panics");
    g.plain_node(last, "p-last", |_| -> Result<u64, _> { panic!("last") });
    g.plain_node(0, "p0", |_| -> Result<u64, _> { panic!("zero") });
    let graph = g.build(ranks).map_err(|e| e.to_string())?;
    let e = ranks
        .run(&graph)
        .err()
        .ok_or("the panicking graph succeeded")?;
    if e.kind() != ErrorKind::NodePanicked || e.rank() != Some(0) || e.node() != Some("p0") {
        return Err(format!("panic: got {e:?}"));
    }
    // A graph that differs on the last rank.
    let mut g = RankGraphBuilder::new("ci differs");
    let a = g.plain_node(0, "a", |_| Ok(1u64));
    let name = if ranks.rank() == last { "other" } else { "b" };
    let b = g.plain_node(last, name, move |ctx| Ok(*ctx.input(a)?));
    g.edge(a, b);
    let graph = g.build(ranks).map_err(|e| e.to_string())?;
    let start = Instant::now();
    let e = ranks
        .run(&graph)
        .err()
        .ok_or("the differing graph succeeded")?;
    let want = format!("node #1 is 'b' on rank 0 but differs on rank {last}");
    if e.kind() != ErrorKind::GraphMismatch || !e.to_string().contains(&want) {
        return Err(format!("mismatch: got {e:?}, want …{want}…"));
    }
    // And the runtime still works after all that.
    let spec = random::random_spec(999, ranks.size(), 30, None);
    let (graph, refs) = random::build(&spec, ranks).map_err(|e| e.to_string())?;
    let out = ranks.run(&graph).map_err(|e| e.to_string())?;
    random::check(&spec, &random::reference(&spec), &out, &refs, ranks.rank())?;
    Ok(format!(
        "a failing node, a panic and a differing graph reported the same on every rank (the check took {:.0} ms); later runs fine",
        start.elapsed().as_secs_f64() * 1e3
    ))
}

fn die(ranks: &Ranks, how: &str) -> Result<String, String> {
    let mut g = RankGraphBuilder::new("ci waits on rank 1");
    let slow = g.plain_node(1, "slow", |_| {
        std::thread::sleep(Duration::from_secs(60));
        Ok(1u64)
    });
    let b = g.plain_node(0, "b", move |ctx| Ok(*ctx.input(slow)?));
    g.edge(slow, b);
    let graph = g.build(ranks).map_err(|e| e.to_string())?;
    let h = ranks.submit(&graph).map_err(|e| e.to_string())?;
    if ranks.rank() == 1 {
        std::thread::sleep(Duration::from_millis(500));
        match how {
            "kill" => {
                eprintln!("rank 1: killing itself (SIGKILL)");
                // SAFETY-free: a signal to this process.
                std::process::Command::new("kill")
                    .args(["-9", &std::process::id().to_string()])
                    .status()
                    .ok();
                std::thread::sleep(Duration::from_secs(60));
            }
            _ => panic!("rank 1 panics outside any node"),
        }
    }
    let start = Instant::now();
    match h.wait() {
        Ok(_) => Err("the run waiting on a dead rank succeeded".into()),
        Err(e) if e.kind() == ErrorKind::PeerDied && e.rank() == Some(1) => Ok(format!(
            "rank 1 died and this rank's run ended in {:.1} s: {e}",
            start.elapsed().as_secs_f64()
        )),
        Err(e) => Err(format!("unexpected error: {e:?}")),
    }
}
