//! Built-in graph shapes: a [`Dag`] is a plain description (compressed successor lists) of one
//! of the [`Shape`]s or of a graph file; [`Dag::to_graph`] turns it into a boundpool [`Graph`],
//! and [`Dag::adjacency`] into the successor lists the baselines run ([`crate::host`]).

use std::sync::atomic::AtomicU32;
use std::time::Instant;

use boundpool_scheduler::{Graph, GraphBuilder};

/// A built-in graph shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Shape {
    /// `n` nodes, each after the previous one.
    Chain,
    /// A full binary out-tree (each node releases two children); `n` is rounded down to
    /// `2^depth - 1` nodes.
    Tree,
    /// One source, `n - 2` independent nodes, one sink (`n` < 2: `n` nodes, no edges).
    Wide,
    /// A square grid, each cell after its left and upper neighbour; `n` is rounded down to a
    /// square.
    Wavefront,
    /// A random DAG: each node after up to 4 earlier nodes (seeded, reproducible).
    Random,
}

impl Shape {
    /// Every shape, in table order.
    pub const ALL: [Shape; 5] = [
        Shape::Chain,
        Shape::Tree,
        Shape::Wide,
        Shape::Wavefront,
        Shape::Random,
    ];

    /// The shape's name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Shape::Chain => "chain",
            Shape::Tree => "tree",
            Shape::Wide => "wide",
            Shape::Wavefront => "wavefront",
            Shape::Random => "random",
        }
    }

    /// Parses a command-line name.
    pub fn parse(s: &str) -> Option<Shape> {
        Shape::ALL.into_iter().find(|sh| sh.name() == s)
    }
}

/// A DAG as compressed successor lists, with names and optional busy work per node.
#[derive(Clone, Debug, Default)]
pub struct Dag {
    /// Node names.
    pub names: Vec<String>,
    /// Busy work per node, in nanoseconds (0: an empty body).
    pub work_ns: Vec<u64>,
    /// Edges `(from, to)`.
    pub edges: Vec<(u32, u32)>,
}

impl Dag {
    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// Whether the DAG has no nodes.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// Builds a shape of about `n` nodes (see [`Shape`] for the rounding).
    pub fn shape(shape: Shape, n: usize) -> Dag {
        let mut edges = Vec::new();
        let nodes = match shape {
            Shape::Chain => {
                edges.extend((1..n as u32).map(|i| (i - 1, i)));
                n
            }
            Shape::Tree => {
                let depth = usize::BITS - (n + 1).leading_zeros() - 1; // floor(log2(n + 1))
                let m = (1usize << depth) - 1;
                edges.extend((1..m as u32).map(|i| ((i - 1) / 2, i)));
                m
            }
            Shape::Wide if n < 2 => n, // no nodes, or the source alone
            Shape::Wide => {
                let sink = (n - 1) as u32;
                for i in 1..sink {
                    edges.push((0, i));
                    edges.push((i, sink));
                }
                if n == 2 {
                    edges.push((0, 1));
                }
                n
            }
            Shape::Wavefront => {
                let side = (n as f64).sqrt() as usize;
                for r in 0..side {
                    for c in 0..side {
                        let i = (r * side + c) as u32;
                        if c > 0 {
                            edges.push((i - 1, i));
                        }
                        if r > 0 {
                            edges.push((i - side as u32, i));
                        }
                    }
                }
                side * side
            }
            Shape::Random => {
                let mut rng = 0x2545_F491_4F6C_DD1Du64;
                for i in 1..n as u32 {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    let k = (rng % 5) as u32;
                    for j in 0..k {
                        let window = i.min(64);
                        let p = i - 1 - ((rng >> (8 * j + 3)) as u32 % window);
                        edges.push((p, i));
                    }
                }
                edges.sort_unstable();
                edges.dedup();
                n
            }
        };
        Dag {
            names: (0..nodes).map(|i| format!("n{i}")).collect(),
            work_ns: vec![0; nodes],
            edges,
        }
    }

