//! One copy a host (`RanksBuilder::relay_per_host`, `plan::relay`) over the in-process network
//! with a faked host map: relayed runs equal to flat ones and to the one-process run, fewer
//! messages between hosts, faults through a relay on every rank, host maps that differ.

mod common;

use std::time::{Duration, Instant};

use boundpool_ranks::plan::{crossing_hosts, lower};
use boundpool_ranks::{
    Error, ErrorKind, LocalNetwork, NodeRef, RankGraph, RankGraphBuilder, Ranks, RanksBuilder,
};
use boundpool_scheduler::Cores;
use common::random;

const TWO_BY_TWO: [usize; 4] = [0, 0, 1, 1];

fn world(hosts: &[usize], settings: RanksBuilder) -> (LocalNetwork, Vec<Ranks>) {
    let net = LocalNetwork::new(hosts.len());
    let ranks = (0..hosts.len())
        .map(|r| {
            settings
                .clone()
                .cores(Cores::Unpinned)
                .hosts(hosts.to_vec())
                .build_local(&net, r)
                .unwrap()
        })
        .collect();
    (net, ranks)
}

/// Runs `f` on every rank at once (a thread each), like an SPMD program.
fn on_all<R: Send>(ranks: &[Ranks], f: impl Fn(&Ranks) -> R + Sync) -> Vec<R> {
    std::thread::scope(|s| {
        let hs: Vec<_> = ranks.iter().map(|r| s.spawn(|| f(r))).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Random graphs on `ranks`: every node's output checked against the one-process run;
/// returns (outputs checked, transfers between hosts, transfers forwarded by a relay).
fn random_runs(ranks: &[Ranks], seeds: std::ops::Range<u64>) -> (usize, usize, usize) {
    let per_rank = on_all(ranks, |r| {
        let (mut checked, mut crossing, mut relayed) = (0, 0, 0);
        for seed in seeds.clone() {
            // A 1 MiB value now and then: forwarded as a header and chunks.
            let big = (seed % 5 == 0).then_some(1 << 20);
            let spec = random::random_spec(seed, r.size(), 40, big);
            let reference = random::reference(&spec);
            let (graph, refs) = random::build(&spec, r).unwrap();
            crossing += crossing_hosts(graph.lowering(), r.hosts());
            relayed += graph
                .lowering()
                .transfers
                .iter()
                .filter(|t| t.via.is_some())
                .count();
            // Two runs in flight: relayed values of both share the relays' tags.
            let hs = [r.submit(&graph).unwrap(), r.submit(&graph).unwrap()];
            for h in hs {
                let out = h.wait().unwrap();
                checked += random::check(&spec, &reference, &out, &refs, r.rank()).unwrap();
            }
        }
        (checked, crossing, relayed)
    });
    // Every rank lowered the same graphs: their counts agree.
    assert!(per_rank
        .windows(2)
        .all(|w| (w[0].1, w[0].2) == (w[1].1, w[1].2)));
    let checked = per_rank.iter().map(|x| x.0).sum();
    (checked, per_rank[0].1, per_rank[0].2)
}

#[test]
fn relayed_random_graphs_equal_flat_runs_and_the_one_process_run() {
    // Small chunks, so that forwarded values past them go as a header and chunks.
    let settings = RanksBuilder::new().workers(2).max_message_bytes(64 << 10);
    let (_net, relayed) = world(&TWO_BY_TWO, settings.clone());
    assert!(relayed.iter().all(Ranks::relays_per_host));
    let (checked, crossing, forwarded) = random_runs(&relayed, 0..16);
    drop(relayed);
    let (_net, flat) = world(&TWO_BY_TWO, settings.relay_per_host(false));
    assert!(!flat[0].relays_per_host());
    let (checked_flat, crossing_flat, forwarded_flat) = random_runs(&flat, 0..16);
    assert_eq!((checked, checked_flat), (16 * 40 * 2, 16 * 40 * 2));
    assert_eq!(forwarded_flat, 0);
    assert!(forwarded > 0, "nothing was relayed");
    // Each forwarded transfer replaced one between hosts.
    assert_eq!(
        crossing,
        crossing_flat - forwarded,
        "{crossing} vs {crossing_flat}"
    );
}

#[test]
fn one_host_or_relaying_off_lowers_flat() {
    let net = LocalNetwork::new(2);
    let r = RanksBuilder::new()
        .workers(1)
        .cores(Cores::Unpinned)
        .build_local(&net, 0)
        .unwrap();
    // The in-process network is one host.
    assert_eq!(r.hosts(), &[0, 0]);
    assert!(!r.relays_per_host());
    let r1 = RanksBuilder::new()
        .workers(1)
        .cores(Cores::Unpinned)
        .hosts(vec![0, 1])
        .relay_per_host(false)
        .build_local(&net, 1)
        .unwrap();
    assert_eq!(r1.hosts(), &[0, 1]);
    assert!(!r1.relays_per_host());
}

#[test]
fn a_host_map_of_another_length_is_an_error() {
    let net = LocalNetwork::new(2);
    let e = RanksBuilder::new()
        .workers(1)
        .cores(Cores::Unpinned)
        .hosts(vec![0, 0, 1])
        .build_local(&net, 0)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidConfig, "{e}");
    assert!(
        e.to_string()
            .contains("RanksBuilder::hosts gives 3 hosts, but there are 2 ranks"),
        "{e}"
    );
}

/// `a` on rank 0 (host 0) read on ranks 1, 2 and 3: rank 2 receives it for host 1 and
/// forwards it to rank 3.
fn fan_out(r: &Ranks, a_body: fn() -> Result<Vec<u64>, String>) -> (RankGraph, Vec<NodeRef<u64>>) {
    let mut g = RankGraphBuilder::new("fan out");
    let a = g.plain_node(0, "a", move |_| a_body().map_err(Into::into));
    let mut bs = Vec::new();
    for rank in 1..4 {
        let b = g.plain_node(rank, format!("b{rank}"), move |ctx| {
            Ok(ctx.input(a)?.iter().sum::<u64>())
        });
        g.edge(a, b);
        bs.push(b);
    }
    let graph = g.build(r).unwrap();
    let l = graph.lowering();
    let route: Vec<(usize, usize, Option<u32>)> =
        l.transfers.iter().map(|t| (t.from, t.to, t.via)).collect();
    assert_eq!(route, vec![(0, 1, None), (0, 2, None), (2, 3, Some(1))]);
    assert_eq!(crossing_hosts(l, r.hosts()), 1);
    assert_eq!(
        crossing_hosts(&lower(graph.desc(), 4).unwrap(), r.hosts()),
        2
    );
    (graph, bs)
}

#[test]
fn a_value_is_forwarded_within_its_host() {
    let (_net, ranks) = world(&TWO_BY_TWO, RanksBuilder::new().workers(1));
    let sums = on_all(&ranks, |r| {
        let (graph, bs) = fan_out(r, || Ok((0..100_000).collect()));
        let out = r.run(&graph).unwrap();
        (1..4)
            .filter(|&rank| rank == r.rank())
            .map(|rank| *out.get(bs[rank - 1]).unwrap())
            .collect::<Vec<_>>()
    });
    let want = (0..100_000u64).sum::<u64>();
    assert_eq!(sums, vec![vec![], vec![want], vec![want], vec![want]]);
}

#[test]
fn a_failing_producer_ends_every_rank_through_its_relay() {
    let (_net, ranks) = world(&TWO_BY_TWO, RanksBuilder::new().workers(1));
    let errors = on_all(&ranks, |r| {
        let (graph, _) = fan_out(r, || Err("no value".into()));
        r.run(&graph).unwrap_err()
    });
    for e in &errors {
        assert_eq!(e.kind(), ErrorKind::NodeFailed, "{e}");
        assert_eq!(
            e.to_string(),
            "rank 0: node 'a' (#0) of graph 'fan out' failed: no value"
        );
    }
}

#[test]
fn a_relay_that_dies_before_forwarding_ends_every_other_rank() {
    let settings = RanksBuilder::new()
        .workers(1)
        .peer_timeout(Duration::from_millis(800))
        .heartbeat(Duration::from_millis(100));
    let (net, ranks) = world(&TWO_BY_TWO, settings);
    let start = Instant::now();
    let results: Vec<Result<(), Error>> = on_all(&ranks, |r| {
        let (graph, _) = fan_out(r, || {
            std::thread::sleep(Duration::from_millis(600));
            Ok(vec![1, 2, 3])
        });
        let h = r.submit(&graph).unwrap();
        if r.rank() == 2 {
            // The relay is cut off before the value reaches it.
            std::thread::sleep(Duration::from_millis(200));
            net.sever(2);
            return Ok(());
        }
        h.wait().map(|_| ())
    });
    let took = start.elapsed();
    for rank in [0, 1, 3] {
        let e = results[rank].as_ref().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::PeerDied, "rank {rank}: {e}");
        assert_eq!(e.rank(), Some(2), "rank {rank}: {e}");
    }
    assert!(took < Duration::from_secs(10), "took {took:?}");
}

#[test]
fn a_producer_that_dies_ends_its_relay_and_the_ranks_behind_it() {
    let settings = RanksBuilder::new()
        .workers(1)
        .peer_timeout(Duration::from_millis(800))
        .heartbeat(Duration::from_millis(100));
    let (net, ranks) = world(&TWO_BY_TWO, settings);
    let start = Instant::now();
    let results: Vec<Result<(), Error>> = on_all(&ranks, |r| {
        let (graph, _) = fan_out(r, || {
            std::thread::sleep(Duration::from_secs(30));
            Ok(vec![1])
        });
        let h = r.submit(&graph).unwrap();
        if r.rank() == 0 {
            std::thread::sleep(Duration::from_millis(200));
            net.sever(0);
            return Ok(());
        }
        h.wait().map(|_| ())
    });
    let took = start.elapsed();
    for (rank, res) in results.iter().enumerate().skip(1) {
        let e = res.as_ref().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::PeerDied, "rank {rank}: {e}");
        assert_eq!(e.rank(), Some(0), "rank {rank}: {e}");
    }
    assert!(took < Duration::from_secs(10), "took {took:?}");
}

