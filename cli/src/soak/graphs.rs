//! The soak's graphs: a seeded generator, random DAGs of host nodes whose every output is a
//! known sum, and the faults a node can be made to commit.

use std::panic;
use std::sync::Arc;

use boundpool::{Graph, GraphBuilder, NodeRef};

/// The text every injected panic starts with (the panic hook keeps these off stderr).
pub(super) const PANIC_TAG: &str = "soak: injected panic";

/// A small, fast, seeded generator (xorshift64*).
#[derive(Clone)]
pub(super) struct Rng(u64);

impl Rng {
    pub(super) fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub(super) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in `0..n` (n > 0).
    pub(super) fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A random DAG: `preds[i]` are earlier nodes, so index order is a topological order.
pub(super) struct Shape {
    pub(super) preds: Vec<Vec<u32>>,
    pub(super) base: Vec<u64>,
}

impl Shape {
    pub(super) fn random(rng: &mut Rng, max_nodes: u64) -> Shape {
        let n = 1 + rng.below(max_nodes) as usize;
        let mut preds = Vec::with_capacity(n);
        let mut base = Vec::with_capacity(n);
        for i in 0..n {
            let mut p: Vec<u32> = (0..rng.below(4).min(i as u64))
                .map(|_| (i as u64 - 1 - rng.below((i as u64).min(16))) as u32)
                .collect();
            p.sort_unstable();
            p.dedup();
            preds.push(p);
            base.push(rng.next() >> 8);
        }
        Shape { preds, base }
    }

    pub(super) fn len(&self) -> usize {
        self.base.len()
    }

    /// The value every node must produce: its base plus its inputs', wrapping.
    pub(super) fn expected(&self) -> Vec<u64> {
        let mut v: Vec<u64> = Vec::with_capacity(self.len());
        for i in 0..self.len() {
            let s = self.preds[i]
                .iter()
                .fold(self.base[i], |a, &p| a.wrapping_add(v[p as usize]));
            v.push(s);
        }
        v
    }

    pub(super) fn is_sink(&self, i: usize) -> bool {
        !self.preds[i + 1..].iter().any(|p| p.contains(&(i as u32)))
    }
}

/// What a node is made to do wrong.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Fault {
    Error,
    Panic,
}

/// Builds `shape` as host nodes named `{prefix}n{i}`; node `fault.1` does `fault.0`, and every
/// body runs `extra` (the dropped scenario counts runs with it).
pub(super) fn host_graph<S: Send + 'static>(
    name: &str,
    shape: &Shape,
    fault: Option<(Fault, usize)>,
    extra: Option<Arc<dyn Fn() + Send + Sync>>,
) -> (Graph<S>, Vec<NodeRef<u64>>) {
    let mut g = GraphBuilder::<S>::with_capacity(name.to_string(), shape.len(), 4 * shape.len());
    let mut refs: Vec<NodeRef<u64>> = Vec::with_capacity(shape.len());
    for i in 0..shape.len() {
        let inputs: Vec<NodeRef<u64>> = shape.preds[i].iter().map(|&p| refs[p as usize]).collect();
        let base = shape.base[i];
        let fault = fault.and_then(|(f, at)| (at == i).then_some(f));
        let extra = extra.clone();
        let r = g.node(format!("n{i}"), move |ctx| {
            if let Some(e) = &extra {
                e();
            }
            match fault {
                Some(Fault::Error) => return Err(format!("injected error in n{i}").into()),
                Some(Fault::Panic) => panic!("{PANIC_TAG} in n{i}"),
                None => {}
            }
            let mut v = base;
            for p in &inputs {
                v = v.wrapping_add(*ctx.input(*p)?);
            }
            Ok(v)
        });
        for &p in &shape.preds[i] {
            g.edge(refs[p as usize], r);
        }
        refs.push(r);
    }
    (g.build().expect("a soak graph is acyclic"), refs)
}

/// Installs a panic hook that keeps injected panics off stderr (and counts nothing else out).
pub(super) fn quiet_injected_panics() {
    let default = panic::take_hook();
    panic::set_hook(Box::new(move |info| {
        let msg = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        if !msg.starts_with(PANIC_TAG) {
            default(info);
        }
    }));
}
