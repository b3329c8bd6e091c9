//! `build`'s checks: bad placements and edges, cycles (Kahn's algorithm, skipped when node
//! order is already topological), and the final layout of the node records (external successor
//! lists, chain links).

use std::sync::{Arc, OnceLock};

use super::builder::{BadEdge, GraphBuilder};
use super::joins::CounterCache;
use super::memory::{filled, reserve, too_large, zeros, AllocFailure};
use super::plan::{
    build_predecessors, release_classes, successors_of, MaxPlacement, NodeSpec, Plan, FLAG_CHAIN,
};
use crate::error::{bounded, bounded_list, Error, ErrorKind};
use crate::ids::{NodeId, Placement, ANY_GROUP, DOMAIN_BIT};

impl<S> Plan<S> {
    pub(super) fn build(mut b: GraphBuilder<S>) -> Result<Self, Error> {
        let gname: Arc<str> = Arc::from(&*b.name);
        check_recorded(&b, &gname)?;
        let (n, edges) = (b.nodes.len(), b.edges);
        let too_large = |f| too_large(&gname, n, edges, f);
        let ext = external_successors(&mut b.nodes, &b.overflow).map_err(too_large)?;
        check_handoffs(&b, &ext, &gname)?;
        mark_chains(&mut b.nodes);
        let sources = sources(&b.has_pred, b.nodes.len()).map_err(too_large)?;
        if !b.forward {
            check_acyclic(&b, &ext, &sources, &gname).map_err(too_large)??;
        }
        let prioritized = b.nodes.iter().any(|n| n.is_prioritized());
        let mut max_placement = b.max_placement;
        if b.replaced {
            max_placement = MaxPlacement::default();
            for (i, spec) in b.nodes.iter().enumerate() {
                max_placement.note(i as u32, spec.placement());
            }
        }
        let classes = release_classes(&b.nodes).map_err(too_large)?;
        Ok(Plan {
            uid: b.uid,
            name: gname,
            nodes: b.nodes.into_boxed_slice(),
            ext,
            edges: b.edges,
            joins: b.joins,
            preds: OnceLock::new(),
            wide_joins: OnceLock::new(),
            counters: CounterCache::new(),
            names: b.names.shrunk(),
            sources: sources.into_boxed_slice(),
            valued: b.valued.into_boxed_slice(),
            max_placement,
            priority: b.priority,
            prio_overrides: b.prio_overrides.into_boxed_slice(),
            device_nodes: device_bits(&b.device_nodes, n),
            prioritized,
            classes,
        })
    }
}

/// One bit per node of the `n`, set for the `marked` ones (empty when none is).
fn device_bits(marked: &[u32], n: usize) -> Box<[u64]> {
    if marked.is_empty() {
        return Box::default();
    }
    let mut bits = vec![0u64; n.div_ceil(64)];
    for &i in marked {
        bits[i as usize / 64] |= 1 << (i % 64);
    }
    bits.into_boxed_slice()
}

/// The errors the builder recorded as it went: the first bad placement, the first bad edge.
fn check_recorded<S>(b: &GraphBuilder<S>, gname: &str) -> Result<(), Error> {
    let n = b.nodes.len();
    if let Some((id, placement)) = b.bad_placement {
        return Err(match placement {
            Some(p) => {
                let (what, index, max) = match p {
                    Placement::Domain(d) => ("domain", d.index(), ANY_GROUP - DOMAIN_BIT - 1),
                    Placement::Group(g) => ("group", g.index(), DOMAIN_BIT - 1),
                    Placement::Any => unreachable!("`Any` always fits"),
                };
                Error::new(
                    ErrorKind::UnknownGroup,
                    format!(
                        "graph '{}': node '{}' (#{}) is placed on {what} {index}, above the \
                         largest {what} index a pool can have ({max})",
                        bounded(gname),
                        bounded(&b.names[id.index as usize]),
                        id.index,
                    ),
                )
            }
            None => node_error(gname, id, b.uid, n, "a placement, priority or device mark"),
        });
    }
    match b.bad_edge {
        None => {}
        Some(BadEdge::Foreign(id)) | Some(BadEdge::Unknown(id)) => {
            return Err(node_error(gname, id, b.uid, n, "an edge"));
        }
        Some(BadEdge::SelfLoop(f)) => {
            return Err(Error::new(
                ErrorKind::Cycle,
                format!(
                    "graph '{}' has a cycle of 1 node: node '{}' (#{f}) depends on itself",
                    bounded(gname),
                    bounded(&b.names[f as usize])
                ),
            ));
        }
    }
    Ok(())
}

