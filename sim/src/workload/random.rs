//! The random host DAG the simulator is checked against on this machine: blocks of nodes
//! dealt round-robin to the ranks, each node reading a few of the nodes shortly before it,
//! of a few weight classes and output sizes. The real run (`boundpool sim check-host`)
//! builds the same nodes with bodies doing their class's work; the simulator gets this graph.

use crate::graph::{NodeSpec, SimGraph};

/// The DAG's shape.
#[derive(Clone, Debug, PartialEq)]
pub struct RandomDag {
    /// Nodes.
    pub nodes: usize,
    /// Ranks.
    pub ranks: usize,
    /// Consecutive nodes dealt to one rank before the next.
    pub block: usize,
    /// A node reads nodes among the `window` before it.
    pub window: usize,
    /// It reads 1 to `preds` of them (the first node none).
    pub preds: usize,
    /// Weight classes: (name, relative work); a node's class is drawn uniformly.
    pub classes: Vec<(String, u32)>,
    /// Output sizes in bytes; a node's is drawn uniformly.
    pub bytes: Vec<u64>,
    /// Seeds the draws.
    pub seed: u64,
}

/// One node of a [`RandomDag`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RandomNode {
    /// Its rank.
    pub rank: usize,
    /// Its class (index into `classes`).
    pub class: usize,
    /// Its output's size.
    pub bytes: u64,
    /// Nodes it reads (earlier ones, ascending, distinct).
    pub preds: Vec<u32>,
}

fn mix(mut x: u64) -> u64 {
    // splitmix64.
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

impl RandomDag {
    /// `nodes` nodes over `ranks` ranks in blocks of 16, reading 1 to 3 of the 64 before,
    /// classes `light` (1) and `heavy` (4), outputs of 8 B, 4 KiB or 64 KiB.
    pub fn new(nodes: usize, ranks: usize, seed: u64) -> Self {
        RandomDag {
            nodes,
            ranks,
            block: 16,
            window: 64,
            preds: 3,
            classes: vec![("light".into(), 1), ("heavy".into(), 4)],
            bytes: vec![8, 4096, 65536],
            seed,
        }
    }

    /// The nodes, drawn from the seed.
    pub fn draw(&self) -> Vec<RandomNode> {
        let mut x = self.seed ^ 0x005e_ed0f_da65;
        let mut next = move |k: usize| -> usize {
            x = mix(x);
            (x % k.max(1) as u64) as usize
        };
        (0..self.nodes)
            .map(|i| {
                let class = next(self.classes.len());
                let bytes = self.bytes[next(self.bytes.len())];
                let mut preds: Vec<u32> = if i == 0 {
                    Vec::new()
                } else {
                    let lo = i.saturating_sub(self.window);
                    let count = 1 + next(self.preds.max(1));
                    (0..count).map(|_| (lo + next(i - lo)) as u32).collect()
                };
                preds.sort_unstable();
                preds.dedup();
                RandomNode {
                    rank: (i / self.block.max(1)) % self.ranks.max(1),
                    class,
                    bytes,
                    preds,
                }
            })
            .collect()
    }

    /// Node `i`'s name: its class and index (`heavy 17`: kind `heavy`).
    pub fn name(&self, i: usize, node: &RandomNode) -> String {
        format!("{} {i}", self.classes[node.class].0)
    }

    /// The graph to simulate.
    pub fn sim_graph(&self) -> SimGraph {
        let mut g = SimGraph::new(format!("random dag {} on {} ranks", self.nodes, self.ranks));
        for (i, node) in self.draw().iter().enumerate() {
            let spec = NodeSpec::host(self.classes[node.class].0.clone()).bytes(node.bytes);
            let x = g.node(self.name(i, node), node.rank, spec);
            for &p in &node.preds {
                g.edge(p, x);
            }
        }
        g
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_draw_is_the_seed_s() {
        let d = RandomDag::new(500, 4, 3);
        let a = d.draw();
        assert_eq!(a, d.draw());
        assert_ne!(a, RandomDag::new(500, 4, 4).draw());
        for (i, n) in a.iter().enumerate() {
            assert_eq!(n.rank, (i / 16) % 4);
            assert!(n
                .preds
                .iter()
                .all(|&p| (p as usize) < i && i - (p as usize) <= 64));
            assert_eq!(n.preds.is_empty(), i == 0);
        }
        let g = d.sim_graph();
        assert_eq!(g.len(), 500);
        assert!(boundpool_ranks::lower(&g.desc, 4).unwrap().transfers.len() > 100);
    }
}
