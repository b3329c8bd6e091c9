//! The one order of NCCL operations every rank issues. NCCL has no tags: the operations on a
//! communicator match by their order, so every rank must issue its part of the graph's
//! collectives and NCCL transfers in the same order, and that order must agree with the
//! graph's edges (else a rank would wait, inside an operation, for a value that only a later
//! operation lets its producer compute). Pure: computed from the description alone, the same
//! on every rank.
//!
//! The order is a topological order of the graph in which each collective (its members on all
//! ranks) and each NCCL transfer (its send and its receive) is one vertex, taken smallest
//! first (a node by its index, a collective by its first member's, a transfer after its
//! producer): Kahn's algorithm with a heap. A cycle through such a vertex (a member that
//! depends on another member of its collective, say) cannot be issued in one order and is an
//! error naming the operation.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::error::{Error, ErrorKind};
use crate::plan::desc::{GraphDesc, Wire};
use crate::plan::transfer::Transfer;

/// One NCCL operation of a graph, in [`Lowering::nccl_order`](crate::plan::Lowering::nccl_order).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NcclOp {
    /// Collective `c` of [`GraphDesc::collectives`]: each member's rank issues its member.
    Collective(u32),
    /// Transfer `t` of [`Lowering::transfers`](crate::plan::Lowering::transfers), whose
    /// producer's wire is [`Wire::Nccl`]: its sender issues `ncclSend`, its receiver
    /// `ncclRecv`.
    Transfer(u32),
}

/// Checks the collectives: known, distinct member nodes, each in one collective, one per rank
/// of all `ranks`.
pub(crate) fn check_collectives(
    desc: &GraphDesc,
    rank_of: &[usize],
    ranks: usize,
) -> Result<(), Error> {
    let mut member_of = vec![None::<usize>; desc.nodes.len()];
    for (c, coll) in desc.collectives.iter().enumerate() {
        let bad = |what: String| {
            Error::new(
                ErrorKind::InvalidGraph,
                format!(
                    "graph '{}': collective '{}' (#{c}) {what}",
                    crate::error::bounded(&desc.name),
                    crate::error::bounded(&coll.name)
                ),
            )
        };
        let mut on_rank = vec![None::<u32>; ranks];
        for &m in &coll.members {
            let Some(&r) = rank_of.get(m as usize) else {
                return Err(bad(format!(
                    "names node #{m}, but the graph has {} nodes",
                    desc.nodes.len()
                )));
            };
            if let Some(other) = member_of[m as usize].replace(c) {
                return Err(bad(format!(
                    "has node {}, already a member of collective #{other}",
                    desc.describe(m)
                )));
            }
            if let Some(first) = on_rank[r].replace(m) {
                return Err(bad(format!(
                    "has two members on rank {r}: {} and {}",
                    desc.describe(first),
                    desc.describe(m)
                )));
            }
        }
        if let Some(r) = on_rank.iter().position(Option::is_none) {
            return Err(bad(format!(
                "has no member on rank {r}: an NCCL collective needs every rank of the \
                 communicator ({ranks})"
            )));
        }
    }
    Ok(())
}