/// Each edge declared with `hand_on`: its target must be its source's only successor.
fn check_handoffs<S>(b: &GraphBuilder<S>, ext: &[u32], gname: &str) -> Result<(), Error> {
    for &(f, t) in &b.handoffs {
        let succ = successors_of(&b.nodes, ext, f);
        if let Some(&other) = succ.iter().find(|&&s| s != t) {
            let name = |i: u32| format!("node '{}' (#{i})", bounded(&b.names[i as usize]));
            return Err(Error::new(
                ErrorKind::BadInput,
                format!(
                    "graph '{}': {} takes the output of {} (`hand_on`), which {} may also read \
                     (of {} successors): a node takes an output only as its only successor",
                    bounded(gname),
                    name(t),
                    name(f),
                    name(other),
                    succ.len()
                ),
            ));
        }
    }
    Ok(())
}

/// The nodes without predecessors, in index order (`has_pred`: a bit a node).
fn sources(has_pred: &[u64], n: usize) -> Result<Vec<u32>, AllocFailure> {
    let mut sources = Vec::new();
    for (w, &bits) in has_pred.iter().enumerate() {
        let mut free = !bits;
        while free != 0 {
            let i = w * 64 + free.trailing_zeros() as usize;
            if i >= n {
                break;
            }
            reserve(&mut sources, 1, "source list")?;
            sources.push(i as u32);
            free &= free - 1;
        }
    }
    Ok(sources)
}

/// Kahn's algorithm: every node must become ready, or there is a cycle, which the error names.
/// The caller skips it when every edge goes from a lower to a higher index: node order is then
/// a topological order. The outer `Err`: its own memory could not be allocated.
fn check_acyclic<S>(
    b: &GraphBuilder<S>,
    ext: &[u32],
    sources: &[u32],
    gname: &str,
) -> Result<Result<(), Error>, AllocFailure> {
    let n = b.nodes.len();
    let mut remaining = Vec::new();
    (remaining.try_reserve_exact(n)).map_err(|_| AllocFailure::of::<u32>("cycle check", n))?;
    remaining.extend(b.nodes.iter().map(|s| s.indegree));
    let mut stack = Vec::new();
    reserve(&mut stack, sources.len(), "cycle check")?;
    stack.extend_from_slice(sources);
    let mut seen = 0;
    while let Some(i) = stack.pop() {
        seen += 1;
        for &s in successors_of(&b.nodes, ext, i) {
            let r = &mut remaining[s as usize];
            *r -= 1;
            if *r == 0 {
                reserve(&mut stack, 1, "cycle check")?;
                stack.push(s);
            }
        }
    }
    if seen < n {
        let preds = build_predecessors(n, |f| successors_of(&b.nodes, ext, f))?;
        let cycle = find_cycle(&remaining, &preds.0, &preds.1)?;
        // Name at most a few of its nodes: a cycle can be millions of nodes long.
        let name = |i: u32| format!("'{}' (#{i})", bounded(&b.names[i as usize]));
        return Ok(Err(Error::new(
            ErrorKind::Cycle,
            format!(
                "graph '{}' has a cycle of {} nodes: {} -> {}",
                bounded(gname),
                cycle.len(),
                bounded_list(cycle.iter().map(|&i| name(i)), cycle.len(), " -> "),
                name(cycle[0])
            ),
        )));
    }
    Ok(Ok(()))
}

