//! Segment and lane planning: which captured nodes share a CUDA graph, and, with
//! [`ReplayBuilder::max_width`](super::ReplayBuilder::max_width), the lane each follows.

/// Splits the captured nodes (`devices[i]`: Some(ordinal)) into segments: returns each node's
/// segment and each segment's members in `order` (a topological order).
///
/// Cut levels: an edge adds 1 unless both ends are captured nodes of one device. A segment is
/// the captured nodes of one level and one device: a path between two of them keeps the level,
/// so it passes only through captured nodes of that device (the segment is convex); an edge
/// between segments raises the level (they form a DAG with the other nodes). Independent nodes
/// of a level share one CUDA graph.
pub(super) fn plan_segments(
    devices: &[Option<i32>],
    preds: &[Vec<u32>],
    order: &[u32],
) -> (Vec<Option<u32>>, Vec<Vec<u32>>) {
    let n = devices.len();
    let mut level = vec![0u64; n];
    for &v in order {
        let dv = devices[v as usize];
        for &p in &preds[v as usize] {
            let inc = u64::from(!(dv.is_some() && devices[p as usize] == dv));
            level[v as usize] = level[v as usize].max(level[p as usize] + inc);
        }
    }
    let mut seg_key: std::collections::HashMap<(u64, i32), u32> = Default::default();
    let mut seg_of: Vec<Option<u32>> = vec![None; n];
    let mut segments: Vec<Vec<u32>> = Vec::new();
    for &v in order {
        let Some(d) = devices[v as usize] else {
            continue;
        };
        let s = *seg_key.entry((level[v as usize], d)).or_insert_with(|| {
            segments.push(Vec::new());
            (segments.len() - 1) as u32
        });
        seg_of[v as usize] = Some(s);
        segments[s as usize].push(v);
    }
    (seg_of, segments)
}

/// [`ReplayBuilder::max_width`](super::ReplayBuilder::max_width): spreads each segment's members (in their topological order)
/// over `w` lanes and returns, for each node, the member it must also follow (its lane's
/// previous node) where none of its own predecessors is that node. Every lane is a chain, so
/// at most `w` members of a segment are ever unordered with each other.
pub(super) fn plan_lanes(
    segments: &[Vec<u32>],
    seg_of: &[Option<u32>],
    preds: &[Vec<u32>],
    w: usize,
) -> Vec<Option<u32>> {
    let mut after = vec![None; seg_of.len()];
    let mut lane_of: Vec<usize> = vec![usize::MAX; seg_of.len()];
    for (k, members) in segments.iter().enumerate() {
        // Each lane's last node and when it was last extended.
        let mut tail: Vec<Option<u32>> = vec![None; w];
        let mut used: Vec<usize> = vec![0; w];
        for (step, &m) in members.iter().enumerate() {
            let own = preds[m as usize].iter().copied().filter(|&p| {
                seg_of[p as usize] == Some(k as u32) && tail[lane_of[p as usize]] == Some(p)
            });
            let lane = match own.min_by_key(|&p| lane_of[p as usize]) {
                Some(p) => lane_of[p as usize],
                None => {
                    let l = (0..w)
                        .min_by_key(|&l| (tail[l].is_some(), used[l]))
                        .expect("w >= 1");
                    after[m as usize] = tail[l];
                    l
                }
            };
            tail[lane] = Some(m);
            used[lane] = step + 1;
            lane_of[m as usize] = lane;
        }
    }
    after
}

#[cfg(test)]
mod tests {
    use super::{plan_lanes, plan_segments};