/// The graph's NCCL operations in the order every rank issues them (empty when it has none).
pub(crate) fn nccl_order(
    desc: &GraphDesc,
    rank_of: &[usize],
    transfers: &[Transfer],
) -> Result<Vec<NcclOp>, Error> {
    let nccl_transfers: Vec<u32> = transfers
        .iter()
        .enumerate()
        .filter(|(_, t)| desc.nodes[t.producer as usize].wire == Wire::Nccl)
        .map(|(i, _)| i as u32)
        .collect();
    if desc.collectives.is_empty() && nccl_transfers.is_empty() {
        return Ok(Vec::new());
    }
    // Vertices: a node (alone, or its collective), then the NCCL transfers.
    let n = desc.nodes.len();
    let mut vertex_of: Vec<usize> = (0..n).collect();
    let mut kind: Vec<(u64, u64, Option<NcclOp>)> = (0..n as u64).map(|i| (i, 0, None)).collect();
    for (c, coll) in desc.collectives.iter().enumerate() {
        let v = kind.len();
        let first = coll.members.iter().copied().min().unwrap_or(0);
        kind.push((u64::from(first), 0, Some(NcclOp::Collective(c as u32))));
        for &m in &coll.members {
            vertex_of[m as usize] = v;
        }
    }
    let mut transfer_vertex = vec![usize::MAX; transfers.len()];
    for &t in &nccl_transfers {
        let tr = &transfers[t as usize];
        transfer_vertex[t as usize] = kind.len();
        kind.push((
            u64::from(tr.producer),
            1 + tr.to as u64,
            Some(NcclOp::Transfer(t)),
        ));
    }
    let mut succ: Vec<Vec<usize>> = vec![Vec::new(); kind.len()];
    let edge = |a: usize, b: usize, succ: &mut Vec<Vec<usize>>| -> Result<(), usize> {
        if a == b {
            return Err(a);
        }
        succ[a].push(b);
        Ok(())
    };
    let transfer_of = |p: u32, to: usize| {
        nccl_transfers
            .iter()
            .copied()
            .find(|&t| transfers[t as usize].producer == p && transfers[t as usize].to == to)
    };
    for &(a, b) in &desc.edges {
        let (va, vb) = (vertex_of[a as usize], vertex_of[b as usize]);
        let crossing = rank_of[a as usize] != rank_of[b as usize];
        let r = match transfer_of(a, rank_of[b as usize]).filter(|_| crossing) {
            Some(t) => {
                let vt = transfer_vertex[t as usize];
                edge(va, vt, &mut succ).and_then(|()| edge(vt, vb, &mut succ))
            }
            None => edge(va, vb, &mut succ),
        };
        if let Err(v) = r {
            return Err(unorderable(desc, transfers, &kind, v));
        }
    }
    // Kahn's algorithm, smallest vertex first.
    let mut indeg = vec![0usize; kind.len()];
    for s in &succ {
        for &b in s {
            indeg[b] += 1;
        }
    }
    // Only vertices in use: a collective's members no longer stand for themselves.
    let used: Vec<bool> = (0..kind.len())
        .map(|v| v >= n || vertex_of[v] == v)
        .collect();
    let mut heap: BinaryHeap<Reverse<(u64, u64, usize)>> = (0..kind.len())
        .filter(|&v| used[v] && indeg[v] == 0)
        .map(|v| Reverse((kind[v].0, kind[v].1, v)))
        .collect();
    let mut order = Vec::new();
    let mut done = 0usize;
    while let Some(Reverse((_, _, v))) = heap.pop() {
        done += 1;
        if let Some(op) = kind[v].2 {
            order.push(op);
        }
        for &s in &succ[v] {
            indeg[s] -= 1;
            if indeg[s] == 0 {
                heap.push(Reverse((kind[s].0, kind[s].1, s)));
            }
        }
    }
    let total = used.iter().filter(|&&u| u).count();
    if done < total {
        // A cycle: it goes through an NCCL vertex (the graph itself is acyclic, checked before).
        let v = (n..kind.len())
            .find(|&v| indeg[v] > 0)
            .expect("a cycle of the merged graph passes an NCCL operation");
        return Err(unorderable(desc, transfers, &kind, v));
    }
    Ok(order)
}

/// The error of an NCCL operation (vertex `v`) that no one order can place.
fn unorderable(
    desc: &GraphDesc,
    transfers: &[Transfer],
    kind: &[(u64, u64, Option<NcclOp>)],
    v: usize,
) -> Error {
    let what = match kind[v].2 {
        Some(NcclOp::Collective(c)) => format!(
            "collective '{}' (#{c})",
            crate::error::bounded(&desc.collectives[c as usize].name)
        ),
        Some(NcclOp::Transfer(t)) => {
            let tr = &transfers[t as usize];
            format!(
                "the NCCL transfer of {} from rank {} to rank {}",
                desc.describe(tr.producer),
                tr.from,
                tr.to
            )
        }
        None => desc.describe(v as u32),
    };
    Error::new(
        ErrorKind::InvalidGraph,
        format!(
            "graph '{}': {what} depends on itself through the graph's edges, so its NCCL \
             operations cannot be issued in one order on every rank",
            crate::error::bounded(&desc.name)
        ),
    )
}

#[cfg(test)]
mod tests {
    use crate::error::ErrorKind;
    use crate::plan::desc::{GraphDesc, Wire};
    use crate::plan::lower::{lower, LocalNode};
    use crate::plan::order::NcclOp;

    /// Per rank: `x{r}` (a device value), then an all-reduce of them, then `y{r}` reading it.
    fn reduce_then_use(ranks: usize) -> GraphDesc {
        let mut g = GraphDesc::new("reduce");
        let xs: Vec<u32> = (0..ranks)
            .map(|r| g.node(format!("x{r}"), r, Wire::Device))
            .collect();
        let ms: Vec<u32> = (0..ranks)
            .map(|r| g.node(format!("sum{r}"), r, Wire::Device))
            .collect();
        for r in 0..ranks {
            g.edge(xs[r], ms[r]);
            let y = g.node(format!("y{r}"), r, Wire::Local);
            g.edge(ms[r], y);
        }
        g.collective("sum", ms);
        g
    }

    #[test]
    fn a_collective_is_one_operation_issued_by_each_rank() {
        let l = lower(&reduce_then_use(3), 3).unwrap();
        assert_eq!(l.nccl_order, vec![NcclOp::Collective(0)]);
        for r in 0..3 {
            assert_eq!(l.plans[r].nccl, vec![LocalNode::Compute(3 + r as u32)]);
        }
        // No NCCL operation, no order.
        let mut g = GraphDesc::new("plain");
        let a = g.node("a", 0, Wire::Device);
        let b = g.node("b", 1, Wire::Local);
        g.edge(a, b);
        let l = lower(&g, 2).unwrap();
        assert!(l.nccl_order.is_empty() && l.plans.iter().all(|p| p.nccl.is_empty()));
    }

