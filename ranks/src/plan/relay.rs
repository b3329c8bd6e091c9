//! Relays: a value read on many ranks forwarded by ranks that received it, instead of sent by
//! its producer's rank to each. A transformation of [`lower`](super::lower)'s [`Lowering`]:
//! the same transfers (one per producer and consuming rank, the same consumers, the same
//! positions), but a transfer may be sent by another consuming rank after its own receive
//! ([`Transfer::via`]). The runtime (one copy a host, [`per_host`]) and the simulator (also
//! trees, [`k_ary`]) call the same code.
//!
//! Only host values are relayed ([`Wire::Plain`], [`Wire::Serde`]): a relay forwards the bytes
//! as they arrived. Device values (staged or over NCCL) stay flat, so the NCCL order and each
//! plan's NCCL chain are unchanged.

use std::collections::BTreeMap;

use crate::plan::desc::{GraphDesc, Wire};
use crate::plan::lower::{LocalNode, LocalPlan, Lowering};
use crate::plan::transfer::Transfer;

/// Who sends a producer's value to each of its consuming ranks: called with the producer's
/// rank and its consuming ranks (`tos`, ascending), it returns for each the index in `tos` of
/// the rank that forwards it, or `None` for the producer's own rank. Every parent must come
/// earlier in the list (a tree rooted at the producer).
pub type Parents = dyn Fn(usize, &[usize]) -> Vec<Option<usize>> + Send + Sync;

/// A `fanout`-ary tree over the consuming ranks in rank order (breadth first: the producer
/// sends to the first `fanout`, the k-th of those to the next `fanout`, …).
pub fn k_ary(fanout: usize) -> Box<Parents> {
    let f = fanout.max(1);
    Box::new(move |_from, tos| {
        (0..tos.len())
            .map(|j| if j < f { None } else { Some((j - f) / f) })
            .collect()
    })
}

/// One copy a host: the producer sends to every consuming rank of its own host and to the
/// first consuming rank of each other host, which forwards to the others of its host over
/// the host's shared memory. `host_of[r]` is rank `r`'s host (any numbering; a rank past the
/// end is a host of its own).
pub fn per_host(host_of: Vec<usize>) -> Box<Parents> {
    let host = move |r: usize| host_of.get(r).map_or((usize::MAX, r), |&h| (h, 0));
    Box::new(move |from, tos| {
        let mut leader: BTreeMap<(usize, usize), usize> = BTreeMap::new();
        tos.iter()
            .enumerate()
            .map(|(j, &to)| {
                let h = host(to);
                if h == host(from) {
                    return None;
                }
                match leader.get(&h) {
                    Some(&l) => Some(l),
                    None => {
                        leader.insert(h, j);
                        None
                    }
                }
            })
            .collect()
    })
}

/// Whether a producer's value may be forwarded: host values only (the relay sends the bytes
/// it received; a device value's bytes land in staging memory or on the device).
pub fn relayable(wire: Wire) -> bool {
    matches!(wire, Wire::Plain | Wire::Serde)
}

/// Rebuilds `l` (the lowering of `desc`) with the transfers of every [`relayable`] producer
/// forwarded as `parents` says. Transfers keep their positions; `from` becomes the sending
/// rank, `via` the transfer whose receive it forwards, and `index` is renumbered densely per
/// ordered pair. Deterministic, as `lower`: ranks that agree on `parents` agree on the result.
pub fn relay(desc: &GraphDesc, l: &Lowering, parents: &Parents) -> Lowering {
    let ranks = l.ranks;
    let mut transfers: Vec<Transfer> = Vec::with_capacity(l.transfers.len());
    let mut i = 0;
    while i < l.transfers.len() {
        let p = l.transfers[i].producer;
        let mut j = i;
        while j < l.transfers.len() && l.transfers[j].producer == p {
            j += 1;
        }
        let group = &l.transfers[i..j];
        let wire = desc.nodes.get(p as usize).map_or(Wire::Local, |n| n.wire);
        if group.len() < 2 || !relayable(wire) {
            transfers.extend(group.iter().cloned());
        } else {
            let from = group[0].from;
            let tos: Vec<usize> = group.iter().map(|t| t.to).collect();
            let par = parents(from, &tos);
            let base = transfers.len() as u32;
            for (k, t) in group.iter().enumerate() {
                let (sender, via) = match par.get(k).copied().flatten() {
                    Some(q) if q < k => (tos[q], Some(base + q as u32)),
                    _ => (from, None),
                };
                transfers.push(Transfer {
                    from: sender,
                    via,
                    ..t.clone()
                });
            }
        }
        i = j;
    }
    if transfers.iter().all(|t| t.via.is_none()) {
        return l.clone();
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
            sends: Vec::new(),
            edges: p
                .edges
                .iter()
                .filter(|(_, b)| !matches!(b, LocalNode::Send(_)))
                .copied()
                .collect(),
            ..p.clone()
        })
        .collect();
    for (t, tr) in transfers.iter().enumerate() {
        let t = t as u32;
        let plan = &mut plans[tr.from];
        plan.sends.push(t);
        let source = match tr.via {
            None => LocalNode::Compute(tr.producer),
            Some(up) => LocalNode::Recv(up),
        };
        plan.edges.push((source, LocalNode::Send(t)));
    }
    Lowering {
        ranks,
        rank_of: l.rank_of.clone(),
        tags_per_run: pair.iter().copied().max().unwrap_or(0),
        transfers,
        plans,
        // NCCL transfers are never relayed: their senders, positions and order stay.
        nccl_order: l.nccl_order.clone(),
    }
}

