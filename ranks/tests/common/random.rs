//! Random rank graphs with values crossing ranks (plain `Vec<u64>` and a serde record), and
//! their one-process reference: shared by the in-process tests and the MPI CI program.
#![allow(dead_code, unreachable_pub)]

use boundpool_ranks::{Error, NodeRef, RankGraph, RankGraphBuilder, Ranks};
use serde::{Deserialize, Serialize};

/// A serde value: a record with a string and a vector.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Rec {
    pub node: u32,
    pub acc: u64,
    pub text: String,
    pub data: Vec<u32>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Plain,
    Serde,
}

#[derive(Clone, Debug)]
pub struct NodeSpec {
    pub rank: usize,
    pub kind: Kind,
    /// Elements of its value (u64 for plain, u32 for serde).
    pub len: usize,
}

#[derive(Clone, Debug)]
pub struct Spec {
    pub seed: u64,
    pub nodes: Vec<NodeSpec>,
    pub edges: Vec<(u32, u32)>,
}

/// splitmix64.
pub fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = mix(self.0);
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// A random DAG of `n` nodes on `ranks` ranks: each node reads up to 3 earlier nodes; values
/// are mostly small, some of 1k–64k elements, and with `big` one value of `big` bytes.
pub fn random_spec(seed: u64, ranks: usize, n: usize, big: Option<usize>) -> Spec {
    let mut rng = Rng(seed ^ 0x5eed);
    let mut nodes = Vec::with_capacity(n);
    let mut edges = Vec::new();
    for i in 0..n {
        let kind = if rng.below(3) == 0 {
            Kind::Serde
        } else {
            Kind::Plain
        };
        let len = match rng.below(10) {
            0 => 1000 + rng.below(64_000) as usize,
            1 => 0,
            _ => 1 + rng.below(16) as usize,
        };
        nodes.push(NodeSpec {
            rank: rng.below(ranks as u64) as usize,
            kind,
            len,
        });
        if i > 0 {
            for _ in 0..rng.below(4) {
                let p = rng.below(i as u64) as u32;
                if !edges.contains(&(p, i as u32)) {
                    edges.push((p, i as u32));
                }
            }
        }
    }
    if let (Some(bytes), true) = (big, n > 1) {
        // The first node's value is big and read on another rank by the last node.
        nodes[0].kind = Kind::Plain;
        nodes[0].len = bytes / 8;
        nodes[0].rank = 0;
        nodes[n - 1].rank = ranks - 1;
        if !edges.contains(&(0, n as u32 - 1)) {
            edges.push((0, n as u32 - 1));
        }
    }
    Spec { seed, nodes, edges }
}

fn preds(spec: &Spec, i: u32) -> Vec<u32> {
    spec.edges
        .iter()
        .filter(|e| e.1 == i)
        .map(|e| e.0)
        .collect()
}

pub fn plain_value(seed: u64, i: u32, acc: u64, len: usize) -> Vec<u64> {
    let base = mix(seed ^ (u64::from(i) << 32) ^ acc);
    (0..len as u64)
        .map(|j| base ^ j.wrapping_mul(0x1000_0000_01b3))
        .collect()
}

pub fn serde_value(seed: u64, i: u32, acc: u64, len: usize) -> Rec {
    let base = mix(seed ^ (u64::from(i) << 32) ^ acc);
    Rec {
        node: i,
        acc,
        text: format!("node {i} of graph {seed}: {base:x}"),
        data: (0..len as u32).map(|j| (base as u32) ^ j).collect(),
    }
}

pub fn sum_plain(v: &[u64]) -> u64 {
    v.iter()
        .enumerate()
        .fold(v.len() as u64, |a, (j, &x)| mix(a ^ x ^ j as u64))
}

pub fn sum_rec(r: &Rec) -> u64 {
    let mut a = mix(u64::from(r.node) ^ r.acc);
    for b in r.text.bytes() {
        a = mix(a ^ u64::from(b));
    }
    for &d in &r.data {
        a = mix(a ^ u64::from(d));
    }
    a
}

