//! Lowering: a rank-annotated graph to each rank's local plan, where each cross-rank edge
//! becomes a send on the producer's rank and a receive on the consumer's, one transfer per
//! (producer, consuming rank).

use std::collections::BTreeSet;

use crate::error::{Error, ErrorKind};
use crate::plan::desc::{GraphDesc, On, Wire};
use crate::plan::order::{check_collectives, nccl_order, NcclOp};
use crate::plan::transfer::Transfer;

/// A node of a rank's local plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LocalNode {
    /// A node of the graph (by index) that runs on this rank.
    Compute(u32),
    /// The send of transfer `t` (by index in [`Lowering::transfers`]).
    Send(u32),
    /// The receive of transfer `t`.
    Recv(u32),
}

/// What one rank runs: its nodes, its sends and receives, and the edges among them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LocalPlan {
    /// The rank.
    pub rank: usize,
    /// The graph's nodes placed here, ascending.
    pub compute: Vec<u32>,
    /// Transfers this rank sends, ascending.
    pub sends: Vec<u32>,
    /// Transfers this rank receives, ascending.
    pub recvs: Vec<u32>,
    /// Local edges: compute → compute, compute → its sends, receive → its consumers.
    pub edges: Vec<(LocalNode, LocalNode)>,
    /// This rank's NCCL operations (collective members, NCCL sends and receives) in the one
    /// order every rank issues them ([`Lowering::nccl_order`]): the runtime chains them with
    /// edges, each after the one before.
    pub nccl: Vec<LocalNode>,
}

/// Every rank's plan for one graph (what [`lower`] returns).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lowering {
    /// The number of ranks lowered for.
    pub ranks: usize,
    /// Each node's rank.
    pub rank_of: Vec<usize>,
    /// Every transfer, grouped by producer (ascending), then by receiving rank (ascending).
    pub transfers: Vec<Transfer>,
    /// The most transfers between one ordered pair of ranks (tags a run needs per direction).
    pub tags_per_run: u32,
    /// Each rank's plan, by rank.
    pub plans: Vec<LocalPlan>,
    /// The graph's NCCL operations (collectives, transfers of [`Wire::Nccl`] values) in the
    /// one order every rank issues them: a topological order of the graph with each operation
    /// one vertex, the same on every rank (see `plan/order.rs`).
    pub nccl_order: Vec<NcclOp>,
}

/// Resolves each node's rank: its own, or its datum's owner.
pub fn place(desc: &GraphDesc, ranks: usize) -> Result<Vec<usize>, Error> {
    if ranks == 0 {
        return Err(Error::new(ErrorKind::InvalidConfig, "zero ranks"));
    }
    for (d, datum) in desc.data.iter().enumerate() {
        if datum.owner >= ranks {
            return Err(Error::new(
                ErrorKind::InvalidGraph,
                format!(
                    "graph '{}': datum '{}' (#{d}) is owned by rank {}, but there are {ranks} ranks",
                    crate::error::bounded(&desc.name),
                    crate::error::bounded(&datum.name),
                    datum.owner
                ),
            ));
        }
    }
    desc.nodes
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let rank = match n.on {
                On::Rank(r) => r,
                On::Writes(d) => match desc.data.get(d.0 as usize) {
                    Some(datum) => datum.owner,
                    None => {
                        return Err(Error::new(
                            ErrorKind::InvalidGraph,
                            format!(
                            "graph '{}': node {} writes datum #{}, which the graph does not have",
                            crate::error::bounded(&desc.name),
                            desc.describe(i as u32),
                            d.0
                        ),
                        )
                        .at_node(n.name.clone()))
                    }
                },
            };
            if rank >= ranks {
                return Err(Error::new(
                    ErrorKind::InvalidGraph,
                    format!(
                        "graph '{}': node {} is placed on rank {rank}, but there are {ranks} ranks",
                        crate::error::bounded(&desc.name),
                        desc.describe(i as u32)
                    ),
                )
                .at_node(n.name.clone()));
            }
            Ok(rank)
        })
        .collect()
}