/// The error for a placement or edge naming node `id`, which is of another graph or beyond the
/// `n` nodes of graph `uid`.
fn node_error(gname: &str, id: NodeId, uid: u32, n: usize, what: &str) -> Error {
    let gname = bounded(gname);
    if id.graph != uid {
        Error::new(
            ErrorKind::ForeignNode,
            format!(
                "graph '{gname}': {what} refers to node #{} of another graph; \
                 inline that graph with `subgraph` and map the node through the returned `Subgraph`",
                id.index
            ),
        )
    } else {
        Error::new(
            ErrorKind::UnknownNode,
            format!(
                "graph '{gname}': {what} refers to node #{}, but the graph has {n} node(s)",
                id.index
            ),
        )
    }
}

/// Moves the successors of nodes with more than two into one list: each such node's first two
/// (from its record) and then its `overflow` edges, in the order they were added; the record
/// then holds `[start, len]`. Nothing to do (and nothing allocated) when no node has more than two.
fn external_successors<S>(
    nodes: &mut [NodeSpec<S>],
    overflow: &[(u32, u32)],
) -> Result<Box<[u32]>, AllocFailure> {
    if overflow.is_empty() {
        return Ok(Box::new([]));
    }
    // Overflow edges per node; then each node's fill cursor.
    let mut extra = zeros(nodes.len(), "successor lists")?;
    for &(f, _) in overflow {
        extra[f as usize] += 1;
    }
    let total: usize = extra
        .iter()
        .filter(|&&k| k > 0)
        .map(|&k| 2 + k as usize)
        .sum();
    let total_u32 = u32::try_from(total).expect("a graph holds at most 2^32 - 1 edges");
    let mut ext = zeros(total_u32 as usize, "successor lists")?;
    let mut cursor = 0u32;
    for (f, k) in extra.iter_mut().enumerate() {
        if *k == 0 {
            continue;
        }
        let spec = &mut nodes[f];
        let len = 2 + *k;
        ext[cursor as usize] = spec.succ[0];
        ext[cursor as usize + 1] = spec.succ[1];
        spec.succ = [cursor, len];
        *k = cursor + 2;
        cursor += len;
    }
    for &(f, t) in overflow {
        let at = &mut extra[f as usize];
        ext[*at as usize] = t;
        *at += 1;
    }
    Ok(ext.into_boxed_slice())
}

/// Sets `FLAG_CHAIN` on every node whose one successor has it as its only predecessor and is
/// placed anywhere or where the node is.
fn mark_chains<S>(nodes: &mut [NodeSpec<S>]) {
    for i in 0..nodes.len() {
        let spec = &nodes[i];
        if spec.succ_mode() != 1 {
            continue;
        }
        let next = &nodes[spec.succ[0] as usize];
        let place = next.placement_bits();
        if next.indegree == 1 && (place == ANY_GROUP || place == spec.placement_bits()) {
            nodes[i].meta |= FLAG_CHAIN;
        }
    }
}

/// Walks predecessors among the nodes Kahn's algorithm could not reach until one repeats;
/// returns that cycle in edge order.
fn find_cycle(
    remaining: &[u32],
    pred_start: &[u32],
    pred: &[u32],
) -> Result<Vec<u32>, AllocFailure> {
    let start = remaining
        .iter()
        .position(|&r| r > 0)
        .expect("a cycle exists") as u32;
    let mut pos = filled(remaining.len(), u32::MAX, "cycle check")?;
    let mut path = Vec::new();
    let mut cur = start;
    loop {
        if pos[cur as usize] != u32::MAX {
            let mut cycle = path.split_off(pos[cur as usize] as usize);
            cycle.reverse(); // we walked predecessors; report in edge direction
            return Ok(cycle);
        }
        pos[cur as usize] = path.len() as u32;
        reserve(&mut path, 1, "cycle check")?;
        path.push(cur);
        let i = cur as usize;
        cur = *pred[pred_start[i] as usize..pred_start[i + 1] as usize]
            .iter()
            .find(|&&p| remaining[p as usize] > 0)
            .expect("a node left with predecessors has an unfinished one");
    }
}