    /// A xorshift64 stream from `seed` (non-zero).
    fn xorshift(mut x: u64) -> impl FnMut() -> u64 {
        move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        }
    }

    /// `n` nodes in topological order, each with fewer than `most` distinct predecessors
    /// below it.
    fn random_preds(n: usize, most: u64, next: &mut impl FnMut() -> u64) -> Vec<Vec<u32>> {
        (0..n)
            .map(|i| {
                let mut ps: Vec<u32> = (0..next() % most)
                    .filter(|_| i > 0)
                    .map(|_| (next() % i as u64) as u32)
                    .collect();
                ps.sort_unstable();
                ps.dedup();
                ps
            })
            .collect()
    }

    /// `plan_lanes` on independent nodes: round robin over the lanes, each node after the one
    /// `w` before it.
    #[test]
    fn independent_nodes_fill_lanes_round_robin() {
        let preds = vec![Vec::new(); 7];
        let of = vec![Some(0); 7];
        let after = plan_lanes(&[(0..7).collect()], &of, &preds, 3);
        assert_eq!(
            after,
            vec![None, None, None, Some(0), Some(1), Some(2), Some(3)]
        );
        // A chain stays on one lane whatever the width: no lane edge.
        let chain: Vec<Vec<u32>> = (0..7u32)
            .map(|i| if i == 0 { vec![] } else { vec![i - 1] })
            .collect();
        assert_eq!(
            plan_lanes(&[(0..7).collect()], &of, &chain, 3),
            vec![None; 7]
        );
    }

    /// Random DAGs and segments: lane edges point backwards within one segment, and with them
    /// no `w + 1` members of a segment are pairwise unordered (checked by brute force).
    #[test]
    #[allow(clippy::needless_range_loop)] // index loops read clearer for a reachability matrix
    fn lanes_bound_the_width_of_every_segment() {
        let mut next = xorshift(0x2545_F491_4F6C_DD1D);
        for round in 0..200 {
            let n = 2 + (next() % 11) as usize;
            let w = 1 + (next() % 3) as usize;
            let devices: Vec<Option<i32>> = (0..n)
                .map(|_| if next() % 5 == 0 { None } else { Some(0) })
                .collect();
            let preds = random_preds(n, 3, &mut next);
            let order: Vec<u32> = (0..n as u32).collect();
            let (of, segs) = plan_segments(&devices, &preds, &order);
            let after = plan_lanes(&segs, &of, &preds, w);
            // Reachability over the DAG's edges plus the lane edges (nodes are in order).
            let mut reach = vec![vec![false; n]; n];
            for v in 0..n {
                let ps = preds[v].iter().chain(&after[v]);
                for &p in ps {
                    let p = p as usize;
                    assert!(p < v, "round {round}: an edge {p} -> {v} backwards");
                    reach[p][v] = true;
                    for u in 0..n {
                        if reach[u][p] {
                            reach[u][v] = true;
                        }
                    }
                }
                if let Some(a) = after[v] {
                    assert_eq!(
                        of[a as usize], of[v],
                        "round {round}: lane edge across segments"
                    );
                    assert!(of[v].is_some());
                }
            }
            for seg in &segs {
                // Every (w + 1)-subset of the members has an ordered pair.
                let m = seg.len();
                for mask in 0u32..(1 << m) {
                    if mask.count_ones() as usize != w + 1 {
                        continue;
                    }
                    let pick: Vec<usize> = (0..m)
                        .filter(|&i| mask & (1 << i) != 0)
                        .map(|i| seg[i] as usize)
                        .collect();
                    let ordered = pick
                        .iter()
                        .any(|&a| pick.iter().any(|&b| a != b && reach[a][b]));
                    assert!(ordered, "round {round}: {pick:?} unordered with {w} lanes");
                }
            }
        }
    }

    /// Segments of a graph given as (device or None for host/eager, predecessors), nodes in
    /// topological order.
    fn plan(nodes: &[(Option<i32>, &[u32])]) -> (Vec<Option<u32>>, Vec<Vec<u32>>) {
        let devices: Vec<Option<i32>> = nodes.iter().map(|n| n.0).collect();
        let preds: Vec<Vec<u32>> = nodes.iter().map(|n| n.1.to_vec()).collect();
        let order: Vec<u32> = (0..nodes.len() as u32).collect();
        plan_segments(&devices, &preds, &order)
    }

    #[test]
    fn a_chain_of_gpu_nodes_is_one_segment() {
        let (of, segs) = plan(&[(Some(0), &[]), (Some(0), &[0]), (Some(0), &[1])]);
        assert_eq!(segs, vec![vec![0, 1, 2]]);
        assert_eq!(of, vec![Some(0); 3]);
    }

    #[test]
    fn independent_nodes_share_a_segment() {
        let (_, segs) = plan(&[(Some(0), &[]), (Some(0), &[]), (Some(0), &[])]);
        assert_eq!(segs, vec![vec![0, 1, 2]]);
    }

    #[test]
    fn a_host_node_splits_and_a_bypass_edge_does_not_join() {
        // a -> h -> b, and a -> b directly: a and b must be separate (b waits for h).
        let (of, segs) = plan(&[(Some(0), &[]), (None, &[0]), (Some(0), &[0, 1])]);
        assert_eq!(segs.len(), 2, "{segs:?}");
        assert_eq!(of[1], None);
        assert_ne!(of[0], of[2]);
    }

    #[test]
    fn a_node_beside_the_host_node_stays_in_the_first_segment() {
        // a -> h -> c; a -> b (b does not depend on h): a and b together, c apart.
        let (of, segs) = plan(&[
            (Some(0), &[]),
            (None, &[0]),
            (Some(0), &[0]),
            (Some(0), &[1]),
        ]);
        assert_eq!(segs.len(), 2, "{segs:?}");
        assert_eq!(of[0], of[2]);
        assert_ne!(of[0], of[3]);
    }

    #[test]
    fn devices_alternating_make_a_segment_each() {
        // a(0) -> b(1) -> c(0): c must not share a's graph (it waits for b on device 1).
        let (of, segs) = plan(&[(Some(0), &[]), (Some(1), &[0]), (Some(0), &[1])]);
        assert_eq!(segs.len(), 3, "{segs:?}");
        assert_ne!(of[0], of[2]);
    }

    /// Random DAGs: every segment is convex (no path between two members leaves it) and the
    /// segments with the other nodes form a DAG.
    #[test]
    #[allow(clippy::needless_range_loop)] // index loops read clearer for a reachability matrix
    fn random_graphs_give_convex_acyclic_segments() {
        let mut next = xorshift(0x9E37_79B9_7F4A_7C15);
        for round in 0..300 {
            let n = 2 + (next() % 40) as usize;
            let devices: Vec<Option<i32>> = (0..n)
                .map(|_| match next() % 6 {
                    0 => None,
                    1 => Some(1),
                    _ => Some(0),
                })
                .collect();
            let preds = random_preds(n, 4, &mut next);
            let order: Vec<u32> = (0..n as u32).collect();
            let (of, segs) = plan_segments(&devices, &preds, &order);
            // Every captured node in exactly one segment of its device.
            for i in 0..n {
                assert_eq!(of[i].is_some(), devices[i].is_some(), "round {round}");
                if let Some(s) = of[i] {
                    assert!(segs[s as usize].contains(&(i as u32)));
                    assert!(segs[s as usize]
                        .iter()
                        .all(|&m| devices[m as usize] == devices[i]));
                }
            }
            // Unit of the condensed graph: its segment, or the node itself.
            let unit = |i: usize| of[i].map_or(1000 + i, |s| s as usize);
            // reach[i]: nodes reachable from i (nodes are in topological order).
            let mut reach = vec![vec![false; n]; n];
            for i in (0..n).rev() {
                for j in i + 1..n {
                    if preds[j].contains(&(i as u32)) {
                        reach[i][j] = true;
                        for k in 0..n {
                            if reach[j][k] {
                                reach[i][k] = true;
                            }
                        }
                    }
                }
            }
            for a in 0..n {
                for b in 0..n {
                    for m in 0..n {
                        // Convex: a path a -> m -> b between members of one segment stays in it.
                        if of[a].is_some() && of[a] == of[b] && reach[a][m] && reach[m][b] {
                            assert_eq!(of[m], of[a], "round {round}: segment not convex");
                        }
                    }
                    // Acyclic: no two units reach each other.
                    if unit(a) != unit(b) && reach[a][b] {
                        for c in 0..n {
                            for d in 0..n {
                                if unit(c) == unit(b) && unit(d) == unit(a) {
                                    assert!(!reach[c][d], "round {round}: segments form a cycle");
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}