#[test]
fn host_maps_that_differ_between_ranks_are_an_error_naming_them() {
    // Rank 3 thinks it is alone on a third host; the others relay on two hosts.
    let net = LocalNetwork::new(4);
    let ranks: Vec<Ranks> = (0..4)
        .map(|r| {
            let hosts = if r == 3 {
                vec![0, 0, 1, 2]
            } else {
                TWO_BY_TWO.to_vec()
            };
            RanksBuilder::new()
                .workers(1)
                .cores(Cores::Unpinned)
                .hosts(hosts)
                .build_local(&net, r)
                .unwrap()
        })
        .collect();
    let errors = on_all(&ranks, |r| {
        let graph = fan_out_unchecked(r);
        r.run(&graph).unwrap_err()
    });
    for e in &errors {
        assert_eq!(e.kind(), ErrorKind::GraphMismatch, "{e}");
        assert_eq!(e.rank(), Some(3), "{e}");
        assert!(
            e.to_string()
                .contains("rank 3 relays values on another host map than rank 0"),
            "{e}"
        );
    }
}

/// `fan_out` without its lowering's checks (ranks whose host maps differ lower differently).
fn fan_out_unchecked(r: &Ranks) -> RankGraph {
    let mut g = RankGraphBuilder::new("fan out");
    let a = g.plain_node(0, "a", |_| Ok(vec![1u64]));
    for rank in 1..4 {
        let b = g.plain_node(rank, format!("b{rank}"), move |ctx| Ok(ctx.input(a)?[0]));
        g.edge(a, b);
    }
    g.build(r).unwrap()
}