/// How many transfers of `l` go from one host to another (`host_of` as in [`per_host`]).
pub fn crossing_hosts(l: &Lowering, host_of: &[usize]) -> usize {
    let host = |r: usize| host_of.get(r).map_or((usize::MAX, r), |&h| (h, 0));
    l.transfers
        .iter()
        .filter(|t| host(t.from) != host(t.to))
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::lower;

    fn fan(ranks: usize, wire: Wire) -> GraphDesc {
        let mut g = GraphDesc::new("fan");
        let a = g.node("a", 0, wire);
        for r in 1..ranks {
            let b = g.node(format!("b{r}"), r, Wire::Plain);
            g.edge(a, b);
        }
        g
    }

    #[test]
    fn a_binary_tree_forwards_from_the_receivers() {
        let g = fan(8, Wire::Plain);
        let l = lower(&g, 8).unwrap();
        assert_eq!(l.transfers.len(), 7);
        let t = relay(&g, &l, &*k_ary(2));
        // Consuming ranks 1..=7: rank 0 sends to 1 and 2; 1 to 3, 4; 2 to 5, 6; 3 to 7.
        let senders: Vec<(usize, usize)> = t.transfers.iter().map(|x| (x.from, x.to)).collect();
        assert_eq!(
            senders,
            vec![(0, 1), (0, 2), (1, 3), (1, 4), (2, 5), (2, 6), (3, 7)]
        );
        let via: Vec<Option<u32>> = t.transfers.iter().map(|x| x.via).collect();
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
        let hosts: Vec<usize> = (0..12).map(|r| r / 4).collect();
        let t = relay(&g, &l, &*per_host(hosts.clone()));
        let senders: Vec<(usize, usize)> = t.transfers.iter().map(|x| (x.from, x.to)).collect();
        assert_eq!(
            senders,
            vec![(1, 0), (1, 2), (1, 4), (4, 5), (4, 6), (4, 7), (1, 9)]
        );
        assert_eq!(crossing_hosts(&l, &hosts), 5);
        assert_eq!(crossing_hosts(&t, &hosts), 2);
    }

    #[test]
    fn two_hosts_of_two_ranks() {
        // a on rank 0 (host 0) read on 1 (host 0), 2 and 3 (host 1); c on rank 3 read on
        // 0, 1 and 2; d on 2 read on 3 only.
        let mut g = GraphDesc::new("2x2");
        let a = g.node("a", 0, Wire::Serde);
        let b: Vec<u32> = (0..4)
            .map(|r| g.node(format!("b{r}"), r, Wire::Plain))
            .collect();
        let c = g.node("c", 3, Wire::Plain);
        let d = g.node("d", 2, Wire::Plain);
        for &x in &b[1..] {
            g.edge(a, x);
        }
        for &x in &b[..3] {
            g.edge(c, x);
        }
        g.edge(d, b[3]);
        let l = lower(&g, 4).unwrap();
        let hosts = vec![0, 0, 1, 1];
        let t = relay(&g, &l, &*per_host(hosts.clone()));
        let route: Vec<(u32, usize, usize, Option<u32>)> = t
            .transfers
            .iter()
            .map(|x| (x.producer, x.from, x.to, x.via))
            .collect();
        assert_eq!(
            route,
            vec![
                // a: its own host direct, one copy to host 1 (rank 2), which forwards to 3.
                (a, 0, 1, None),
                (a, 0, 2, None),
                (a, 2, 3, Some(1)),
                // c: rank 2 of its own host direct, one copy to host 0 (rank 0) for rank 1.
                (c, 3, 0, None),
                (c, 0, 1, Some(3)),
                (c, 3, 2, None),
                // d: one consuming rank, nothing to relay.
                (d, 2, 3, None),
            ]
        );
        // One inter-host message a producer and host (d stays on host 1).
        assert_eq!(crossing_hosts(&l, &hosts), 4);
        assert_eq!(crossing_hosts(&t, &hosts), 2);
        // Indices dense per ordered pair, in transfer order: (0,1) carries a and c, (2,3) the
        // forwarded a and d.
        let idx: Vec<u32> = t.transfers.iter().map(|x| x.index).collect();
        assert_eq!(idx, vec![0, 0, 0, 0, 1, 0, 1]);
        assert_eq!(t.tags_per_run, 2);
        // The relay's plan: its receive before the forwarded send; receives unchanged.
        assert!(t.plans[2]
            .edges
            .contains(&(LocalNode::Recv(1), LocalNode::Send(2))));
        assert_eq!(t.plans[2].sends, vec![2, 6]);
        assert_eq!(t.plans[0].sends, vec![0, 1, 4]);
        for (p, q) in t.plans.iter().zip(&l.plans) {
            assert_eq!((&p.recvs, &p.compute), (&q.recvs, &q.compute));
        }
    }

    #[test]
    fn device_values_and_one_host_stay_flat() {
        for wire in [Wire::Device, Wire::Nccl] {
            let g = fan(4, wire);
            let l = lower(&g, 4).unwrap();
            assert_eq!(relay(&g, &l, &*per_host(vec![0, 1, 1, 1])), l, "{wire}");
        }
        let g = fan(4, Wire::Plain);
        let l = lower(&g, 4).unwrap();
        assert_eq!(relay(&g, &l, &*per_host(vec![0; 4])), l);
        assert_ne!(relay(&g, &l, &*per_host(vec![0, 1, 1, 1])), l);
    }
}