    #[test]
    fn independent_collectives_go_in_member_order_and_dependent_ones_after() {
        // Two ranks; collectives A (members 2, 3) and B (members 0, 1) independent; C (4, 5)
        // reads A's member on rank 0 and B's on rank 1.
        let mut g = GraphDesc::new("three");
        for i in 0..6 {
            g.node(format!("n{i}"), i % 2, Wire::Device);
        }
        g.edge(2, 4).edge(1, 5);
        g.collective("A", vec![2, 3]);
        g.collective("B", vec![0, 1]);
        g.collective("C", vec![4, 5]);
        let l = lower(&g, 2).unwrap();
        assert_eq!(
            l.nccl_order,
            vec![
                NcclOp::Collective(1),
                NcclOp::Collective(0),
                NcclOp::Collective(2)
            ]
        );
        let c = |i| LocalNode::Compute(i);
        assert_eq!(l.plans[0].nccl, vec![c(0), c(2), c(4)]);
        assert_eq!(l.plans[1].nccl, vec![c(1), c(3), c(5)]);
        // The same on every call, and for a description built in another order of edges.
        assert_eq!(lower(&g, 2).unwrap(), l);
    }

    #[test]
    fn nccl_transfers_take_their_place_between_collectives() {
        // Rank 0 makes `v` (over NCCL to rank 1), whose consumer feeds collective S; collective
        // F comes first (smaller members, independent).
        let mut g = GraphDesc::new("mixed");
        let f0 = g.node("f0", 0, Wire::Device); // 0
        let f1 = g.node("f1", 1, Wire::Device); // 1
        let v = g.node("v", 0, Wire::Nccl); // 2
        let u = g.node("u", 1, Wire::Device); // 3
        let s0 = g.node("s0", 0, Wire::Device); // 4
        let s1 = g.node("s1", 1, Wire::Device); // 5
        g.edge(v, u).edge(u, s1).edge(v, s0);
        g.collective("S", vec![s0, s1]);
        g.collective("F", vec![f0, f1]);
        let l = lower(&g, 2).unwrap();
        assert_eq!(l.transfers.len(), 1);
        assert_eq!(
            l.nccl_order,
            vec![
                NcclOp::Collective(1),
                NcclOp::Transfer(0),
                NcclOp::Collective(0)
            ]
        );
        assert_eq!(
            l.plans[0].nccl,
            vec![
                LocalNode::Compute(f0),
                LocalNode::Send(0),
                LocalNode::Compute(s0)
            ]
        );
        assert_eq!(
            l.plans[1].nccl,
            vec![
                LocalNode::Compute(f1),
                LocalNode::Recv(0),
                LocalNode::Compute(s1)
            ]
        );
    }

    #[test]
    fn bad_collectives_are_named() {
        let msg = |g: &GraphDesc, ranks| {
            let e = lower(g, ranks).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidGraph);
            e.to_string()
        };
        let mut g = reduce_then_use(2);
        g.collectives[0].members.pop();
        let m = msg(&g, 2);
        assert!(
            m.contains("collective 'sum' (#0) has no member on rank 1"),
            "{m}"
        );

        let mut g = reduce_then_use(2);
        g.collectives[0].members[1] = 0; // x0, rank 0 (sum0 already there)
        let m = msg(&g, 2);
        assert!(m.contains("has two members on rank 0"), "{m}");

        let mut g = reduce_then_use(2);
        g.collective("again", vec![2, 3]);
        let m = msg(&g, 2);
        assert!(m.contains("already a member of collective #0"), "{m}");

        let mut g = reduce_then_use(2);
        g.collectives[0].members[0] = 99;
        assert!(msg(&g, 2).contains("names node #99"));

        // A member that depends on another member of its own collective.
        let mut g = GraphDesc::new("self");
        let a = g.node("a", 0, Wire::Device);
        let b = g.node("b", 1, Wire::Device);
        g.edge(a, b);
        g.collective("loop", vec![a, b]);
        let m = msg(&g, 2);
        assert!(
            m.contains("collective 'loop' (#0) depends on itself"),
            "{m}"
        );
    }

    #[test]
    fn collectives_that_need_each_other_in_both_orders_cannot_be_ordered() {
        // A's member on rank 0 feeds B's member on rank 0; B's member on rank 1 feeds A's on
        // rank 1: rank 0 must issue A then B, rank 1 B then A.
        let mut g = GraphDesc::new("cross");
        let a0 = g.node("a0", 0, Wire::Device);
        let a1 = g.node("a1", 1, Wire::Device);
        let b0 = g.node("b0", 0, Wire::Device);
        let b1 = g.node("b1", 1, Wire::Device);
        g.edge(a0, b0).edge(b1, a1);
        g.collective("A", vec![a0, a1]);
        g.collective("B", vec![b0, b1]);
        let e = lower(&g, 2).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidGraph);
        assert!(
            e.to_string()
                .contains("cannot be issued in one order on every rank"),
            "{e}"
        );
    }
}
