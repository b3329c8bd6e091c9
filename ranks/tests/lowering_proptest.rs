//! Property tests of the pure layer: lowering respects every edge, sends each value once per
//! consuming rank, numbers each pair's transfers densely, gives each transfer its consumers'
//! longest path as its priority, and the ranks' plans together run to the end (no deadlock),
//! for random graphs.

use std::collections::{BTreeSet, HashMap, HashSet};

use boundpool_ranks::plan::{lower, GraphDesc, LocalNode, NcclOp, Wire};
use boundpool_ranks::ErrorKind;
use proptest::prelude::*;

/// A random DAG description: node i reads some nodes before it.
fn graphs() -> impl Strategy<Value = (GraphDesc, usize)> {
    (1usize..7, 1usize..60).prop_flat_map(|(ranks, n)| {
        let nodes = proptest::collection::vec((0..ranks, 0u8..10), n);
        let edges = proptest::collection::vec((0..n, 0..n), 0..n * 3);
        // One graph in five keeps nodes whose output cannot cross (most then fail to lower).
        (Just(ranks), nodes, edges, 0u8..5).prop_map(|(ranks, nodes, edges, keep_local)| {
            let mut g = GraphDesc::new("random");
            for (i, (rank, w)) in nodes.iter().enumerate() {
                let wire = match w {
                    0 if keep_local == 0 => Wire::Local,
                    1..=3 => Wire::Serde,
                    _ => Wire::Plain,
                };
                g.node(format!("n{i}"), *rank, wire);
            }
            for (a, b) in edges {
                if a < b {
                    g.edge(a as u32, b as u32);
                }
            }
            (g, ranks)
        })
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn lowering_respects_every_edge_and_sends_once_per_rank((g, ranks) in graphs()) {
        let crossing_local = g.edges.iter().any(|&(a, b)| {
            let (na, nb) = (&g.nodes[a as usize], &g.nodes[b as usize]);
            na.on != nb.on && na.wire == Wire::Local
        });
        let l = match lower(&g, ranks) {
            Ok(l) => l,
            Err(e) => {
                // The only error for these graphs: a local output crossing, named.
                prop_assert!(crossing_local, "unexpected error {e}");
                prop_assert_eq!(e.kind(), ErrorKind::CannotCross);
                return Ok(());
            }
        };
        prop_assert!(!crossing_local, "a local output crossed without an error");
        prop_assert_eq!(&l, &lower(&g, ranks).unwrap(), "not deterministic");

        // Every node on exactly one rank, the one it names.
        let mut seen = vec![0; g.nodes.len()];
        for p in &l.plans {
            for &i in &p.compute {
                seen[i as usize] += 1;
                prop_assert_eq!(l.rank_of[i as usize], p.rank);
            }
        }
        prop_assert!(seen.iter().all(|&s| s == 1));

        // Each value once per consuming rank; dense indices per ordered pair.
        let mut by_pair: HashMap<(usize, usize), Vec<u32>> = HashMap::new();
        let mut per_producer: HashMap<u32, BTreeSet<usize>> = HashMap::new();
        for t in &l.transfers {
            prop_assert_eq!(t.from, l.rank_of[t.producer as usize]);
            prop_assert!(t.from != t.to);
            prop_assert!(per_producer.entry(t.producer).or_default().insert(t.to), "sent twice to a rank");
            by_pair.entry((t.from, t.to)).or_default().push(t.index);
        }
        let mut max = 0;
        for (_, mut idx) in by_pair {
            idx.sort_unstable();
            prop_assert_eq!(idx.clone(), (0..idx.len() as u32).collect::<Vec<_>>());
            max = max.max(idx.len() as u32);
        }
        prop_assert_eq!(l.tags_per_run, max);

        // Each transfer's priority: its consumers' longest path to a sink, in nodes (every
        // edge goes from a lower index to a higher one here, so one backward pass finds them).
        let mut level = vec![1u32; g.nodes.len()];
        for i in (0..g.nodes.len()).rev() {
            for &(a, b) in &g.edges {
                if a as usize == i {
                    level[i] = level[i].max(level[b as usize] + 1);
                }
            }
        }
        for t in &l.transfers {
            let want = t.consumers.iter().map(|&c| level[c as usize]).max().unwrap();
            prop_assert_eq!(t.priority, want, "transfer of {} to rank {}", t.producer, t.to);
        }

        // Every edge: local, or a send on the producer's rank and a receive on the consumer's.
        let edge_sets: Vec<HashSet<(LocalNode, LocalNode)>> =
            l.plans.iter().map(|p| p.edges.iter().copied().collect()).collect();
        for &(a, b) in &g.edges {
            let (ra, rb) = (l.rank_of[a as usize], l.rank_of[b as usize]);
            if ra == rb {
                prop_assert!(edge_sets[ra].contains(&(LocalNode::Compute(a), LocalNode::Compute(b))));
            } else {
                let t = l.transfers.iter().position(|t| t.producer == a && t.to == rb);
                prop_assert!(t.is_some(), "edge {a}->{b} has no transfer");
                let t = t.unwrap() as u32;
                prop_assert!(l.transfers[t as usize].consumers.contains(&b));
                prop_assert!(edge_sets[ra].contains(&(LocalNode::Compute(a), LocalNode::Send(t))));
                prop_assert!(edge_sets[rb].contains(&(LocalNode::Recv(t), LocalNode::Compute(b))));
                prop_assert!(l.plans[ra].sends.contains(&t) && l.plans[rb].recvs.contains(&t));
            }
        }
        // And no edge the graph does not imply.
        let distinct: HashSet<(u32, u32)> = g.edges.iter().copied().collect();
        let implied = distinct.len() + l.transfers.len();
        prop_assert_eq!(l.plans.iter().map(|p| p.edges.len()).sum::<usize>(), implied);

        // The plans run to the end together: a receive runs once its send ran.
        let mut done: HashSet<(usize, LocalNode)> = HashSet::new();
        let total: usize = l.plans.iter().map(|p| p.compute.len() + p.sends.len() + p.recvs.len()).sum();
        let preds: Vec<HashMap<LocalNode, Vec<LocalNode>>> = l.plans.iter().map(|p| {
            let mut m: HashMap<LocalNode, Vec<LocalNode>> = HashMap::new();
            for &(a, b) in &p.edges { m.entry(b).or_default().push(a); }
            m
        }).collect();
        loop {
            let mut progressed = false;
            for p in &l.plans {
                let all = p.compute.iter().map(|&i| LocalNode::Compute(i))
                    .chain(p.sends.iter().map(|&t| LocalNode::Send(t)))
                    .chain(p.recvs.iter().map(|&t| LocalNode::Recv(t)));
                for node in all.collect::<Vec<_>>() {
                    if done.contains(&(p.rank, node)) { continue; }
                    let local_ready = preds[p.rank].get(&node).is_none_or(|ps| ps.iter().all(|q| done.contains(&(p.rank, *q))));
                    let remote_ready = match node {
                        LocalNode::Recv(t) => done.contains(&(l.transfers[t as usize].from, LocalNode::Send(t))),
                        _ => true,
                    };
                    if local_ready && remote_ready {
                        done.insert((p.rank, node));
                        progressed = true;
                    }
                }
            }
            if !progressed { break; }
        }
        prop_assert_eq!(done.len(), total, "the plans deadlock");
    }
}

/// A random graph with NCCL operations: items in order, each a node (rank, plain or NCCL wire)
/// or a collective (one member per rank); every node reads up to two nodes of earlier items.
fn nccl_graphs() -> impl Strategy<Value = (GraphDesc, usize)> {
    (2usize..5, 1usize..30).prop_flat_map(|(ranks, items)| {
        let item = (
            0u8..4,
            0..ranks,
            proptest::collection::vec(any::<u32>(), 2 * ranks),
        );
        (Just(ranks), proptest::collection::vec(item, items)).prop_map(|(ranks, items)| {
            let mut g = GraphDesc::new("nccl random");
            // `picks` are nodes of earlier items (below `node`).
            let reads = |g: &mut GraphDesc, node: u32, picks: &[u32]| {
                for &p in picks {
                    g.edge(p, node);
                }
            };
            for (i, (kind, rank, picks)) in items.into_iter().enumerate() {
                let first = g.nodes.len() as u32;
                if kind == 0 {
                    let members: Vec<u32> = (0..ranks)
                        .map(|r| g.node(format!("c{i}.{r}"), r, Wire::Device))
                        .collect();
                    for (r, &m) in members.iter().enumerate() {
                        if first > 0 {
                            reads(&mut g, m, &[picks[2 * r] % first, picks[2 * r + 1] % first]);
                        }
                    }
                    g.collective(format!("c{i}"), members);
                } else {
                    let wire = if kind == 1 { Wire::Nccl } else { Wire::Plain };
                    let n = g.node(format!("n{i}"), rank, wire);
                    if first > 0 {
                        reads(&mut g, n, &[picks[0] % first, picks[1] % first]);
                    }
                }
            }
            (g, ranks)
        })
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// NCCL operations (collectives, NCCL transfers) lower to one order that every rank issues
    /// its part of, chained; the ranks then run to the end, each NCCL operation completing
    /// only once every rank it involves has reached it (NCCL's rendezvous: no tags).
    #[test]
    fn nccl_operations_run_in_one_order_without_deadlock((g, ranks) in nccl_graphs()) {
        // Edges go from earlier nodes to later ones, collectives are complete: it lowers.
        let l = lower(&g, ranks).unwrap();
        prop_assert_eq!(&l, &lower(&g, ranks).unwrap());
        // Each rank's chain is the global order's part that involves it.
        for p in &l.plans {
            let mut want = Vec::new();
            for op in &l.nccl_order {
                match *op {
                    NcclOp::Collective(c) => {
                        let m = g.collectives[c as usize].members[p.rank];
                        want.push(LocalNode::Compute(m));
                    }
                    NcclOp::Transfer(t) => {
                        let tr = &l.transfers[t as usize];
                        if tr.from == p.rank { want.push(LocalNode::Send(t)); }
                        if tr.to == p.rank { want.push(LocalNode::Recv(t)); }
                    }
                }
            }
            prop_assert_eq!(&p.nccl, &want);
        }
        // Every collective and every NCCL transfer is in the order once.
        let nccl_transfers = l.transfers.iter().filter(|t| g.nodes[t.producer as usize].wire == Wire::Nccl).count();
        prop_assert_eq!(l.nccl_order.len(), g.collectives.len() + nccl_transfers);

        // Run: local edges plus each rank's chain; a plain receive after its send; an NCCL
        // operation when all its participants are ready (together).
        let preds: Vec<HashMap<LocalNode, Vec<LocalNode>>> = l.plans.iter().map(|p| {
            let mut m: HashMap<LocalNode, Vec<LocalNode>> = HashMap::new();
            for &(a, b) in &p.edges { m.entry(b).or_default().push(a); }
            for w in p.nccl.windows(2) { m.entry(w[1]).or_default().push(w[0]); }
            m
        }).collect();
        let mut done: HashSet<(usize, LocalNode)> = HashSet::new();
        let ready = |done: &HashSet<(usize, LocalNode)>, r: usize, n: LocalNode| {
            preds[r].get(&n).is_none_or(|ps| ps.iter().all(|q| done.contains(&(r, *q))))
        };
        let participants = |op: &NcclOp| -> Vec<(usize, LocalNode)> {
            match *op {
                NcclOp::Collective(c) => g.collectives[c as usize].members.iter()
                    .map(|&m| (l.rank_of[m as usize], LocalNode::Compute(m))).collect(),
                NcclOp::Transfer(t) => {
                    let tr = &l.transfers[t as usize];
                    vec![(tr.from, LocalNode::Send(t)), (tr.to, LocalNode::Recv(t))]
                }
            }
        };
        let in_nccl: HashSet<(usize, LocalNode)> = l.nccl_order.iter().flat_map(participants).collect();
        let total: usize = l.plans.iter().map(|p| p.compute.len() + p.sends.len() + p.recvs.len()).sum();
        loop {
            let mut progressed = false;
            for op in &l.nccl_order {
                let parts = participants(op);
                if parts.iter().all(|&(r, n)| !done.contains(&(r, n)) && ready(&done, r, n)) {
                    done.extend(parts);
                    progressed = true;
                }
            }
            for p in &l.plans {
                let all = p.compute.iter().map(|&i| LocalNode::Compute(i))
                    .chain(p.sends.iter().map(|&t| LocalNode::Send(t)))
                    .chain(p.recvs.iter().map(|&t| LocalNode::Recv(t)));
                for node in all.collect::<Vec<_>>() {
                    if done.contains(&(p.rank, node)) || in_nccl.contains(&(p.rank, node)) { continue; }
                    let remote = match node {
                        LocalNode::Recv(t) => done.contains(&(l.transfers[t as usize].from, LocalNode::Send(t))),
                        _ => true,
                    };
                    if remote && ready(&done, p.rank, node) {
                        done.insert((p.rank, node));
                        progressed = true;
                    }
                }
            }
            if !progressed { break; }
        }
        prop_assert_eq!(done.len(), total, "the ranks deadlock");
    }
}

/// Whether the ranks' plans run to the end together: a node runs once its local
/// predecessors ran, a receive also once its send ran.
fn runs_to_end(l: &boundpool_ranks::Lowering) -> bool {
    let preds: Vec<HashMap<LocalNode, Vec<LocalNode>>> = l
        .plans
        .iter()
        .map(|p| {
            let mut m: HashMap<LocalNode, Vec<LocalNode>> = HashMap::new();
            for &(a, b) in &p.edges {
                m.entry(b).or_default().push(a);
            }
            m
        })
        .collect();
    let mut done: HashSet<(usize, LocalNode)> = HashSet::new();
    let total: usize = l
        .plans
        .iter()
        .map(|p| p.compute.len() + p.sends.len() + p.recvs.len())
        .sum();
    loop {
        let mut progressed = false;
        for p in &l.plans {
            let all = p
                .compute
                .iter()
                .map(|&i| LocalNode::Compute(i))
                .chain(p.sends.iter().map(|&t| LocalNode::Send(t)))
                .chain(p.recvs.iter().map(|&t| LocalNode::Recv(t)));
            for node in all.collect::<Vec<_>>() {
                if done.contains(&(p.rank, node)) {
                    continue;
                }
                let local = preds[p.rank]
                    .get(&node)
                    .is_none_or(|ps| ps.iter().all(|q| done.contains(&(p.rank, *q))));
                let remote = match node {
                    LocalNode::Recv(t) => {
                        done.contains(&(l.transfers[t as usize].from, LocalNode::Send(t)))
                    }
                    _ => true,
                };
                if local && remote {
                    done.insert((p.rank, node));
                    progressed = true;
                }
            }
        }
        if !progressed {
            return done.len() == total;
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// One copy a host (`plan::relay` with `plan::per_host`) on a random host map: the same
    /// transfers and consumers, each relayed one received on the relay's rank from the
    /// producer, one message a producer and other host, dense indices, no deadlock.
    #[test]
    fn relaying_per_host_sends_one_copy_a_host(
        (g, ranks) in graphs(),
        host_seeds in proptest::collection::vec(0usize..3, 7),
    ) {
        use boundpool_ranks::plan::{crossing_hosts, per_host, relay, relayable};
        let Ok(flat) = lower(&g, ranks) else { return Ok(()) };
        let hosts: Vec<usize> = host_seeds[..ranks].to_vec();
        let l = relay(&g, &flat, &*per_host(hosts.clone()));
        prop_assert_eq!(&l, &relay(&g, &flat, &*per_host(hosts.clone())), "not deterministic");
        prop_assert_eq!(l.transfers.len(), flat.transfers.len());
        for (p, q) in l.plans.iter().zip(&flat.plans) {
            prop_assert_eq!((&p.compute, &p.recvs), (&q.compute, &q.recvs));
        }
        let mut by_pair: HashMap<(usize, usize), Vec<u32>> = HashMap::new();
        // Per producer, the hosts its value entered from another host.
        let mut entered: HashMap<u32, Vec<usize>> = HashMap::new();
        for (t, f) in l.transfers.iter().zip(&flat.transfers) {
            prop_assert_eq!((t.producer, t.to, &t.consumers, t.priority), (f.producer, f.to, &f.consumers, f.priority));
            let home = l.rank_of[t.producer as usize];
            match t.via {
                None => prop_assert_eq!(t.from, home),
                Some(up) => {
                    let up = &l.transfers[up as usize];
                    prop_assert!(relayable(g.nodes[t.producer as usize].wire));
                    prop_assert_eq!((up.producer, up.to, up.via), (t.producer, t.from, None));
                    prop_assert_eq!(hosts[t.from], hosts[t.to]);
                    prop_assert!(hosts[t.to] != hosts[home]);
                }
            }
            if hosts[t.from] != hosts[t.to] {
                entered.entry(t.producer).or_default().push(hosts[t.to]);
            }
            by_pair.entry((t.from, t.to)).or_default().push(t.index);
        }
        for (p, mut hs) in entered {
            let n = hs.len();
            hs.sort_unstable();
            hs.dedup();
            if relayable(g.nodes[p as usize].wire) {
                prop_assert_eq!(hs.len(), n, "node {} entered a host twice", p);
            }
        }
        let mut max = 0;
        for (_, idx) in by_pair {
            prop_assert_eq!(idx.clone(), (0..idx.len() as u32).collect::<Vec<_>>());
            max = max.max(idx.len() as u32);
        }
        prop_assert_eq!(l.tags_per_run, max);
        prop_assert!(crossing_hosts(&l, &hosts) <= crossing_hosts(&flat, &hosts));
        prop_assert!(runs_to_end(&l), "the relayed plans deadlock");
    }
}