/// Lowers `desc` for `ranks` ranks: places every node, checks the edges (known nodes, no cycle,
/// also none that closes only across ranks; every crossing producer can cross), and makes
/// each rank's plan. Deterministic: every rank computes the same lowering from the same
/// description.
pub fn lower(desc: &GraphDesc, ranks: usize) -> Result<Lowering, Error> {
    let rank_of = place(desc, ranks)?;
    let n = desc.nodes.len();
    for &(a, b) in &desc.edges {
        for x in [a, b] {
            if x as usize >= n {
                return Err(Error::new(
                    ErrorKind::InvalidGraph,
                    format!(
                        "graph '{}': an edge names node #{x}, but the graph has {n} nodes",
                        crate::error::bounded(&desc.name)
                    ),
                ));
            }
        }
    }
    check_acyclic(desc)?;
    check_collectives(desc, &rank_of, ranks)?;
    let levels = bottom_levels(desc);

    // Consumer ranks of each producer, and each crossing edge checked for a wire.
    let mut consumer_ranks: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); n];
    for &(a, b) in &desc.edges {
        let (ra, rb) = (rank_of[a as usize], rank_of[b as usize]);
        if ra != rb {
            let node = &desc.nodes[a as usize];
            if node.wire == Wire::Local {
                return Err(Error::new(
                    ErrorKind::CannotCross,
                    format!(
                        "graph '{}': edge {} (rank {ra}) -> {} (rank {rb}) crosses ranks, but the \
                         output of {} ({}) cannot cross: make it with plain_node (Pod data) or \
                         serde_node",
                        crate::error::bounded(&desc.name),
                        desc.describe(a),
                        desc.describe(b),
                        desc.describe(a),
                        if node.type_name.is_empty() {
                            "its type"
                        } else {
                            &node.type_name
                        },
                    ),
                )
                .at_node(node.name.clone()));
            }
            consumer_ranks[a as usize].insert(rb);
        }
    }

    let mut plans: Vec<LocalPlan> = (0..ranks)
        .map(|rank| LocalPlan {
            rank,
            ..LocalPlan::default()
        })
        .collect();
    for (i, &r) in rank_of.iter().enumerate() {
        plans[r].compute.push(i as u32);
    }
    // Transfers in producer order, then receiving rank order; numbered per ordered pair.
    let mut pair_count = vec![0u32; ranks * ranks];
    let mut transfers = Vec::new();
    // transfer_of[(producer, to)] through a per-producer list (few consumer ranks each).
    let mut first_transfer = vec![u32::MAX; n];
    for (p, set) in consumer_ranks.iter().enumerate() {
        let from = rank_of[p];
        for (k, &to) in set.iter().enumerate() {
            if k == 0 {
                first_transfer[p] = transfers.len() as u32;
            }
            let t = transfers.len() as u32;
            let slot = &mut pair_count[from * ranks + to];
            transfers.push(Transfer {
                producer: p as u32,
                from,
                to,
                index: *slot,
                consumers: Vec::new(),
                priority: 0,
                via: None,
            });
            *slot += 1;
            plans[from].sends.push(t);
            plans[from]
                .edges
                .push((LocalNode::Compute(p as u32), LocalNode::Send(t)));
            plans[to].recvs.push(t);
        }
    }
    let transfer_to = |p: u32, to: usize| -> u32 {
        let first = first_transfer[p as usize];
        let count = consumer_ranks[p as usize].len() as u32;
        (first..first + count)
            .find(|&t| transfers[t as usize].to == to)
            .expect("a crossing edge has its transfer")
    };
    let mut seen = std::collections::HashSet::new();
    let mut consumer_lists: Vec<Vec<u32>> = vec![Vec::new(); transfers.len()];
    for &(a, b) in &desc.edges {
        if !seen.insert((a, b)) {
            continue;
        }
        let (ra, rb) = (rank_of[a as usize], rank_of[b as usize]);
        if ra == rb {
            plans[ra]
                .edges
                .push((LocalNode::Compute(a), LocalNode::Compute(b)));
        } else {
            let t = transfer_to(a, rb);
            consumer_lists[t as usize].push(b);
            plans[rb]
                .edges
                .push((LocalNode::Recv(t), LocalNode::Compute(b)));
        }
    }
    for (t, mut list) in consumer_lists.into_iter().enumerate() {
        list.sort_unstable();
        transfers[t].priority = list.iter().map(|&c| levels[c as usize]).max().unwrap_or(0);
        transfers[t].consumers = list;
    }
    for plan in &mut plans {
        plan.recvs.sort_unstable();
    }
    let tags_per_run = pair_count.iter().copied().max().unwrap_or(0);
    let nccl_order = nccl_order(desc, &rank_of, &transfers)?;
    for op in &nccl_order {
        match *op {
            NcclOp::Collective(c) => {
                for &m in &desc.collectives[c as usize].members {
                    plans[rank_of[m as usize]].nccl.push(LocalNode::Compute(m));
                }
            }
            NcclOp::Transfer(t) => {
                let tr = &transfers[t as usize];
                plans[tr.from].nccl.push(LocalNode::Send(t));
                plans[tr.to].nccl.push(LocalNode::Recv(t));
            }
        }
    }
    Ok(Lowering {
        ranks,
        rank_of,
        transfers,
        tags_per_run,
        plans,
        nccl_order,
    })
}

