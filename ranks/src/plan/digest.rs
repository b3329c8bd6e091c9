//! The structure digest every rank compares at a graph's first submission: one 64-bit FNV-1a
//! hash per node (its name, rank, wire, output type and predecessors) and one for the graph.

use crate::plan::desc::{GraphDesc, Wire};

/// FNV-1a, 64 bits: fixed, simple and the same in every build (the standard library's hasher
/// is free to change between Rust releases, and ranks may run different builds).
#[derive(Clone, Copy)]
struct Fnv(u64);

impl Fnv {
    fn new() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
    fn bytes(mut self, b: &[u8]) -> Self {
        for &x in b {
            self.0 ^= u64::from(x);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
        self
    }
    fn u64(self, v: u64) -> Self {
        self.bytes(&v.to_le_bytes())
    }
    fn str(self, s: &str) -> Self {
        self.u64(s.len() as u64).bytes(s.as_bytes())
    }
}

/// What one rank's graph looks like, compared across ranks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Digest {
    /// The graph's own: its name, node count, runs in flight and collectives (names and
    /// members).
    pub graph: u64,
    /// One per node: name, resolved rank, wire, output type name, sorted predecessors.
    pub nodes: Vec<u64>,
    /// How the runtime relays values read on several ranks: 0 when it does not, else the
    /// digest of the host map it relays on ([`relay_digest`]).
    pub relay: u64,
}

/// The digest of `desc` with its nodes placed on `rank_of` (from [`place`](super::place)).
pub fn digest(desc: &GraphDesc, rank_of: &[usize]) -> Digest {
    let mut preds: Vec<Vec<u32>> = vec![Vec::new(); desc.nodes.len()];
    for &(a, b) in &desc.edges {
        if let Some(p) = preds.get_mut(b as usize) {
            p.push(a);
        }
    }
    let nodes = desc
        .nodes
        .iter()
        .zip(preds.iter_mut())
        .enumerate()
        .map(|(i, (n, p))| {
            p.sort_unstable();
            p.dedup();
            let wire = match n.wire {
                Wire::Local => 0,
                Wire::Plain => 1,
                Wire::Serde => 2,
                Wire::Device => 3,
                Wire::Nccl => 4,
            };
            let mut h = Fnv::new()
                .str(&n.name)
                .u64(rank_of.get(i).copied().unwrap_or(usize::MAX) as u64)
                .u64(wire)
                .str(&n.type_name)
                .u64(p.len() as u64);
            for &x in p.iter() {
                h = h.u64(u64::from(x));
            }
            h.0
        })
        .collect();
    let mut graph = Fnv::new()
        .str(&desc.name)
        .u64(desc.nodes.len() as u64)
        .u64(u64::from(desc.runs_in_flight))
        .u64(desc.collectives.len() as u64);
    for c in &desc.collectives {
        graph = graph.str(&c.name).u64(c.members.len() as u64);
        for &m in &c.members {
            graph = graph.u64(u64::from(m));
        }
    }
    let graph = graph.0;
    Digest {
        graph,
        nodes,
        relay: 0,
    }
}

/// The [`Digest::relay`] of a runtime relaying one copy a host on `host_of` (`None`: flat).
/// Ranks that disagree on it would lower differently: their check fails, naming it.
pub fn relay_digest(host_of: Option<&[usize]>) -> u64 {
    host_of.map_or(0, |hosts| {
        let mut h = Fnv::new().u64(hosts.len() as u64);
        for &x in hosts {
            h = h.u64(x as u64);
        }
        h.0 | 1
    })
}

/// The first place where two digests differ: `None` when equal, `Some(Some(i))` at node `i`
/// (also the first node one of them lacks), `Some(None)` when only the graph's own differs
/// (not [`Digest::relay`], compared apart).
pub fn first_difference(a: &Digest, b: &Digest) -> Option<Option<usize>> {
    if let Some(i) = a.nodes.iter().zip(&b.nodes).position(|(x, y)| x != y) {
        return Some(Some(i));
    }
    if a.nodes.len() != b.nodes.len() {
        return Some(Some(a.nodes.len().min(b.nodes.len())));
    }
    (a.graph != b.graph).then_some(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::desc::GraphDesc;

    fn g(names: &[&str], rank_b: usize) -> (GraphDesc, Vec<usize>) {
        let mut d = GraphDesc::new("g");
        for n in names {
            d.node(*n, 0, Wire::Plain);
        }
        if names.len() > 1 {
            d.edge(0, 1);
        }
        let ranks = (0..names.len())
            .map(|i| if i == 1 { rank_b } else { 0 })
            .collect();
        (d, ranks)
    }

    #[test]
    fn equal_graphs_have_equal_digests() {
        let (a, ra) = g(&["x", "y", "z"], 1);
        let (b, rb) = g(&["x", "y", "z"], 1);
        assert_eq!(first_difference(&digest(&a, &ra), &digest(&b, &rb)), None);
    }

    #[test]
    fn the_first_differing_node_is_found() {
        let (a, ra) = g(&["x", "y", "z"], 1);
        let (b, rb) = g(&["x", "y", "w"], 1);
        assert_eq!(
            first_difference(&digest(&a, &ra), &digest(&b, &rb)),
            Some(Some(2))
        );
        // A different rank for node 1.
        let (c, rc) = g(&["x", "y", "z"], 0);
        assert_eq!(
            first_difference(&digest(&a, &ra), &digest(&c, &rc)),
            Some(Some(1))
        );
        // One node more.
        let (d, rd) = g(&["x", "y", "z", "q"], 1);
        assert_eq!(
            first_difference(&digest(&a, &ra), &digest(&d, &rd)),
            Some(Some(3))
        );
        // Only the graph's settings.
        let (mut e, re) = g(&["x", "y", "z"], 1);
        e.runs_in_flight = 9;
        assert_eq!(
            first_difference(&digest(&a, &ra), &digest(&e, &re)),
            Some(None)
        );
    }

    #[test]
    fn the_hash_is_fixed() {
        // FNV-1a of the empty input, and of "a": the published test vectors.
        assert_eq!(Fnv::new().0, 0xcbf2_9ce4_8422_2325);
        assert_eq!(Fnv::new().bytes(b"a").0, 0xaf63_dc4c_8601_ec8c);
    }
}