fn combine(sums: impl Iterator<Item = u64>) -> u64 {
    sums.fold(0x1234, |a, s| mix(a ^ s))
}

/// Every node's checksum, computed in one process.
pub fn reference(spec: &Spec) -> Vec<u64> {
    let mut sums = vec![0u64; spec.nodes.len()];
    for (i, n) in spec.nodes.iter().enumerate() {
        let acc = combine(preds(spec, i as u32).iter().map(|&p| sums[p as usize]));
        sums[i] = match n.kind {
            Kind::Plain => sum_plain(&plain_value(spec.seed, i as u32, acc, n.len)),
            Kind::Serde => sum_rec(&serde_value(spec.seed, i as u32, acc, n.len)),
        };
    }
    sums
}

#[derive(Clone, Copy)]
pub enum Ref {
    Plain(NodeRef<Vec<u64>>),
    Serde(NodeRef<Rec>),
}

/// The spec as a rank graph (every rank builds it the same), and its node references.
pub fn build(spec: &Spec, ranks: &Ranks) -> Result<(RankGraph, Vec<Ref>), Error> {
    let mut g = RankGraphBuilder::new(format!("random {}", spec.seed));
    let mut refs: Vec<Ref> = Vec::with_capacity(spec.nodes.len());
    for (i, n) in spec.nodes.iter().enumerate() {
        let inputs: Vec<Ref> = preds(spec, i as u32)
            .iter()
            .map(|&p| refs[p as usize])
            .collect();
        let (seed, i, len) = (spec.seed, i as u32, n.len);
        let name = format!("n{i}");
        let acc_of = move |ctx: &boundpool_ranks::RankCtx<'_, ()>| -> Result<u64, Error> {
            let mut sums = Vec::with_capacity(inputs.len());
            for r in &inputs {
                sums.push(match *r {
                    Ref::Plain(p) => sum_plain(ctx.input(p)?),
                    Ref::Serde(p) => sum_rec(ctx.input(p)?),
                });
            }
            Ok(combine(sums.into_iter()))
        };
        let r = match n.kind {
            Kind::Plain => Ref::Plain(g.plain_node(n.rank, name, move |ctx| {
                Ok(plain_value(seed, i, acc_of(ctx)?, len))
            })),
            Kind::Serde => Ref::Serde(g.serde_node(n.rank, name, move |ctx| {
                Ok(serde_value(seed, i, acc_of(ctx)?, len))
            })),
        };
        refs.push(r);
    }
    for &(a, b) in &spec.edges {
        let from = match refs[a as usize] {
            Ref::Plain(r) => r.into(),
            Ref::Serde(r) => boundpool_ranks::RankNodeId::from(r),
        };
        match refs[b as usize] {
            Ref::Plain(r) => g.edge(from, r),
            Ref::Serde(r) => g.edge(from, r),
        };
    }
    Ok((g.build(ranks)?, refs))
}

/// Checks the outputs of this rank's nodes against the reference; returns how many it checked.
pub fn check(
    spec: &Spec,
    reference: &[u64],
    out: &boundpool_ranks::RankOutput,
    refs: &[Ref],
    rank: usize,
) -> Result<usize, String> {
    let mut n = 0;
    for (i, node) in spec.nodes.iter().enumerate() {
        if node.rank != rank {
            continue;
        }
        let sum = match refs[i] {
            Ref::Plain(r) => out.get(r).map(|v| sum_plain(v)),
            Ref::Serde(r) => out.get(r).map(sum_rec),
        };
        match sum {
            Some(s) if s == reference[i] => n += 1,
            Some(_) => return Err(format!("graph {}: node {i} differs", spec.seed)),
            None => return Err(format!("graph {}: node {i} has no output", spec.seed)),
        }
    }
    Ok(n)
}