/// Each node's bottom level: the number of nodes on the longest path from it to a sink,
/// itself included (the graph is acyclic: checked before).
fn bottom_levels(desc: &GraphDesc) -> Vec<u32> {
    let n = desc.nodes.len();
    let mut outdeg = vec![0u32; n];
    let mut pred_start = vec![0usize; n + 1];
    for &(a, b) in &desc.edges {
        outdeg[a as usize] += 1;
        pred_start[b as usize + 1] += 1;
    }
    for i in 0..n {
        pred_start[i + 1] += pred_start[i];
    }
    let mut fill = pred_start.clone();
    let mut preds = vec![0u32; desc.edges.len()];
    for &(a, b) in &desc.edges {
        preds[fill[b as usize]] = a;
        fill[b as usize] += 1;
    }
    // Sinks first, then every node once all its successors are done.
    let mut level = vec![1u32; n];
    let mut stack: Vec<u32> = (0..n as u32).filter(|&i| outdeg[i as usize] == 0).collect();
    while let Some(v) = stack.pop() {
        for &p in &preds[pred_start[v as usize]..pred_start[v as usize + 1]] {
            let p = p as usize;
            level[p] = level[p].max(level[v as usize] + 1);
            outdeg[p] -= 1;
            if outdeg[p] == 0 {
                stack.push(p as u32);
            }
        }
    }
    level
}

