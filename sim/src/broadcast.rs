//! Broadcasts in the lowering, tried in simulation: a value read on many ranks is forwarded
//! by the ranks that received it instead of being sent by its producer's rank to each.
//! A transformation of `plan::lower`'s [`Lowering`]: the same transfers (one per producer
//! and consuming rank, the same consumers), but a transfer may be sent by another consuming
//! rank after its own receive (`via`).

use boundpool_ranks::plan::{LocalNode, LocalPlan, Lowering, Transfer};

/// For each consuming rank of one producer (`tos`, ascending), the index in `tos` of the rank
/// that sends it the value, or `None` for the producer's own rank. Must form a tree rooted at
/// the producer (every parent earlier in the list).
pub(crate) type Parents = dyn Fn(usize, &[usize]) -> Vec<Option<usize>>;

/// A `fanout`-ary tree over the consuming ranks in rank order (breadth first: the producer
/// sends to the first `fanout`, the k-th of those to the next `fanout`, …).
pub(crate) fn k_ary(fanout: usize) -> Box<Parents> {
    let f = fanout.max(1);
    Box::new(move |_from, tos| {
        (0..tos.len())
            .map(|j| if j < f { None } else { Some((j - f) / f) })
            .collect()
    })
}

/// One copy per host: the producer sends to the first consuming rank of each host (and to
/// every consuming rank of its own host), which forwards to the others of its host.
pub(crate) fn per_host(ranks_per_host: usize) -> Box<Parents> {
    let per = ranks_per_host.max(1);
    Box::new(move |from, tos| {
        let mut leader: std::collections::BTreeMap<usize, usize> = Default::default();
        tos.iter()
            .enumerate()
            .map(|(j, &to)| {
                let host = to / per;
                if host == from / per {
                    return None;
                }
                match leader.get(&host) {
                    Some(&l) => Some(l),
                    None => {
                        leader.insert(host, j);
                        None
                    }
                }
            })
            .collect()
    })
}

/// Rebuilds `l` with every producer's transfers forwarded as `parents` says; returns the new
/// lowering and, per transfer, the transfer whose receive it forwards.
pub(crate) fn relay(l: &Lowering, parents: &Parents) -> (Lowering, Vec<Option<u32>>) {
    let ranks = l.ranks;
    let mut transfers: Vec<Transfer> = Vec::with_capacity(l.transfers.len());
    let mut via: Vec<Option<u32>> = Vec::with_capacity(l.transfers.len());
    let mut i = 0;
    while i < l.transfers.len() {
        let p = l.transfers[i].producer;
        let mut j = i;
        while j < l.transfers.len() && l.transfers[j].producer == p {
            j += 1;
        }
        let group = &l.transfers[i..j];
        let from = group[0].from;
        let tos: Vec<usize> = group.iter().map(|t| t.to).collect();
        let par = parents(from, &tos);
        let base = transfers.len() as u32;
        for (k, t) in group.iter().enumerate() {
            let (sender, v) = match par[k] {
                None => (from, None),
                Some(q) => (tos[q], Some(base + q as u32)),
            };
            transfers.push(Transfer {
                from: sender,
                index: 0,
                ..t.clone()
            });
            via.push(v);
        }
        i = j;
    }
    // Dense indices per ordered pair, in transfer order.
    let mut pair = vec![0u32; ranks * ranks];
    for t in &mut transfers {
        let slot = &mut pair[t.from * ranks + t.to];
        t.index = *slot;
        *slot += 1;
    }
    let mut plans: Vec<LocalPlan> = l
        .plans
        .iter()
        .map(|p| LocalPlan {
            rank: p.rank,
            compute: p.compute.clone(),
            sends: Vec::new(),
            recvs: p.recvs.clone(),
            edges: p
                .edges
                .iter()
                .filter(|(_, b)| !matches!(b, LocalNode::Send(_)))
                .copied()
                .collect(),
            // The simulator's graphs have no NCCL wires (their GPU values cross as plain
            // device transfers): no NCCL order to keep.
            nccl: Vec::new(),
        })
        .collect();
    for (t, tr) in transfers.iter().enumerate() {
        let t = t as u32;
        let plan = &mut plans[tr.from];
        plan.sends.push(t);
        let source = match via[t as usize] {
            None => LocalNode::Compute(tr.producer),
            Some(up) => LocalNode::Recv(up),
        };
        plan.edges.push((source, LocalNode::Send(t)));
    }
    let tags_per_run = pair.iter().copied().max().unwrap_or(0);
    (
        Lowering {
            ranks,
            rank_of: l.rank_of.clone(),
            transfers,
            tags_per_run,
            plans,
            nccl_order: Vec::new(),
        },
        via,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use boundpool_ranks::{lower, GraphDesc, Wire};

    fn fan(ranks: usize) -> GraphDesc {
        let mut g = GraphDesc::new("fan");
        let a = g.node("a", 0, Wire::Plain);
        for r in 1..ranks {
            let b = g.node(format!("b{r}"), r, Wire::Plain);
            g.edge(a, b);
        }
        g
    }

    #[test]
    fn a_binary_tree_forwards_from_the_receivers() {
        let l = lower(&fan(8), 8).unwrap();
        assert_eq!(l.transfers.len(), 7);
        let (t, via) = relay(&l, &*k_ary(2));
        // Consuming ranks 1..=7: rank 0 sends to 1 and 2; 1 to 3, 4; 2 to 5, 6; 3 to 7.
        let senders: Vec<(usize, usize)> = t.transfers.iter().map(|x| (x.from, x.to)).collect();
        assert_eq!(
            senders,
            vec![(0, 1), (0, 2), (1, 3), (1, 4), (2, 5), (2, 6), (3, 7)]
        );
        assert_eq!(
            via,
            vec![None, None, Some(0), Some(0), Some(1), Some(1), Some(2)]
        );
        assert!(t.plans[1]
            .edges
            .contains(&(LocalNode::Recv(0), LocalNode::Send(2))));
        assert_eq!(t.plans[0].sends, vec![0, 1]);
        assert_eq!(t.plans[3].sends, vec![6]);
        assert_eq!(t.transfers[6].consumers, l.transfers[6].consumers);
        assert_eq!(t.tags_per_run, 1);
    }

    #[test]
    fn one_copy_per_host() {
        // 4 ranks a host: from rank 1 to ranks 0, 2 (its host), 4..7 and 9.
        let mut g = GraphDesc::new("hosts");
        let a = g.node("a", 1, Wire::Plain);
        for r in [0, 2, 4, 5, 6, 7, 9] {
            let b = g.node(format!("b{r}"), r, Wire::Plain);
            g.edge(a, b);
        }
        let l = lower(&g, 12).unwrap();
        let (t, _) = relay(&l, &*per_host(4));
        let senders: Vec<(usize, usize)> = t.transfers.iter().map(|x| (x.from, x.to)).collect();
        assert_eq!(
            senders,
            vec![(1, 0), (1, 2), (1, 4), (4, 5), (4, 6), (4, 7), (1, 9)]
        );
    }
}
