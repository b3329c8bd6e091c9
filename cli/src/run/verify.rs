//! The exactly-once-after-predecessors check of `boundpool run`.
//!
//! Every node body counts its runs and takes a start and a finish number from one shared
//! `AtomicU64` sequence. The scheduler releases a successor only after its predecessor's body
//! returned, so the predecessor's finish number was taken before (in the sequence's modification
//! order) the successor's start number: `finish[p] < start[s]` must hold for every edge. After the
//! run, every node must have run exactly once. One node per run also samples the process's OS
//! threads, from inside the run.

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;

use boundpool::{Error, Graph, GraphBuilder};
use boundpool_workloads::{busy_work, Dag};

/// Per-node run counts and sequence numbers of one run.
pub(super) struct Check {
    seq: AtomicU64,
    runs: Box<[AtomicU32]>,
    start: Box<[AtomicU64]>,
    finish: Box<[AtomicU64]>,
    /// The node that samples the OS thread count.
    sample: u32,
    /// The largest OS thread count seen from inside a node.
    pub(super) peak_threads: AtomicUsize,
}

impl Check {
    pub(super) fn new(nodes: usize) -> Self {
        Check {
            seq: AtomicU64::new(0),
            runs: (0..nodes).map(|_| AtomicU32::new(0)).collect(),
            start: (0..nodes).map(|_| AtomicU64::new(0)).collect(),
            finish: (0..nodes).map(|_| AtomicU64::new(0)).collect(),
            sample: (nodes / 2) as u32,
            peak_threads: AtomicUsize::new(0),
        }
    }

    /// Clears the counts and numbers for the next run (not the thread peak).
    pub(super) fn reset(&self) {
        self.seq.store(0, Relaxed);
        for i in 0..self.runs.len() {
            self.runs[i].store(0, Relaxed);
            self.start[i].store(0, Relaxed);
            self.finish[i].store(0, Relaxed);
        }
    }

    /// Nodes whose body has finished in the current run (approximately, while it runs).
    pub(super) fn finished_approx(&self) -> u64 {
        self.seq.load(Relaxed) / 2
    }

    #[inline]
    fn body(&self, i: u32, work_ns: u64) {
        self.runs[i as usize].fetch_add(1, Relaxed);
        self.start[i as usize].store(self.seq.fetch_add(1, Relaxed) + 1, Relaxed);
        busy_work(work_ns);
        if i == self.sample {
            if let Some(n) = crate::process::os_threads() {
                self.peak_threads.fetch_max(n, Relaxed);
            }
        }
        self.finish[i as usize].store(self.seq.fetch_add(1, Relaxed) + 1, Relaxed);
    }

    /// Checks the run that just finished (its handle returned): every node ran exactly once, and
    /// started after each of its predecessors finished. The error names the first offending node.
    pub(super) fn verify(&self, dag: &Dag) -> Result<(), String> {
        for (i, r) in self.runs.iter().enumerate() {
            let r = r.load(Relaxed);
            if r != 1 {
                return Err(format!("node '{}' (#{i}) ran {r} times", dag.names[i]));
            }
        }
        for &(p, s) in &dag.edges {
            let (f, st) = (
                self.finish[p as usize].load(Relaxed),
                self.start[s as usize].load(Relaxed),
            );
            if f >= st {
                return Err(format!(
                    "node '{}' (#{s}) started (event {st}) before its predecessor '{}' (#{p}) finished (event {f})",
                    dag.names[s as usize], dag.names[p as usize]
                ));
            }
        }
        Ok(())
    }
}

/// Builds `dag` into a graph named `name` whose nodes record into `check` (and busy-work their
/// `work_ns`). Errors are the scheduler's validation errors (a cycle names nodes on it).
pub(super) fn build_graph(dag: &Dag, name: &str, check: &Arc<Check>) -> Result<Graph, Error> {
    let mut g = GraphBuilder::with_capacity(name.to_string(), dag.len(), dag.edges.len());
    let ids: Vec<_> = (0..dag.len())
        .map(|i| {
            let c = check.clone();
            let w = dag.work_ns[i];
            g.node(dag.names[i].clone(), move |_| {
                c.body(i as u32, w);
                Ok(())
            })
        })
        .collect();
    for &(f, t) in &dag.edges {
        g.edge(ids[f as usize], ids[t as usize]);
    }
    g.build()
}

#[cfg(test)]
mod tests {
    use super::*;
    use boundpool_workloads::Shape;

    #[test]
    fn a_correct_run_verifies_and_a_wrong_order_does_not() {
        let dag = Dag::shape(Shape::Chain, 3);
        let c = Check::new(3);
        // Simulate 0, 1, 2 in order.
        for i in 0..3 {
            c.body(i, 0);
        }
        assert_eq!(c.verify(&dag), Ok(()));
        c.reset();
        // 1 before 0: a violation naming node n1.
        c.body(1, 0);
        c.body(0, 0);
        c.body(2, 0);
        let e = c.verify(&dag).unwrap_err();
        assert!(e.contains("'n1'") && e.contains("'n0'"), "{e}");
        c.reset();
        c.body(0, 0);
        c.body(1, 0);
        assert!(c
            .verify(&dag)
            .unwrap_err()
            .contains("'n2' (#2) ran 0 times"));
    }
}