/// Kahn's algorithm over the whole graph: a cycle is an error naming nodes on it, also one
/// whose edges cross ranks (each rank's plan alone would look acyclic, and deadlock).
fn check_acyclic(desc: &GraphDesc) -> Result<(), Error> {
    let n = desc.nodes.len();
    let mut indeg = vec![0u32; n];
    let mut succ_start = vec![0usize; n + 1];
    for &(a, b) in &desc.edges {
        indeg[b as usize] += 1;
        succ_start[a as usize + 1] += 1;
    }
    for i in 0..n {
        succ_start[i + 1] += succ_start[i];
    }
    let mut fill = succ_start.clone();
    let mut succ = vec![0u32; desc.edges.len()];
    for &(a, b) in &desc.edges {
        succ[fill[a as usize]] = b;
        fill[a as usize] += 1;
    }
    let mut left = indeg.clone();
    let mut stack: Vec<u32> = (0..n as u32).filter(|&i| indeg[i as usize] == 0).collect();
    let mut done = 0usize;
    while let Some(v) = stack.pop() {
        done += 1;
        for &s in &succ[succ_start[v as usize]..succ_start[v as usize + 1]] {
            left[s as usize] -= 1;
            if left[s as usize] == 0 {
                stack.push(s);
            }
        }
    }
    if done == n {
        return Ok(());
    }
    // Walk back from a node left over along unfinished predecessors until a node repeats.
    let mut preds: Vec<Vec<u32>> = vec![Vec::new(); n];
    for &(a, b) in &desc.edges {
        if left[a as usize] > 0 && left[b as usize] > 0 {
            preds[b as usize].push(a);
        }
    }
    let start = (0..n).find(|&i| left[i] > 0).expect("a node is left") as u32;
    let mut path = vec![start];
    let mut pos = std::collections::HashMap::new();
    pos.insert(start, 0usize);
    let mut v = start;
    loop {
        let p = *preds[v as usize]
            .first()
            .expect("a node left over has an unfinished predecessor");
        if let Some(&at) = pos.get(&p) {
            let mut cycle: Vec<u32> = path[at..].to_vec();
            cycle.reverse();
            let names: Vec<String> = cycle.iter().take(6).map(|&c| desc.describe(c)).collect();
            return Err(Error::new(
                ErrorKind::InvalidGraph,
                format!(
                    "graph '{}' has a cycle of {} nodes: {}{} -> {}",
                    crate::error::bounded(&desc.name),
                    cycle.len(),
                    names.join(" -> "),
                    if cycle.len() > 6 { " -> …" } else { "" },
                    desc.describe(cycle[0])
                ),
            )
            .at_node(desc.nodes[cycle[0] as usize].name.clone()));
        }
        pos.insert(p, path.len());
        path.push(p);
        v = p;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::desc::{DataId, GraphDesc, Wire};

    fn chain(ranks: &[usize]) -> GraphDesc {
        let mut g = GraphDesc::new("chain");
        for (i, &r) in ranks.iter().enumerate() {
            g.node(format!("n{i}"), r, Wire::Plain);
        }
        for i in 1..ranks.len() as u32 {
            g.edge(i - 1, i);
        }
        g
    }

    #[test]
    fn a_chain_across_two_ranks() {
        let l = lower(&chain(&[0, 0, 1, 1, 0]), 2).unwrap();
        assert_eq!(l.rank_of, vec![0, 0, 1, 1, 0]);
        assert_eq!(l.transfers.len(), 2);
        assert_eq!(
            (
                l.transfers[0].producer,
                l.transfers[0].from,
                l.transfers[0].to
            ),
            (1, 0, 1)
        );
        assert_eq!(l.transfers[0].consumers, vec![2]);
        assert_eq!(
            (
                l.transfers[1].producer,
                l.transfers[1].from,
                l.transfers[1].to
            ),
            (3, 1, 0)
        );
        assert_eq!(l.tags_per_run, 1);
        let p0 = &l.plans[0];
        assert_eq!(p0.compute, vec![0, 1, 4]);
        assert_eq!((p0.sends.clone(), p0.recvs.clone()), (vec![0], vec![1]));
        assert!(p0
            .edges
            .contains(&(LocalNode::Compute(1), LocalNode::Send(0))));
        assert!(p0
            .edges
            .contains(&(LocalNode::Recv(1), LocalNode::Compute(4))));
        let p1 = &l.plans[1];
        assert!(p1
            .edges
            .contains(&(LocalNode::Recv(0), LocalNode::Compute(2))));
        assert!(p1
            .edges
            .contains(&(LocalNode::Compute(2), LocalNode::Compute(3))));
    }

    #[test]
    fn a_value_goes_to_each_consuming_rank_once() {
        // a on rank 0 read by b, c on rank 1 and d on rank 2 and e on rank 0.
        let mut g = GraphDesc::new("fan");
        let a = g.node("a", 0, Wire::Serde);
        let b = g.node("b", 1, Wire::Local);
        let c = g.node("c", 1, Wire::Local);
        let d = g.node("d", 2, Wire::Local);
        let e = g.node("e", 0, Wire::Local);
        g.edge(a, b).edge(a, c).edge(a, d).edge(a, e).edge(a, b);
        let l = lower(&g, 3).unwrap();
        assert_eq!(l.transfers.len(), 2);
        assert_eq!(l.transfers[0].to, 1);
        assert_eq!(l.transfers[0].consumers, vec![b, c]);
        assert_eq!(l.transfers[1].to, 2);
        assert_eq!(l.plans[0].sends, vec![0, 1]);
        assert_eq!(l.plans[1].recvs, vec![0]);
        assert_eq!(l.plans[1].edges.len(), 2);
    }

    #[test]
    fn owner_computes() {
        let mut g = GraphDesc::new("owned");
        let x = g.datum("x", 2);
        let a = g.node("writes x", DataId(x.0), Wire::Plain);
        let b = g.node("on 0", 0, Wire::Plain);
        g.edge(b, a);
        let l = lower(&g, 3).unwrap();
        assert_eq!(l.rank_of, vec![2, 0]);
        assert_eq!(l.transfers[0].from, 0);
        assert_eq!(l.transfers[0].to, 2);
    }

    #[test]
    fn errors_name_what_is_wrong() {
        let e = lower(&chain(&[0, 3]), 2).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidGraph);
        assert!(
            e.to_string().contains("'n1' (#1) is placed on rank 3"),
            "{e}"
        );

        let mut g = GraphDesc::new("local");
        let a = g.node("a", 0, Wire::Local);
        let b = g.node("b", 1, Wire::Local);
        g.edge(a, b);
        let e = lower(&g, 2).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::CannotCross);
        assert!(
            e.to_string()
                .contains("edge 'a' (#0) (rank 0) -> 'b' (#1) (rank 1) crosses ranks"),
            "{e}"
        );

        let mut g = GraphDesc::new("bad datum");
        g.node("a", On::Writes(DataId(5)), Wire::Plain);
        assert!(lower(&g, 2)
            .unwrap_err()
            .to_string()
            .contains("writes datum #5"));
    }

    #[test]
    fn a_cycle_across_ranks_is_found() {
        // Each rank's plan alone has no cycle; the graph has one.
        let mut g = chain(&[0, 1]);
        g.edge(1, 0);
        let e = lower(&g, 2).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidGraph);
        assert!(e.to_string().contains("has a cycle of 2 nodes"), "{e}");
    }

    #[test]
    fn a_transfer_is_as_urgent_as_its_producer_s_longest_path() {
        // a (rank 0) -> b (rank 1) -> c -> d (rank 1); a -> e (rank 2), a sink.
        let mut g = GraphDesc::new("levels");
        let a = g.node("a", 0, Wire::Plain);
        let b = g.node("b", 1, Wire::Plain);
        let c = g.node("c", 1, Wire::Plain);
        let d = g.node("d", 0, Wire::Plain);
        let e = g.node("e", 2, Wire::Plain);
        g.edge(a, b).edge(b, c).edge(c, d).edge(a, e);
        let l = lower(&g, 3).unwrap();
        let prio: Vec<(u32, usize, u32)> = l
            .transfers
            .iter()
            .map(|t| (t.producer, t.to, t.priority))
            .collect();
        // a to rank 1, read by b: b c d (3); to rank 2, read by e: 1; c to rank 0, read by d: 1.
        assert_eq!(prio, vec![(a, 1, 3), (a, 2, 1), (c, 0, 1)]);
        assert_eq!(bottom_levels(&g), vec![4, 3, 2, 1, 1]);
    }

    #[test]
    fn pair_indices_count_per_direction() {
        // 0 -> 1 twice, 1 -> 0 once.
        let mut g = GraphDesc::new("pairs");
        let a = g.node("a", 0, Wire::Plain);
        let b = g.node("b", 0, Wire::Plain);
        let c = g.node("c", 1, Wire::Plain);
        let d = g.node("d", 0, Wire::Plain);
        g.edge(a, c).edge(b, c).edge(c, d);
        let l = lower(&g, 2).unwrap();
        let idx: Vec<(usize, usize, u32)> = l
            .transfers
            .iter()
            .map(|t| (t.from, t.to, t.index))
            .collect();
        assert_eq!(idx, vec![(0, 1, 0), (0, 1, 1), (1, 0, 0)]);
        assert_eq!(l.tags_per_run, 2);
    }
}