    /// Successor lists and in-degrees.
    pub fn adjacency(&self) -> Adjacency {
        let n = self.len();
        let mut start = vec![0u32; n + 1];
        for &(f, _) in &self.edges {
            start[f as usize + 1] += 1;
        }
        for i in 0..n {
            start[i + 1] += start[i];
        }
        let mut fill = start.clone();
        let mut succ = vec![0u32; self.edges.len()];
        let mut indegree = vec![0u32; n];
        for &(f, t) in &self.edges {
            succ[fill[f as usize] as usize] = t;
            fill[f as usize] += 1;
            indegree[t as usize] += 1;
        }
        let bodies = self
            .work_ns
            .iter()
            .map(|&w| -> Box<dyn Fn() + Send + Sync> {
                if w == 0 {
                    Box::new(|| {})
                } else {
                    Box::new(move || busy_work(w))
                }
            })
            .collect();
        Adjacency {
            start,
            succ,
            indegree,
            bodies,
        }
    }

    /// A boundpool graph of this DAG whose node bodies call `body(node index)` (after the
    /// node's busy work, if any).
    pub fn to_graph<F>(&self, name: &str, body: F) -> Graph
    where
        F: Fn(u32) + Clone + Send + Sync + 'static,
    {
        let mut g = GraphBuilder::with_capacity(name.to_string(), self.len(), self.edges.len());
        let ids: Vec<_> = (0..self.len())
            .map(|i| {
                let body = body.clone();
                let work = self.work_ns[i];
                let idx = i as u32;
                g.node(self.names[i].clone(), move |_| {
                    busy_work(work);
                    body(idx);
                    Ok(())
                })
            })
            .collect();
        for &(f, t) in &self.edges {
            g.edge(ids[f as usize], ids[t as usize]);
        }
        g.build().expect("a built-in DAG is acyclic")
    }
}

/// A shape built straight into a boundpool graph with empty node bodies: what the graph-building
/// benchmark times (no intermediate `Dag`, static names).
pub fn empty_graph(shape: Shape, n: usize) -> Graph {
    let dag = Dag::shape(shape, n);
    let mut g = GraphBuilder::with_capacity(shape.name(), dag.len(), dag.edges.len());
    let ids: Vec<_> = (0..dag.len()).map(|_| g.node("n", |_| Ok(()))).collect();
    for &(f, t) in &dag.edges {
        g.edge(ids[f as usize], ids[t as usize]);
    }
    g.build().expect("a built-in DAG is acyclic")
}

/// Compressed successor lists, and each node's body as a boxed closure: the baselines call a
/// node's body through a `dyn Fn` as boundpool does, so both pay for running user code.
pub struct Adjacency {
    start: Vec<u32>,
    succ: Vec<u32>,
    indegree: Vec<u32>,
    bodies: Vec<Box<dyn Fn() + Send + Sync>>,
}

impl std::fmt::Debug for Adjacency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Adjacency")
            .field("nodes", &self.indegree.len())
            .field("edges", &self.succ.len())
            .finish()
    }
}

impl Adjacency {
    pub(crate) fn successors(&self, i: u32) -> &[u32] {
        &self.succ[self.start[i as usize] as usize..self.start[i as usize + 1] as usize]
    }

    #[inline]
    pub(crate) fn run_body(&self, i: u32) {
        (self.bodies[i as usize])();
    }

    pub(crate) fn counters(&self) -> Vec<AtomicU32> {
        self.indegree.iter().map(|&d| AtomicU32::new(d)).collect()
    }

    pub(crate) fn sources(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.indegree.len() as u32).filter(|&i| self.indegree[i as usize] == 0)
    }
}

/// Spins for about `ns` nanoseconds (the `work_ns` of a graph file).
pub fn busy_work(ns: u64) {
    if ns == 0 {
        return;
    }
    let t0 = Instant::now();
    while (t0.elapsed().as_nanos() as u64) < ns {
        std::hint::spin_loop();
    }
}
